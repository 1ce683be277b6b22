"""Counting and encoding corpus shards: documents read as one bytes object each (the list
path) against documents read as (buffer, offsets) batches (the buffer path), on one thread.

    python benchmarks/bench_stages.py CORPUS.txt [--shards 2] [--vocab-size 4096] [--documents
    line] [--repeat 2]
[--workdir DIR]

CORPUS.txt is sharded by the library (`shard_corpus`, --shards shards) in a temporary store,
counted, and a --vocab-size tokenizer is learned from the counts (the stages' own functions).
Then each shard, one after the other, in this process and on this thread:

* count, list     `BoundedCounts.add_documents` over `iter_shard_batches` (2048 documents a
                  batch, a bytes object each, `PieceCounter.add_batch`);
* count, buffer   `counting.count_shard` (`iter_shard_buffers`: batches of ~4 MiB as `DocBatch`,
                  `PieceCounter.add_buffer`);
* count, core     the shard's text already in memory as one buffer, `PieceCounter.add_buffer`
                  and the table's export (`to_arrays`) alone: the rate the stage can reach;
* encode, list    `token_shards.encode_documents` over `iter_shard_batches(with_source=True)`,
                  with the doc table (as the encoding stage writes it by default; its
                  per-document sha256 computed by the core, as in the buffer path);
* encode, buffer  `token_shards.encode_shard_file`, with the doc table;
* encode, no doc table   `encode_shard_file` without it;
* encode, core    `Encoder.encode_ordinary_buffer` on one thread, the text in memory.

Every run uses one thread (`EncodeConfig(workers=1)`); each timing is the best of --repeat
runs (the runs of one shard follow each other). Printed per shard and summed: MB of
text (1 MB = 1e6 bytes) per CPU-second of this process (`time.process_time`: what other
processes on a shared machine do not change) and per wall-second, and each path's rate as a
ratio of the list path's and of the core's, all measured in the same run; the load average
before and after. Run by hand (not part of the tests).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(CPU seconds of this process, wall seconds) of one call."""
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", help="a text file")
    parser.add_argument("--shards", type=int, default=2, help="corpus shards (default 2)")
    parser.add_argument(
        "--vocab-size", type=int, default=4096, help="tokenizer ids (default 4096, the stage's default)"
    )
    parser.add_argument(
        "--documents", default="line", choices=["line", "paragraph", "file"], help="what a document is (default line)"
    )
    parser.add_argument("--repeat", type=int, default=2, help="runs of each timing, the best kept (default 2)")
    parser.add_argument(
        "--workdir", default=None, help="where the temporary store goes (default: the system's temp dir)"
    )
    args = parser.parse_args(argv)

    import numpy as np
    import pyarrow.parquet as pq

    from pipeline_lib import ArtifactStore, stages
    from pipeline_lib.corpus import CorpusConfig, iter_shard_batches
    from pipeline_lib.counting import BoundedCounts, CountConfig, count_shard
    from pipeline_lib.stages import TokenizerConfig
    from pipeline_lib.token_shards import EncodeConfig, encode_documents, encode_shard_file
    from pipeline_lib.tokenizer import native
    from pipeline_lib.tokenizer.train import native_pattern_id

    work = tempfile.mkdtemp(prefix="bench-stages-", dir=args.workdir)
    try:
        load_before = os.getloadavg()
        store = ArtifactStore(os.path.join(work, "store"))
        corpus_config = CorpusConfig(sources=(args.corpus,), documents=args.documents, n_shards=args.shards)
        corpus = stages.shard_corpus(store, stages.download_corpus(store, corpus_config), corpus_config)
        shards = stages.corpus_shards(store, corpus)
        paths = [store.local_file(corpus.kind, corpus.version, s["file"]) for s in shards]
        count_config = CountConfig()
        for i in range(len(paths)):
            stages.count_shard(store, corpus, i, count_config)
        counts = stages.reduce_counts(store, corpus, count_config)
        tokenizer = stages.load_tokenizer(
            store, stages.learn_tokenizer(store, counts, TokenizerConfig(vocab_size=args.vocab_size))
        )
        encode_config = EncodeConfig(workers=1)
        print(
            f"# {args.corpus}: {sum(s['n_bytes'] for s in shards) / 1e6:.1f} MB of text in {len(paths)} shards "
            f"({args.documents} documents); "
            f"{tokenizer.vocab_size} ids; {os.cpu_count()} CPUs; load average {load_before[0]:.2f} "
            f"{load_before[1]:.2f} {load_before[2]:.2f}",
            flush=True,
        )
        out = os.path.join(work, "out")
        os.makedirs(out)
        tokens, index, doc_table = (os.path.join(out, name) for name in ("t.npy", "t.idx.npy", "t.docs.parquet"))

        def count_list(path: str) -> None:
            table = BoundedCounts(count_config, "a shard")
            for docs in iter_shard_batches(path):
                table.add_documents(docs)
            table.to_arrays()

        runs: dict[str, Callable[[str], object]] = {
            "count list": count_list,
            "count buffer": lambda path: count_shard(path, count_config),
            "encode list": lambda path: encode_documents(
                tokenizer, iter_shard_batches(path, with_source=True), tokens, index, encode_config, "s", doc_table
            ),
            "encode buffer": lambda path: encode_shard_file(
                tokenizer, path, tokens, index, encode_config, "s", doc_table_path=doc_table
            ),
            "encode buffer, no doc table": lambda path: encode_shard_file(
                tokenizer, path, tokens, index, encode_config, "s"
            ),
        }

        def core_runs(path: str) -> dict[str, Callable[[str], object]]:
            """The core's calls on the shard's text, read into one buffer first."""
            text = pq.read_table(path, columns=["text"]).column(0).combine_chunks().cast("large_binary")
            _, offsets_buffer, data_buffer = text.buffers()
            data = memoryview(data_buffer)
            offsets = np.frombuffer(offsets_buffer, dtype=np.int64, count=len(text) + 1, offset=text.offset * 8)
            pattern = native_pattern_id(count_config.pattern)

            def count_core(_: str) -> None:
                counter = native._CORE.PieceCounter(pattern)
                counter.add_buffer(data, offsets)
                counter.to_arrays()

            return {
                "count core": count_core,
                "encode core": lambda _: tokenizer.encode_ordinary_buffer_to_numpy(data, offsets, 1),
            }

        totals: dict[str, list[float]] = {}
        n_bytes = 0
        for shard, path in zip(shards, paths):
            n_bytes += shard["n_bytes"]
            row: dict[str, object] = {"shard": shard["file"], "mb": round(shard["n_bytes"] / 1e6, 2)}
            for label, fn in {**runs, **core_runs(path)}.items():
                cpu, wall = min(timed(functools.partial(fn, path)) for _ in range(args.repeat))
                totals.setdefault(label, [0.0, 0.0])
                totals[label][0] += cpu
                totals[label][1] += wall
                row[label] = {"mb_per_cpu_s": round(shard["n_bytes"] / 1e6 / cpu, 1), "wall_s": round(wall, 3)}
            print(json.dumps(row), flush=True)
        load_after = os.getloadavg()
        print(
            f"\n# all shards, {n_bytes / 1e6:.1f} MB, one thread; load average after {load_after[0]:.2f} "
            f"{load_after[1]:.2f} {load_after[2]:.2f}"
        )
        print(f"{'path':30s} {'MB/CPU-s':>9s} {'MB/wall-s':>9s} {'CPU s':>7s} {'x list':>7s} {'of core':>8s}")
        for label, (cpu, wall) in totals.items():
            stage = label.split()[0]
            versus_list = totals[f"{stage} list"][0] / cpu
            of_core = totals[f"{stage} core"][0] / cpu
            print(
                f"{label:30s} {n_bytes / 1e6 / cpu:9.1f} {n_bytes / 1e6 / wall:9.1f} {cpu:7.2f} {versus_list:7.2f} "
                f"{of_core:8.2f}"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
