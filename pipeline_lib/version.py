"""Package version and per-stage code versions (part of every version id)."""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
from importlib import metadata

try:
    __version__ = metadata.version("tokenmill")
except metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+src"


# Modules whose work the compiled core does when it is built (pre-tokenizing, counting,
# training, encoding): naming one makes the core's C++ source part of the code version.
NATIVE_BACKED = frozenset({"pipeline_lib.tokenizer", "pipeline_lib.bpe_reference", "pipeline_lib._tokcore"})  # submodules too


def _sources(name: str) -> list[tuple[bytes, str]]:
    """(label, path) of the source files that module `name` stands for: its own file, or
    for a package every ``.py`` file in it (subpackages too), sorted by and labelled with
    its path in the package and its size (renaming or moving code is a change too)."""
    try:
        module = importlib.import_module(name)
    except ImportError:  # the compiled core, not built: the pure-Python reference stands in for it
        return []
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py"):
        return []
    if not hasattr(module, "__path__"):
        return [(b"", path)]
    root = os.path.dirname(path)
    found = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                full = os.path.join(directory, f)
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                found.append((rel, full))
    return [(f"{rel}\0{os.path.getsize(full)}\0".encode(), full) for rel, full in sorted(found)]


@functools.cache
def code_version(*modules: str) -> str:
    """`<package version>+<hash of the named modules' source>`: changes when their code does.

    A module stands for its source file; a package (``pipeline_lib.stages``) for every
    ``.py`` file in it, subpackages included; ``pipeline_lib._tokcore``, the compiled core,
    for its C++ sources (for a stage that calls it directly, as the sharder does).

    Stages name the modules whose behaviour decides their output, so editing the LM code
    does not invalidate tokenized shards. When one of them is in NATIVE_BACKED and the
    compiled core is in use, the hash also covers the core's C++ sources
    (``_tokcore.CORE_SOURCE_HASH``, computed when it was built); with the pure-Python
    reference, the reference's own source is what counts.
    """
    h = hashlib.sha256()
    for name in sorted(modules):
        for label, path in _sources(name):
            h.update(label)
            with open(path, "rb") as f:
                h.update(f.read())
    if any(m == n or m.startswith(n + ".") for m in modules for n in NATIVE_BACKED):
        from pipeline_lib.tokenizer import backend_info

        core_hash = backend_info()["core_source_hash"]
        if core_hash is not None:
            h.update(b"native core " + core_hash.encode())
    return f"{__version__}+{h.hexdigest()[:12]}"
