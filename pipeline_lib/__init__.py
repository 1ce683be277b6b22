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
