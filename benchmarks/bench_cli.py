"""The user's path: `tokenmill tokenizer train` against a six-line rustbpe script, and where
the product path's seconds go.

Run by hand (not part of the tests):

    bash ../shared/corpus/make_prose_big.sh /tmp/prose          # ~139 MB of English, ~2 min
    pip install -e ".[bench]"                                   # rustbpe, tiktoken
    python benchmarks/bench_cli.py /tmp/prose/prose_big.txt --head-mb 20   # the first 20 MB
    python benchmarks/bench_cli.py /tmp/prose/prose_big.txt

Every contender is a fresh process, timed from spawn to exit, on the same file:

    rustbpe            the script below: read, split at blank lines, rustbpe
                       `train_from_iterator` (cl100k pattern, RAYON_NUM_THREADS=--workers),
                       a tiktoken Encoding from its ranks, the ranks saved to a file
    library            the stages `tokenizer train` runs (download, shard, count per shard in
                       a pool of --workers threads, reduce, learn merges) called directly, no
                       Prefect: the work the command cannot skip
    tokenmill (cold)   `tokenmill tokenizer train --corpus FILE --vocab-size V --pattern cl100k
                       --workers W --store DIR`, no PREFECT_API_URL, a fresh PREFECT_HOME:
                       the command starts tokenmill's local Prefect server (once per home)
    tokenmill          the same command again (new store), the local server already running:
                       what every later command costs, run in the warm runner the first
                       command left (flows/warm.py; its child's CPU is counted), and with
                       TOKENMILL_WARM=0 (imports and all, in the command's own process)
    tokenmill (API)    the same with PREFECT_API_URL pointing at `prefect server start`
                       (started here, on 127.0.0.1 and a free port, and stopped afterwards)

For each: wall time, CPU time of the process (all its threads and children), CPU time the
Prefect server spent meanwhile, and for tokenmill the phases read from its log: spawn ->
first flow-run line (imports, API checks, flow-run creation), the flow run, last line ->
exit. Wall times on a shared machine move with its load (printed with each row); CPU
times move much less, so the CPU ratio (process + server) is printed beside the wall ratio.

Targets: tokenmill <= 0.5x rustbpe's wall time on 20 MB, <= 0.3x on 139 MB.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
CL100K = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
)

RUSTBPE_SCRIPT = textwrap.dedent("""
    import sys, rustbpe, tiktoken
    docs = open(sys.argv[1], encoding="utf-8", errors="replace").read().split("\\n\\n")
    tok = rustbpe.Tokenizer(); tok.train_from_iterator(iter(docs), int(sys.argv[2]), pattern=sys.argv[4])
    ranks = {bytes(k): v for k, v in tok.get_mergeable_ranks()}
    enc = tiktoken.Encoding("bench", pat_str=tok.get_pattern(), mergeable_ranks=ranks, special_tokens={})
    open(sys.argv[3], "w").write("".join(f"{k.hex()} {v}\\n" for k, v in sorted(ranks.items(), key=lambda kv: kv[1])))
""")
LOG_LINE = re.compile(r"^(\d\d:\d\d:\d\d\.\d{3}) \| ", re.M)


def load() -> float:
    return os.getloadavg()[0]


@dataclass
class Timing:
    wall: float
    cpu: float  # the process and its children
    server_cpu: float = 0.0  # the Prefect server's process group meanwhile
    phases: tuple[float, float, float] | None = None  # spawn -> first log line, first -> last, last -> exit
    load: float = 0.0


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def group_cpu(pgid: int | None) -> float:
    """CPU seconds of the live processes of process group `pgid` (a server we or tokenmill started)."""
    if pgid is None:
        return 0.0
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:  # field 5 of stat: the process group
                total += (int(fields[11]) + int(fields[12])) / tick
    return total


def log_phases(log: str, spawned: float, ended: float) -> tuple[float, float, float] | None:
    """(spawn -> first Prefect log line, first -> last line, last line -> exit) in seconds."""
    with open(log, encoding="utf-8", errors="replace") as f:
        stamps = LOG_LINE.findall(f.read())
    if not stamps:
        return None
    day = dt.datetime.fromtimestamp(spawned).date()
    first, last = (dt.datetime.combine(day, dt.time.fromisoformat(s)).timestamp() for s in (stamps[0], stamps[-1]))
    return first - spawned, last - first, ended - last


def timed(argv: list[str], env: dict[str, str], log: str, server_pgid=lambda: None, phases: bool = False) -> Timing:
    pgid = server_pgid()
    s0, c0, l0 = group_cpu(pgid), children_cpu(), load()
    spawned, t0 = time.time(), time.perf_counter()
    with open(log, "wb") as out:
        rc = subprocess.run(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    wall, ended = time.perf_counter() - t0, time.time()
    if rc != 0:
        with open(log, "rb") as f:
            tail = f.read()[-3000:].decode("utf-8", "replace")
        raise SystemExit(f"{argv[0]} ... exited with {rc} (log {log}):\n{tail}")
    pgid = pgid or server_pgid()  # a cold run starts the server: count it from its start
    return Timing(
        wall,
        children_cpu() - c0,
        group_cpu(pgid) - s0,
        log_phases(log, spawned, ended) if phases else None,
        max(l0, load()),
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(home: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "TOKENMILL_"))}
    env.update(
        PREFECT_HOME=home, PREFECT_SERVER_ANALYTICS_ENABLED="false", PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    )
    return env


def local_server_pgid(home: str) -> int | None:
    """The pid (= process group) of tokenmill's local server in PREFECT_HOME `home`, if it runs."""
    sys.path.insert(0, ROOT)
    from flows.prefect_api import LocalServer, server_dir

    state = LocalServer(server_dir(__import__("pathlib").Path(home))).read_state()
    return state["pid"] if state else None


@contextlib.contextmanager
def prefect_server(home: str):
    """`prefect server start` on 127.0.0.1 and a free port; yields (API URL, process group)."""
    port = free_port()
    env = base_env(home)
    env.update(PREFECT_UI_ENABLED="false", PREFECT_SERVER_API_HOST="127.0.0.1", PREFECT_SERVER_API_PORT=str(port))
    os.makedirs(home, exist_ok=True)
    with open(os.path.join(home, "server.log"), "wb") as log:
        proc = subprocess.Popen(
            [os.path.join(BIN, "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}/api"
    try:
        t0 = time.perf_counter()
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"prefect server start exited with {proc.returncode}; see {home}/server.log")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            if time.perf_counter() - t0 > 300:
                raise SystemExit("prefect server start: not healthy after 300 s")
            time.sleep(0.2)
        print(f"  prefect server start: healthy after {time.perf_counter() - t0:.1f} s (load {load():.1f})", flush=True)
        yield url, proc.pid
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
                break


def wait_for_runner(home: str, timeout: float = 120) -> str:
    """The log of the warm runner (flows/warm.py) the first command left, once it serves."""
    directory = os.path.join(home, "tokenmill")
    deadline = time.monotonic() + timeout
    while not os.path.exists(os.path.join(directory, "warm.json")):
        if time.monotonic() > deadline:
            raise SystemExit(f"no warm runner in {directory} after {timeout:.0f} s")
        time.sleep(0.2)
    return os.path.join(directory, "warm.log")


def served_cpu(t: Timing, runner_log: str) -> Timing:
    """`t` with the CPU of the runner's child that ran the command (it logs it as it exits)."""
    with open(runner_log) as f:
        exits = re.findall(r"pid \d+: exit \d+, ([\d.]+) s CPU", f.read())
    if not exits:
        raise SystemExit(f"{runner_log}: the command did not run in the warm runner")
    t.cpu += float(exits[-1])
    return t


def cut(path: str, out: str, head_mb: float | None = None, head_tail_mb: float | None = None) -> str:
    """The first `head_mb` MB of `path`, or its first and last `head_tail_mb` MB, cut at line ends."""
    with open(path, "rb") as f:
        data = f.read()
    if head_mb:
        part = data[: int(head_mb * 1e6)]
        part = part[: part.rfind(b"\n") + 1]
    else:
        n = int((head_tail_mb or 0) * 1e6)
        head, tail = data[:n], data[-n:]
        part = head[: head.rfind(b"\n") + 1] + tail[tail.find(b"\n") + 1 :]
    with open(out, "wb") as f:
        f.write(part)
    return out


def run_library(corpus: str, vocab_size: int, workers: int, store_url: str) -> None:
    """The stages of `tokenizer train`, called directly (the `library` contender's process)."""
    sys.path.insert(0, ROOT)
    from concurrent.futures import ThreadPoolExecutor

    from pipeline_lib import ArtifactStore, stages
    from pipeline_lib.corpus import CorpusConfig
    from pipeline_lib.counting import CountConfig

    store = ArtifactStore(store_url)
    config, count = CorpusConfig(sources=(corpus,)), CountConfig(pattern="cl100k")
    shards = stages.shard_corpus(store, stages.download_corpus(store, config), config)
    with ThreadPoolExecutor(workers) as pool:
        list(
            pool.map(
                lambda i: stages.count_shard(store, shards, i, count), range(len(stages.corpus_shards(store, shards)))
            )
        )
    tokenizer = stages.learn_tokenizer(
        store, stages.reduce_counts(store, shards, count), stages.TokenizerConfig(vocab_size=vocab_size)
    )
    print(f"tokenizer {tokenizer.key}")


def main() -> None:
    if sys.argv[1:2] == ["--library-run"]:
        corpus, vocab, workers, store = sys.argv[2:6]
        run_library(corpus, int(vocab), int(workers), store)
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus")
    part = ap.add_mutually_exclusive_group()
    part.add_argument("--head-mb", type=float, help="benchmark on the first N MB of the file (20: the 20 MB case)")
    part.add_argument("--head-tail-mb", type=float, help="benchmark on the first and last N MB of the file")
    ap.add_argument("--vocab-size", type=int, default=32768)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per contender after the cold one (default: %(default)s); the best counts",
    )
    ap.add_argument(
        "--no-api-server", action="store_true", help="skip the PREFECT_API_URL contender (`prefect server start`)"
    )
    ap.add_argument("--work-dir", help="for stores, homes and logs (default: a temp dir, removed afterwards)")
    args = ap.parse_args()

    try:
        import rustbpe  # noqa: F401
        import tiktoken  # noqa: F401

        has_rustbpe = True
    except ImportError:
        has_rustbpe = False
    work = args.work_dir or tempfile.mkdtemp(prefix="tokenmill-bench-cli-")
    os.makedirs(work, exist_ok=True)
    corpus = args.corpus
    if args.head_mb or args.head_tail_mb:
        corpus = cut(corpus, os.path.join(work, "corpus.txt"), args.head_mb, args.head_tail_mb)
    size = os.path.getsize(corpus)
    # `python -m flows.cli` from the repository root: the `tokenmill` script's code, from this checkout
    # (whatever copy of the package the environment holds).
    tokenmill = [sys.executable, "-m", "flows.cli"]
    runs = iter(range(10_000))

    def train_cmd() -> list[str]:
        store = os.path.join(work, f"store{next(runs)}")
        return [
            *tokenmill,
            "tokenizer",
            "train",
            "--corpus",
            corpus,
            "--vocab-size",
            str(args.vocab_size),
            "--pattern",
            "cl100k",
        ] + [
            "--workers",
            str(args.workers),
            "--store",
            store,
        ]

    print(
        f"{corpus}: {size / 1e6:.1f} MB, vocab {args.vocab_size}, {args.workers} workers, {os.cpu_count()} CPUs, "
        f"load {load():.1f}",
        flush=True,
    )
    print(
        f"  {'contender':<38} {'wall s':>7} {'cpu s':>6} {'server':>6}  {'to flow':>7} {'flow':>6} {'exit':>5}  load",
        flush=True,
    )
    results: dict[str, list[Timing]] = {}

    def record(name: str, t: Timing) -> None:
        results.setdefault(name, []).append(t)
        phases = "  ".join(f"{p:6.2f}" for p in t.phases) if t.phases else ""
        print(f"  {name:<38} {t.wall:7.2f} {t.cpu:6.2f} {t.server_cpu:6.2f}  {phases:<22} {t.load:4.1f}", flush=True)

    log = lambda name: os.path.join(work, f"{name}{next(runs)}.log")  # noqa: E731
    env = base_env(os.path.join(work, "unused-home"))
    env["RAYON_NUM_THREADS"] = str(args.workers)
    if has_rustbpe:
        script = os.path.join(work, "rustbpe_train.py")
        with open(script, "w") as f:
            f.write(RUSTBPE_SCRIPT)
        for _ in range(args.repeat):
            ranks = os.path.join(work, "rustbpe.ranks")
            record(
                "rustbpe + tiktoken",
                timed([sys.executable, script, corpus, str(args.vocab_size), ranks, CL100K], env, log("rustbpe")),
            )
    else:
        print("  rustbpe + tiktoken: not installed (pip install -e '.[bench]'), no ratio", flush=True)
    for _ in range(args.repeat):
        store = os.path.join(work, f"store{next(runs)}")
        argv = [
            sys.executable,
            os.path.abspath(__file__),
            "--library-run",
            corpus,
            str(args.vocab_size),
            str(args.workers),
            store,
        ]
        record("library (no Prefect)", timed(argv, env, log("library")))

    home = os.path.join(work, "home-local")
    env = {**base_env(home), "TOKENMILL_WARM": "1"}  # the runner is opt-in
    try:
        record(
            "tokenmill (cold local server)",
            timed(train_cmd(), env, log("cold"), lambda: local_server_pgid(home), phases=True),
        )
        runner_log = wait_for_runner(home)
        for _ in range(args.repeat):
            t = timed(train_cmd(), env, log("warm"), lambda: local_server_pgid(home), phases=True)
            record("tokenmill (local server, warm runner)", served_cpu(t, runner_log))
        for _ in range(args.repeat):
            cold_env = {**env, "TOKENMILL_WARM": "0"}
            record(
                "tokenmill (local server, no runner)",
                timed(train_cmd(), cold_env, log("nowarm"), lambda: local_server_pgid(home), phases=True),
            )
    finally:
        subprocess.run([*tokenmill, "server", "stop"], env=env, cwd=ROOT, capture_output=True)
    if not args.no_api_server:
        with prefect_server(os.path.join(work, "home-server")) as (url, pgid):
            env = base_env(os.path.join(work, "home-client"))
            env["PREFECT_API_URL"] = url
            for _ in range(args.repeat):
                record("tokenmill (PREFECT_API_URL)", timed(train_cmd(), env, log("api"), lambda: pgid, phases=True))

    if has_rustbpe:
        base = min(results["rustbpe + tiktoken"], key=lambda t: t.wall)
        target = 0.5 if size < 50e6 else 0.3
        print(
            f"ratio to rustbpe + tiktoken ({base.wall:.2f} s wall, {base.cpu:.2f} s CPU; target <= {target}x wall "
            "at this size):"
        )
        print(f"  {'':<38} {'wall':>6} {'cpu+server':>10}")
        for name, timings in results.items():
            if name != "rustbpe + tiktoken":
                best = min(timings, key=lambda t: t.wall)
                print(f"  {name:<38} {best.wall / base.wall:5.2f}x {(best.cpu + best.server_cpu) / base.cpu:9.2f}x")
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
