"""tokenmill's library: tokenizer, artifact store, corpus stages and the LM trainer.

Nothing here imports Prefect; `tasks/` and `flows/` wrap these functions.

    from pipeline_lib import Tokenizer, get_encoding
    tok = Tokenizer.train(["some text", ...], vocab_size=4096, pattern="cl100k")
    ids = tok.encode("hello world")          # a list of ints, as tiktoken's
    tok.decode(ids)
    get_encoding("cl100k_base").encode("hello world")   # tiktoken's ids, from local files

tiktoken's module-level names are here too (``Encoding`` is `Tokenizer`), so a program
written for tiktoken runs with ``import pipeline_lib as tiktoken``.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline_lib.store import ArtifactStore, VersionRef
    from pipeline_lib.tokenizer import (
        Encoding,
        Tokenizer,
        backend,
        encoding_for_model,
        encoding_name_for_model,
        get_encoding,
        list_encoding_names,
    )
    from pipeline_lib.version import __version__

# Loaded on first use (PEP 562): `import pipeline_lib.lm.model` runs this file first, and the
# model must import where only torch, numpy and safetensors are (no compiled core, no pyarrow).
# `__version__` reads the installed package's metadata (~40 ms): every `tokenmill` command
# imports this package, few need it.
_LAZY = {
    "__version__": "pipeline_lib.version",
    "ArtifactStore": "pipeline_lib.store",
    "VersionRef": "pipeline_lib.store",
    "Encoding": "pipeline_lib.tokenizer",
    "Tokenizer": "pipeline_lib.tokenizer",
    "backend": "pipeline_lib.tokenizer",
    "encoding_for_model": "pipeline_lib.tokenizer",
    "encoding_name_for_model": "pipeline_lib.tokenizer",
    "get_encoding": "pipeline_lib.tokenizer",
    "list_encoding_names": "pipeline_lib.tokenizer",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "ArtifactStore",
    "Encoding",
    "Tokenizer",
    "VersionRef",
    "__version__",
    "backend",
    "encoding_for_model",
    "encoding_name_for_model",
    "get_encoding",
    "list_encoding_names",
]
