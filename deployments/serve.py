"""The pipeline's deployments: what runs when, with which parameters.

Two ways to run them, same names, schedules and parameters:

* `tokenmill serve` (this module's `serve`): one long-lived process registers the
  deployments with the Prefect server and runs their flow runs itself (each in a
  subprocess). No work pool, no worker; stop it with Ctrl-C (its schedules are paused).
* `prefect deploy --all --prefect-file deployments/prefect.yaml` plus
  `prefect worker start --pool tokenmill`: the deployments live on the server, a
  `process` work pool's worker runs them. `prefect.yaml` mirrors `DEPLOYMENTS` below
  (tests/test_deployments.py checks that they agree).

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
only trains the model.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline_lib.fsio import InputError

DEFAULT_STORE = "./artifacts"
WORK_POOL = "tokenmill"
TIMEZONE = "UTC"
NIGHTLY_CRON = "0 2 * * *"
WEEKLY_CRON = "0 3 * * 0"

# What the scheduled pipeline deployments set, per config (the configs' defaults otherwise).
# Config dicts: `deployment_specs` validates them against the configs (pipeline_lib.config),
# and Prefect's server refuses a triggered run whose dict names an unknown field or choice.
TOKENIZE_PARAMETERS: dict[str, dict[str, Any]] = {"corpus": {"n_shards": 8, "documents": "paragraph"}, "tokenizer": {"vocab_size": 32768}}
RETRAIN_PARAMETERS: dict[str, dict[str, Any]] = {"lm": {"steps": 600}}


def merge_parameters(*layers: dict[str, Any]) -> dict[str, Any]:
    """Parameters layered left to right; a config dict is merged field by field."""
    out: dict[str, Any] = {}
    for layer in layers:
        for k, v in layer.items():
            out[k] = {**out[k], **v} if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "storage_options" else v
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

    @property
    def entrypoint(self) -> str:
        return f"deployments/entrypoints.py:{self.flow}"


def _absolute(url: str) -> str:
    """Local paths absolute (flow runs may start in another directory); URLs unchanged."""
    return url if "://" in url else os.path.abspath(os.path.expanduser(url))


def deployment_specs(store: str = DEFAULT_STORE, corpus: Sequence[str] | None = None, storage_options: dict[str, Any] | None = None) -> list[DeploymentSpec]:
    """The deployments for one store and corpus.

    Args:
        store: artifact store URL or path (made absolute if local).
        corpus: corpus URLs or globs (None: the bundled tiny Shakespeare).
        storage_options: fsspec options for store and corpus (e.g. s3 endpoint_url). Never
            put secrets here: parameters are visible in the UI; give credentials to the
            worker's environment (AWS_ACCESS_KEY_ID ...) instead.
    """
    common: dict[str, Any] = {"store": _absolute(store)}
    if corpus:
        common["corpus"] = {"sources": [_absolute(c) for c in corpus]}
    if storage_options:
        common["storage_options"] = dict(storage_options)
    stage_common = {k: v for k, v in common.items() if k != "corpus"}
    specs = [
        DeploymentSpec(
            "tokenmill_pipeline", "nightly-tokenize",
            "Nightly: fetch the corpus, retrain the tokenizer and re-encode the token shards if the corpus changed (no LM).",
            cron=NIGHTLY_CRON, parameters=merge_parameters(common, TOKENIZE_PARAMETERS, {"train_model": False}), tags=("tokenmill", "nightly"),
        ),
        DeploymentSpec(
            "tokenmill_pipeline", "weekly-retrain",
            "Weekly: the nightly chain plus the GPT trained on the latest token shards.",
            cron=WEEKLY_CRON, parameters=merge_parameters(common, TOKENIZE_PARAMETERS, RETRAIN_PARAMETERS, {"train_model": True}), tags=("tokenmill", "weekly"),
        ),
        DeploymentSpec("tokenmill_pipeline", "on-demand", "The whole chain; give any parameters when triggering.", parameters=dict(common)),
        DeploymentSpec(
            "tokenmill_pipeline", "on-demand-dask", "The whole chain with the mapped stages on Dask.",
            parameters=dict(common), tags=("tokenmill", "dask"), runner="dask",
        ),
        DeploymentSpec("corpus_flow", "on-demand", "Fetch and shard a corpus.", parameters=dict(common)),
        DeploymentSpec("tokenizer_flow", "on-demand", "Count and learn merges on a corpus reference (corpus_ref).", parameters=dict(stage_common)),
        DeploymentSpec("encode_flow", "on-demand", "Encode a corpus reference with a tokenizer reference.", parameters=dict(stage_common)),
        DeploymentSpec("lm_flow", "on-demand", "Train the GPT on a tokens reference.", parameters=dict(stage_common)),
    ]
    for spec in specs:
        check_spec(spec)
    return specs


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


def _require_server() -> str:
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise InputError(
            "tokenmill serve needs a Prefect server (an ephemeral API never schedules runs): "
            "start one with `prefect server start` and set PREFECT_API_URL=http://127.0.0.1:4200/api"
        )
    return url


def bound_flows(specs: Sequence[DeploymentSpec], task_runner=None, workers: int = 0, dask_address: str | None = None) -> list[tuple[DeploymentSpec, Any]]:
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
            flow = flow.with_options(task_runner=make_task_runner(spec.runner, workers, dask_address if spec.runner == "dask" else None))
        elif task_runner is not None:
            flow = flow.with_options(task_runner=task_runner)
        out.append((spec, flow))
    return out


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
) -> None:
    """Register the deployments and run their flow runs from this process until stopped.

    Args:
        store, corpus, storage_options: see `deployment_specs`.
        runner: task runner for the mapped stages (threads | processes | dask); None reads
            TOKENMILL_RUNNER / TOKENMILL_WORKERS / TOKENMILL_DASK_ADDRESS (default threads).
        workers, dask_address: see `flows.runners.make_task_runner`.
        paused: register the schedules paused (runs only when triggered).
        limit: at most this many flow runs at once (None: no limit).
        poll_seconds: how often to look for due runs (default PREFECT_RUNNER_POLL_FREQUENCY, 10 s).

    Raises:
        InputError: no Prefect server configured (PREFECT_API_URL unset).

    Uses `Runner.add_flow` rather than `prefect.serve(*flow.to_deployment(...))`: only
    `add_flow` keeps the flow object, so its runs execute the flow bound here (with its
    task runner) in a subprocess; `serve(*deployments)` reloads the flow from its
    entrypoint file instead, which loses the task runner and depends on the working
    directory.
    """
    import asyncio

    from prefect.exceptions import TerminationSignal
    from prefect.runner import Runner
    from prefect.schedules import Cron

    from flows.runners import make_task_runner

    url = _require_server()
    task_runner = make_task_runner(runner, workers, dask_address) if runner else None
    specs = deployment_specs(store, corpus, storage_options)
    prefect_runner = Runner(name="tokenmill-serve", limit=limit, pause_on_shutdown=True, query_seconds=poll_seconds)
    names = []
    for spec, flow in bound_flows(specs, task_runner, workers, dask_address):
        prefect_runner.add_flow(
            flow,
            name=spec.name,
            schedules=[Cron(spec.cron, timezone=TIMEZONE)] if spec.cron else None,
            parameters=spec.parameters,
            description=spec.description,
            tags=list(spec.tags),
            paused=paused,
        )
        names.append(f"{flow.name}/{spec.name}" + (f"  [{spec.cron} {TIMEZONE}]" if spec.cron else ""))
    print(f"tokenmill serve: {len(names)} deployments on {url}; Ctrl-C stops (schedules are paused on exit)", flush=True)
    for name in names:
        print(f"  {name}", flush=True)
    try:
        asyncio.run(prefect_runner.start())
    except (KeyboardInterrupt, TerminationSignal):
        print("tokenmill serve: stopped", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m deployments.serve``: the same as `tokenmill serve`, with runner options."""
    import argparse
    import json
    import sys

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
    args = p.parse_args(argv)
    try:
        serve(args.store, args.corpus, storage_options=args.storage_options, runner=args.runner, workers=args.workers,
              dask_address=args.dask_address, paused=args.paused, limit=args.limit, poll_seconds=args.poll_seconds)
    except InputError as e:
        print(f"tokenmill serve: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
