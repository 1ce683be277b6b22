"""Cost of publishing a version on an object store (a local moto S3 server): the staging
PUTs, then the server-side copies under the version prefix and the create-only manifest.

    python benchmarks/bench_publish.py            # 64 MiB as 1 file and as 16 files
    python benchmarks/bench_publish.py --mib 256
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import s3_server  # noqa: E402

from pipeline_lib.store import ArtifactStore  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64)
    args = ap.parse_args()
    opts = s3_server.storage_options()
    bucket = s3_server.make_bucket()
    data = os.urandom(1 << 20) * args.mib
    for n_files in (1, 16):
        store = ArtifactStore(f"s3://{bucket}/bench{n_files}", **opts)
        staging = store.stage("tokens", "v1")
        t0 = time.perf_counter()
        size = len(data) // n_files
        infos = {f"f{i}.bin": staging.put_bytes(f"f{i}.bin", data[i * size : (i + 1) * size]) for i in range(n_files)}
        t1 = time.perf_counter()
        store.publish(staging, files=infos)
        t2 = time.perf_counter()
        print(
            f"{n_files:>2} file(s), {args.mib} MiB: staging PUTs {t1 - t0:.2f} s, publish (copies + manifest) "
            f"{t2 - t1:.2f} s, ratio {(t2 - t1) / (t1 - t0):.2f}"
        )


if __name__ == "__main__":
    main()
