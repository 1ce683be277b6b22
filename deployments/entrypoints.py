"""Deployment entrypoints: the flows of `flows.pipeline`, with the task runner picked by
the environment of the process that runs them.

A process worker starts each flow run as ``python -m prefect.engine``, which runs the
deployment's pull steps (clone and install the repository: deployments/steps.py), imports
this module from the installed package and takes the flow named by the deployment's
entrypoint (``deployments.entrypoints.tokenmill_pipeline``). The task runner is chosen at
that moment from

    TOKENMILL_RUNNER        threads (default) | processes | dask
    TOKENMILL_WORKERS       parallel workers, 0 = one per core (default)
    TOKENMILL_DASK_ADDRESS  tcp://HOST:8786 to use a running Dask cluster

set in the worker's environment (``TOKENMILL_RUNNER=dask prefect worker start ...``) or in
a deployment's ``job_variables.env`` (prefect.yaml), so the same deployment runs on threads
on a laptop and on a Dask cluster in production. Flow names stay those of flows.pipeline,
so runs group under the same flow in the UI whichever way they were started.
"""

from __future__ import annotations

from flows import pipeline, sweep
from flows.runners import runner_from_env


def _with_env_runner(flow):
    return flow.with_options(task_runner=runner_from_env())


tokenmill_pipeline = _with_env_runner(pipeline.tokenmill_pipeline)
corpus_flow = _with_env_runner(pipeline.corpus_flow)
tokenizer_flow = _with_env_runner(pipeline.tokenizer_flow)
encode_flow = _with_env_runner(pipeline.encode_flow)
lm_flow = _with_env_runner(pipeline.lm_flow)
sweep_flow = _with_env_runner(sweep.sweep_flow)

FLOWS = {
    "tokenmill_pipeline": tokenmill_pipeline,
    "corpus_flow": corpus_flow,
    "tokenizer_flow": tokenizer_flow,
    "encode_flow": encode_flow,
    "lm_flow": lm_flow,
    "sweep_flow": sweep_flow,
}
