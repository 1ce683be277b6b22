"""Storage options that are secrets stay out of what is recorded.

`tokenmill --storage-option key=...` options flow into Prefect flow parameters, which the
Prefect API stores and shows. `redact` splits options into the redacted form that is passed
around and recorded (``key=***``) and the secrets, which the command puts in its environment
(TOKENMILL_STORAGE_SECRETS, JSON; inherited by the worker processes it starts);
`resolve`, called where a filesystem is made (pipeline_lib.fsio.filesystem), puts them back.
"""

from __future__ import annotations

import json
import os
from typing import Any

from pipeline_lib.errors import InputError

ENV = "TOKENMILL_STORAGE_SECRETS"
REDACTED = "***"
SECRET_WORDS = ("key", "secret", "token", "password", "passwd", "credential", "auth", "session", "signature")


def is_secret(name: str) -> bool:
    return any(word in name.lower() for word in SECRET_WORDS)


def redact(options: dict[str, Any], prefix: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
    """(options with each secret value replaced by ``***``, {dotted name: secret value})."""
    shown: dict[str, Any] = {}
    secrets: dict[str, Any] = {}
    for name, value in options.items():
        path = f"{prefix}{name}"
        if isinstance(value, dict):
            shown[name], inner = redact(value, f"{path}.")
            secrets.update(inner)
        elif is_secret(name) and value not in (None, "", False, True):
            shown[name], secrets[path] = REDACTED, value
        else:
            shown[name] = value
    return shown, secrets


def remember(secrets: dict[str, Any]) -> None:
    """Add `secrets` to this process's environment, for `resolve` here and in its workers."""
    if secrets:
        os.environ[ENV] = json.dumps({**_known(), **secrets})


def _known() -> dict[str, Any]:
    try:
        known = json.loads(os.environ.get(ENV) or "{}")
    except ValueError:
        raise InputError(f"{ENV}: not JSON") from None
    return known if isinstance(known, dict) else {}


def resolve(options: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`options` with each ``***`` put back from the environment."""
    known: dict[str, Any] | None = None
    out: dict[str, Any] = {}
    for name, value in options.items():
        path = f"{prefix}{name}"
        if isinstance(value, dict):
            out[name] = resolve(value, f"{path}.")
        elif value == REDACTED:
            known = _known() if known is None else known
            if path not in known:
                raise InputError(
                    f"storage option {path}=***: its value is not in this process's {ENV}; give it with "
                    "--storage-option "
                    "(or the storage's own environment variables, e.g. AWS_SECRET_ACCESS_KEY)"
                )
            out[name] = known[path]
        else:
            out[name] = value
    return out
