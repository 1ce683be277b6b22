"""The `tokenmill` program (pyproject's console script) and the warm runner's process.

`main` hands the command to the warm runner when one of the caller's own can run it
(flows.warm, opt-in with TOKENMILL_WARM=1), else runs it here (flows.cli.main). ``python
-m flows.entry DIR SERVER_PID`` is the runner itself, which `flows.warm.spawn` starts.
Kept apart so that flows.warm imports neither flows.cli nor flows.prefect_api, which use it.
"""

from __future__ import annotations

import os
import sys

from flows import warm
from flows.home import SERVER_DIR, prefect_home


def main() -> None:
    status = warm.run_warm(sys.argv[1:], os.path.join(prefect_home(), SERVER_DIR))
    if status is None:
        from flows.cli import main as cli_main

        status = cli_main()
    sys.exit(status)


def _preload() -> None:
    """The imports every command needs, made once in the runner."""
    import flows.cli

    flows.cli.use_console_handler()  # as each command does before Prefect is imported: once, here

    import flows.lab  # noqa: F401
    import flows.pipeline  # noqa: F401
    import flows.prefect_api  # noqa: F401
    import flows.runners  # noqa: F401
    import flows.sweep  # noqa: F401
    import tasks.factory  # noqa: F401


def _run(argv: list[str]) -> int:
    from flows.cli import main as cli_main

    return cli_main(argv)


def serve_runner(argv: list[str]) -> None:
    from flows.prefect_api import DEFAULT_IDLE_TIMEOUT_S, ENV_IDLE_TIMEOUT, read_float_env

    warm.serve(argv[0], int(argv[1]), _preload, _run, read_float_env(ENV_IDLE_TIMEOUT, DEFAULT_IDLE_TIMEOUT_S))


if __name__ == "__main__":
    # Through the importable modules, not this `__main__` copy: the children's state (the
    # command's environment) must be the one flows.warm and flows.prefect_api see.
    from flows import entry

    entry.serve_runner(sys.argv[1:])
