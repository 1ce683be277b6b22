"""Long native calls stay interruptible: Ctrl-C, SIGTERM and cancel_all() end them within a
fraction of a second, cleanly, and the next call works.

The signal tests run a script in a subprocess whose native work would take minutes (tens of
GB to count, or a hundred thousand 1 MB pieces to encode), send the signal once the work has
started, and wait a bounded time: finishing the work is impossible in that time, and the
script prints FINISHED if it ever does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest

from pipeline_lib import Tokenizer
from pipeline_lib import _tokcore as tokcore
from pipeline_lib.errors import CancelledError
from pipeline_lib.tokenizer import PieceCounts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKED_S = 0.5  # CPU seconds the script spends in its native call before the signal


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) that process `pid` has used so far."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


PRELUDE = textwrap.dedent("""
    import signal, sys, threading, time, warnings
    from pipeline_lib import Tokenizer
    from pipeline_lib.tokenizer import PieceCounts

    warnings.simplefilter("ignore")
    DOC = open("pipeline_lib/data/tinyshakespeare.txt", "rb").read() * 8  # 9 MB

    def long_counting():  # one native call over 37 GB: minutes
        PieceCounts("cl100k").add_documents([DOC] * 4096)

    def long_encoding(workers):  # 100,000 pieces of a million bytes each: an hour
        tok = Tokenizer.train([b"a" * (1 << 20)], 300, pattern="gpt2", special_tokens=())
        tok.encode_ordinary_batch_to_numpy([b"a" * ((1 << 20) - 1)] * 100_000, workers)

    def long_text():  # one text of 256 MB, cut at its newlines for two threads: seconds
        tok = Tokenizer.train([b"a" * (1 << 20)], 300, pattern="gpt2", special_tokens=())
        tok._encoder.text_threads = 2
        tok.encode_ordinary(("a" * ((1 << 20) - 3) + "b\\nc") * 256)

    def long_training(workers):  # Tokenizer.train over the same 37 GB
        Tokenizer.train([DOC] * 4096, 1024, workers=workers)
""")


def run_and_signal(body: str, signum: int) -> tuple[subprocess.CompletedProcess, float]:
    """Run PRELUDE + body; once it prints READY and has used WORKED_S more CPU seconds (by its
    progress, not the clock: a loaded machine only delays it), send `signum`. Returns the
    process and the seconds from the signal to its exit, for the log: the work would take
    minutes, so a process that ignored the signal prints FINISHED or runs into the per-test
    timeout."""
    proc = subprocess.Popen(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "READY", proc.stderr.read()[-3000:]
        ready = _cpu_s(proc.pid)
        while proc.poll() is None and _cpu_s(proc.pid) - ready < WORKED_S:
            time.sleep(0.01)
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        sent = time.monotonic()
        proc.send_signal(signum)
        out, err = proc.communicate()
        elapsed = time.monotonic() - sent
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), elapsed


@pytest.mark.parametrize(
    "work", ["long_counting()", "long_encoding(1)", "long_encoding(2)", "long_text()", "long_training(1)"]
)
def test_ctrl_c_on_the_main_thread(work):
    body = f"""
        print("READY", flush=True)
        try:
            {work}
            print("FINISHED", flush=True)
        except KeyboardInterrupt:
            print("INTERRUPTED", flush=True)
            tok = Tokenizer.train(["To be, or not to be: that is the question."] * 3, 300, workers=1)  # works again
            print("AGAIN", tok.decode(tok.encode("to be")), flush=True)
            raise
    """
    done, elapsed = run_and_signal(body, signal.SIGINT)
    assert "FINISHED" not in done.stdout
    assert "INTERRUPTED" in done.stdout and "AGAIN to be" in done.stdout, done.stderr[-3000:]
    assert done.returncode != 0 and done.stderr.rstrip().endswith("KeyboardInterrupt"), done.stderr[-3000:]
    print(f"{work}: exited {elapsed:.2f} s after SIGINT")


@pytest.mark.parametrize("wait", ["worker.join()", "while worker.is_alive(): time.sleep(0.05)"], ids=["join", "sleep"])
@pytest.mark.parametrize("work", ["long_counting()", "long_encoding(2)"])
def test_sigterm_while_a_worker_thread_is_in_native_code(work, wait):
    """The main thread waits in Python; a SIGTERM handler raises SystemExit; the exit stops the
    worker's native call instead of waiting for it to finish."""
    body = f"""
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(3))
        def work():
            {work}
            print("FINISHED", flush=True)
        worker = threading.Thread(target=work)
        worker.start()
        print("READY", flush=True)
        {wait}
    """
    done, elapsed = run_and_signal(body, signal.SIGTERM)
    assert "FINISHED" not in done.stdout
    assert done.returncode == 3, done.stderr[-3000:]
    assert "terminate called" not in done.stderr and "leaked" not in done.stderr, done.stderr[-3000:]
    if "sleep" in wait:
        # the interpreter joined the worker, which got CancelledError out of its call (a
        # join() that a signal interrupts makes CPython forget the thread: it may be cut short)
        assert "pipeline_lib.errors.CancelledError" in done.stderr, done.stderr[-3000:]
    print(f"{work} in a thread, main thread in {wait.split(':')[0]}: exited {elapsed:.2f} s after SIGTERM")


def test_ctrl_c_while_counting_threads_work():
    """Tokenizer.train counts on a thread pool while the main thread waits on futures:
    Ctrl-C there stops the workers' native calls before the pool joins them."""
    body = """
        print("READY", flush=True)
        long_training(2)
        print("FINISHED", flush=True)
    """
    done, elapsed = run_and_signal(body, signal.SIGINT)
    assert "FINISHED" not in done.stdout
    assert done.returncode != 0 and done.stderr.rstrip().endswith("KeyboardInterrupt"), done.stderr[-3000:]
    print(f"Tokenizer.train(workers=2): exited {elapsed:.2f} s after SIGINT")


# ---- cancel_all() in-process --------------------------------------------------------------------


def _in_thread(fn):
    result = {}

    def run():
        try:
            result["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            result["error"] = e

    th = threading.Thread(target=run)
    th.start()
    return th, result


@pytest.mark.parametrize("threads", [1, 2])
def test_cancel_all_stops_running_calls_and_the_next_call_works(threads):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = Tokenizer.train([b"a" * (1 << 20)], 300, pattern="gpt2", special_tokens=())
    doc = b"a" * ((1 << 20) - 1)
    big = open(os.path.join(ROOT, "pipeline_lib", "data", "tinyshakespeare.txt"), "rb").read() * 8
    counter = PieceCounts("cl100k")
    jobs = [
        _in_thread(lambda: tok.encode_ordinary_batch_to_numpy([doc] * 100_000, threads)),
        _in_thread(lambda: counter.add_documents([big] * 4096)),
    ]
    # cancel_all() stops the calls that started before it: repeat it until both calls have
    # started and stopped (their work takes minutes; a call that ignored it would run on,
    # and the per-test timeout would fail the test).
    for th, _ in jobs:
        while th.is_alive():
            tokcore.cancel_all()
            th.join(0.05)
    for _, result in jobs:
        assert isinstance(result.get("error"), CancelledError), result
    # the counter stopped half-way and says so; everything else works as before
    with pytest.raises(ValueError, match="interrupted"):
        counter.to_arrays()
    flat, offsets = tok.encode_ordinary_batch_to_numpy([doc] * 3, threads)
    assert offsets.tolist() == [0, 20, 40, 60] and tok.decode(flat[:20]) == doc.decode()
    fresh = PieceCounts("cl100k")
    fresh.add_documents([b"hello world"])
    assert fresh.to_arrays()[0] == [b" world", b"hello"]


def test_cancel_all_only_stops_calls_already_running():
    tokcore.cancel_all()
    ids = tokcore.learn_merges([b"abab"], np.array([2]), 2)
    assert ids.tolist() == [[97, 98, 256], [256, 256, 257]]


def test_shutting_down_refuses_new_calls_from_other_threads():
    """cancel_native_calls(shutting_down=True), for Ctrl-C / SIGTERM handlers: a worker that
    loops over batches stops at its next call; the main thread (exit handlers) still works."""
    script = PRELUDE + textwrap.dedent("""
        from pipeline_lib.cancel import cancel_native_calls
        from pipeline_lib.errors import CancelledError

        def batches():
            n = 0
            try:
                while True:
                    PieceCounts("cl100k").add_documents([DOC[:100_000]])
                    n += 1
            except CancelledError:
                print("WORKER STOPPED", n > 0, flush=True)

        worker = threading.Thread(target=batches)
        worker.start()
        time.sleep(0.5)
        cancel_native_calls(shutting_down=True)
        worker.join(10)
        print("JOINED", not worker.is_alive(), flush=True)
        counts = PieceCounts("cl100k")
        counts.add_documents([b"still works"])
        print("MAIN", len(counts), flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["WORKER", "STOPPED", "True", "JOINED", "True", "MAIN", "2"], done.stdout
