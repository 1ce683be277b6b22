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


@functools.cache
def code_version(*modules: str) -> str:
    """`<package version>+<hash of the named modules' source>`: changes when their code does.

    Stages name the modules whose behaviour decides their output, so editing the LM code
    does not invalidate tokenized shards.
    """
    h = hashlib.sha256()
    for name in sorted(modules):
        module = importlib.import_module(name)
        path = getattr(module, "__file__", None)
        if path and path.endswith(".py"):
            with open(path, "rb") as f:
                h.update(f.read())
        h.update(str(getattr(module, "CORE_VERSION", "")).encode())
    return f"{__version__}+{h.hexdigest()[:12]}"
