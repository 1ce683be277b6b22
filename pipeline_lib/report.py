"""Tokenizer reports: compression against vocabulary size, fertility per language, notable tokens.

Greedy BPE is prefix-consistent: the tokenizer with V ids is the first V-256 merges of a
larger one. So one training run at the largest size gives the whole compression curve.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from pipeline_lib.tokenizer import Tokenizer

# A character-level BPE of tiny Shakespeare (65 distinct characters) at 300 ids, as the
# classic course notebooks train it, reaches 1.93 characters per token.
CHAR_LEVEL_REFERENCE: dict[str, Any] = {"corpus": "tiny Shakespeare", "vocab_size": 300, "base_vocab": 65, "chars_per_token": 1.93}


def truncate(tok: Tokenizer, vocab_size: int) -> Tokenizer:
    """The tokenizer made of the first merges of `tok`, with `vocab_size` ordinary ids."""
    if tok.merges is None:
        raise ValueError("truncate needs a trained tokenizer (with its merge list)")
    n = max(0, vocab_size - 256)
    merges = tok.merges[:n]
    keep = {i for i in range(256)} | {m[2] for m in merges}
    ranks = {b: i for b, i in tok.mergeable_ranks.items() if i in keep}
    return Tokenizer(ranks, tok.pattern, {}, merges=merges)


def compression_curve(tok: Tokenizer, heldout: str, vocab_sizes: Sequence[int]) -> list[dict[str, Any]]:
    """Bytes/token and chars/token on held-out text for each vocabulary size (256 = bytes)."""
    n_bytes, n_chars = len(heldout.encode("utf-8")), len(heldout)
    rows = [{"vocab_size": "chars", "tokens": n_chars, "bytes_per_token": n_bytes / max(1, n_chars), "chars_per_token": 1.0}]
    for v in vocab_sizes:
        sub = truncate(tok, v)
        n = len(sub.encode_ordinary(heldout))
        rows.append({"vocab_size": v, "tokens": n, "bytes_per_token": n_bytes / max(1, n), "chars_per_token": n_chars / max(1, n)})
    return rows


_SECTION = re.compile(r"^### UDHR \[([^\]]+)\] (.*?) \(", re.M)


def udhr_sections(text: str) -> dict[str, str]:
    """Split the multilingual sample into {"eng English": text, ...} by its ``### UDHR`` headers."""
    heads = list(_SECTION.finditer(text))
    out = {}
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        body = text[m.end() : end].split("\n", 1)[-1]
        body = body.split("\n#", 1)[0]  # stop at the emoji list or any other header
        out[f"{m.group(1)} {m.group(2)}"] = body.strip()
    return out


def fertility(tok: Tokenizer, texts: Mapping[str, str]) -> list[dict[str, Any]]:
    """Tokens per word and per character for each text (whitespace words)."""
    rows = []
    for name, text in texts.items():
        n = len(tok.encode_ordinary(text))
        words = max(1, len(text.split()))
        rows.append({"text": name, "tokens": n, "tokens_per_word": n / words, "tokens_per_char": n / max(1, len(text))})
    return sorted(rows, key=lambda r: r["tokens_per_char"])


def notable_tokens(tok: Tokenizer, k: int = 10) -> dict[str, list[str]]:
    by_id = {i: b for b, i in tok.mergeable_ranks.items()}
    merges = tok.merges or []
    show = lambda b: b.decode("utf-8", "replace")  # noqa: E731
    return {
        "first": [show(by_id[m[2]]) for m in merges[:k]],
        "last": [show(by_id[m[2]]) for m in merges[-k:]],
        "longest": [show(b) for b in sorted(tok.mergeable_ranks, key=lambda b: (-len(b), b))[:k]],
    }


def plot_compression(rows: list[dict[str, Any]], path: str, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [r for r in rows if isinstance(r["vocab_size"], int)]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    ax.plot([r["vocab_size"] for r in pts], [r["chars_per_token"] for r in pts], "o-", label="byte-level BPE (ours)")
    ax.axhline(1.0, color="gray", ls="--", lw=1, label="character level")
    ref = CHAR_LEVEL_REFERENCE
    ax.plot([ref["vocab_size"]], [ref["chars_per_token"]], "s", color="tab:red", label=f"char-level BPE @ {ref['vocab_size']} ({ref['corpus']})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("vocabulary size")
    ax.set_ylabel("characters per token (held-out)")
    ax.set_title(title or "Compression vs vocabulary size")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# --------------------------------------------------------------------------- the report stage
REPORT_KIND = "report"
MULTILINGUAL = os.path.join(os.path.dirname(__file__), "data", "multilingual.txt")


def tokenizer_report(store, corpus, pattern: str = "cl100k", vocab_sizes: Sequence[int] = (256, 300, 512, 1024, 2048, 4096, 8192, 16384, 32768)):
    """Train on all corpus shards but the last, measure on the last; publish a `report` version.

    Holds: the compression curve (JSON + PNG), fertility per language on the multilingual
    sample, the first / last / longest tokens, and the seeds' char-level figure beside ours.
    """
    from pipeline_lib.store import version_id
    from pipeline_lib.version import code_version

    vocab_sizes = sorted(set(int(v) for v in vocab_sizes))
    params = {"pattern": pattern, "vocab_sizes": vocab_sizes}
    code = code_version("pipeline_lib.report", "pipeline_lib.tokenizer", "pipeline_lib.bpe_reference")
    version = version_id(REPORT_KIND, {"corpus": corpus.key}, params, code)
    return store.produce(REPORT_KIND, version, lambda: _tokenizer_report(store, corpus, pattern, vocab_sizes, version, params, code))


def _tokenizer_report(store, corpus, pattern: str, vocab_sizes: list[int], version: str, params: dict, code: str):
    from pipeline_lib.corpus import iter_shard_batches
    from pipeline_lib.tokenizer import count_documents

    shards = store.manifest(corpus.kind, corpus.version)["meta"]["shards"]
    if len(shards) < 2:
        raise ValueError("the report needs at least 2 corpus shards: one is held out for measuring")
    root = store.local_dir(corpus.kind, corpus.version)
    docs = (doc for s in shards[:-1] for batch in iter_shard_batches(os.path.join(root, s["file"])) for doc in batch)
    pieces, counts = count_documents(docs, pattern).to_arrays()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = Tokenizer.train(dict(zip(pieces, counts.tolist())), max(vocab_sizes), pattern=pattern, special_tokens=())
    heldout = "\n\n".join(d.decode("utf-8") for docs in iter_shard_batches(os.path.join(root, shards[-1]["file"])) for d in docs)
    curve = compression_curve(tok, heldout, [v for v in vocab_sizes if v <= tok.vocab_size])
    with open(MULTILINGUAL, encoding="utf-8") as f:
        sections = udhr_sections(f.read())
    report = {
        "pattern": pattern,
        "trained_on_shards": len(shards) - 1,
        "heldout_chars": len(heldout),
        "compression": curve,
        "fertility_at": tok.vocab_size,
        "fertility": fertility(tok, sections),
        "tokens": notable_tokens(tok),
        "char_level_reference": CHAR_LEVEL_REFERENCE,
    }
    staging = store.stage(REPORT_KIND, version)
    with tempfile.TemporaryDirectory(prefix="report-", dir=store.scratch_dir(REPORT_KIND)) as tmp:
        png = os.path.join(tmp, "compression.png")
        plot_compression(curve, png, f"Compression on held-out text ({pattern} split)")
        files = {
            "compression.png": staging.put_file("compression.png", png, move=True),
            "report.json": staging.put_bytes("report.json", json.dumps(report, indent=2, ensure_ascii=False).encode()),
            "report.md": staging.put_bytes("report.md", report_markdown(report).encode()),
        }
    return store.publish(staging, files=files, parents={"corpus": corpus}, params=params, code_version=code, meta={"compression": curve})


def report_markdown(report: dict[str, Any]) -> str:
    ref = report["char_level_reference"]
    ours300 = next((r for r in report["compression"] if r["vocab_size"] == 300), None)
    lines = [
        f"## Tokenizer report ({report['pattern']} split, held-out {report['heldout_chars']:,} characters)",
        "",
        "| vocabulary | tokens | bytes/token | chars/token |",
        "|---|---|---|---|",
        *[f"| {r['vocab_size']} | {r['tokens']:,} | {r['bytes_per_token']:.3f} | {r['chars_per_token']:.3f} |" for r in report["compression"]],
        "",
        f"The classic char-level BPE of {ref['corpus']} ({ref['base_vocab']} characters + merges, {ref['vocab_size']} ids) reaches "
        f"{ref['chars_per_token']}× chars/token."
        + (
            f" Byte-level at {ref['vocab_size']} ids spends 256 on bytes and has {ref['vocab_size'] - 256} merges: {ours300['chars_per_token']:.2f}×."
            if ours300
            else ""
        ),
        "",
        f"### Fertility per language (vocabulary {report['fertility_at']:,})",
        "",
        "| text | tokens/word | tokens/char |",
        "|---|---|---|",
        *[f"| {r['text']} | {r['tokens_per_word']:.2f} | {r['tokens_per_char']:.3f} |" for r in report["fertility"]],
        "",
        "### Tokens",
        "",
        *[f"- **{k}**: " + ", ".join(f"`{t!r}`" for t in v) for k, v in report["tokens"].items()],
    ]
    return "\n".join(lines) + "\n"
