"""Stopping the compiled core's long calls: Ctrl-C, SIGTERM and interpreter exit.

The core polls for cancellation inside its long loops (``_core/cancel.h``), so:

* a native call made on the main thread runs Python's signal handlers every ~50 ms: Ctrl-C
  raises KeyboardInterrupt out of it within a fraction of a second, and a SIGTERM handler
  that raises (Prefect's, or one that calls ``sys.exit``) does the same;
* `cancel_native_calls` stops every native call now running, in every thread; each raises
  `pipeline_lib.errors.CancelledError` in its own thread. Calls started afterwards run
  normally (a REPL user who hit Ctrl-C can train again), unless ``shutting_down=True``.

Importing this module registers a hook that runs when the interpreter starts shutting
down, before it joins worker threads: it stops every native call and waits (up to 2 s)
for them to get back into Python. Without it a thread busy in native code (a counting or
encoding worker of a ThreadPoolExecutor) keeps the process alive until its call finishes;
and a thread that gets back only after finalization has begun (a daemon thread) would
abort the process (see ``_core/module.cpp``). From then on, native calls from threads
other than the main one raise CancelledError.

A Ctrl-C / SIGTERM handler of a program that runs native work on other threads (Prefect's
thread task runner) should call ``cancel_native_calls(shutting_down=True)``: the engine
joins those threads before the interpreter exits, and a worker looping over batches would
otherwise start its next call and finish the loop.

This module installs no signal handler.
"""

from __future__ import annotations

# concurrent.futures.thread registers the exit hook that joins executor threads when it is
# imported; threading runs these hooks last-registered-first, so importing it before
# registering ours makes ours run before that join.
import concurrent.futures.thread  # noqa: F401
import threading
from typing import Any

_cores: list[Any] = []  # the compiled core, once pipeline_lib.tokenizer has loaded it


def cancel_native_calls(*, shutting_down: bool = False) -> None:
    """Stop every native call now running in this process (each raises CancelledError).

    With ``shutting_down=True``, later calls from threads other than the main thread raise
    CancelledError at once as well: for a process that is going down.
    """
    for core in _cores:
        if shutting_down:
            core.shutdown()
        else:
            core.cancel_all()


def watch(core: Any) -> None:
    """Called with the compiled core module when it is loaded."""
    if core not in _cores:
        _cores.append(core)


def _at_exit() -> None:
    for core in _cores:
        core.shutdown(wait_s=2.0)


try:
    threading._register_atexit(_at_exit)  # type: ignore[attr-defined]
except RuntimeError:  # imported while the interpreter is already shutting down
    pass
