"""Pre-tokenization split patterns: GPT-2, GPT-4 (cl100k) and o200k, exactly as published,
``none`` (no split) and custom regular expressions.

A pattern is one of:

* a name, ``gpt2``, ``cl100k`` or ``o200k``: the pure-Python splitter runs the published
  regex with the `regex` module, the compiled core the same pattern written by hand;
* ``none``: no split, a whole text is one piece, so merges may cross spaces (minbpe's
  ``BasicTokenizer``); the compiled core does this too;
* any other string: a regular expression (`regex` module syntax), as tiktoken, HF and minbpe
  allow. The text is split in Python; the pieces go to the compiled core. Text between two
  matches becomes a piece of its own, so encoding stays lossless whatever the regex. A
  tokenizer stores such a pattern as its regex source (``tokenmill.json``'s ``pattern``).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from pipeline_lib.errors import InputError
from pipeline_lib.lazy import LazyModule

if TYPE_CHECKING:
    import regex
else:  # for custom regexes and the pure-Python splitter: the core splits the named patterns
    regex = LazyModule(globals(), "regex", "regex")

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
# A custom regex is user input and the `regex` module backtracks: ``(a|aa)+$`` takes time
# exponential in the text. Each call gets this budget (seconds, wall clock: the module's own
# timeout), far above what a regex linear in its text needs (~0.4 us per character here),
# so only a runaway regex meets it, and then it ends in `PatternTimeoutError`.
CUSTOM_BUDGET_S = 1.0
CUSTOM_BUDGET_S_PER_CHAR = 10e-6
NO_SPLIT = "none"
# Longest custom regex accepted: a pattern travels in configs, version ids and file headers.
MAX_PATTERN_CHARS = 4096


def check_pattern(pattern: str) -> str:
    """`pattern` itself if it is a name, ``none`` or a regex that compiles.

    Raises:
        InputError: anything else, naming the pattern and what is wrong with it.
    """
    if not isinstance(pattern, str):
        raise InputError(f"pattern must be a string (a name or a regex), got {pattern!r}")
    if pattern in PATTERNS or pattern == NO_SPLIT:
        return pattern
    if not pattern:
        raise InputError(
            f"pattern is empty; give one of {', '.join(sorted(PATTERNS))}, {NO_SPLIT} or a regular expression"
        )
    if regex.fullmatch(r"\w+", pattern):
        raise InputError(
            f"unknown pattern: give 'none', a regex, or one of 'gpt2', 'cl100k' or 'o200k', got {pattern!r}"
            " (a bare word that is no name is taken for a misspelt name; to split on that literal text write "
            f"(?:{pattern}))"
        )
    if len(pattern) > MAX_PATTERN_CHARS:
        raise InputError(
            f"pattern is {len(pattern)} characters long, longer than {MAX_PATTERN_CHARS} (MAX_PATTERN_CHARS)"
        )
    try:
        compiled(pattern)
    except regex.error as e:
        raise InputError(
            f"pattern {pattern[:80]!r} is not a valid regular expression ({e}); give one of "
            f"{', '.join(sorted(PATTERNS))}, {NO_SPLIT} or a regex that compiles"
        ) from None
    return pattern


def is_custom(pattern: str) -> bool:
    """A custom regex (split in Python), not a name the compiled core implements nor ``none``."""
    return pattern not in PATTERNS and pattern != NO_SPLIT


def pattern_string(pattern: str) -> str:
    """The regex source of a pattern: a name's published regex, ``""`` for ``none``, a custom regex itself.

    Raises:
        InputError (a ValueError): not a name, ``none`` or a valid regex.
    """
    check_pattern(pattern)
    if pattern == NO_SPLIT:
        return ""
    return PATTERNS.get(pattern, pattern)


@functools.lru_cache(maxsize=64)
def compiled(pattern: str) -> regex.Pattern:
    """The compiled regex of a name or of a custom regex."""
    return regex.compile(PATTERNS.get(pattern, pattern))


class PatternTimeoutError(InputError):
    """A custom regex ran past its time budget: catastrophic backtracking, most likely."""


def budget_s(text: str) -> float:
    """The time a custom regex may take over `text` in one call (see CUSTOM_BUDGET_S)."""
    return CUSTOM_BUDGET_S + CUSTOM_BUDGET_S_PER_CHAR * len(text)


def _timed_out(pattern: str, text: str) -> PatternTimeoutError:
    return PatternTimeoutError(
        f"--pattern {pattern[:80]!r}: the regex ran past its budget of {budget_s(text):.1f} s on {len(text)} characters"
        " (catastrophic backtracking: nested or overlapping repeats such as (a|aa)+ or (a+)+);"
        " rewrite it with possessive quantifiers (a++) or atomic groups ((?>...)), or use a named pattern (gpt2, "
        "cl100k, o200k)"
    )


def custom_finditer(pattern: str, text: str) -> list[regex.Match]:
    """All matches of a custom regex in `text`, within the time budget.

    Raises:
        PatternTimeoutError (an InputError): the regex ran past `budget_s` (it names ``--pattern``).
    """
    try:
        return list(compiled(pattern).finditer(text, timeout=budget_s(text)))
    except TimeoutError:
        raise _timed_out(pattern, text) from None


def custom_fullmatch(pattern: str, text: str) -> bool:
    """Whether a custom regex matches all of `text`, within the time budget (raises as `custom_finditer`)."""
    try:
        return compiled(pattern).fullmatch(text, timeout=budget_s(text)) is not None
    except TimeoutError:
        raise _timed_out(pattern, text) from None
