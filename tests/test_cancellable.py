"""flows.cancellable: Prefect's termination of a flow run stops the native calls of its
tasks. A flow-run process (against the session's Prefect API) runs a mapped stage task on
tokenmill's thread runner, deep in the compiled core; SIGTERM — what a worker or runner
sends to cancel a deployment run — must end the task within a second or two, not run it to
the end, and never record it Completed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("pipeline_lib._tokcore")
pytestmark = pytest.mark.usefixtures("prefect_harness")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent("""
    import sys, time
    from prefect import flow, task
    from pipeline_lib.errors import CancelledError
    from pipeline_lib.tokenizer import PieceCounts
    from flows.runners import make_task_runner
    from tasks.factory import _wait_awake, cancelled_state

    DOC = open("pipeline_lib/data/tinyshakespeare.txt", "rb").read() * 8  # 9 MB

    @task
    def count_everything():
        print("READY", flush=True)
        t0 = time.monotonic()
        try:
            PieceCounts("cl100k").add_documents([DOC] * 4096)  # one native call over 37 GB: minutes
        except CancelledError as e:
            print(f"STOPPED {time.monotonic() - t0:.2f}", flush=True)
            return cancelled_state("count_everything", e)
        return "finished"

    @flow(task_runner=make_task_runner("threads", 2))
    def cancellable():
        future = count_everything.submit()
        _wait_awake(future)  # the flow's main thread waits as tasks.factory's stages do
        return future.state.name

    cancellable()
""")


def test_sigterm_stops_a_task_in_the_core_and_records_it_cancelled():
    from prefect.client.orchestration import get_client
    from prefect.settings import get_current_settings

    env = {**os.environ, "PREFECT_API_URL": get_current_settings().api.url or ""}
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "READY", (
            proc.stderr.read()[-3000:] if proc.stderr else ""
        )
        time.sleep(1.5)  # inside the native call
        assert proc.poll() is None
        sent = time.monotonic()
        proc.terminate()
        out, err = proc.communicate(timeout=60)
        exited_s = time.monotonic() - sent
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    stopped = [line for line in out.splitlines() if line.startswith("STOPPED")]
    assert stopped, out + err[-3000:]
    print(
        f"\nSIGTERM -> task stopped in the core: {float(stopped[0].split()[1]) - 1.5:.2f} s after the signal; "
        f"process exited after {exited_s:.2f} s"
    )
    assert exited_s < 15, exited_s
    # Task-run states reach the server as events, written asynchronously: let them settle.
    # A process terminated this fast may go before its last event is sent (the task then
    # stays Running); whatever arrives must say Cancelled, never Completed or Failed. The
    # served run of tests/test_deployments.py (slow) checks the recorded state end to end.
    deadline = time.monotonic() + 20
    with get_client(sync_client=True) as client:
        while True:
            mine = [r for r in client.read_task_runs() if r.name.startswith("count_everything")]
            if (mine and mine[0].state is not None and mine[0].state.is_final()) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert mine and mine[0].state is not None and mine[0].state.name in ("Cancelled", "Running"), [
        (r.name, r.state) for r in mine
    ]
