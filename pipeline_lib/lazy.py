"""Modules imported where they are first used: NumPy and `regex`.

``import pipeline_lib``, ``get_encoding`` and tiktoken's calls (`encode`, `decode`, lists in
and out) need neither: NumPy took ~0.12 s of a ~0.38 s program that loads cl100k and encodes
one text, `regex` ~12 ms. A module that uses one only in some calls writes::

    if TYPE_CHECKING:
        import numpy as np
    else:
        np = LazyModule(globals(), "np", "numpy")

The first ``np.<name>`` imports NumPy and puts the module itself in that module's namespace.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any, TypeGuard

if TYPE_CHECKING:
    import numpy


class LazyModule:
    def __init__(self, namespace: dict[str, Any], name: str, module: str):
        self._namespace, self._name, self._module = namespace, name, module

    def __getattr__(self, attr: str) -> Any:
        module = importlib.import_module(self._module)
        self._namespace[self._name] = module
        return getattr(module, attr)


def is_ndarray(value: Any) -> TypeGuard[numpy.ndarray]:
    """``isinstance(value, numpy.ndarray)`` without importing NumPy: no value is one before
    NumPy is loaded."""
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.ndarray)


def is_integer(value: Any) -> bool:
    """An int or a NumPy integer, never a bool (Python's or NumPy's)."""
    if type(value) is int:
        return True
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.integer)
