"""The encoder on 1, 2, ... N threads in one process: does it scale with cores?

    python benchmarks/bench_threads.py FILE [--encoding cl100k_base] [--threads 1 2] [--repeat 5] [--fresh-strs]
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

--peers: the NumPy batch of every peer that has one (bench_encode_peers.py's list, whichever
import), and our list batch, on each thread count: one process per thread count, bound to that
many CPUs (sched_setaffinity: some peers' pools take every CPU they may run on, whatever they are
asked) and with RAYON_NUM_THREADS set. In each process every encoder is made there and warmed up
on a sentence, so its first call on the batch meets the text new (printed as "new"), then
--repeat calls of the same batch interleaved (their median printed as "seen"). Every output is checked against our new
call's ids. Printed per encoder and thread count: MB/s, MB per CPU-second, the speed-up over
its own first thread count, and the ratio of ours to the fastest peer.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

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
    ap.add_argument(
        "--fresh-strs",
        action="store_true",
        help="each batch call on new str objects, as documents read from a file arrive (a str keeps the UTF-8 "
        "that one thread's conversion makes, so the same strs again skip it)",
    )
    ap.add_argument("--peers", action="store_true", help="the peers' NumPy batches too, one process a thread count")
    ap.add_argument("--only", nargs="*", default=[], metavar="PEER", help="with --peers: these peers alone (and ours)")
    ap.add_argument("--peer-run", type=int, default=0, metavar="THREADS", help=argparse.SUPPRESS)  # one such process
    args = ap.parse_args()
    if args.peer_run:
        peer_run(args.file, args.encoding, args.peer_run, args.repeat, args.only)
        return
    if args.peers:
        peers_scaling(args.file, args.encoding, args.threads, args.repeat, args.only)
        return
    if args.texts:
        long_texts(args.file, args.encoding, args.threads, args.texts)
        return
    with open(args.file, encoding="utf-8") as f:
        docs = [d for d in f.read().split("\n\n") if d]
    size = sum(len(d.encode()) for d in docs)
    enc = get_encoding(args.encoding)
    calls: dict[str, Callable[[list[str], int], object]] = {
        "batch to numpy": lambda texts, t: enc.encode_ordinary_batch_to_numpy(texts, num_threads=t),
        "batch to lists": lambda texts, t: enc.encode_ordinary_batch(texts, num_threads=t),
    }

    def texts() -> list[str]:
        return [(d + "!")[:-1] for d in docs] if args.fresh_strs else docs

    la = os.getloadavg()
    print(
        f"{args.file}: {size / 1e6:.1f} MB, {len(docs):,} documents, {args.encoding}; {os.cpu_count()} CPUs, "
        f"load {la[0]:.2f} {la[1]:.2f}"
    )
    for label, call in calls.items():
        call(texts(), 1)  # warm: the vocabulary's tables paged in
        runs: dict[int, list[tuple[float, float]]] = {t: [] for t in args.threads}
        for _ in range(args.repeat):
            for t in args.threads:
                runs[t].append(timed(functools.partial(call, texts(), t)))
        one = medians(runs[args.threads[0]])[0]
        strs = ", new strs each call" if args.fresh_strs else ""
        print(f"\n{label} (median of {args.repeat}{strs}, load {os.getloadavg()[0]:.2f}):")
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


def peer_run(path: str, encoding: str, threads: int, repeat: int, only: list[str]) -> None:
    """In a process of its own: every encoder's batch of FILE's documents on `threads` threads, new
    then seen; one JSON line per encoder."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_encode_peers import VOCABS, flat_ids, peers_for

    cpus = sorted(os.sched_getaffinity(0))[:threads]
    os.sched_setaffinity(0, cpus)  # before the peers start their pools
    vocab = next(k for k, v in VOCABS.items() if v == encoding)
    with open(path, encoding="utf-8") as f:
        docs = [d for d in f.read().split("\n\n") if d]
    size = sum(len(d.encode()) for d in docs)
    peers = [p for p in peers_for(vocab)[0] if p.name == "tokenmill" or not only or p.name in only]
    base = get_encoding(encoding)  # ours for the lists: an encoder of its own, its caches empty
    ours = Encoding(name=encoding, pat_str=base.pattern_str, mergeable_ranks=base._mergeable_ranks, special_tokens={})
    calls: dict[str, Callable[[], Any]] = {
        p.name: functools.partial(p.numpy_batch, docs, threads) for p in peers if p.numpy_batch is not None
    }
    calls["tokenmill lists"] = functools.partial(ours.encode_ordinary_batch, docs, num_threads=threads)
    warm_up = ["Tables paged in, pools started: a sentence that is not in the corpus."] * (4 * threads)
    ours.encode_ordinary_batch(warm_up, num_threads=threads)
    for p in peers:
        if p.numpy_batch is not None:
            p.numpy_batch(warm_up, threads)
    new: dict[str, tuple[float, float]] = {}
    outputs: dict[str, np.ndarray] = {}
    for name, call in calls.items():
        w, c = time.perf_counter(), time.process_time()
        out = call()
        new[name] = (time.perf_counter() - w, time.process_time() - c)
        outputs[name] = np.asarray(flat_ids(out) if isinstance(out, list) else out, dtype=np.int64).ravel()
    seen: dict[str, list[tuple[float, float]]] = {name: [] for name in calls}
    for _ in range(repeat):
        for name, call in calls.items():
            seen[name].append(timed(call))
    expected = outputs["tokenmill"]
    for name in calls:
        same = outputs[name].shape == expected.shape and bool((outputs[name] == expected).all())
        line = {"name": name, "threads": threads, "mb": size / 1e6, "new": new[name], "seen": medians(seen[name])}
        print(json.dumps(line | {"same_ids": same}), flush=True)


def peers_scaling(path: str, encoding: str, threads: list[int], repeat: int, only: list[str]) -> None:
    la = os.getloadavg()
    print(f"{path}, {encoding}, batch of its documents; {os.cpu_count()} CPUs, load {la[0]:.2f} {la[1]:.2f}")
    rows: dict[str, dict[int, dict[str, Any]]] = {}
    for t in threads:
        env = dict(os.environ, RAYON_NUM_THREADS=str(t))
        cmd = [sys.executable, os.path.abspath(__file__), path, "--encoding", encoding, "--repeat", str(repeat)]
        cmd += ["--only", *only] if only else []
        done = subprocess.run([*cmd, "--peer-run", str(t)], env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(f"  {t} thread(s): the run failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        for line in done.stdout.splitlines():
            r = json.loads(line)
            rows.setdefault(r["name"], {})[t] = r
    for kind in ("new", "seen"):
        print(f"\n{kind} text (load {os.getloadavg()[0]:.2f}): MB/s, MB per CPU-second, x its first thread count")
        peer_rows = [r for n, r in rows.items() if not n.startswith("tokenmill")]
        fastest_peer = {t: max((r[t]["mb"] / r[t][kind][0] for r in peer_rows if t in r), default=0.0) for t in threads}
        for name, by_t in rows.items():
            first = next(iter(by_t.values()))
            cells = []
            for t, r in by_t.items():
                w, c = r[kind]
                mark = "" if r["same_ids"] else " (ids differ)"
                cells.append(f"{t}: {r['mb'] / w:7.1f} {r['mb'] / c:6.1f} x{first[kind][0] / w:4.1f}{mark}")
            print(f"  {name:<16} " + " | ".join(cells))
        ours = rows.get("tokenmill", {})
        ratios = [f"{t}: x{ours[t]['mb'] / ours[t][kind][0] / fastest_peer[t]:.2f}" for t in ours if fastest_peer[t]]
        print(f"  {'ours / fastest':<16} " + " | ".join(ratios))


if __name__ == "__main__":
    main()
