"""A text file to a `.npy` of token ids: the command a user types against the peers' file paths.

    python benchmarks/bench_encode_file.py FILE [FILE ...] [--repeat 3] [--encoding cl100k_base]

Each run is a fresh process that reads FILE, encodes it as one text (ids as tiktoken's
`encode_ordinary` gives them) and writes the ids to a `.npy`: imports, reading and writing
count, as they do for a user.

- tokenmill: `tokenmill tokenizer encode --tokenizer ENC --input FILE --output ids.npy
  --special-as-text` (the CLI: it streams the file in blocks cut at safe boundaries, encodes
  them on all cores and appends the ids);
- gigatoken: `Tokenizer.encode_files(FILE)` (its native file reader, parallel), then `np.save`;
- fastokens, toktok-rs: the file read into a `str`, their one-text call, then `np.save`.

Installs nothing: a peer that does not import is named and skipped. The first run of each peer's
ids is checked against tokenmill's output (equal arrays, or the peer is not ranked). Runs are
interleaved (tokenmill, peer, tokenmill, peer, ...) and the medians are printed: wall seconds,
CPU seconds (user + system of the process and its children), peak RSS, MB/s and the ratio of
the fastest peer's wall time to tokenmill's. The load average is printed with each file.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_encode_peers import ranks_file  # noqa: E402

PATTERNS = {"cl100k_base": "cl100k", "o200k_base": "o200k"}

# One peer's file path as a script: argv = FILE OUT RANKS PATTERN ENCODING.
PEER_SCRIPTS = {
    "gigatoken": """
import sys, numpy as np, awkward as ak, gigatoken
src, out, ranks, pattern, _ = sys.argv[1:]
tok = gigatoken.Tokenizer.from_tiktoken(ranks, pretokenizer=pattern)
np.save(out, ak.flatten(tok.encode_files(src)).to_numpy().astype(np.uint32))
""",
    "fastokens": """
import sys, numpy as np, fastokens
from pipeline_lib.tokenizer import get_encoding
src, out, ranks, pattern, name = sys.argv[1:]
tok = fastokens.Tokenizer.from_tiktoken(ranks, pattern=get_encoding(name).pattern_str)
with open(src, encoding="utf-8", newline="") as f:  # no newline translation: the bytes as they are
    text = f.read()
ids = tok.encode_ordinary(text)
np.save(out, np.asarray(getattr(ids, "ids", ids), dtype=np.uint32))
""",
    "toktok-rs": """
import sys, numpy as np, toktok
src, out, ranks, pattern, name = sys.argv[1:]
tok = toktok._encoding(name)
with open(src, encoding="utf-8", newline="") as f:  # no newline translation: the bytes as they are
    text = f.read()
np.save(out, np.asarray(tok.encode_ordinary(text), dtype=np.uint32))  # its numpy call checks specials
""",
}
PEER_MODULES = {"gigatoken": "gigatoken", "fastokens": "fastokens", "toktok-rs": "toktok"}


# The environment of a user's shell: Python caches compiled modules (a sandbox that sets
# PYTHONDONTWRITEBYTECODE recompiles tokenmill's ~30 modules at every start, ~60 ms, while the
# peers' installed wheels come compiled).
USER_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def measured(argv: list[str]) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MB) of `argv` run to completion in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=USER_ENV)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:4]} exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # ru_maxrss of RUSAGE_CHILDREN is the largest child's so far: run the measurement in a
    # process of its own (below) so that it is this command's alone.
    return wall, cpu, after.ru_maxrss / 1024  # MiB


def measured_alone(argv: list[str]) -> tuple[float, float, float]:
    """`measured` in a fresh Python process, so that the peak RSS is this command's alone."""
    code = (
        "import sys, json; sys.path.insert(0, sys.argv[1]); from bench_encode_file import measured; "
        "print(json.dumps(measured(sys.argv[2:])))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "benchmarks"), *argv], cwd=ROOT, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}")
    import json

    wall, cpu, rss = json.loads(out.stdout.strip().splitlines()[-1])
    return wall, cpu, rss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--encoding", default="cl100k_base", choices=list(PATTERNS))
    ap.add_argument(
        "--peers",
        nargs="*",
        choices=list(PEER_MODULES),
        default=list(PEER_MODULES),
        help="peers to run (default all; those reading the file into a str take ~15-20 bytes per input byte)",
    )
    args = ap.parse_args()
    import importlib.util

    ranks = ranks_file(args.encoding)
    peers, skipped = [], []
    for name, module in PEER_MODULES.items():
        if name in args.peers:
            (peers if importlib.util.find_spec(module) else skipped).append(name)
    print(f"{os.cpu_count()} CPUs, encoding {args.encoding}; peers {', '.join(peers) or 'none'}", flush=True)
    for name in skipped:
        print(f"  skipped {name}: not installed")
    work = Path(tempfile.mkdtemp(prefix="tokenmill-bench-file-"))
    ours = [sys.executable, "-m", "flows.cli", "tokenizer", "encode", "--tokenizer", args.encoding, "--special-as-text"]
    try:
        for path in args.files:
            size = os.path.getsize(path)
            la = os.getloadavg()
            print(f"\n{path} ({size / 1e6:,.1f} MB), load {la[0]:.1f} {la[1]:.1f}", flush=True)
            argv = {"tokenmill": [*ours, "--input", path, "--output", str(work / "tokenmill.npy")]}
            for name in peers:
                script = work / f"peer_{name.replace('-', '_')}.py"
                script.write_text(PEER_SCRIPTS[name])
                argv[name] = [sys.executable, str(script), path, str(work / f"{name}.npy"), ranks]
                argv[name] += [PATTERNS[args.encoding], args.encoding]
            runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in argv}
            runs["tokenmill"].append(measured_alone(argv["tokenmill"]))
            expected = np.load(work / "tokenmill.npy", allow_pickle=False)
            ranked = []
            for name in peers:
                try:
                    runs[name].append(measured_alone(argv[name]))
                    got = np.load(work / f"{name}.npy", allow_pickle=False)
                except RuntimeError as e:
                    print(f"  {name:<10} failed: {e}")
                    continue
                if not np.array_equal(got, expected):
                    print(f"  {name:<10} not ranked: ids differ from tokenmill's ({len(got):,} vs {len(expected):,})")
                    continue
                ranked.append(name)
                (work / f"{name}.npy").unlink()
            for _ in range(args.repeat - 1):  # interleaved: ours, peer, ours, peer, ...
                for name in ranked:
                    runs["tokenmill"].append(measured_alone(argv["tokenmill"]))
                    runs[name].append(measured_alone(argv[name]))
            med = {
                name: tuple(statistics.median(r[i] for r in rs) for i in range(3))
                for name, rs in runs.items()
                if rs and (name == "tokenmill" or name in ranked)
            }
            best_peer = min((med[n][0] for n in ranked), default=None)
            print(f"  {len(expected):,} ids, equal for every ranked peer; medians of {args.repeat} runs:")
            for name, (wall, cpu, rss) in sorted(med.items(), key=lambda kv: kv[1][0]):
                ratio = ""
                if name == "tokenmill" and best_peer:
                    ratio = f"  tokenmill {best_peer / med['tokenmill'][0]:.2f}x the fastest peer"
                print(
                    f"  {name:<10} {wall:7.2f} s  {cpu:7.2f} CPU-s  {rss:7.0f} MB peak  "
                    f"{size / 1e6 / wall:7.1f} MB/s  {rss * 2**20 / size:5.2f} bytes of RSS per input byte{ratio}",
                    flush=True,
                )
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
