"""A cost model of the chain without the LM (ingest, shard, count, reduce, merges, encode),
built from one measured run and applied to bigger corpora: the model docs/scale.md quotes.

Used by benchmarks/bench_scale.py, which calibrates it on its smallest chain run and checks
its predictions against the bigger runs (the error is printed). By hand, on a run already
made with tokenmill's local server or PREFECT_API_URL:

    python benchmarks/cost_model.py --api http://127.0.0.1:PORT/api --store STORE \\
        [--flow-run NAME] [--workers 2] [--predict-gb 1 4] [--cluster 32x8 128x8]

What it measures, per stage, from the Prefect API (task runs of the flow run) and the store's
manifests (bytes, shards, distinct pieces):

    busy seconds   the sum of the stage's task-run durations (what a core spends on it,
                   the orchestrator's per-task cost included)
    rate           corpus bytes per busy second: MB/s per core
    serial         download, shard, reduce, merges and the token manifest run as one task
                   each; count and encode run one task per group of shards, `workers` at a
                   time, at the parallel efficiency measured in the run
    pieces         merges grow with the distinct pieces, not the bytes, and the reduce with
                   the rows of the per-shard tables it merges (shards x distinct pieces per
                   shard); distinct pieces follow Heaps' law, distinct(bytes) = K * bytes^beta,
                   beta fitted from the run's shards (each shard's distinct pieces against the whole)

and the fixed cost (flow run start and end, imports: the command's wall minus the stages).
Predicted wall(S) = fixed + serial stages(S) + parallel stages(S) / (workers * efficiency).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Stage of each task run, by the task's name (a group of shards is `count_words[shards=0-3/8]`).
STAGES = {
    "download_corpus": "download",
    "reference_corpus": "download",
    "shard_corpus": "shard",  # the publish; its units (one per source group or range) are shard_sources
    "shard_sources": "shard",
    "count_words": "count",
    "reduce_counts": "reduce",  # the publish (the last merge); the tree's merges are merge_counts
    "merge_counts": "reduce",
    "learn_merges": "merges",
    "encode_shard": "encode",
    "write_token_manifest": "manifest",
}
PARALLEL = ("count", "encode")  # the stages whose spans give the parallel efficiency
MAPPED = ("shard", "count", "encode")  # the stages whose units run `workers` at a time
# Orchestration throughput measured here (docs/scale.md section 7, bench_granularity.py's one task
# per shard run: 2,000 task runs in 201 s, the server ~60 ms of CPU per task run): the task runs
# one Prefect server (one process, SQLite, a 2-vCPU VM shared with the flow) records per second.
SERVER_TASK_RUNS_PER_S = 10.0
# Bytes per counting and encoding task in the cluster plan: one task per 256 MiB shard
# (`--task-bytes 268435456`), so that the server records ~15,000 task runs per TB, not ~37,000.
CLUSTER_TASK_BYTES = 256 << 20


def _time(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def flow_run_timings(api_url: str, name: str | None = None, auth: str | None = None) -> dict:
    """Task-run durations per stage of a flow run (the latest one, or the one named); `auth`:
    the server's basic-auth credential (``user:password``, PREFECT_API_AUTH_STRING)."""
    import httpx

    auth = auth or os.environ.get("PREFECT_API_AUTH_STRING")
    basic = tuple(auth.split(":", 1)) if auth else None

    body: dict = {"sort": "START_TIME_DESC", "limit": 1}
    if name:
        body["flow_runs"] = {"name": {"any_": [name]}}
    runs = httpx.post(f"{api_url}/flow_runs/filter", json=body, timeout=60, auth=basic).json()
    if not runs:
        raise SystemExit(f"no flow run {name or ''} at {api_url}")
    run = runs[0]
    tasks, offset = [], 0
    while True:
        page = httpx.post(
            f"{api_url}/task_runs/filter",
            json={"flow_runs": {"id": {"any_": [run["id"]]}}, "offset": offset, "limit": 200},
            timeout=60,
            auth=basic,
        ).json()
        tasks += page
        offset += len(page)
        if len(page) < 200:
            break
    stages: dict[str, dict] = {}
    for t in tasks:
        stage = STAGES.get(t["name"].split("[")[0].rsplit("-", 1)[0]) or STAGES.get(t["name"].split("[")[0])
        if stage is None or not t.get("start_time") or not t.get("end_time"):
            continue
        s = stages.setdefault(stage, {"tasks": 0, "busy_s": 0.0, "start": math.inf, "end": 0.0})
        s["tasks"] += 1
        s["busy_s"] += _time(t["end_time"]) - _time(t["start_time"])
        s["start"] = min(s["start"], _time(t["start_time"]))
        s["end"] = max(s["end"], _time(t["end_time"]))
    for s in stages.values():
        s["span_s"] = s.pop("end") - s.pop("start")
    return {"name": run["name"], "flow_s": _time(run["end_time"]) - _time(run["start_time"]), "stages": stages}


def store_figures(store_url: str) -> dict:
    """Bytes, shards, distinct pieces and Heaps' beta of the latest chain in a store."""
    sys.path.insert(0, str(ROOT))
    from pipeline_lib.store import ArtifactStore

    store = ArtifactStore(store_url)
    corpus, counts, tokens = (store.latest(k) for k in ("corpus", "counts", "tokens"))
    if not (corpus and counts and tokens):
        raise SystemExit(
            f"{store_url}: no corpus, counts and tokens versions (run `tokenmill run --no-lm` into it first)"
        )
    shards = counts["meta"]["shards"]
    total_bytes, total_pieces = sum(r["n_bytes"] for r in shards), counts["meta"]["n_pieces"]
    # Heaps' law between the mean shard and the whole corpus (one shard: no fit, beta 0.5).
    mean_bytes = total_bytes / len(shards)
    mean_pieces = sum(r["n_pieces"] for r in shards) / len(shards)
    beta = (
        math.log(total_pieces / mean_pieces) / math.log(total_bytes / mean_bytes)
        if len(shards) > 1 and total_pieces > mean_pieces
        else 0.5
    )
    corpus_files = sum(f["size"] for f in corpus["files"].values()) if isinstance(corpus.get("files"), dict) else None
    return {
        "bytes": corpus["meta"]["n_bytes"],
        "shards": len(corpus["meta"]["shards"]),
        "pieces": total_pieces,
        "shard_pieces_rows": sum(r["n_pieces"] for r in shards),
        "beta": beta,
        "parquet_ratio": (corpus_files / corpus["meta"]["n_bytes"]) if corpus_files else None,
        "tokens": tokens["meta"]["totals"]["n_tokens"],
    }


@dataclass
class CostModel:
    """Per-stage cost from one run; predicts the chain's wall time at other sizes."""

    bytes: int
    pieces: int
    shards: int
    beta: float
    workers: int
    fixed_s: float
    busy_s: dict[str, float]
    tasks: dict[str, int]
    efficiency: float  # parallel stages: busy / (span * workers), measured
    notes: dict = field(default_factory=dict)

    @classmethod
    def calibrate(cls, timings: dict, figures: dict, command_wall_s: float, workers: int) -> CostModel:
        stages = timings["stages"]
        busy = {k: v["busy_s"] for k, v in stages.items()}
        spans = sum(v["span_s"] for k, v in stages.items() if k in PARALLEL)
        par_busy = sum(busy.get(k, 0.0) for k in PARALLEL)
        efficiency = min(1.0, par_busy / (spans * workers)) if spans else 1.0
        staged = sum(v["span_s"] for v in stages.values())
        return cls(
            bytes=figures["bytes"],
            pieces=figures["pieces"],
            shards=figures["shards"],
            beta=figures["beta"],
            workers=workers,
            fixed_s=max(0.0, command_wall_s - staged),
            busy_s=busy,
            tasks={k: v["tasks"] for k, v in stages.items()},
            efficiency=efficiency,
            notes={
                "parquet_ratio": figures.get("parquet_ratio"),
                "shard_rows_per_piece": figures["shard_pieces_rows"] / max(1, figures["pieces"]),
            },
        )

    def pieces_at(self, nbytes: float) -> float:
        return self.pieces * (nbytes / self.bytes) ** self.beta

    def rows_at(self, nbytes: float, shards: int) -> float:
        """Rows of the per-shard count tables the reduce merges."""
        return shards * self.pieces_at(nbytes / shards)

    def stage_seconds(self, nbytes: float, shards: int | None = None, pieces: float | None = None) -> dict[str, float]:
        """Busy seconds (one core) of each stage for a corpus of `nbytes` cut into `shards`
        shards (default: as many as the calibration run) with `pieces` distinct pieces
        (default: Heaps' law)."""
        shards = shards or self.shards
        piece_scale = (pieces or self.pieces_at(nbytes)) / self.pieces
        scale = {k: nbytes / self.bytes for k in self.busy_s}
        scale["merges"] = piece_scale
        scale["reduce"] = (
            piece_scale if pieces else self.rows_at(nbytes, shards) / self.rows_at(self.bytes, self.shards)
        )
        return {k: v * scale[k] for k, v in self.busy_s.items()}

    def wall(self, nbytes: float, workers: int | None = None, pieces: float | None = None) -> float:
        workers = workers or self.workers
        seconds = self.stage_seconds(nbytes, pieces=pieces)
        serial = sum(v for k, v in seconds.items() if k not in MAPPED)
        parallel = sum(v for k, v in seconds.items() if k in MAPPED)
        return self.fixed_s + serial + parallel / (workers * self.efficiency)

    def rates(self) -> dict[str, float]:
        """MB per busy second (per core) of each stage, at the calibration size."""
        return {k: self.bytes / 1e6 / v for k, v in self.busy_s.items() if v > 0}


def tree_reduce_seconds(model: CostModel, nbytes: float, shards: int, slots: int) -> float:
    """Wall seconds of the counts tree (pairwise merges, `slots` merges at a time): each level's
    merges run in parallel, each reading two tables of the distinct pieces of its share of the
    corpus, at the calibration run's reduce rate (busy seconds per table row read)."""
    per_row = model.busy_s.get("reduce", 0.0) / max(1.0, model.rows_at(model.bytes, model.shards))
    wall, tables = 0.0, shards
    while tables > 1:
        merges = math.ceil(tables / 2)
        rows_per_merge = 2 * model.pieces_at(nbytes / tables)  # two tables, each of its share's distinct pieces
        wall += math.ceil(merges / slots) * rows_per_merge * per_row
        tables = merges
    return wall


def cluster_plan(
    model: CostModel,
    nbytes: float,
    nodes: int,
    cores: int,
    task_bytes: int = CLUSTER_TASK_BYTES,
    shard_bytes: int = 256 << 20,
    group_bytes: int = 256 << 20,
) -> dict:
    """The chain on `nodes` workers of `cores` cores for a corpus of `nbytes`: time per stage,
    task runs, object-store requests and bytes moved (reference mode: no copy of the sources).

    The sharder runs one task per source group of `group_bytes` (at most as many at once as
    cores), the counts are merged by a tree of pairwise merges (one task each), and
    learn_merges stays one task on the (pruned) counts table."""
    shards = math.ceil(nbytes / shard_bytes)
    groups = math.ceil(nbytes / group_bytes)
    seconds = model.stage_seconds(nbytes, shards)
    cores_all = nodes * cores
    tasks = max(64, math.ceil(nbytes / task_bytes))
    tree_merges = max(0, shards - 2)
    task_runs = 2 * tasks + groups + tree_merges + 4
    parquet = model.notes.get("parquet_ratio") or 0.35
    out = {
        "shards": shards,
        "task_runs": task_runs,
        "shard_h": seconds.get("shard", 0.0) / (min(cores_all, groups) * model.efficiency) / 3600,
        "count_h": seconds.get("count", 0.0) / (cores_all * model.efficiency) / 3600,
        "encode_h": seconds.get("encode", 0.0) / (cores_all * model.efficiency) / 3600,
        "reduce_merges_h": (tree_reduce_seconds(model, nbytes, shards, cores_all) + seconds.get("merges", 0.0)) / 3600,
        "orchestration_h": task_runs / SERVER_TASK_RUNS_PER_S / 3600,
        "distinct_pieces": model.pieces_at(nbytes),
        # GET the sources once (sharders), the shards twice (count, encode); PUT the shards, the
        # per-shard counts and the tree's tables, and three files per token shard; multipart parts of 64 MiB.
        "requests": int(nbytes / (64 << 20) * 2 + shards * (1 + 2 + 1 + 3 + 4) + 3 * tree_merges),
        "bytes_read_tb": (nbytes + 2 * nbytes * parquet) / 1e12,
        "bytes_written_tb": (nbytes * parquet + nbytes / 4.2 * 4) / 1e12,  # shards + uint32 tokens (~4.2 bytes/token)
    }
    # The server records task runs while the stages run: the wall is the longer of the two.
    work_h = out["shard_h"] + out["count_h"] + out["encode_h"] + out["reduce_merges_h"]
    out["wall_h"] = max(work_h, out["orchestration_h"])
    stage_h = {k: out[k] for k in ("shard_h", "count_h", "encode_h", "reduce_merges_h", "orchestration_h")}
    out["bottleneck"] = max(stage_h, key=lambda k: stage_h[k]).removesuffix("_h")
    return out


def print_model(model: CostModel) -> None:
    print(
        f"  calibrated on {model.bytes / 1e6:,.0f} MB, {model.pieces:,} distinct pieces (Heaps beta "
        f"{model.beta:.2f}), {model.workers} workers"
    )
    print(f"  fixed cost {model.fixed_s:.1f} s; parallel efficiency {model.efficiency:.2f}")
    print(f"  {'stage':<9} {'tasks':>5} {'busy s':>8} {'MB/s/core':>10}")
    for k, v in model.busy_s.items():
        print(f"  {k:<9} {model.tasks[k]:>5} {v:8.2f} {model.rates().get(k, float('nan')):10.1f}")


def print_clusters(model: CostModel, sizes_tb: list[float], clusters: list[tuple[int, int]]) -> None:
    print(
        f"  {'corpus':>7} {'cluster':>8} {'wall h':>7} {'shard h':>8} {'count h':>8} {'encode h':>9} "
        f"{'red+merge h':>11} {'server h':>8} "
        f"{'pieces M':>9} {'task runs':>9} {'requests':>10} {'read TB':>8} {'bottleneck':>11}"
    )
    for tb in sizes_tb:
        for nodes, cores in clusters:
            p = cluster_plan(model, tb * 1e12, nodes, cores)
            print(
                f"  {tb:>5g}TB {nodes:>4}x{cores:<3} {p['wall_h']:7.1f} {p['shard_h']:8.1f} {p['count_h']:8.2f} "
                f"{p['encode_h']:9.2f} "
                f"{p['reduce_merges_h']:11.2f} {p['orchestration_h']:8.2f} {p['distinct_pieces'] / 1e6:9.0f} "
                f"{p['task_runs']:>9,} "
                f"{p['requests']:>10,} {p['bytes_read_tb']:8.1f} {p['bottleneck']:>11}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--api", required=True, help="the Prefect API the run used")
    ap.add_argument("--store", required=True, help="the store the run wrote")
    ap.add_argument("--flow-run", help="the flow run's name (default: the latest)")
    ap.add_argument("--wall", type=float, help="the command's wall seconds (default: the flow run's)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--predict-gb", type=float, nargs="*", default=[1.0, 4.0])
    ap.add_argument("--cluster", nargs="*", default=["32x8", "128x8"], help="NODESxCORES")
    args = ap.parse_args()
    timings = flow_run_timings(args.api, args.flow_run)
    model = CostModel.calibrate(timings, store_figures(args.store), args.wall or timings["flow_s"], args.workers)
    print_model(model)
    for gb in args.predict_gb:
        print(f"  predicted {gb:g} GB on {args.workers} workers: {model.wall(gb * 1e9):.1f} s")
    print_clusters(model, [1, 10], [tuple(map(int, c.split("x"))) for c in args.cluster])  # type: ignore[misc]
    print(json.dumps({"rates_mb_s_per_core": model.rates(), "fixed_s": model.fixed_s, "beta": model.beta}))


if __name__ == "__main__":
    main()
