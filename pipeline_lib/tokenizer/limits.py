"""The vocabulary's limits and the checks every reader and writer of a vocabulary applies:
the largest id and token, the units, special tokens' ids, and `UnknownTokenError`."""

from __future__ import annotations

from typing import Any

from pipeline_lib import bpe_reference as ref
from pipeline_lib.errors import InputError
from pipeline_lib.lazy import is_integer

# Every id (ordinary or special) is below MAX_VOCAB_SIZE: 4,194,304 ids, 20x o200k's. The
# decoder's tables are per id, so this bounds what a file can make us allocate.
MAX_VOCAB_SIZE = 1 << 22
# Longest token: 1 MiB, far beyond any natural token (GPT-2/cl100k/o200k: 128 bytes or
# less) and the default max_token_bytes of training. The compiled core checks both too.
MAX_TOKEN_BYTES = 1 << 20
ENDOFTEXT = "<|endoftext|>"
# The unknown token of char- and word-level vocabularies trained with unknown="unk".
UNK = "<unk>"
UNITS = ref.UNITS
# One line per unit, for --help and manifests.
UNIT_DESCRIPTIONS = {
    "byte": "byte-level BPE: 256 bytes + merges; lossless on any text (GPT-2, tiktoken)",
    "char": "character-level BPE: the corpus's characters + merges; lossless on text made of them, unseen characters "
    "become <unk> or bytes",
    "word": "word BPE with an end-of-word </w> (Sennrich): lossy, whitespace is not kept (nor case with --lowercase, "
    "nor what a --pattern regex does not match); decodes </w> as a space",
}


def check_unit(unit: str) -> str:
    if unit not in UNITS:
        raise InputError(f"unknown unit {unit!r}; choose one of {', '.join(UNITS)}")
    return unit


class UnknownTokenError(InputError, KeyError):
    """A token id, or bytes, that the vocabulary does not have.

    A `KeyError`, as tiktoken raises, and an `InputError` (a `ValueError`), as the rest of
    tokenmill expects for bad input.
    """

    __str__ = Exception.__str__  # KeyError's own would quote the message


def check_id(value: Any, what: str) -> int:
    """`value` as an id: an int (a NumPy integer too, never a bool or a float) in [0, MAX_VOCAB_SIZE)."""
    if not is_integer(value):
        raise InputError(f"{what}: ids must be integers, got {value!r} ({type(value).__name__})")
    if not 0 <= value < MAX_VOCAB_SIZE:
        raise InputError(f"{what}: id {value} is outside [0, {MAX_VOCAB_SIZE}) (MAX_VOCAB_SIZE)")
    return int(value)


def check_token_length(n: int, what: str) -> None:
    if n > MAX_TOKEN_BYTES:
        raise InputError(f"{what}: a token of {n} bytes is longer than MAX_TOKEN_BYTES ({MAX_TOKEN_BYTES})")


def check_special(tok: Any, i: Any, where: str = "") -> int:
    """The id of special token `tok`, checked; `where` prefixes messages (a file name)."""
    what = f"{where}special_tokens[{str(tok)[:40]!r}]"
    if not isinstance(tok, str) or not tok:
        raise InputError(f"{what}: a special token must be a non-empty string, got {tok!r}")
    try:
        n = len(tok.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise InputError(f"{what}: not encodable as UTF-8 ({e.reason})") from None
    check_token_length(n, what)
    return check_id(i, what)
