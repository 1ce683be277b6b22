"""Fixed costs a user pays on every call: the `tokenmill tokenizer` command's start and the
Python wrapper around one short `encode`.

Run by hand (not part of the tests):

    python benchmarks/bench_startup.py                 # both, 10 runs of the command
    python benchmarks/bench_startup.py --runs 20 --calls 50000 --text "hello world"

command   `tokenmill tokenizer encode --tokenizer DIR --text hi` (DIR: a small tokenizer
          saved here first) and the same with `--tokenizer cl100k_base`, each a fresh
          process timed from spawn to exit: the median and the spread of --runs runs
          (`python -X importtime -m flows.cli tokenizer encode ...` says where the time goes)
program   a program written for tiktoken, as a user runs it (``python -c``: the import, the
          encoding's load, one `encode`): ``import pipeline_lib as tiktoken`` against the
          peers installed (toktok-rs, gigatoken), interleaved, the median of --runs runs
call      `encode`, `encode_ordinary`, `encode(allowed_special="all")` and the native
          `encode_ordinary_list` on --text with cl100k_base, in interleaved rounds of
          --calls calls: the median time per call in microseconds

The load average is printed beside: on a loaded machine compare rows of one run only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import timeit


def command_times(argv: list[str], runs: int) -> list[float]:
    # as in a user's shell, Python caches compiled modules (see bench_encode_file.USER_ENV)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)  # writes the caches
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)
        times.append(time.perf_counter() - start)
    return times


def program_times(runs: int) -> dict[str, list[float]]:
    """A fresh process per run of each program, interleaved (tokenmill, peer, ..., tokenmill, ...)."""
    import importlib.util

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_encode_peers import ranks_file

    programs = {"tokenmill": "import pipeline_lib as tiktoken; enc = tiktoken.get_encoding('cl100k_base')"}
    if importlib.util.find_spec("toktok"):
        programs["toktok-rs"] = "import toktok; enc = toktok._encoding('cl100k_base')"
    if importlib.util.find_spec("gigatoken"):
        programs["gigatoken"] = (
            f"import gigatoken; enc = gigatoken.Tokenizer.from_tiktoken({ranks_file('cl100k_base')!r}, "
            "pretokenizer='cl100k')"
        )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    argv = {name: [sys.executable, "-c", code + "; enc.encode('hello world')"] for name, code in programs.items()}
    for a in argv.values():
        subprocess.run(a, check=True, env=env)  # writes the caches
    times: dict[str, list[float]] = {name: [] for name in argv}
    for _ in range(runs):
        for name, a in argv.items():
            start = time.perf_counter()
            subprocess.run(a, check=True, env=env)
            times[name].append(time.perf_counter() - start)
    return times


def call_times(text: str, calls: int, rounds: int = 15) -> dict[str, float]:
    from pipeline_lib import get_encoding

    enc = get_encoding("cl100k_base")
    native = enc._encoder.encode_ordinary_list if enc._encoder is not None else enc.encode_ordinary
    assert enc.encode(text) == enc.encode_ordinary(text) == native(text)
    cases = {
        "encode": lambda: enc.encode(text),
        "encode(allowed_special='all')": lambda: enc.encode(text, allowed_special="all"),
        "encode_ordinary": lambda: enc.encode_ordinary(text),
        "native encode_ordinary_list": lambda: native(text),
    }
    seen: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):
        for name, f in cases.items():
            seen[name].append(timeit.timeit(f, number=calls) / calls * 1e6)
    return {name: statistics.median(v) for name, v in seen.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="runs of each command (default: %(default)s)")
    ap.add_argument("--calls", type=int, default=20_000, help="calls per round (default: %(default)s)")
    ap.add_argument("--text", default="hi", help="the text encoded (default: %(default)r)")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")

    from pipeline_lib import Tokenizer

    tokenmill = shutil.which("tokenmill") or sys.exit("bench_startup: the tokenmill script is not on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        saved = os.path.join(tmp, "tok")
        Tokenizer.train(["hello world, hello tokens " * 20], vocab_size=270, pattern="cl100k").save(saved)
        for name, tok in (("a saved directory", saved), ("cl100k_base", "cl100k_base")):
            times = command_times(
                [tokenmill, "tokenizer", "encode", "--tokenizer", tok, "--text", args.text], args.runs
            )
            print(
                f"command  tokenizer encode --tokenizer <{name}>: median {statistics.median(times):.3f} s "
                f"(min {min(times):.3f}, max {max(times):.3f}, {args.runs} runs)"
            )
    programs = program_times(args.runs)
    ours = statistics.median(programs["tokenmill"])
    for name, times in programs.items():
        median = statistics.median(times)
        print(
            f"program  {name:10s} import, get_encoding('cl100k_base'), encode: median {median:.3f} s "
            f"(min {min(times):.3f}, max {max(times):.3f}; {median / ours:.2f}x tokenmill's)"
        )
    for name, us in call_times(args.text, args.calls).items():
        print(f"call     {name:32s} {us:.3f} us")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
