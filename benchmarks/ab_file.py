"""The file command of two installs against each other: which encodes a file to `.npy` faster.

    python benchmarks/ab_file.py FILE A/bin/tokenmill B/bin/tokenmill [--runs 8] [--encoding cl100k_base]
    python benchmarks/ab_file.py FILE A.so B.so ...  (two builds of the core, this checkout's Python)

Runs `tokenmill tokenizer encode --tokenizer ENC --input FILE --output OUT --special-as-text` of
each install in fresh processes, in turn (A, B, then B, A, ...), the outputs in a temporary
directory, and prints each one's median wall and CPU seconds (user + system
of the process and its children) and the median of the pairwise ratios A/B by wall and by CPU
(above 1: B is faster), which the machine's drift from minute to minute moves the least; the load
average before and after. The two outputs are checked equal once. Two installs: e.g. a clean
clone of the commit before with its own virtual environment, and this one. Two `.so` files (the
`Prof` build of docs/performance.md, one per change): each run loads one as the core, as
`ab_core.py` does, and calls `Tokenizer.encode_file` (what the command calls) in a fresh process.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from ab_core import LOAD_BUILD, ROOT

WITH_BUILD = (
    LOAD_BUILD
    + r"""
from pipeline_lib.tokenizer import get_encoding
get_encoding(sys.argv[4]).encode_file(sys.argv[2], sys.argv[3])
"""
)


def run(tokenmill: str, path: str, out: str, encoding: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of the command (or of a build's encode_file)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    if tokenmill.endswith(".so"):
        command = [sys.executable, "-c", WITH_BUILD, tokenmill, path, out, encoding, ROOT]
    else:
        command = [tokenmill, "tokenizer", "encode", "--tokenizer", encoding, "--input", path, "--output", out]
        command.append("--special-as-text")
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("a", help="install A's tokenmill executable, or a build of the core (.so)")
    parser.add_argument("b", help="install B's tokenmill executable, or a build of the core (.so)")
    parser.add_argument("--runs", type=int, default=8, help="runs of each (default 8)")
    parser.add_argument("--encoding", default="cl100k_base")
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    times: dict[str, list[tuple[float, float]]] = {"a": [], "b": []}
    with tempfile.TemporaryDirectory() as tmp:
        outs = {"a": os.path.join(tmp, "a.npy"), "b": os.path.join(tmp, "b.npy")}
        for k in range(args.runs):
            for name in ("a", "b") if k % 2 == 0 else ("b", "a"):
                times[name].append(run(getattr(args, name), args.file, outs[name], args.encoding))
        if not filecmp.cmp(outs["a"], outs["b"], shallow=False):
            print("the two installs wrote different ids", file=sys.stderr)
            return 1
    for name in ("a", "b"):
        wall, cpu = (statistics.median(x) for x in zip(*times[name]))
        print(f"{name.upper()} {getattr(args, name)}: wall {wall:.3f} s, {cpu:.3f} CPU-s")
    for i, what in ((0, "wall"), (1, "CPU")):
        ratios = [a[i] / b[i] for a, b in zip(times["a"], times["b"])]
        print(f"A/B by {what}, median of {len(ratios)} pairs: {statistics.median(ratios):.3f}")
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
