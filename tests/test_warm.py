"""The warm runner (flows/warm.py): commands run in a forked child of a process that has
made the imports, with the caller's arguments, directory, environment, streams, exit status
and signals; anything that could make them differ from a fresh process runs the usual way.

The runner here serves a directory of its own, tied to this test process's pid as its
"server" (the local Prefect server's role: it leaves when that process is gone); the
commands need no Prefect server. tests/test_cli_startup.py covers the runner a local server
starts and stops.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_cli_startup import wait_gone

from flows import warm
from pipeline_lib.tokenizer.registry import get_encoding

ROOT = Path(__file__).resolve().parent.parent


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "TOKENMILL_"))}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_LOGGING_LEVEL="WARNING")
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    home = tmp_path_factory.mktemp("warm") / "home"
    directory = home / warm.SERVER_DIR
    directory.mkdir(parents=True)
    env = _env(home, TEST_TOKENIZER=str(home.parent / "gpt2"))  # saved below; part of the runner's environment
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.warm", str(directory), str(os.getpid()), warm.env_key(env)],
        env={**env, "PYTHONPATH": str(ROOT)},
        cwd="/",
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while not (directory / warm.INFO_FILE).exists():
        assert proc.poll() is None and time.monotonic() < deadline, (directory / warm.LOG_FILE).read_text()
        time.sleep(0.1)
    tokenizer = home.parent / "gpt2"
    get_encoding("gpt2").save(str(tokenizer))
    yield directory, env
    proc.terminate()
    proc.wait(30)
    assert not (directory / warm.INFO_FILE).exists()  # it cleans up after itself


def _tokenmill(args: list[str], env: dict[str, str], cwd: Path = ROOT, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, **kw)


def _served(directory: Path) -> list[str]:
    return [line.split(": tokenmill ", 1)[1] for line in (directory / warm.LOG_FILE).read_text().splitlines() if ": tokenmill " in line]


def test_a_command_runs_in_the_runner_as_in_a_fresh_process(runner, tmp_path):
    directory, env = runner
    args = ["tokenizer", "encode", "--tokenizer", env["TEST_TOKENIZER"], "--text", "This is some text", "--output", "ids.npy"]
    served = _tokenmill(args, env, cwd=tmp_path, input="")
    assert served.returncode == 0, served.stderr[-3000:]
    assert " ".join(args) in _served(directory)
    # Its exit is logged (with its CPU seconds) before the caller hears the status.
    assert re.search(r"pid \d+: exit 0, [\d.]+ s CPU\n$", (directory / warm.LOG_FILE).read_text())
    assert np.load(tmp_path / "ids.npy").tolist() == [1212, 318, 617, 2420]  # in the caller's directory
    usual = _tokenmill(args, {**env, warm.ENV_WARM: "0"}, cwd=tmp_path, input="")  # TOKENMILL_WARM=0: the usual way
    assert usual.returncode == 0 and usual.stdout == served.stdout == "4 tokens -> ids.npy\n", (served.stdout, usual.stdout)
    assert _served(directory).count(" ".join(args)) == 1


def test_bad_input_gives_its_one_line_and_status(runner, tmp_path):
    directory, env = runner
    proc = _tokenmill(["show", "tokenizer/abc", "--store", str(tmp_path / "none")], env, input="")
    assert proc.returncode == 2, proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("tokenmill: error:")] and "Traceback" not in proc.stderr
    assert f"show tokenizer/abc --store {tmp_path / 'none'}" in _served(directory)


def test_another_environment_or_code_runs_the_usual_way(runner, tmp_path):
    directory, env = runner
    before = len(_served(directory))
    other = _tokenmill(["tokenizer", "encode", "--tokenizer", env["TEST_TOKENIZER"], "--text", "hi"], {**env, "TOKENMILL_SOMETHING": "1"}, input="")
    assert other.returncode == 0 and other.stdout.strip() == "5303"
    assert len(_served(directory)) == before
    # A runner whose code is not the caller's (an edited checkout, a pip install) is not used.
    info_path = directory / warm.INFO_FILE
    info = json.loads(info_path.read_text())
    info_path.write_text(json.dumps({**info, "fingerprint": "0" * 64}))
    try:
        stale = _tokenmill(["tokenizer", "encode", "--tokenizer", env["TEST_TOKENIZER"], "--text", "hi"], env, input="")
        assert stale.returncode == 0 and stale.stdout.strip() == "5303"
        assert len(_served(directory)) == before
    finally:
        info_path.write_text(json.dumps(info))


def _start_blocked(env: dict[str, str], directory: Path) -> tuple[subprocess.Popen, int]:
    """A served command blocked reading its stdin (a pipe the test holds open); its child's pid."""
    before = len(_served(directory))
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "tokenizer", "encode", "--tokenizer", env["TEST_TOKENIZER"], "--input", "/dev/stdin"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while len(_served(directory)) == before:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    (line,) = [x for x in (directory / warm.LOG_FILE).read_text().splitlines() if "--input /dev/stdin" in x][-1:]
    return proc, int(re.search(r"pid (\d+):", line).group(1))  # type: ignore[union-attr]


def test_ctrl_c_reaches_the_command(runner):
    directory, env = runner
    proc, child = _start_blocked(env, directory)
    time.sleep(0.5)  # into its read
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted" in err and "Traceback" not in err
    wait_gone(child)


def test_the_command_ends_when_its_caller_is_killed(runner):
    directory, env = runner
    proc, child = _start_blocked(env, directory)
    proc.kill()
    proc.wait(60)
    wait_gone(child)
