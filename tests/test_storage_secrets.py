"""Secret storage options are recorded redacted and put back where a filesystem is made
(pipeline_lib/storage_secrets.py); tests/test_cli_startup.py reads a flow run's parameters
from the API."""

from __future__ import annotations

import pytest

from pipeline_lib.errors import InputError
from pipeline_lib.fsio import filesystem
from pipeline_lib.storage_secrets import ENV, REDACTED, redact, remember, resolve


def test_secrets_are_redacted_and_put_back(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    options = {
        "key": "AKIA",
        "secret": "s3cr3t",
        "anon": False,
        "client_kwargs": {"endpoint_url": "http://x", "aws_session_token": "sess-9f2c"},
    }
    shown, secrets = redact(options)
    assert shown == {
        "key": REDACTED,
        "secret": REDACTED,
        "anon": False,
        "client_kwargs": {"endpoint_url": "http://x", "aws_session_token": REDACTED},
    }
    assert "s3cr3t" not in repr(shown) and "sess-9f2c" not in repr(shown)
    remember(secrets)
    assert resolve(shown) == options


def test_a_redacted_option_without_its_secret_is_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV, raising=False)
    with pytest.raises(InputError, match=r"storage option secret=\*\*\*.*--storage-option"):
        filesystem(str(tmp_path), secret=REDACTED)
