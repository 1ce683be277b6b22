"""`Tokenizer`: BPE with tiktoken's API and ids, trained here or loaded from files.

Byte-level by default (tiktoken's ids); character-level and word-level BPE (`UNITS`) and
split patterns from names, ``none`` or a regex share the same machinery and methods.

Laid out as tiktoken is:

* `core`: the `Tokenizer` class (encoding, decoding; tiktoken's `Encoding` methods), no I/O.
* `native`: which backend runs (`backend`, `backend_info`): the compiled core
  (`pipeline_lib._tokcore`, ``native._CORE``) when it is built, else the pure-Python
  `bpe_reference` (``TOKENMILL_PURE_PYTHON=1`` forces it); both give the same ids.
* `limits`: the vocabulary's limits and checks (ids, token lengths, units, special tokens),
  below every other module here.
* `train`: counting pieces on threads (`PieceCounts`, `count_documents`) and learning merges
  (and each merge's count) for every unit.
* `load`: ``save`` / ``load`` through fsspec (ranks, merges with their counts, metadata),
  ``.tiktoken`` ranks files, GPT-2's files.
* `export`: HF ``tokenizer.json``, a transformers directory, GPT-2's ``vocab.json`` +
  ``merges.txt``, and `tiktoken.Encoding`.
* `registry`: ``get_encoding("cl100k_base")``, ``encoding_for_model("gpt-4o")``, from local
  files only.
"""

from pipeline_lib.tokenizer import core, native
from pipeline_lib.tokenizer.core import Tokenizer
from pipeline_lib.tokenizer.limits import (
    ENDOFTEXT,
    MAX_TOKEN_BYTES,
    MAX_VOCAB_SIZE,
    UNIT_DESCRIPTIONS,
    UNITS,
    UNK,
    UnknownTokenError,
)
from pipeline_lib.tokenizer.load import (
    FORMAT,
    MAX_META_FILE_BYTES,
    MAX_VOCAB_FILE_BYTES,
    MERGES_FILE,
    META_FILE,
    RANKS_FILE,
    parse_tiktoken_ranks,
)
from pipeline_lib.tokenizer.native import backend, backend_info
from pipeline_lib.tokenizer.registry import (
    UnknownModelError,
    encoding_for_model,
    encoding_name_for_model,
    get_encoding,
    list_encoding_names,
)
from pipeline_lib.tokenizer.train import PieceCounts, PieceTable, count_documents

# tiktoken's name for the class
Encoding = Tokenizer

__all__ = [
    "ENDOFTEXT",
    "FORMAT",
    "MAX_META_FILE_BYTES",
    "MAX_TOKEN_BYTES",
    "MAX_VOCAB_FILE_BYTES",
    "MAX_VOCAB_SIZE",
    "MERGES_FILE",
    "META_FILE",
    "RANKS_FILE",
    "UNITS",
    "UNIT_DESCRIPTIONS",
    "UNK",
    "Encoding",
    "PieceCounts",
    "PieceTable",
    "Tokenizer",
    "UnknownModelError",
    "UnknownTokenError",
    "backend",
    "backend_info",
    "core",
    "count_documents",
    "encoding_for_model",
    "encoding_name_for_model",
    "get_encoding",
    "list_encoding_names",
    "native",
    "parse_tiktoken_ranks",
]
