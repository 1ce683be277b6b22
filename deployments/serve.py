"""The pipeline's deployments: what runs when, with which parameters.

Two ways to run them, same names, schedules and parameters:

* `tokenmill serve` (this module's `serve`): one long-lived process registers the
  deployments with the Prefect server and runs their flow runs itself (each in a
  subprocess). No work pool, no worker; the first Ctrl-C or SIGTERM stops it (the
  schedules it registered are paused). It refuses to start while deployments of the same
  names exist on a work pool (made by `tokenmill deploy` / `prefect deploy`): serving them
  would take them over.
* `tokenmill deploy` (deployments/deploy.py) or `prefect deploy --all --prefect-file
  deployments/prefect.yaml`, plus `prefect worker start --pool tokenmill` on any machine:
  the deployments live on the server, each flow run clones and installs the repository
  (pull steps), a `process` work pool's worker runs them. Both build the deployments from
  `deployment_specs` below (prefect.yaml mirrors it; tests/test_deployments.py checks that
  they agree).

Both need a running server (`prefect server start`, PREFECT_API_URL set): an ephemeral
API never schedules anything. Schedules are in UTC.

Deployments:
    tokenmill-pipeline/nightly-tokenize  02:00 daily   corpus -> tokenizer -> token shards (no LM)
    tokenmill-pipeline/weekly-retrain    03:00 Sunday  the same chain plus the GPT
    tokenmill-pipeline/on-demand         no schedule   the whole chain, parameters at trigger time
    tokenmill-pipeline/on-demand-dask    no schedule   the same, mapped stages on Dask
    tokenmill-{corpus,tokenizer,encode,lm}/on-demand   one stage each, on references

Every stage is cached on the content-derived version id of what it writes, so the nightly
run recomputes nothing while the corpus is unchanged, and the weekly retrain reuses the
tokenizer and token shards the nightly run already made (same corpus and parameters) and
only trains the model. The two scheduled deployments allow one run at a time each (a run
due while the previous one still runs waits: collision strategy ENQUEUE); on a work pool
they also share the work queue `scheduled` of concurrency limit 1, so a weekly run never
overlaps a nightly one on the same store.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from deployments.steps import absolute
from pipeline_lib.fsio import InputError

DEFAULT_STORE = "./artifacts"
WORK_POOL = "tokenmill"
WORK_QUEUE = "default"
SCHEDULED_QUEUE = "scheduled"  # the scheduled deployments' queue, concurrency limit 1
TIMEZONE = "UTC"
NIGHTLY_CRON = "0 2 * * *"
WEEKLY_CRON = "0 3 * * 0"

# What the scheduled pipeline deployments set, per config (the configs' defaults otherwise).
# Config dicts: `deployment_specs` validates them against the configs (pipeline_lib.config),
# and Prefect's server refuses a triggered run whose dict names an unknown field or choice.
TOKENIZE_PARAMETERS: dict[str, dict[str, Any]] = {
    "corpus": {"n_shards": 8, "documents": "paragraph"},
    "tokenizer": {"vocab_size": 32768},
}
# All 600 steps: LMConfig's default time budget (1 minute) would re-plan the run to what fits in it.
RETRAIN_PARAMETERS: dict[str, dict[str, Any]] = {"lm": {"steps": 600, "minutes": None}}


def merge_parameters(*layers: dict[str, Any]) -> dict[str, Any]:
    """Parameters layered left to right; a config dict is merged field by field."""
    out: dict[str, Any] = {}
    for layer in layers:
        for k, v in layer.items():
            out[k] = (
                {**out[k], **v}
                if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "storage_options"
                else v
            )
    return out


@dataclass(frozen=True)
class DeploymentSpec:
    flow: str  # attribute of deployments.entrypoints
    name: str  # deployment name; the UI shows "<flow name>/<name>"
    description: str
    cron: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    tags: tuple[str, ...] = ("tokenmill",)
    runner: str | None = None  # task runner for this deployment alone (None: the serving process's)
    concurrency_limit: int | None = None  # runs of this deployment at once; more wait (ENQUEUE)
    work_queue: str = WORK_QUEUE  # on a work pool

    @property
    def entrypoint(self) -> str:
        """A module path: a worker imports the flow from the installed package (deployments/steps.py: pull_steps)."""
        return f"deployments.entrypoints.{self.flow}"

    def concurrency(self):
        """The deployment's concurrency limit as Prefect takes it (None: unlimited)."""
        if self.concurrency_limit is None:
            return None
        from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy

        return ConcurrencyLimitConfig(limit=self.concurrency_limit, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE)


def deployment_specs(
    store: str = DEFAULT_STORE,
    corpus: Sequence[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    nightly_cron: str = NIGHTLY_CRON,
    weekly_cron: str = WEEKLY_CRON,
) -> list[DeploymentSpec]:
    """The deployments for one store and corpus.

    Args:
        store: artifact store URL or path (made absolute if local).
        corpus: corpus URLs or globs (None: the bundled tiny Shakespeare).
        storage_options: fsspec options for store and corpus (e.g. s3 endpoint_url). Never
            put secrets here: parameters are visible in the UI; give credentials to the
            worker's environment (AWS_ACCESS_KEY_ID ...) instead.
        nightly_cron, weekly_cron: the schedules (cron strings, in UTC).

    Raises:
        InputError: a cron string that is not one.
    """
    for what, cron in (("--nightly-cron", nightly_cron), ("--weekly-cron", weekly_cron)):
        check_cron(cron, what)
    common: dict[str, Any] = {"store": absolute(store)}
    if corpus:
        common["corpus"] = {"sources": [absolute(c) for c in corpus]}
    if storage_options:
        common["storage_options"] = dict(storage_options)
    stage_common = {k: v for k, v in common.items() if k != "corpus"}
    specs = [
        DeploymentSpec(
            "tokenmill_pipeline",
            "nightly-tokenize",
            "Nightly: fetch the corpus, retrain the tokenizer and re-encode the token shards if the corpus changed "
            "(no LM).",
            cron=nightly_cron,
            parameters=merge_parameters(common, TOKENIZE_PARAMETERS, {"train_model": False}),
            tags=("tokenmill", "nightly"),
            concurrency_limit=1,
            work_queue=SCHEDULED_QUEUE,
        ),
        DeploymentSpec(
            "tokenmill_pipeline",
            "weekly-retrain",
            "Weekly: the nightly chain plus the GPT trained on the latest token shards.",
            cron=weekly_cron,
            parameters=merge_parameters(common, TOKENIZE_PARAMETERS, RETRAIN_PARAMETERS, {"train_model": True}),
            tags=("tokenmill", "weekly"),
            concurrency_limit=1,
            work_queue=SCHEDULED_QUEUE,
        ),
        DeploymentSpec(
            "tokenmill_pipeline",
            "on-demand",
            "The whole chain; give any parameters when triggering.",
            parameters=dict(common),
        ),
        DeploymentSpec(
            "tokenmill_pipeline",
            "on-demand-dask",
            "The whole chain with the mapped stages on Dask.",
            parameters=dict(common),
            tags=("tokenmill", "dask"),
            runner="dask",
        ),
        DeploymentSpec("corpus_flow", "on-demand", "Fetch and shard a corpus.", parameters=dict(common)),
        DeploymentSpec(
            "tokenizer_flow",
            "on-demand",
            "Count and learn merges on a corpus reference (corpus_ref).",
            parameters=dict(stage_common),
        ),
        DeploymentSpec(
            "encode_flow",
            "on-demand",
            "Encode a corpus reference with a tokenizer reference.",
            parameters=dict(stage_common),
        ),
        DeploymentSpec("lm_flow", "on-demand", "Train the GPT on a tokens reference.", parameters=dict(stage_common)),
    ]
    for spec in specs:
        check_spec(spec)
    return specs


def check_cron(cron: str, what: str) -> str:
    """`cron` if Prefect's scheduler takes it (InputError naming `what` otherwise)."""
    from prefect.schedules import Cron

    try:
        Cron(cron, timezone=TIMEZONE)
    except ValueError as e:
        raise InputError(
            f"{what} {cron!r} is not a cron schedule: give five fields, minute hour day month weekday "
            "(e.g. '0 2 * * *')"
        ) from e
    return cron


def check_spec(spec: DeploymentSpec) -> None:
    """Validate a deployment's parameters against its flow's signature and configs
    (ConfigError naming the deployment, parameter and field)."""
    from deployments import entrypoints
    from flows.pipeline import check_parameters
    from pipeline_lib.errors import ConfigError

    try:
        check_parameters(entrypoints.FLOWS[spec.flow], spec.parameters)
    except ConfigError as e:
        raise ConfigError(f"deployment {spec.flow}/{spec.name}: {e}") from e


def _require_server(command: str = "tokenmill serve") -> str:
    """PREFECT_API_URL (environment, profile or prefect.toml), or InputError naming `command`."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise InputError(
            f"{command} needs a Prefect server of your own (tokenmill's local server and Prefect's temporary one "
            "run no scheduler): start one with `prefect server start` and set PREFECT_API_URL=http://127.0.0.1:4200/api"
        )
    return url


def bound_flows(
    specs: Sequence[DeploymentSpec], task_runner=None, workers: int = 0, dask_address: str | None = None
) -> list[tuple[DeploymentSpec, Any]]:
    """Each spec with its flow, bound to `task_runner` (or to the spec's own runner).

    A spec with its own `runner` (on-demand-dask) gets that runner, with `workers` and
    `dask_address`; the others get `task_runner` (None: the entrypoint's, from the
    environment).
    """
    from deployments import entrypoints
    from flows.runners import make_task_runner

    out = []
    for spec in specs:
        flow = entrypoints.FLOWS[spec.flow]
        if spec.runner is not None:
            flow = flow.with_options(
                task_runner=make_task_runner(spec.runner, workers, dask_address if spec.runner == "dask" else None)
            )
        elif task_runner is not None:
            flow = flow.with_options(task_runner=task_runner)
        out.append((spec, flow))
    return out


def pool_deployments(names: Sequence[str]) -> list[str]:
    """Which of the deployments `names` ("flow/deployment") exist on a work pool, as
    "flow/deployment (work pool P)"."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    taken = []
    with get_client(sync_client=True) as client:
        for name in names:
            try:
                existing = client.read_deployment_by_name(name)
            except ObjectNotFound:
                continue
            if existing.work_pool_name:
                taken.append(f"{name} (work pool {existing.work_pool_name!r})")
    return taken


def _pause_served(deployment_ids: Sequence[Any]) -> int:
    """Pause the schedules of the deployments this process served, unless one of them
    was taken over by a work pool meanwhile (`prefect deploy` of the same name)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    paused = 0
    with get_client(sync_client=True) as client:
        for deployment_id in deployment_ids:
            try:
                if client.read_deployment(deployment_id).work_pool_name:
                    continue
                client.pause_deployment(deployment_id)
                paused += 1
            except ObjectNotFound:
                continue
    return paused


def _serve_runner(**kwargs):
    """A prefect Runner that stops on the first SIGTERM or SIGINT, runs in flight included.

    Prefect's own SIGTERM handler calls the runner's `stop()` from inside the event loop,
    where it only creates a coroutine that never runs, then exits the interpreter from the
    handler; on SIGINT asyncio cancels the runner's task, whose exit then waits for the
    flow-run subprocesses to finish (a signal sent to the serve process alone, as `kill`
    and service managers do, never reaches them). Here either signal schedules the runner's
    `astop()` on its loop: the runs in flight are cancelled (their subprocesses stopped,
    their state Cancelled; a rerun resumes from the finished shards), the polling stops,
    and `start()` returns. A second signal stops at once (KeyboardInterrupt).
    """
    import asyncio
    import signal

    from prefect.runner import Runner

    class ServeRunner(Runner):
        stop_requests = 0
        stop_task = None

        def request_stop(self, signum: int | None = None, frame: Any = None) -> None:
            self.stop_requests += 1
            try:
                loop = asyncio.get_running_loop()  # a signal handler runs in the loop's thread
            except RuntimeError:
                loop = None
            if self.stop_requests > 1 or loop is None or not self.started:
                raise KeyboardInterrupt
            name = signal.Signals(signum).name if signum else "signal"
            self._logger.info(
                "%s received: cancelling the runs in flight and stopping (send it again to stop at once)", name
            )

            def stop() -> None:
                self.stop_task = loop.create_task(self.astop())

            loop.call_soon_threadsafe(stop)

        def handle_sigterm(self, *args: Any, **kwargs: Any) -> None:  # Runner.start installs it for SIGTERM
            self.request_stop(*args[:2])

    return ServeRunner(**kwargs)


def serve(
    store: str = DEFAULT_STORE,
    corpus: Sequence[str] | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    runner: str | None = None,
    workers: int = 0,
    dask_address: str | None = None,
    paused: bool = False,
    limit: int | None = None,
    poll_seconds: float | None = None,
    nightly_cron: str = NIGHTLY_CRON,
    weekly_cron: str = WEEKLY_CRON,
    result_storage: str | None = None,
) -> None:
    """Register the deployments and run their flow runs from this process until stopped.

    Args:
        store, corpus, storage_options, nightly_cron, weekly_cron: see `deployment_specs`.
        runner: task runner for the mapped stages (threads | processes | dask); None reads
            TOKENMILL_RUNNER / TOKENMILL_WORKERS / TOKENMILL_DASK_ADDRESS (default threads).
        workers, dask_address: see `flows.runners.make_task_runner`.
        paused: register the schedules paused (runs only when triggered).
        limit: at most this many flow runs at once (None: no limit; 1 also keeps a weekly
            run from overlapping a nightly one).
        poll_seconds: how often to look for due runs (default PREFECT_RUNNER_POLL_FREQUENCY, 10 s).
        result_storage: Prefect block ("remote-file-system/NAME" ...) for the task results of
            the runs (PREFECT_DEFAULT_RESULT_STORAGE_BLOCK of their processes).

    Raises:
        InputError: no Prefect server configured (PREFECT_API_URL unset); deployments of the
            same names already on a work pool; a result storage block that does not exist.

    Uses `Runner.add_flow` rather than `prefect.serve(*flow.to_deployment(...))`: only
    `add_flow` keeps the flow object, so its runs execute the flow bound here (with its
    task runner) in a subprocess; `serve(*deployments)` reloads the flow from its
    entrypoint file instead, which loses the task runner and depends on the working
    directory. Stops on the first Ctrl-C or SIGTERM, cancelling the runs in flight; on the
    way out it pauses the schedules of the deployments it registered (and only those).
    """
    url, bound = _flows_to_serve(
        store, corpus, storage_options, runner, workers, dask_address, nightly_cron, weekly_cron, result_storage
    )
    prefect_runner = _serve_runner(
        name="tokenmill-serve", limit=limit, pause_on_shutdown=False, query_seconds=poll_seconds
    )
    ids: list[Any] = []
    try:
        names = _add_deployments(prefect_runner, bound, paused, ids)
        print(
            f"tokenmill serve: {len(names)} deployments on {url}; Ctrl-C stops (schedules are paused on exit)",
            flush=True,
        )
        for name in names:
            print(f"  {name}", flush=True)
        _run_until_stopped(prefect_runner)
    finally:
        if ids:
            try:
                print(
                    f"tokenmill serve: stopped; paused the schedules of {_pause_served(ids)} deployment(s)", flush=True
                )
            except Exception as e:  # noqa: BLE001 - the server may be gone; stopping matters more
                print(f"tokenmill serve: stopped; could not pause the schedules ({type(e).__name__}: {e})", flush=True)


def _flows_to_serve(
    store: str,
    corpus: Sequence[str] | None,
    storage_options: dict[str, Any] | None,
    runner: str | None,
    workers: int,
    dask_address: str | None,
    nightly_cron: str,
    weekly_cron: str,
    result_storage: str | None,
) -> tuple[str, list[tuple[DeploymentSpec, Any]]]:
    """``(the Prefect API URL, [(spec, flow bound to its task runner)])``, checked: none of the
    deployments on a work pool, the result storage block there; this process's environment
    set for the flow-run subprocesses (result storage, heartbeat)."""
    from deployments.steps import RESULT_STORAGE_ENV, load_block
    from flows.runners import make_task_runner

    url = _require_server()
    task_runner = make_task_runner(runner, workers, dask_address) if runner else None
    specs = deployment_specs(store, corpus, storage_options, nightly_cron, weekly_cron)
    bound = bound_flows(specs, task_runner, workers, dask_address)
    taken = pool_deployments([f"{flow.name}/{spec.name}" for spec, flow in bound])
    if taken:
        raise InputError(
            f"tokenmill serve would take over deployments that run on a work pool: {', '.join(taken)} "
            "(serving them removes their pool and pull steps and pauses them on exit); serve against another "
            "Prefect server, or delete them first (prefect deployment delete NAME)"
        )
    if result_storage:
        load_block(result_storage, "--result-storage")
        os.environ[RESULT_STORAGE_ENV] = result_storage  # the flow-run subprocesses inherit it
    from deployments.automations import heartbeat_env

    for name, value in heartbeat_env().items():  # the zombie automation's heartbeat, unless set
        os.environ.setdefault(name, value)
    return url, bound


def _add_deployments(
    prefect_runner: Any, bound: list[tuple[DeploymentSpec, Any]], paused: bool, ids: list[Any]
) -> list[str]:
    """Add each bound flow to `prefect_runner` as a deployment, its id appended to `ids` as
    soon as it exists (so that those added before a failure are paused on the way out);
    the lines that name them."""
    from prefect.schedules import Cron

    names = []
    for spec, flow in bound:
        ids.append(
            prefect_runner.add_flow(
                flow,
                name=spec.name,
                schedules=[Cron(spec.cron, timezone=TIMEZONE)] if spec.cron else None,
                parameters=spec.parameters,
                description=spec.description,
                tags=list(spec.tags),
                paused=paused,
                concurrency_limit=spec.concurrency(),
            )
        )
        names.append(f"{flow.name}/{spec.name}" + (f"  [{spec.cron} {TIMEZONE}]" if spec.cron else ""))
    return names


def _run_until_stopped(prefect_runner: Any) -> None:
    """Run the due flow runs until Ctrl-C or SIGTERM; Ctrl-C goes to the runner's own
    handler (which cancels the runs in flight) while it runs on the main thread."""
    import asyncio
    import signal
    import threading

    from prefect.exceptions import TerminationSignal

    previous = (
        signal.signal(signal.SIGINT, prefect_runner.request_stop)
        if threading.current_thread() is threading.main_thread()
        else None
    )
    try:
        asyncio.run(prefect_runner.start())
    except (KeyboardInterrupt, TerminationSignal):
        pass
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m deployments.serve``: the same as `tokenmill serve`, with runner options."""
    import argparse
    import json
    import sys

    from pipeline_lib.errors import TokenmillError

    p = argparse.ArgumentParser(prog="python -m deployments.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--store", default=DEFAULT_STORE)
    p.add_argument("--corpus", action="append", metavar="URL")
    p.add_argument("--storage-options", type=json.loads, help="fsspec options as JSON")
    p.add_argument("--runner", choices=("threads", "processes", "dask"))
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--dask-address")
    p.add_argument("--paused", action="store_true", help="register schedules paused")
    p.add_argument("--limit", type=int, help="at most this many flow runs at once")
    p.add_argument("--poll-seconds", type=float, help="how often to look for due runs (default 10)")
    p.add_argument(
        "--nightly-cron", default=NIGHTLY_CRON, help="schedule of nightly-tokenize, UTC (default: %(default)s)"
    )
    p.add_argument("--weekly-cron", default=WEEKLY_CRON, help="schedule of weekly-retrain, UTC (default: %(default)s)")
    p.add_argument(
        "--result-storage",
        metavar="BLOCK",
        help="Prefect block for task results, e.g. remote-file-system/tokenmill-results",
    )
    args = p.parse_args(argv)
    try:
        serve(
            args.store,
            args.corpus,
            storage_options=args.storage_options,
            runner=args.runner,
            workers=args.workers,
            dask_address=args.dask_address,
            paused=args.paused,
            limit=args.limit,
            poll_seconds=args.poll_seconds,
            nightly_cron=args.nightly_cron,
            weekly_cron=args.weekly_cron,
            result_storage=args.result_storage,
        )
    except TokenmillError as e:
        print(f"tokenmill serve: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
