"""How `tokenmill` starts: what it imports, which Prefect API its flows use, and what the
local Prefect server leaves in PREFECT_HOME (flows/prefect_api.py, flows/local_server.py).

The commands run in subprocesses with their own PREFECT_HOME and no PREFECT_API_URL, as a
user's shell runs them; every local server a test starts is stopped before it ends.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flows.cli import main
from flows.prefect_api import LocalServer, TagLimits, flow_api, local_client_settings, server_dir

ROOT = Path(__file__).resolve().parent.parent


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "TOKENMILL_"))}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_LOGGING_LEVEL="WARNING",
        TOKENMILL_SERVER_IDLE_TIMEOUT="300",
    )  # a server a failed test leaves stops by itself
    env.update(extra)
    return env


def _tokenmill(args: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def _assert_one_error_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    lines = [line for line in proc.stderr.splitlines() if line.startswith("tokenmill: error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def corpus(tmp_path, shakespeare_text) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(shakespeare_text[:40_000], encoding="utf-8")
    return path


def _wait_for_runner(directory: Path, timeout: float = 120) -> int:
    """The pid of the warm runner serving in `directory`, once it serves."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return int(json.loads((directory / "warm.json").read_text())["pid"])
        except (OSError, ValueError, KeyError):
            time.sleep(0.2)
    raise AssertionError(
        f"no warm runner in {directory} after {timeout} s: "
        f"{(directory / 'warm.log').read_text() if (directory / 'warm.log').exists() else ''}"
    )


def wait_gone(pid: int, timeout: float = 60) -> None:
    """Wait for process `pid` to end (an AssertionError after `timeout` s); tests/test_warm.py too."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    raise AssertionError(f"process {pid} still runs after {timeout} s")


def _train_args(corpus: Path, store: Path) -> list[str]:
    return [
        "tokenizer",
        "train",
        "--corpus",
        str(corpus),
        "--vocab-size",
        "300",
        "--workers",
        "2",
        "--store",
        str(store),
    ]


# ------------------------------------------------------------------------------ imports
def test_tokenizer_commands_import_neither_torch_nor_matplotlib():
    script = """
import sys
import flows.cli
argv = ["tokenizer", "train", "--corpus", "x.txt", "--vocab-size", "512"]
flows.cli.build_parser(argv).parse_args(argv)
assert "prefect" not in sys.modules, "parsing imports prefect"
import flows.pipeline  # what `tokenizer train` imports to run its flows
heavy = sorted(m for m in ("torch", "matplotlib") if m in sys.modules)
assert not heavy, heavy
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


# What the everyday tokenizer commands need is the tokenizer (numpy, regex, the core): none of
# what the other commands import (Prefect, the stage configs' pydantic, the LM's torch, the
# store, fsspec for a tokenizer saved in a local directory). Each import here cost 40-80 ms of
# a command's start.
_NOT_FOR_TOKENIZER_COMMANDS = ("prefect", "pydantic", "torch", "pandas", "pyarrow", "pipeline_lib.lab_compare")
_NOT_FOR_LOCAL_FILES = ("fsspec", "pipeline_lib.store", "pipeline_lib.version")


def test_tokenizer_commands_import_only_the_tokenizer(tmp_path):
    from pipeline_lib import Tokenizer

    saved = tmp_path / "tok"
    Tokenizer.train(["hello world, hello tokens " * 20], vocab_size=270, pattern="cl100k").save(str(saved))
    ids = tmp_path / "ids.npy"
    commands = [
        ["tokenizer", "encode", "--tokenizer", str(saved), "--text", "hello world"],
        ["tokenizer", "encode", "--tokenizer", str(saved), "--text", "hello world", "--output", str(ids)],
        ["tokenizer", "decode", "--tokenizer", str(saved), "--input", str(ids)],
        ["tokenizer", "decode", "--tokenizer", str(saved), "--ids", "104,101"],
        ["tokenizer", "vocab", "--tokenizer", str(saved), "--search", "hel"],
        ["tokenizer", "merges", "--tokenizer", str(saved)],
        ["tokenizer", "inspect", "--tokenizer", str(saved)],
    ]
    script = f"""
import contextlib, io, json, sys
from flows.cli import main
for argv in {commands!r}:
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0, argv
    loaded = [m for m in {_NOT_FOR_TOKENIZER_COMMANDS + _NOT_FOR_LOCAL_FILES!r} if m in sys.modules]
    assert not loaded, (argv, loaded)
for name in ("gpt2", "cl100k_base"):  # production encodings, from the files installed packages ship (.gz)
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["tokenizer", "encode", "--tokenizer", name, "--text", "hello world"]) == 0
    loaded = [m for m in {_NOT_FOR_TOKENIZER_COMMANDS + _NOT_FOR_LOCAL_FILES!r} if m in sys.modules]
    assert not loaded, (name, loaded)
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300, env=_env(tmp_path / "h")
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_tiktoken_calls_and_the_encode_command_import_no_numpy(tmp_path):
    """NumPy took ~0.12 s of a ~0.38 s program that loads cl100k and encodes one text: a program
    written for tiktoken, the command that encodes a file to a .npy and the one that prints a
    text's ids do without it."""
    text = tmp_path / "in.txt"
    text.write_text("hello world\n" * 1000 + "héllo wörld 🙂\n", encoding="utf-8")
    argv = [
        "tokenizer",
        "encode",
        "--tokenizer",
        "cl100k_base",
        "--input",
        str(text),
        "--output",
        str(tmp_path / "ids.npy"),
    ]
    script = f"""
import contextlib, io, sys
import pipeline_lib as tiktoken
enc = tiktoken.get_encoding("cl100k_base")
ids = enc.encode("hello world <|endoftext|>", allowed_special="all")
assert enc.decode(ids) == "hello world <|endoftext|>"
assert enc.encode_ordinary_batch(["a b", "héllo"]) == [enc.encode_ordinary("a b"), enc.encode_ordinary("héllo")]
assert enc.decode_batch([ids]) == [enc.decode(ids)] and enc.decode_single_token_bytes(ids[0]) == b"hello"
assert tiktoken.encoding_for_model("gpt-4o").name == "o200k_base"
assert "numpy" not in sys.modules, "tiktoken's calls imported numpy"
from flows.cli import main
with contextlib.redirect_stdout(io.StringIO()) as printed:
    assert main({argv!r}) == 0
assert "numpy" not in sys.modules, "the file command imported numpy"
print(printed.getvalue().strip())
with contextlib.redirect_stdout(io.StringIO()) as shown:
    assert main(["tokenizer", "encode", "--tokenizer", "cl100k_base", "--text", "hello world"]) == 0
assert shown.getvalue().split() == ["15339", "1917"] and "numpy" not in sys.modules, "--text imported numpy"
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300, env=_env(tmp_path / "h")
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    from pipeline_lib import get_encoding

    content = text.read_text(encoding="utf-8")
    n_ids, n_chars, n_bytes = (
        len(get_encoding("cl100k_base").encode_ordinary(content)),
        len(content),
        text.stat().st_size,
    )
    assert n_bytes > n_chars  # the characters are counted, not the bytes
    assert proc.stdout.startswith(
        f"{n_ids} tokens -> {tmp_path / 'ids.npy'} ({n_chars:,} characters, {n_bytes:,} bytes"
    )


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="threads counted in /proc")
def test_tokenizer_commands_start_no_blas_threads(tmp_path):
    """numpy's OpenBLAS would start a thread per core as it loads (~55 ms on 2 cores): the
    tokenizer commands load it with one, and leave the environment as it was."""
    script = """
import contextlib, io, os
from flows.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    assert main(["tokenizer", "encode", "--tokenizer", "gpt2", "--text", "hello world"]) == 0
print(len(os.listdir("/proc/self/task")), "OPENBLAS_NUM_THREADS" in os.environ)
"""
    env = {k: v for k, v in _env(tmp_path / "h").items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["1", "False"], proc.stdout


def test_help_of_every_command_is_the_whole_parsers(tmp_path):
    """`tokenmill CMD --help` builds only CMD's options (its stage configs); each help text is
    the one the whole parser gives, word for word."""
    script = """
import argparse, contextlib, io, json, sys
from flows.cli import build_parser, main

def commands(parser, words):
    yield words, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, [*words, name])

out = {}
for words, whole in commands(build_parser(None), []):
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown), contextlib.suppress(SystemExit):
        main([*words, "--help"])
    out[" ".join(words)] = [whole, shown.getvalue()]
print(json.dumps(out))
"""
    env = _env(tmp_path / "h", COLUMNS="100")
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    helps = json.loads(proc.stdout)
    assert {"", "tokenizer encode", "tokenizer decode", "run", "compare"} <= set(helps), sorted(helps)
    differ = [words for words, (whole, shown) in helps.items() if whole != shown]
    assert not differ, differ
    assert "--special-as-text" in helps["tokenizer encode"][1] and "--vocab-size" in helps["tokenizer train"][1]


def test_only_the_program_skips_the_collections_at_exit(tmp_path):
    script = """
import gc, sys
from flows.cli import main
assert main(["server", "status"]) == 0 and gc.get_freeze_count() == 0  # a caller in-process keeps a collectable heap
sys.argv = ["tokenmill", "server", "status"]
assert main() == 0 and gc.get_freeze_count() > 0  # the program: exiting next, its heap is left to the exit
"""
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(tmp_path / "home"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_lm_package_loads_torch_only_when_used():
    script = """
import sys, types
import pipeline_lib.lm.config
assert "torch" not in sys.modules
import pipeline_lib.lm.report  # imports submodule pipeline_lib.lm.train
import pipeline_lib.lm as lm
from pipeline_lib.lm import train, sample, GPT, PRESETS
assert isinstance(lm.train, types.FunctionType) and lm.train is train, lm.train
assert isinstance(sample, types.FunctionType) and "tiny" in PRESETS and GPT.__name__ == "GPT"
assert "torch" in sys.modules
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


# ------------------------------------------------------------------------------ start path
def test_the_local_server_is_started_once_and_reused(tmp_path, corpus):
    home = tmp_path / "home"
    env = _env(home, TOKENMILL_WARM="1")
    local = LocalServer(server_dir(home))
    try:
        first = _tokenmill(_train_args(corpus, tmp_path / "s1"), env)
        assert first.returncode == 0, first.stderr[-3000:]
        state = json.loads(local.state_path.read_text())
        # It says that it starts a server, and what it leaves running.
        assert first.stderr.count("starting tokenmill's local Prefect server") == 1, first.stderr[-3000:]
        assert (
            f"tokenmill's local Prefect server (pid {state['pid']}) and its warm runner keep running until 5 min"
            in first.stderr
        )
        # The first command left a warm runner (flows/warm.py) starting: the next command runs in it.
        runner = _wait_for_runner(local.directory)
        second = _tokenmill(_train_args(corpus, tmp_path / "s2"), env)
        assert second.returncode == 0, second.stderr[-3000:]
        assert json.loads(local.state_path.read_text())["pid"] == state["pid"]  # the same server
        served = (local.directory / "warm.log").read_text()
        assert f"tokenmill {' '.join(_train_args(corpus, tmp_path / 's2'))}" in served, served
        assert _wait_for_runner(local.directory) == runner, served  # still the same runner: a served command keeps it
        assert (tmp_path / "s2" / "tokenizer").is_dir() and "-> " in second.stdout
        assert "View at" not in first.stderr + first.stdout  # the server has no UI to link to
        assert "starting tokenmill's local Prefect server" not in second.stderr
        status = _tokenmill(["server", "status"], env, timeout=120)
        assert status.returncode == 0 and state["api_url"] in status.stdout, status.stdout
        assert f"warm runner: pid {runner}" in status.stdout and "idle time-out: 5 min" in status.stdout, status.stdout
        # One flow run per command: corpus and tokenizer together; only with the credential.
        import httpx

        assert httpx.post(f"{state['api_url']}/flow_runs/filter", json={}, timeout=60).status_code == 401
        auth = tuple(local.auth_path.read_text().strip().split(":", 1))
        assert local.auth_path.stat().st_mode & 0o777 == 0o600
        runs = httpx.post(f"{state['api_url']}/flow_runs/filter", json={}, timeout=60, auth=auth).json()
        names = sorted(r["name"] for r in runs)
        assert (
            len(names) == 2
            and names[0].startswith("tokenizer-corpus-")
            and names[0].endswith("@s1")
            and names[1].endswith("@s2")
        ), names
        # A failure in a served command reads as in a fresh process: one line, no traceback.
        bad = _tokenmill(_train_args(tmp_path / "missing.txt", tmp_path / "s3"), env)
        assert bad.returncode == 2 and "missing.txt" in (local.directory / "warm.log").read_text(), bad.stderr[-3000:]
        assert "Traceback" not in bad.stderr + bad.stdout, bad.stderr[-3000:]
        assert [line for line in bad.stderr.splitlines() if line.startswith("tokenmill: error:")] == [
            f"tokenmill: error: corpus source '{tmp_path / 'missing.txt'}': no such file"
        ], bad.stderr[-3000:]
        assert any(local.storage_dir.iterdir())  # the runs' task results are kept with it
        assert not (home / "storage").exists() and not (home / "prefect.db").exists()
    finally:
        stop = _tokenmill(["server", "stop"], env, timeout=120)
    assert stop.returncode == 0 and "stopped" in stop.stdout, stop.stdout + stop.stderr
    assert not local.state_path.exists()
    wait_gone(runner)  # the runner leaves with its server
    assert "not running" in _tokenmill(["server", "status"], env, timeout=120).stdout
    gc = _tokenmill(["gc", "--prefect-home", "--store", str(tmp_path / "s1")], env, timeout=120)
    assert gc.returncode == 0 and not (local.directory / "warm.log").exists() and not local.auth_path.exists(), (
        gc.stdout
    )


def test_local_server_clients_skip_heartbeats_and_csrf_unless_asked(tmp_path, monkeypatch):
    from prefect.context import SettingsContext, get_settings_context
    from prefect.settings import Settings, temporary_settings

    local = LocalServer(tmp_path / "tokenmill")

    def effective() -> tuple[dict[str, str], Settings]:
        settings = Settings()  # from this environment
        env, updates, defaults = local_client_settings(local, "http://127.0.0.1:1/api", settings)
        with (
            SettingsContext(profile=get_settings_context().profile, settings=settings),
            temporary_settings(updates=updates, set_defaults=defaults) as s,
        ):
            return env, s

    for name in (
        "PREFECT_FLOWS_HEARTBEAT_FREQUENCY",
        "PREFECT_RUNNER_HEARTBEAT_FREQUENCY",
        "PREFECT_SERVER_API_CSRF_PROTECTION_ENABLED",
    ):
        monkeypatch.delenv(name, raising=False)
    env, s = effective()
    assert (
        s.flows.heartbeat_frequency is None
        and s.client.csrf_support_enabled is False
        and s.api.url == "http://127.0.0.1:1/api"
    )
    assert env["PREFECT_CLIENT_CSRF_SUPPORT_ENABLED"] == "false"
    # The user's heartbeats (for the zombie automation) and a server that wants CSRF tokens are kept.
    monkeypatch.setenv("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "30")
    monkeypatch.setenv("PREFECT_SERVER_API_CSRF_PROTECTION_ENABLED", "true")
    env, s = effective()
    assert (
        s.flows.heartbeat_frequency == 30
        and s.client.csrf_support_enabled is True
        and "PREFECT_CLIENT_CSRF_SUPPORT_ENABLED" not in env
    )


def test_task_runs_take_concurrency_slots_only_for_tags_with_a_limit(prefect_harness):
    import uuid

    import prefect.task_engine
    from prefect import flow, tags, task
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    limited = f"limited-{uuid.uuid4().hex[:8]}"
    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=f"tag:{limited}", limit=1))

    def active_slots() -> int:
        with get_client(sync_client=True) as client:
            return client.read_global_concurrency_limit_by_name(f"tag:{limited}").active_slots

    @task
    def held() -> int:
        return active_slots()

    @task
    def free() -> int:
        return active_slots()

    @flow
    def two_tasks() -> tuple[int, int]:
        with tags(limited):
            during_limited = held()
        with tags("no-limit-here"):
            during_free = free()
        return during_limited, during_free

    asked: list[list[str]] = []
    original = prefect.task_engine._concurrency
    with flow_api():  # PREFECT_API_URL from the harness: the same routing as with any API
        limits = prefect.task_engine._concurrency.__self__
        assert isinstance(limits, TagLimits) and limits.original is original

        def recording(names, *args, **kwargs):
            asked.append(list(names))
            return original(names, *args, **kwargs)

        limits.original = recording
        assert two_tasks() == (1, 0)  # the limited task held its slot, the other took none
    assert prefect.task_engine._concurrency is original
    assert asked == [[f"tag:{limited}"]], asked  # one request, for the tag with a limit
    assert active_slots() == 0  # released


def test_a_prefect_without_the_private_names_runs_flows_unpatched(prefect_harness, monkeypatch):
    """The two private names `TagLimits` and `SlotWaitLog` replace are checked before use: a
    Prefect that renamed them keeps its own behaviour (a request per task run), and the
    flow still runs."""
    import prefect.concurrency._sync as sync
    import prefect.task_engine
    from prefect import flow, task

    from flows.concurrency_slots import SlotWaitLog

    monkeypatch.delattr(prefect.task_engine, "_concurrency")
    monkeypatch.delattr(sync, "acquire_concurrency_slots_with_lease")
    with TagLimits.installed() as limits, SlotWaitLog.installed(30.0):
        assert limits is None
        assert not hasattr(prefect.task_engine, "_concurrency") and not hasattr(
            sync, "acquire_concurrency_slots_with_lease"
        )
    monkeypatch.undo()

    @task
    def one() -> int:
        return 1

    @flow
    def a_flow() -> int:
        return one()

    with flow_api():
        assert prefect.task_engine._concurrency.__self__.__class__ is TagLimits
        assert a_flow() == 1


def test_a_server_that_does_not_answer_in_time_is_one_error_line(tmp_path, corpus):
    home = tmp_path / "home"
    proc = _tokenmill(_train_args(corpus, tmp_path / "store"), _env(home, TOKENMILL_SERVER_STARTUP_TIMEOUT="0.01"))
    _assert_one_error_line(proc, "did not answer within 0.01 s", "PREFECT_API_URL", "TOKENMILL_SERVER_STARTUP_TIMEOUT")
    local = LocalServer(server_dir(home))
    assert local.read_state() is None and local.status() is None  # the half-started server was stopped


def test_a_server_that_exits_while_starting_is_one_error_line(tmp_path, corpus):
    home = tmp_path / "home"
    bad_db = f"sqlite+aiosqlite:///{tmp_path}/no/such/dir/prefect.db"
    proc = _tokenmill(_train_args(corpus, tmp_path / "store"), _env(home, PREFECT_API_DATABASE_CONNECTION_URL=bad_db))
    line = _assert_one_error_line(proc, "exited with status", "while starting", "server.log")
    assert str(server_dir(home)) in line


def test_an_unreachable_api_url_is_one_error_line(tmp_path, corpus):
    from tests.prefect_server import free_port

    url = f"http://127.0.0.1:{free_port()}/api"  # nothing listens there
    proc = _tokenmill(_train_args(corpus, tmp_path / "store"), _env(tmp_path / "home", PREFECT_API_URL=url))
    _assert_one_error_line(proc, "cannot reach the Prefect API", "127.0.0.1")
    assert not server_dir(tmp_path / "home").exists()  # PREFECT_API_URL set: no local server


class _Failing(http.server.BaseHTTPRequestHandler):
    def _fail(self):
        body = b'{"detail": "broken"}'
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _fail

    def log_message(self, *args):
        pass


def test_a_broken_api_is_one_error_line(tmp_path, corpus):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/api"
        proc = _tokenmill(_train_args(corpus, tmp_path / "store"), _env(tmp_path / "home", PREFECT_API_URL=url))
    finally:
        server.shutdown()
    _assert_one_error_line(proc, "HTTP 500")


def test_a_bad_mode_is_bad_input(tmp_path, corpus):
    proc = _tokenmill(
        _train_args(corpus, tmp_path / "store"), _env(tmp_path / "home", TOKENMILL_PREFECT_SERVER="remote")
    )
    assert proc.returncode == 2 and proc.stderr.count("tokenmill: error:") == 1, proc.stderr[-3000:]
    assert "TOKENMILL_PREFECT_SERVER" in proc.stderr and "Traceback" not in proc.stderr


# ------------------------------------------------------------------------------ gc
def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _write(path: Path, text: str = "x", age_s: float = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if age_s:
        t = time.time() - age_s
        os.utime(path, (t, t))
    return path


def _prefect_home(tmp_path: Path) -> tuple[Path, dict[str, Path], dict[str, Path]]:
    """A PREFECT_HOME with tokenmill's local-server files and files of others."""
    home = tmp_path / "home"
    ours_dir = home / "tokenmill"
    dead = _dead_pid()
    ours = {
        "db": _write(ours_dir / "prefect.db"),
        "wal": _write(ours_dir / "prefect.db-wal"),
        "shm": _write(ours_dir / "prefect.db-shm"),
        "log": _write(ours_dir / "server.log"),
        "memo": _write(ours_dir / "memo_store.toml"),
        "state": _write(
            ours_dir / "server.json", json.dumps({"pid": dead, "port": 1, "api_url": "http://127.0.0.1:1/api"})
        ),
        "client": _write(ours_dir / "clients" / str(dead)),
        "result": _write(ours_dir / "storage" / "count_words-abc", age_s=7200),
        "nested": _write(ours_dir / "storage" / "sub" / "learn_merges-def", age_s=7200),
        "failure_log": _write(home / "logs" / "tokenmill-20260101-000000-000000-1.log", age_s=7200),
    }
    others = {
        "young_result": _write(ours_dir / "storage" / "encode_shard-new"),  # younger than --min-age
        "young_log": _write(home / "logs" / "tokenmill-20990101-000000-000000-2.log"),
        "prefect_db": _write(home / "prefect.db", age_s=7200),
        "profiles": _write(home / "profiles.toml", age_s=7200),
        "prefect_storage": _write(home / "storage" / "some-result", age_s=7200),
        "other_log": _write(home / "logs" / "prefect-server.log", age_s=7200),
        "other_in_dir": _write(ours_dir / "notes.txt", age_s=7200),
    }
    return home, ours, others


def test_gc_prefect_home_removes_only_what_tokenmill_put_there(tmp_path, monkeypatch, capsys):
    home, ours, others = _prefect_home(tmp_path)
    monkeypatch.setenv("PREFECT_HOME", str(home))
    monkeypatch.delenv("TOKENMILL_LOG_DIR", raising=False)
    store = str(tmp_path / "store")

    assert main(["gc", "--prefect-home", "--store", store, "--min-age", "3600", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert all(p.exists() for p in [*ours.values(), *others.values()])
    assert all(f"would remove {p}" in out for p in ours.values()), out

    assert main(["gc", "--prefect-home", "--store", store, "--min-age", "3600"]) == 0
    out = capsys.readouterr().out
    gone = [name for name, p in ours.items() if p.exists()]
    assert not gone, (gone, out)
    kept = [name for name, p in others.items() if not p.exists()]
    assert not kept, (kept, out)
    for p in others.values():
        assert f"removed {p}\n" not in out


def test_gc_prefect_home_keeps_the_database_while_a_command_runs(tmp_path, monkeypatch, capsys):
    home, ours, _others = _prefect_home(tmp_path)
    monkeypatch.setenv("PREFECT_HOME", str(home))
    _write(home / "tokenmill" / "clients" / str(os.getpid()))  # this process: a running command
    assert main(["gc", "--prefect-home", "--store", str(tmp_path / "store"), "--min-age", "3600"]) == 0
    out = capsys.readouterr().out
    assert "command(s) running" in out and str(os.getpid()) in out
    assert ours["db"].exists() and ours["wal"].exists() and ours["log"].exists()
    assert not ours["result"].exists() and not ours["client"].exists()  # old results and dead registrations go


def test_server_status_and_stop_when_none_runs(tmp_path):
    env = _env(tmp_path / "home")
    status = _tokenmill(["server", "status"], env, timeout=120)
    assert status.returncode == 0 and "not running" in status.stdout
    stop = _tokenmill(["server", "stop"], env, timeout=120)
    assert stop.returncode == 0 and "no local Prefect server" in stop.stdout


# ------------------------------------------------------------------------------ a shared machine, a stuck or killed
# server
@pytest.fixture(scope="module")
def blocking_server(tmp_path_factory):
    """A running local server whose `tag:tokenmill` limit has its one slot taken, so every
    tokenmill task run waits (as when another local user held it)."""
    import httpx

    tmp = tmp_path_factory.mktemp("blocking")
    home = tmp / "home"
    env = _env(home, TOKENMILL_SLOT_WAIT_LOG="1")
    local = LocalServer(server_dir(home))
    start = _tokenmill(["server", "start"], env)
    assert start.returncode == 0, start.stderr[-3000:]
    state = json.loads(local.state_path.read_text())
    auth = tuple(local.auth_path.read_text().strip().split(":", 1))
    made = httpx.post(
        f"{state['api_url']}/v2/concurrency_limits/", json={"name": "tag:tokenmill", "limit": 1}, auth=auth, timeout=60
    )
    assert made.status_code == 201, made.text
    holder = "0b5e55ed-0000-4000-8000-000000000001"  # a task run of someone else's
    lease = {
        "names": ["tag:tokenmill"],
        "slots": 1,
        "mode": "concurrency",
        "lease_duration": 3600,
        "holder": {"type": "task_run", "id": holder},
    }
    held = httpx.post(
        f"{state['api_url']}/v2/concurrency_limits/increment-with-lease", json=lease, auth=auth, timeout=60
    )
    assert held.status_code == 200, held.text
    corpus = tmp / "corpus.txt"
    corpus.write_text("some words to count\n" * 200)
    try:
        yield env, local, state, corpus
    finally:
        _tokenmill(["server", "stop"], env, timeout=120)


def _start_blocked(env: dict[str, str], corpus: Path, store: Path) -> subprocess.Popen:
    """A command blocked at its first task; returns once its log says it waits for a slot."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", *_train_args(corpus, store)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = []
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if "waiting" in line and "concurrency slot" in line:
            assert (
                "tag:tokenmill (1 of 1 slots taken; held by task run 0b5e55ed-0000-4000-8000-000000000001)" in line
            ), line
            return proc
    proc.wait()
    raise AssertionError(f"no wait for a slot logged (exit {proc.returncode}): {''.join(lines)[-3000:]}")


def test_another_user_cannot_read_or_use_the_local_api(blocking_server):
    from test_warm import other_user_python

    _env_, local, state, _corpus = blocking_server
    python = other_user_python()
    script = f"""
import urllib.request, urllib.error
try:
    open({str(local.auth_path)!r}).read()
    print("read the credential")
except PermissionError:
    pass
req = urllib.request.Request(
    {state["api_url"] + "/flow_runs/filter"!r}, data=b"{{}}", headers={{"Content-Type": "application/json"}}
)
try:
    urllib.request.urlopen(req, timeout=60)
    print("API open")
except urllib.error.HTTPError as e:
    print(e.code)
"""
    proc = subprocess.run(
        [python, "-c", script],
        user=65534,
        group=65534,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "401", proc.stdout + proc.stderr


def test_a_run_waiting_for_a_slot_says_so_and_sigterm_ends_it(blocking_server, tmp_path):
    import signal

    env, _local, _state, corpus = blocking_server
    proc = _start_blocked(env, corpus, tmp_path / "store")
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=120)  # it waited for the slot to be freed, which never happens here
    assert proc.returncode == 143, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("tokenmill: error:")]
    assert len(lines) == 1 and "SIGTERM" in lines[0] and "Traceback" not in err, err[-3000:]


def test_a_killed_server_is_one_line(blocking_server, tmp_path):
    import signal

    env, _local, state, corpus = blocking_server
    proc = _start_blocked(env, corpus, tmp_path / "store")
    os.kill(state["pid"], signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err[-3000:]
    # After the wait's log line (read by _start_blocked), that line and nothing else.
    assert err == (
        f"tokenmill's local Prefect server stopped (pid {state['pid']}); run the command again to restart it\n"
    ), err[-3000:]


def test_no_secret_storage_option_reaches_the_flow_parameters(tmp_path, corpus):
    import httpx

    home = tmp_path / "home"
    env = _env(home)
    secret = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
    local = LocalServer(server_dir(home))
    try:
        proc = _tokenmill(
            [
                *_train_args(corpus, tmp_path / "s"),
                "--storage-option",
                f"secret={secret}",
                "--storage-option",
                "auto_mkdir=true",
            ],
            env,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        state = json.loads(local.state_path.read_text())
        auth = tuple(local.auth_path.read_text().strip().split(":", 1))
        runs = httpx.post(f"{state['api_url']}/flow_runs/filter", json={}, timeout=60, auth=auth).json()
        assert runs and all(r["parameters"]["storage_options"]["secret"] == "***" for r in runs), [
            r["parameters"] for r in runs
        ]
        assert secret not in json.dumps(runs)
    finally:
        _tokenmill(["server", "stop"], env, timeout=120)


def test_the_command_line_the_server_and_the_runner_import_no_cycle():
    """flows.cli, flows.prefect_api and flows.warm: every import, at any depth of the file,
    goes one way (shared pieces in flows.home; the program in flows.entry)."""
    import ast

    modules = (
        "flows.cli",
        "flows.prefect_api",
        "flows.server_manager",
        "flows.warm",
        "flows.home",
        "flows.entry",
        "flows.local_server",
        "flows.console",
    )
    graph: dict[str, set[str]] = {}
    for name in modules:
        tree = ast.parse((ROOT / (name.replace(".", "/") + ".py")).read_text())
        found: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
        graph[name] = {m for m in found if m in modules and m != name}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in graph[start])

    cycles = [m for m in modules if reaches(m, m, set())]
    assert not cycles, {m: sorted(graph[m]) for m in modules}
    assert graph["flows.warm"] <= {"flows.home"} and not graph["flows.home"], graph


def test_a_server_folder_others_can_write_is_refused(tmp_path, corpus):
    home = tmp_path / "home"
    (home / "tokenmill").mkdir(parents=True)
    (home / "tokenmill").chmod(0o777)  # another user could put their own server.json (or runner) there
    proc = _tokenmill(_train_args(corpus, tmp_path / "s"), _env(home), timeout=300)
    line = _assert_one_error_line(proc, str(home / "tokenmill"), "can be written by other users", "PREFECT_HOME")
    assert not (home / "tokenmill" / "server.json").exists(), line
