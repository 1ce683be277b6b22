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


def truncate(tok: Tokenizer, vocab_size: int) -> Tokenizer:
    """The tokenizer made of the first merges of `tok`: `vocab_size` ids in all (its unit's
    alphabet, the merges, its special tokens), or fewer when `tok` has fewer merges."""
    if tok.merges is None:
        raise ValueError("truncate needs a trained tokenizer (with its merge list)")
    made = {m[2] for m in tok.merges}
    alphabet = {i for i in tok.mergeable_ranks.values() if i not in made}
    n = max(0, vocab_size - len(alphabet) - len(tok.special_tokens))
    merges = tok.merges[:n]
    keep = alphabet | {m[2] for m in merges}
    ranks = {b: i for b, i in tok.mergeable_ranks.items() if i in keep}
    specials = {
        name: len(ranks) + k for k, name in enumerate(sorted(tok.special_tokens, key=tok.special_tokens.__getitem__))
    }
    counts = tok.merge_counts[:n] if tok.merge_counts is not None else None
    return Tokenizer(
        ranks,
        tok.pattern,
        specials,
        merges=merges,
        merge_counts=counts,
        unit=tok.unit,
        unknown=tok.unknown,
        lowercase=tok.lowercase,
    )


def compression_curve(
    tok: Tokenizer, heldout: str, vocab_sizes: Sequence[int], stopped_because: str = ""
) -> list[dict[str, Any]]:
    """Bytes/token and chars/token on held-out text for each vocabulary size (256 = bytes),
    after a first row for character level itself (one token per character).

    A size larger than `tok` (the corpus gave fewer merges) gets a row with its ``reached``
    size and ``note`` saying why (`stopped_because`), and no figures: it was not measured.
    A size smaller than the unit's alphabet (a character-level BPE) is not reached either.
    """
    n_bytes, n_chars = len(heldout.encode("utf-8")), len(heldout)
    reached = tok.vocab_size
    smallest = tok.vocab_size - len(tok.merges or [])
    rows = [
        {
            "vocab_size": "chars",
            "reached": None,
            "tokens": n_chars,
            "bytes_per_token": n_bytes / max(1, n_chars),
            "chars_per_token": 1.0,
        }
    ]
    for v in vocab_sizes:
        if v > reached or v < smallest:
            note = (
                stopped_because
                if v > reached
                else (f"the {tok.unit}s of the corpus and the special tokens alone are {smallest:,} ids")
            )
            rows.append(
                {
                    "vocab_size": v,
                    "reached": reached if v > reached else smallest,
                    "tokens": None,
                    "bytes_per_token": None,
                    "chars_per_token": None,
                    "note": note,
                }
            )
            continue
        n = len(truncate(tok, v).encode_ordinary(heldout))
        rows.append(
            {
                "vocab_size": v,
                "reached": v,
                "tokens": n,
                "bytes_per_token": n_bytes / max(1, n),
                "chars_per_token": n_chars / max(1, n),
            }
        )
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


def plot_compression(
    rows: list[dict[str, Any]], path: str, title: str = "", char_rows: Sequence[dict[str, Any]] = ()
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for curve, style, label in ((rows, "o-", "byte-level BPE"), (char_rows, "s-", "character-level BPE (no split)")):
        pts = [r for r in curve if isinstance(r["vocab_size"], int) and r["chars_per_token"] is not None]
        if pts:
            ax.plot([r["vocab_size"] for r in pts], [r["chars_per_token"] for r in pts], style, label=label)
    ax.axhline(1.0, color="gray", ls="--", lw=1, label="character level")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("vocabulary size")
    ax.set_ylabel("characters per token (held-out)")
    ax.set_title(title or "Compression vs vocabulary size")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def char_level_curve(train_docs: Sequence[bytes], heldout: str, vocab_sizes: Sequence[int]) -> dict[str, Any]:
    """Character-level BPE with no split (the first tutorials' tokenizer) trained on the same
    documents: its alphabet and its compression curve at `vocab_sizes` (one training at the
    largest size, cut to each: greedy BPE is prefix-consistent for every unit)."""
    texts = [d.decode("utf-8", "replace") for d in train_docs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = Tokenizer.train(texts, max(vocab_sizes), unit="char", pattern="none", special_tokens=())
    alphabet = tok.vocab_size - len(tok.merges or []) - len(tok.special_tokens)
    reason = (
        f"training stopped after {len(tok.merges or []):,} merges: no pair is left to merge"
        if tok.vocab_size < max(vocab_sizes)
        else ""
    )
    return {
        "base_vocab": alphabet,
        "unknown": tok.unknown,
        "compression": compression_curve(tok, heldout, vocab_sizes, reason)[1:],
    }


def stop_reason(tok: Tokenizer, pieces: Sequence[bytes]) -> str:
    """Why training gave `tok` fewer merges than asked: what is left of the training pieces."""
    import numpy as np

    _, ends = tok.encode_ordinary_batch_to_numpy(list(pieces))
    split = int(np.count_nonzero(np.diff(ends.astype(np.int64)) > 1))
    n_merges = len(tok.merges or [])
    if split == 0:
        return (
            f"training stopped after {n_merges:,} merges: each of the corpus's {len(pieces):,} distinct pieces is "
            "one token, no pair is left to merge"
        )
    return (
        f"training stopped after {n_merges:,} merges: no pair left occurs often enough ({split:,} pieces are still "
        "more than one token)"
    )


# --------------------------------------------------------------------------- the report stage
REPORT_KIND = "report"
MULTILINGUAL = os.path.join(os.path.dirname(__file__), "data", "multilingual.txt")


# Bump when the report files change for the same corpus and params.
REPORT_OUTPUT_VERSION = 1


def tokenizer_report(
    store,
    corpus,
    pattern: str = "cl100k",
    vocab_sizes: Sequence[int] = (256, 300, 512, 1024, 2048, 4096, 8192, 16384, 32768),
):
    """Train on all corpus shards but the last, measure on the last; publish a `report` version.

    Holds: the compression curve of byte-level BPE (JSON + PNG) beside character-level BPE
    trained on the same shards, fertility per language on the multilingual sample, and the
    first / last / longest tokens. Every figure is measured in the run.
    """
    from pipeline_lib.store import version_id
    from pipeline_lib.version import output_code

    vocab_sizes = sorted(set(int(v) for v in vocab_sizes))
    params = {"pattern": pattern, "vocab_sizes": vocab_sizes}
    code = output_code(REPORT_OUTPUT_VERSION)
    version = version_id(REPORT_KIND, {"corpus": corpus.key}, params, code)
    return store.produce(
        REPORT_KIND, version, lambda: _tokenizer_report(store, corpus, pattern, vocab_sizes, version, params, code)
    )


def _tokenizer_report(store, corpus, pattern: str, vocab_sizes: list[int], version: str, params: dict, code: str):
    from pipeline_lib.corpus import iter_shard_batches
    from pipeline_lib.tokenizer import count_documents

    shards = store.manifest(corpus.kind, corpus.version)["meta"]["shards"]
    if len(shards) < 2:
        raise ValueError("the report needs at least 2 corpus shards: one is held out for measuring")
    root = store.local_dir(corpus.kind, corpus.version)
    train_docs = [
        doc for s in shards[:-1] for batch in iter_shard_batches(os.path.join(root, s["file"])) for doc in batch
    ]
    pieces, counts = count_documents(train_docs, pattern).to_arrays()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = Tokenizer.train(dict(zip(pieces, counts.tolist())), max(vocab_sizes), pattern=pattern, special_tokens=())
    heldout = "\n\n".join(
        d.decode("utf-8") for docs in iter_shard_batches(os.path.join(root, shards[-1]["file"])) for d in docs
    )
    reason = stop_reason(tok, pieces) if len(tok.mergeable_ranks) < max(vocab_sizes) else ""
    curve = compression_curve(tok, heldout, vocab_sizes, reason)
    with open(MULTILINGUAL, encoding="utf-8") as f:
        sections = udhr_sections(f.read())
    report: dict[str, Any] = {
        "pattern": pattern,
        "trained_on_shards": len(shards) - 1,
        "heldout_chars": len(heldout),
        "compression": curve,
        "char_level": char_level_curve(train_docs, heldout, vocab_sizes),
        "fertility_at": tok.vocab_size,
        "fertility": fertility(tok, sections),
        "tokens": notable_tokens(tok),
    }
    staging = store.stage(REPORT_KIND, version)
    with tempfile.TemporaryDirectory(prefix="report-", dir=store.scratch_dir(REPORT_KIND)) as tmp:
        png = os.path.join(tmp, "compression.png")
        plot_compression(
            curve, png, f"Compression on held-out text ({pattern} split)", report["char_level"]["compression"]
        )
        files = {
            "compression.png": staging.put_file("compression.png", png, move=True),
            "report.json": staging.put_bytes("report.json", json.dumps(report, indent=2, ensure_ascii=False).encode()),
            "report.md": staging.put_bytes("report.md", report_markdown(report).encode()),
        }
    return store.publish(
        staging, files=files, parents={"corpus": corpus}, params=params, code_version=code, meta={"compression": curve}
    )


def _figure(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _size_cell(row: dict[str, Any]) -> str:
    if row.get("reached") is not None and row["reached"] != row["vocab_size"]:
        return f"{row['vocab_size']:,} (reached {row['reached']:,})"
    return f"{row['vocab_size']:,}" if isinstance(row["vocab_size"], int) else str(row["vocab_size"])


def report_markdown(report: dict[str, Any]) -> str:
    char = report["char_level"]
    char_at = {r["vocab_size"]: r for r in char["compression"]}
    lines = [
        f"## Tokenizer report ({report['pattern']} split, held-out {report['heldout_chars']:,} characters)",
        "",
        f"Byte-level BPE ({report['pattern']} split) beside character-level BPE (the training text's "
        f"{char['base_vocab']:,} characters, merges "
        "and `<unk>`, no split), both trained on the same shards in this run.",
        "",
        "| vocabulary | tokens | bytes/token | chars/token | char-level BPE chars/token |",
        "|---|---|---|---|---|",
    ]
    notes = []
    for r in report["compression"]:
        c = char_at.get(r["vocab_size"])
        tokens = "—" if r["tokens"] is None else f"{r['tokens']:,}"
        lines.append(
            f"| {_size_cell(r)} | {tokens} | {_figure(r['bytes_per_token'])} | {_figure(r['chars_per_token'])} | "
            f"{_figure(c and c['chars_per_token'])} |"
        )
        if r.get("note") and r["note"] not in notes:
            notes.append(r["note"])
    lines += ["", *[f"Not reached: {n}." for n in notes]]
    lines += [
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
