"""tokenmill's local Prefect server, managed: one `prefect` API process per PREFECT_HOME,
started detached by the first command that needs it (``python -m flows.local_server``, on
127.0.0.1 and a free port), health-checked and reused by every later command, and stopped
after 15 minutes without use (`tokenmill server stop|status` manage it). `LocalServer` is
its manager; `flows.prefect_api.flow_api` decides when a command uses it. Everything it
keeps is in ``$PREFECT_HOME/tokenmill/``:

    server.json   pid, port and URL of the running server (written by the server)
    server.log    its output;  server.lock  serialises starting it
    api-auth      the credential every API request needs (0600; Prefect's basic auth)
    prefect.db    its SQLite database (flow-run history)
    storage/      Prefect's task results of the runs that used it (PREFECT_LOCAL_STORAGE_PATH,
                  unless you set one)
    clients/      one file per running tokenmill command (keeps the server from idling out)

`tokenmill gc --prefect-home` removes them. This module imports nothing heavy.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flows import warm
from flows.home import SERVER_DIR, NotOwnError, check_own_file, make_own_dir, spawn_detached
from flows.home import pid_alive as _pid_alive
from flows.home import prefect_home as _prefect_home
from pipeline_lib.errors import InputError, TokenmillError

ENV_MODE = "TOKENMILL_PREFECT_SERVER"  # "local" (default) or "temporary"
ENV_STARTUP_TIMEOUT = "TOKENMILL_SERVER_STARTUP_TIMEOUT"
ENV_IDLE_TIMEOUT = "TOKENMILL_SERVER_IDLE_TIMEOUT"
ENV_SLOT_WAIT_LOG = "TOKENMILL_SLOT_WAIT_LOG"  # seconds a task run waits for a slot before its log says so
DEFAULT_SLOT_WAIT_LOG_S = 30.0
# Measured start-up of the server (docs/operations.md): ~8 s with its database, ~19 s
# creating it, on 2 cores at load 6.5; a machine several times busier still fits.
DEFAULT_STARTUP_TIMEOUT_S = 180.0
DEFAULT_IDLE_TIMEOUT_S = 900.0
SERVER_MODULE = "flows.local_server"
STATE_FILE, LOG_FILE, LOCK_FILE, DB_FILE = "server.json", "server.log", "server.lock", "prefect.db"
STORAGE_DIR, CLIENTS_DIR, MEMO_FILE = "storage", "clients", "memo_store.toml"
AUTH_FILE = "api-auth"  # the server's basic-auth credential, user:password (0600)
AUTH_USER = "tokenmill"
_DB_URL_VARS = ("PREFECT_API_DATABASE_CONNECTION_URL", "PREFECT_SERVER_DATABASE_CONNECTION_URL")
_STORAGE_VARS = ("PREFECT_LOCAL_STORAGE_PATH", "PREFECT_RESULTS_LOCAL_STORAGE_PATH")
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)


class ServerError(TokenmillError):
    """tokenmill's local Prefect server could not be started or reached."""


def read_float_env(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InputError(f"{name}={raw!r}: expected a number of seconds") from None
    if value < 0:
        raise InputError(f"{name}={raw!r}: expected a number of seconds >= 0")
    return value


def prefect_home() -> Path:
    return Path(_prefect_home())


def server_dir(home: Path | None = None) -> Path:
    return (home or prefect_home()) / SERVER_DIR


class LocalServer:
    """tokenmill's local Prefect server whose files are in `directory`."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.state_path = self.directory / STATE_FILE
        self.log_path = self.directory / LOG_FILE
        self.lock_path = self.directory / LOCK_FILE
        self.db_path = self.directory / DB_FILE
        self.storage_dir = self.directory / STORAGE_DIR
        self.clients_dir = self.directory / CLIENTS_DIR
        self.auth_path = self.directory / AUTH_FILE

    def make_dir(self) -> None:
        """Create the server's folder (0700) if missing, and check it is the caller's alone.

        Raises:
            ServerError: another user owns or can write it, or a folder above it.
        """
        try:
            make_own_dir(str(self.directory))
        except NotOwnError as e:
            raise ServerError(
                f"tokenmill's local Prefect server keeps its files in {self.directory}, but {e}: set PREFECT_HOME to a "
                "folder of your own (or PREFECT_API_URL to a server)"
            ) from None

    def auth_string(self) -> str:
        """The credential the server asks of every API request (``user:password``), from its
        0600 file; made on first use. Other local users can reach the port, not the file."""
        import secrets

        self.make_dir()
        try:
            fd = os.open(self.auth_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(f"{AUTH_USER}:{secrets.token_urlsafe(32)}\n")
        try:
            check_own_file(str(self.auth_path))
        except NotOwnError as e:
            raise ServerError(f"{e}: remove it (tokenmill server stop; rm {self.auth_path})") from None
        text = self.auth_path.read_text().strip()
        if not text.startswith(f"{AUTH_USER}:"):
            raise ServerError(
                f"{self.auth_path}: not a credential tokenmill wrote: remove it (tokenmill server stop; "
                f"rm {self.auth_path})"
            )
        return text

    # ------------------------------------------------------------------ state
    def write_state(self, state: dict[str, Any]) -> None:
        self.make_dir()
        tmp = self.state_path.with_name(f".{STATE_FILE}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(state, f)
        os.replace(tmp, self.state_path)

    def read_state(self) -> dict[str, Any] | None:
        try:
            check_own_file(str(self.state_path))
            state = json.loads(self.state_path.read_text())
        except (OSError, ValueError, NotOwnError):
            return None
        ok = isinstance(state, dict) and isinstance(state.get("pid"), int) and isinstance(state.get("api_url"), str)
        return state if ok else None

    def remove_state(self, pid: int) -> None:
        state = self.read_state()
        if state is not None and state["pid"] == pid:
            with contextlib.suppress(FileNotFoundError):
                self.state_path.unlink()

    def is_server(self, pid: int) -> bool:
        """Whether `pid` is alive and (where /proc tells) runs this module."""
        if not _pid_alive(pid):
            return False
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return not Path("/proc/self").exists()  # no /proc here: trust the state file
        return SERVER_MODULE.encode() in cmdline and str(self.directory).encode() in cmdline

    @staticmethod
    def healthy(api_url: str, timeout: float = 5.0) -> bool:
        try:
            with urllib.request.urlopen(f"{api_url}/health", timeout=timeout) as r:
                return r.status == 200
        except (OSError, ValueError):
            return False

    def status(self) -> dict[str, Any] | None:
        """The state of the running, healthy server, or None."""
        state = self.read_state()
        if state is None or not self.is_server(state["pid"]) or not self.healthy(state["api_url"]):
            return None
        return state

    # ------------------------------------------------------------------ clients
    def live_clients(self) -> list[int]:
        try:
            names = os.listdir(self.clients_dir)
        except OSError:
            return []
        return [int(n) for n in names if n.isdigit() and _pid_alive(int(n))]

    @contextlib.contextmanager
    def registered(self) -> Iterator[None]:
        """Mark this process as a user of the server (it does not idle out meanwhile)."""
        self.make_dir()
        self.clients_dir.mkdir(exist_ok=True, mode=0o700)
        path = self.clients_dir / str(os.getpid())
        path.touch()
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                path.unlink()

    @contextlib.contextmanager
    def locked(self, timeout: float) -> Iterator[None]:
        import fcntl

        self.make_dir()
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise ServerError(
                            "another tokenmill command has been starting the local Prefect server in "
                            f"{self.directory} for "
                            f"over {timeout:.0f} s: wait for it (or stop it: tokenmill server stop), or set "
                            "PREFECT_API_URL "
                            "to a running server (prefect server start)"
                        ) from None
                    time.sleep(0.2)
            yield
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ start / stop
    def ensure(self, timeout: float) -> dict[str, Any]:
        """The running server's state; starts one first if none runs (waits up to `timeout` s).

        Raises:
            ServerError: it did not answer in time, or exited while starting.
        """
        deadline = time.monotonic() + timeout
        with self.locked(timeout + 30):
            state = self.read_state()
            if state is not None and self.is_server(state["pid"]) and not state.get("auth"):
                # started by an older tokenmill, without a credential: open to every local user
                self._kill(state["pid"])
                state = None
            if state is not None and self.is_server(state["pid"]):
                # Running, or still starting (a command that started it was interrupted).
                if self._wait_healthy(state["pid"], None, deadline):
                    return self.read_state() or state
                self._kill(state["pid"])
                raise self._timeout_error(timeout)
            with contextlib.suppress(FileNotFoundError):
                self.state_path.unlink()
            print(
                f"starting tokenmill's local Prefect server in {self.directory} (stop it with `tokenmill server stop`)",
                file=sys.stderr,
                flush=True,
            )
            proc = self._spawn()
            if self._wait_healthy(proc.pid, proc, deadline):
                return self.read_state() or {}
            if proc.poll() is not None:
                raise ServerError(
                    f"tokenmill's local Prefect server (in {self.directory}) exited with status {proc.returncode} "
                    "while "
                    f"starting ({self._last_log_line()}; log: {self.log_path}): fix that, or set PREFECT_API_URL to a "
                    "running server (prefect server start)"
                )
            self._kill(proc.pid)
            raise self._timeout_error(timeout)

    def _timeout_error(self, timeout: float) -> ServerError:
        return ServerError(
            f"tokenmill's local Prefect server (in {self.directory}) did not answer within {timeout:g} s (log: "
            f"{self.log_path}): the machine may be overloaded; rerun, allow it more time ({ENV_STARTUP_TIMEOUT}=600), "
            "or set PREFECT_API_URL to a running server (prefect server start)"
        )

    def _wait_healthy(self, pid: int, proc: subprocess.Popen | None, deadline: float) -> bool:
        while True:
            if proc is not None and proc.poll() is not None:
                return False
            state = self.read_state()
            if (
                state is not None
                and state["pid"] == pid
                and self.healthy(state["api_url"], timeout=max(0.1, min(5.0, deadline - time.monotonic())))
            ):
                return True
            if time.monotonic() >= deadline or (proc is None and not _pid_alive(pid)):
                return False
            time.sleep(0.1)

    def _spawn(self) -> subprocess.Popen:
        env = dict(os.environ)
        env.pop("PREFECT_API_URL", None)
        if env.get("PREFECT_LOGGING_HANDLERS_CONSOLE_CLASS") == "flows.console.ConsoleHandler":
            del env["PREFECT_LOGGING_HANDLERS_CONSOLE_CLASS"]  # the CLI's; a server has no run logs to trim
        env["PREFECT_HOME"] = str(self.directory.parent)
        if not any(env.get(v) for v in _DB_URL_VARS):
            env["PREFECT_API_DATABASE_CONNECTION_URL"] = f"sqlite+aiosqlite:///{self.db_path}"
        env.setdefault("PREFECT_MEMO_STORE_PATH", str(self.directory / MEMO_FILE))  # Prefect's; else in PREFECT_HOME
        env.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no telemetry calls from a local helper
        env["PREFECT_UI_ENABLED"] = "false"
        env["PREFECT_SERVER_API_AUTH_STRING"] = self.auth_string()  # in its environment, never on its command line
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        self.make_dir()
        return spawn_detached(["-m", SERVER_MODULE, str(self.directory)], env, str(self.log_path), append=False)

    def _kill(self, pid: int, timeout: float = 10.0) -> None:
        """SIGTERM the server's process group, SIGKILL after `timeout` s."""
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pid, sig)  # it leads its own session: this reaches what it started too
            except (ProcessLookupError, PermissionError):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            end = time.monotonic() + wait
            while time.monotonic() < end:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)  # reap it when it is our child
                if not _pid_alive(pid):
                    self.remove_state(pid)
                    return
                time.sleep(0.1)
        self.remove_state(pid)

    def stop(self) -> int | None:
        """Stop the running server; its pid, or None when none ran."""
        state = self.read_state()
        if state is None:
            return None
        if not self.is_server(state["pid"]):
            self.remove_state(state["pid"])
            return None
        self._kill(state["pid"])
        warm.stop(str(self.directory))
        return state["pid"]

    def _last_log_line(self) -> str:
        try:
            lines = [x.strip() for x in self.log_path.read_text(errors="replace").splitlines() if x.strip()]
        except OSError:
            return "no log"
        return lines[-1][:300] if lines else "empty log"

    # ------------------------------------------------------------------ gc
    def gc(self, min_age_s: float, dry_run: bool, log_dir: Path | None = None) -> tuple[list[str], list[str]]:
        """Remove what the local server and tokenmill's runs on it left here: its database,
        log and state, task results older than `min_age_s`, and tokenmill's failure logs
        (``tokenmill-*.log``) in `log_dir` older than that. Nothing else in PREFECT_HOME.

        The server is stopped first when no tokenmill command uses it; while one does, the
        database and server files are kept. Returns (removed paths, notes).
        """
        removed: list[str] = []
        notes: list[str] = []
        now = time.time()

        def remove(path: Path) -> None:
            removed.append(str(path))
            if not dry_run:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

        def old(path: Path) -> bool:
            try:
                return now - path.lstat().st_mtime >= min_age_s
            except FileNotFoundError:
                return False

        if log_dir is not None and log_dir.is_dir():
            for p in sorted(log_dir.glob("tokenmill-*.log")):
                if p.is_file() and not p.is_symlink() and old(p):
                    remove(p)
        if not self.directory.is_dir():
            return removed, notes
        with self.locked(DEFAULT_STARTUP_TIMEOUT_S):
            clients = self.live_clients()
            state = self.read_state()
            running = state is not None and self.is_server(state["pid"])
            if clients:
                notes.append(
                    "kept the local server's database: tokenmill command(s) running (pid "
                    f"{', '.join(map(str, clients))})"
                )
            else:
                if running and state is not None:
                    notes.append(
                        f"{'would stop' if dry_run else 'stopped'} the local Prefect server (pid {state['pid']})"
                    )
                    if not dry_run:
                        self._kill(state["pid"])
                if not dry_run:
                    warm.stop(str(self.directory))
                server_files = (
                    DB_FILE,
                    f"{DB_FILE}-wal",
                    f"{DB_FILE}-shm",
                    f"{DB_FILE}-journal",
                    MEMO_FILE,
                    LOG_FILE,
                    STATE_FILE,
                    AUTH_FILE,
                )
                for name in (*server_files, warm.INFO_FILE, warm.LOG_FILE, warm.SOCKET_FILE):
                    if (self.directory / name).is_file() or (self.directory / name).is_socket():
                        remove(self.directory / name)
            if self.clients_dir.is_dir():
                for p in self.clients_dir.iterdir():
                    if p.name.isdigit() and p.is_file() and not _pid_alive(int(p.name)):
                        remove(p)
            if self.storage_dir.is_dir():
                for root, _dirs, files in os.walk(self.storage_dir):
                    for name in sorted(files):
                        p = Path(root) / name
                        if p.is_file() and not p.is_symlink() and old(p):
                            remove(p)
            if not dry_run:
                for root, dirs, _files in os.walk(self.storage_dir, topdown=False):
                    for d in dirs:
                        with contextlib.suppress(OSError):
                            os.rmdir(os.path.join(root, d))  # only empty ones
                for top in (self.storage_dir, self.clients_dir):
                    with contextlib.suppress(OSError):
                        top.rmdir()
        return removed, notes
