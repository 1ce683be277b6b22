"""Tokenizers out to other libraries, same ids everywhere: HF ``tokenizer.json``, a
transformers-ready directory, GPT-2's ``vocab.json`` + ``merges.txt``, `tiktoken.Encoding`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pipeline_lib.formats import gpt2_files, hf_tokenizer_json
from pipeline_lib.fsio import InputError, filesystem, write_bytes_atomic
from pipeline_lib.tokenizer.core import ENDOFTEXT

if TYPE_CHECKING:
    import tiktoken

    from pipeline_lib.tokenizer.core import Tokenizer

HF_FILE = "tokenizer.json"
TRANSFORMERS_CONFIG = "tokenizer_config.json"
TRANSFORMERS_SPECIAL_MAP = "special_tokens_map.json"
# transformers' own "no limit" (`tokenization_utils_base.VERY_LARGE_INTEGER`)
NO_MAX_LENGTH = int(1e30)


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, indent=2, ensure_ascii=False).encode()


def to_hf_json(tok: Tokenizer, path: str) -> None:
    """Write a HF ``tokenizer.json`` that `tokenizers.Tokenizer.from_file` loads, with our ids
    (special tokens included, whatever gaps the ids have)."""
    fs, p = filesystem(path)
    write_bytes_atomic(fs, p, json.dumps(hf_tokenizer_json(tok), ensure_ascii=False).encode())


def special_roles(tok: Tokenizer, eos_token: str | None = None, bos_token: str | None = None, pad_token: str | None = None) -> dict[str, str]:
    """transformers' ``eos_token`` / ``bos_token`` / ``pad_token`` among `tok`'s special tokens.

    Unset: eos is ``<|endoftext|>`` when `tok` has it; bos ``<|startoftext|>`` and pad
    ``<|pad|>`` when `tok` has them, else the eos token (GPT-2's convention). A role with
    nothing to fill it is left out.

    Raises:
        InputError: a role given a string that is not one of `tok`'s special tokens.
    """
    for role, value in (("eos_token", eos_token), ("bos_token", bos_token), ("pad_token", pad_token)):
        if value is not None and value not in tok.special_tokens:
            raise InputError(f"{role}={value!r} is not a special token of this tokenizer (it has {sorted(tok.special_tokens)})")
    specials = tok.special_tokens
    eos = eos_token or (ENDOFTEXT if ENDOFTEXT in specials else None)
    roles = {
        "bos_token": bos_token or ("<|startoftext|>" if "<|startoftext|>" in specials else eos),
        "eos_token": eos,
        "pad_token": pad_token or ("<|pad|>" if "<|pad|>" in specials else eos),
    }
    return {k: v for k, v in roles.items() if v is not None}


def transformers_files(
    tok: Tokenizer, model_max_length: int | None = None, eos_token: str | None = None, bos_token: str | None = None, pad_token: str | None = None
) -> dict[str, bytes]:
    """The files of `to_transformers`, by name."""
    if model_max_length is not None and (isinstance(model_max_length, bool) or not isinstance(model_max_length, int) or model_max_length < 1):
        raise InputError(f"model_max_length={model_max_length!r}: a number of tokens >= 1 (or None for no limit)")
    roles = special_roles(tok, eos_token, bos_token, pad_token)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model_max_length or NO_MAX_LENGTH,
        # byte-level BPE decodes exactly; transformers' clean-up would drop spaces before punctuation
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": {
            str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
            for t, i in sorted(tok.special_tokens.items(), key=lambda kv: kv[1])
        },
        **roles,
    }
    return {
        HF_FILE: json.dumps(hf_tokenizer_json(tok), ensure_ascii=False).encode(),
        TRANSFORMERS_CONFIG: _dumps(config),
        TRANSFORMERS_SPECIAL_MAP: _dumps(roles),
    }


def to_transformers(
    tok: Tokenizer,
    directory: str,
    model_max_length: int | None = None,
    *,
    eos_token: str | None = None,
    bos_token: str | None = None,
    pad_token: str | None = None,
    **storage_options: Any,
) -> None:
    """Write a directory that ``transformers.AutoTokenizer.from_pretrained`` loads as a
    ``PreTrainedTokenizerFast`` with our ids: ``tokenizer.json``, ``tokenizer_config.json``
    (``model_max_length``: None for transformers' "no limit") and ``special_tokens_map.json``
    (roles as `special_roles` picks them)."""
    _write_dir(directory, transformers_files(tok, model_max_length, eos_token, bos_token, pad_token), storage_options)


def to_gpt2(tok: Tokenizer, directory: str, **storage_options: Any) -> None:
    """Write GPT-2's format into `directory`: ``vocab.json`` (its ``encoder.json``) and
    ``merges.txt`` (its ``vocab.bpe``: one merge per line, byte-encoder strings), which
    ``Tokenizer.from_gpt2(vocab.json, merges.txt, pattern=tok.pattern)`` loads back to the
    same ids (the split pattern is not part of the format)."""
    _write_dir(directory, gpt2_files(tok), storage_options)


def _write_dir(directory: str, files: dict[str, bytes], storage_options: dict[str, Any]) -> None:
    fs, root = filesystem(directory, **storage_options)
    fs.makedirs(root, exist_ok=True)
    for name, data in files.items():
        write_bytes_atomic(fs, f"{root.rstrip('/')}/{name}", data)


def to_tiktoken(tok: Tokenizer) -> tiktoken.Encoding:
    """A `tiktoken.Encoding` with the same ranks, pattern and special tokens (needs tiktoken)."""
    import tiktoken

    return tiktoken.Encoding(
        name=tok.name,
        pat_str=tok.pattern_str,
        mergeable_ranks=tok.mergeable_ranks,
        special_tokens=tok.special_tokens,
    )
