"""`tokenmill deploy`: create the deployments on a Prefect server for workers on any machine.

The deployments of deployments/serve.py (`deployment_specs`: names, parameters, schedules,
concurrency limits), on a `process` work pool, with the pull steps of
deployments/steps.py: before each flow run the worker clones the repository (`--repo`,
`--branch`; default: this checkout's `origin` and branch), runs `--install-command` in the
clone (default `python -m deployments.wheel_cache`, which builds the compiled core once per
code version into a wheel cache; `none` for workers that have tokenmill installed), and imports the
flows from the installed package. The same as `prefect deploy --all --prefect-file
deployments/prefect.yaml` with TOKENMILL_* variables, from flags:

    tokenmill deploy --store s3://bucket/tokenmill --corpus s3://bucket/corpus.txt \\
        --pool tokenmill --nightly-cron "0 2 * * *" --weekly-cron "0 3 * * 0" \\
        --result-storage remote-file-system/tokenmill-results --notify custom-webhook/ops-alerts
    prefect worker start --pool tokenmill        # on each worker machine

Workers clone what is committed and pushed: uncommitted changes of the deploying checkout
never reach them. Deploying again updates the deployments in place.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from deployments.serve import (
    DEFAULT_STORE,
    NIGHTLY_CRON,
    SCHEDULED_QUEUE,
    TIMEZONE,
    WEEKLY_CRON,
    WORK_POOL,
    deployment_specs,
)
from deployments.steps import (
    DEFAULT_INSTALL,
    PREINSTALLED,
    job_env,
    load_block,
    local_checkout,
    pull_steps,
    source_settings,
)
from pipeline_lib.errors import InputError, TokenmillError


class PullSteps:
    """Flow-code "storage" that is only a list of pull steps (what `RunnerDeployment`
    sends to the server as the deployment's pull steps); nothing is pulled at deploy time."""

    def __init__(self, pull: list[dict[str, Any]]):
        self.pull = pull
        self._base_path = Path.cwd()

    def set_base_path(self, path: Path) -> None:
        self._base_path = path

    @property
    def destination(self) -> Path:
        return self._base_path

    @property
    def pull_interval(self) -> int | None:
        return None

    async def pull_code(self) -> None:
        return None

    def to_pull_step(self) -> list[dict[str, Any]]:
        return self.pull

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PullSteps) and other.pull == self.pull

    __hash__ = None  # type: ignore[assignment]


def _ensure_pool(pool: str, create: bool) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            existing = client.read_work_pool(pool)
        except ObjectNotFound:
            if not create:
                raise InputError(
                    f"work pool {pool!r} does not exist: create it (prefect work-pool create {pool} --type process) "
                    "or pass --create-pool"
                ) from None
            client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
            print(f"tokenmill deploy: created work pool {pool!r} (process)")
            return
    if existing.type != "process":
        print(
            f"tokenmill deploy: note: work pool {pool!r} is of type {existing.type!r}; the deployments are written "
            "for 'process' pools"
        )


def deploy(
    store: str = DEFAULT_STORE,
    corpus: Sequence[str] | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    pool: str = WORK_POOL,
    nightly_cron: str = NIGHTLY_CRON,
    weekly_cron: str = WEEKLY_CRON,
    repo: str | None = None,
    branch: str | None = None,
    install_command: str | None = None,
    result_storage: str | None = None,
    notify: str | None = None,
    image: str | None = None,
    paused: bool = False,
    create_pool: bool = False,
    cwd: str | None = None,
) -> dict[str, Any]:
    """Create or update the deployments on the server PREFECT_API_URL points at.

    Args:
        store, corpus, storage_options, nightly_cron, weekly_cron: see
            `deployments.serve.deployment_specs`.
        pool: the work pool (of type process); `create_pool` creates it if missing.
        repo, branch, install_command: what the workers clone and how they install it
            (see `deployments.steps.source_settings`; defaults from the checkout at `cwd`).
        result_storage: Prefect block ("remote-file-system/NAME" ...) for task results, given
            to the flow runs as PREFECT_DEFAULT_RESULT_STORAGE_BLOCK (job variables).
        notify: notification block ("custom-webhook/NAME" ...) that the failure automation
            sends through (deployments/automations.py); None installs none.
        image: the container image of a docker work pool's flow runs (job variable `image`),
            one with tokenmill installed (the repository's Dockerfile); None: the pool's.
        paused: create the schedules paused.

    Returns:
        ``{"deployments": [("flow/deployment", deployment id), ...], "repo", "branch", "install"}``

    Raises:
        InputError: no server, a bad cron string, no repository, a missing pool or block.
    """
    from prefect.schedules import Cron
    from prefect.types.entrypoint import EntrypointType

    from deployments import entrypoints
    from deployments.serve import _require_server
    from deployments.steps import work_queue

    _require_server("tokenmill deploy")
    specs = deployment_specs(store, corpus, storage_options, nightly_cron, weekly_cron)
    source = source_settings(repo, branch, install_command, cwd)
    pull = pull_steps(source["repo"], source["branch"], source["install"])
    _ensure_pool(pool, create_pool)
    if result_storage:
        load_block(result_storage, "--result-storage")
    if notify:
        load_block(notify, "--notify")
    work_queue(pool, SCHEDULED_QUEUE, concurrency_limit=1)
    done = []
    for spec in specs:
        flow = entrypoints.FLOWS[spec.flow]
        deployment = flow.to_deployment(
            name=spec.name,
            schedules=[Cron(spec.cron, timezone=TIMEZONE)] if spec.cron else None,
            parameters=spec.parameters,
            description=spec.description,
            tags=list(spec.tags),
            paused=paused,
            concurrency_limit=spec.concurrency(),
            work_pool_name=pool,
            work_queue_name=spec.work_queue,
            job_variables={"env": job_env(result_storage, spec.runner), **({"image": image} if image else {})},
            entrypoint_type=EntrypointType.MODULE_PATH,
        )
        deployment.entrypoint = spec.entrypoint
        deployment.storage = PullSteps(pull)
        done.append((f"{flow.name}/{spec.name}", deployment.apply()))
    if notify:
        from deployments.automations import install_failure_notification

        install_failure_notification(notify)
    return {"deployments": done, **source}


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of `tokenmill deploy` (for `python -m deployments.deploy` and the CLI)."""
    parser.add_argument(
        "--store",
        default=DEFAULT_STORE,
        help="artifact store URL or path, the deployments' default (default: %(default)s, made absolute)",
    )
    parser.add_argument(
        "--corpus",
        action="append",
        metavar="URL",
        help="corpus URL or glob (repeatable; default: the bundled tiny Shakespeare)",
    )
    parser.add_argument(
        "--storage-options",
        type=_json_object,
        metavar="JSON",
        help="fsspec options for store and corpus as JSON (no secrets: parameters show in the UI)",
    )
    parser.add_argument(
        "--pool", default=WORK_POOL, help="process work pool the deployments run on (default: %(default)s)"
    )
    parser.add_argument(
        "--create-pool", action="store_true", help="create the work pool (type process) if it does not exist"
    )
    parser.add_argument(
        "--nightly-cron",
        default=NIGHTLY_CRON,
        metavar="CRON",
        help=f"schedule of nightly-tokenize, {TIMEZONE} (default: %(default)s)",
    )
    parser.add_argument(
        "--weekly-cron",
        default=WEEKLY_CRON,
        metavar="CRON",
        help=f"schedule of weekly-retrain, {TIMEZONE} (default: %(default)s)",
    )
    parser.add_argument(
        "--repo", help="git URL or path the workers clone (default: this checkout's origin remote, else this checkout)"
    )
    parser.add_argument(
        "--branch",
        help="branch to clone (default: this checkout's branch when --repo is not given, else the default branch)",
    )
    parser.add_argument(
        "--install-command",
        metavar="CMD",
        help=f"run in the clone before each flow run (default: {DEFAULT_INSTALL!r}; "
        "'none': the worker's Python has tokenmill installed, no clone and no install; "
        "'python -m deployments.wheel_cache --no-deps' where the worker's environment has the dependencies)",
    )
    parser.add_argument(
        "--result-storage",
        metavar="BLOCK",
        help="Prefect block for task results, shared by all workers (e.g. remote-file-system/tokenmill-results)",
    )
    parser.add_argument(
        "--notify",
        metavar="BLOCK",
        help="notification block (e.g. custom-webhook/ops-alerts): notify when a tokenmill flow run fails or crashes",
    )
    parser.add_argument(
        "--image",
        help="container image for a docker work pool's flow runs, with tokenmill installed (see the Dockerfile); use "
        "with --install-command none",
    )
    parser.add_argument("--paused", action="store_true", help="create the schedules paused")
    return parser


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def run(args: argparse.Namespace) -> int:
    """`tokenmill deploy` with parsed `args` (raises TokenmillError on bad input)."""
    result = deploy(
        args.store,
        args.corpus,
        storage_options=args.storage_options,
        pool=args.pool,
        nightly_cron=args.nightly_cron,
        weekly_cron=args.weekly_cron,
        repo=args.repo,
        branch=args.branch,
        install_command=args.install_command,
        result_storage=args.result_storage,
        notify=args.notify,
        image=args.image,
        paused=args.paused,
        create_pool=args.create_pool,
    )
    if result["install"].strip().lower() == PREINSTALLED:
        how = "workers run the tokenmill installed in their Python (no clone, no install)"
    else:
        how = f"workers clone {result['repo']} ({result['branch'] or 'default branch'}) and run {result['install']!r}"
    print(f"tokenmill deploy: {len(result['deployments'])} deployments on work pool {args.pool!r}; {how}")
    for name, deployment_id in result["deployments"]:
        print(f"  {name}  {deployment_id}")
    checkout = local_checkout()
    if checkout is not None and checkout["dirty"] and not args.repo:
        print(f"tokenmill deploy: note: {checkout['root']} has uncommitted changes; the workers will not see them")
    print(f"start a worker: prefect worker start --pool {args.pool}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m deployments.deploy``: the same as `tokenmill deploy`."""
    parser = add_arguments(argparse.ArgumentParser(prog="tokenmill deploy", description=__doc__.split("\n\n")[0]))
    args = parser.parse_args(argv)
    try:
        return run(args)
    except TokenmillError as e:
        print(f"tokenmill deploy: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
