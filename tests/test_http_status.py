"""HTTP status codes of a corpus URL, against a real http.server on loopback: 5xx and 429
are transient (the download task retries them with backoff), 404/410 read "no such file",
401/403 "no permission" — each its own one-line message."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from flows import cli
from flows.cli import main
from pipeline_lib.corpus import expand_sources
from pipeline_lib.errors import InputError
from pipeline_lib.fsio import HTTPStatusTransient, filesystem
from pipeline_lib.store import ArtifactStore
from tasks.common import is_transient

pytest.importorskip("aiohttp")

BODY = ("The quick brown fox jumps over the lazy dog. " * 400).encode()


class StatusServer:
    """Answers GET/HEAD of ``/<name>`` with the next status of ``plan[name]`` (the last one
    repeats; 200 serves BODY) and counts the GETs and HEADs of each path."""

    def __init__(self) -> None:
        self.plan: dict[str, list[int]] = {}
        self.hits: dict[str, int] = {}
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, with_body: bool) -> None:
                name = self.path.lstrip("/")
                seen = outer.hits.get(name, 0)
                outer.hits[name] = seen + 1
                codes = outer.plan.get(name, [404])
                status = codes[min(seen, len(codes) - 1)]
                self.send_response(status)
                body = BODY if status == 200 else b"error\n"
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if with_body:
                    self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                self._answer(True)

            def do_HEAD(self) -> None:  # noqa: N802
                self._answer(False)

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def flows_ready(prefect_harness):
    """As tests/test_failures.py: Prefect's logging set up before a test's capsys."""
    import os

    os.environ.setdefault(*cli.PREFECT_CONSOLE_CLASS)
    import flows.pipeline  # noqa: F401


@pytest.fixture(autouse=True)
def log_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(cli.ENV_LOG_DIR, str(tmp_path / "logs"))


@pytest.fixture
def server() -> Iterator[StatusServer]:
    s = StatusServer()
    yield s
    s.close()


@pytest.mark.parametrize(
    "status, exc_type, words, transient",
    [
        (500, HTTPStatusTransient, ["HTTP 500", "transient"], True),
        (502, HTTPStatusTransient, ["HTTP 502", "transient"], True),
        (503, HTTPStatusTransient, ["HTTP 503", "transient"], True),
        (429, HTTPStatusTransient, ["HTTP 429", "too many requests", "transient"], True),
        (404, FileNotFoundError, ["no such file"], False),
        (410, FileNotFoundError, ["no such file"], False),
        (401, PermissionError, ["HTTP 401", "no permission", "--storage-option"], False),
        (403, PermissionError, ["HTTP 403", "no permission", "--storage-option"], False),
    ],
)
def test_each_status_is_classified(server, status, exc_type, words, transient):
    server.plan["corpus.txt"] = [status]
    url = f"{server.url}/corpus.txt"
    with pytest.raises(exc_type) as raised:
        filesystem(url)[0].info(url)
    assert all(w in str(raised.value) for w in words), raised.value
    with pytest.raises(InputError) as e:
        expand_sources((url,))
    message = str(e.value)
    assert "\n" not in message and url in message and all(w in message for w in words), message
    if status not in (404, 410):
        assert "no such file" not in message
    assert is_transient(e.value) is transient


@pytest.mark.usefixtures("flows_ready")
def test_a_503_is_retried_by_the_download_task(server, tmp_path, capsys):
    """The source answers 503 twice (the HEAD and GET of fsspec's probe), then serves the file:
    the download task's retry fetches it and the run completes."""
    server.plan["corpus.txt"] = [503, 503, 200]
    store = str(tmp_path / "store")
    args = [
        "run",
        "--corpus",
        f"{server.url}/corpus.txt",
        "--store",
        store,
        "--no-lm",
        "--vocab-size",
        "260",
        "--workers",
        "1",
    ]
    assert main(args) == 0, capsys.readouterr().err
    assert ArtifactStore(store).latest("tokens") is not None
    assert server.hits["corpus.txt"] > 2


@pytest.mark.usefixtures("flows_ready")
@pytest.mark.parametrize("status, words", [(403, ["HTTP 403", "no permission"]), (410, ["no such file"])])
def test_permanent_statuses_fail_at_once_with_one_line(server, tmp_path, capsys, status, words):
    server.plan["corpus.txt"] = [status]
    url = f"{server.url}/corpus.txt"
    args = [
        "run",
        "--corpus",
        url,
        "--store",
        str(tmp_path / "store"),
        "--no-lm",
        "--vocab-size",
        "260",
        "--workers",
        "1",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("tokenmill: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert url in lines[0] and all(w in lines[0] for w in words), lines[0]
    # Two probes (HEAD and GET each): the run's source fingerprint and the one download try.
    # A retried download would probe a third time.
    assert server.hits["corpus.txt"] <= 4, server.hits
