"""What a task run costs: many small shards through the flows, one task per shard vs grouped.

    python benchmarks/bench_granularity.py [--shards 1000] [--corpus FILE] [--workers 2]

The corpus (default: the bundled tiny Shakespeare, ~1.1 MB) is cut into --shards shards
with the library. Then the per-shard stages (count -> reduce -> merges, encode -> publish)
run three ways, each into a fresh store so that nothing is reused:

    library         the stage functions in a thread pool of --workers, no Prefect: the work
    flow, grouped   tokenizer_flow + encode_flow with the default --task-bytes (64 MiB,
                    at least 64 tasks per mapped stage)
    flow, 1/shard   the same with --task-bytes 0: one task run per shard and stage

against the Prefect API the CLI uses (PREFECT_API_URL if set, else tokenmill's local
server, started if needed). Overhead = flow wall - library wall, per task run of the
mapped stages and per shard. Run by hand; prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def load() -> str:
    return "load %.1f" % os.getloadavg()[0]


def server_cpu_s(external_api: bool) -> float | None:
    """CPU seconds (user + system) tokenmill's local Prefect server has used so far, or None
    when another API is in use (PREFECT_API_URL) or the server cannot be read."""
    if external_api:
        return None
    from flows.prefect_api import LocalServer, server_dir

    state = LocalServer(server_dir()).read_state()
    try:
        with open(f"/proc/{state['pid']}/stat") as f:  # type: ignore[index]
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, TypeError, KeyError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def make_corpus(store_url: str, source: str, shards: int):
    from pipeline_lib import ArtifactStore, stages
    from pipeline_lib.corpus import CorpusConfig

    store = ArtifactStore(store_url)
    config = CorpusConfig(sources=(source,), n_shards=shards)
    return stages.shard_corpus(store, stages.download_corpus(store, config), config)


def copy_corpus(src: str, dst: str) -> None:
    """The corpus versions of store `src` into a fresh store `dst` (same ids)."""
    import shutil

    shutil.copytree(src, dst)
    for kind in ("counts", "tokenizer", "tokens"):
        shutil.rmtree(os.path.join(dst, kind), ignore_errors=True)


def run_library(store_url: str, corpus, vocab: int, workers: int) -> float:
    from pipeline_lib import ArtifactStore, stages
    from pipeline_lib.counting import CountConfig
    from pipeline_lib.token_shards import EncodeConfig

    store = ArtifactStore(store_url)
    n = len(stages.corpus_shards(store, corpus))
    t0 = time.perf_counter()
    cc, ec = CountConfig(), EncodeConfig()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda i: stages.count_shard(store, corpus, i, cc), range(n)))
        tok = stages.learn_tokenizer(
            store, stages.reduce_counts(store, corpus, cc), stages.TokenizerConfig(vocab_size=vocab)
        )
        list(pool.map(lambda i: stages.encode_shard(store, corpus, tok, i, ec), range(n)))
    stages.publish_tokens(store, corpus, tok, ec)
    return time.perf_counter() - t0


def run_flows(store_url: str, corpus, vocab: int, workers: int, task_bytes: int) -> float:
    from prefect.task_runners import ThreadPoolTaskRunner

    from flows.pipeline import encode_flow, tokenizer_flow

    runner = ThreadPoolTaskRunner(max_workers=workers)
    t0 = time.perf_counter()
    config = {"task_bytes": task_bytes}  # the corpus config's byte budget per task (the rest: defaults)
    tok = tokenizer_flow.with_options(task_runner=runner)(
        corpus, store=store_url, tokenizer={"vocab_size": vocab}, corpus=config
    )
    encode_flow.with_options(task_runner=runner)(corpus, tok, store=store_url, corpus=config)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", type=int, default=1000)
    ap.add_argument("--corpus", default=str(ROOT / "pipeline_lib" / "data" / "tinyshakespeare.txt"))
    ap.add_argument("--vocab-size", type=int, default=512)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    from flows.prefect_api import flow_api
    from pipeline_lib import ArtifactStore, stages
    from pipeline_lib.corpus import DEFAULT_TASK_BYTES
    from pipeline_lib.stages import spec

    work = tempfile.mkdtemp(prefix="bench-granularity-")
    base = os.path.join(work, "corpus")
    corpus = make_corpus(base, args.corpus, args.shards)
    sizes = [s["n_bytes"] for s in stages.corpus_shards(ArtifactStore(base), corpus)]
    n = len(sizes)
    grouped_tasks = len(spec.group_units(sizes, DEFAULT_TASK_BYTES))
    print(
        f"{n} shards of {sum(sizes) / n:,.0f} bytes on average ({sum(sizes):,} bytes), {args.workers} workers, "
        f"{load()}",
        flush=True,
    )

    rows = []
    store = os.path.join(work, "library")
    copy_corpus(base, store)
    wall = run_library(store, corpus, args.vocab_size, args.workers)
    rows.append({"run": "library", "tasks": 0, "wall_s": wall})
    print(f"  library: {wall:.2f} s ({load()})", flush=True)
    external_api = bool(os.environ.get("PREFECT_API_URL"))  # flow_api sets it for the local server
    with flow_api() as api:
        print(f"  Prefect API: {os.environ.get('PREFECT_API_URL') or api}", flush=True)
        for label, task_bytes, tasks in (("flow, grouped", DEFAULT_TASK_BYTES, grouped_tasks), ("flow, 1/shard", 0, n)):
            store = os.path.join(work, label.replace(", ", "-").replace("/", "per"))
            copy_corpus(base, store)
            server0 = server_cpu_s(external_api)
            wall = run_flows(store, corpus, args.vocab_size, args.workers, task_bytes)
            server1 = server_cpu_s(external_api)
            server = server1 - server0 if server0 is not None and server1 is not None else None
            rows.append({"run": label, "tasks": 2 * tasks, "wall_s": wall, "server_cpu_s": server})
            print(
                f"  {label}: {wall:.2f} s, {2 * tasks} mapped task runs, {2 * tasks / wall:.1f} task runs/s "
                f"sustained, the server's CPU {'n/a' if server is None else f'{server:.1f} s'} ({load()})",
                flush=True,
            )

    library = rows[0]["wall_s"]
    print(f"\n{'run':<15} {'mapped tasks':>12} {'wall s':>8} {'overhead s':>11} {'ms/task run':>12} {'ms/shard':>9}")
    for r in rows:
        over = r["wall_s"] - library
        r["overhead_s"] = over
        r["ms_per_task"] = 1000 * over / r["tasks"] if r["tasks"] else None
        r["ms_per_shard"] = 1000 * over / (2 * n) if r["tasks"] else None  # per shard and stage
        per_task = f"{r['ms_per_task']:.1f}" if r["tasks"] else "-"
        per_shard = f"{r['ms_per_shard']:.1f}" if r["tasks"] else "-"
        print(f"{r['run']:<15} {r['tasks']:>12} {r['wall_s']:>8.2f} {over:>11.2f} {per_task:>12} {per_shard:>9}")
    print(json.dumps({"shards": n, "bytes": sum(sizes), "workers": args.workers, "rows": rows}))


if __name__ == "__main__":
    main()
