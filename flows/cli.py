"""`tokenmill`: the program's `main` (parse, run the command, report a failure as one line).

The commands and their options are described in flows/cli_parser.py (`tokenmill --help`);
they live by concern: flows/cli_pipeline.py (the pipeline's flows), flows/cli_tokenizer.py,
flows/cli_store.py, the options generated from the stage configs in flows/cli_options.py,
shared helpers in flows/cli_common.py; `serve` and `deploy` in deployments/cli.py (an entry
point: the flows never import the deployments).
"""

from __future__ import annotations

if __name__ == "__main__":  # `python -m flows.cli`: the warm runner first, before the imports below
    import sys as _sys

    from flows.warm import run_warm as _run_warm

    _status = _run_warm(_sys.argv[1:])
    if _status is not None:
        _sys.exit(_status)

import argparse
import contextlib
import os
import sys

from flows.cli_common import DEFAULT_STORE
from flows.cli_options import (
    COMPARE_CONFIGS,
    ENCODE_CONFIGS,
    LM_CONFIGS,
    REPORT_CONFIGS,
    RUN_CONFIGS,
    SAMPLE_CONFIGS,
    SWEEP_CONFIGS,
    TOKENIZER_CONFIGS,
    _config_classes,
    add_config_options,
    configs_from_args,
    flag_of,
)
from flows.cli_parser import build_parser
from flows.cli_pipeline import _yours_in_report, cmd_encode, cmd_lm_train, cmd_report, cmd_run, cmd_sweep
from flows.cli_tokenizer import cmd_tokenizer_train
from flows.failures import (
    ENV_DEBUG,
    ENV_LOG_DIR,
    EXIT_BROKEN_PIPE,
    PREFECT_CONSOLE_CLASS,
    _error_line_printed,
    report_failure,
)
from flows.home import prefect_home
from flows.signals import _command, _sigterm_raises

# What callers (tests, benchmarks, the warm runner) import from here, wherever it lives now.
__all__ = [
    "COMPARE_CONFIGS",
    "DEFAULT_STORE",
    "ENCODE_CONFIGS",
    "ENV_DEBUG",
    "ENV_LOG_DIR",
    "LM_CONFIGS",
    "PREFECT_CONSOLE_CLASS",
    "REPORT_CONFIGS",
    "RUN_CONFIGS",
    "SAMPLE_CONFIGS",
    "SWEEP_CONFIGS",
    "TOKENIZER_CONFIGS",
    "_config_classes",
    "_yours_in_report",
    "add_config_options",
    "build_parser",
    "configs_from_args",
    "flag_of",
    "main",
    "use_console_handler",
]


@contextlib.contextmanager
def _debug_env(debug: bool):
    previous = os.environ.get(ENV_DEBUG)
    if debug:
        os.environ[ENV_DEBUG] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(ENV_DEBUG, None)
        else:
            os.environ[ENV_DEBUG] = previous


# Commands that run stages: a rerun after a failure resumes them.
# A command of a layer above says so itself (``set_defaults(resumable=True)``: serve).
_RESUMABLE = (cmd_run, cmd_sweep, cmd_tokenizer_train, cmd_encode, cmd_lm_train, cmd_report)


def _resumable(args: argparse.Namespace) -> bool:
    return args.func in _RESUMABLE or bool(getattr(args, "resumable", False))


def use_console_handler() -> None:
    """Our console handler for Prefect's logs (PREFECT_CONSOLE_CLASS), set before anything
    imports Prefect: its settings read it then (in a command's process, or once in the warm
    runner for every command it runs). A logging.yml of the user's own is left alone."""
    if not os.environ.get("PREFECT_LOGGING_SETTINGS_PATH") and not os.path.exists(
        os.path.join(prefect_home(), "logging.yml")
    ):
        os.environ.setdefault(*PREFECT_CONSOLE_CLASS)


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the program itself (the `tokenmill` script, python -m flows.cli), not a caller in-process
        try:
            return main(sys.argv[1:])
        finally:
            # The process exits next. The interpreter's last garbage collections would walk every
            # object Prefect and pydantic made (1-3 s on a loaded 2-core machine) only to free
            # memory the exit frees anyway; frozen objects are skipped. atexit handlers (Prefect's
            # event and log flushes) still run.
            import gc

            gc.freeze()
    argv = list(argv)
    _error_line_printed.clear()  # one error line per command (a caller may run several in one process)
    use_console_handler()
    args = build_parser(argv).parse_args(argv)
    debug = bool(getattr(args, "debug", False)) or os.environ.get(ENV_DEBUG, "").strip().lower() not in (
        "",
        "0",
        "false",
        "no",
    )
    _command.update(store=getattr(args, "store", None), resumable=_resumable(args))
    with _debug_env(debug):
        try:
            if isinstance(getattr(args, "store", None), str):  # before any work: a store URL that cannot hold results
                from pipeline_lib.store_layout import check_store_url  # not the store itself: its backends

                check_store_url(args.store, durable=True)
            with _sigterm_raises():
                return args.func(args)
        except (SystemExit, GeneratorExit):
            raise
        except BrokenPipeError:
            # The reader of our output went away (`tokenmill ... | head`): not a failure to
            # report, as for any filter. Python's own recipe: no flush of stdout at exit.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_BROKEN_PIPE
        except BaseException as e:  # noqa: BLE001 - the one place every failure is reported
            return report_failure(e, argv, getattr(args, "store", None), debug, resumable=_resumable(args))


if __name__ == "__main__":
    sys.exit(main())
