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
            for var, value in (
                ("AWS_ACCESS_KEY_ID", "testing"),
                ("AWS_SECRET_ACCESS_KEY", "testing"),
                ("AWS_DEFAULT_REGION", "us-east-1"),
            ):
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
                "s3",
                endpoint_url=endpoint(),
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
                region_name="us-east-1",
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


class MotoProcess:
    """A moto S3 server in a process of its own, so that a test can pause it (SIGSTOP) to
    play a hung endpoint; the in-process server above lives in the test's own process.

    >>> with MotoProcess() as server:  # doctest: +SKIP
    ...     server.pause()   # every request now hangs until it times out
    ...     server.resume()
    """

    def __init__(self) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def __enter__(self) -> MotoProcess:
        import subprocess
        import sys
        import time

        for var, value in (
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_DEFAULT_REGION", "us-east-1"),
        ):
            os.environ.setdefault(var, value)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from moto.server import main; main(sys.argv[1:])",
                "-H",
                "127.0.0.1",
                "-p",
                str(self.port),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError(f"the moto server on port {self.port} did not start") from None
                time.sleep(0.1)

    def options(self, **config_kwargs) -> dict:
        """s3fs options for this server; `config_kwargs` go to botocore's Config."""
        out = {**CREDENTIALS, "client_kwargs": {"endpoint_url": self.url, "region_name": "us-east-1"}}
        if config_kwargs:
            out["config_kwargs"] = config_kwargs
        return out

    def make_bucket(self, name: str | None = None) -> str:
        import boto3

        name = name or f"test-{uuid.uuid4().hex[:12]}"
        boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        ).create_bucket(Bucket=name)
        return name

    def pause(self) -> None:
        import signal

        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        import signal

        os.kill(self.proc.pid, signal.SIGCONT)

    def __exit__(self, *exc) -> None:
        import subprocess

        if self.proc is not None and self.proc.poll() is None:
            self.resume()  # a stopped process cannot act on SIGTERM
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="session")
def s3_options() -> dict:
    return storage_options()


@pytest.fixture
def s3_bucket(s3_options) -> str:
    """A fresh, empty bucket."""
    return make_bucket()
