"""The encoder on 1, 2, ... N threads in one process: does it scale with cores?

    python benchmarks/bench_threads.py FILE [--encoding cl100k_base] [--threads 1 2] [--repeat 5]
    python benchmarks/bench_threads.py FILE --texts 524288 [--encoding ...] [--threads 1 2]

FILE is cut into documents at blank lines; each run encodes all of them with
`encode_ordinary_batch_to_numpy` (ids into one array) and with `encode_ordinary_batch` (a list
of lists, tiktoken's signature), on each thread count in turn (interleaved: 1, 2, ..., 1, 2,
...). Printed per call and thread count: the median wall seconds, MB/s, CPU seconds of the
process, and the speed-up over one thread. The CPU seconds show whether the threads add work
(allocation, contention); the wall speed-up needs as many idle cores as threads, so the load
average is printed too. Target (issue "fastest exact BPE"): >= 0.8 x N on N threads, up to the
machine's cores.

--texts BYTES: one long text per call instead (`encode_ordinary`, which cuts a text of 512 KiB
or more at safe points for its text threads): FILE cut into texts of BYTES, one encoder per
thread count (made anew, its text threads set), each text met once by each encoder (text it
has not seen: each thread learns its words on its own), the thread counts taking turns text by
text. Printed per thread count: the median MB per wall second and per CPU-second.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable

from pipeline_lib.tokenizer import Encoding, get_encoding


def timed(call: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process) of one call."""
    w, c = time.perf_counter(), time.process_time()
    call()
    return time.perf_counter() - w, time.process_time() - c


def medians(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--encoding", default="cl100k_base")
    ap.add_argument("--threads", type=int, nargs="*", default=[1, os.cpu_count() or 1])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--texts", type=int, default=0, metavar="BYTES", help="one long text per call (see above)")
    args = ap.parse_args()
    if args.texts:
        long_texts(args.file, args.encoding, args.threads, args.texts)
        return
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
                runs[t].append(timed(functools.partial(call, t)))
        one = medians(runs[args.threads[0]])[0]
        print(f"\n{label} (median of {args.repeat}, load {os.getloadavg()[0]:.2f}):")
        for t, rs in runs.items():
            wall, cpu = medians(rs)
            print(
                f"  {t:>2} thread(s): {wall:6.3f} s  {size / 1e6 / wall:7.1f} MB/s  {cpu:6.3f} CPU-s  "
                f"x{one / wall:.2f} of {args.threads[0]} thread(s)"
            )


def long_texts(path: str, encoding: str, threads: list[int], size: int) -> None:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    texts = [text[k : k + size] for k in range(0, len(text) - size + 1, size)][:61]
    base = get_encoding(encoding)
    encoders = {}
    for t in threads:
        enc = Encoding(
            name=f"{encoding}-{t}", pat_str=base.pattern_str, mergeable_ranks=base._mergeable_ranks, special_tokens={}
        )
        enc._encoder.text_threads = t
        enc.encode_ordinary(texts[0])  # the vocabulary's tables paged in, the caches made
        encoders[t] = enc
    la = os.getloadavg()
    print(
        f"{path}: {len(texts) - 1} texts of {size:,} characters, {encoding}; {os.cpu_count()} CPUs, "
        f"load {la[0]:.2f} {la[1]:.2f}"
    )
    rates: dict[int, list[tuple[float, float]]] = {t: [] for t in threads}
    for k, piece in enumerate(texts[1:]):
        nbytes = len(piece.encode())
        for t in threads if k % 2 == 0 else threads[::-1]:
            fresh = "".join([piece[:1], piece[1:]])  # a new str: no UTF-8 copy cached by an earlier call
            w, c = timed(functools.partial(encoders[t].encode_ordinary, fresh))
            rates[t].append((nbytes / 1e6 / w, nbytes / 1e6 / c))
    first = threads[0]
    one_w, one_c = medians(rates[first])
    print(f"one text per call, encode_ordinary (medians, load {os.getloadavg()[0]:.2f}):")
    for t, (wall, cpu) in ((t, medians(rs)) for t, rs in rates.items()):
        print(f"  {t:>2} thread(s): {wall:7.1f} MB/s  {cpu:7.1f} MB/CPU-s  ", end="")
        print(f"x{wall / one_w:.2f} wall, x{cpu / one_c:.2f} per CPU-second of {first} thread(s)")


if __name__ == "__main__":
    main()
