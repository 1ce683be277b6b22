"""Single-core throughput of the core's two inner loops, and a hook for callgrind.

    python benchmarks/profile_core.py CORPUS TOKENIZER_DIR [--mb 20] [--repeat 5]
    python benchmarks/profile_core.py CORPUS TOKENIZER_DIR --mb 3 --once encode   # under callgrind
    python benchmarks/profile_core.py CORPUS cl100k_base --warm-mb 1 --mb 2 --once encode  # warm, unseen
    python benchmarks/profile_core.py CORPUS o200k_base --mb 4 --new-pieces   # the cost of a new piece

* count    `PieceCounter(pattern).add_batch(docs)`: pre-tokenize + count the distinct pieces;
* encode   `Encoder.encode_ordinary_batch(docs, 1)`: pre-tokenize + BPE, one thread, with the
           vocabulary saved in TOKENIZER_DIR (`Tokenizer.save`), or `cl100k_base` / `o200k_base`
           for the registry's files. A fresh Encoder per run, so its piece cache starts cold.

`--new-pieces` times, instead, what a piece the encoder has not met costs: the distinct pieces of
the --mb that are not single tokens, each encoded as a document of its own (`encode_ordinary_batch`,
one thread), by a fresh Encoder (cache misses, the vocabulary probe, BPE, the cache insert) and
again by the same one (its caches answer); printed per piece, median of --repeat. The pieces
come one per document, so what the two times differ by is mostly BPE.

Times are CPU seconds of this process (`time.process_time`), best of --repeat; throughput is
MB (1e6 bytes) of corpus per CPU-second. The corpus is cut into documents at blank lines, as
`bench_core.py` does. `--once count|encode` runs that loop once and prints nothing else, so
that a profiler sees little besides it:

    cmake -S . -B build-prof -G Ninja -DCMAKE_BUILD_TYPE=Prof -DCMAKE_CXX_FLAGS="-O3 -DNDEBUG -g -fno-stack-protector"
    ninja -C build-prof       # the same code as the release build, with symbols
    valgrind --tool=callgrind --callgrind-out-file=cg.out python benchmarks/profile_core.py \\
        CORPUS TOK --mb 3 --once encode --core build-prof/_tokcore.cpython-311-x86_64-linux-gnu.so
    callgrind_annotate --inclusive=no cg.out | head -30
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def _use_core_file() -> None:
    """`--core FILE`: import the native module from FILE (a build with symbols, for a profiler)
    in place of the installed one. Runs before anything imports `pipeline_lib._tokcore`."""
    if "--core" not in sys.argv:
        return
    import importlib.util

    path = sys.argv[sys.argv.index("--core") + 1]
    spec = importlib.util.spec_from_file_location("pipeline_lib._tokcore", path)
    if spec is None or spec.loader is None:
        sys.exit(f"profile_core: error: --core {path}: not a loadable extension module")
    module = importlib.util.module_from_spec(spec)
    sys.modules["pipeline_lib._tokcore"] = module
    spec.loader.exec_module(module)


_use_core_file()

from bench_core import documents  # noqa: E402  (this folder: the same documents as bench_core)

from pipeline_lib import _tokcore as core  # type: ignore[attr-defined]  # noqa: E402
from pipeline_lib.tokenizer import Tokenizer  # noqa: E402


def load_tokenizer(where: str) -> Tokenizer:
    if where in ("cl100k_base", "o200k_base"):
        from pipeline_lib.tokenizer.registry import get_encoding

        return get_encoding(where)
    return Tokenizer.load(where)


def cpu_best(repeat: int, fn) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def new_pieces(data: bytes, tokens: list[bytes], ranks: np.ndarray, pid: int, repeat: int, once: bool) -> int:
    vocab = set(tokens)
    pieces = list(dict.fromkeys(p for p in core.split(data, pid) if p not in vocab))
    if once:
        core.Encoder(tokens, ranks, pid).encode_ordinary_batch(pieces, 1)
        return 0
    first, second = [], []
    for _ in range(repeat):
        enc = core.Encoder(tokens, ranks, pid)
        for times in (first, second):
            t0 = time.process_time()
            enc.encode_ordinary_batch(pieces, 1)
            times.append(time.process_time() - t0)
    n = len(pieces)
    print(f"{n:,} distinct pieces that are not one token ({sum(map(len, pieces)) / 1e3:.0f} KB), pattern {pid}")
    print(f"new     {statistics.median(first) / n * 1e9:7.0f} ns per piece (a fresh encoder)")
    print(f"cached  {statistics.median(second) / n * 1e9:7.0f} ns per piece (the same encoder again)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus")
    ap.add_argument("tokenizer", help="a directory written by Tokenizer.save, or cl100k_base / o200k_base")
    ap.add_argument("--mb", type=float, default=20.0, help="MB of the corpus to use (from its start)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--core", metavar="FILE", help="import the native module from FILE (e.g. a build with -g, not stripped)"
    )
    ap.add_argument(
        "--once", choices=("count", "encode", "new-pieces"), help="run one loop once, print nothing (for a profiler)"
    )
    ap.add_argument("--new-pieces", action="store_true", help="time the encoder on the corpus's distinct new pieces")
    ap.add_argument(
        "--warm-mb",
        type=float,
        default=0.0,
        help="--once encode: first encode this many MB from the corpus's start in one call (EncoderCore::encode, "
        "not encode_batch: a profiler toggled on encode_batch leaves it out), then the --mb after them: "
        "warm caches, unseen text",
    )
    args = ap.parse_args()

    with open(args.corpus, "rb") as f:
        warm = f.read(int(args.warm_mb * 1e6))
        data = f.read(int(args.mb * 1e6))
    docs = documents(data, 1 << 16)
    tok = load_tokenizer(args.tokenizer)
    pid = core.PATTERN_IDS[tok.pattern]
    tokens = list(tok.mergeable_ranks)
    ranks = np.fromiter(tok.mergeable_ranks.values(), np.uint32, len(tokens))

    def count() -> None:
        core.PieceCounter(pid).add_batch(docs)

    encoders: list = []  # one fresh Encoder per timed run

    def encode() -> None:
        encoders.pop().encode_ordinary_batch(docs, 1)

    if args.new_pieces or args.once == "new-pieces":
        return new_pieces(data, tokens, ranks, pid, args.repeat, once=args.once == "new-pieces")
    if args.once == "count":
        count()
        return 0
    if args.once == "encode":
        encoders.append(core.Encoder(tokens, ranks, pid))
        if warm:
            encoders[-1].encode_ordinary(warm)
        encode()
        return 0

    mb = len(data) / 1e6
    print(
        f"{mb:.1f} MB in {len(docs)} documents, pattern {tok.pattern}, vocabulary "
        f"{len(tokens) + len(tok.special_tokens)}"
    )
    t_count = cpu_best(args.repeat, count)
    encoders.extend(core.Encoder(tokens, ranks, pid) for _ in range(args.repeat))
    t_encode = cpu_best(args.repeat, encode)
    print(f"count   {mb / t_count:7.1f} MB per CPU-second")
    print(f"encode  {mb / t_encode:7.1f} MB per CPU-second")
    return 0


if __name__ == "__main__":
    sys.exit(main())
