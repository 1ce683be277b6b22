"""Whether a native call gives the GIL up while it runs (tests of the compiled core)."""

from __future__ import annotations

import sys
import threading
import time


def steps_taken_during(call) -> int:
    """Steps this thread takes while `call()` runs on another thread.

    The switch interval is set far beyond the test, so the GIL changes hands only where a
    thread gives it up: if the native call held it, this thread could not take a step
    between the worker's two readings of the step count (the result is then 0)."""
    done = threading.Event()
    steps, span = [0], {}

    def work():
        span["start"] = steps[0]
        call()
        span["end"] = steps[0]
        done.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        th = threading.Thread(target=work)
        th.start()
        while not done.is_set():
            steps[0] += 1
            time.sleep(0)  # gives the GIL up, so that the worker gets it back after its call
        th.join()
    finally:
        sys.setswitchinterval(interval)
    return span["end"] - span["start"]
