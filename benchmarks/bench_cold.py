"""Where unseen text's time goes: one whole text to NumPy, unseen, again, and again after the caches are emptied.

    python benchmarks/bench_cold.py CORPUS [--encoding cl100k_base] [--pairs 3]

The corpus is cut into parts of ~250,000 characters at line ends; part 0 warms each encoder up.
For parts 1-8, one call each: the part unseen (new words, tables out of the cache), the same part
again (every word met, its lines in the cache), and again after 64 MB have been written (every
word met, the lines in memory), each call on a new str of the part's text (as a user's text
arrives). Printed: the median CPU milliseconds of each, per peer, run in
fresh processes taking turns (tokenmill, gigatoken, tokenmill, ...), and the ratios of the two.
unseen - again is what the new words cost with the cache's help; evicted - again what the
tables' lines cost from memory. gigatoken is skipped when it is not installed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def worker(peer: str, encoding: str, corpus: str) -> None:
    import numpy as np  # before the timing: its import starts threads that spin for a while

    text = open(corpus, encoding="utf-8").read()
    parts: list[str] = []
    while len(parts) < 9 and text:
        end = text.find("\n", 250_000)
        end = len(text) if end < 0 else end + 1
        parts.append(text[:end])
        text = text[end:]
    if peer == "tokenmill":
        import pipeline_lib

        call = pipeline_lib.get_encoding(encoding).encode_to_numpy
    else:
        import gigatoken

        sys.path.insert(0, HERE)
        from bench_encode_peers import ranks_file

        scheme = {"cl100k_base": "gpt4", "o200k_base": "o200k"}[encoding]
        call = gigatoken.Tokenizer.from_tiktoken(ranks_file(encoding), pretokenizer=scheme).encode
    call(parts[0])
    big = np.ones(64 << 20, np.uint8)
    times: dict[str, list[float]] = {"unseen": [], "again": [], "evicted": []}
    for part in parts[1:]:
        for kind in times:
            if kind == "evicted":
                big += 1
            text = (part + "!")[:-1]  # a new str: one read before keeps the UTF-8 CPython made for it
            t0 = time.process_time()
            call(text)
            times[kind].append(time.process_time() - t0)
    print(" ".join(f"{statistics.median(v) * 1e3:.3f}" for v in times.values()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus")
    ap.add_argument("--encoding", default="cl100k_base", choices=["cl100k_base", "o200k_base"])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.encoding, args.corpus)
        return
    peers = ["tokenmill"]
    try:
        import gigatoken  # noqa: F401

        peers.append("gigatoken")
    except ImportError:
        print("gigatoken is not installed: tokenmill alone")
    runs: dict[str, list[list[float]]] = {p: [] for p in peers}
    for _ in range(args.pairs):
        for peer in peers:
            cmd = [sys.executable, __file__, args.corpus, "--encoding", args.encoding, "--worker", peer]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()
            runs[peer].append([float(x) for x in out])
    print(f"{os.path.basename(args.corpus)}, {args.encoding}, load {os.getloadavg()[0]:.2f}: CPU ms per part")
    medians = {peer: [statistics.median(r[k] for r in rows) for k in range(3)] for peer, rows in runs.items()}
    for peer, (unseen, again, evicted) in medians.items():
        print(
            f"  {peer:<10} unseen {unseen:6.2f}  again {again:6.2f}  evicted {evicted:6.2f}"
            f"  | unseen - again {unseen - again:5.2f}  evicted - again {evicted - again:5.2f}"
        )
    if "gigatoken" in medians:
        kinds = ("unseen", "again", "evicted")
        pairs = zip(kinds, medians["tokenmill"], medians["gigatoken"])
        ratios = "  ".join(f"{kind} {peer_ms / ours_ms:.2f}x" for kind, ours_ms, peer_ms in pairs)
        print(f"  tokenmill's speed over gigatoken's: {ratios}")


if __name__ == "__main__":
    main()
