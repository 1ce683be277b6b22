"""Other tokenizer file formats: GPT-2's encoder.json + vocab.bpe in, HF tokenizer.json out.

GPT-2 stores tokens as printable "byte-encoder" strings (each byte mapped to a visible
character); `byte_to_unicode` is that mapping, shared by both directions.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

from pipeline_lib import bpe_reference as ref
from pipeline_lib.fsio import InputError

if TYPE_CHECKING:
    from pipeline_lib.tokenizer import Tokenizer


@functools.cache
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def gpt2_ranks(encoder_json: bytes, vocab_bpe: bytes, enc_name: str, bpe_name: str) -> dict[bytes, int]:
    """Mergeable ranks from GPT-2's files, cross-checked against each other.

    Byte tokens are ranked in GPT-2's printable order, then one rank per merge line, which
    is how tiktoken builds its ``gpt2`` encoding; `encoder.json` must agree id for id.
    """
    decoder = {c: b for b, c in byte_to_unicode().items()}

    def to_bytes(s: str, where: str) -> bytes:
        try:
            return bytes(decoder[ch] for ch in s)
        except KeyError as e:
            raise InputError(f"{where}: character {e.args[0]!r} is not in GPT-2's byte alphabet") from None

    ranks: dict[bytes, int] = {bytes([b]): i for i, b in enumerate(byte_to_unicode())}
    try:
        lines = vocab_bpe.decode("utf-8").split("\n")
    except UnicodeDecodeError as e:
        raise InputError(f"{bpe_name}: not UTF-8 ({e})") from e
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2:
            raise InputError(f"{bpe_name}:{lineno}: expected two symbols per merge line, got {line[:60]!r}")
        merged = to_bytes(parts[0], f"{bpe_name}:{lineno}") + to_bytes(parts[1], f"{bpe_name}:{lineno}")
        ranks.setdefault(merged, len(ranks))
    try:
        encoder = json.loads(encoder_json)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{enc_name}: not valid JSON ({e})") from e
    expected = {to_bytes(k, enc_name): v for k, v in encoder.items() if k not in ("<|endoftext|>", "<|startoftext|>")}
    if expected != ranks:
        differ = next((k for k in expected if ranks.get(k) != expected[k]), None)
        raise InputError(f"{enc_name} and {bpe_name} disagree (first difference at token {differ!r}): not a matching GPT-2 pair")
    return ranks


def merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Recover an ordered merge list from ranks: each token splits where BPE, limited to
    lower ranks, leaves exactly two parts."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        lower = _RankLimit(ranks, rank)
        parts = ref.bpe_piece(token, lower)
        if len(parts) != 2:
            raise InputError(f"token {token!r} (rank {rank}) cannot be reached by merging two lower-ranked tokens")
        left = lower.bytes_of(parts[0])
        merges.append((left, token[len(left) :]))
    return merges


class _RankLimit(dict):
    """A view of ranks holding only tokens ranked below `limit` (for `merges_from_ranks`)."""

    def __init__(self, ranks: dict[bytes, int], limit: int):
        super().__init__()
        self._ranks, self._limit = ranks, limit
        self._by_rank = {}

    def __contains__(self, key: object) -> bool:
        r = self._ranks.get(key)  # type: ignore[call-overload]
        return r is not None and r < self._limit

    def get(self, key, default=None):
        r = self._ranks.get(key)
        return r if r is not None and r < self._limit else default

    def __getitem__(self, key):
        r = self.get(key)
        if r is None:
            raise KeyError(key)
        self._by_rank[r] = key
        return r

    def bytes_of(self, rank: int) -> bytes:
        return self._by_rank[rank]


def onig_pattern(pattern: str) -> str:
    r"""The split pattern in the Oniguruma dialect HF `tokenizers` uses.

    Oniguruma reads ``{1,3}+`` as "one or more runs of 1-3", not as a possessive
    quantifier, so cl100k's ``\p{N}{1,3}+`` would swallow whole numbers. Possessiveness is
    moot there (nothing follows in that alternative), so the plain ``{1,3}`` is equivalent.
    """
    return pattern.replace("{1,3}+", "{1,3}")


def hf_tokenizer_json(tok: Tokenizer) -> dict[str, Any]:
    """The HF `tokenizers` JSON for `tok`: Split(pattern) + ByteLevel, BPE model, same ids."""
    b2u = byte_to_unicode()

    def show(b: bytes) -> str:
        return "".join(b2u[x] for x in b)

    if tok.merges is not None:
        by_id = {i: b for b, i in tok.mergeable_ranks.items()}
        merges = [(by_id[a], by_id[b]) for a, b, _ in tok.merges]
    else:
        merges = merges_from_ranks(tok.mergeable_ranks)
    vocab = {show(b): i for b, i in tok.mergeable_ranks.items()}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
            for t, i in sorted(tok.special_tokens.items(), key=lambda kv: kv[1])
        ],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": onig_pattern(tok.pattern_str)}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            ],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [[show(a), show(b)] for a, b in merges],
        },
    }
