"""Deploy-time settings and the pull steps that put the code on a clean worker.

`prefect deploy` runs `settings` as a build step of deployments/prefect.yaml and uses its
outputs as the deployments' default parameters, pull steps and job variables
(``{{ settings.store }}`` ...); `tokenmill deploy` (deployments/deploy.py) takes the same
values as flags. From the deploying process's environment:

    TOKENMILL_STORE            artifact store URL or path (default ./artifacts, made absolute)
    TOKENMILL_CORPUS           corpus URL or glob; several separated by spaces (default: the
                               flow's default, the bundled tiny Shakespeare)
    TOKENMILL_STORAGE_OPTIONS  fsspec options as JSON, e.g. '{"client_kwargs":
                               {"endpoint_url": "http://127.0.0.1:9000"}}' (default: none)
    TOKENMILL_REPO             git URL or path the workers clone (default: the deploying
                               checkout's `origin` remote, else the checkout itself)
    TOKENMILL_BRANCH           branch to clone (default: the checkout's current branch when
                               TOKENMILL_REPO is unset; else the repository's default branch)
    TOKENMILL_INSTALL          command run in the clone before each flow run (default
                               `python -m deployments.wheel_cache`: installs the wheel of
                               this code version from the wheel cache, building it with the
                               worker's compiler the first time); `none`: the worker's Python
                               already has tokenmill installed, no clone and no install
    TOKENMILL_RESULT_STORAGE   Prefect block (`remote-file-system/NAME`, `s3-bucket/NAME` ...)
                               for task results, so cache hits and per-shard resume work across
                               machines (default: each worker's PREFECT_LOCAL_STORAGE_PATH)

Why a step and not Prefect's ``{{ $VAR }}``: an unset variable there becomes an empty string
(a store of "" is the deploy directory itself, a corpus of [""] fails at run time); this
step gives None for what is unset, which the flows read as "use the default".
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from typing import Any

from pipeline_lib.fsio import InputError

# Builds the wheel once per code version, into the wheel cache (deployments/wheel_cache.py).
DEFAULT_INSTALL = "python -m deployments.wheel_cache"
PREINSTALLED = "none"  # TOKENMILL_INSTALL / --install-command: the worker's Python has tokenmill; no clone, no install
RESULT_STORAGE_ENV = "PREFECT_DEFAULT_RESULT_STORAGE_BLOCK"


def absolute(url: str) -> str:
    """Local paths absolute (flow runs may start in another directory); URLs unchanged."""
    return url if "://" in url else os.path.abspath(os.path.expanduser(url))


def _git(args: list[str], cwd: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def local_checkout(cwd: str | None = None) -> dict[str, Any] | None:
    """The git checkout `cwd` is in: ``{"root", "repo", "branch", "dirty"}``, or None.

    `repo` is the `origin` remote (a relative path made absolute), else the checkout's own
    path; `branch` is None on a detached HEAD; `dirty` is True when files differ from HEAD
    (such changes are not what the workers clone).
    """
    cwd = os.path.abspath(cwd or os.getcwd())
    root = _git(["rev-parse", "--show-toplevel"], cwd)
    if root is None:
        return None
    origin = _git(["remote", "get-url", "origin"], root)
    if origin and "://" not in origin and not _scp_like(origin):
        origin = os.path.normpath(os.path.join(root, os.path.expanduser(origin)))
    branch = _git(["rev-parse", "--abbrev-ref", "HEAD"], root)
    return {
        "root": root,
        "repo": origin or root,
        "branch": None if branch in (None, "HEAD") else branch,
        "dirty": _git(["status", "--porcelain", "--untracked-files=no"], root) is not None,
    }


def _scp_like(url: str) -> bool:
    """git@host:org/repo.git (no scheme, a colon before any slash)."""
    head = url.split("/", 1)[0]
    return ":" in head and not os.path.exists(url)


def source_settings(
    repo: str | None = None, branch: str | None = None, install: str | None = None, cwd: str | None = None
) -> dict[str, Any]:
    """``{"repo", "branch", "install"}`` for the pull steps; unset values from the checkout at `cwd`.

    Raises:
        InputError: no repository given and `cwd` is not in a git checkout.
    """
    if not repo:
        checkout = local_checkout(cwd)
        if checkout is None:
            raise InputError(
                f"no repository for the workers to clone: {os.path.abspath(cwd or os.getcwd())} is not a git checkout; "
                "set TOKENMILL_REPO (tokenmill deploy --repo) to a git URL or path"
            )
        repo, branch = checkout["repo"], branch or checkout["branch"]
    elif "://" not in repo and not _scp_like(repo):
        repo = absolute(repo)
    install = (install or "").strip() or DEFAULT_INSTALL
    return {"repo": repo, "branch": branch or None, "install": install}


def pull_steps(repo: str, branch: str | None, install: str) -> list[dict[str, Any]]:
    """What a worker runs before each flow run (deployments/prefect.yaml's `pull:` rendered).

    Clone (or update) the repository in the flow run's working directory, run the install
    command in the clone, then go back to the working directory: the module-path entrypoint
    (``deployments.entrypoints.FLOW``) is then imported from the installed package, with its
    compiled core, not from the bare clone (which has no built core).
    """
    if install.strip().lower() == PREINSTALLED:
        # The entrypoint is imported from the worker's own installation; nothing to fetch.
        return [{"prefect.deployments.steps.set_working_directory": {"directory": "."}}]
    return [
        {"prefect.deployments.steps.git_clone": {"id": "clone", "repository": repo, "branch": branch}},
        {"prefect.deployments.steps.run_shell_script": {"directory": "{{ clone.directory }}", "script": install}},
        {"prefect.deployments.steps.set_working_directory": {"directory": "."}},
    ]


def job_env(result_storage: str | None = None, runner: str | None = None) -> dict[str, str]:
    """`job_variables.env` of a deployment: tokenmill's flow-run heartbeat (for the zombie
    automation, deployments/automations.py), and the result storage block and task runner
    when set."""
    from deployments.automations import heartbeat_env

    env: dict[str, str] = heartbeat_env()
    if result_storage:
        env[RESULT_STORAGE_ENV] = check_block_slug(
            result_storage, "TOKENMILL_RESULT_STORAGE (tokenmill deploy --result-storage)"
        )
    if runner:
        env["TOKENMILL_RUNNER"] = runner
    return env


def check_block_slug(slug: str, what: str) -> str:
    parts = slug.strip().split("/")
    if len(parts) != 2 or not all(parts):
        raise InputError(
            f"{what}: expected a block as BLOCK-TYPE/NAME (e.g. remote-file-system/tokenmill-results, "
            f"custom-webhook/ops-alerts), got {slug!r}"
        )
    return slug.strip()


def settings(store_default: str = "./artifacts", **_: Any) -> dict[str, Any]:
    """Outputs ``store``, ``corpus``, ``storage_options`` (None when unset), ``repo``,
    ``branch``, ``install`` (the pull steps), ``env`` and ``dask_env`` (job variables)."""
    corpus = shlex.split(os.environ.get("TOKENMILL_CORPUS", ""))
    out: dict[str, Any] = {
        "store": absolute(os.environ.get("TOKENMILL_STORE", "").strip() or store_default),
        "corpus": [absolute(c) for c in corpus] or None,
        "storage_options": None,
    }
    raw = os.environ.get("TOKENMILL_STORAGE_OPTIONS", "").strip()
    if raw:
        try:
            options = json.loads(raw)
        except json.JSONDecodeError as e:
            raise InputError(f"TOKENMILL_STORAGE_OPTIONS is not JSON: {e}") from e
        if not isinstance(options, dict):
            raise InputError("TOKENMILL_STORAGE_OPTIONS must be a JSON object")
        out["storage_options"] = options
    out.update(
        source_settings(
            os.environ.get("TOKENMILL_REPO", "").strip(),
            os.environ.get("TOKENMILL_BRANCH", "").strip(),
            os.environ.get("TOKENMILL_INSTALL"),
        )
    )
    result_storage = os.environ.get("TOKENMILL_RESULT_STORAGE", "").strip() or None
    out["env"] = job_env(result_storage)
    out["dask_env"] = job_env(result_storage, runner="dask")
    print(f"tokenmill deploy settings: {json.dumps(out)}")
    checkout = local_checkout()
    if checkout is not None and checkout["dirty"] and not os.environ.get("TOKENMILL_REPO", "").strip():
        print(
            f"tokenmill deploy: note: {checkout['root']} has uncommitted changes; workers clone {out['repo']} "
            f"({out['branch'] or 'default branch'}) without them"
        )
    return out


def work_queue(pool: str, name: str, concurrency_limit: int | None = None, **_: Any) -> dict[str, Any]:
    """Create work queue `name` in work pool `pool`, or update it, with `concurrency_limit`
    (None: no limit). A worker starts no run from a queue that already has that many
    Pending/Running, so deployments sharing a queue of limit 1 never overlap.

    Raises:
        InputError: the work pool does not exist.
    """
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(pool)
        except ObjectNotFound:
            raise InputError(
                f"work pool {pool!r} does not exist: create it with `prefect work-pool create {pool} --type process`"
            ) from None
        try:
            queue = client.read_work_queue_by_name(name, work_pool_name=pool)
        except ObjectNotFound:
            queue = client.create_work_queue(name=name, work_pool_name=pool, concurrency_limit=concurrency_limit)
        else:
            if queue.concurrency_limit != concurrency_limit:
                client.update_work_queue(queue.id, concurrency_limit=concurrency_limit)
    return {"work_queue": name, "work_queue_concurrency_limit": concurrency_limit}


def load_block(slug: str, what: str) -> Any:
    """The block document `slug` ("block-type/name") from the server, checked to exist.

    Only the server is asked (no block class needed here): the machines that use the block
    (workers) need its package (s3fs for remote-file-system on s3://, prefect-aws for s3-bucket).

    Raises:
        InputError: malformed slug, or no such block.
    """
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    block_type, name = check_block_slug(slug, what).split("/")
    with get_client(sync_client=True) as client:
        try:
            return client.read_block_document_by_name(name, block_type_slug=block_type, include_secrets=False)
        except ObjectNotFound:
            raise InputError(
                f"{what} {slug!r}: the Prefect server has no such block; create it first (docs/operations.md, "
                "'Deployments on a clean worker')"
            ) from None
