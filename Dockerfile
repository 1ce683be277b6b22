# A tokenmill worker image: Python, the compiled core and every dependency preinstalled, so a
# flow run starts without cloning or building anything (docs/operations.md, "Worker setups").
#
#   docker build -t tokenmill-worker:$(git rev-parse --short HEAD) .
#   prefect work-pool create tokenmill-docker --type docker      # needs: pip install prefect-docker
#   tokenmill deploy --pool tokenmill-docker --install-command none --image tokenmill-worker:$(git rev-parse --short HEAD)
#   prefect worker start --pool tokenmill-docker
#
# One image per code version: deploy again with the new tag after building it. The install
# commands are the README's (tests/test_worker_image.py checks that they stay so), without
# -e: the image keeps the installed package, not the source tree.
FROM python:3.11-slim

# g++ and cmake build the compiled core; git for `tokenmill deploy` run inside the image.
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ cmake git \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/tokenmill-src
COPY . .
RUN pip install --no-cache-dir torch==2.13.0 \
    && pip install --no-cache-dir ".[dask,s3]" prefect-docker \
    && cd / && rm -rf /opt/tokenmill-src \
    && python -c "import pipeline_lib.tokenizer, deployments.entrypoints"

WORKDIR /work
ENV PREFECT_FLOWS_HEARTBEAT_FREQUENCY=30
