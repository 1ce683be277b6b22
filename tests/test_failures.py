"""Every failure ends in one clear line: ``tokenmill: error: ...`` naming the file, URL or
store and what to do, an exit status (2 bad input, 1 other failures, 130 Ctrl-C, 143
SIGTERM), no traceback on the console, and nothing published half.

Most cases run `flows.cli.main` in-process against the session's Prefect API, with one
stage monkeypatched to fail the way it would (or for real: a full tmpfs, a paused or absent
S3 endpoint, `gc` removing a running stage's staging area). The console itself (Prefect's
log lines included) is checked in a few subprocesses, which reuse the session's API instead
of starting a temporary one each.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from flows import cli, failures
from flows.cli import main
from flows.failures import describe_failure
from pipeline_lib.errors import CancelledError, CheckpointError, ConfigError, InputError, ShardError, StoreError
from pipeline_lib.stages import spec as engine
from pipeline_lib.store import ArtifactStore

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def flows_ready(prefect_harness):
    """The session's Prefect API, with Prefect's logging set up now: set up inside a test,
    its console handler would keep writing to that test's capsys stream after it closed."""
    os.environ.setdefault(*cli.PREFECT_CONSOLE_CLASS)  # as main() does first
    import flows.pipeline  # noqa: F401  (imports Prefect, which sets up its logging)


@pytest.fixture
def corpus(tmp_path, shakespeare_text):
    path = tmp_path / "corpus.txt"
    path.write_text(shakespeare_text[:30_000], encoding="utf-8")
    return str(path)


@pytest.fixture
def log_dir(tmp_path, monkeypatch):
    directory = tmp_path / "logs"
    monkeypatch.setenv(cli.ENV_LOG_DIR, str(directory))
    return directory


def one_error_line(err: str, out: str = "") -> str:
    """The single ``tokenmill: error:`` line of a failed command; no traceback anywhere."""
    lines = [line for line in err.splitlines() if line.startswith("tokenmill: error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "Traceback" not in out, err
    return lines[0]


def run_args(corpus: str, store: str, *extra: str) -> list[str]:
    return ["run", "--corpus", corpus, "--store", store, "--no-lm", "--vocab-size", "300", "--workers", "2", *extra]


def assert_nothing_half_published(store_url: str) -> None:
    """Whatever the store lists is whole: every file of every version is there and hashes right."""
    store = ArtifactStore(store_url)
    for m in store.list():
        store.verify(m["kind"], m["version"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- the line itself
@pytest.mark.parametrize(
    "exc, code, words",
    [
        (InputError("corpus source 'x.txt': no such file"), 2, ["x.txt", "no such file"]),
        (ConfigError("vocab_size=10 is too small"), 2, ["vocab_size=10"]),
        (ShardError("/s/tokens/v/shard_000001.npy: truncated"), 1, ["shard_000001.npy"]),
        (CheckpointError("/s/model/ckpt: incomplete checkpoint"), 1, ["ckpt"]),
        (
            StoreError("tokens/abc (staging): shard_000000.npy is missing"),
            1,
            ["shard_000000.npy", "tokenmill gc", "--min-age"],
        ),
        (
            OSError(errno.ENOSPC, "No space left on device", "/data/store/x.part"),
            1,
            ["no space left", "/data/store/x.part", "another --store"],
        ),
        (OSError(errno.ENOSPC, "No space left on device"), 1, ["no space left", "/the/store"]),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), 1, ["quota", "/the/store"]),
        (OSError(28, "Error writing bytes to file. Detail: [errno 28] No space left on device"), 1, ["no space left"]),
        (RuntimeError("PytorchStreamWriter failed writing file data/0: No space left on device"), 1, ["no space left"]),
        (
            PermissionError(errno.EACCES, "Permission denied", "/data/store/raw"),
            1,
            ["permission denied", "/data/store/raw"],
        ),
        (PermissionError("Access Denied"), 1, ["permission denied", "/the/store", "credentials"]),
        (MemoryError(), 1, ["out of memory", "--shards"]),
        (OverflowError("Python int too large to convert to C long"), 1, ["overflow", "out of range"]),
        (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), 1, ["connection refused"]),
        (TimeoutError("timed out"), 1, ["in time", "read_timeout"]),
        (KeyboardInterrupt(), 130, ["interrupted", "rerun"]),
        (CancelledError("cancelled from the UI"), 130, ["cancelled from the UI"]),
        (failures.Terminated(signal.SIGTERM), 143, ["SIGTERM"]),
        (KeyError("oops"), 1, ["unexpected KeyError"]),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else None,
)
def test_describe_failure(exc, code, words):
    failure = describe_failure(exc, store="/the/store")
    assert failure.exit_code == code
    assert "\n" not in failure.message
    for word in words:
        assert word.lower() in failure.message.lower(), failure.message
    assert failure.unexpected == isinstance(exc, KeyError)


def test_botocore_errors_name_the_endpoint():
    from botocore import exceptions as botocore

    refused = botocore.EndpointConnectionError(
        endpoint_url="http://127.0.0.1:9/bucket?list-type=2", error=ConnectionRefusedError(111, "Connection refused")
    )
    failure = describe_failure(refused, store="s3://bucket/tm")
    assert (
        failure.exit_code == 1
        and "connection refused" in failure.message
        and "http://127.0.0.1:9/bucket" in failure.message
    )
    assert "no such file" not in failure.message and "list-type" not in failure.message
    hung = botocore.ReadTimeoutError(endpoint_url="http://127.0.0.1:9/bucket/key")
    failure = describe_failure(hung, store="s3://bucket/tm")
    assert "no answer from http://127.0.0.1:9/bucket/key" in failure.message and "read_timeout" in failure.message


def test_failure_log_is_private_and_redacted(log_dir):
    try:
        raise KeyError("boom")
    except KeyError as e:
        path = failures.write_failure_log(
            e, ["versions", "--storage-option", "secret=hunter2", "--store", "s3://me:pw@host/b"], "unexpected KeyError"
        )
    assert path and os.path.dirname(path) == str(log_dir)
    text = pathlib.Path(path).read_text()
    assert "Traceback" in text and "KeyError: 'boom'" in text
    assert "hunter2" not in text and "me:pw" not in text
    assert os.stat(path).st_mode & 0o077 == 0


# --------------------------------------------------------------------------- object stores
def test_s3_defaults_bound_every_request():
    from pipeline_lib.fsio import S3_CONFIG_DEFAULTS, filesystem

    fs, _ = filesystem("s3://bucket/x", key="k", secret="s")
    assert fs.config_kwargs == S3_CONFIG_DEFAULTS
    assert (
        all(fs.config_kwargs[k] for k in ("connect_timeout", "read_timeout"))
        and fs.config_kwargs["retries"]["total_max_attempts"] >= 1
    )
    mine = {"read_timeout": 5, "retries": {"max_attempts": 1}}
    fs, _ = filesystem("s3://bucket/x", key="k", secret="s", config_kwargs=mine)
    assert fs.config_kwargs == {
        "connect_timeout": S3_CONFIG_DEFAULTS["connect_timeout"],
        "read_timeout": 5,
        "retries": {"max_attempts": 1, "mode": "standard"},
    }
    fs.connect()  # botocore rewrites the retries dict it is given: neither ours nor the caller's
    assert mine == {"read_timeout": 5, "retries": {"max_attempts": 1}}
    assert S3_CONFIG_DEFAULTS["retries"] == {"total_max_attempts": 3, "mode": "standard"}
    assert filesystem("s3://bucket/y", key="k", secret="s")[0].config_kwargs == S3_CONFIG_DEFAULTS
    with pytest.raises(InputError, match="config_kwargs"):
        filesystem("s3://bucket/x", config_kwargs="fast")


def test_http_defaults_and_refused_connection_is_not_a_missing_file():
    import aiohttp  # noqa: F401

    from pipeline_lib.corpus import expand_sources
    from pipeline_lib.fsio import HTTP_TIMEOUT_DEFAULTS, filesystem

    fs, _ = filesystem("http://127.0.0.1:9/corpus.txt")
    timeout = fs.client_kwargs["timeout"]
    assert (
        timeout.total is None
        and timeout.sock_read == HTTP_TIMEOUT_DEFAULTS["sock_read"]
        and timeout.sock_connect == HTTP_TIMEOUT_DEFAULTS["sock_connect"]
    )
    fs2, _ = filesystem("http://127.0.0.1:9/corpus.txt", client_kwargs={"timeout": {"sock_read": 300}})
    assert (
        fs2.client_kwargs["timeout"].sock_read == 300
        and fs2.client_kwargs["timeout"].sock_connect == HTTP_TIMEOUT_DEFAULTS["sock_connect"]
    )
    url = f"http://user:pw@127.0.0.1:{_free_port()}/corpus.txt"
    with pytest.raises(ConnectionRefusedError, match="connection refused") as e:
        filesystem(url)[0].info(url)
    assert "pw" not in str(e.value)
    with pytest.raises(InputError, match="connection refused") as e:
        expand_sources((url,))
    assert "no such file" not in str(e.value)


def test_s3_refused_through_the_cli(capsys, log_dir):
    endpoint = f"http://127.0.0.1:{_free_port()}"
    args = [
        "versions",
        "--store",
        "s3://bucket/tm",
        "--storage-option",
        f"endpoint_url={endpoint}",
        "--storage-option",
        "key=k",
        "--storage-option",
        "secret=s",
        "--storage-option",
        'config_kwargs={"connect_timeout": 1, "retries": {"total_max_attempts": 1}}',
    ]
    assert main(args) == 1
    captured = capsys.readouterr()
    line = one_error_line(captured.err, captured.out)
    assert f"cannot connect to {endpoint}" in line and "connection refused" in line and "endpoint_url" in line


def test_paused_s3_endpoint_fails_in_bounded_time(capsys, log_dir):
    """A hung server (the moto process SIGSTOPped) ends reads and writes with one clear error."""
    import s3fs  # noqa: F401
    from s3_server import MotoProcess

    fast = {"connect_timeout": 1, "read_timeout": 0.5, "retries": {"total_max_attempts": 1}}
    with MotoProcess() as server:
        bucket = server.make_bucket()
        url = f"s3://{bucket}/tm"
        store = ArtifactStore(url, **server.options())
        staging = store.stage("notes", "v1")
        store.publish(staging, files={"a.txt": staging.put_bytes("a.txt", b"hello")})
        server.pause()
        try:
            args = [
                "versions",
                "--store",
                url,
                "--storage-option",
                f"endpoint_url={server.url}",
                "--storage-option",
                "key=testing",
                "--storage-option",
                "secret=testing",
                "--storage-option",
                f"config_kwargs={__import__('json').dumps(fast)}",
            ]
            assert main(args) == 1
            captured = capsys.readouterr()
            line = one_error_line(captured.err, captured.out)
            assert f"no answer from {server.url}/{bucket}" in line and "read_timeout" in line, line
            # A write through the library, with the same short timeouts.
            hung = ArtifactStore(url, **server.options(**fast))
            with pytest.raises(Exception) as e:
                hung.stage("notes", "v2").put_bytes("b.txt", b"world")
            failure = describe_failure(e.value, store=url)
            assert failure.exit_code == 1 and server.url in failure.message and "no answer" in failure.message
            # A hung call would never end: the per-test timeout (pyproject.toml) fails it.
        finally:
            server.resume()
        assert [m["version"] for m in store.list("notes")] == ["v1"]  # nothing half-published


# --------------------------------------------------------------------------- a flow that fails
def _raise(exc: BaseException):
    def stage(*args, **kwargs):
        raise copy.copy(exc)  # a fresh exception per call: mapped tasks raise it in several threads

    return stage


# Where the tasks enter a stage (`pipeline_lib.stages.spec`): the engine's entry point and
# the stage's output kind, by the library function the cases are named after.
_ENTRIES = {
    "learn_tokenizer": ("produce", "tokenizer"),
    "count_shard": ("run_unit", "counts"),
    "publish_tokens": ("produce", "tokens"),
}


def _patch_stage(monkeypatch, stage: str, replacement) -> None:
    """Make the tasks' calls into `stage` go to `replacement`; other stages run as usual."""
    entry, kind = _ENTRIES[stage]
    real = getattr(engine, entry)

    def patched(spec, *args, **kwargs):
        return (replacement if spec.kind == kind else real)(spec, *args, **kwargs)

    monkeypatch.setattr(engine, entry, patched)


@pytest.mark.usefixtures("flows_ready")
@pytest.mark.parametrize(
    "stage, exc, code, words",
    [
        (
            "learn_tokenizer",
            ShardError("/s/tokens/v/shard_000001.npy: 100 bytes, the header says 400"),
            1,
            ["shard_000001.npy"],
        ),
        (
            "learn_tokenizer",
            CheckpointError("/s/model/v/ckpt_000100: incomplete (no completion marker)"),
            1,
            ["ckpt_000100"],
        ),
        (
            "count_shard",
            MemoryError("Unable to allocate 64.0 GiB for an array"),
            1,
            ["out of memory", "count_words", "--shards"],
        ),
        (
            "learn_tokenizer",
            OverflowError("Python int too large to convert to C long"),
            1,
            ["overflow", "--vocab-size"],
        ),
        (
            "count_shard",
            PermissionError(errno.EACCES, "Permission denied", "/data/store/counts/.staging/x"),
            1,
            ["permission denied", "/data/store/counts/.staging/x"],
        ),
        ("learn_tokenizer", KeyboardInterrupt(), 130, ["interrupted", "rerun the same command"]),
        ("learn_tokenizer", CancelledError("cancelled"), 130, ["cancelled"]),
        (
            "learn_tokenizer",
            ZeroDivisionError("division by zero"),
            1,
            ["unexpected ZeroDivisionError", "a bug", "--debug"],
        ),
    ],
    ids=[
        "ShardError",
        "CheckpointError",
        "MemoryError",
        "OverflowError",
        "PermissionError",
        "KeyboardInterrupt",
        "CancelledError",
        "bug",
    ],
)
def test_failing_stage(stage, exc, code, words, corpus, tmp_path, monkeypatch, capsys, log_dir):
    _patch_stage(monkeypatch, stage, _raise(exc))
    store = str(tmp_path / "store")
    assert main(run_args(corpus, store)) == code
    captured = capsys.readouterr()
    line = one_error_line(captured.err, captured.out)
    for word in words:
        assert word in line, line
    logs = list(log_dir.glob("tokenmill-*.log"))
    assert len(logs) == 1 and "Traceback" in logs[0].read_text()
    assert (str(logs[0]) in line) == (code == 1 and "unexpected" in line)  # the path only for bugs
    assert_nothing_half_published(store)


@pytest.mark.usefixtures("flows_ready")
def test_debug_prints_the_traceback(corpus, tmp_path, monkeypatch, capsys, log_dir):
    _patch_stage(monkeypatch, "learn_tokenizer", _raise(ZeroDivisionError("division by zero")))
    assert main(["--debug", *run_args(corpus, str(tmp_path / "store"))]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "ZeroDivisionError" in err and err.count("tokenmill: error:") == 1
    assert cli.ENV_DEBUG not in os.environ  # restored for whoever runs next in this process


@pytest.mark.usefixtures("flows_ready")
def test_http_source_refused_through_the_cli(tmp_path, capsys, log_dir):
    url = f"http://127.0.0.1:{_free_port()}/corpus.txt"
    assert main(run_args(url, str(tmp_path / "store"))) == 2
    captured = capsys.readouterr()
    line = one_error_line(captured.err, captured.out)
    assert url in line and "connection refused" in line and "no such file" not in line


@pytest.mark.usefixtures("flows_ready")
def test_gc_removes_the_staging_area_of_a_running_flow(corpus, tmp_path, monkeypatch, capsys, log_dir):
    """`tokenmill gc --min-age 0` while a run is between encoding and publishing its tokens."""
    store = str(tmp_path / "store")
    real = engine.produce

    def gc_then_publish(*args, **kwargs):
        assert main(["gc", "--store", store, "--min-age", "0"]) == 0
        return real(*args, **kwargs)

    _patch_stage(monkeypatch, "publish_tokens", gc_then_publish)
    assert main(run_args(corpus, store)) == 1
    captured = capsys.readouterr()
    line = one_error_line(captured.err, captured.out)
    assert "staging" in line and "tokenmill gc" in line and "rerun the same command" in line, line
    assert ArtifactStore(store).latest("tokens") is None
    assert_nothing_half_published(store)
    monkeypatch.setattr(engine, "produce", real)
    assert main(run_args(corpus, store)) == 0  # the rerun completes it
    assert ArtifactStore(store).latest("tokens") is not None


@contextlib.contextmanager
def full_disk(path, size="192k"):
    """A tiny tmpfs at `path` (real ENOSPC from the kernel), or None where mounting is not
    allowed (not root, no CAP_SYS_ADMIN): the caller then simulates the error."""
    os.makedirs(path, exist_ok=True)
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, check=False
        ).returncode
        == 0
    )
    try:
        yield path if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.usefixtures("flows_ready")
def test_disk_full(tmp_path, shakespeare_text, monkeypatch, capsys, log_dir):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(shakespeare_text[:400_000], encoding="utf-8")
    with full_disk(tmp_path / "full") as mount:
        if mount is None:  # no tmpfs here: the copy into the store fails as a full disk would
            import pipeline_lib.corpus_sources

            monkeypatch.setattr(
                pipeline_lib.corpus_sources, "hash_stream", _raise(OSError(errno.ENOSPC, "No space left on device"))
            )
        store = str(tmp_path / "full" / "store")
        assert main(run_args(str(corpus), store)) == 1
        captured = capsys.readouterr()
        line = one_error_line(captured.err, captured.out)
        assert "no space left on device" in line and store in line and "rerun the same command" in line, line
        assert_nothing_half_published(store)


# --------------------------------------------------------------------------- the real console
def _cli_process(tmp_path, args, inject: str = "", api_url: str | None = None) -> subprocess.Popen:
    """`tokenmill ARGS` in a subprocess (after running `inject`), on the session's Prefect API."""
    code = textwrap.dedent(inject) + "\nimport sys\nfrom flows.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    env = {**os.environ, cli.ENV_LOG_DIR: str(tmp_path / "logs"), "PYTHONPATH": ROOT}
    env.pop(cli.PREFECT_CONSOLE_CLASS[0], None)  # as a fresh shell has it: main() sets it
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def api_url(flows_ready):
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


def test_console_bad_input(tmp_path, api_url):
    proc = _cli_process(
        tmp_path,
        ["run", "--corpus", str(tmp_path / "nonexistent.txt"), "--no-lm", "--store", str(tmp_path / "s")],
        api_url=api_url,
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    line = one_error_line(err, out)
    assert "nonexistent.txt" in line and "no such file" in line
    assert "Encountered exception" in err  # Prefect's own one-line report is still there, without its traceback


def test_console_bug_in_a_mapped_task(tmp_path, corpus, api_url):
    inject = """
        import pipeline_lib.stages.spec as engine
        real = engine.run_unit
        def run_unit(stage, *args, **kwargs):
            return {}["missing"] if stage.kind == "counts" else real(stage, *args, **kwargs)
        engine.run_unit = run_unit
    """
    proc = _cli_process(tmp_path, run_args(corpus, str(tmp_path / "s")), inject, api_url)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    line = one_error_line(err, out)
    assert "unexpected KeyError" in line and "--debug" in line
    log = line.split("the full traceback is in ", 1)[1].split(";", 1)[0]
    assert os.path.dirname(log) == str(tmp_path / "logs") and "Traceback" in pathlib.Path(log).read_text()


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_console_signal(tmp_path, corpus, api_url, signum, code):
    started, slept = tmp_path / "started", tmp_path / "slept"
    inject = f"""
        import pathlib, time
        import pipeline_lib.stages.spec as engine
        real = engine.produce
        def produce(stage, *args, **kwargs):
            if stage.kind != "tokenizer":
                return real(stage, *args, **kwargs)
            pathlib.Path({str(started)!r}).touch()
            time.sleep(60)
            pathlib.Path({str(slept)!r}).touch()
        engine.produce = produce
    """
    proc = _cli_process(tmp_path, run_args(corpus, str(tmp_path / "s")), inject, api_url)
    try:
        while not started.exists():  # a run that never gets there: the per-test timeout
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err
    assert not slept.exists()  # the signal ended the stage, not the stage's 60 s
    line = one_error_line(err, out)
    assert ("interrupted" if signum == signal.SIGINT else "SIGTERM") in line and "rerun the same command" in line
    assert_nothing_half_published(str(tmp_path / "s"))
