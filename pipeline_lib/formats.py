"""Other tokenizer file formats: GPT-2's encoder.json + vocab.bpe (HF's vocab.json +
merges.txt) in and out, HF tokenizer.json out; the same ids, special tokens included. And the
header of the `.npy` files of ids that are written before their length is known.

GPT-2 stores tokens as printable "byte-encoder" strings (each byte mapped to a visible
character); `byte_to_unicode` is that mapping, shared by both directions.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, cast

from pipeline_lib import bpe_reference as ref
from pipeline_lib.fsio import InputError

# A .npy of ids written as they come has a header of a fixed length, rewritten with the count at
# the end (the token shards, the file command's output).
NPY_HEADER_LEN = 128


def npy_header(descr: str, n: int) -> bytes:
    """A .npy (version 1.0) header of a 1-d array of `n` items of dtype `descr` (e.g. '<u4'),
    always NPY_HEADER_LEN bytes long."""
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }" % (descr, n)
    body = header.ljust(NPY_HEADER_LEN - 10 - 1) + "\n"
    out = b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body.encode("ascii")
    assert len(out) == NPY_HEADER_LEN
    return out


class Tokenizer(Protocol):
    """What the writers read of a tokenizer (`pipeline_lib.tokenizer.Tokenizer` has it): this
    module knows formats, not the tokenizer package, which imports it."""

    @property
    def mergeable_ranks(self) -> dict[bytes, int]: ...

    @property
    def special_tokens(self) -> Mapping[str, int]: ...

    @property
    def merges(self) -> Sequence[tuple[int, int, int]] | None: ...

    @property
    def pattern_str(self) -> str: ...


@functools.cache
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def gpt2_vocab(
    encoder_json: bytes, vocab_bpe: bytes, enc_name: str, bpe_name: str
) -> tuple[dict[bytes, int], dict[str, int]]:
    """Mergeable ranks and special tokens from a GPT-2 style pair: ``encoder.json`` (HF's
    ``vocab.json``: byte-encoder string -> id) and ``vocab.bpe`` (``merges.txt``: one merge
    per line, highest priority first, after a ``#version`` line).

    Ids come from the encoder. Every byte must be there, and every merge's parts and result;
    results must have increasing ids down the file, so that tiktoken's rule (lowest id
    first) merges in GPT-2's order (line order) and both give the same ids. Encoder entries
    neither a byte nor a merge result are the special tokens, spelled as they are (GPT-2's
    ``<|endoftext|>``). For GPT-2's own files this is tiktoken's ``gpt2`` encoding.
    """
    decoder = {c: b for b, c in byte_to_unicode().items()}
    try:
        encoder = json.loads(encoder_json)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{enc_name}: not valid JSON ({e})") from e
    if not isinstance(encoder, dict) or not all(type(v) is int and v >= 0 for v in encoder.values()):
        raise InputError(f"{enc_name}: expected a JSON object mapping tokens to non-negative integer ids")
    ranks: dict[bytes, int] = {}
    for b, ch in byte_to_unicode().items():
        if ch not in encoder:
            raise InputError(f"{enc_name}: no token for byte {b} ({ch!r}): not a byte-level GPT-2 vocabulary")
        ranks[bytes([b])] = encoder[ch]
    reached = set(byte_to_unicode().values())
    try:
        lines = vocab_bpe.decode("utf-8").split("\n")
    except UnicodeDecodeError as e:
        raise InputError(f"{bpe_name}: not UTF-8 ({e})") from e
    last = -1
    for lineno, line in enumerate(lines, start=1):
        if not line.strip() or (lineno == 1 and line.startswith("#")):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise InputError(f"{bpe_name}:{lineno}: expected two symbols per merge line, got {line[:60]!r}")
        merged = parts[0] + parts[1]
        for s in (*parts, merged):
            if s not in encoder:
                raise InputError(f"{bpe_name}:{lineno}: {s!r} is not in {enc_name}: not a matching pair")
        try:
            token = bytes(decoder[ch] for ch in merged)
        except KeyError as e:
            raise InputError(f"{bpe_name}:{lineno}: character {e.args[0]!r} is not in GPT-2's byte alphabet") from None
        if merged in reached:
            continue  # a repeated rule: the first one counts (as in GPT-2's encoder.py)
        if encoder[merged] <= last:
            raise InputError(
                f"{bpe_name}:{lineno}: {merged!r} has id {encoder[merged]} in {enc_name}, not above the previous "
                "merge's"
                f" {last}: merges must be in id order for the ids to be GPT-2's"
            )
        last = encoder[merged]
        reached.add(merged)
        ranks[token] = last
    specials = {t: i for t, i in encoder.items() if t not in reached}
    return ranks, specials


def gpt2_ranks(encoder_json: bytes, vocab_bpe: bytes, enc_name: str, bpe_name: str) -> dict[bytes, int]:
    """The mergeable ranks of `gpt2_vocab` (how tiktoken builds its ``gpt2`` encoding)."""
    return gpt2_vocab(encoder_json, vocab_bpe, enc_name, bpe_name)[0]


def merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Recover an ordered merge list from ranks: each token splits where BPE, limited to
    lower ranks, leaves exactly two parts."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        # BPE with only the lower ranks (an o200k export asks 200,000 times: no rank-limiting view)
        parts = cast("list[bytes]", ref.merge_parts([token[i : i + 1] for i in range(len(token))], ranks, below=rank))
        if len(parts) != 2:
            raise InputError(f"token {token!r} (rank {rank}) cannot be reached by merging two lower-ranked tokens")
        merges.append((parts[0], parts[1]))
    return merges


def onig_pattern(pattern: str) -> str:
    r"""The split pattern in the Oniguruma dialect HF `tokenizers` uses.

    Oniguruma reads ``{1,3}+`` as "one or more runs of 1-3", not as a possessive
    quantifier, so cl100k's ``\p{N}{1,3}+`` would swallow whole numbers. Possessiveness is
    moot there (nothing follows in that alternative), so the plain ``{1,3}`` is equivalent.
    """
    return pattern.replace("{1,3}+", "{1,3}")


def _show(b: bytes) -> str:
    b2u = byte_to_unicode()
    return "".join(b2u[x] for x in b)


def merge_list(tok: Tokenizer) -> list[tuple[bytes, bytes]]:
    """`tok`'s merges in priority order (by the merged token's id): the trained list when it
    has one, else recovered from the ranks (`merges_from_ranks`)."""
    if tok.merges is None:
        return merges_from_ranks(tok.mergeable_ranks)
    by_id = {i: b for b, i in tok.mergeable_ranks.items()}
    return [(by_id[a], by_id[b]) for a, b, _ in sorted(tok.merges, key=lambda m: m[2])]


def gpt2_style_vocab(tok: Tokenizer) -> dict[str, int]:
    """Byte-encoder string -> id for every token, the special tokens spelled as they are.

    HF `tokenizers` takes an added token's id from the model's vocabulary when it is there,
    else gives it the next free id (so cl100k's ``<|endoftext|>``, 100257 after a gap, would
    load as 100256): the special tokens go into the vocabulary, as in GPT-2's own files.

    Raises:
        InputError: a special token spelled like an ordinary token's byte-encoder string
            (one vocabulary cannot give that string two ids).
    """
    vocab = {_show(b): i for b, i in sorted(tok.mergeable_ranks.items(), key=lambda kv: kv[1])}
    for t, i in sorted(tok.special_tokens.items(), key=lambda kv: kv[1]):
        if t in vocab:
            raise InputError(
                f"special token {t!r} (id {i}) is spelled like the ordinary token with id {vocab[t]} in GPT-2's byte"
                " alphabet: a GPT-2 / HF vocabulary cannot give one string two ids; rename the special token"
            )
        vocab[t] = i
    return dict(sorted(vocab.items(), key=lambda kv: kv[1]))


def gpt2_files(tok: Tokenizer) -> dict[str, bytes]:
    """GPT-2's own format for `tok`: ``vocab.json`` (GPT-2's ``encoder.json``) and
    ``merges.txt`` (its ``vocab.bpe``), which `gpt2_vocab` reads back to the same ids.
    The split pattern is not part of the format: pass it when loading."""
    vocab = gpt2_style_vocab(tok)
    lines = ["#version: 0.2"] + [f"{_show(a)} {_show(b)}" for a, b in merge_list(tok)]
    return {
        "vocab.json": json.dumps(vocab, ensure_ascii=False).encode(),
        "merges.txt": ("\n".join(lines) + "\n").encode(),
    }


def hf_added_tokens(tok: Tokenizer) -> list[dict[str, Any]]:
    """The special tokens as HF `tokenizers` ``added_tokens``, in id order."""
    return [
        {
            "id": i,
            "content": t,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for t, i in sorted(tok.special_tokens.items(), key=lambda kv: kv[1])
    ]


def hf_tokenizer_json(tok: Tokenizer) -> dict[str, Any]:
    """The HF `tokenizers` JSON for `tok`: Split(pattern) + ByteLevel, BPE model, same ids
    (the special tokens included: they sit in the BPE vocabulary too, see `gpt2_style_vocab`)."""
    vocab = gpt2_style_vocab(tok)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": hf_added_tokens(tok),
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": onig_pattern(tok.pattern_str)},
                    "behavior": "Isolated",
                    "invert": False,
                },
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
            "merges": [[_show(a), _show(b)] for a, b in merge_list(tok)],
        },
    }
