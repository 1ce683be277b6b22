"""Pre-tokenization split patterns: GPT-2, GPT-4 (cl100k) and o200k, exactly as published.

Only the names and the pattern strings live here; the pure-Python splitter uses them with
the `regex` module and the compiled core implements the same three patterns by hand.
"""

from __future__ import annotations

import functools

import regex

GPT2 = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""

CL100K = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)

O200K = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

PATTERNS: dict[str, str] = {"gpt2": GPT2, "cl100k": CL100K, "o200k": O200K}


def pattern_string(name: str) -> str:
    """Return the regex source for a pattern name (`gpt2`, `cl100k`, `o200k`)."""
    try:
        return PATTERNS[name]
    except KeyError:
        raise ValueError(f"unknown split pattern {name!r}; choose one of {sorted(PATTERNS)}") from None


@functools.cache
def compiled(name: str) -> regex.Pattern:
    return regex.compile(pattern_string(name))
