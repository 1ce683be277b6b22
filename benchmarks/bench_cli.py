"""The user's path: `tokenmill tokenizer train` against a six-line rustbpe script, wall time.

Run by hand (not part of the tests):

    bash ../shared/corpus/make_prose_big.sh /tmp/prose          # ~139 MB of English, ~2 min
    pip install -e ".[bench]"                                   # rustbpe, tiktoken
    python benchmarks/bench_cli.py /tmp/prose/prose_big.txt --head-tail-mb 10   # the 20 MB cut
    python benchmarks/bench_cli.py /tmp/prose/prose_big.txt

Every contender is a fresh process, timed from spawn to exit, on the same file:

    rustbpe            the script below: read, split at blank lines, rustbpe
                       `train_from_iterator` (cl100k pattern, RAYON_NUM_THREADS=--workers),
                       a tiktoken Encoding from its ranks, the ranks saved to a file
    tokenmill (cold)   `tokenmill tokenizer train --corpus FILE --vocab-size V --pattern cl100k
                       --workers W --store DIR`, no PREFECT_API_URL, a fresh PREFECT_HOME:
                       the command starts tokenmill's local Prefect server (once per home)
    tokenmill          the same command again (new store), the local server already running:
                       what every later command costs
    tokenmill (API)    the same with PREFECT_API_URL pointing at `prefect server start`
                       (started here, on 127.0.0.1 and a free port, and stopped afterwards)

Targets: tokenmill <= 0.5x rustbpe's wall time on 20 MB, <= 0.3x on 139 MB. The machine's
load average is printed with each timing: on a shared machine, compare runs side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
CL100K = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""

RUSTBPE_SCRIPT = textwrap.dedent("""
    import sys, rustbpe, tiktoken
    docs = open(sys.argv[1], encoding="utf-8", errors="replace").read().split("\\n\\n")
    tok = rustbpe.Tokenizer(); tok.train_from_iterator(iter(docs), int(sys.argv[2]), pattern=sys.argv[4])
    ranks = {bytes(k): v for k, v in tok.get_mergeable_ranks()}
    enc = tiktoken.Encoding("bench", pat_str=tok.get_pattern(), mergeable_ranks=ranks, special_tokens={})
    open(sys.argv[3], "w").write("".join(f"{k.hex()} {v}\\n" for k, v in sorted(ranks.items(), key=lambda kv: kv[1])))
""")


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def timed(argv: list[str], env: dict[str, str], log: str) -> float:
    t0 = time.perf_counter()
    with open(log, "wb") as out:
        rc = subprocess.run(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        with open(log, "rb") as f:
            tail = f.read()[-3000:].decode("utf-8", "replace")
        raise SystemExit(f"{argv[0]} ... exited with {rc} (log {log}):\n{tail}")
    return wall


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(home: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "TOKENMILL_"))}
    env.update(PREFECT_HOME=home, PREFECT_SERVER_ANALYTICS_ENABLED="false", PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    return env


@contextlib.contextmanager
def prefect_server(home: str):
    """`prefect server start` on 127.0.0.1 and a free port; yields its API URL."""
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
        print(f"  prefect server start: healthy after {time.perf_counter() - t0:.1f} s ({load()})", flush=True)
        yield url
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
                break


def head_tail(path: str, mb: float, out: str) -> str:
    """The first and the last `mb` MB of `path`, cut at line ends."""
    n = int(mb * 1e6)
    with open(path, "rb") as f:
        data = f.read()
    head = data[:n]
    head = head[: head.rfind(b"\n") + 1]
    tail = data[-n:]
    tail = tail[tail.find(b"\n") + 1 :]
    with open(out, "wb") as f:
        f.write(head + tail)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus")
    ap.add_argument("--head-tail-mb", type=float, help="benchmark on the first and last N MB of the file (10: the 20 MB cut)")
    ap.add_argument("--vocab-size", type=int, default=32768)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="warm tokenmill runs per mode (default: %(default)s)")
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
    if args.head_tail_mb:
        corpus = head_tail(corpus, args.head_tail_mb, os.path.join(work, "corpus.txt"))
    size = os.path.getsize(corpus)
    # `python -m flows.cli` from the repository root: the `tokenmill` script's code, from this checkout
    # (whatever copy of the package the environment holds).
    tokenmill = [sys.executable, "-m", "flows.cli"]

    def train_cmd(store: str) -> list[str]:
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
            "--workers",
            str(args.workers),
            "--store",
            store,
        ]

    print(f"{corpus}: {size / 1e6:.1f} MB, vocab {args.vocab_size}, {args.workers} workers, {os.cpu_count()} CPUs, {load()}", flush=True)
    results: dict[str, list[float]] = {}

    def record(name: str, wall: float) -> None:
        results.setdefault(name, []).append(wall)
        print(f"  {name:<28} {wall:7.2f} s  ({load()})", flush=True)

    run = iter(range(1000))
    if has_rustbpe:
        env = base_env(os.path.join(work, "unused-home"))
        env["RAYON_NUM_THREADS"] = str(args.workers)
        script = os.path.join(work, "rustbpe_train.py")
        with open(script, "w") as f:
            f.write(RUSTBPE_SCRIPT)
        record(
            "rustbpe + tiktoken",
            timed([sys.executable, script, corpus, str(args.vocab_size), os.path.join(work, "rustbpe.ranks"), CL100K], env, os.path.join(work, "rustbpe.log")),
        )
    else:
        print("  rustbpe + tiktoken: not installed (pip install -e '.[bench]'), no ratio", flush=True)

    home = os.path.join(work, "home-local")
    env = base_env(home)
    try:
        record("tokenmill (cold local server)", timed(train_cmd(os.path.join(work, f"store{next(run)}")), env, os.path.join(work, "cold.log")))
        for _ in range(args.repeat):
            i = next(run)
            record("tokenmill (local server)", timed(train_cmd(os.path.join(work, f"store{i}")), env, os.path.join(work, f"warm{i}.log")))
    finally:
        subprocess.run([*tokenmill, "server", "stop"], env=env, cwd=ROOT, capture_output=True)
    with prefect_server(os.path.join(work, "home-server")) as url:
        env = base_env(os.path.join(work, "home-client"))
        env["PREFECT_API_URL"] = url
        for _ in range(args.repeat):
            i = next(run)
            record("tokenmill (PREFECT_API_URL)", timed(train_cmd(os.path.join(work, f"store{i}")), env, os.path.join(work, f"api{i}.log")))

    if has_rustbpe:
        base = min(results["rustbpe + tiktoken"])
        target = 0.5 if size < 50e6 else 0.3
        print(f"ratio to rustbpe + tiktoken ({base:.2f} s; target <= {target}x at this size):")
        for name, walls in results.items():
            if name != "rustbpe + tiktoken":
                print(f"  {name:<28} {min(walls) / base:5.2f}x")
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
