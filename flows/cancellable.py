"""Prefect's cancellation of a flow run, carried into the compiled core.

When a deployment run is cancelled (UI, API, `prefect flow-run cancel`), its worker or
runner sends the flow-run process SIGTERM; Prefect's engine turns that into a
TerminationSignal on the main thread (tasks.factory keeps that thread waking up while it
waits for mapped tasks), which leaves the flow body through the task runner, and the run is
recorded Cancelled. Prefect's thread runner only stops tasks that have not started, and
waits for the others: a `count_words` / `encode_shard` task inside a native call ran to
its end (seconds to minutes per shard) and was recorded Completed.

`ThreadPoolTaskRunner` here first stops every native call of the process
(`pipeline_lib.cancel.cancel_native_calls`): each in-flight task gets a CancelledError
within the core's polling interval, returns a Cancelled state (tasks.factory), and leaves
its partial output in the staging area for `tokenmill gc`. The process is going down, so
later native calls from worker threads are refused too (``shutting_down=True``): a task
between two calls does not start its next unit.

Only a cancel that reaches the process stops it: Prefect cancels runs that a worker or a
runner (`tokenmill serve`) started. A plain `tokenmill run` in a terminal has no
supervisor to send the signal (Ctrl-C stops it).
"""

from __future__ import annotations

from typing import Any

from prefect.exceptions import TerminationSignal
from prefect.task_runners import ThreadPoolTaskRunner as PrefectThreadPoolTaskRunner

from pipeline_lib.cancel import cancel_native_calls


class ThreadPoolTaskRunner(PrefectThreadPoolTaskRunner):
    """Prefect's thread task runner; when the flow run is terminated it stops native calls.

    The TerminationSignal leaves the flow body through this runner's ``__exit__`` (which
    waits for the worker threads) before the engine calls `cancel_all` on the flow's
    runner: both stop the native calls, so neither waits for a task to end on its own. A
    flow body that ends with an ordinary exception (a failed task) still lets the running
    tasks finish, as Prefect's runner does.
    """

    def cancel_all(self) -> None:
        if not self._exiting:  # the engine's cancel_all_tasks, not our own __exit__
            cancel_native_calls(shutting_down=True)
        super().cancel_all()

    _exiting = False

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self._exiting = True
        if exc_type is not None and issubclass(exc_type, TerminationSignal):
            cancel_native_calls(shutting_down=True)  # the process is going down
        elif exc_type is not None and not issubclass(exc_type, Exception):
            # KeyboardInterrupt, SystemExit: the calls running now (the process may go on:
            # a test, a REPL; a Ctrl-C handler of its own shuts the core down if it exits)
            cancel_native_calls()
        super().__exit__(exc_type, exc_value, traceback)
