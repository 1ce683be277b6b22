"""A `prefect deploy` build step: the store, corpus and storage options from the environment.

prefect.yaml runs `deployments.steps.settings` before creating each deployment and uses
its outputs as the deployments' default parameters (``{{ settings.store }}`` ...):

    TOKENMILL_STORE            artifact store URL or path (default ./artifacts, made absolute)
    TOKENMILL_CORPUS           corpus URL or glob; several separated by spaces (default: the
                               flow's default, the bundled tiny Shakespeare)
    TOKENMILL_STORAGE_OPTIONS  fsspec options as JSON, e.g. '{"client_kwargs":
                               {"endpoint_url": "http://127.0.0.1:9000"}}' (default: none)

Why a step and not Prefect's ``{{ $VAR }}``: an unset variable there becomes an empty string
(a store of "" is the deploy directory itself, a corpus of [""] fails at run time); this
step gives None for what is unset, which the flows read as "use the default".
"""

from __future__ import annotations

import json
import os
import shlex
from typing import Any

from pipeline_lib.fsio import InputError


def _absolute(url: str) -> str:
    return url if "://" in url else os.path.abspath(os.path.expanduser(url))


def settings(store_default: str = "./artifacts", **_: Any) -> dict[str, Any]:
    """Outputs ``store``, ``corpus`` and ``storage_options`` (None when unset)."""
    corpus = shlex.split(os.environ.get("TOKENMILL_CORPUS", ""))
    out: dict[str, Any] = {
        "store": _absolute(os.environ.get("TOKENMILL_STORE", "").strip() or store_default),
        "corpus": [_absolute(c) for c in corpus] or None,
        "storage_options": None,
    }
    raw = os.environ.get("TOKENMILL_STORAGE_OPTIONS", "").strip()
    if raw:
        try:
            options = json.loads(raw)
        except json.JSONDecodeError as e:
            raise InputError(f"TOKENMILL_STORAGE_OPTIONS is not JSON: {e}") from e
        if not isinstance(options, dict):
            raise InputError("TOKENMILL_STORAGE_OPTIONS must be a JSON object")
        out["storage_options"] = options
    print(f"tokenmill deploy settings: {json.dumps(out)}")
    return out
