"""The compiled core (`pipeline_lib._tokcore`) as the tokenizer package uses it: `_CORE` is
the module, or None when it is not built (or with ``TOKENMILL_PURE_PYTHON=1``).

Every module reads ``native._CORE`` at call time, so a test can swap it for None and run the
pure-Python reference everywhere at once.
"""

from __future__ import annotations

import os
from typing import Literal

from pipeline_lib import cancel


def _native_core():
    if os.environ.get("TOKENMILL_PURE_PYTHON"):
        return None
    try:
        from pipeline_lib import _tokcore
    except ImportError:
        return None
    return _tokcore if hasattr(_tokcore, "Encoder") else None


_CORE = _native_core()
if _CORE is not None:
    cancel.watch(_CORE)


def backend() -> Literal["native", "python"]:
    """Which implementation encodes and trains: the compiled core or the reference."""
    return "native" if _CORE is not None else "python"


def backend_info() -> dict[str, str | None]:
    """What trains and encodes here, for manifests.

    Returns ``{"backend": "native" | "python", "core_source_hash": ...}``: the sha256 of
    the C++ sources the compiled core was built from (``_tokcore.CORE_SOURCE_HASH``), or
    None when the pure-Python reference runs.

    >>> backend_info()["backend"] in ("native", "python")
    True
    """
    if _CORE is None:
        return {"backend": "python", "core_source_hash": None}
    return {"backend": "native", "core_source_hash": _CORE.CORE_SOURCE_HASH}
