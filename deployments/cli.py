"""The deployments' `tokenmill` commands, `serve` and `deploy`: registered as an entry point
(pyproject.toml, group "tokenmill.commands") that flows/cli_parser.py loads, so that the
flows, below, never import the deployments."""

from __future__ import annotations

from typing import Any

from flows.cli_common import _storage_options
from flows.cli_options import _add_runner, _add_store


def cmd_serve(args) -> int:
    from deployments.serve import serve

    serve(
        store=args.store,
        corpus=args.corpus,
        storage_options=_storage_options(args.storage_option) or None,
        runner=args.runner,
        workers=args.workers,
        dask_address=args.dask_address,
        paused=args.paused,
    )
    return 0


def cmd_deploy(args) -> int:
    from deployments.deploy import run

    return run(args)


def add_commands(sub: Any, path: tuple[str, ...] | None = None) -> None:
    """Add `serve` and `deploy` to the `tokenmill` parser's subcommands `sub` (`path`: the
    command words of the line being parsed, None for all)."""
    p = sub.add_parser("serve", help="serve the scheduled deployments from this process (needs a Prefect server)")
    _add_store(p)
    p.add_argument("--corpus", action="append", metavar="URL")
    _add_runner(p)
    p.add_argument("--paused", action="store_true", help="register the schedules paused")
    p.set_defaults(func=cmd_serve, resumable=True)  # it runs stages: a rerun after a failure resumes them
    p = sub.add_parser(
        "deploy",
        help="create the deployments on a Prefect server, for process workers on any machine "
        "(they clone and install the project)",
    )
    if path is None or path[:1] == ("deploy",):  # its options import Prefect's deployment machinery
        from deployments.deploy import add_arguments

        add_arguments(p)
    p.set_defaults(func=cmd_deploy)
