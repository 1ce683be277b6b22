"""Tokenizers out to other libraries, same ids everywhere: HF ``tokenizer.json``, a
transformers-ready directory, GPT-2's ``vocab.json`` + ``merges.txt``, `tiktoken.Encoding`.

Byte-level BPE with a named split pattern goes to all of them but GPT-2's files, which take
GPT-2's pattern only (they hold no pattern: every GPT-2 loader splits with GPT-2's); with no
split or a custom regex, to HF and transformers. Character- and word-level BPE go to HF ``tokenizer.json`` and
transformers only (`unit_tokenizer_json`): GPT-2's files and tiktoken's ranks hold byte-level
vocabularies, and exporting other units to them is refused.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pipeline_lib import bpe_reference as ref
from pipeline_lib.formats import gpt2_files, hf_added_tokens, hf_tokenizer_json, onig_pattern
from pipeline_lib.fsio import InputError, filesystem, write_bytes_atomic
from pipeline_lib.patterns import NO_SPLIT
from pipeline_lib.tokenizer.limits import ENDOFTEXT, UNK

if TYPE_CHECKING:
    import tiktoken

    from pipeline_lib.tokenizer.core import Tokenizer

HF_FILE = "tokenizer.json"
TRANSFORMERS_CONFIG = "tokenizer_config.json"
TRANSFORMERS_SPECIAL_MAP = "special_tokens_map.json"
# transformers' own "no limit" (`tokenization_utils_base.VERY_LARGE_INTEGER`)
NO_MAX_LENGTH = int(1e30)
# The word unit's end-of-word symbol in HF files. HF's BPE starts from the characters of a
# word, so the symbol must be one character: U+FFFF, a Unicode noncharacter, which text does
# not hold (text that does encodes differently in HF). The decoder turns it into a space.
HF_END_OF_WORD = "\uffff"
# Python's str.split() whitespace in Oniguruma (its \s lacks the separators U+001C..U+001F).
HF_SPACE = r"[\s\x1c-\x1f]"


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, indent=2, ensure_ascii=False).encode()


def hf_json(tok: Tokenizer, what: str = "a HF tokenizer.json") -> dict[str, Any]:
    """The HF ``tokenizer.json`` content of `tok`, any unit and pattern: byte-level as
    `pipeline_lib.formats.hf_tokenizer_json` (a custom regex in its ``Split``, none without
    one), char- and word-level as `unit_tokenizer_json`."""
    if tok.unit != "byte":
        return unit_tokenizer_json(tok, what)
    out = hf_tokenizer_json(tok)
    if tok.pattern == NO_SPLIT:  # the whole text is one piece: no Split before the bytes
        out["pre_tokenizer"] = out["pre_tokenizer"]["pretokenizers"][1]
    return out


def to_hf_json(tok: Tokenizer, path: str) -> None:
    """Write a HF ``tokenizer.json`` that `tokenizers.Tokenizer.from_file` loads, with our ids
    (special tokens included, whatever gaps the ids have)."""
    data = json.dumps(hf_json(tok), ensure_ascii=False).encode()
    fs, p = filesystem(path)
    write_bytes_atomic(fs, p, data)


def _refuse(tok: Tokenizer, what: str, why: str) -> InputError:
    return InputError(
        f"{what} cannot carry this {tok.unit}-level tokenizer: {why}; use the tokenizer's own files "
        "(save / Tokenizer.load)"
    )


def _hf_token_names(tok: Tokenizer, what: str) -> dict[bytes, str]:
    """Token bytes -> the string HF's vocabulary holds: the text of the token, ``</w>`` as
    `HF_END_OF_WORD`, and the single bytes that are not UTF-8 (byte fallback) as HF's
    ``<0xNN>`` (ASCII bytes keep their character: HF finds them as characters, same id)."""
    names: dict[bytes, str] = {}
    end_of_word = ref.END_OF_WORD if tok.unit == "word" else None
    for b in tok.mergeable_ranks:
        if len(b) == 1 and b[0] >= 0x80 and b != end_of_word:
            names[b] = f"<0x{b[0]:02X}>"
            continue
        try:
            names[b] = (b.replace(end_of_word, HF_END_OF_WORD.encode()) if end_of_word else b).decode("utf-8")
        except UnicodeDecodeError:
            raise _refuse(
                tok,
                what,
                f"token {b!r} (id {tok.mergeable_ranks[b]}) is not UTF-8 text (the training corpus held "
                "bytes that are not UTF-8)",
            ) from None
    taken: dict[str, bytes] = {}
    for b, name in names.items():
        other = taken.setdefault(name, b)
        if other != b or name in tok.special_tokens:
            raise _refuse(tok, what, f"two tokens would be spelled {name!r} in its vocabulary")
    if tok.unit == "word" and any(HF_END_OF_WORD in n for b, n in names.items() if ref.END_OF_WORD not in b):
        raise _refuse(tok, what, f"its corpus holds {HF_END_OF_WORD!r}, the character that stands for </w> there")
    return names


def _hf_merges(tok: Tokenizer, names: dict[bytes, str]) -> list[list[str]]:
    """The merges in priority order (by the merged token's id): the trained list; for a
    tokenizer without one, every pair of tokens that joins into a token of higher id.

    Our encoder merges whichever adjacent pair joins into the lowest id (tiktoken's rule),
    HF the listed pair that comes first: the trained merges give the same ids (the trained
    pairs are the ones encoding meets), and so does the full list, by construction.
    """
    if tok.merges is not None:
        by_id = {i: names[b] for b, i in tok.mergeable_ranks.items()}
        return [[by_id[a], by_id[b]] for a, b, _ in sorted(tok.merges, key=lambda m: m[2])]
    ranks = tok.mergeable_ranks
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        for k in range(1, len(token)):
            left, right = ranks.get(token[:k]), ranks.get(token[k:])
            if left is not None and right is not None and left < rank and right < rank:
                merges.append([names[token[:k]], names[token[k:]]])
    return merges


def unit_tokenizer_json(tok: Tokenizer, what: str = "a HF tokenizer.json") -> dict[str, Any]:
    """The HF ``tokenizer.json`` of a char- or word-level `tok`, giving our ids.

    A BPE model over characters: vocabulary = our tokens (and special tokens) by id, merges in
    order (`_hf_merges`), ``ignore_merges`` (a piece that is a token is that token, as ours),
    ``<unk>`` for characters unseen at training (unknown="unk") or HF's byte fallback with
    ``<0xNN>`` tokens, which are our fallback byte ids (unknown="bytes"). The char unit's
    split pattern is a ``Split`` pre-tokenizer (none: no pre-tokenizer). The word unit puts
    `HF_END_OF_WORD` after each word in the normalizer (after a ``Lowercase`` if asked),
    splits at whitespace, and its decoder turns the symbol into a space, as our decode does.

    HF lowercases character by character, Python's ``str.lower`` (ours) turns a word-final
    capital sigma into ``ς``: Greek words ending in ``Σ`` can differ under ``lowercase``.

    HF's own word-BPE (``end_of_word_suffix="</w>"``) glues the end-of-word to the last
    character before any merge; ours is a symbol of its own, merged like any other, so that
    model would give other ids on many words.

    Raises:
        InputError: what HF cannot carry: the word unit with a split pattern (HF would have to
            mark word ends inside the pattern's pieces), tokens that are not UTF-8 text, two
            tokens with one spelling.
    """
    if tok.unit == "word" and tok.pattern != NO_SPLIT:
        raise _refuse(
            tok,
            what,
            f"it splits words with --pattern {tok.pattern!r}; word-level HF files hold "
            "whitespace words (train with --pattern none)",
        )
    names = _hf_token_names(tok, what)
    vocab = {names[b]: i for b, i in tok.mergeable_ranks.items()}
    vocab.update(tok.special_tokens)
    byte_fallback = tok.unknown == "bytes"
    normalizers: list[dict[str, Any]] = []
    if tok.unit == "word":
        if tok.lowercase:
            normalizers.append({"type": "Lowercase"})
        word_end = {"Regex": f"(?<=[^{HF_SPACE[1:-1]}])(?={HF_SPACE}|\\z)"}
        normalizers.append({"type": "Replace", "pattern": word_end, "content": HF_END_OF_WORD})
        pre_tokenizer: dict[str, Any] | None = {
            "type": "Split",
            "pattern": {"Regex": f"{HF_SPACE}+"},
            "behavior": "Removed",
            "invert": False,
        }
    elif tok.pattern == NO_SPLIT:
        pre_tokenizer = None
    else:
        pre_tokenizer = {
            "type": "Split",
            "pattern": {"Regex": onig_pattern(tok.pattern_str)},
            "behavior": "Isolated",
            "invert": False,
        }
    decoders: list[dict[str, Any]] = [{"type": "ByteFallback"}] if byte_fallback else []
    if tok.unit == "word":
        decoders.append({"type": "Replace", "pattern": {"String": HF_END_OF_WORD}, "content": " "})
    decoders.append({"type": "Fuse"})  # tokens join as they are (with no decoder, HF joins them with spaces)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": hf_added_tokens(tok),
        "normalizer": {"type": "Sequence", "normalizers": normalizers} if normalizers else None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": UNK if tok.unknown == "unk" else None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": byte_fallback,
            "ignore_merges": True,
            "vocab": dict(sorted(vocab.items(), key=lambda kv: kv[1])),
            "merges": _hf_merges(tok, names),
        },
    }


def special_roles(
    tok: Tokenizer, eos_token: str | None = None, bos_token: str | None = None, pad_token: str | None = None
) -> dict[str, str]:
    """transformers' ``eos_token`` / ``bos_token`` / ``pad_token`` among `tok`'s special tokens.

    Unset: eos is ``<|endoftext|>`` when `tok` has it; bos ``<|startoftext|>`` and pad
    ``<|pad|>`` when `tok` has them, else the eos token (GPT-2's convention); unk is ``<unk>``
    when unseen characters become it. A role with nothing to fill it is left out.

    Raises:
        InputError: a role given a string that is not one of `tok`'s special tokens.
    """
    for role, value in (("eos_token", eos_token), ("bos_token", bos_token), ("pad_token", pad_token)):
        if value is not None and value not in tok.special_tokens:
            raise InputError(
                f"{role}={value!r} is not a special token of this tokenizer (it has {sorted(tok.special_tokens)})"
            )
    specials = tok.special_tokens
    eos = eos_token or (ENDOFTEXT if ENDOFTEXT in specials else None)
    roles: dict[str, str | None] = {
        "bos_token": bos_token or ("<|startoftext|>" if "<|startoftext|>" in specials else eos),
        "eos_token": eos,
        "pad_token": pad_token or ("<|pad|>" if "<|pad|>" in specials else eos),
    }
    if tok.unknown == "unk":
        roles["unk_token"] = UNK
    return {k: v for k, v in roles.items() if v is not None}


def transformers_files(
    tok: Tokenizer,
    model_max_length: int | None = None,
    eos_token: str | None = None,
    bos_token: str | None = None,
    pad_token: str | None = None,
) -> dict[str, bytes]:
    """The files of `to_transformers`, by name."""
    tokenizer_json = hf_json(tok, "a transformers directory")
    if model_max_length is not None and (
        isinstance(model_max_length, bool) or not isinstance(model_max_length, int) or model_max_length < 1
    ):
        raise InputError(f"model_max_length={model_max_length!r}: a number of tokens >= 1 (or None for no limit)")
    roles = special_roles(tok, eos_token, bos_token, pad_token)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model_max_length or NO_MAX_LENGTH,
        # our decode is exact (word-level: words and spaces); transformers' clean-up would drop spaces before
        # punctuation
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": {
            str(i): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for t, i in sorted(tok.special_tokens.items(), key=lambda kv: kv[1])
        },
        **roles,
    }
    return {
        HF_FILE: json.dumps(tokenizer_json, ensure_ascii=False).encode(),
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
    ``Tokenizer.from_gpt2`` and every GPT-2 loader (OpenAI's ``encoder.py``,
    ``GPT2Tokenizer``, ``GPT2TokenizerFast``) load with the same ids.

    Raises:
        InputError: a tokenizer with another split than GPT-2's: the files hold no pattern
            and every GPT-2 loader splits with GPT-2's, so they would load with other ids.
    """
    what = "GPT-2's vocab.json + merges.txt"
    if tok.unit == "byte" and tok.pattern != "gpt2":
        raise InputError(
            f"{what} cannot carry the {tok.pattern!r} split pattern: the files hold no pattern and GPT-2 loaders split"
            " with GPT-2's, so they would load with other ids; export this tokenizer with --format hf or --format "
            "transformers"
            " (to_hf_json / to_transformers), which carry the pattern"
        )
    _require_byte_level(tok, what)
    _write_dir(directory, gpt2_files(tok), storage_options)


def _require_byte_level(tok: Tokenizer, what: str) -> None:
    if tok.unit != "byte":
        raise InputError(
            f"{what} cannot carry a {tok.unit}-level tokenizer: it holds byte-level BPE only;"
            " export this one with --format hf or --format transformers (to_hf_json / to_transformers)"
        )
    tok.require_byte_level(what)


def _write_dir(directory: str, files: dict[str, bytes], storage_options: dict[str, Any]) -> None:
    fs, root = filesystem(directory, **storage_options)
    fs.makedirs(root, exist_ok=True)
    for name, data in files.items():
        write_bytes_atomic(fs, f"{root.rstrip('/')}/{name}", data)


def tiktoken_ranks_file(tok: Tokenizer) -> bytes:
    """The ``.tiktoken`` ranks file of a byte-level `tok` (what ``tokenizer export --format
    tiktoken`` writes); other units are refused, as tiktoken would read them as bytes."""
    if tok.unit != "byte":
        _require_byte_level(tok, "a .tiktoken ranks file")
    return tok.ranks_text()


def to_tiktoken(tok: Tokenizer) -> tiktoken.Encoding:
    """A `tiktoken.Encoding` with the same ranks, pattern and special tokens (needs tiktoken)."""
    _require_byte_level(tok, "a tiktoken.Encoding")
    import tiktoken

    return tiktoken.Encoding(
        name=tok.name,
        pat_str=tok.pattern_str,
        mergeable_ranks=tok.mergeable_ranks,
        special_tokens=tok.special_tokens,
    )
