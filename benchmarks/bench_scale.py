"""Large corpora through the product path, in one run: the figures the scale work is judged by.

Run by hand (not part of the tests; the 4 GB chain takes minutes and 4 GB of disk twice):

    bash ../shared/corpus/make_prose_big.sh /tmp/corpora           # prose_big.txt, ~139 MB
    pip install -e ".[bench]"                                      # rustbpe, tiktoken
    python benchmarks/bench_scale.py --prose /tmp/corpora/prose_big.txt \\
        --chain-source /tmp/corpora/prose_big.txt --chain-source /tmp/corpora/multilingual_big.txt \\
        --chain-source /tmp/corpora/code_py.txt --chain-gb 0.25 1 4

    (multilingual_big.txt: ../shared/corpus/make_multilingual_big.sh; code_py.txt:
    ../shared/corpus/make_code_corpus.py over the venv's site-packages and the stdlib)

It prints, section by section:

1. `tokenmill tokenizer train` against the library path and a rustbpe + tiktoken script at
   20 MB (the first 20 MB of --prose) and on the whole of --prose: benchmarks/bench_cli.py,
   whose table and ratios are printed as they come (with and without a running
   `prefect server start`).
2. The chain without the LM (`tokenmill run --no-lm`: ingest, shard, count, merges to
   --vocab-size, encode every shard) on corpora of --chain-gb gigabytes, made by
   interleaving the --chain-source files (each cycled, in proportion to its size, so every
   size has the same mix) and cut at a line end, with tokenmill's
   local Prefect server already running: wall time, peak RSS of the command (the largest of
   its process and its children), RSS growth from the smallest to the largest corpus, and
   the corpus shards' size spread (the manifest's `balance`).
   Each run's stage timings come from the Prefect API (benchmarks/cost_model.py).
3. The cost model (benchmarks/cost_model.py) calibrated on the smallest chain run: its
   per-stage rates (MB/s per core), its predictions for the bigger runs against their
   measured wall time (the error), and its projection to 1 TB and 10 TB on a cluster.
4. The cost of a task run: benchmarks/bench_granularity.py (1,000 small shards, one task per
   shard vs grouped), where it exists.
5. With --many-files N: the smallest chain corpus cut into N files at line ends, its
   sharding stage (one unit per source group, --many-group-bytes) on 1 and 2 worker
   processes, against the same bytes in one file: wall, MB/s, groups, shards, the worst
   group's shard spread, and the speedup on 2 workers.
6. With --big-file: the smallest chain corpus as one file, its sharding stage read whole (one
   unit) on 1 worker, then split into ranges of --big-group-bytes (pipeline_lib.source_ranges)
   on 1 and 2 workers: wall, CPU seconds (all processes), MB/s, units, shards, the speedup on 2
   workers, and whether the split runs' documents are the whole run's (a digest, in order).

Sections 5 and 6 print the CPU seconds beside the wall time and the load average: on a
machine shared with other work, the wall speedup is bounded by the cores free, not by the code.
Linux's autogroup scheduler (/proc/sys/kernel/sched_autogroup_enabled) shares the CPU between
sessions, not processes: worker processes in the benchmark's session share one session's
slice, so a second worker gains nothing while other sessions keep the cores busy.
--worker-sessions starts each worker in a session of its own (as separate machines would be).

Targets (issue "large corpora"): CLI <= 0.5x rustbpe's wall at 20 MB and <= 0.3x at 139 MB;
the 1 GB chain <= 60 s wall with peak RSS <= 1 GB, RSS flat (<= 1.2x) from 1 GB to 4 GB.
The machine's load average is printed with each figure: compare runs side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))
import cost_model  # noqa: E402

# Runs a command and prints its children's peak RSS (KiB on Linux) as its last line: a fresh
# process per measurement, so the peak is that command's alone.
PEAK_RSS = (
    "import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:]).returncode; "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(rc)"
)


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def section(title: str) -> None:
    print(f"\n== {title} ({load()}) ==", flush=True)


def stream(argv: list[str], env: dict[str, str] | None = None) -> int:
    """Run `argv`, printing its output as it comes, indented."""
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        print(f"  {line}", end="", flush=True)
    return proc.wait()


def build_corpus(sources: list[str], size: int, out: Path, block: int = 8 << 20) -> Path:
    """`size` bytes of the `sources` interleaved, each cycled, in proportion to their sizes
    (blocks of about `block` bytes in all per round, cut at line ends): every size has the
    same mix, so two sizes differ in amount, not in kind."""
    if out.exists() and size - (1 << 20) < out.stat().st_size <= size:
        return out
    sizes = [os.path.getsize(src) for src in sources]
    shares = [max(1, block * n // sum(sizes)) for n in sizes]
    files = [open(src, "rb") for src in sources]
    written = 0
    try:
        with open(out, "wb") as f:
            while written < size:
                for src, share in zip(files, shares):
                    part = src.read(share)
                    if len(part) < share:  # cycle this source
                        src.seek(0)
                        part += src.read(share - len(part))
                    part += src.readline()  # to the line end
                    part = part[: size - written]
                    f.write(part)
                    written += len(part)
                    if written >= size:
                        break
            f.truncate(written)
    finally:
        for src in files:
            src.close()
    with open(out, "rb+") as f:  # cut at the last line end
        f.seek(max(0, written - (1 << 20)))
        tail = f.read()
        f.truncate(written - len(tail) + tail.rfind(b"\n") + 1)
    return out


def stage_timings(home: Path) -> dict:
    """The latest flow run's stage timings from tokenmill's local server in PREFECT_HOME `home`."""
    sys.path.insert(0, str(ROOT))
    from flows.prefect_api import LocalServer, server_dir

    server = LocalServer(server_dir(home))
    state = server.read_state()
    if not state:
        raise SystemExit(f"tokenmill's local server in {home} is not running")
    return cost_model.flow_run_timings(state["api_url"], auth=server.auth_string())


def chain(
    corpus: Path,
    store: Path,
    vocab_size: int,
    workers: int,
    env: dict[str, str],
    log: Path,
    extra: tuple[str, ...] = (),
) -> dict[str, float | str]:
    """`tokenmill run --no-lm` on `corpus` (a file or a directory): wall, peak RSS, the shards'
    spread and what the run produced (`outputs`)."""
    argv = [sys.executable, "-m", "flows.cli", "run", "--no-lm", "--corpus", str(corpus), "--store", str(store)]
    argv += ["--vocab-size", str(vocab_size), "--pattern", "cl100k", "--workers", str(workers), *extra]
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.run(
            [sys.executable, "-c", PEAK_RSS, *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=out, text=True
        )
    wall = time.perf_counter() - t0
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"tokenmill run --no-lm on {corpus} exited with {proc.returncode}: see {log}")
    with open(log, "a") as out:
        out.write("\n".join(lines[:-1]))
    sys.path.insert(0, str(ROOT))
    from pipeline_lib.store import ArtifactStore

    latest = ArtifactStore(str(store)).latest("corpus")
    balance = (latest or {}).get("meta", {}).get("balance", {})
    return {
        "wall": wall,
        "peak_rss_mb": int(lines[-1]) / 1024,
        "spread": json.dumps(balance, sort_keys=True) if balance else "n/a",
        **outputs(store),
    }


def outputs(store: Path) -> dict[str, str | int]:
    """What a chain run produced, to compare layouts whose corpus versions differ: the merges
    file's sha256, the distinct pieces counted (and pruned away) and the tokens written."""
    from pipeline_lib.store import ArtifactStore

    st = ArtifactStore(str(store))
    tokenizer, counts, tokens = (st.latest(kind) or {} for kind in ("tokenizer", "counts", "tokens"))
    return {
        "merges_sha256": tokenizer.get("meta", {}).get("merges_sha256", "?"),
        "n_pieces": counts.get("meta", {}).get("n_pieces", -1),
        "count_mode": counts.get("meta", {}).get("count_mode", "?"),
        "n_tokens": tokens.get("meta", {}).get("totals", {}).get("n_tokens", -1),
    }


@contextmanager
def local_server(env: dict[str, str]) -> Iterator[None]:
    """tokenmill's local Prefect server in env's PREFECT_HOME, stopped afterwards."""
    subprocess.run(
        [sys.executable, "-m", "flows.cli", "server", "start"], cwd=ROOT, env=env, check=True, capture_output=True
    )
    try:
        yield
    finally:
        subprocess.run([sys.executable, "-m", "flows.cli", "server", "stop"], cwd=ROOT, env=env, capture_output=True)


def split_corpus(corpus: Path, n_files: int, out: Path) -> list[str]:
    """`corpus` cut into `n_files` files of about equal bytes at line ends (in `out`)."""
    out.mkdir(parents=True, exist_ok=True)
    size = corpus.stat().st_size
    paths = []
    with open(corpus, "rb") as src:
        for i in range(n_files):
            part = src.read(max(1, size // n_files)) + src.readline()
            if i == n_files - 1:
                part += src.read()
            path = out / f"part-{i:05d}.txt"
            path.write_bytes(part)
            paths.append(str(path))
    return paths


def _shard_group(args: tuple[str, dict, dict, int]) -> None:
    from pipeline_lib import stages
    from pipeline_lib.store import ArtifactStore, VersionRef

    store_url, raw, config, group = args
    stages.shard_sources(ArtifactStore(store_url), VersionRef(**raw), group, stages.CorpusConfig(**config))


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its reaped children."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def shard_stage(
    sources: list[str], store: Path, workers: int, group_bytes: int, n_shards: int = 8, own_sessions: bool = False
) -> dict[str, float | int | str]:
    """The sharding stage alone on `sources` (downloaded first, not timed): its units (one
    per source group or range of a large source) on `workers` processes, then the publish.
    Wall, CPU seconds (the workers' included: the pool is joined inside the timing) and the
    corpus version."""
    from concurrent.futures import ProcessPoolExecutor
    from dataclasses import asdict

    sys.path.insert(0, str(ROOT))
    from pipeline_lib import stages
    from pipeline_lib.stages import spec
    from pipeline_lib.store import ArtifactStore

    shutil.rmtree(store, ignore_errors=True)
    config = {"sources": tuple(sources), "n_shards": n_shards, "source_group_bytes": group_bytes}
    cfg = stages.CorpusConfig(**config)
    st = ArtifactStore(str(store))
    raw = stages.download_corpus(st, cfg)
    n_groups = spec.unit_count(stages.SHARD, st, {"raw": raw}, cfg)
    t0, cpu0 = time.perf_counter(), cpu_seconds()
    with ProcessPoolExecutor(workers, initializer=os.setsid if own_sessions else None) as pool:
        list(pool.map(_shard_group, [(str(store), asdict(raw), config, g) for g in range(n_groups)]))
    corpus = spec.produce(stages.SHARD, st, {"raw": raw}, cfg)
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    meta = st.manifest(corpus.kind, corpus.version)["meta"]
    worst = max((g["balance"]["max_over_mean"] or 1.0) for g in meta["groups"])
    return {
        "wall": wall,
        "cpu": cpu,
        "groups": n_groups,
        "shards": len(meta["shards"]),
        "bytes": meta["n_bytes"],
        "docs": meta["n_docs"],
        "version": corpus.version,
        "worst_group_spread": worst,
        "digest": documents_digest(st, corpus),
    }


def documents_digest(store, ref) -> str:
    """sha256 over a corpus version's documents in order (each with its length): equal for two
    versions holding the same documents in the same order, however they are sharded."""
    import hashlib

    from pipeline_lib.corpus import iter_shard_buffers

    lengths, data = hashlib.sha256(), hashlib.sha256()  # two streams: batching does not change either
    root = store.local_dir(ref.kind, ref.version)
    for shard in store.manifest(ref.kind, ref.version)["meta"]["shards"]:
        for batch in iter_shard_buffers(os.path.join(root, shard["file"])):
            lengths.update(batch.lengths().tobytes())
            data.update(batch.data[batch.offsets[0] : batch.offsets[-1]])
    return lengths.hexdigest() + data.hexdigest()


def _row(label: str, row: dict) -> str:
    mb = float(row["bytes"]) / 1e6
    return (
        f"  {label}: wall {row['wall']:.1f} s, CPU {row['cpu']:.1f} s ({mb / float(row['wall']):.1f} MB/s wall, "
        f"{mb / float(row['cpu']):.1f} MB/CPU-s), "
        f"{row['groups']} units, {row['shards']} shards, worst unit max/mean {row['worst_group_spread']} ({load()})"
    )


def many_files(
    corpus: Path,
    n_files: int,
    work: Path,
    group_bytes: int,
    own_sessions: bool = False,
    chain_runs: Callable[[Path], None] | None = None,
) -> None:
    """Section 5: the corpus as `n_files` files, sharded on 1 and 2 workers, against the
    same bytes in one file on 1 worker; then `chain_runs` on the directory of files."""
    sources = split_corpus(corpus, n_files, work / f"many-{n_files}")
    one = shard_stage([str(corpus)], work / "store-one", 1, 0, own_sessions=own_sessions)
    print(_row("one file, 1 worker", one), flush=True)
    walls = {}
    for workers in (1, 2):
        row = shard_stage(sources, work / f"store-many-{workers}", workers, group_bytes, own_sessions=own_sessions)
        walls[workers] = float(row["wall"])
        print(_row(f"{n_files} files, {workers} worker(s)", row), flush=True)
    print(f"  sharding speedup on 2 workers: x{walls[1] / walls[2]:.2f} (target >= 1.7)")
    if group_bytes == 0:  # one unit per file above; the default grouping for comparison
        from pipeline_lib.corpus_config import DEFAULT_SOURCE_GROUP_BYTES as default

        grouped = shard_stage(sources, work / "store-many-grouped", 1, default, own_sessions=own_sessions)
        print(_row(f"{n_files} files in groups of {default >> 20} MiB, 1 worker", grouped), flush=True)
        print(
            f"  per byte against one file, 1 worker: one unit per file x{float(one['wall']) / walls[1]:.2f}, "
            f"grouped x{float(one['wall']) / float(grouped['wall']):.2f} (1.00: as fast)"
        )
        shutil.rmtree(work / "store-many-grouped", ignore_errors=True)
    same = one["digest"] == row["digest"]
    print(f"  documents of the {n_files} files {'identical to' if same else 'DIFFER FROM'} the one file's (in order)")
    for name in ("store-one", "store-many-1", "store-many-2"):
        shutil.rmtree(work / name, ignore_errors=True)
    if chain_runs is not None:
        chain_runs(work / f"many-{n_files}")


def big_file(corpus: Path, work: Path, group_bytes: int, own_sessions: bool = False) -> None:
    """Section 6: one file sharded whole on 1 worker, then in ranges of `group_bytes` on 1 and 2 workers."""
    whole = shard_stage([str(corpus)], work / "store-whole", 1, 0, own_sessions=own_sessions)
    print(_row("one file read whole, 1 worker", whole), flush=True)
    walls = {}
    for workers in (1, 2):
        row = shard_stage(
            [str(corpus)], work / f"store-ranges-{workers}", workers, group_bytes, own_sessions=own_sessions
        )
        walls[workers] = float(row["wall"])
        same = row["digest"] == whole["digest"] and row["docs"] == whole["docs"]
        print(
            _row(f"ranges of {group_bytes >> 20} MiB, {workers} worker(s)", row) + "; documents "
            f"{'identical to' if same else 'DIFFER FROM'} the whole run's",
            flush=True,
        )
    print(
        f"  sharding speedup on 2 workers: x{walls[1] / walls[2]:.2f} (target >= 1.7); ranges vs whole on 1 worker: "
        f"x{float(whole['wall']) / walls[1]:.2f}"
    )
    for name in ("store-whole", "store-ranges-1", "store-ranges-2"):
        shutil.rmtree(work / name, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prose", help="English text for section 1 (prose_big.txt); leave out to skip it")
    ap.add_argument(
        "--chain-source", action="append", default=[], help="text file concatenated into the chain corpora (repeatable)"
    )
    ap.add_argument(
        "--chain-gb",
        type=float,
        nargs="*",
        default=[0.25, 1.0, 4.0],
        help="chain corpus sizes in GB (default: 0.25 1 4)",
    )
    ap.add_argument("--vocab-size", type=int, default=32768)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-granularity", action="store_true", help="skip section 4")
    ap.add_argument("--work-dir", help="for corpora, stores and logs (default: a temp dir, removed afterwards)")
    ap.add_argument("--no-chain", action="store_true", help="skip sections 2 and 3 (the chain runs and the cost model)")
    ap.add_argument(
        "--many-files",
        type=int,
        default=0,
        help="section 5: the smallest chain corpus as this many files, sharded on 1 and 2 workers",
    )
    ap.add_argument(
        "--many-files-gb",
        type=float,
        default=0.0,
        help="section 5: the corpus size cut into --many-files files (default: the smallest --chain-gb)",
    )
    ap.add_argument(
        "--no-many-chain", action="store_true", help="section 5: the sharding stage only, not the chain on the files"
    )
    ap.add_argument(
        "--many-group-bytes",
        type=int,
        default=0,
        help="section 5: --source-group-bytes of those runs (default 0: one task per file)",
    )
    ap.add_argument(
        "--big-file",
        action="store_true",
        help="section 6: the smallest chain corpus as one file, sharded whole and in ranges on 1 and 2 workers",
    )
    ap.add_argument(
        "--big-group-bytes",
        type=int,
        default=32 << 20,
        help="section 6: --source-group-bytes of the split runs (default 32 MiB)",
    )
    ap.add_argument(
        "--worker-sessions",
        action="store_true",
        help="sections 5 and 6: each worker process in a session of its own (see the module doc)",
    )
    args = ap.parse_args()
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="tokenmill-bench-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled")
    sessions = f", autogroup {autogroup.read_text().strip()}" if autogroup.exists() else ""
    print(f"bench_scale: {os.cpu_count()} CPUs{sessions}, {load()}, work dir {work}", flush=True)

    if args.prose:
        for label, extra in (("20 MB", ["--head-mb", "20"]), ("the whole file", [])):
            section(f"1. tokenizer train vs library vs rustbpe + tiktoken: {label} of {args.prose}")
            stream(
                [
                    sys.executable,
                    str(BENCH / "bench_cli.py"),
                    args.prose,
                    "--vocab-size",
                    str(args.vocab_size),
                    "--workers",
                    str(args.workers),
                    *extra,
                ]
            )

    home = work / "prefect-home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "TOKENMILL_"))}
    # TOKENMILL_WARM=0: each run in its own process (imports included), so that its peak RSS is the command's.
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", TOKENMILL_WARM="0")
    one_file_outputs: dict[float, dict] = {}  # chain corpus size -> what its one-file run produced

    def chain_with_stages(corpus: Path, store: Path, workers: int, log: Path, extra: tuple[str, ...] = ()):
        shutil.rmtree(store, ignore_errors=True)
        row = chain(corpus, store, args.vocab_size, workers, env, log, extra)
        timings = stage_timings(home)
        model = cost_model.CostModel.calibrate(
            timings, cost_model.store_figures(str(store)), float(row["wall"]), workers
        )
        shutil.rmtree(store, ignore_errors=True)
        return row, timings, model

    if args.chain_source and args.chain_gb and not args.no_chain:
        section("2. tokenmill run --no-lm, tokenmill's local Prefect server running")
        rows = []
        with local_server(env):
            for gb in sorted(args.chain_gb):
                corpus = build_corpus(args.chain_source, int(gb * 1e9), work / f"chain-{gb:g}GB.txt")
                row, _, model = chain_with_stages(
                    corpus, work / f"store-{gb:g}GB", args.workers, work / f"chain-{gb:g}GB.log"
                )
                rows.append((gb, row, model))
                one_file_outputs[gb] = row
                stages = ", ".join(f"{k} {v:.1f}" for k, v in model.busy_s.items())
                print(
                    f"  {gb:g} GB: wall {row['wall']:.1f} s, peak RSS {row['peak_rss_mb']:.0f} MB, shards "
                    f"{row['spread']} ({load()})",
                    flush=True,
                )
                print(f"    busy s per stage: {stages}; fixed {model.fixed_s:.1f} s", flush=True)
        sized = [(gb, row) for gb, row, _ in rows if gb >= 1]
        if len(sized) > 1:
            (small, first), (large, last) = sized[0], sized[-1]
            print(
                f"  RSS {small:g} GB -> {large:g} GB: "
                f"x{float(last['peak_rss_mb']) / float(first['peak_rss_mb']):.2f} (target <= 1.2)"
            )
        if len(rows) > 1:
            section("3. the cost model, calibrated on the smallest run")
            gb0, _, model = rows[0]
            cost_model.print_model(model)
            for gb, row, run in rows[1:]:
                measured = float(row["wall"])
                predicted, known = model.wall(gb * 1e9), model.wall(gb * 1e9, pieces=run.pieces)
                print(
                    f"  {gb:g} GB: predicted {predicted:.1f} s, measured {measured:.1f} s, error "
                    f"{100 * (predicted / measured - 1):+.0f}%; "
                    f"with its distinct pieces known ({run.pieces:,}: the corpus repeats its sources) {known:.1f} s, "
                    f"error {100 * (known / measured - 1):+.0f}%"
                )
            cost_model.print_clusters(model, [1, 10], [(8, 8), (32, 8), (128, 8)])

    if args.many_files and args.chain_source and args.chain_gb:
        gb = args.many_files_gb or min(args.chain_gb)
        corpus = build_corpus(args.chain_source, int(gb * 1e9), work / f"chain-{gb:g}GB.txt")
        section(f"5. the sharding stage on {gb:g} GB as {args.many_files} files, 1 and 2 workers")

        def chain_runs(directory: Path) -> None:
            print(f"\n  the chain (tokenmill run --no-lm) on the {args.many_files} files ({load()}):", flush=True)
            with local_server(env):
                if gb not in one_file_outputs:
                    row, _, _ = chain_with_stages(corpus, work / "store-one", args.workers, work / "chain-one.log")
                    one_file_outputs[gb] = row
                    print(f"  one file, --workers {args.workers}: wall {row['wall']:.1f} s", flush=True)
                reference = one_file_outputs[gb]
                runs = [(w, (), "exact") for w in (1, 2)] + [(2, ("--count-mode", "pruned"), "pruned")]
                for workers, extra, label in runs:
                    row, timings, _ = chain_with_stages(
                        directory, work / "store-many", workers, work / f"chain-many-{workers}-{label}.log", extra
                    )
                    shard = timings["stages"].get("shard", {})
                    same = all(row[k] == reference[k] for k in ("merges_sha256", "n_pieces", "n_tokens"))
                    print(
                        f"  --workers {workers}, {row['count_mode']} counts: wall {row['wall']:.1f} s, peak RSS "
                        f"{row['peak_rss_mb']:.0f} MB, sharding {shard.get('tasks', 0)} tasks in "
                        f"{shard.get('span_s', 0):.1f} s (busy {shard.get('busy_s', 0):.1f} s), "
                        f"{row['n_pieces']:,} distinct pieces, {row['n_tokens']:,} tokens; merges, pieces and "
                        f"tokens {'identical to' if same else 'differ from'} the one-file run's ({load()})",
                        flush=True,
                    )

        many_files(
            corpus,
            args.many_files,
            work,
            args.many_group_bytes,
            args.worker_sessions,
            None if args.no_many_chain else chain_runs,
        )

    if args.big_file and args.chain_source and args.chain_gb:
        gb = min(args.chain_gb)
        section(f"6. the sharding stage on {gb:g} GB in one file: read whole, and in ranges on 1 and 2 workers")
        big_file(
            build_corpus(args.chain_source, int(gb * 1e9), work / f"chain-{gb:g}GB.txt"),
            work,
            args.big_group_bytes,
            args.worker_sessions,
        )

    granularity = BENCH / "bench_granularity.py"
    if not args.no_granularity and granularity.exists():
        section("4. the cost of a task run (benchmarks/bench_granularity.py)")
        home = work / "prefect-home-granularity"  # a local server of its own, stopped afterwards
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "TOKENMILL_"))}
        env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
        try:
            stream([sys.executable, str(granularity), "--workers", str(args.workers)], env=env)
        finally:
            subprocess.run(
                [sys.executable, "-m", "flows.cli", "server", "stop"], cwd=ROOT, env=env, capture_output=True
            )
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
