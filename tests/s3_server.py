"""A local S3 server for tests: moto's ThreadedMotoServer on 127.0.0.1, a free port.

One server per test process (started on first use, stopped at exit), reached through
s3fs with ``client_kwargs={"endpoint_url": ...}`` exactly like any S3-compatible store.
Import the fixtures into a test module::

    from s3_server import s3_options, s3_bucket  # noqa: F401  (pytest fixtures)
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
import uuid

import pytest

_LOCK = threading.RLock()
_SERVER: dict = {}
CREDENTIALS = {"key": "testing", "secret": "testing"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def endpoint() -> str:
    """Start the server once per process; return its endpoint URL."""
    with _LOCK:
        if "url" not in _SERVER:
            from moto.server import ThreadedMotoServer

            logging.getLogger("werkzeug").setLevel(logging.ERROR)
            for var, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_DEFAULT_REGION", "us-east-1")):
                os.environ.setdefault(var, value)
            port = _free_port()
            server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
            server.start()
            atexit.register(server.stop)
            _SERVER.update(server=server, url=f"http://127.0.0.1:{port}")
        return _SERVER["url"]


def storage_options() -> dict:
    """s3fs options for the local server (what ArtifactStore(url, **options) takes)."""
    return {
        **CREDENTIALS,
        "client_kwargs": {"endpoint_url": endpoint(), "region_name": "us-east-1"},
    }


def make_bucket(name: str | None = None) -> str:
    import boto3

    name = name or f"test-{uuid.uuid4().hex[:12]}"
    with _LOCK:
        if "client" not in _SERVER:
            _SERVER["client"] = boto3.client(
                "s3", endpoint_url=endpoint(), aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1",
            )
    _SERVER["client"].create_bucket(Bucket=name)
    return name


def shared_bucket() -> str:
    """One bucket per process; tests take a unique prefix in it (cheaper than a bucket each)."""
    with _LOCK:
        name = _SERVER.get("bucket")
    if name is None:
        name = make_bucket()
        _SERVER["bucket"] = name
    return name


def s3_url(prefix: str = "store") -> str:
    """A fresh, empty ``s3://`` location on the local server."""
    return f"s3://{shared_bucket()}/{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def s3_options() -> dict:
    return storage_options()


@pytest.fixture
def s3_bucket(s3_options) -> str:
    """A fresh, empty bucket."""
    return make_bucket()
