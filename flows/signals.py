"""SIGTERM during a command: raised as `Terminated` in the main thread so that `finally`
blocks and Prefect's crash handling run, and the process ended within `EXIT_GRACE_S`
after its one error line."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Any

from flows.failures import EXIT_TERMINATED, Terminated, _error_line_lock, _error_line_printed, _redact, describe_failure

EXIT_GRACE_S = 10.0  # from SIGTERM to the process's end, at most


_command: dict[str, Any] = {}  # the running command's store and whether a rerun resumes it (main)


def _exit_now(status: int) -> None:
    """End the process now, after its one error line (printed here if not yet)."""
    from flows import warm

    if _error_line_lock.acquire(timeout=2.0):
        if not _error_line_printed.is_set():
            failure = describe_failure(
                Terminated(signal.SIGTERM), _command.get("store"), _command.get("resumable", True)
            )
            with contextlib.suppress(OSError, ValueError):
                print(f"tokenmill: error: {_redact(failure.message)}", file=sys.stderr, flush=True)
            _error_line_printed.set()
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    warm.exit_now(status)


@contextlib.contextmanager
def _sigterm_raises():
    """Turn SIGTERM into `Terminated` in the main thread (so `finally` blocks and Prefect's
    crash handling run), unless someone else already handles it."""
    try:
        if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) not in (
            signal.SIG_DFL,
            None,
        ):
            yield
            return
    except ValueError:
        yield
        return

    def raise_terminated(signum, frame):
        # The exit that follows waits for Prefect's threads (a task run waiting for a
        # concurrency slot never ends) and at-exit flushes to the API: bounded.
        timer = threading.Timer(EXIT_GRACE_S, _exit_now, (EXIT_TERMINATED,))
        timer.daemon = True
        timer.start()
        raise Terminated(signum)

    signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
