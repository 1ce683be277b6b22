"""How well a tokenization compresses a text: shared by the lab and its comparisons."""

from __future__ import annotations

from typing import Any


def compression_of(n_tokens: int, n_chars: int, n_bytes: int) -> dict[str, Any]:
    """Tokens, characters, bytes, bytes/token and chars/token of a text of `n_chars` characters
    and `n_bytes` bytes encoded in `n_tokens`."""
    return {
        "tokens": n_tokens,
        "chars": n_chars,
        "bytes": n_bytes,
        "bytes_per_token": n_bytes / max(1, n_tokens),
        "chars_per_token": n_chars / max(1, n_tokens),
    }


def compression(text: str, n_tokens: int) -> dict[str, Any]:
    """`compression_of` for `text` encoded in `n_tokens`."""
    return compression_of(n_tokens, len(text), len(text.encode("utf-8", "surrogatepass")))
