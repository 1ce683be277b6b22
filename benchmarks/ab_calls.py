"""Two tokenmill installs against each other on the calls a tiktoken program makes, with their
default special-token policies: `encode`, `encode_to_numpy` and `encode_batch` (one thread).

    python benchmarks/ab_calls.py PYTHON_A PYTHON_B CORPUS [--pairs 6] [--encoding cl100k_base]

PYTHON_A and PYTHON_B are the interpreters of two installs (two checkouts' `.venv/bin/python`).
Each run is a fresh process of one install: the corpus cut into parts of 250,000 characters, part
0 encoded by every call to warm it up, then each call over the other parts in turn (`encode`
first, on text it has not seen; `encode_to_numpy` and `encode_batch` then meet the same parts
again), the median MB per CPU-second of each call over the parts. The installs take turns, the
order swapping from pair to pair; printed: each install's median and the median of the pairwise
ratios B/A, which the machine's drift from minute to minute moves the least.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess

WORKER = r"""
import json, sys, time
import numpy  # imported before the timing: its BLAS threads spin for a while when it loads
import pipeline_lib as tm

with open(sys.argv[1], encoding="utf-8") as f:
    text = f.read()
parts = [text[i : i + 250_000] for i in range(0, len(text), 250_000)]
enc = tm.get_encoding(sys.argv[2])
calls = {
    "encode": enc.encode,
    "encode_to_numpy": enc.encode_to_numpy,
    "encode_batch": lambda part: enc.encode_batch(part.split("\n\n"), num_threads=1),
}
for call in calls.values():
    call(parts[0])
rates = {}
for name, call in calls.items():
    per_part = []
    for part in parts[1:]:
        t = time.process_time()
        call(part)
        per_part.append(len(part.encode()) / 1e6 / max(time.process_time() - t, 1e-9))
    rates[name] = sorted(per_part)[len(per_part) // 2]
print(json.dumps(rates))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("python_a")
    ap.add_argument("python_b")
    ap.add_argument("corpus")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--encoding", default="cl100k_base")
    args = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {args.python_a: [], args.python_b: []}
    print(f"load average {os.getloadavg()[0]:.2f}; A {args.python_a}; B {args.python_b}")
    for i in range(args.pairs):
        order = (args.python_a, args.python_b) if i % 2 == 0 else (args.python_b, args.python_a)
        for python in order:
            done = subprocess.run(
                [python, "-c", WORKER, args.corpus, args.encoding], capture_output=True, text=True, check=True
            )
            runs[python].append(json.loads(done.stdout))
    a_runs, b_runs = runs[args.python_a], runs[args.python_b]
    print(f"{os.path.basename(args.corpus)}, {args.encoding}: MB per CPU-second")
    for call in a_runs[0]:
        a = [r[call] for r in a_runs]
        b = [r[call] for r in b_runs]
        ratio = statistics.median(y / x for x, y in zip(a, b))
        medians = f"A {statistics.median(a):6.1f} | B {statistics.median(b):6.1f}"
        print(f"  {call:<16} {medians} | B/A pairwise median {ratio:.3f}")


if __name__ == "__main__":
    main()
