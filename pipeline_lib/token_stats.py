"""How well a tokenization compresses a text: shared by the lab and its comparisons."""

from __future__ import annotations

from typing import Any


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
