"""tokenmill's whole tokenization chain against the usual tools, and the thread runner's parallelism.

    python benchmarks/bench_pipeline.py compare CORPUS.txt [--scales 1 4] [--threads 2]
    python benchmarks/bench_pipeline.py parallel CORPUS.txt [--shards 2]

``compare``: raw text file -> BPE tokenizer at --vocab-size (32,768) -> every document
encoded into uint16 tokens, no LM, for each contender in its own subprocess (wall time,
CPU time user+sys of the process and its children, peak RSS of the largest process):

    tokenmill-flow     `tokenmill run --no-lm`: the Prefect flow (ephemeral API included):
                       ingest -> shard -> count (mapped) -> merges -> encode (mapped)
    tokenmill-lib      the same stage functions without Prefect, a thread pool for the
                       mapped stages (what the flow costs beyond the work itself)
    hf                 HF `tokenizers`: BPE trainer `train_from_iterator` on the documents,
                       then `encode_batch` into a uint16 np.memmap (nanoGPT prepare.py style)
    rustbpe+tiktoken   rustbpe `train_from_iterator`, then tiktoken `encode_ordinary_batch`
                       into a uint16 np.memmap (nanochat style); skipped if rustbpe is absent

All use the cl100k split pattern, the same paragraph documents (blank-line separated), an
<|endoftext|> after each document and --threads threads (RAYON_NUM_THREADS for the Rust
ones). --scales 4 concatenates the corpus 4 times (same vocabulary, 4x the work).

``parallel``: does the thread runner really run two shards at once? The corpus in
--shards shards; counting and encoding each shard with the library functions the tasks
call, one after the other and then in one thread per shard: wall and process CPU time,
and per-job thread CPU time. Then the same through Prefect (tokenizer_flow and
encode_flow on ThreadPoolTaskRunner(1) and (2)): the stage's wall time against the sum
of its task runs' run times, read back from the API.

On a shared machine other processes take CPU and CPU/wall says little: the GIL probe
(see GilProbe) still shows whether the native calls hold the GIL, and ``nice -n -20``
(root) gives the measurement the cores for its few seconds.

Run by hand (not part of the tests); results go to stdout as a table and JSON lines.
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
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EOT = "<|endoftext|>"
CONTENDERS = ("tokenmill-flow", "tokenmill-lib", "hf", "rustbpe+tiktoken")
API_URL: str | None = None  # --api-url: run the flow against this Prefect server


# ----------------------------------------------------------------------------- documents
def iter_paragraphs(path: str) -> Iterator[str]:
    """Blank-line separated paragraphs, lines joined, trailing newline stripped (as tokenmill's
    documents="paragraph")."""
    para: list[bytes] = []
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                para.append(line)
            elif para:
                yield b"".join(para).rstrip(b"\r\n").decode("utf-8", "replace")
                para = []
    if para:
        yield b"".join(para).rstrip(b"\r\n").decode("utf-8", "replace")


def batched(it, n: int):
    batch = []
    for x in it:
        batch.append(x)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def write_memmap(path: str, arrays: list, dtype="uint16") -> int:
    """nanoGPT prepare.py: total length first, then one memmap filled batch by batch."""
    import numpy as np

    total = int(sum(len(a) for a in arrays))
    out = np.memmap(path, dtype=dtype, mode="w+", shape=(total,))
    pos = 0
    for a in arrays:
        out[pos : pos + len(a)] = a
        pos += len(a)
    out.flush()
    del out
    return total


# ----------------------------------------------------------------------------- contenders
def run_tokenmill_flow(corpus: str, out: str, vocab: int, threads: int, shards: int) -> dict:
    from flows.cli import main

    t0 = time.perf_counter()
    rc = main(
        [
            "run",
            "--no-lm",
            "--corpus",
            corpus,
            "--store",
            os.path.join(out, "store"),
            "--vocab-size",
            str(vocab),
            "--shards",
            str(shards),
            "--workers",
            str(threads),
            "--documents",
            "paragraph",
        ]
    )
    assert rc == 0
    from pipeline_lib import ArtifactStore

    m = ArtifactStore(os.path.join(out, "store")).latest("tokens")
    return {
        "n_tokens": m["meta"]["totals"]["n_tokens"],
        "n_docs": m["meta"]["totals"]["n_docs"],
        "total_s": time.perf_counter() - t0,
    }


def run_tokenmill_lib(corpus: str, out: str, vocab: int, threads: int, shards: int) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    from pipeline_lib import ArtifactStore, stages
    from pipeline_lib.corpus import CorpusConfig
    from pipeline_lib.counting import CountConfig
    from pipeline_lib.stages import TokenizerConfig
    from pipeline_lib.token_shards import EncodeConfig

    store = ArtifactStore(os.path.join(out, "store"))
    phases = {}
    t = time.perf_counter()
    cfg = CorpusConfig(sources=(corpus,), documents="paragraph", n_shards=shards)
    raw = stages.download_corpus(store, cfg)
    corpus_ref = stages.shard_corpus(store, raw, cfg)
    n = len(stages.corpus_shards(store, corpus_ref))
    phases["ingest+shard_s"] = time.perf_counter() - t
    t = time.perf_counter()
    ccfg = CountConfig("cl100k")
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda i: stages.count_shard(store, corpus_ref, i, ccfg), range(n)))
    counts = stages.reduce_counts(store, corpus_ref, ccfg)
    phases["count_s"] = time.perf_counter() - t
    t = time.perf_counter()
    tok = stages.learn_tokenizer(store, counts, TokenizerConfig(vocab_size=vocab))
    phases["merges_s"] = time.perf_counter() - t
    t = time.perf_counter()
    ecfg = EncodeConfig(workers=1)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda i: stages.encode_shard(store, corpus_ref, tok, i, ecfg), range(n)))
    tokens = stages.publish_tokens(store, corpus_ref, tok, ecfg)
    phases["encode_s"] = time.perf_counter() - t
    meta = store.manifest(tokens.kind, tokens.version)["meta"]
    return {"n_tokens": meta["totals"]["n_tokens"], "n_docs": meta["totals"]["n_docs"], **phases}


def run_hf(corpus: str, out: str, vocab: int, threads: int, shards: int) -> dict:
    import numpy as np
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from pipeline_lib.patterns import PATTERNS

    t = time.perf_counter()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PATTERNS["cl100k"]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        min_frequency=2,
        special_tokens=[EOT],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(batched(iter_paragraphs(corpus), 1024), trainer=trainer)
    train_s = time.perf_counter() - t
    t = time.perf_counter()
    eot = tok.token_to_id(EOT)
    arrays = []
    n_docs = 0
    for docs in batched(iter_paragraphs(corpus), 4096):
        for enc in tok.encode_batch(docs, add_special_tokens=False):
            ids = enc.ids
            ids.append(eot)
            arrays.append(np.array(ids, dtype=np.uint16))
        n_docs += len(docs)
    n = write_memmap(os.path.join(out, "train.bin"), arrays)
    return {
        "n_tokens": n,
        "n_docs": n_docs,
        "train_s": train_s,
        "encode_s": time.perf_counter() - t,
        "vocab": tok.get_vocab_size(),
    }


def run_rustbpe_tiktoken(corpus: str, out: str, vocab: int, threads: int, shards: int) -> dict:
    import numpy as np
    import rustbpe
    import tiktoken

    from pipeline_lib.patterns import PATTERNS

    t = time.perf_counter()
    tok = rustbpe.Tokenizer()
    # one id left for <|endoftext|>
    tok.train_from_iterator(iter_paragraphs(corpus), vocab - 1, pattern=PATTERNS["cl100k"])
    ranks = {bytes(k): v for k, v in tok.get_mergeable_ranks()}
    train_s = time.perf_counter() - t
    t = time.perf_counter()
    enc = tiktoken.Encoding(
        name="bench", pat_str=PATTERNS["cl100k"], mergeable_ranks=ranks, special_tokens={EOT: len(ranks)}
    )
    eot = enc.eot_token
    arrays = []
    n_docs = 0
    for docs in batched(iter_paragraphs(corpus), 4096):
        for ids in enc.encode_ordinary_batch(docs, num_threads=threads):
            ids.append(eot)
            arrays.append(np.array(ids, dtype=np.uint16))
        n_docs += len(docs)
    n = write_memmap(os.path.join(out, "train.bin"), arrays)
    return {
        "n_tokens": n,
        "n_docs": n_docs,
        "train_s": train_s,
        "encode_s": time.perf_counter() - t,
        "vocab": len(ranks) + 1,
    }


RUNNERS = {
    "tokenmill-flow": run_tokenmill_flow,
    "tokenmill-lib": run_tokenmill_lib,
    "hf": run_hf,
    "rustbpe+tiktoken": run_rustbpe_tiktoken,
}


def available(name: str) -> str | None:
    """None if the contender can run here, else why not."""
    import importlib.util

    needs = {"hf": ["tokenizers"], "rustbpe+tiktoken": ["rustbpe", "tiktoken"]}.get(name, [])
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    return f"not installed: {', '.join(missing)} (pip install {' '.join(missing)})" if missing else None


def measure(name: str, corpus: str, vocab: int, threads: int, shards: int, workdir: str) -> dict:
    """Run one contender in a fresh subprocess; wall, CPU (user+sys incl. children) and peak RSS."""
    out = tempfile.mkdtemp(prefix=f"{name.replace('+', '-')}-", dir=workdir)
    env = dict(
        os.environ,
        RAYON_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="true",
        PREFECT_HOME=os.path.join(out, "prefect"),
        PREFECT_LOGGING_LEVEL="WARNING",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="120",
    )
    os.makedirs(env["PREFECT_HOME"], exist_ok=True)
    env.pop("PREFECT_API_URL", None)
    if API_URL and name == "tokenmill-flow":
        env["PREFECT_API_URL"] = API_URL  # a running server: no temporary API to start
    result_path = os.path.join(out, "result.json")
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, __file__, "_one", name, corpus, out, str(vocab), str(threads), str(shards), result_path],
        env=env,
        cwd=str(ROOT),
        stdout=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed with exit code {proc.returncode}")
    with open(result_path) as f:
        detail = json.load(f)
    shutil.rmtree(out, ignore_errors=True)
    return {
        "contender": name,
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        **detail,
    }


def cmd_compare(args) -> int:
    global API_URL
    API_URL = args.api_url
    size = os.path.getsize(args.corpus)
    workdir = tempfile.mkdtemp(prefix="bench-pipeline-", dir=args.workdir)
    load = os.getloadavg()
    print(
        f"# corpus {args.corpus}: {size / 1e6:.1f} MB; vocab {args.vocab_size}; {args.threads} threads; "
        f"{os.cpu_count()} CPUs; load average before {load[0]:.2f}",
        flush=True,
    )
    names = args.only or list(CONTENDERS)
    rows = []
    try:
        for scale in args.scales:
            corpus = args.corpus
            if scale != 1:
                corpus = os.path.join(workdir, f"corpus_x{scale}.txt")
                with open(corpus, "wb") as dst:
                    for _ in range(scale):
                        with open(args.corpus, "rb") as src:
                            shutil.copyfileobj(src, dst, 16 << 20)
            nbytes = os.path.getsize(corpus)
            shards = args.shards or args.threads * max(1, -(-nbytes // (args.threads * (64 << 20))))
            for name in names:
                why = available(name)
                if why:
                    print(f"# skip {name}: {why}", flush=True)
                    continue
                row = {
                    "scale": scale,
                    "mb": round(nbytes / 1e6, 1),
                    "shards": shards if name.startswith("tokenmill") else None,
                    **measure(name, corpus, args.vocab_size, args.threads, shards, workdir),
                }
                row["mb_per_s"] = nbytes / 1e6 / row["wall_s"]
                row["load_after"] = round(os.getloadavg()[0], 2)
                rows.append(row)
                print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
            if scale != 1:
                os.unlink(corpus)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(
        f"{'scale':>5} {'contender':<17} {'MB':>7} {'wall s':>8} {'CPU s':>8} {'CPU/wall':>8} {'peak MB':>8} "
        f"{'MB/s':>6} {'tokens':>12} {'wall x':>7} {'CPU x':>6} {'RSS x':>6}"
    )
    for scale in args.scales:
        base = next((r for r in rows if r["scale"] == scale and r["contender"] == "tokenmill-lib"), None)
        for r in (r for r in rows if r["scale"] == scale):
            ratios = ("", "", "")
            if base:
                ratios = (
                    f"{r['wall_s'] / base['wall_s']:.2f}",
                    f"{r['cpu_s'] / base['cpu_s']:.2f}",
                    f"{r['peak_rss_mb'] / base['peak_rss_mb']:.2f}",
                )
            print(
                f"{r['scale']:>5} {r['contender']:<17} {r['mb']:>7} {r['wall_s']:>8.2f} {r['cpu_s']:>8.2f} "
                f"{r['cpu_s'] / r['wall_s']:>8.2f} "
                f"{r['peak_rss_mb']:>8.0f} {r['mb_per_s']:>6.1f} {r['n_tokens']:>12,} {ratios[0]:>7} {ratios[1]:>6} "
                f"{ratios[2]:>6}"
            )
    print(
        "(ratios against tokenmill-lib at the same scale; CPU = user+sys of the process tree; peak = largest single "
        "process)"
    )
    return 0


# ----------------------------------------------------------------------------- parallel
class GilProbe:
    """A thread that sleeps 1 ms at a time and records how late it wakes up.

    Waking up needs the GIL: while native code holds it, the probe waits for the whole
    call (a GIL-holding 0.5 s call shows as a 0.5 s delay); while native code has released
    it, delays stay at scheduler noise (and Python's 5 ms switch interval when other
    Python threads run). Robust to CPU contention from other processes, unlike
    CPU-time-over-wall-time, which needs two idle cores to show anything.
    """

    def __init__(self):
        import threading

        self.delays: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            t = time.perf_counter()
            time.sleep(0.001)
            self.delays.append(time.perf_counter() - t - 0.001)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        d = sorted(self.delays) or [0.0]
        return {
            "probe_max_ms": round(1000 * d[-1], 1),
            "probe_p99_ms": round(1000 * d[int(0.99 * (len(d) - 1))], 1),
            "probe_wakeups": len(d),
        }


def _timed(fn, jobs, threads: int) -> dict:
    """Run fn(job) for each job with `threads` threads: wall, process CPU, per-job thread CPU, GIL probe."""
    from concurrent.futures import ThreadPoolExecutor

    def one(job):
        c0, w0 = time.thread_time(), time.perf_counter()
        fn(job)
        return {"thread_cpu_s": time.thread_time() - c0, "wall_s": time.perf_counter() - w0}

    with GilProbe() as probe:
        c0, w0 = time.process_time(), time.perf_counter()
        if threads == 1:
            per_job = [one(j) for j in jobs]
        else:
            with ThreadPoolExecutor(threads) as pool:
                per_job = list(pool.map(one, jobs))
        wall = time.perf_counter() - w0
        cpu = time.process_time() - c0
    return {
        "threads": threads,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "cpu_per_wall": round(cpu / wall, 2),
        "jobs": [{k: round(v, 3) for k, v in j.items()} for j in per_job],
        **probe.summary(),
        "load": round(os.getloadavg()[0], 2),
    }


def _machine_control(threads: int) -> dict:
    """What the machine gives `threads` threads of GIL-free native work: sha256 over 64 MiB
    buffers (hashlib releases the GIL above 2 KiB). CPU/wall near `threads` means idle
    cores; near 1 means the cores are busy elsewhere and no runner can be parallel here."""
    import hashlib

    data = os.urandom(64 << 20)
    r = _timed(lambda _: [hashlib.sha256(data).digest() for _ in range(4)], list(range(threads)), threads)
    return {k: r[k] for k in ("threads", "wall_s", "cpu_s", "cpu_per_wall", "load")}


def _gil_holding_control(seconds: float = 0.3) -> dict:
    """The probe against a long C call that holds the GIL: `sum(range(10**7))`."""
    with GilProbe() as probe:
        n = 10_000_000
        t = time.perf_counter()
        while time.perf_counter() - t < seconds:
            sum(range(n))
    return probe.summary()


def _stage_overlap(flow_state, task_name: str) -> dict:
    """Stage wall (first start to last end) against the sum of the task runs' run times."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_state.state_details.flow_run_id]))
        )
    runs = [r for r in runs if r.name.rsplit("-", 1)[0] == task_name]
    start = min(r.start_time for r in runs)
    end = max(r.end_time for r in runs)
    busy = sum(r.total_run_time.total_seconds() for r in runs)
    wall = (end - start).total_seconds()
    return {
        "tasks": len(runs),
        "stage_wall_s": round(wall, 3),
        "sum_task_run_s": round(busy, 3),
        "overlap": round(busy / wall, 2),
    }


def cmd_parallel(args) -> int:
    from pipeline_lib import ArtifactStore, counting, stages, token_shards
    from pipeline_lib.corpus import CorpusConfig, iter_shard_batches
    from pipeline_lib.counting import CountConfig
    from pipeline_lib.stages import TokenizerConfig
    from pipeline_lib.token_shards import EncodeConfig

    work = tempfile.mkdtemp(prefix="bench-parallel-", dir=args.workdir)
    try:
        print(
            f"# corpus {args.corpus}: {os.path.getsize(args.corpus) / 1e6:.1f} MB in {args.shards} shards; "
            f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        store = ArtifactStore(os.path.join(work, "store"))
        cfg = CorpusConfig(sources=(args.corpus,), documents="paragraph", n_shards=args.shards)
        corpus_ref = stages.shard_corpus(store, stages.download_corpus(store, cfg), cfg)
        cdir = store.local_dir(corpus_ref.kind, corpus_ref.version)
        paths = [os.path.join(cdir, s["file"]) for s in stages.corpus_shards(store, corpus_ref)]
        ccfg = CountConfig("cl100k")
        for i in range(len(paths)):
            stages.count_shard(store, corpus_ref, i, ccfg)
        counts = stages.reduce_counts(store, corpus_ref, ccfg)
        tok_ref = stages.learn_tokenizer(store, counts, TokenizerConfig(vocab_size=args.vocab_size))
        tok = stages.load_tokenizer(store, tok_ref)

        def count(path):
            counting.count_shard(path, "cl100k")

        def encode(path):
            d = tempfile.mkdtemp(dir=work)
            token_shards.encode_documents(
                tok,
                iter_shard_batches(path),
                os.path.join(d, "t.npy"),
                os.path.join(d, "i.npy"),
                EncodeConfig(workers=1),
                "s",
            )

        control = _gil_holding_control()
        print(json.dumps({"stage": "control: sum(range(1e7)) holds the GIL", **control}), flush=True)
        for threads in (1, len(paths)):
            print(
                json.dumps({"stage": "control: sha256 in threads (GIL released)", **_machine_control(threads)}),
                flush=True,
            )
        results = {}
        for label, fn in (("count", count), ("encode", encode)):
            for threads in (1, len(paths)):
                r = _timed(fn, paths, threads)
                results[f"{label}-{threads}"] = r
                print(json.dumps({"stage": label, **r}), flush=True)
            one, many = results[f"{label}-1"], results[f"{label}-{len(paths)}"]
            print(
                f"{label}: {len(paths)} shards one after the other {one['wall_s']:.2f} s wall / {one['cpu_s']:.2f} s "
                "CPU; "
                f"{len(paths)} threads {many['wall_s']:.2f} s wall / {many['cpu_s']:.2f} s CPU (CPU/wall "
                f"{many['cpu_per_wall']}); "
                f"speed-up {one['wall_s'] / many['wall_s']:.2f}x; GIL probe max delay {many['probe_max_ms']} ms "
                f"(control holding the GIL: {control['probe_max_ms']} ms)",
                flush=True,
            )

        if args.skip_prefect:
            return 0
        # Through Prefect: the same two stages as flows, thread runner with 1 and N threads.
        os.environ.setdefault("PREFECT_HOME", os.path.join(work, "prefect"))
        os.makedirs(os.environ["PREFECT_HOME"], exist_ok=True)
        # 20 s is too short on a busy machine
        os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
        os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        from prefect.task_runners import ThreadPoolTaskRunner

        from flows.pipeline import encode_flow, tokenizer_flow
        from tasks.common import ref_dict

        for threads in (1, len(paths)):
            st = os.path.join(work, f"store-prefect-{threads}")
            s2 = ArtifactStore(st)
            c2 = stages.shard_corpus(s2, stages.download_corpus(s2, cfg), cfg)
            runner = ThreadPoolTaskRunner(max_workers=threads)
            t0 = time.perf_counter()
            state = tokenizer_flow.with_options(task_runner=runner)(
                ref_dict(c2), store=st, vocab_size=args.vocab_size, return_state=True
            )
            t_tok = time.perf_counter() - t0
            tok2 = state.result()
            row = {
                "stage": "prefect-count",
                "threads": threads,
                "flow_wall_s": round(t_tok, 3),
                **_stage_overlap(state, "count_words"),
            }
            print(json.dumps(row), flush=True)
            t0 = time.perf_counter()
            state = encode_flow.with_options(task_runner=ThreadPoolTaskRunner(max_workers=threads))(
                ref_dict(c2), tok2, store=st, return_state=True
            )
            row = {
                "stage": "prefect-encode",
                "threads": threads,
                "flow_wall_s": round(time.perf_counter() - t0, 3),
                **_stage_overlap(state, "encode_shard"),
            }
            print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


# ----------------------------------------------------------------------------- main
def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "_one":
        name, corpus, out, vocab, threads, shards, result_path = sys.argv[2:9]
        detail = RUNNERS[name](corpus, out, int(vocab), int(threads), int(shards))
        with open(result_path, "w") as f:
            json.dump(detail, f)
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare", help="tokenmill vs HF tokenizers vs rustbpe+tiktoken")
    c.add_argument("corpus")
    c.add_argument(
        "--scales", type=int, nargs="+", default=[1, 4], help="corpus repeated this many times (default: 1 4)"
    )
    c.add_argument("--vocab-size", type=int, default=32768)
    c.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    c.add_argument(
        "--shards", type=int, default=0, help="tokenmill corpus shards (default: one per thread, at most 64 MB each)"
    )
    c.add_argument("--only", nargs="+", choices=CONTENDERS)
    c.add_argument("--workdir", help="scratch directory (default: the system temp dir)")
    c.add_argument(
        "--api-url",
        help="run tokenmill-flow against this Prefect server (e.g. http://127.0.0.1:4200/api) "
        "instead of a temporary API",
    )
    c.set_defaults(func=cmd_compare)
    q = sub.add_parser("parallel", help="thread-runner parallelism of the counting and encoding tasks")
    q.add_argument("corpus")
    q.add_argument("--shards", type=int, default=2)
    q.add_argument("--vocab-size", type=int, default=32768)
    q.add_argument("--workdir")
    q.add_argument("--skip-prefect", action="store_true", help="only the library-level measurement")
    q.set_defaults(func=cmd_parallel)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
