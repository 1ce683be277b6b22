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
import platform
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
from flows.home import SERVER_DIR
from pipeline_lib.tokenizer.registry import get_encoding

ROOT = Path(__file__).resolve().parent.parent


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "TOKENMILL_"))}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_LOGGING_LEVEL="WARNING",
        TOKENMILL_WARM="1",
    )
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    home = tmp_path_factory.mktemp("warm") / "home"
    directory = home / SERVER_DIR
    directory.mkdir(parents=True)
    env = _env(home, TEST_TOKENIZER=str(home.parent / "gpt2"))  # saved below; part of the runner's environment
    proc = subprocess.Popen(
        [sys.executable, "-m", warm.RUNNER_MODULE, str(directory), str(os.getpid())],
        env={**env, "PYTHONPATH": str(ROOT), "_TOKENMILL_WARM_PYTHONPATH": ""},
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
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, **kw
    )


def _served(directory: Path) -> list[str]:
    return [
        line.split(": tokenmill ", 1)[1]
        for line in (directory / warm.LOG_FILE).read_text().splitlines()
        if ": tokenmill " in line
    ]


def test_a_command_runs_in_the_runner_as_in_a_fresh_process(runner, tmp_path):
    directory, env = runner
    args = [
        "tokenizer",
        "encode",
        "--tokenizer",
        env["TEST_TOKENIZER"],
        "--text",
        "This is some text",
        "--output",
        "ids.npy",
    ]
    served = _tokenmill(args, env, cwd=tmp_path, input="")
    assert served.returncode == 0, served.stderr[-3000:]
    assert " ".join(args) in _served(directory)
    # Its exit is logged (with its CPU seconds) before the caller hears the status.
    assert re.search(r"pid \d+: exit 0, [\d.]+ s CPU\n$", (directory / warm.LOG_FILE).read_text())
    assert np.load(tmp_path / "ids.npy").tolist() == [1212, 318, 617, 2420]  # in the caller's directory
    usual = _tokenmill(args, {**env, warm.ENV_WARM: "0"}, cwd=tmp_path, input="")  # TOKENMILL_WARM=0: the usual way
    assert usual.returncode == 0 and usual.stdout == served.stdout == "4 tokens -> ids.npy\n", (
        served.stdout,
        usual.stdout,
    )
    assert _served(directory).count(" ".join(args)) == 1


def test_bad_input_gives_its_one_line_and_status(runner, tmp_path):
    directory, env = runner
    proc = _tokenmill(["show", "tokenizer/abc", "--store", str(tmp_path / "none")], env, input="")
    assert proc.returncode == 2, proc.stderr
    assert [
        line for line in proc.stderr.splitlines() if line.startswith("tokenmill: error:")
    ] and "Traceback" not in proc.stderr
    assert f"show tokenizer/abc --store {tmp_path / 'none'}" in _served(directory)


def test_another_environment_or_code_runs_the_usual_way(runner, tmp_path):
    directory, env = runner
    before = len(_served(directory))
    other = _tokenmill(
        ["tokenizer", "encode", "--tokenizer", env["TEST_TOKENIZER"], "--text", "hi"],
        {**env, "TOKENMILL_SOMETHING": "1"},
        input="",
    )
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
        [
            sys.executable,
            "-m",
            "flows.cli",
            "tokenizer",
            "encode",
            "--tokenizer",
            env["TEST_TOKENIZER"],
            "--input",
            "/dev/stdin",
        ],
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


def _reading_the_pipe(pid: int, pipe_fd: int) -> bool:
    """Whether process `pid`'s main thread waits in a read of the pipe whose other end is our
    `pipe_fd`: by its system call (read, and its first argument a descriptor on that pipe), or
    where that is not readable (another process's, under Yama) by its wait channel."""
    try:
        fields = Path(f"/proc/{pid}/syscall").read_text().split()
    except PermissionError:
        return "pipe_read" in Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False
    if len(fields) < 2 or fields[0] != str(_READ_SYSCALL.get(platform.machine(), 0)):
        return False
    try:  # both ends of a pipe link to the same "pipe:[inode]"
        return os.readlink(f"/proc/{pid}/fd/{int(fields[1], 16)}") == os.readlink(f"/proc/self/fd/{pipe_fd}")
    except OSError:
        return False


_READ_SYSCALL = {"x86_64": 0, "aarch64": 63, "arm64": 63}


def test_ctrl_c_reaches_the_command(runner):
    directory, env = runner
    proc, child = _start_blocked(env, directory)
    assert proc.stdin is not None
    # Ctrl-C once the command waits in its read: earlier, it would meet the command's start-up
    # (argument parsing), where a fresh process too ends with a traceback.
    deadline = time.monotonic() + 120
    while not _reading_the_pipe(child, proc.stdin.fileno()):
        assert proc.poll() is None and time.monotonic() < deadline, "the command never waited on its stdin"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    # Its stdin stays open until it has ended: closed earlier, the command could read the end
    # of its input and finish (exit 0) before the caller, on a busy machine, forwards the signal.
    proc.wait(timeout=120)
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


# ------------------------------------------------------------------------------ who, where, what code
def _count_served(directory: Path, args: list[str], env: dict[str, str], **kw) -> int:
    before = len(_served(directory))
    proc = _tokenmill(args, env, input="", **kw)
    assert proc.returncode == 0 and proc.stdout.strip() == "5303", proc.stderr[-3000:]
    return len(_served(directory)) - before


def _hi(env: dict[str, str]) -> list[str]:
    return ["tokenizer", "encode", "--tokenizer", env["TEST_TOKENIZER"], "--text", "hi"]


def test_a_runner_folder_others_can_write_or_own_is_not_used(runner):
    directory, env = runner
    assert _count_served(directory, _hi(env), env) == 1
    mode = directory.stat().st_mode
    try:
        directory.chmod(0o777)  # another user could have put their own runner there
        assert _count_served(directory, _hi(env), env) == 0
        directory.chmod(0o700)
        os.chown(directory, 4242, -1)  # another user's folder (no such user needed)
        assert _count_served(directory, _hi(env), env) == 0
    finally:
        os.chown(directory, os.getuid(), -1)
        directory.chmod(mode)
    assert _count_served(directory, _hi(env), env) == 1


def other_user_python() -> str:
    """A Python that another uid (nobody) can run, or skip: the test needs root and one."""
    if os.getuid() != 0:
        pytest.skip("needs root to act as another uid")
    for python in ("/usr/bin/python3", "/usr/local/bin/python3"):
        probe = (
            subprocess.run(
                [python, "-c", "pass"], user=65534, group=65534, extra_groups=[], capture_output=True, cwd="/"
            )
            if os.path.exists(python)
            else None
        )
        if probe is not None and probe.returncode == 0:
            return python
    pytest.skip("no Python that uid 65534 can run")


def test_the_runner_refuses_another_uid_and_the_caller_another_pid(runner, tmp_path):
    directory, env = runner
    python = other_user_python()
    # Another uid reaching the socket (its folder opened up for the test) is refused by the runner.
    sock = directory / warm.SOCKET_FILE
    above = [p for p in directory.parents if p != Path("/")]
    modes = {p: p.stat().st_mode for p in [directory, *above]}
    script = f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({str(sock)!r}); print(repr(s.recv(100)))"
    try:
        for p in [directory, *above]:
            p.chmod(modes[p] | 0o005)
        sock.chmod(0o777)
        other = subprocess.run(
            [python, "-c", script],
            user=65534,
            group=65534,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
    finally:
        sock.chmod(0o600)
        for p, m in modes.items():
            p.chmod(m)
    assert other.returncode == 0 and other.stdout.strip() == "b''", other.stderr
    assert "refused a connection from uid 65534" in (directory / warm.LOG_FILE).read_text()
    # A runner whose pid is not the one its state file names (someone else's listener) is not used.
    info_path = directory / warm.INFO_FILE
    info = json.loads(info_path.read_text())
    info_path.write_text(json.dumps({**info, "pid": os.getpid()}))
    try:
        assert _count_served(directory, _hi(env), env) == 0
    finally:
        info_path.write_text(json.dumps(info))


def test_a_command_under_other_limits_niceness_or_affinity_runs_the_usual_way(runner):
    import resource

    directory, env = runner
    cpu = resource.getrlimit(resource.RLIMIT_CPU)
    assert (
        _count_served(
            directory, _hi(env), env, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CPU, (3600, cpu[1]))
        )
        == 0
    )
    assert _count_served(directory, _hi(env), env, preexec_fn=lambda: os.nice(5)) == 0
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:
        assert _count_served(directory, _hi(env), env, preexec_fn=lambda: os.sched_setaffinity(0, cpus[:1])) == 0
    assert _count_served(directory, _hi(env), env) == 1


def test_an_edited_dependency_is_not_served_old(runner):
    import prefect

    directory, env = runner
    path = Path(prefect.__file__)
    st = path.stat()
    try:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # an installed package's file, edited
        assert _count_served(directory, _hi(env), env) == 0
    finally:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_runner_whose_files_change_while_it_starts_does_not_serve(tmp_path):
    directory = tmp_path / "home" / SERVER_DIR
    directory.mkdir(parents=True)
    env = _env(tmp_path / "home")
    lab = ROOT / "flows" / "lab.py"
    st = lab.stat()
    try:
        os.utime(lab)  # edited just now: what the runner is about to import may not be what it fingerprints
        proc = subprocess.run(
            [sys.executable, "-m", warm.RUNNER_MODULE, str(directory), str(os.getpid())],
            env={**env, "PYTHONPATH": str(ROOT), "_TOKENMILL_WARM_PYTHONPATH": ""},
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        os.utime(lab, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"not serving: {lab} changed" in (directory / warm.LOG_FILE).read_text()
    assert not (directory / warm.INFO_FILE).exists()


class _FakeRunner:
    """A listener in a runner's place that the caller accepts (this process's pid, the
    caller's environment key, context and code), keeping the bytes it is sent."""

    def __init__(self, directory: Path, env: dict[str, str], reply: dict | None):
        import socket
        import threading

        directory.mkdir(parents=True, mode=0o700)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(directory / warm.SOCKET_FILE))
        os.chmod(directory / warm.SOCKET_FILE, 0o600)
        self.listener.listen(1)
        caller_env = {k: v for k, v in env.items()}
        info = {
            "pid": os.getpid(),
            "salt": "ab",
            "env": warm.env_key(caller_env, "ab"),
            "context": warm.process_context(),
            "files": [],
        }
        info["fingerprint"] = warm.fingerprint([])
        (directory / warm.INFO_FILE).write_text(json.dumps(info))
        (directory / warm.INFO_FILE).chmod(0o600)
        self.received = b""
        self.reply = reply
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(30)
        msg, fds, _, _ = __import__("socket").recv_fds(conn, 1 << 20, 3)
        self.received = msg
        for fd in fds:
            os.close(fd)
        if self.reply is not None:
            data = json.dumps(self.reply).encode()
            conn.sendall(len(data).to_bytes(4, "big") + data)
        conn.close()


def test_no_secret_is_sent_and_a_taken_command_never_runs_twice(tmp_path):
    home = tmp_path / "home"
    secret = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
    env = _env(home, AWS_SECRET_ACCESS_KEY=secret)
    get_encoding("gpt2").save(str(tmp_path / "gpt2"))
    args = [
        "tokenizer",
        "encode",
        "--tokenizer",
        str(tmp_path / "gpt2"),
        "--text",
        "hi",
        "--output",
        str(tmp_path / "ids.npy"),
    ]
    fake = _FakeRunner(home / SERVER_DIR, env, reply={"refused": "test"})
    proc = _tokenmill(args, env, input="")
    fake.thread.join(60)
    assert proc.returncode == 0 and (tmp_path / "ids.npy").exists(), proc.stderr[-3000:]  # refused: ran the usual way
    assert fake.received and b"argv" in fake.received and secret.encode() not in fake.received
    assert b"AWS_SECRET_ACCESS_KEY" not in fake.received
    # A runner that takes the command and goes away: an error, not a second run here.
    (tmp_path / "ids.npy").unlink()
    home2 = tmp_path / "home2"
    env2 = _env(home2, AWS_SECRET_ACCESS_KEY=secret)
    fake = _FakeRunner(home2 / SERVER_DIR, env2, reply=None)
    proc = _tokenmill(args, env2, input="")
    assert proc.returncode == 1 and "did not answer" in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "ids.npy").exists()


def test_the_interpreter_by_another_of_its_names_is_served(runner):
    directory, env = runner
    names = [
        p
        for p in (Path(sys.executable).with_name(n) for n in ("python", "python3"))
        if p.exists() and str(p) != sys.executable
    ]
    if not names:
        pytest.skip("no second name for this interpreter")
    before = len(_served(directory))
    proc = subprocess.run(
        [str(names[0]), "-m", "flows.cli", *_hi(env)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        input="",
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "5303", proc.stderr[-3000:]
    assert len(_served(directory)) == before + 1  # the `tokenmill` script says python3, a shell python
