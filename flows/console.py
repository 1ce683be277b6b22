"""Prefect's console log handler, minus the tracebacks of failed flow and task runs.

When a stage fails, Prefect's engine logs the exception with its traceback twice (once
for the task run, once for the flow run) to every handler, the console included; the
`tokenmill` command then reports the same failure in one line. This handler prints those
records without the traceback, so the console shows Prefect's one-line summaries and our
``tokenmill: error:`` line, while Prefect's API logs (the UI) and the CLI's log file keep
the full traceback.

It is installed the way Prefect documents for changing any part of its logging.yml, an
environment override of one key: ``tokenmill`` sets
``PREFECT_LOGGING_HANDLERS_CONSOLE_CLASS=flows.console.ConsoleHandler`` before Prefect is
imported, so Prefect's own `setup_logging` builds this handler (with the formatter, styles
and level of its logging.yml) in the CLI process and in every worker process it starts
(process pool, Dask LocalCluster), which inherit the environment. A user's own setting of
that variable wins. ``TOKENMILL_DEBUG=1`` (``tokenmill --debug``) keeps the tracebacks.

Only records of the run loggers (``prefect.flow_runs``, ``prefect.task_runs``) lose their
traceback: any other record with one (a Prefect or server bug) is printed whole.
"""

from __future__ import annotations

import copy
import logging
import os

from prefect.logging.handlers import PrefectConsoleHandler

ENV_DEBUG = "TOKENMILL_DEBUG"
# A record logged with extra={PLAIN: True} (the lab's merge lines, traces, tables) is printed
# as its message alone, as a learner reads it; Prefect's API logs keep it as any other.
PLAIN = "plain"
RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")


def debug_enabled() -> bool:
    return os.environ.get(ENV_DEBUG, "").strip().lower() not in ("", "0", "false", "no")


class ConsoleHandler(PrefectConsoleHandler):
    """`PrefectConsoleHandler` that prints run-failure records without their traceback."""

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, PLAIN, False):
            try:
                self.console.print(record.getMessage(), soft_wrap=True, markup=False, highlight=False)
            except Exception:
                self.handleError(record)
            return
        if (
            (record.exc_info or record.exc_text or record.stack_info)
            and record.name.startswith(RUN_LOGGERS)
            and not debug_enabled()
        ):
            # A copy: the record is shared with the handlers that run after this one.
            record = copy.copy(record)
            record.exc_info = record.exc_text = record.stack_info = None
        super().emit(record)
