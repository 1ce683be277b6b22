"""Tokenizer benchmark: training and encoding, ours against the libraries people use today.

Run by hand (not part of the tests):

    bash ../shared/corpus/make_prose_big.sh /tmp/prose        # ~139 MB of real English, ~2 min
    pip install -e ".[bench]"
    python benchmarks/bench_tokenizer.py /tmp/prose/prose.txt --vocab 8192,32768 --threads 2

Training: every trainer runs in its own subprocess on the same documents (paragraphs) with
the same thread count, so wall time, CPU time and peak RSS are its own; each learns the
same vocabulary size, and bytes/token is measured on the same held-out text so the
vocabularies compare. Encoding: ours, tiktoken and HF `tokenizers` with the *same*
vocabulary (ours, exported to each), on one thread and on `--threads`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from pipeline_lib.patterns import CL100K  # noqa: E402

TRAINERS: dict[str, str] = {
    "tokenmill": """
        from pipeline_lib.tokenizer import Tokenizer
        docs = open(TRAIN, "rb").read().split(b"\\n\\n")
        tok = Tokenizer.train(docs, VOCAB, pattern="cl100k", special_tokens=(), workers=THREADS)
        tok.save(OUT)
    """,
    "rustbpe": """
        import base64, rustbpe
        docs = open(TRAIN, encoding="utf-8").read().split("\\n\\n")
        t = rustbpe.Tokenizer()
        t.train_from_iterator(iter(docs), VOCAB)
        ranks = t.get_mergeable_ranks()
        items = ranks.items() if hasattr(ranks, "items") else ranks
        with open(OUT + ".tiktoken", "wb") as f:
            for tok, rank in sorted(items, key=lambda kv: kv[1]):
                f.write(base64.b64encode(bytes(tok)) + b" " + str(rank).encode() + b"\\n")
    """,
    "hf-bytelevel": """
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        docs = open(TRAIN, encoding="utf-8").read().split("\\n\\n")
        tk = Tokenizer(models.BPE())
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        trainer = trainers.BpeTrainer(vocab_size=VOCAB, initial_alphabet=alphabet, show_progress=False)
        tk.train_from_iterator(docs, trainer)
        tk.save(OUT + ".json")
    """,
    "hf-gpt4split": """
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
        docs = open(TRAIN, encoding="utf-8").read().split("\\n\\n")
        tk = Tokenizer(models.BPE())
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        tk.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        trainer = trainers.BpeTrainer(vocab_size=VOCAB, initial_alphabet=alphabet, show_progress=False)
        tk.train_from_iterator(docs, trainer)
        tk.save(OUT + ".json")
    """,
    "sentencepiece": """
        import sentencepiece as spm
        docs = open(TRAIN, encoding="utf-8").read().split("\\n\\n")
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(docs), model_prefix=OUT, vocab_size=VOCAB, model_type="bpe",
            byte_fallback=True, num_threads=THREADS, max_sentence_length=1 << 16,
            input_sentence_size=0, train_extremely_large_corpus=False, minloglevel=2,
        )
    """,
    "bpeasy": """
        import base64, bpeasy
        docs = open(TRAIN, encoding="utf-8").read().split("\\n\\n")
        vocab = bpeasy.train_bpe(iter(docs), PATTERN, 128, VOCAB)
        with open(OUT + ".tiktoken", "wb") as f:
            for tok, rank in sorted(vocab.items(), key=lambda kv: kv[1]):
                f.write(base64.b64encode(bytes(tok)) + b" " + str(rank).encode() + b"\\n")
    """,
}


# The child reports its own peak RSS (VmHWM of its post-exec address space): ru_maxrss
# from wait4 would include the parent's peak, which Linux carries across fork and exec.
_PEAK = "\nprint('VMHWM_KB', open('/proc/self/status').read().split('VmHWM:')[1].split()[0])\n"


def run_measured(code: str, env: dict[str, str]) -> dict[str, float]:
    """Run Python `code` in a child; return its wall time, CPU time and peak RSS."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", code + _PEAK], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime - _CHILD_CPU[0]
    _CHILD_CPU[0] = usage.ru_utime + usage.ru_stime
    if proc.returncode != 0:
        text = err.decode(errors="replace").strip()
        return {"error": text.splitlines()[-1] if text else f"exit {proc.returncode}"}
    peak_kb = int(out.decode().rsplit("VMHWM_KB", 1)[1].split()[0])
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": peak_kb / 1024}


_CHILD_CPU = [0.0]


def heldout_bytes_per_token(name: str, out: str, heldout: str) -> float | None:
    n_bytes = len(heldout.encode("utf-8"))
    try:
        if name == "tokenmill":
            from pipeline_lib import Tokenizer

            n = len(Tokenizer.load(out).encode_ordinary(heldout))
        elif name in ("rustbpe", "bpeasy"):
            from pipeline_lib import Tokenizer

            n = len(Tokenizer.from_tiktoken(out + ".tiktoken", pattern="cl100k").encode_ordinary(heldout))
        elif name.startswith("hf"):
            from tokenizers import Tokenizer as HF

            n = len(HF.from_file(out + ".json").encode(heldout).ids)
        elif name == "sentencepiece":
            import sentencepiece as spm

            n = len(spm.SentencePieceProcessor(model_file=out + ".model").encode(heldout))
        else:
            return None
    except Exception as e:  # a peer's odd vocabulary must not stop the benchmark
        print(f"  ({name}: held-out measurement failed: {e})")
        return None
    return n_bytes / max(1, n)


def bench_training(
    train_path: str, heldout: str, vocabs: list[int], threads: int, workdir: str, only: list[str]
) -> list[dict]:
    rows = []
    env = {
        **os.environ,
        "RAYON_NUM_THREADS": str(threads),
        "OMP_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "true",
    }
    for vocab in vocabs:
        for name, body in TRAINERS.items():
            if only and name not in only:
                continue
            out = os.path.join(workdir, f"{name}-{vocab}")
            prelude = f"TRAIN={train_path!r}; VOCAB={vocab}; THREADS={threads}; OUT={out!r}; PATTERN={CL100K!r}\n"
            code = prelude + f"import sys; sys.path.insert(0, {os.path.dirname(HERE)!r})\n" + textwrap.dedent(body)
            m = run_measured(code, env)
            row = {"trainer": name, "vocab": vocab, **m}
            if "error" not in m:
                row["heldout_bytes_per_token"] = heldout_bytes_per_token(name, out, heldout)
            rows.append(row)
            print("  " + json.dumps(row))
    return rows


def bench_encoding(train_path: str, heldout_text: str, vocab: int, threads: int, workdir: str, mb: float) -> list[dict]:
    from pipeline_lib import Tokenizer

    out = os.path.join(workdir, f"tokenmill-{vocab}")
    tok = Tokenizer.load(out)
    with open(train_path, encoding="utf-8") as f:
        text = f.read(int(mb * 1e6))
    docs = text.split("\n\n")
    n_bytes = len(text.encode("utf-8"))
    rows = []

    def timed(name: str, fn) -> None:
        fn()  # warm-up (caches, thread pools)
        t0, c0 = time.perf_counter(), time.process_time()
        n = fn()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        rows.append({"encoder": name, "MB_per_s": n_bytes / 1e6 / wall, "wall_s": wall, "cpu_s": cpu, "tokens": n})
        print("  " + json.dumps(rows[-1]))

    docs_b = [d.encode("utf-8") for d in docs]
    timed("tokenmill encode_ordinary (1 thread)", lambda: sum(len(tok.encode_ordinary(d)) for d in docs))
    timed("tokenmill encode_ordinary_batch (1 thread)", lambda: len(tok.encode_ordinary_batch_to_numpy(docs_b, 1)[0]))
    timed(
        f"tokenmill encode_ordinary_batch ({threads} threads)",
        lambda: len(tok.encode_ordinary_batch_to_numpy(docs_b, threads)[0]),
    )
    try:
        enc = tok.to_tiktoken()
        timed("tiktoken encode_ordinary (1 thread)", lambda: sum(len(enc.encode_ordinary(d)) for d in docs))
        timed(
            f"tiktoken encode_ordinary_batch ({threads} threads)",
            lambda: sum(len(x) for x in enc.encode_ordinary_batch(docs, num_threads=threads)),
        )
    except ImportError:
        print("  (tiktoken not installed)")
    try:
        from tokenizers import Tokenizer as HF

        path = os.path.join(workdir, "ours-hf.json")
        tok.to_hf_json(path)
        hf = HF.from_file(path)
        os.environ["RAYON_NUM_THREADS"] = str(threads)
        timed("HF tokenizers encode (1 thread)", lambda: sum(len(hf.encode(d).ids) for d in docs))
        timed(f"HF tokenizers encode_batch ({threads} threads)", lambda: sum(len(e.ids) for e in hf.encode_batch(docs)))
    except ImportError:
        print("  (tokenizers not installed)")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus", help="a UTF-8 text file (documents separated by blank lines)")
    ap.add_argument("--vocab", default="8192,32768")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--heldout-mb", type=float, default=2.0, help="held-out text taken from the end of the corpus")
    ap.add_argument("--encode-mb", type=float, default=20.0, help="text encoded in the encoding benchmark")
    ap.add_argument("--only", default="", help="comma-separated trainers to run (default: all)")
    args = ap.parse_args()

    with open(args.corpus, encoding="utf-8", errors="replace") as f:
        text = f.read()
    cut = max(0, len(text) - int(args.heldout_mb * 1e6))
    cut = text.find("\n\n", cut) if text.find("\n\n", cut) >= 0 else cut
    train, heldout = text[:cut], text[cut:]
    workdir = tempfile.mkdtemp(prefix="tokenmill-bench-")
    train_path = os.path.join(workdir, "train.txt")
    with open(train_path, "w", encoding="utf-8") as f:
        f.write(train)
    print(
        f"corpus {args.corpus}: train {len(train.encode()) / 1e6:.1f} MB, held-out "
        f"{len(heldout.encode()) / 1e6:.1f} MB, threads {args.threads}"
    )

    vocabs = [int(v) for v in args.vocab.split(",")]
    print("== training (counting + merges), each in its own process ==")
    rows = bench_training(train_path, heldout, vocabs, args.threads, workdir, [o for o in args.only.split(",") if o])
    print("\n== training: ratios (tokenmill / peer; < 1 means tokenmill is faster or smaller) ==")
    print(f"{'vocab':>6} {'peer':<15} {'wall':>8} {'cpu':>8} {'rss':>8} {'bytes/token ours vs peer':>26}")
    for vocab in vocabs:
        ours = next((r for r in rows if r["trainer"] == "tokenmill" and r["vocab"] == vocab and "error" not in r), None)
        if ours is None:
            continue
        for r in rows:
            if r["vocab"] != vocab or r["trainer"] == "tokenmill":
                continue
            if "error" in r:
                print(f"{vocab:>6} {r['trainer']:<15} failed: {r['error'][:60]}")
                continue
            bpt = f"{ours.get('heldout_bytes_per_token') or 0:.3f} vs {r.get('heldout_bytes_per_token') or 0:.3f}"
            print(
                f"{vocab:>6} {r['trainer']:<15} {ours['wall_s'] / r['wall_s']:>7.2f}x "
                f"{ours['cpu_s'] / r['cpu_s']:>7.2f}x {ours['peak_rss_mb'] / r['peak_rss_mb']:>7.2f}x {bpt:>26}"
            )

    print(f"\n== encoding ({args.encode_mb:.0f} MB, vocabulary {vocabs[-1]} learned above, same ids in all three) ==")
    enc = bench_encoding(train_path, heldout, vocabs[-1], args.threads, workdir, args.encode_mb)
    by = {r["encoder"]: r["MB_per_s"] for r in enc}
    ours1 = by.get("tokenmill encode_ordinary (1 thread)")
    for name, mbps in by.items():
        if not name.startswith("tokenmill") and ours1:
            print(f"  tokenmill encode_ordinary (1 thread) / {name}: {ours1 / mbps:.2f}x throughput")
    oursN = by.get(f"tokenmill encode_ordinary_batch ({args.threads} threads)")
    for name, mbps in by.items():
        if "threads)" in name and not name.startswith("tokenmill") and oursN:
            print(f"  tokenmill batch ({args.threads} threads) / {name}: {oursN / mbps:.2f}x throughput")


if __name__ == "__main__":
    main()
