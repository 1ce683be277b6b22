"""Task runners for the mapped stages: threads (default), processes, or Dask via prefect-dask.

What runs where: the flow itself (and its small tasks) runs in the calling process; the
mapped `count_words` / `encode_shard` tasks run on the task runner. Tasks hand each other
store references, never data, so any runner whose workers can reach the store URL gives
the same artifacts (same version ids, same bytes): a local path for threads, processes and
a LocalCluster; a shared filesystem or an object store (s3://...) for a remote cluster.

Measured here (2 cores, see docs/operations.md): the compiled core releases the GIL while
it pre-tokenizes, counts and encodes, so the thread runner runs two shards on two cores
at once with ~4-5 ms of overhead per task, against ~90-105 ms per task for Dask and
~110-180 ms for processes. Use Dask to go beyond one machine, not to go faster on one.

A cluster of machines that share no disk needs Prefect's task results in one place every
machine reaches (a result storage block, PREFECT_DEFAULT_RESULT_STORAGE_BLOCK): without
one, each Dask worker keeps the results of the tasks it ran on its own disk, and a rerun
from another machine recomputes them (the store still never publishes a version twice).
`make_task_runner` says so when it connects to a cluster without one; docs/scale.md has
the recipe.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from pipeline_lib.fsio import InputError

RUNNERS = ("threads", "processes", "dask")

# Environment variables read by `runner_from_env` (deployments set them as job variables).
ENV_RUNNER = "TOKENMILL_RUNNER"
ENV_WORKERS = "TOKENMILL_WORKERS"
ENV_DASK_ADDRESS = "TOKENMILL_DASK_ADDRESS"

log = logging.getLogger("tokenmill.runners")


def make_task_runner(
    kind: str = "threads",
    workers: int = 0,
    dask_address: str | None = None,
    dask_cluster_kwargs: Mapping[str, Any] | None = None,
):
    """Build a Prefect task runner.

    Args:
        kind: ``threads``: `ThreadPoolTaskRunner`; parallel for CPU-bound work because the
            compiled core releases the GIL while it splits, counts and encodes.
            ``processes``: `ProcessPoolTaskRunner`; for the pure-Python fallback (no
            compiled core); needs a store every process can open (not ``memory://``).
            ``dask``: `prefect_dask.DaskTaskRunner` on a `LocalCluster` of `workers`
            single-threaded worker processes, started and stopped with the flow run, or on
            the existing cluster at `dask_address` (its size is the cluster's business).
        workers: parallel workers; 0 means one per CPU core.
        dask_address: scheduler address of a running cluster, e.g. ``tcp://10.0.0.5:8786``.
        dask_cluster_kwargs: extra `LocalCluster` arguments (memory_limit, dashboard_address...).

    Returns:
        A task runner for ``flow.with_options(task_runner=...)``.

    Raises:
        InputError: unknown kind, or ``dask`` without prefect-dask installed.

    >>> type(make_task_runner("threads", 2)).__name__
    'ThreadPoolTaskRunner'
    """
    if workers < 0:
        raise InputError(f"workers={workers}: expected 0 (one per core) or a positive count")
    workers = workers or os.cpu_count() or 1
    if kind == "threads":
        from flows.cancellable import ThreadPoolTaskRunner  # Prefect's, whose cancel stops the compiled core

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
            if not dask_address.startswith(("tcp://", "tls://", "ws://", "wss://", "inproc://", "ucx://")):
                raise InputError(f"--dask-address {dask_address!r}: expected a scheduler address like tcp://HOST:8786")
            if not shared_result_storage():
                log.warning(
                    "tokenmill: note: no Prefect result storage block is set (PREFECT_DEFAULT_RESULT_STORAGE_BLOCK): "
                    "each Dask worker keeps its tasks' results on its own disk, so a rerun elsewhere recomputes them; "
                    "see docs/scale.md"
                )
            return DaskTaskRunner(address=dask_address)
        # One thread per worker process: each mapped task is a whole shard of native work
        # that uses its core fully; more threads per worker would only oversubscribe.
        cluster_kwargs = {
            "n_workers": workers,
            "threads_per_worker": 1,
            "processes": True,
            **(dask_cluster_kwargs or {}),
        }
        return DaskTaskRunner(cluster_kwargs=cluster_kwargs)
    raise InputError(f"unknown runner {kind!r}; choose one of {RUNNERS}")


def shared_result_storage() -> str | None:
    """The Prefect result storage block every process of a run writes task results to, if any."""
    from prefect.settings import get_current_settings

    return get_current_settings().results.default_storage_block


def runner_from_env(environ: Mapping[str, str] | None = None):
    """The task runner named by TOKENMILL_RUNNER / TOKENMILL_WORKERS / TOKENMILL_DASK_ADDRESS.

    Deployments use this: a work pool's job variables (or the environment of
    `tokenmill serve`) pick the runner without changing the deployment.
    Unset means threads, one per core.
    """
    env = os.environ if environ is None else environ
    kind = env.get(ENV_RUNNER, "").strip() or "threads"
    raw_workers = env.get(ENV_WORKERS, "").strip() or "0"
    try:
        workers = int(raw_workers)
    except ValueError:
        raise InputError(f"{ENV_WORKERS}={raw_workers!r}: expected an integer") from None
    address = env.get(ENV_DASK_ADDRESS, "").strip() or None
    if address and kind != "dask":
        raise InputError(
            f"{ENV_DASK_ADDRESS} is set but {ENV_RUNNER}={kind!r}: set {ENV_RUNNER}=dask to use the cluster"
        )
    return make_task_runner(kind, workers, address)
