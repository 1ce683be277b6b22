"""The tokenizer lab: what a tokenizer learned and how it compares, measured on the user's text.

* `show_tokens`: text drawn token by token, each token's text above its id, whitespace made
  visible, with the compression of that text (`tokenmill tokenizer encode --show`).
* `merge_log`: every N-th merge with its pair, the new token and the pair's count when it
  was merged (`tokenmill tokenizer train --log-merges N`).
* `inspect_tokenizer`: shortest, longest, first and last tokens, tokens per length, and the
  tokens that never occur in the training counts (`tokenmill tokenizer inspect`).
* `compare`: character level, word level, our BPE at several sizes, HF `tokenizers` BPE at
  the same sizes and the production encodings (GPT-2, cl100k, o200k), side by side on the
  same held-out text, with fertility per language (`tokenmill compare`).

No Prefect here; `flows/lab.py` turns a comparison into Prefect artifacts.
"""

from __future__ import annotations

import json
import os
import re
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pipeline_lib import bpe_reference as ref
from pipeline_lib.bpe_reference import END_OF_WORD
from pipeline_lib.config import STRICT, check_vocab_sizes_limit, doc
from pipeline_lib.errors import InputError

if TYPE_CHECKING:
    import numpy as np

    from pipeline_lib.tokenizer import Tokenizer

    Counts = Sequence[int] | np.ndarray

# --------------------------------------------------------------------------- the shipped small corpora
LAB_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "lab")
# name -> (file in LAB_DATA, what it is): the tutorials' small corpora, shipped (data/lab/README.md).
LAB_CORPORA = {
    "hat": ("hat.txt", 'the byte-level walkthrough\'s sentence, "the cat in the hat"'),
    "low": ("low.txt", "low/lower/newest/widest, the word-frequency walkthrough"),
    "cats": ("cats.txt", "the cat/rat sentences of the lowercase \\w+ word walkthrough"),
    "names": ("names.txt", "5,000 generated given names (CC0), one a line"),
    "peter_rabbit": ("peter_rabbit.txt", "the opening of The Tale of Peter Rabbit (1902, public domain)"),
}


def lab_corpus(name: str) -> str:
    """The path of a shipped lab corpus."""
    if name not in LAB_CORPORA:
        raise InputError(f"unknown lab corpus {name!r}; shipped: {', '.join(LAB_CORPORA)}")
    return os.path.join(LAB_DATA, LAB_CORPORA[name][0])


# --------------------------------------------------------------------------- drawing tokens
# Whitespace and control characters as a person can see them in a token.
VISIBLE = {" ": "␣", "\n": "↵", "\t": "→", "\r": "␍", "\v": "␋", "\f": "␌"}
# Background colours (xterm-256) that alternate from token to token in a terminal.
TOKEN_COLOURS = (153, 223, 194, 217, 189, 229)


def visible(text: str) -> str:
    """`text` with whitespace and other control characters drawn as visible symbols."""
    out = []
    for c in text:
        if c in VISIBLE:
            out.append(VISIBLE[c])
        elif ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0:
            out.append(f"\\x{ord(c):02x}")
        else:
            out.append(c)
    return "".join(out)


def shown_bytes(tok: Tokenizer, data: bytes) -> str:
    """Token bytes as visible text: bytes that are not whole UTF-8 characters as ``\\xNN``,
    the word unit's end-of-word symbol as ``</w>``."""
    if tok.unit == "word":
        return "</w>".join(visible(part.decode("utf-8", "backslashreplace")) for part in data.split(END_OF_WORD))
    return visible(data.decode("utf-8", "backslashreplace"))


def token_texts(tok: Tokenizer, ids: Iterable[int]) -> list[str]:
    """The visible text of each id (special tokens by their names)."""
    specials = {i: name for name, i in tok.special_tokens.items()}
    if tok.unit == "word":  # its decoder turns </w> into a space: show the token's own bytes
        by_id = {i: b for b, i in tok.mergeable_ranks.items()}
        raw_of: Callable[[int], bytes] = by_id.__getitem__
    else:
        raw_of = tok.decode_single_token_bytes
    return [specials[i] if i in specials else shown_bytes(tok, raw_of(i)) for i in ids]


def compression(text: str, n_tokens: int) -> dict[str, Any]:
    """Tokens, characters, bytes, bytes/token and chars/token of `text` encoded in `n_tokens`."""
    n_chars, n_bytes = len(text), len(text.encode("utf-8", "surrogatepass"))
    return {
        "tokens": n_tokens,
        "chars": n_chars,
        "bytes": n_bytes,
        "bytes_per_token": n_bytes / max(1, n_tokens),
        "chars_per_token": n_chars / max(1, n_tokens),
    }


def _cell_width(text: str) -> int:
    from rich.cells import cell_len

    return cell_len(text)


def draw_tokens(cells: Sequence[tuple[int, str]], width: int = 80, colour: bool = False) -> list[str]:
    """Lines drawing (id, text) cells: each token's text above its id, wrapped at `width`.

    Plain: boundaries are ``|``. In colour, each token has its own background and the
    cells are a space apart, so neighbouring ids do not read as one number.
    """
    bar = " " if colour else "|"
    rows: list[tuple[list[str], list[str]]] = [([], [])]
    used = len(bar)
    for k, (token_id, text) in enumerate(cells):
        w = max(_cell_width(text), len(str(token_id)))
        if rows[-1][0] and used + w + len(bar) > width:
            rows.append(([], []))
            used = len(bar)
        shown, number = text + " " * (w - _cell_width(text)), str(token_id).ljust(w)
        if colour:
            on = f"\x1b[48;5;{TOKEN_COLOURS[k % len(TOKEN_COLOURS)]}m\x1b[38;5;16m"
            shown, number = f"{on}{shown}\x1b[0m", f"{on}{number}\x1b[0m"
        rows[-1][0].append(shown)
        rows[-1][1].append(number)
        used += w + len(bar)
    if colour:
        return [bar.join(row).rstrip() for top, bottom in rows if top for row in (top, bottom)]
    return [bar + bar.join(row) + bar for top, bottom in rows if top for row in (top, bottom)]


def _whole(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def mark_split_characters(raw: Sequence[bytes], texts: Sequence[str]) -> list[str]:
    """`texts` of tokens (their bytes `raw`), where a character whose bytes are split over
    several tokens is shown in each of them with its part: ``猫`` as three byte tokens reads
    ``猫[1/3]`` ``猫[2/3]`` ``猫[3/3]``, and ``␣\\xe5`` ``\\xa5`` ``\\xbd`` reads ``␣好[1/3]``
    ``好[2/3]`` ``好[3/3]``. Tokens without such a character keep their text."""
    owner: list[int] = []  # byte -> token
    for k, data in enumerate(raw):
        owner += [k] * len(data)
    joined = b"".join(raw)
    shown: list[list[str]] = [[] for _ in raw]
    split_in = set()
    at = 0
    for c in joined.decode("utf-8", "surrogateescape"):
        size = len(c.encode("utf-8", "surrogateescape"))
        first, last = owner[at], owner[at + size - 1]
        if first == last or "\udc80" <= c <= "\udcff":
            shown[first].append(visible(c) if not "\udc80" <= c <= "\udcff" else f"\\x{ord(c) - 0xDC00:02x}")
        else:
            for k in range(first, last + 1):
                shown[k].append(f"{visible(c)}[{k - first + 1}/{last - first + 1}]")
                split_in.add(k)
        at += size
    return ["".join(shown[k]) if k in split_in else texts[k] for k in range(len(raw))]


def show_tokens(tok: Tokenizer, text: str, ids: Sequence[int], width: int = 80, colour: bool = False) -> str:
    """`text` drawn as its tokens `ids`, then its compression (the `encode --show` output).
    A character split over several byte tokens is marked in each (`mark_split_characters`)."""
    texts = token_texts(tok, ids)
    if tok.unit == "byte":
        specials = set(tok.special_tokens.values())
        texts = mark_split_characters([b"" if i in specials else tok.decode_single_token_bytes(i) for i in ids], texts)
    cells = list(zip(ids, texts))
    c = compression(text, len(ids))
    lines = draw_tokens(cells, width, colour)
    legend = ", ".join(
        [f"{v} {k!r}" for k, v in VISIBLE.items() if any(v in t for _, t in cells)]
        + (["X[i/n]: part i of a character split over n tokens"] if any(re.search(r"\[\d+/\d+\]$", t) for _, t in cells) else [])
    )
    lines.append(
        f"{c['tokens']:,} token{'s' if c['tokens'] != 1 else ''} for {c['chars']:,} characters ({c['bytes']:,} bytes): "
        f"{c['bytes_per_token']:.2f} bytes/token, {c['chars_per_token']:.2f} chars/token" + (f"  [{legend}]" if legend else "")
    )
    return "\n".join(lines)


def text_rows(text: str, tokenizers: Sequence[tuple[str, Tokenizer]]) -> list[dict[str, Any]]:
    """The same `text` as tokens under character level, word level and each tokenizer:
    per row its name and (id, visible text) cells. Character ids are code points; word
    level's ids number the text's own words and punctuation runs in the order met."""
    rows = [{"name": "character level", "cells": [(ord(c), visible(c)) for c in text]}]
    words: dict[str, int] = {}
    rows.append({"name": "word level", "cells": [(words.setdefault(w, len(words)), visible(w)) for w in WORD_PIECES.findall(text)]})
    for name, tok in tokenizers:
        ids = tok.encode_ordinary(text)
        rows.append({"name": name, "cells": list(zip(ids, token_texts(tok, ids)))})
    return rows


def show_text_rows(text: str, rows: Sequence[Mapping[str, Any]], width: int = 80, colour: bool = False) -> str:
    """`text_rows` drawn one under the other, each with its token count and chars/token."""
    out = []
    for row in rows:
        c = compression(text, len(row["cells"]))
        out.append(f"{row['name']}: {c['tokens']:,} tokens, {c['chars_per_token']:.2f} chars/token")
        out += draw_tokens(row["cells"], width, colour)
        out.append("")
    return "\n".join(out).rstrip("\n")


def check_special_tokens(tok: Tokenizer, text: str, allowed: Iterable[str], source: str) -> set[str] | Literal["all"]:
    """The special tokens `text` may hold, as `encode` takes them; raises the command-line error.

    Raises:
        InputError: an ``--allow-special`` name the tokenizer does not have, or a special
            token in the text that is not allowed (the message names it and the flag).
    """
    allowed = list(allowed)
    if "all" in allowed:
        return "all"
    names = ", ".join(sorted(tok.special_tokens)) or "none"
    for name in allowed:
        if name not in tok.special_tokens:
            raise InputError(f"--allow-special {name!r}: not a special token of this tokenizer (its special tokens: {names})")
    refused = [t for t in tok.special_tokens if t not in allowed]
    if refused:
        found = re.search("|".join(re.escape(t) for t in sorted(refused, key=len, reverse=True)), text)
        if found:
            token = found.group()
            raise InputError(
                f"{source} holds the special token {token!r} (at character {found.start():,}), which text may only hold when allowed: "
                f"pass --allow-special '{token}' to encode it as its id {tok.special_tokens[token]}, or --special-as-text to encode it as ordinary text"
            )
    return set(allowed)


# --------------------------------------------------------------------------- the merges, as learned
def merge_log(tok: Tokenizer, every: int) -> list[dict[str, Any]]:
    """Every `every`-th merge (0, every, 2*every, ... and the last): its pair, the token it
    made and the pair's count when it was merged (None for a tokenizer that did not keep them)."""
    if every < 1:
        raise InputError(f"--log-merges {every}: give a step of at least 1")
    merges = tok.merges or []
    picked = sorted({*range(0, len(merges), every), len(merges) - 1} - {-1})
    texts = token_texts(tok, sorted({i for k in picked for i in merges[k]}))
    text_of = dict(zip(sorted({i for k in picked for i in merges[k]}), texts))
    counts = tok.merge_counts
    return [
        {
            "merge": k,
            "left": text_of[merges[k][0]],
            "right": text_of[merges[k][1]],
            "token": text_of[merges[k][2]],
            "id": merges[k][2],
            "count": counts[k] if counts is not None else None,
        }
        for k in picked
    ]


def merge_line(row: dict[str, Any]) -> str:
    count = "" if row["count"] is None else f" (count {row['count']:,})"
    return f"merge {row['merge']}: '{row['left']}' + '{row['right']}' -> '{row['token']}' (id {row['id']}){count}"


# --------------------------------------------------------------------------- traces
def _start_parts(tok: Tokenizer, piece: bytes) -> list[bytes | None]:
    """A piece's parts before any merge, as the tokenizer's unit starts it: bytes, or
    characters (None: a character that is ``<unk>``; its bytes with byte fallback)."""
    if tok.unit == "byte":
        return [piece[i : i + 1] for i in range(len(piece))]
    ranks = tok.mergeable_ranks
    parts: list[bytes | None] = []
    for c in ref.characters(piece):
        if c in ranks:
            parts.append(c)
        elif tok.unknown == "unk":
            parts.append(None)
        else:
            parts.extend(c[i : i + 1] for i in range(len(c)))
    return parts


def piece_texts(tok: Tokenizer, parts: Sequence[bytes | None]) -> list[str]:
    return [UNK_TEXT if p is None else shown_bytes(tok, p) for p in parts]


UNK_TEXT = "<unk>"


def encode_pieces(tok: Tokenizer, text: str) -> list[bytes]:
    """The pieces the tokenizer encodes one by one (split by its pattern; a word unit's
    words with their ``</w>``)."""
    return tok._pieces(text.encode("utf-8", "surrogatepass"))


def encode_trace(tok: Tokenizer, text: str) -> list[dict[str, Any]]:
    """How `text` is encoded, piece by piece: the parts it starts as, then each merge applied
    (the adjacent pair whose merged token has the lowest rank first, leftmost on equal
    ranks), with that rank, until no adjacent pair is a token; then the ids.

    The ids equal ``tok.encode_ordinary(text)``.
    """
    ranks = tok.mergeable_ranks
    unknown = tok.special_tokens.get("<unk>") if tok.unknown == "unk" else None
    out = []
    for piece in encode_pieces(tok, text):
        parts = _start_parts(tok, piece)
        start = piece_texts(tok, parts)
        steps = []
        while len(parts) > 1 and (pair := ref.lowest_rank_pair(parts, ranks)) is not None:
            best, at = pair
            left, right = parts[at], parts[at + 1]
            assert left is not None and right is not None
            parts[at : at + 2] = [left + right]
            steps.append(
                {
                    "rank": best,
                    "left": shown_bytes(tok, left),
                    "right": shown_bytes(tok, right),
                    "token": shown_bytes(tok, left + right),
                    "parts": piece_texts(tok, parts),
                }
            )
        ids = [unknown if p is None else ranks[p] for p in parts]
        out.append({"piece": shown_bytes(tok, piece), "start": start, "steps": steps, "ids": ids})
    return out


def encode_trace_text(trace: Sequence[Mapping[str, Any]]) -> str:
    """The trace as a learner reads it: each piece, its parts, then one line per merge."""
    lines = []
    for entry in trace:
        lines.append(f"piece '{entry['piece']}': {' '.join(entry['start'])}")
        for step in entry["steps"]:
            lines.append(f"  rank {step['rank']}: '{step['left']}' + '{step['right']}' -> '{step['token']}'   {' '.join(step['parts'])}")
        lines.append(f"  ids {' '.join(map(str, entry['ids']))}")
    return "\n".join(lines)


def train_trace(tok: Tokenizer, pieces: Sequence[bytes], counts: Counts, max_pieces: int = 20, max_merges: int | None = None) -> dict[str, Any]:
    """The training pieces after each merge, as the tutorials print the corpus: the
    `max_pieces` most frequent pieces (ties: in the order given), each as its parts with its
    count, before any merge and after each of the first `max_merges` merges (all: None).

    The merges are replayed from the tokenizer's merge list (each merge rewrites every
    occurrence of its pair, left to right), so the last state is how training left the pieces.
    """
    merges = tok.merges or []
    if max_merges is not None:
        merges = merges[:max_merges]
    weights = [int(c) for c in counts]
    order = sorted(range(len(pieces)), key=lambda k: -weights[k])[:max_pieces]
    chosen = [pieces[k] for k in order]
    if tok.unit == "word":  # the pieces are words (`bpe_reference.word_counts`)
        start = [[*ref.characters(w), ref.END_OF_WORD] for w in chosen]
    else:
        start = [[p[i : i + 1] for i in range(len(p))] if tok.unit == "byte" else ref.characters(p) for p in chosen]
    by_id = {i: b for b, i in tok.mergeable_ranks.items()}
    id_of = tok.mergeable_ranks
    state = [[id_of[s] for s in symbols] for symbols in start]
    show = lambda: [" ".join(shown_bytes(tok, by_id[i]) for i in word) for word in state]  # noqa: E731
    steps: list[dict[str, Any]] = [{"merge": None, "pieces": show()}]
    for k, (left, right, new) in enumerate(merges):
        state = [ref._merge_word(word, (left, right), new) for word in state]
        steps.append(
            {
                "merge": k,
                "left": shown_bytes(tok, by_id[left]),
                "right": shown_bytes(tok, by_id[right]),
                "token": shown_bytes(tok, by_id[new]),
                "pieces": show(),
            }
        )
    return {"counts": [weights[k] for k in order], "pieces_total": len(pieces), "steps": steps}


def train_trace_text(trace: Mapping[str, Any], width: int = 160) -> str:
    """One line per merge: the merge, then the traced pieces (``×count`` when above 1)."""
    counts = trace["counts"]
    lines = []
    for step in trace["steps"]:
        shown = "  |  ".join(p + (f" ×{c}" if c > 1 else "") for p, c in zip(step["pieces"], counts))
        head = "start" if step["merge"] is None else f"merge {step['merge']}: '{step['left']}' + '{step['right']}' -> '{step['token']}'"
        line = f"{head}   {shown}"
        lines.append(line if len(line) <= width else line[: width - 1] + "…")
    if trace["pieces_total"] > len(counts):
        lines.append(f"(the {len(counts)} most frequent of {trace['pieces_total']:,} pieces)")
    return "\n".join(lines)


# --------------------------------------------------------------------------- merges and vocabulary as text
def merges_text(tok: Tokenizer, name: str) -> str:
    """Every merge as a learner reads it, under a header: rank, pair, new token, its id and
    the pair's count when merged (`tokenmill tokenizer merges`)."""
    if tok.merges is None:
        raise InputError(f"--tokenizer {name}: keeps no merge list (loaded from ranks); its tokens are listed by `tokenmill tokenizer vocab`")
    header = (
        f"# {name}: {len(tok.merges):,} merges, {tok.unit}-level BPE, pattern {tok.pattern}, {tok.vocab_size:,} ids\n"
        "# merge: left + right -> token (id) (the pair's count when merged); ␣ space, ↵ newline, → tab"
    )
    return "\n".join([header, *(merge_line(r) for r in merge_log(tok, 1))])


def vocab_rows(tok: Tokenizer, search: str | None = None) -> list[tuple[int, str]]:
    """(id, visible text) of every token, special tokens included, by id; with `search`,
    only the tokens whose text (spaces as ``␣`` or as spaces) contains it."""
    by_id = sorted((i, b) for b, i in tok.mergeable_ranks.items())
    rows = [*((i, t) for (i, _), t in zip(by_id, token_texts(tok, [i for i, _ in by_id]))), *sorted((i, n) for n, i in tok.special_tokens.items())]
    if search:
        wanted = {search, visible(search)}
        rows = [(i, t) for i, t in rows if any(w in t for w in wanted)]
    return rows


# --------------------------------------------------------------------------- your tokenizers beside a report
def yours_markdown(named: Sequence[tuple[str, Tokenizer]], heldout: str, sections: Mapping[str, str]) -> str:
    """A report section for tokenizers the learner trained: compression on the report's
    held-out text and tokens per word on each language of the UDHR sample."""
    lines = [
        f"## Your tokenizers (the same held-out {len(heldout):,} characters)",
        "",
        "| tokenizer | ids | tokens | chars/token | bytes/token |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, tok in named:
        c = compression(heldout, len(tok.encode_ordinary(heldout)))
        lines.append(f"| {name} | {tok.vocab_size:,} | {c['tokens']:,} | {c['chars_per_token']:.3f} | {c['bytes_per_token']:.3f} |")
    lines += ["", "Tokens per word:", "", "| language | " + " | ".join(n for n, _ in named) + " |", "|---|" + "---:|" * len(named)]
    for language, text in sections.items():
        words = max(1, len(text.split()))
        lines.append(f"| {language} | " + " | ".join(f"{len(tok.encode_ordinary(text)) / words:.2f}" for _, tok in named) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- inspecting a tokenizer
def token_length(data: bytes) -> int:
    """A token's length in characters; bytes that are not whole characters count one each."""
    return len(data.decode("utf-8", "surrogateescape"))


def token_occurrences(tok: Tokenizer, pieces: Sequence[bytes], counts: Counts) -> list[int]:
    """How often each id occurs when the training pieces are encoded, weighted by their counts."""
    import numpy as np

    ids, ends = tok.encode_ordinary_batch_to_numpy(list(pieces))
    per_piece = np.diff(np.asarray(ends, dtype=np.int64)).astype(np.int64)
    occurrences = np.zeros(tok.vocab_size, dtype=np.int64)
    np.add.at(occurrences, np.asarray(ids, dtype=np.int64), np.repeat(np.asarray(counts, dtype=np.int64), per_piece))  # exact in int64
    return occurrences.tolist()


def training_compression(tok: Tokenizer, pieces: Sequence[bytes], counts: Counts) -> dict[str, Any]:
    """Tokens, bytes and characters of the training text (its pieces, weighted by their
    counts) under the tokenizer, with bytes/token and chars/token: the figure the tutorials
    print when training ends."""
    import numpy as np

    weights = np.asarray(counts, dtype=np.int64)
    _, ends = tok.encode_ordinary_batch_to_numpy(list(pieces))
    n_tokens = int(np.dot(np.diff(np.asarray(ends, dtype=np.int64)), weights)) if len(weights) else 0
    n_bytes = int(np.dot(np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces)), weights)) if len(weights) else 0
    n_chars = int(np.dot(np.fromiter((token_length(p) for p in pieces), dtype=np.int64, count=len(pieces)), weights)) if len(weights) else 0
    return {
        "tokens": n_tokens,
        "chars": n_chars,
        "bytes": n_bytes,
        "bytes_per_token": n_bytes / max(1, n_tokens),
        "chars_per_token": n_chars / max(1, n_tokens),
    }


def compression_line(c: Mapping[str, Any], what: str = "the training text") -> str:
    return (
        f"compression on {what}: {c['chars']:,} characters ({c['bytes']:,} bytes) -> {c['tokens']:,} tokens, "
        f"{c['chars_per_token']:.2f} chars/token, {c['bytes_per_token']:.2f} bytes/token"
    )


def inspect_tokenizer(tok: Tokenizer, k: int = 10, counts: tuple[Sequence[bytes], Counts] | None = None) -> dict[str, Any]:
    """What a tokenizer holds: its `k` shortest, longest, first and last tokens, the number
    of tokens per length, and (given the training `counts`: pieces and their counts) the
    tokens that never occur when the training text is encoded."""
    by_id = sorted((i, b) for b, i in tok.mergeable_ranks.items())
    entry = lambda i, b: {"id": i, "text": shown_bytes(tok, b)}  # noqa: E731
    lengths = Counter(token_length(b) for _, b in by_id)
    if tok.merges is not None:  # in the order they were learned
        token_of = dict(by_id)
        learned = [(m[2], token_of[m[2]]) for m in tok.merges]
    else:  # loaded from ranks: a token's rank is its merge's
        learned = [(i, b) for i, b in by_id if len(b) > 1]
    out: dict[str, Any] = {
        "vocab_size": tok.vocab_size,
        "ordinary_tokens": len(by_id),
        "special_tokens": dict(tok.special_tokens),
        "learned_tokens": len(learned),
        "shortest": [entry(i, b) for i, b in sorted(by_id, key=lambda e: (token_length(e[1]), e[0]))[:k]],
        "longest": [entry(i, b) for i, b in sorted(by_id, key=lambda e: (-token_length(e[1]), e[0]))[:k]],
        "first": [entry(i, b) for i, b in learned[:k]],
        "last": [entry(i, b) for i, b in learned[-k:]],
        "per_length": dict(sorted(lengths.items())),
        "never_used": None,
    }
    if counts is not None:
        seen = token_occurrences(tok, *counts)
        unused = [(i, b) for i, b in learned if seen[i] == 0]
        out["never_used"] = {"count": len(unused), "tokens": [entry(i, b) for i, b in unused[:k]]}
    return out


def inspect_text(report: dict[str, Any]) -> str:
    """The terminal / Markdown-friendly text of `inspect_tokenizer`'s result."""
    cells = lambda entries: "  ".join(f"{e['id']}:{e['text']}" for e in entries)  # noqa: E731
    specials = ", ".join(f"{t} ({i})" for t, i in report["special_tokens"].items()) or "none"
    lines = [
        f"{report['vocab_size']:,} ids: {report['ordinary_tokens']:,} ordinary tokens ({report['learned_tokens']:,} learned by merges), special tokens: {specials}",
        f"shortest: {cells(report['shortest'])}",
        f"longest:  {cells(report['longest'])}",
        f"first:    {cells(report['first'])}",
        f"last:     {cells(report['last'])}",
        "tokens per length (characters): " + ", ".join(f"{n}: {c:,}" for n, c in report["per_length"].items()),
    ]
    never = report["never_used"]
    if never is None:
        lines.append("never used in training: unknown (the tokenizer's training counts are not known; give a store REF)")
    else:
        lines.append(f"never used in training: {never['count']:,} learned tokens" + (f" (e.g. {cells(never['tokens'])})" if never["tokens"] else ""))
        if never["count"]:
            lines.append("  (merged into longer tokens every time they appear: intermediate steps of a merge chain)")
    return "\n".join(lines)


# --------------------------------------------------------------------------- comparing tokenizers
PRODUCTION_ENCODINGS = ("gpt2", "cl100k_base", "o200k_base")
# Words and punctuation runs: the pieces a word-level tokenizer gives an id each.
WORD_PIECES = re.compile(r"\w+|[^\w\s]+")


@dataclass(frozen=True)
class CompareConfig:
    """`tokenmill compare`: tokenizers side by side on the same held-out text."""

    __pydantic_config__ = STRICT

    vocab_sizes: Annotated[tuple[int, ...], doc("vocabulary sizes of the BPE tokenizers trained for the comparison (ours and HF's)")] = (300, 1024, 4096)
    units: Annotated[
        tuple[Literal["byte", "char", "word"], ...], doc("the units our BPE is trained over (char: no split; word: whitespace words), a row per unit and size")
    ] = ("byte", "char")
    pattern: Annotated[Literal["gpt2", "cl100k", "o200k"], doc("split pattern of our byte-level BPE")] = "cl100k"
    heldout_fraction: Annotated[float, doc("the end of the corpus held out for measuring (the rest trains)")] = 0.1
    d_model: Annotated[int, doc("model width for the embedding parameters column (vocabulary x width)")] = 768
    production: Annotated[tuple[str, ...], doc("production encodings to measure (get_encoding names; none: leave them out)")] = PRODUCTION_ENCODINGS
    hf: Annotated[bool, doc("also train HF tokenizers' byte-level BPE at the same sizes (needs the tokenizers package)")] = True

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
            raise InputError(f"production={list(self.production)}: unknown encoding {unknown[0]!r} (known: {', '.join(list_encoding_names())}, or none)")


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
    return Candidate("character level", "character level", len(alphabet), len, timed=False, note=note, size_axis=len(alphabet))


def word_level(train: str, heldout: str) -> Candidate:
    vocab = set(WORD_PIECES.findall(train))
    pieces = WORD_PIECES.findall(heldout)
    unseen = sum(1 for p in pieces if p not in vocab)
    note = f"words and punctuation runs; {unseen / max(1, len(pieces)):.1%} of held-out ones unseen (one <unk> id)"
    return Candidate("word level", "word level", len(vocab) + 1, lambda t: len(WORD_PIECES.findall(t)), timed=False, note=note, size_axis=len(vocab) + 1)


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
        big = Tokenizer.train(docs, max(vocab_sizes), pattern=split, special_tokens=(), unit=unit) if max(vocab_sizes) >= 256 or unit != "byte" else None
    if big is None:
        return []
    smallest = big.vocab_size - len(big.merges or [])
    label = f"ours {unit}" + (f" {pattern}" if unit == "byte" else "")
    family = f"ours ({unit}-level BPE" + (f", {pattern} split)" if unit == "byte" else ", no split)" if unit == "char" else ", whitespace words, </w>)")
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
        trainer = trainers.BpeTrainer(vocab_size=v, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[], show_progress=False)
        hf.train_from_iterator(docs, trainer)
        reached = hf.get_vocab_size()
        note = f"the corpus gave {reached:,} ids of the {v:,} asked for" if reached < v else ""
        out.append(Candidate(f"HF byte-level BPE {v}", "HF tokenizers (byte-level BPE)", reached, _hf_counter(hf), note=note, size_axis=v))
    return out, "HF tokenizers rows: encode throughput of one `Tokenizer.encode` call on the whole held-out text (HF also computes offsets)"


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
        candidates.append(Candidate(name, f"yours ({tok.unit}-level BPE, {tok.pattern} split)", tok.vocab_size, _counter(tok), size_axis=tok.vocab_size))
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
            fertility_rows.append({"text": name, "words": len(section.split()), **{c.name: c.count(section) / words for c in candidates}})
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
        return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *["| " + " | ".join(r) + " |" for r in rows]]
    widths = [max(len(h), *(len(r[k]) for r in rows)) for k, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    return [line(header), line(["-" * w for w in widths]), *map(line, rows)]


def compare_text(result: dict[str, Any], markdown: bool = False) -> str:
    """The comparison as a terminal table (or Markdown), then fertility per language and notes."""
    rows = result["rows"]
    head = (
        f"Held-out text: {result['heldout_chars']:,} characters, {result['heldout_bytes']:,} bytes, {result['heldout_words']:,} words"
        f" (the last part of {result['source'] or 'the corpus'}; the {result['train_chars']:,} characters before it train);"
        f" embedding parameters at d_model={result['d_model']}."
    )
    lines = [f"## Tokenizers compared\n\n{head}\n" if markdown else head + "\n"]
    lines += _table([c for c, _ in TABLE_COLUMNS], [[f(r) for _, f in TABLE_COLUMNS] for r in rows], markdown)
    notes = [f"{r['name']}: {r['note']}" for r in rows if r["note"]] + result["notes"]
    if result["fertility"]:
        # The terminal shows the largest size of each trained family; the Markdown, every row.
        last = {r["family"]: r["name"] for r in rows}
        names = [r["name"] for r in rows if markdown or r["family"] == "production" or last[r["family"]] == r["name"]]
        title = "Fertility per language (tokens per whitespace word, UDHR sample" + (")" if markdown else "; every size in the Markdown file)")
        lines += ["", f"### {title}" if markdown else f"{title}:", ""]
        lines += _table(["language", *names], [[f["text"], *(_number(f[n]) for n in names)] for f in result["fertility"]], markdown)
        notes.append("character- and word-level tokenizers count a character or word unseen in training as one <unk> token: few tokens there is not coverage")
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
