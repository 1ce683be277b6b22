"""Peak memory of ingestion: does memory stay flat when the corpus grows?

Runs download -> shard -> count -> learn tokenizer -> encode (the corpus half of the
pipeline, as the stages run it) on a corpus file, and again on a 4x concatenation of it,
each in a fresh process into a fresh store, and prints each run's peak RSS (and the peak
above the process's post-import baseline), the time per stage, and the ratios. Streaming
stages should give a ratio near 1, not 4: the 4x corpus has 4x larger shards but the same
documents, so only per-document and per-batch memory should show.

By hand only (not a test)::

    python benchmarks/bench_ingest.py /tmp/prose/prose_big.txt            # ~139 MB and ~555 MB
    python benchmarks/bench_ingest.py some.txt --shards 4 --vocab-size 4096 --workers 2

(``bash /work/shared/corpus/make_prose_big.sh /tmp/prose`` builds the 139 MB corpus.)
A ``.parquet`` corpus is "concatenated" by listing it four times as sources.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(args: argparse.Namespace) -> None:
    """One measured run (in its own process)."""
    sys.path.insert(0, ROOT)
    from pipeline_lib import stages
    from pipeline_lib.corpus import CorpusConfig
    from pipeline_lib.store import ArtifactStore

    base = _rss_mb()
    times: dict[str, float] = {}
    peaks: dict[str, float] = {}

    def step(name, fn):
        t = time.perf_counter()
        out = fn()
        times[name] = round(time.perf_counter() - t, 2)
        peaks[name] = round(_rss_mb(), 1)
        return out

    store = ArtifactStore(args.store)
    cfg = CorpusConfig(
        sources=tuple(args.sources), n_shards=args.shards, documents=args.documents, text_field=args.text_field
    )
    raw = step("download", lambda: stages.download_corpus(store, cfg))
    corpus = step("shard", lambda: stages.shard_corpus(store, raw, cfg))
    n = len(store.manifest(corpus.kind, corpus.version)["meta"]["shards"])
    cc = stages.CountConfig(pattern=args.pattern)

    def count():
        for i in range(n):
            stages.count_shard(store, corpus, i, cc)
        return stages.reduce_counts(store, corpus, cc)

    counts = step("count", count)
    tok = step(
        "tokenizer", lambda: stages.learn_tokenizer(store, counts, stages.TokenizerConfig(vocab_size=args.vocab_size))
    )
    ec = stages.EncodeConfig(workers=args.workers)

    def encode():
        for i in range(n):
            stages.encode_shard(store, corpus, tok, i, ec)
        return stages.publish_tokens(store, corpus, tok, ec)

    tokens = step("encode", encode)
    cmeta = store.manifest(corpus.kind, corpus.version)["meta"]
    tmeta = store.manifest(tokens.kind, tokens.version)["meta"]
    print(
        json.dumps(
            {
                "bytes": cmeta["n_bytes"],
                "docs": cmeta["n_docs"],
                "shards": n,
                "tokens": tmeta["totals"]["n_tokens"],
                "base_mb": round(base, 1),
                "peak_mb": round(_rss_mb(), 1),
                "peaks_mb": peaks,
                "seconds": times,
            }
        )
    )


def run(sources: list[str], args: argparse.Namespace, label: str) -> dict:
    store = tempfile.mkdtemp(prefix="bench-ingest-store-", dir=args.tmp)
    try:
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            "--store",
            store,
            "--shards",
            str(args.shards),
            "--vocab-size",
            str(args.vocab_size),
            "--workers",
            str(args.workers),
            "--pattern",
            args.pattern,
            "--documents",
            args.documents,
            "--text-field",
            args.text_field,
            *sources,
        ]
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"{label} run failed:\n{proc.stderr[-4000:]}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        result["wall_s"] = round(time.perf_counter() - t, 1)
    finally:
        shutil.rmtree(store, ignore_errors=True)
    mb = result["bytes"] / 1e6
    print(
        f"{label:>6}: {mb:8.1f} MB text, {result['docs']:,} docs, {result['tokens']:,} tokens in {result['shards']} "
        "shards | "
        f"peak RSS {result['peak_mb']:.0f} MB (post-import baseline {result['base_mb']:.0f} MB, "
        f"+{result['peak_mb'] - result['base_mb']:.0f} MB) | "
        f"{result['wall_s']} s"
    )
    print(f"        peak after each stage (MB): {result['peaks_mb']}")
    print(f"        seconds per stage:          {result['seconds']}")
    return result


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sources", nargs="+", help="corpus file(s)")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--workers", type=int, default=0, help="encoding threads (0 = all cores)")
    p.add_argument("--pattern", default="cl100k")
    p.add_argument("--documents", default="line", choices=["line", "paragraph", "file"])
    p.add_argument("--text-field", default="text")
    p.add_argument("--tmp", default=None, help="where the stores and the 4x file go (default: system temp)")
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return
    one = run(args.sources, args, "1x")
    tmpdir = tempfile.mkdtemp(prefix="bench-ingest-", dir=args.tmp)
    try:
        if all(s.endswith(".parquet") for s in args.sources):
            four_sources = list(args.sources) * 4
        else:  # concatenate the bytes (valid for .txt/.jsonl, and multi-member .gz / multi-frame .zst)
            ext = "".join(os.path.basename(args.sources[0]).partition(".")[1:]) or ".txt"
            four = os.path.join(tmpdir, "corpus_x4." + ext.lstrip("."))
            with open(four, "wb") as out:
                for _ in range(4):
                    for s in args.sources:
                        with open(s, "rb") as f:
                            shutil.copyfileobj(f, out, 8 << 20)
            four_sources = [four]
        four_result = run(four_sources, args, "4x")
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    ratio = four_result["peak_mb"] / one["peak_mb"]
    above = (four_result["peak_mb"] - four_result["base_mb"]) / max(1.0, one["peak_mb"] - one["base_mb"])
    print(
        f"ratio 4x/1x: peak RSS {ratio:.2f}, peak above baseline {above:.2f} (1.0 = flat; 4.0 = memory grows with "
        "the corpus)"
    )


if __name__ == "__main__":
    main()
