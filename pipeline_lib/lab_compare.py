"""Tokenizers side by side on the same held-out text (`tokenmill compare`): character level,
word level, our BPE at several sizes, HF `tokenizers` BPE at the same sizes and the
production encodings (GPT-2, cl100k, o200k), each measured for compression (`compression`),
fertility per language, speed and embedding parameters, as a table, a plot and files."""

from __future__ import annotations

import json
import os
import re
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pipeline_lib.config import STRICT, check_vocab_sizes_limit, doc
from pipeline_lib.errors import InputError
from pipeline_lib.token_stats import compression

if TYPE_CHECKING:
    from pipeline_lib.tokenizer import Tokenizer


PRODUCTION_ENCODINGS = ("gpt2", "cl100k_base", "o200k_base")
# Words and punctuation runs: the pieces a word-level tokenizer gives an id each.
WORD_PIECES = re.compile(r"\w+|[^\w\s]+")


@dataclass(frozen=True)
class CompareConfig:
    """`tokenmill compare`: tokenizers side by side on the same held-out text."""

    __pydantic_config__ = STRICT

    vocab_sizes: Annotated[
        tuple[int, ...], doc("vocabulary sizes of the BPE tokenizers trained for the comparison (ours and HF's)")
    ] = (300, 1024, 4096)
    units: Annotated[
        tuple[Literal["byte", "char", "word"], ...],
        doc("the units our BPE is trained over (char: no split; word: whitespace words), a row per unit and size"),
    ] = ("byte", "char")
    pattern: Annotated[Literal["gpt2", "cl100k", "o200k"], doc("split pattern of our byte-level BPE")] = "cl100k"
    heldout_fraction: Annotated[float, doc("the end of the corpus held out for measuring (the rest trains)")] = 0.1
    d_model: Annotated[int, doc("model width for the embedding parameters column (vocabulary x width)")] = 768
    production: Annotated[
        tuple[str, ...], doc("production encodings to measure (get_encoding names; none: leave them out)")
    ] = PRODUCTION_ENCODINGS
    hf: Annotated[
        bool, doc("also train HF tokenizers' byte-level BPE at the same sizes (needs the tokenizers package)")
    ] = True

    def __post_init__(self):
        object.__setattr__(self, "vocab_sizes", tuple(sorted(set(int(v) for v in self.vocab_sizes))))
        object.__setattr__(self, "production", tuple(p for p in self.production if p.lower() != "none"))
        if not self.vocab_sizes or min(self.vocab_sizes) < 1:
            raise InputError(f"vocab_sizes={list(self.vocab_sizes)}: give positive sizes")
        check_vocab_sizes_limit(self.vocab_sizes)
        if not 0 < self.heldout_fraction < 1:
            raise InputError(f"heldout_fraction={self.heldout_fraction}: must be between 0 and 1")
        if self.d_model < 1:
            raise InputError(f"d_model={self.d_model}: must be at least 1")
        from pipeline_lib.tokenizer import list_encoding_names

        unknown = [p for p in self.production if p not in list_encoding_names()]
        if unknown:
            raise InputError(
                f"production={list(self.production)}: unknown encoding {unknown[0]!r} (known: "
                f"{', '.join(list_encoding_names())}, or none)"
            )


def split_heldout(text: str, fraction: float) -> tuple[str, str]:
    """(training text, held-out text): the last `fraction` of `text`, cut at a line start."""
    cut = int(len(text) * (1 - fraction))
    line = text.find("\n", cut)
    cut = line + 1 if 0 <= line < len(text) - 1 else cut
    if cut <= 0 or cut >= len(text):
        raise InputError(f"the corpus ({len(text):,} characters) is too small to hold out {fraction:.0%} of it")
    return text[:cut], text[cut:]


@dataclass
class Candidate:
    """One tokenizer in the comparison: how it encodes, and what to say about it."""

    name: str
    family: str
    vocab_size: int
    count: Callable[[str], int]  # number of tokens of a text
    timed: bool = True  # an encoder worth timing (not a baseline's str.split)
    note: str = ""
    size_axis: int | None = None  # the x of the plot (the requested size for trained ones)
    extra: dict[str, Any] = field(default_factory=dict)


def throughput(count: Callable[[str], int], text: str, min_seconds: float = 0.2) -> float:
    """Encode throughput in MB/s of UTF-8 input: the best of repeated runs over `min_seconds`."""
    n_bytes = len(text.encode("utf-8"))
    best, spent = float("inf"), 0.0
    while spent < min_seconds:
        start = time.perf_counter()
        count(text)
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
        if took == 0:
            break
    return n_bytes / 1e6 / max(best, 1e-9)


def character_level(train: str, heldout: str) -> Candidate:
    alphabet = set(train)
    unseen = sum(1 for c in heldout if c not in alphabet)
    note = f"{unseen:,} held-out characters unseen in training ({unseen / max(1, len(heldout)):.2%})" if unseen else ""
    return Candidate(
        "character level", "character level", len(alphabet), len, timed=False, note=note, size_axis=len(alphabet)
    )


def word_level(train: str, heldout: str) -> Candidate:
    vocab = set(WORD_PIECES.findall(train))
    pieces = WORD_PIECES.findall(heldout)
    unseen = sum(1 for p in pieces if p not in vocab)
    note = f"words and punctuation runs; {unseen / max(1, len(pieces)):.1%} of held-out ones unseen (one <unk> id)"
    return Candidate(
        "word level",
        "word level",
        len(vocab) + 1,
        lambda t: len(WORD_PIECES.findall(t)),
        timed=False,
        note=note,
        size_axis=len(vocab) + 1,
    )


def ours(train: str, unit: str, pattern: str, vocab_sizes: Sequence[int]) -> list[Candidate]:
    """Our BPE over `unit` at each size: one training at the largest, cut to each (greedy
    BPE is prefix-consistent: the first merges are the smaller tokenizer). Byte-level BPE
    splits with `pattern`; character- and word-level BPE as the tutorials do (no split;
    whitespace words)."""
    from pipeline_lib.report import truncate
    from pipeline_lib.tokenizer import Tokenizer

    split = pattern if unit == "byte" else "none"
    docs = [p for p in train.split("\n\n") if p]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        big = (
            Tokenizer.train(docs, max(vocab_sizes), pattern=split, special_tokens=(), unit=unit)
            if max(vocab_sizes) >= 256 or unit != "byte"
            else None
        )
    if big is None:
        return []
    smallest = big.vocab_size - len(big.merges or [])
    label = f"ours {unit}" + (f" {pattern}" if unit == "byte" else "")
    family = f"ours ({unit}-level BPE" + (
        f", {pattern} split)" if unit == "byte" else ", no split)" if unit == "char" else ", whitespace words, </w>)"
    )
    out = []
    for v in vocab_sizes:
        if v < smallest:
            continue
        tok = truncate(big, v)
        note = f"the corpus gave {tok.vocab_size:,} ids of the {v:,} asked for" if tok.vocab_size < v else ""
        if tok.lossy:
            note = "; ".join(filter(None, [note, "lossy: whitespace is not kept"]))
        out.append(Candidate(f"{label} {v}", family, tok.vocab_size, _counter(tok), note=note, size_axis=v))
    return out


def _counter(tok: Tokenizer) -> Callable[[str], int]:
    return lambda text: len(tok.encode_ordinary_batch_to_numpy([text], 1)[0])


def hf_bpe(train: str, vocab_sizes: Sequence[int]) -> tuple[list[Candidate], str]:
    """HF `tokenizers` byte-level BPE (GPT-2's pre-tokenizer) at each size, or a note why not."""
    try:
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import models, pre_tokenizers, trainers
    except ImportError:
        return [], "HF tokenizers is not installed (pip install tokenizers): its rows are left out"
    docs = [p for p in train.split("\n\n") if p]
    out = []
    for v in (v for v in vocab_sizes if v >= 256):
        hf = HFTokenizer(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(
            vocab_size=v, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[], show_progress=False
        )
        hf.train_from_iterator(docs, trainer)
        reached = hf.get_vocab_size()
        note = f"the corpus gave {reached:,} ids of the {v:,} asked for" if reached < v else ""
        out.append(
            Candidate(
                f"HF byte-level BPE {v}",
                "HF tokenizers (byte-level BPE)",
                reached,
                _hf_counter(hf),
                note=note,
                size_axis=v,
            )
        )
    return out, (
        "HF tokenizers rows: encode throughput of one `Tokenizer.encode` call on the whole held-out text (HF "
        "also computes offsets)"
    )


def _hf_counter(hf: Any) -> Callable[[str], int]:
    return lambda text: len(hf.encode(text).ids)


def production(names: Sequence[str], files: Mapping[str, str]) -> tuple[list[Candidate], list[str]]:
    """The published encodings, from the user's files or the packages that ship them."""
    from pipeline_lib.tokenizer import get_encoding

    out, notes = [], []
    for name in names:
        try:
            tok = get_encoding(name, path=files.get(name))
        except InputError as e:
            notes.append(f"{name} left out: {e} (point to its file with --encoding-file {name}=PATH)")
            continue
        out.append(Candidate(name, "production", tok.n_vocab, _counter(tok), size_axis=tok.n_vocab))
    return out, notes


def measure(c: Candidate, heldout: str, d_model: int) -> dict[str, Any]:
    n = c.count(heldout)
    comp = compression(heldout, n)
    return {
        "name": c.name,
        "family": c.family,
        "vocab_size": c.vocab_size,
        "size_axis": c.size_axis,
        "tokens": n,
        "bytes_per_token": comp["bytes_per_token"],
        "chars_per_token": comp["chars_per_token"],
        "tokens_per_word": n / max(1, len(heldout.split())),
        "embedding_params": c.vocab_size * d_model,
        "mb_per_s": throughput(c.count, heldout) if c.timed else None,
        "note": c.note,
    }


def compare(
    text: str,
    config: CompareConfig,
    source: str = "",
    multilingual: str | None = None,
    encoding_files: Mapping[str, str] | None = None,
    progress: Callable[[str], None] | None = None,
    tokenizers: Mapping[str, Tokenizer] | None = None,
) -> dict[str, Any]:
    """Train and measure every tokenizer of `config` on `text` (held out: its end), and the
    already trained `tokenizers` (name -> tokenizer: the learner's own) beside them.

    Returns the rows (one per tokenizer), fertility per language (tokens/word on each
    section of the `multilingual` UDHR sample, when given) and notes on what was left out.
    """
    from pipeline_lib.report import udhr_sections

    say = progress or (lambda message: None)
    train, heldout = split_heldout(text, config.heldout_fraction)
    say(f"training on {len(train):,} characters, measuring on {len(heldout):,}")
    candidates = [character_level(train, heldout), word_level(train, heldout)]
    for unit in config.units:
        say(f"training our {unit}-level BPE at {', '.join(map(str, config.vocab_sizes))}")
        candidates += ours(train, unit, config.pattern, config.vocab_sizes)
    notes = []
    if config.hf:
        say("training HF tokenizers' BPE")
        found, note = hf_bpe(train, config.vocab_sizes)
        candidates += found
        notes += [note] if note else []
    for name, tok in (tokenizers or {}).items():
        candidates.append(
            Candidate(
                name,
                f"yours ({tok.unit}-level BPE, {tok.pattern} split)",
                tok.vocab_size,
                _counter(tok),
                size_axis=tok.vocab_size,
            )
        )
    found, left_out = production(config.production, encoding_files or {})
    candidates += found
    notes += left_out
    say("measuring")
    rows = [measure(c, heldout, config.d_model) for c in candidates]
    fertility_rows = []
    if multilingual:
        sections = udhr_sections(multilingual)
        for name, section in sections.items():
            words = max(1, len(section.split()))
            fertility_rows.append(
                {"text": name, "words": len(section.split()), **{c.name: c.count(section) / words for c in candidates}}
            )
    return {
        "source": source,
        "train_chars": len(train),
        "heldout_chars": len(heldout),
        "heldout_bytes": len(heldout.encode("utf-8")),
        "heldout_words": len(heldout.split()),
        "d_model": config.d_model,
        "rows": rows,
        "fertility": fertility_rows,
        "notes": notes,
    }


def _number(value: float | int | None, digits: int = 2) -> str:
    if value is None:
        return "—"
    return f"{value:,}" if isinstance(value, int) else f"{value:,.{digits}f}"


TABLE_COLUMNS = (
    ("tokenizer", lambda r: r["name"]),
    ("vocabulary", lambda r: _number(r["vocab_size"])),
    ("tokens", lambda r: _number(r["tokens"])),
    ("bytes/token", lambda r: _number(r["bytes_per_token"])),
    ("chars/token", lambda r: _number(r["chars_per_token"])),
    ("tokens/word", lambda r: _number(r["tokens_per_word"])),
    ("embedding params", lambda r: _number(r["embedding_params"])),
    ("encode MB/s", lambda r: _number(r["mb_per_s"], 1)),
)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool) -> list[str]:
    if markdown:
        return [
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
            *["| " + " | ".join(r) + " |" for r in rows],
        ]
    widths = [max(len(h), *(len(r[k]) for r in rows)) for k, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    return [line(header), line(["-" * w for w in widths]), *map(line, rows)]


def compare_text(result: dict[str, Any], markdown: bool = False) -> str:
    """The comparison as a terminal table (or Markdown), then fertility per language and notes."""
    rows = result["rows"]
    head = (
        f"Held-out text: {result['heldout_chars']:,} characters, {result['heldout_bytes']:,} bytes, "
        f"{result['heldout_words']:,} words"
        f" (the last part of {result['source'] or 'the corpus'}; the {result['train_chars']:,} characters before it "
        "train);"
        f" embedding parameters at d_model={result['d_model']}."
    )
    lines = [f"## Tokenizers compared\n\n{head}\n" if markdown else head + "\n"]
    lines += _table([c for c, _ in TABLE_COLUMNS], [[f(r) for _, f in TABLE_COLUMNS] for r in rows], markdown)
    notes = [f"{r['name']}: {r['note']}" for r in rows if r["note"]] + result["notes"]
    if result["fertility"]:
        # The terminal shows the largest size of each trained family; the Markdown, every row.
        last = {r["family"]: r["name"] for r in rows}
        names = [r["name"] for r in rows if markdown or r["family"] == "production" or last[r["family"]] == r["name"]]
        title = "Fertility per language (tokens per whitespace word, UDHR sample" + (
            ")" if markdown else "; every size in the Markdown file)"
        )
        lines += ["", f"### {title}" if markdown else f"{title}:", ""]
        lines += _table(
            ["language", *names], [[f["text"], *(_number(f[n]) for n in names)] for f in result["fertility"]], markdown
        )
        notes.append(
            "character- and word-level tokenizers count a character or word unseen in training as one <unk> "
            "token: few tokens there is not coverage"
        )
    if notes:
        lines += ["", *[("- " if markdown else "note: ") + n for n in notes]]
    return "\n".join(lines) + "\n"


def plot_comparison(result: dict[str, Any], path: str) -> None:
    """Chars/token against vocabulary size: a line per trained family, a point per fixed tokenizer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    families: dict[str, list[dict[str, Any]]] = {}
    for r in result["rows"]:
        families.setdefault(r["family"], []).append(r)
    for family, rows in families.items():
        xs, ys = [r["size_axis"] for r in rows], [r["chars_per_token"] for r in rows]
        if len(rows) > 1:
            ax.plot(xs, ys, "x--" if family.startswith("HF") else "o-", label=family)
        else:
            ax.plot(xs, ys, "s", label=rows[0]["name"])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("vocabulary size")
    ax.set_ylabel("characters per token (held-out)")
    ax.set_title("Compression against vocabulary size, measured on the same held-out text")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_comparison(result: dict[str, Any], directory: str) -> dict[str, str]:
    """compare.md, compare.json and compare.png in `directory`; returns their paths."""
    os.makedirs(directory, exist_ok=True)
    paths = {name: os.path.join(directory, f"compare.{name}") for name in ("md", "json", "png")}
    with open(paths["md"], "w", encoding="utf-8") as f:
        f.write(compare_text(result, markdown=True))
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2, ensure_ascii=False)
    plot_comparison(result, paths["png"])
    return paths
