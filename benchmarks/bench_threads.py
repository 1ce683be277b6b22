"""The encoder on 1, 2, ... N threads in one process: does it scale with cores?

    python benchmarks/bench_threads.py FILE [--encoding cl100k_base] [--threads 1 2] [--repeat 5]

FILE is cut into documents at blank lines; each run encodes all of them with
`encode_ordinary_batch_to_numpy` (ids into one array) and with `encode_ordinary_batch` (a list
of lists, tiktoken's signature), on each thread count in turn (interleaved: 1, 2, ..., 1, 2,
...). Printed per call and thread count: the median wall seconds, MB/s, CPU seconds of the
process, and the speed-up over one thread. The CPU seconds show whether the threads add work
(allocation, contention); the wall speed-up needs as many idle cores as threads, so the load
average is printed too. Target (issue "fastest exact BPE"): >= 0.8 x N on N threads, up to the
machine's cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from pipeline_lib.tokenizer import get_encoding


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--encoding", default="cl100k_base")
    ap.add_argument("--threads", type=int, nargs="*", default=[1, os.cpu_count() or 1])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with open(args.file, encoding="utf-8") as f:
        docs = [d for d in f.read().split("\n\n") if d]
    size = sum(len(d.encode()) for d in docs)
    enc = get_encoding(args.encoding)
    calls = {
        "batch to numpy": lambda t: enc.encode_ordinary_batch_to_numpy(docs, num_threads=t),
        "batch to lists": lambda t: enc.encode_ordinary_batch(docs, num_threads=t),
    }
    la = os.getloadavg()
    print(
        f"{args.file}: {size / 1e6:.1f} MB, {len(docs):,} documents, {args.encoding}; {os.cpu_count()} CPUs, "
        f"load {la[0]:.2f} {la[1]:.2f}"
    )
    for label, call in calls.items():
        call(1)  # warm: the vocabulary's tables paged in
        runs: dict[int, list[tuple[float, float]]] = {t: [] for t in args.threads}
        for _ in range(args.repeat):
            for t in args.threads:
                w, c = time.perf_counter(), time.process_time()
                call(t)
                runs[t].append((time.perf_counter() - w, time.process_time() - c))
        one = statistics.median(w for w, _ in runs[args.threads[0]])
        print(f"\n{label} (median of {args.repeat}, load {os.getloadavg()[0]:.2f}):")
        for t, rs in runs.items():
            wall, cpu = statistics.median(w for w, _ in rs), statistics.median(c for _, c in rs)
            print(
                f"  {t:>2} thread(s): {wall:6.3f} s  {size / 1e6 / wall:7.1f} MB/s  {cpu:6.3f} CPU-s  "
                f"x{one / wall:.2f} of {args.threads[0]} thread(s)"
            )


if __name__ == "__main__":
    main()
