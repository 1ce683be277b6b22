"""Speed and peak memory of `shard_corpus` (the download is not timed).

Shards a corpus file twice, each run in a fresh process into a fresh store: with the
native document scanner (what the pipeline runs) and with the per-document Python reader
(`corpus._SCAN = None`, the path taken when the compiled core is not built), and prints
MB/s of source bytes by wall-clock and by CPU time (which a busy machine inflates less), peak
RSS above the process's baseline, and the ratios. A plain read
of the file (its bytes through `open_source`) is the floor both are measured against.

By hand only (not a test)::

    python benchmarks/bench_shard.py /tmp/corpora/prose_20M.txt
    python benchmarks/bench_shard.py /tmp/corpora/prose_big.txt --documents paragraph --shards 8
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu_s() -> float:
    """CPU time of this process (all threads): what other processes on a busy machine inflate least."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def child(args: argparse.Namespace) -> None:
    """One measured run, in its own process; prints a JSON line."""
    sys.path.insert(0, ROOT)
    import pyarrow.compute  # noqa: F401  (imported on the first cast otherwise: ~0.1 s of setup, not of sharding)

    from pipeline_lib import corpus, stages
    from pipeline_lib.store import ArtifactStore

    if args.path == "python":
        corpus._SCAN = None
    cfg = corpus.CorpusConfig(sources=(args.file,), documents=args.documents, n_shards=args.shards)
    store = ArtifactStore(args.store)
    if args.path == "read":
        base, cpu = _rss_mb(), _cpu_s()
        t = time.perf_counter()
        with corpus.open_source(args.file, os.path.basename(args.file), cfg.max_source_bytes) as f:
            while f.read(16 << 20):
                pass
        seconds, cpu = time.perf_counter() - t, _cpu_s() - cpu
        print(json.dumps({"seconds": seconds, "cpu": cpu, "rss_mb": _rss_mb() - base}))
        return
    raw = stages.download_corpus(store, cfg)
    base, cpu = _rss_mb(), _cpu_s()
    t = time.perf_counter()
    ref = stages.shard_corpus(store, raw, cfg)
    seconds, cpu = time.perf_counter() - t, _cpu_s() - cpu
    meta = store.manifest(ref.kind, ref.version)["meta"]
    print(
        json.dumps(
            {
                "seconds": seconds,
                "cpu": cpu,
                "rss_mb": _rss_mb() - base,
                "n_docs": meta["n_docs"],
                "n_shards": len(meta["shards"]),
            }
        )
    )


def run(args: argparse.Namespace, path: str) -> dict:
    """The best of `args.repeat` runs (each figure on its own: a busy machine only adds time)."""
    runs = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="bench-shard-") as store:
            cmd = [
                sys.executable,
                __file__,
                args.file,
                "--documents",
                args.documents,
                "--shards",
                str(args.shards),
                "--child",
                path,
                "--store",
                store,
            ]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    return {**runs[0], **{k: min(r[k] for r in runs) for k in ("seconds", "cpu", "rss_mb")}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file")
    p.add_argument("--documents", choices=("line", "paragraph"), default="line")
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--no-python", action="store_true", help="skip the (slow) per-document reader")
    p.add_argument("--repeat", type=int, default=3, help="runs of each, in fresh processes; the best is shown")
    p.add_argument("--child", choices=("native", "python", "read"), dest="path", help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.path:
        child(args)
        return
    size = os.path.getsize(args.file)
    print(
        f"{args.file}: {size / 1e6:.1f} MB, documents={args.documents}, {args.shards} shards, best of {args.repeat} "
        "runs"
    )
    results = {"read": run(args, "read"), "native": run(args, "native")}
    if not args.no_python:
        results["python"] = run(args, "python")
    for path, r in results.items():
        docs = f", {r['n_docs']:,} documents in {r['n_shards']} shards" if "n_docs" in r else ""
        print(
            f"  {path:7s} {r['seconds']:6.2f} s {size / r['seconds'] / 1e6:7.1f} MB/s | CPU {r['cpu']:6.2f} s "
            f"{size / max(r['cpu'], 1e-3) / 1e6:7.1f} MB/s"
            f" | peak RSS +{r['rss_mb']:.0f} MB{docs}"
        )
    native = results["native"]
    print(f"  native / plain read time: {native['seconds'] / results['read']['seconds']:.1f}x")
    if "python" in results:
        print(
            f"  native speed-up over the per-document reader: {results['python']['seconds'] / native['seconds']:.1f}x"
        )


if __name__ == "__main__":
    main()
