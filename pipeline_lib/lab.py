"""The tokenizer lab: what a tokenizer learned and how it compares, measured on the user's text.

* `show_tokens`: text drawn token by token, each token's text above its id, whitespace made
  visible, with the compression of that text (`tokenmill tokenizer encode --show`).
* `merge_log`: every N-th merge with its pair, the new token and the pair's count when it
  was merged (`tokenmill tokenizer train --log-merges N`).
* `inspect_tokenizer`: shortest, longest, first and last tokens, tokens per length, and the
  tokens that never occur in the training counts (`tokenmill tokenizer inspect`).
* `compare` (in `lab_compare`, its names here too): character level, word level, our BPE at
  several sizes, HF `tokenizers` BPE at the same sizes and the production encodings (GPT-2,
  cl100k, o200k), side by side on the same held-out text, with fertility per language
  (`tokenmill compare`).

No Prefect here; `flows/lab.py` turns a comparison into Prefect artifacts.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pipeline_lib import bpe_reference as ref
from pipeline_lib.bpe_reference import END_OF_WORD
from pipeline_lib.errors import InputError
from pipeline_lib.token_stats import compression, compression_of  # noqa: F401  (lab.compression, as before)

if TYPE_CHECKING:
    import numpy as np

    from pipeline_lib.lab_compare import (  # noqa: F401  (re-exported: the lab's names, as before the split)
        PRODUCTION_ENCODINGS,
        TABLE_COLUMNS,
        WORD_PIECES,
        Candidate,
        CompareConfig,
        character_level,
        compare,
        compare_text,
        hf_bpe,
        measure,
        ours,
        plot_comparison,
        production,
        split_heldout,
        throughput,
        word_level,
        write_comparison,
    )
    from pipeline_lib.tokenizer import Tokenizer

    Counts = Sequence[int] | np.ndarray

# The comparison's names (`lab_compare`) are re-exported here on first use (PEP 562): it imports
# the stage configs and pydantic, which the `tokenmill tokenizer` commands do not need.
_FROM_COMPARE = frozenset(
    {
        "PRODUCTION_ENCODINGS",
        "TABLE_COLUMNS",
        "WORD_PIECES",
        "Candidate",
        "CompareConfig",
        "character_level",
        "compare",
        "compare_text",
        "hf_bpe",
        "measure",
        "ours",
        "plot_comparison",
        "production",
        "split_heldout",
        "throughput",
        "word_level",
        "write_comparison",
    }
)


def __getattr__(name: str) -> Any:
    if name not in _FROM_COMPARE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from pipeline_lib import lab_compare

    value = getattr(lab_compare, name)
    globals()[name] = value
    return value


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
        + (
            ["X[i/n]: part i of a character split over n tokens"]
            if any(re.search(r"\[\d+/\d+\]$", t) for _, t in cells)
            else []
        )
    )
    lines.append(
        f"{c['tokens']:,} token{'s' if c['tokens'] != 1 else ''} for {c['chars']:,} characters ({c['bytes']:,} bytes): "
        f"{c['bytes_per_token']:.2f} bytes/token, {c['chars_per_token']:.2f} chars/token"
        + (f"  [{legend}]" if legend else "")
    )
    return "\n".join(lines)


def text_rows(text: str, tokenizers: Sequence[tuple[str, Tokenizer]]) -> list[dict[str, Any]]:
    """The same `text` as tokens under character level, word level and each tokenizer:
    per row its name and (id, visible text) cells. Character ids are code points; word
    level's ids number the text's own words and punctuation runs in the order met."""
    from pipeline_lib.lab_compare import WORD_PIECES as word_pieces

    rows = [{"name": "character level", "cells": [(ord(c), visible(c)) for c in text]}]
    words: dict[str, int] = {}
    rows.append(
        {
            "name": "word level",
            "cells": [(words.setdefault(w, len(words)), visible(w)) for w in word_pieces.findall(text)],
        }
    )
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
            raise InputError(
                f"--allow-special {name!r}: not a special token of this tokenizer (its special tokens: {names})"
            )
    refused = [t for t in tok.special_tokens if t not in allowed]
    if refused:
        found = re.search("|".join(re.escape(t) for t in sorted(refused, key=len, reverse=True)), text)
        if found:
            token = found.group()
            raise InputError(
                f"{source} holds the special token {token!r} (at character {found.start():,}), which text may only "
                "hold when allowed: "
                f"pass --allow-special '{token}' to encode it as its id {tok.special_tokens[token]}, or "
                "--special-as-text to encode it as ordinary text"
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
            lines.append(
                f"  rank {step['rank']}: '{step['left']}' + '{step['right']}' -> '{step['token']}'   "
                f"{' '.join(step['parts'])}"
            )
        lines.append(f"  ids {' '.join(map(str, entry['ids']))}")
    return "\n".join(lines)


def train_trace(
    tok: Tokenizer, pieces: Sequence[bytes], counts: Counts, max_pieces: int = 20, max_merges: int | None = None
) -> dict[str, Any]:
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
        head = (
            "start"
            if step["merge"] is None
            else (f"merge {step['merge']}: '{step['left']}' + '{step['right']}' -> '{step['token']}'")
        )
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
        raise InputError(
            f"--tokenizer {name}: keeps no merge list (loaded from ranks); its tokens are listed by "
            "`tokenmill tokenizer vocab`"
        )
    header = (
        f"# {name}: {len(tok.merges):,} merges, {tok.unit}-level BPE, pattern {tok.pattern}, {tok.vocab_size:,} ids\n"
        "# merge: left + right -> token (id) (the pair's count when merged); ␣ space, ↵ newline, → tab"
    )
    return "\n".join([header, *(merge_line(r) for r in merge_log(tok, 1))])


def vocab_rows(tok: Tokenizer, search: str | None = None) -> list[tuple[int, str]]:
    """(id, visible text) of every token, special tokens included, by id; with `search`,
    only the tokens whose text (spaces as ``␣`` or as spaces) contains it."""
    by_id = sorted((i, b) for b, i in tok.mergeable_ranks.items())
    rows = [
        *((i, t) for (i, _), t in zip(by_id, token_texts(tok, [i for i, _ in by_id]))),
        *sorted((i, n) for n, i in tok.special_tokens.items()),
    ]
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
        lines.append(
            f"| {name} | {tok.vocab_size:,} | {c['tokens']:,} | {c['chars_per_token']:.3f} | "
            f"{c['bytes_per_token']:.3f} |"
        )
    lines += [
        "",
        "Tokens per word:",
        "",
        "| language | " + " | ".join(n for n, _ in named) + " |",
        "|---|" + "---:|" * len(named),
    ]
    for language, text in sections.items():
        words = max(1, len(text.split()))
        lines.append(
            f"| {language} | " + " | ".join(f"{len(tok.encode_ordinary(text)) / words:.2f}" for _, tok in named) + " |"
        )
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
    # exact in int64
    np.add.at(occurrences, np.asarray(ids, dtype=np.int64), np.repeat(np.asarray(counts, dtype=np.int64), per_piece))
    return occurrences.tolist()


def training_compression(tok: Tokenizer, pieces: Sequence[bytes], counts: Counts) -> dict[str, Any]:
    """Tokens, bytes and characters of the training text (its pieces, weighted by their
    counts) under the tokenizer, with bytes/token and chars/token: the figure the tutorials
    print when training ends."""
    import numpy as np

    weights = np.asarray(counts, dtype=np.int64)
    _, ends = tok.encode_ordinary_batch_to_numpy(list(pieces))
    n_tokens = int(np.dot(np.diff(np.asarray(ends, dtype=np.int64)), weights)) if len(weights) else 0
    n_bytes = (
        int(np.dot(np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces)), weights)) if len(weights) else 0
    )
    n_chars = (
        int(np.dot(np.fromiter((token_length(p) for p in pieces), dtype=np.int64, count=len(pieces)), weights))
        if len(weights)
        else 0
    )
    return compression_of(n_tokens, n_chars, n_bytes)


def compression_line(c: Mapping[str, Any], what: str = "the training text") -> str:
    return (
        f"compression on {what}: {c['chars']:,} characters ({c['bytes']:,} bytes) -> {c['tokens']:,} tokens, "
        f"{c['chars_per_token']:.2f} chars/token, {c['bytes_per_token']:.2f} bytes/token"
    )


def inspect_tokenizer(
    tok: Tokenizer, k: int = 10, counts: tuple[Sequence[bytes], Counts] | None = None
) -> dict[str, Any]:
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
        f"{report['vocab_size']:,} ids: {report['ordinary_tokens']:,} ordinary tokens ({report['learned_tokens']:,} "
        f"learned by merges), special tokens: {specials}",
        f"shortest: {cells(report['shortest'])}",
        f"longest:  {cells(report['longest'])}",
        f"first:    {cells(report['first'])}",
        f"last:     {cells(report['last'])}",
        "tokens per length (characters): " + ", ".join(f"{n}: {c:,}" for n, c in report["per_length"].items()),
    ]
    never = report["never_used"]
    if never is None:
        lines.append(
            "never used in training: unknown (the tokenizer's training counts are not known; give a store REF)"
        )
    else:
        lines.append(
            f"never used in training: {never['count']:,} learned tokens"
            + (f" (e.g. {cells(never['tokens'])})" if never["tokens"] else "")
        )
        if never["count"]:
            lines.append("  (merged into longer tokens every time they appear: intermediate steps of a merge chain)")
    return "\n".join(lines)
