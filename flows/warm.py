"""A warm runner: `tokenmill` commands without the cost of importing Prefect each time.

A command spends about a second and a half importing Prefect, pydantic, Arrow and the
flows before it does any work. Next to tokenmill's local Prefect server (flows.prefect_api)
runs a process that has made those imports once, the warm runner; each command connects
to it over a Unix socket in the server's directory, hands over its argv, working directory,
environment and standard output and error (the file descriptors themselves), and the
runner forks a child that runs the command as `flows.cli.main` would in a fresh process.
The command's process waits, forwards Ctrl-C and SIGTERM to the child, and exits with the
child's status. The same idea as Mercurial's chg or Gradle's daemon, kept small:

- A command uses the runner only when nothing could make the child differ from a fresh
  process: the same code (the package's files and the installed packages, by path, size
  and modification time), the same environment (every variable but the shell's own
  bookkeeping), and no terminal on stdin. Anything else runs the usual way, and so does
  every command when TOKENMILL_WARM=0, or when no runner is there.
- The runner is started in the background, at the exit of a command that used the local
  server (so the command it speeds up is the next one); it imports and then forks, with
  no thread started in between (fork copies one thread). It leaves when the local server
  is gone, when its code changed, on SIGTERM, and after an hour unused.
- Only the local default uses it: with PREFECT_API_URL or a Prefect profile set, the
  environment differs from the runner's and commands run the usual way.

Runner files, in the local server's directory: ``warm.sock`` (the socket), ``warm.json``
(its pid, code fingerprint and environment key), ``warm.log`` (what it served).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import struct
import sys
import time

ENV_WARM = "TOKENMILL_WARM"
SERVER_DIR = "tokenmill"  # the local server's directory in PREFECT_HOME (flows.prefect_api)
SOCKET_FILE, INFO_FILE, LOG_FILE = "warm.sock", "warm.json", "warm.log"
# The shell's bookkeeping, which changes between two commands of the same session.
_VOLATILE = frozenset({"_", "PWD", "OLDPWD", "SHLVL", "COLUMNS", "LINES"})
_PACKAGES = ("flows", "tasks", "pipeline_lib", "deployments")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_IDLE_S = 3600.0
_HEADER = struct.Struct("!I")
_ORIGINAL_ENV = dict(os.environ)  # before the CLI sets its own variables (flows.cli.main)


# --------------------------------------------------------------------------- shared
def prefect_home() -> str:
    """PREFECT_HOME, absolute (default ~/.prefect): here, where the commands can read it before
    they import Prefect."""
    return os.path.abspath(os.path.expanduser(os.environ.get("PREFECT_HOME") or "~/.prefect"))


def enabled(environ: dict[str, str] | os._Environ = os.environ) -> bool:
    return environ.get(ENV_WARM, "").strip().lower() not in ("0", "false", "no", "off")


def env_key(environ: dict[str, str]) -> str:
    items = sorted((k, v) for k, v in environ.items() if k not in _VOLATILE)
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()


def code_fingerprint(extra: list[str]) -> str:
    """Path, size and modification time of every file the commands run: the package's
    sources, and `extra` (the compiled core, the installed packages' directory)."""
    h = hashlib.sha256(f"{sys.executable}\0{_ROOT}".encode())
    paths = list(extra)
    for package in _PACKAGES:
        for top, dirs, files in os.walk(os.path.join(_ROOT, package)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            paths += [os.path.join(top, f) for f in sorted(files) if f.endswith((".py", ".so", ".txt", ".yaml"))]
    for path in paths:
        try:
            st = os.stat(path)
            h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(f"{path}\0missing\n".encode())
    return h.hexdigest()


def _send(conn: socket.socket, payload: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(payload).encode()
    message = _HEADER.pack(len(data)) + data
    if fds:
        socket.send_fds(conn, [message], fds)
    else:
        conn.sendall(message)


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = conn.recv(n - len(out))
        if not chunk:
            raise EOFError
        out += chunk
    return out


def _recv(conn: socket.socket, max_fds: int = 0) -> tuple[dict, list[int]]:
    fds: list[int] = []
    if max_fds:
        head, fds, _, _ = socket.recv_fds(conn, _HEADER.size, max_fds)
        if len(head) < _HEADER.size:
            head += _recv_exact(conn, _HEADER.size - len(head))
    else:
        head = _recv_exact(conn, _HEADER.size)
    (size,) = _HEADER.unpack(head)
    return json.loads(_recv_exact(conn, size)), fds


# --------------------------------------------------------------------------- the command's side
def main() -> None:
    """The `tokenmill` program: the command in the warm runner when it can, else as usual."""
    argv = sys.argv[1:]
    status = run_warm(argv, os.path.join(prefect_home(), SERVER_DIR))
    if status is None:
        from flows.cli import main as cli_main

        status = cli_main()
    sys.exit(status)


def run_warm(argv: list[str], directory: str) -> int | None:
    """Run the command `argv` in the warm runner of the local server in `directory`; its exit
    status, or None when it has to run the usual way (no runner, another environment or code)."""
    if not enabled() or (argv and argv[0] in ("server", "serve", "deploy")):
        return None
    stdin = 0
    if os.isatty(0):  # the child is not in the terminal's foreground group: it must not read it
        if "-" in argv:
            return None
        stdin = os.open(os.devnull, os.O_RDONLY)
    try:
        with open(os.path.join(directory, INFO_FILE)) as f:
            info = json.load(f)
        if info["env"] != env_key(_ORIGINAL_ENV) or info["fingerprint"] != code_fingerprint(info["extra"]):
            return None
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(5.0)
        conn.connect(os.path.join(directory, SOCKET_FILE))
        request = {"argv": argv, "cwd": os.getcwd(), "env": _ORIGINAL_ENV, "umask": _umask(), "fingerprint": info["fingerprint"]}
        _send(conn, request, [stdin, 1, 2])
        reply, _ = _recv(conn)
    except (OSError, ValueError, KeyError, TypeError, EOFError):
        return None
    finally:
        if stdin:
            os.close(stdin)
    if "pid" not in reply:
        return None  # the runner refused (its code or environment changed since it started)
    child = int(reply["pid"])
    conn.settimeout(None)

    def forward(signum, frame):
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)
    try:
        status, _ = _recv(conn)
        return int(status["status"])
    except (OSError, ValueError, KeyError, EOFError):
        print(
            f"tokenmill: error: the command's process ({child}) ended without an exit status (killed?); see {os.path.join(directory, LOG_FILE)}",
            file=sys.stderr,
        )
        return 1
    finally:
        conn.close()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --------------------------------------------------------------------------- the runner
def _extra_files() -> list[str]:
    import sysconfig

    import pipeline_lib._tokcore as core

    return [core.__file__, sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]


def _log(directory: str, text: str) -> None:
    with open(os.path.join(directory, LOG_FILE), "a") as f:
        f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")


def serve(directory: str, server_pid: int, key: str) -> None:
    """The runner: import what the commands need, then fork a child per command."""
    import threading

    import flows.cli

    flows.cli.use_console_handler()  # as each command does before Prefect is imported: once, here

    import flows.lab  # noqa: F401 - the imports every command needs, made once
    import flows.pipeline  # noqa: F401
    import flows.prefect_api  # noqa: F401
    import flows.runners  # noqa: F401
    import flows.sweep  # noqa: F401
    import tasks.factory  # noqa: F401

    if threading.active_count() != 1:  # fork would copy one thread of several
        _log(directory, f"not serving: {threading.active_count()} threads after the imports")
        return
    extra = _extra_files()
    fingerprint = code_fingerprint(extra)
    sock_path = os.path.join(directory, SOCKET_FILE)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sock_path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    os.chmod(sock_path, 0o600)
    listener.listen(16)
    listener.settimeout(5.0)
    info = {"pid": os.getpid(), "fingerprint": fingerprint, "extra": extra, "env": key}
    tmp = os.path.join(directory, f".{INFO_FILE}.{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(info, f)
    os.replace(tmp, os.path.join(directory, INFO_FILE))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel

    def leave(signum, frame):
        _log(directory, f"signal {signum}: leaving")
        sys.exit(0)

    signal.signal(signal.SIGTERM, leave)
    _log(directory, f"serving (pid {os.getpid()})")
    last_used = time.monotonic()
    try:
        while time.monotonic() - last_used < _IDLE_S and pid_alive(server_pid):
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            last_used = time.monotonic()
            fds: list[int] = []
            try:
                conn.settimeout(5.0)
                request, fds = _recv(conn, max_fds=3)
                current = code_fingerprint(extra)
                if len(fds) != 3 or request.get("fingerprint") != current or env_key(request["env"]) != info["env"]:
                    _send(conn, {"refused": "code or environment changed"})
                    if current != fingerprint:
                        _log(directory, "code changed: leaving")
                        return
                    continue
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    _run_child(directory, conn, request, fds)  # never returns
                _log(directory, f"pid {pid}: tokenmill {' '.join(request['argv'])[:300]}")
            except (OSError, ValueError, KeyError, EOFError) as e:
                _log(directory, f"bad request: {e!r}")
            finally:
                conn.close()
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)
        _log(directory, "idle for an hour, or the local server is gone: leaving")
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            with open(os.path.join(directory, INFO_FILE)) as f:
                if json.load(f).get("pid") == os.getpid():
                    os.unlink(os.path.join(directory, INFO_FILE))
                    os.unlink(sock_path)
        _log(directory, "stopped")


def _run_child(directory: str, conn: socket.socket, request: dict, fds: list[int]) -> None:
    """In the forked child: become the command's process, run it, report its status."""
    status = 1
    try:
        _send(conn, {"pid": os.getpid()})  # from here on the command is this process's
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own streams
        sys.stdout = open(1, "w", closefd=False, buffering=-1 if not os.isatty(1) else 1)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False, buffering=1)  # noqa: SIM115
        os.chdir(request["cwd"])
        os.umask(int(request["umask"]))
        os.environ.clear()
        os.environ.update(request["env"])
        _ORIGINAL_ENV.clear()
        _ORIGINAL_ENV.update(request["env"])
        import tempfile

        tempfile.tempdir = None  # TMPDIR as the command's
        sys.argv = ["tokenmill", *request["argv"]]
        _watch_client(conn)
        from flows.cli import main

        status = main(request["argv"])
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - main reports every failure; this is the last resort
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            _exit_as_python_does()
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        with contextlib.suppress(BaseException):  # logged before the caller hears the status, so it can read it then
            import resource

            cpu = sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))
            _log(directory, f"pid {os.getpid()}: exit {status}, {cpu:.2f} s CPU")
        with contextlib.suppress(BaseException):
            _send(conn, {"status": status})
        os._exit(status)


def _exit_as_python_does() -> None:
    """What an interpreter does at its exit, before `os._exit`: join its threads, then run the
    atexit handlers (Prefect's flushes of run logs and events to the API)."""
    import atexit
    import threading

    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()


def _watch_client(conn: socket.socket) -> None:
    """A thread that ends the command (SIGTERM) when its caller goes away."""
    import threading

    def watch() -> None:
        with contextlib.suppress(OSError):
            conn.settimeout(None)
            while conn.recv(1):
                pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="tokenmill-warm-client", daemon=True).start()


def spawn(directory: str, server_pid: int) -> None:
    """Start a runner for the local server in `directory` unless one with this code and
    environment answers there already (the command's exit is not delayed: it runs detached)."""
    if not enabled(_ORIGINAL_ENV) or len(os.path.join(directory, SOCKET_FILE)) > 100:  # AF_UNIX path limit
        return
    try:
        with open(os.path.join(directory, INFO_FILE)) as f:
            info = json.load(f)
        if info["env"] == env_key(_ORIGINAL_ENV) and info["fingerprint"] == code_fingerprint(info["extra"]) and pid_alive(info["pid"]):
            return
        _log(
            directory,
            f"pid {os.getpid()} replaces the runner {info['pid']}: its environment or code is not this command's",
        )
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(info["pid"]), signal.SIGTERM)  # another environment's or stale: one runner per server
    except (OSError, ValueError, KeyError, TypeError):
        pass
    env = {**_ORIGINAL_ENV, "PYTHONPATH": os.pathsep.join(p for p in (_ROOT, _ORIGINAL_ENV.get("PYTHONPATH")) if p)}
    spawn_detached(["-m", "flows.warm", directory, str(server_pid), env_key(_ORIGINAL_ENV)], env, os.path.join(directory, LOG_FILE))


def spawn_detached(args: list[str], env: dict[str, str], log_path: str, append: bool = True):
    """`python ARGS` in a session of its own (the terminal's Ctrl-C and hang-up do not reach
    it), in /, its output to `log_path` (appended, or from empty)."""
    import subprocess

    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    log = os.open(log_path, flags, 0o600)
    try:
        return subprocess.Popen(
            [sys.executable, *args],
            env=env,
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(log)


def stop(directory: str) -> None:
    """Stop the runner of the local server in `directory`, if one runs."""
    try:
        with open(os.path.join(directory, INFO_FILE)) as f:
            pid = int(json.load(f)["pid"])
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"flows.warm" not in f.read():
                return
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError, KeyError, TypeError):
        pass


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


if __name__ == "__main__":
    # Through the importable module, not this `__main__` copy of it: the children's state
    # (the command's environment) must be the one `flows.prefect_api` sees.
    from flows import warm

    warm.serve(sys.argv[1], int(sys.argv[2]), sys.argv[3])
