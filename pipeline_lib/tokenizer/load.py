"""Tokenizer files, through fsspec (any local path or URL): save, load, and other formats in.

`save` writes ``vocab.tiktoken`` (``base64(token) rank`` per line, tiktoken's format),
``merges.txt`` for a trained tokenizer (``left_id right_id merged_id count`` per line, in the
order learned: the count is the merged pair's count when it was merged) and
``tokenmill.json`` (unit, pattern, special tokens, vocabulary size and the sha256 of the
other files, checked on `load`). The pattern is stored as its name (``gpt2``, ``cl100k``,
``o200k``, ``none``) or, for a custom split, as the regex source itself; ``pattern_str`` is
the regex that runs. Files written before units and merges existed (no ``unit``, no
``merges.txt``) load as byte-level with no merges. `from_tiktoken` reads a ``.tiktoken``
ranks file (``.gz`` too), `from_gpt2` GPT-2's ``encoder.json`` + ``vocab.bpe``. No pickle
anywhere.

Limits: a ranks file is at most ``MAX_VOCAB_FILE_BYTES``, a manifest ``MAX_META_FILE_BYTES``;
ranks are decimal digits below ``MAX_VOCAB_SIZE``, tokens at most ``MAX_TOKEN_BYTES`` long.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from pipeline_lib.formats import gpt2_vocab
from pipeline_lib.fsio import InputError, filesystem, read_bytes, write_bytes_atomic
from pipeline_lib.patterns import check_pattern
from pipeline_lib.tokenizer import native
from pipeline_lib.tokenizer.limits import MAX_TOKEN_BYTES, MAX_VOCAB_SIZE, UNITS, check_special, check_token_length

if TYPE_CHECKING:
    from pipeline_lib.tokenizer.core import Tokenizer

FORMAT = "tokenmill.tokenizer/1"
RANKS_FILE = "vocab.tiktoken"
MERGES_FILE = "merges.txt"
META_FILE = "tokenmill.json"
MAX_VOCAB_FILE_BYTES = 64 << 20
MAX_META_FILE_BYTES = 1 << 20


def ranks_text(tok: Tokenizer) -> bytes:
    """The ``vocab.tiktoken`` file. Raises InputError if `load` would refuse it (too big)."""
    lines = [
        base64.b64encode(b) + b" " + str(i).encode()
        for b, i in sorted(tok.mergeable_ranks.items(), key=lambda kv: kv[1])
    ]
    text = b"\n".join(lines) + b"\n"
    if len(text) > MAX_VOCAB_FILE_BYTES:
        raise InputError(
            f"the ranks file of this vocabulary would be {len(text)} bytes, above the"
            f" {MAX_VOCAB_FILE_BYTES} (MAX_VOCAB_FILE_BYTES) that loading accepts; train with a smaller"
            " max_token_bytes or vocab_size"
        )
    return text


def merges_text(tok: Tokenizer) -> bytes | None:
    """The ``merges.txt`` file, or None for a tokenizer with no merge list (loaded from ranks)."""
    if tok.merges is None:
        return None
    counts = tok.merge_counts if tok.merge_counts is not None else [0] * len(tok.merges)
    return "".join(f"{a} {b} {x} {c}\n" for (a, b, x), c in zip(tok.merges, counts)).encode()


def metadata(tok: Tokenizer) -> dict[str, Any]:
    """The ``tokenmill.json`` content."""
    ranks = ranks_text(tok)
    merges = merges_text(tok)
    meta = {
        "format": FORMAT,
        "name": tok.name,
        "unit": tok.unit,
        "lossy": tok.lossy,
        "pattern": tok.pattern,
        "pattern_str": tok.pattern_str,
        "special_tokens": tok.special_tokens,
        "vocab_size": tok.vocab_size,
        "n_ranks": len(tok.mergeable_ranks),
        "ranks_file": RANKS_FILE,
        "ranks_sha256": hashlib.sha256(ranks).hexdigest(),
    }
    if tok.unit != "byte":
        meta["unknown"] = tok.unknown
    if tok.unit == "word":
        meta["lowercase"] = tok.lowercase
        meta["end_of_word"] = "</w> (stored as the byte 0xFF in vocab.tiktoken; decoded as a space)"
    if merges is not None:
        meta.update(
            merges_file=MERGES_FILE,
            merges_sha256=hashlib.sha256(merges).hexdigest(),
            merge_counts=tok.merge_counts is not None,
        )
    return meta


def files(tok: Tokenizer) -> dict[str, bytes]:
    """The tokenizer's files by name: what `save` writes and `load` reads."""
    out = {RANKS_FILE: ranks_text(tok)}
    merges = merges_text(tok)
    if merges is not None:
        out[MERGES_FILE] = merges
    out[META_FILE] = json.dumps(metadata(tok), indent=2, ensure_ascii=False).encode()
    return out


def save(tok: Tokenizer, url: str, **storage_options: Any) -> None:
    """Write the tokenizer's files (`files`) into the directory `url`, ``tokenmill.json`` last."""
    fs, root = filesystem(url, **storage_options)
    fs.makedirs(root, exist_ok=True)
    for name, data in files(tok).items():
        write_bytes_atomic(fs, f"{root}/{name}", data)


def load(cls: type[Tokenizer], url: str, **storage_options: Any) -> Tokenizer:
    """Load a tokenizer saved by `save`, checking the ranks file's sha256.

    Raises:
        InputError: a missing, corrupt or tampered file, named in the message.
    """
    meta_url = f"{url.rstrip('/')}/{META_FILE}"
    raw = read_bytes(meta_url, MAX_META_FILE_BYTES, **storage_options)
    try:
        meta = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{meta_url}: not valid JSON ({e})") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise InputError(
            f"{meta_url}: not a tokenmill tokenizer file (format "
            f"{meta.get('format') if isinstance(meta, dict) else None!r}, expected {FORMAT!r})"
        )
    for key in ("pattern", "special_tokens", "ranks_sha256"):
        if key not in meta:
            raise InputError(f"{meta_url}: missing field {key!r}")
    try:
        check_pattern(meta["pattern"])
    except InputError as e:
        raise InputError(f"{meta_url}: {e}") from None
    unit = meta.get("unit", "byte")
    if unit not in UNITS:
        raise InputError(f"{meta_url}: unknown unit {unit!r} (expected one of {', '.join(UNITS)})")
    ranks_url = f"{url.rstrip('/')}/{RANKS_FILE}"
    data = read_bytes(ranks_url, MAX_VOCAB_FILE_BYTES, **storage_options)
    digest = hashlib.sha256(data).hexdigest()
    if digest != meta["ranks_sha256"]:
        raise InputError(
            f"{ranks_url}: sha256 {digest[:12]}… does not match {meta_url} "
            f"({meta['ranks_sha256'][:12]}…): the file is corrupt or was changed"
        )
    specials = meta["special_tokens"]
    if not isinstance(specials, dict):
        raise InputError(f"{meta_url}: special_tokens must map strings to integer ids")
    for tok, i in specials.items():
        check_special(tok, i, f"{meta_url}: ")
    merges, merge_counts = None, None
    if "merges_file" in meta:
        merges_url = f"{url.rstrip('/')}/{MERGES_FILE}"
        raw_merges = read_bytes(merges_url, MAX_VOCAB_FILE_BYTES, **storage_options)
        digest = hashlib.sha256(raw_merges).hexdigest()
        if digest != meta.get("merges_sha256"):
            raise InputError(
                f"{merges_url}: sha256 {digest[:12]}… does not match {meta_url}: the file is corrupt or was changed"
            )
        merges, merge_counts = parse_merges(raw_merges, merges_url)
        if not meta.get("merge_counts", True):
            merge_counts = None
    return cls(
        RanksFile(data, ranks_url),
        meta["pattern"],
        specials,
        name=meta.get("name", "tokenmill"),
        merges=merges,
        merge_counts=merge_counts,
        unit=unit,
        unknown=meta.get("unknown"),
        lowercase=bool(meta.get("lowercase", False)),
    )


def parse_merges(data: bytes, source: str) -> tuple[list[tuple[int, int, int]], list[int]]:
    """Parse ``left right merged count`` lines (decimal integers), naming the file and line of any error."""
    merges: list[tuple[int, int, int]] = []
    counts: list[int] = []
    for lineno, line in enumerate(data.splitlines(), start=1):
        parts = line.split()
        if len(parts) != 4 or not all(p.isdigit() for p in parts):
            raise InputError(
                f"{source}:{lineno}: expected 'left_id right_id merged_id count' (non-negative "
                f"integers), got {line[:60]!r}"
            )
        a, b, x, c = map(int, parts)
        if max(a, b, x) >= MAX_VOCAB_SIZE:
            raise InputError(f"{source}:{lineno}: an id is outside [0, {MAX_VOCAB_SIZE}) (MAX_VOCAB_SIZE)")
        merges.append((a, b, x))
        counts.append(c)
    return merges, counts


def from_tiktoken(
    cls: type[Tokenizer],
    path_or_url: str,
    pattern: str = "cl100k",
    special_tokens: Mapping[str, int] | None = None,
    **storage_options: Any,
) -> Tokenizer:
    """Load a ``.tiktoken`` ranks file (optionally ``.gz``), e.g. cl100k_base or o200k_base."""
    data = read_bytes(path_or_url, MAX_VOCAB_FILE_BYTES, **storage_options)
    name = os.path.basename(path_or_url).split(".")[0]
    return cls(RanksFile(data, path_or_url), pattern, special_tokens, name=name)


def from_gpt2(
    cls: type[Tokenizer], encoder_json: str, vocab_bpe: str, pattern: str = "gpt2", **storage_options: Any
) -> Tokenizer:
    """Load GPT-2's ``encoder.json`` + ``vocab.bpe`` (or a pair `to_gpt2` wrote: ``vocab.json``
    + ``merges.txt``): ids from the encoder, special tokens its entries that no merge makes
    (`formats.gpt2_vocab`); GPT-2's own files give tiktoken's ``gpt2``. The files hold no
    split pattern: `pattern` names it."""
    enc = read_bytes(encoder_json, MAX_VOCAB_FILE_BYTES, **storage_options)
    bpe = read_bytes(vocab_bpe, MAX_VOCAB_FILE_BYTES, **storage_options)
    ranks, specials = gpt2_vocab(enc, bpe, encoder_json, vocab_bpe)
    for tok, i in specials.items():
        check_special(tok, i, f"{encoder_json}: ")
    return cls(
        ranks,
        pattern,
        specials,
        name="gpt2" if pattern == "gpt2" else os.path.basename(os.path.dirname(encoder_json)) or "tokenmill",
    )


class RanksFile:
    """A tiktoken ranks file's bytes (`base64(token) rank` lines) as `Tokenizer`'s ranks: the
    core parses it and builds the encoder from it with no Python object per token, and the
    ``{token: id}`` dict, which a program that only encodes never reads, is made on first use
    (building it, checking it and handing it to the core took cl100k's load ~70 ms of ~170).

    `source` names the file in the errors of a file that is not well formed; None for a
    published file whose sha256 the caller checked (`get_encoding`)."""

    __slots__ = ("data", "source")

    def __init__(self, data: bytes, source: str | None = None) -> None:
        self.data = data
        self.source = source

    def parse(self) -> dict[bytes, int]:
        """The ``{token: id}`` of the lines (`parse_tiktoken_ranks`, which names a bad line)."""
        return parse_tiktoken_ranks(self.data, self.source or "the ranks file")


# A block of well-formed ranks lines: what the fast path of `parse_tiktoken_ranks` takes whole.
_RANKS_BLOCK = re.compile(rb"(?:[ \t]*[A-Za-z0-9+/]+={0,2}[ \t]+[0-9]+[ \t]*(?:\r\n|\n|\r)|[ \t]*(?:\r\n|\n|\r))*")
# Lines are parsed a block at a time so the temporary lists stay small beside the result.
_RANKS_BLOCK_BYTES = 1 << 20


def parse_tiktoken_ranks(data: bytes, source: str) -> dict[bytes, int]:
    """Parse ``base64(token) rank`` lines, naming the file and line of any error.

    Ranks are decimal digits below MAX_VOCAB_SIZE; tokens at most MAX_TOKEN_BYTES long.
    Linear in the file: the core parses a well-formed file in one pass (without the core,
    blocks of lines are checked by one regex and converted with C-level maps); a file that is
    not well formed is parsed line by line (`_parse_ranks_lines`), which names the bad line.
    """
    parsed = native._CORE.parse_ranks(data) if native._CORE is not None else _parse_ranks_blocks(data)
    if parsed is None:
        return _parse_ranks_lines(data, source)
    if not parsed:
        raise InputError(f"{source}: no tokens in the file")
    return parsed


def _parse_ranks_blocks(data: bytes) -> dict[bytes, int] | None:
    """The ranks of a well-formed file, a block of lines at a time, or None if it is not well
    formed: the core's `parse_ranks` in Python."""
    ranks: dict[bytes, int] = {}
    if not data.endswith((b"\n", b"\r")):
        data += b"\n"
    start = 0
    while start < len(data):
        end = data.find(b"\n", start + _RANKS_BLOCK_BYTES)
        end = len(data) if end < 0 else end + 1
        block = data[start:end]
        start = end
        if not _RANKS_BLOCK.fullmatch(block):
            return None
        fields = block.split()
        try:
            tokens = [binascii.a2b_base64(t, strict_mode=True) for t in fields[0::2]]
        except binascii.Error:
            return None
        ids = list(map(int, fields[1::2]))
        n_before = len(ranks)
        ranks.update(zip(tokens, ids))
        if (
            len(ranks) != n_before + len(tokens)
            or (ids and max(ids) >= MAX_VOCAB_SIZE)
            or max(map(len, tokens), default=0) > MAX_TOKEN_BYTES
        ):
            return None
    return ranks


def _parse_ranks_lines(data: bytes, source: str) -> dict[bytes, int]:
    """`parse_tiktoken_ranks` one line at a time: slower, and names the first bad line."""
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2:
            raise InputError(f"{source}:{lineno}: expected 'base64-token rank', got {line[:60]!r}")
        if not parts[1].isdigit():  # ASCII digits only: no sign, no '_', no exponent
            raise InputError(f"{source}:{lineno}: cannot parse {line[:60]!r} (the rank must be a non-negative integer)")
        try:
            token = base64.b64decode(parts[0], validate=True)
            rank = int(parts[1])
        except (binascii.Error, ValueError) as e:
            raise InputError(f"{source}:{lineno}: cannot parse {line[:60]!r} ({e})") from e
        if rank >= MAX_VOCAB_SIZE:
            raise InputError(f"{source}:{lineno}: rank {rank} is outside [0, {MAX_VOCAB_SIZE}) (MAX_VOCAB_SIZE)")
        if len(token) > MAX_TOKEN_BYTES:
            check_token_length(len(token), f"{source}:{lineno}")
        if token in ranks:
            raise InputError(f"{source}:{lineno}: token {token!r} appears twice")
        ranks[token] = rank
    if not ranks:
        raise InputError(f"{source}: no tokens in the file")
    return ranks


# Blocks in which `find_special_in_file` scans a file; consecutive blocks overlap by the
# longest token less one byte, so a token across a block boundary is found.
SCAN_BLOCK_BYTES = 8 << 20


def find_special_in_file(
    path: str, tokens: Collection[str], block_bytes: int = SCAN_BLOCK_BYTES
) -> tuple[str, int] | None:
    """The first of `tokens` in the file at `path` and its byte offset, or None: read a block
    at a time (memory bounded by the block), so a command that will refuse a file refuses
    it before reading all of it."""
    if not tokens:
        return None
    needles = sorted((t.encode("utf-8") for t in tokens), key=len, reverse=True)
    pattern = re.compile(b"|".join(map(re.escape, needles)))
    overlap = max(map(len, needles)) - 1
    with open(path, "rb") as f:
        offset, tail = 0, b""  # offset: where `tail` starts in the file
        block = f.read(block_bytes)
        while block:
            following = f.read(block_bytes)
            window = tail + block
            # A match in the last `overlap` bytes may be a shorter token's, the longer one
            # cut by the block's end: it is decided with the next block.
            decided = len(window) - overlap if following else len(window)
            if (found := pattern.search(window)) and found.start() < decided:
                return found.group().decode("utf-8"), offset + found.start()
            keep = min(overlap, len(window))
            offset += len(window) - keep
            tail = window[len(window) - keep :] if keep else b""
            block = following
    return None


# HF `tokenizers`' ByteLevel pre-tokenizer with use_regex=True splits with GPT-2's regex.
_HF_BYTE_LEVEL_REGEX = "gpt2"


def from_hf_json(cls: type[Tokenizer], url: str, **storage_options: Any) -> Tokenizer:
    """Load a HF ``tokenizer.json`` holding byte-level BPE (GPT-2, Llama 3, Qwen 2 style):
    ranks from the vocabulary and merges (`formats.gpt2_vocab`: merges in id order, so
    tiktoken's rule gives HF's ids), the split regex of its pre-tokenizer, its added tokens
    as special tokens (encoded as ids only when allowed, as everywhere here).

    Ids equal HF's ``encode(text, add_special_tokens=False)``: a post-processor's BOS/EOS
    template is not applied.

    Raises:
        InputError: anything that is not byte-level BPE tokenizers' way (a Unigram, WordPiece
            or WordLevel model, a normalizer, a pre-tokenizer other than ByteLevel alone or
            Split(regex, Isolated) + ByteLevel, dropout, subword prefixes or suffixes, byte
            fallback), named with the field.
    """
    raw = read_bytes(url, MAX_VOCAB_FILE_BYTES, **storage_options)
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{url}: not valid JSON ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
        raise InputError(f"{url}: not a HF tokenizer.json (no 'model' object)")

    def refuse(field: str, what: Any, why: str) -> InputError:
        return InputError(
            f"{url}: {field} {json.dumps(what)[:120]} is not supported: {why}; tokenmill loads "
            "byte-level BPE tokenizer.json files only"
        )

    model = doc["model"]
    if model.get("type", "BPE") != "BPE":
        raise refuse("model.type", model.get("type"), "only BPE models load (not Unigram, WordPiece or WordLevel)")
    for field, unsupported in (
        ("dropout", (None, 0, 0.0)),
        ("continuing_subword_prefix", (None, "")),
        ("end_of_word_suffix", (None, "")),
        ("byte_fallback", (None, False)),
    ):
        if model.get(field) not in unsupported:
            raise refuse(f"model.{field}", model.get(field), "tiktoken-style BPE has no such option")
    if doc.get("normalizer") is not None:
        raise refuse("normalizer", doc["normalizer"], "tokenmill applies no normalizer, so ids would differ")
    pattern = _hf_pattern(doc.get("pre_tokenizer"), refuse)
    vocab, merges = model.get("vocab"), model.get("merges")
    if not isinstance(vocab, dict) or not isinstance(merges, list):
        raise InputError(f"{url}: model.vocab must be an object and model.merges a list")
    lines = []
    for k, m in enumerate(merges):
        pair = m.split(" ") if isinstance(m, str) else m
        if not (
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) and p and " " not in p for p in pair)
        ):
            raise InputError(f"{url}: model.merges[{k}] is not a pair of symbols: {json.dumps(m)[:80]}")
        lines.append(" ".join(pair))
    encoder_json = json.dumps(vocab).encode()
    vocab_bpe = ("#version: 0.2\n" + "\n".join(lines) + "\n").encode()
    ranks, specials = gpt2_vocab(encoder_json, vocab_bpe, f"{url} (model.vocab)", f"{url} (model.merges)")
    ordinary_ids = set(ranks.values())
    # HF's ids for added tokens, not the file's "id" fields: a token in model.vocab takes its
    # id there; any other the next id after the vocabulary's size and the added ids so far.
    last_added = len(vocab) - 1
    for k, added in enumerate(doc.get("added_tokens") or []):
        if not isinstance(added, dict) or not isinstance(added.get("content"), str):
            raise InputError(f"{url}: added_tokens[{k}] needs a string 'content'")
        content = added["content"]
        i = vocab[content] if content in vocab else last_added + 1
        last_added = max(last_added, i)
        if i not in ordinary_ids:  # else an ordinary token, which encodes to that id anyway
            specials[content] = i
    for tok, i in specials.items():
        check_special(tok, i, f"{url}: ")
    name = os.path.basename(os.path.dirname(url.rstrip("/"))) or "tokenizer"
    return cls(ranks, pattern, specials, name=name)


def _hf_pattern(pre: Any, refuse: Any) -> str:
    """The split pattern of a byte-level pre-tokenizer: a name where the regex is one of
    ours (the compiled core splits it), else the regex itself (Oniguruma's syntax is the
    `regex` module's for these patterns)."""
    from pipeline_lib.formats import onig_pattern
    from pipeline_lib.patterns import PATTERNS

    steps = pre.get("pretokenizers") if isinstance(pre, dict) and pre.get("type") == "Sequence" else [pre]
    if not isinstance(steps, list) or not steps or not all(isinstance(s, dict) for s in steps):
        raise refuse("pre_tokenizer", pre, "byte-level BPE needs a ByteLevel pre-tokenizer")
    byte_level = steps[-1]
    if byte_level.get("type") != "ByteLevel":
        raise refuse("pre_tokenizer", pre, "byte-level BPE ends its pre-tokenizer with ByteLevel")
    if byte_level.get("add_prefix_space"):
        raise refuse("pre_tokenizer ByteLevel.add_prefix_space", True, "tokenmill adds no space before the text")
    splits = steps[:-1]
    if byte_level.get("use_regex", True):
        if splits:
            raise refuse("pre_tokenizer", pre, "a Split before a ByteLevel that splits again")
        return _HF_BYTE_LEVEL_REGEX
    if len(splits) != 1:
        raise refuse(
            "pre_tokenizer", pre, "one Split(regex) before ByteLevel(use_regex=false) is the split tokenmill runs"
        )
    split = splits[0]
    regex_source = split.get("pattern", {}).get("Regex") if isinstance(split.get("pattern"), dict) else None
    if (
        split.get("type") != "Split"
        or not isinstance(regex_source, str)
        or split.get("behavior") != "Isolated"
        or split.get("invert")
    ):
        raise refuse("pre_tokenizer", split, "only Split with a Regex pattern, behavior Isolated and invert false")
    for name, source in PATTERNS.items():
        if regex_source in (source, onig_pattern(source)):
            return name
    try:
        return check_pattern(regex_source)
    except InputError as e:
        raise refuse("pre_tokenizer Split.pattern", regex_source, str(e)) from None
