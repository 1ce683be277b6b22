"""Counting memory: exact vs pruned counts (--count-mode, --count-min), and what pruning costs in compression.

    python benchmarks/bench_count_memory.py CORPUS.txt [--mb 40] [--shards 8] [--vocab-size
    32768] [--mins 2 5] [--tight
4MiB]

The first --mb MB of CORPUS.txt (cut at a line end) are sharded into --shards shards in a
temporary store; the next 4 MB are held out. For each mode (exact; pruned at each --mins
threshold; pruned at the first one under the --tight budget, which raises thresholds), in
its own subprocess: every shard counted one after the other (`stages.count_shard`), the
reduce (`stages.reduce_counts`), then a --vocab-size tokenizer trained from the counts.
First, as a baseline, a subprocess only reads the shards. Printed per mode: distinct
pieces per shard (mean) and in the reduce, pieces and occurrences pruned, the thresholds
used, the estimated memory (`counting.table_bytes`) of the reduced table, the process's
peak RSS after counting (and its RSS before: imports), the counting wall time, and the
held-out bytes per token of the tokenizer, with its change against exact. Last, a check of
the memory formula: --formula-pieces distinct random words counted, exported and written,
the peak RSS this adds against `counting.table_bytes`.

Run by hand (not part of the tests); results go to stdout as a table and JSON lines.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HELD_OUT = 4_000_000
DEFAULT_MEMORY = "4GiB"


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _current_rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def child(
    store_url: str, corpus_version: str, mode: str, count_min: int, count_memory: str, vocab_size: int, held_out: str
) -> None:
    from pipeline_lib import ArtifactStore, stages
    from pipeline_lib.corpus import iter_shard_batches
    from pipeline_lib.counting import CountConfig, read_counts, table_bytes

    store = ArtifactStore(store_url)
    corpus = store.ref("corpus", corpus_version)
    if mode == "read":  # the baseline: the shards read as counting reads them, nothing counted
        before = _current_rss_mib()
        for shard in stages.corpus_shards(store, corpus):
            for _ in iter_shard_batches(store.local_file(corpus.kind, corpus.version, shard["file"])):
                pass
        print(json.dumps({"mode": "read only", "rss_before_mib": before, "peak_rss_mib": _rss_mib()}))
        return
    config = CountConfig(count_mode=mode, count_min=count_min, count_memory=count_memory)  # type: ignore[arg-type]
    before = _current_rss_mib()
    start = time.perf_counter()
    n_shards = len(stages.corpus_shards(store, corpus))
    for i in range(n_shards):
        stages.count_shard(store, corpus, i, config)
    ref = stages.reduce_counts(store, corpus, config)
    count_s = time.perf_counter() - start
    peak = _rss_mib()
    meta = store.manifest(ref.kind, ref.version)["meta"]
    pieces, counts = read_counts(store.local_file(ref.kind, ref.version, "counts.parquet"))
    shard_pieces = [r["n_pieces"] for r in meta["shards"]]
    row = {
        "mode": mode
        if mode == "exact"
        else f"pruned min {count_min}" + (f", {count_memory} budget" if count_memory != DEFAULT_MEMORY else ""),
        "thresholds": sorted(
            {r["pruned"]["threshold"] for r in meta["shards"]} | {meta["pruned"]["reduce"]["threshold"]}
        )
        if "pruned" in meta
        else [],
        "shard_pieces_mean": sum(shard_pieces) / len(shard_pieces),
        "pieces": meta["n_pieces"],
        "occurrences": meta["n_occurrences"],
        "pieces_dropped": meta.get("pruned", {}).get("pieces_dropped", 0),
        "occurrences_dropped": meta.get("pruned", {}).get("occurrences_dropped", 0),
        "table_mib": table_bytes(len(pieces), sum(map(len, pieces))) / (1 << 20),
        "rss_before_mib": before,
        "peak_rss_mib": peak,
        "count_s": count_s,
    }
    del pieces, counts
    tok = stages.load_tokenizer(
        store, stages.learn_tokenizer(store, ref, stages.TokenizerConfig(vocab_size=vocab_size))
    )
    with open(held_out, "rb") as f:
        text = f.read().decode("utf-8", "replace")
    row["n_vocab"] = tok.n_vocab
    row["held_out_bytes_per_token"] = len(text.encode("utf-8")) / len(tok.encode_ordinary(text))
    print(json.dumps(row))


def formula_child(n_pieces: int) -> None:
    """Count `n_pieces` distinct random 8-letter words (each once, after a space) as a shard is
    counted and written: the RSS this adds against `counting.table_bytes`."""
    import random
    import string

    from pipeline_lib.counting import BoundedCounts, CountConfig, table_bytes, write_counts

    rng = random.Random(0)
    letters = string.ascii_lowercase.encode()
    docs = [b" ".join(bytes(rng.choices(letters, k=8)) for _ in range(100)) for _ in range(n_pieces // 100)]
    base = _current_rss_mib()
    table = BoundedCounts(CountConfig(count_memory="64GiB"), "synthetic")
    for k in range(0, len(docs), 2048):
        table.add_documents(docs[k : k + 2048])
    pieces, counts = table.to_arrays()
    with tempfile.TemporaryDirectory() as tmp:
        write_counts(os.path.join(tmp, "c.parquet"), pieces, counts)
    print(
        json.dumps(
            {
                "pieces": len(pieces),
                "estimate_mib": table_bytes(len(pieces), sum(map(len, pieces))) / (1 << 20),
                "rss_added_mib": _rss_mib() - base,
            }
        )
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("corpus")
    p.add_argument("--mb", type=float, default=40)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--vocab-size", type=int, default=32768)
    p.add_argument("--mins", type=int, nargs="+", default=[2, 5])
    p.add_argument(
        "--tight",
        default="4MiB",
        help="a budget under which the first --mins threshold is raised (default: %(default)s)",
    )
    p.add_argument(
        "--formula-pieces",
        type=int,
        default=2_000_000,
        help="distinct pieces of the formula check (0: skip; default: %(default)s)",
    )
    p.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    p.add_argument("--formula-child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.formula_child:
        formula_child(args.formula_child)
        return
    if args.child:
        store_url, version, mode, count_min, memory, vocab, held_out = args.child
        child(store_url, version, mode, int(count_min), memory, int(vocab), held_out)
        return

    from pipeline_lib import ArtifactStore, stages
    from pipeline_lib.corpus import CorpusConfig

    with tempfile.TemporaryDirectory(prefix="bench-count-memory-") as tmp:
        with open(args.corpus, "rb") as f:
            data = f.read(int(args.mb * 1e6) + HELD_OUT + (1 << 16))
        cut = data.index(b"\n", int(args.mb * 1e6)) + 1
        sample, held = os.path.join(tmp, "sample.txt"), os.path.join(tmp, "held_out.txt")
        with open(sample, "wb") as f:
            f.write(data[:cut])
        with open(held, "wb") as f:
            f.write(data[cut : cut + HELD_OUT])
        store = ArtifactStore(os.path.join(tmp, "store"))
        config = CorpusConfig(sources=(sample,), n_shards=args.shards)
        corpus = stages.shard_corpus(store, stages.download_corpus(store, config), config)
        print(
            f"corpus: {cut / 1e6:.1f} MB of {os.path.basename(args.corpus)} in {args.shards} shards; held out: "
            f"{HELD_OUT / 1e6:.1f} MB; vocab {args.vocab_size:,}"
        )
        rows = []
        runs = (
            [("read", 1, DEFAULT_MEMORY), ("exact", 1, DEFAULT_MEMORY)]
            + [("pruned", m, DEFAULT_MEMORY) for m in args.mins]
            + [("pruned", args.mins[0], args.tight)]
        )
        for mode, count_min, memory in runs:
            cmd = [
                sys.executable,
                __file__,
                args.corpus,
                "--child",
                store.root,
                corpus.version,
                mode,
                str(count_min),
                memory,
                str(args.vocab_size),
                held,
            ]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"{mode} {count_min} failed:\n{done.stderr}")
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    read, rows = rows[0], rows[1:]
    exact = rows[0]
    print()
    print(
        f"reading the shards alone (no counting): peak RSS {read['peak_rss_mib']:.0f} MiB "
        f"({read['rss_before_mib']:.0f} after imports)"
    )
    print(
        "| mode | distinct pieces per shard (mean) | distinct pieces (reduce) | pieces dropped (per shard, summed) | "
        "occurrences dropped | thresholds |"
        " table estimate | peak RSS (imports) | count wall | held-out bytes/token | compression vs exact |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        cost = r["held_out_bytes_per_token"] / exact["held_out_bytes_per_token"] - 1
        print(
            f"| {r['mode']} | {r['shard_pieces_mean']:,.0f} | {r['pieces']:,} | {r['pieces_dropped']:,} | "
            f"{r['occurrences_dropped']:,} "
            f"({r['occurrences_dropped'] / (r['occurrences'] + r['occurrences_dropped']):.2%}) | "
            f"{', '.join(map(str, r['thresholds'])) or '-'} | "
            f"{r['table_mib']:.1f} MiB | {r['peak_rss_mib']:.0f} MiB ({r['rss_before_mib']:.0f}) | {r['count_s']:.1f} "
            "s | "
            f"{r['held_out_bytes_per_token']:.4f} | {cost:+.2%} |"
        )
    if args.formula_pieces:
        done = subprocess.run(
            [sys.executable, __file__, args.corpus, "--formula-child", str(args.formula_pieces)],
            capture_output=True,
            text=True,
            check=True,
        )
        check = json.loads(done.stdout.strip().splitlines()[-1])
        print(
            f"\nformula check: {check['pieces']:,} distinct pieces counted, exported and written: table_bytes estimate "
            f"{check['estimate_mib']:.0f} MiB, peak RSS added {check['rss_added_mib']:.0f} MiB "
            f"({check['rss_added_mib'] / check['estimate_mib']:.2f}x)"
        )


if __name__ == "__main__":
    main()
