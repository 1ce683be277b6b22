"""Copy vs reference: ingesting a corpus that lives on an object store.

    python benchmarks/bench_sources.py CORPUS.txt [--mb 64] [--shards 8]

The first --mb MB of CORPUS.txt (cut at a line end) are put on a local S3 server (moto,
in this process), then ingested into a fresh local store twice, each in its own run:

    copy        download_corpus copies the object into the store (raw), shard_corpus reads the copy
    reference   download_corpus records URL, size and ETag; shard_corpus streams the object
                in place and hashes it as it reads

Prints wall time per step, bytes written to the store, and one JSON line. Both runs must
give byte-identical shards (checked). Run by hand; moto is a Python server, so absolute
rates say more about it than about a real object store: compare the two rows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def du(path: str) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus")
    ap.add_argument("--mb", type=float, default=64)
    ap.add_argument("--shards", type=int, default=8)
    args = ap.parse_args()

    import fsspec
    import s3_server

    from pipeline_lib import ArtifactStore, stages
    from pipeline_lib.corpus import CorpusConfig

    with open(args.corpus, "rb") as f:
        data = f.read(int(args.mb * (1 << 20)))
    data = data[: data.rfind(b"\n") + 1]
    options = s3_server.storage_options()
    url = f"s3://{s3_server.make_bucket()}/sources/corpus.txt"
    fsspec.filesystem("s3", **options).pipe_file(url, data)
    print(f"{len(data) / 1e6:.1f} MB on s3 (moto), {args.shards} shards, load {os.getloadavg()[0]:.1f}", flush=True)

    rows, shards = [], {}
    for mode in ("copy", "reference"):
        root = tempfile.mkdtemp(prefix=f"bench-sources-{mode}-")
        store = ArtifactStore(root)
        config = CorpusConfig(sources=(url,), n_shards=args.shards, source_mode=mode, storage_options=options)  # type: ignore[arg-type]
        t0 = time.perf_counter()
        raw = stages.download_corpus(store, config)
        t1 = time.perf_counter()
        corpus = stages.shard_corpus(store, raw, config)
        t2 = time.perf_counter()
        shards[mode] = {n: i["sha256"] for n, i in store.manifest(corpus.kind, corpus.version)["files"].items()}
        row = {
            "mode": mode,
            "download_s": t1 - t0,
            "shard_s": t2 - t1,
            "total_s": t2 - t0,
            "raw_bytes_stored": du(os.path.join(root, "raw")),
        }
        rows.append(row)
        print(
            f"  {mode:<10} download {row['download_s']:6.2f} s  shard {row['shard_s']:6.2f} s  total "
            f"{row['total_s']:6.2f} s  raw stored {row['raw_bytes_stored']:,} B",
            flush=True,
        )
    assert shards["copy"] == shards["reference"], "the two modes gave different shards"
    print("shards byte-identical: yes")
    print(json.dumps({"bytes": len(data), "shards": args.shards, "rows": rows}))


if __name__ == "__main__":
    main()
