"""Two builds of the compiled core against each other, on one corpus: which is faster, per call.

    python benchmarks/ab_core.py A.so B.so [--encoding cl100k_base] [--corpus FILE] [--rounds 3] [--warm] [--cold]

Each build runs in a process of its own (the module cannot be loaded twice in one), and the two
are driven in turn, part by part: the corpus is cut into 8 parts at blank lines, and for each of
three calls (one whole text to a list, one call per document to lists, a batch to NumPy on one
thread, or on --threads N by wall time) each process encodes part k, then the other does, the
order swapping from part to part.
Fresh processes each round, and a fresh encoder per call, so the parts are text it has not seen
(part 0, untimed, warms it up); with --warm it first encodes the whole corpus, so every part is
a second pass. The measure is
MB of the part per CPU-second of its call; printed: each build's median and the median of the
pairwise ratios B/A, which the machine's drift from minute to minute moves the least. Build the
two .so files with the `Prof` build of docs/performance.md ("Measuring"), one per change.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("whole", "docs", "numpy")

# A worker's first lines: the build at argv[1] loaded as the core of the checkout at argv[5].
LOAD_BUILD = r"""
import importlib.util, sys
sys.path.insert(0, sys.argv[5])
spec = importlib.util.spec_from_file_location("pipeline_lib._tokcore", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules["pipeline_lib._tokcore"] = module
spec.loader.exec_module(module)
"""
WORKER = (
    LOAD_BUILD
    + r"""
import json, time
import numpy as np
import pipeline_lib as tm

base = tm.get_encoding(sys.argv[2])
with open(sys.argv[3], encoding="utf-8") as f:
    docs = [d for d in f.read().split("\n\n") if d]
parts = [docs[i * len(docs) // 8 : (i + 1) * len(docs) // 8] for i in range(8)]
sizes = [sum(len(d.encode()) for d in p) / 1e6 for p in parts]
wholes = ["\n\n".join(p) for p in parts]
warm = sys.argv[4] == "1"
threads = int(sys.argv[6])
cold = sys.argv[7] == "1"
evict = np.zeros(64 << 20, dtype=np.uint8) if cold else None
encoders = {}
for line in sys.stdin:
    mode, k = line.split()
    k = int(k)
    if mode not in encoders:
        enc = tm.Encoding(name="ab", pat_str=base.pattern_str, mergeable_ranks=base._mergeable_ranks, special_tokens={})
        if warm:
            for w in wholes:
                enc.encode_ordinary(w)
        encoders[mode] = enc
    enc, part, whole = encoders[mode], parts[k], wholes[k]
    call = {
        "whole": lambda: enc.encode_ordinary(whole),
        "docs": lambda: [enc.encode_ordinary(d) for d in part],
        "numpy": lambda: enc.encode_ordinary_batch_to_numpy(part, num_threads=threads),
    }[mode]
    clock = time.perf_counter if mode == "numpy" and threads > 1 else time.process_time
    if cold:
        evict[::64] += 1  # a line of every 64 bytes of 64 MB: the caches hold other data
    t0 = clock()
    out = call()
    seconds = clock() - t0
    del out
    print(json.dumps(sizes[k] / max(seconds, 1e-9)), flush=True)
"""
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--encoding", default="cl100k_base")
    ap.add_argument("--corpus", default=os.path.join(ROOT, "pipeline_lib", "data", "tinyshakespeare.txt"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm", action="store_true", help="every part a second pass (the corpus encoded first)")
    ap.add_argument("--threads", type=int, default=1, help="threads of the NumPy batch (> 1: MB per wall second)")
    ap.add_argument(
        "--cold",
        action="store_true",
        help="write 64 MB before each call, so that it starts with the caches holding other data (as when "
        "encoders take turns, e.g. in bench_encode_peers.py)",
    )
    args = ap.parse_args()
    rates: dict[str, dict[str, list[float]]] = {name: {m: [] for m in MODES} for name in "AB"}
    for rnd in range(args.rounds):
        # New processes each round: fresh encoders, and the layout of a process in memory (which
        # moved one build's rate by up to a third against the same code) drawn anew.
        procs = {
            name: subprocess.Popen(
                [sys.executable, "-c", WORKER, path, args.encoding, args.corpus, "1" if args.warm else "0", ROOT]
                + [str(args.threads), "1" if args.cold else "0"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                # one whole text on one thread; no BLAS threads (NumPy's spin for a while after its
                # import, on the process's CPU clock)
                env={**os.environ, "TOKENMILL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"},
            )
            for name, path in (("A", args.a), ("B", args.b))
        }
        for mode in MODES:
            for k in range(8):
                for name in "AB" if (k + rnd) % 2 == 0 else "BA":
                    stdin, stdout = procs[name].stdin, procs[name].stdout
                    assert stdin is not None and stdout is not None
                    stdin.write(f"{mode} {k}\n")
                    stdin.flush()
                    rate = json.loads(stdout.readline())
                    if k > 0 or args.warm:
                        rates[name][mode].append(rate)
        for proc in procs.values():
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait()
    print(
        f"{args.encoding}, {os.path.basename(args.corpus)}, {'second pass' if args.warm else 'unseen text'}"
        f"{', cold caches' if args.cold else ''}, "
        f"load {os.getloadavg()[0]:.2f}: MB per CPU-second"
        + (f" (numpy: {args.threads} threads, MB per wall second)" if args.threads > 1 else "")
    )
    for mode in MODES:
        a, b = rates["A"][mode], rates["B"][mode]
        ratio = statistics.median(y / x for x, y in zip(a, b))
        med_a, med_b = statistics.median(a), statistics.median(b)
        print(f"  {mode:6s} A {med_a:7.1f} | B {med_b:7.1f} | B/A pairwise median {ratio:.3f}")


if __name__ == "__main__":
    main()
