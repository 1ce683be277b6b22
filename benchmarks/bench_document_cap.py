"""Peak memory while refusing one huge document: a small .gz holding ``--mib`` MiB of
``a`` on one line, sharded with ``--max-document-bytes`` at 1 MiB and 16 MiB, by the
compiled scanner and by the Python reader.

    python benchmarks/bench_document_cap.py [--mib 256]

Peaks are tracemalloc's (Python and NumPy allocations), measured around download + shard.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import tempfile
import tracemalloc

from pipeline_lib import corpus as corpus_module
from pipeline_lib.corpus import CorpusConfig
from pipeline_lib.fsio import InputError
from pipeline_lib.stages import download_corpus, shard_corpus
from pipeline_lib.store import ArtifactStore


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="size of the one line, MiB (default: %(default)s)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench-document-cap-")
    try:
        path = os.path.join(work, "one-line.txt.gz")
        with gzip.open(path, "wb", compresslevel=1) as f:
            for _ in range(args.mib):
                f.write(b"a" * (1 << 20))
        print(f"{path}: {os.path.getsize(path):,} bytes compressed, {args.mib} MiB on one line")
        scanner = corpus_module._SCAN
        for reader in ("native", "python"):
            corpus_module._SCAN = scanner if reader == "native" else None
            for cap in (1 << 20, 16 << 20):
                store = ArtifactStore(tempfile.mkdtemp(dir=work))
                cfg = CorpusConfig(sources=(path,), max_document_bytes=cap)
                tracemalloc.start()
                try:
                    shard_corpus(store, download_corpus(store, cfg), cfg)
                    outcome = "accepted"
                except InputError as e:
                    outcome = "refused: " + str(e)[len(path) :][:60]
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
                print(f"{reader:<7} cap {cap >> 20:>3} MiB  peak {peak / 2**20:6.1f} MiB  {outcome}")
        corpus_module._SCAN = scanner
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
