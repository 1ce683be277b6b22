"""Task runners for the mapped stages: threads (default), processes, or Dask via prefect-dask."""

from __future__ import annotations

import os

from pipeline_lib.fsio import InputError

RUNNERS = ("threads", "processes", "dask")


def make_task_runner(kind: str = "threads", workers: int = 0, dask_address: str | None = None):
    """Build a Prefect task runner.

    threads: `ThreadPoolTaskRunner`; parallel for CPU-bound work because the compiled
        core releases the GIL while it splits, counts and encodes.
    processes: `ProcessPoolTaskRunner`; for the pure-Python fallback (no compiled core).
    dask: `prefect_dask.DaskTaskRunner` on a `LocalCluster` of `workers` processes, or on
        the existing cluster at `dask_address`. Workers reach the data through the store's
        URL, so a remote cluster needs a store it can reach (e.g. s3://).
    """
    workers = workers or os.cpu_count() or 1
    if kind == "threads":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=workers)
    if kind == "processes":
        from prefect.task_runners import ProcessPoolTaskRunner

        return ProcessPoolTaskRunner(max_workers=workers)
    if kind == "dask":
        try:
            from prefect_dask import DaskTaskRunner
        except ImportError as e:
            raise InputError("--runner dask needs prefect-dask: pip install 'tokenmill[dask]'") from e
        if dask_address:
            return DaskTaskRunner(address=dask_address)
        return DaskTaskRunner(cluster_kwargs={"n_workers": workers, "threads_per_worker": 1, "processes": True})
    raise InputError(f"unknown runner {kind!r}; choose one of {RUNNERS}")
