"""Package version and per-stage code versions (part of every version id)."""

from __future__ import annotations

import functools
import hashlib
import importlib
from importlib import metadata

try:
    __version__ = metadata.version("tokenmill")
except metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+src"


# Modules whose work the compiled core does when it is built (pre-tokenizing, counting,
# training, encoding): naming one makes the core's C++ source part of the code version.
NATIVE_BACKED = frozenset({"pipeline_lib.tokenizer", "pipeline_lib.bpe_reference"})


@functools.cache
def code_version(*modules: str) -> str:
    """`<package version>+<hash of the named modules' source>`: changes when their code does.

    Stages name the modules whose behaviour decides their output, so editing the LM code
    does not invalidate tokenized shards. When one of them is in NATIVE_BACKED and the
    compiled core is in use, the hash also covers the core's C++ sources
    (``_tokcore.CORE_SOURCE_HASH``, computed when it was built); with the pure-Python
    reference, the reference's own source is what counts.
    """
    h = hashlib.sha256()
    for name in sorted(modules):
        module = importlib.import_module(name)
        path = getattr(module, "__file__", None)
        if path and path.endswith(".py"):
            with open(path, "rb") as f:
                h.update(f.read())
    if NATIVE_BACKED.intersection(modules):
        from pipeline_lib.tokenizer import backend_info

        core_hash = backend_info()["core_source_hash"]
        if core_hash is not None:
            h.update(b"native core " + core_hash.encode())
    return f"{__version__}+{h.hexdigest()[:12]}"
