"""A warm runner: `tokenmill` commands without the cost of importing Prefect each time.

A command spends one to several seconds importing Prefect, pydantic, Arrow and the flows
before it does any work. Next to tokenmill's local Prefect server (flows.prefect_api) runs
a process that has made those imports once, the warm runner; a command connects to it over
a Unix socket in the server's directory, hands over its argv, working directory, umask and
standard streams (the file descriptors themselves), and the runner forks a child that runs
the command as `flows.cli.main` would in a fresh process. The command's process waits,
forwards Ctrl-C and SIGTERM to the child, and exits with the child's status. The same idea
as Mercurial's chg or Gradle's daemon, kept small. It is opt-in (TOKENMILL_WARM=1; README
and docs/operations.md give the figures).

A command uses the runner only when the child cannot differ from a fresh process, and
only a runner that is its own user's:

- Who: the runner's folder is the caller's, 0700, and no folder above it lets another user
  replace it (flows.home.check_own_dir); its socket and state file are the caller's; each
  side checks the other's credentials on the socket (SO_PEERCRED: same uid, and the pid the
  state file names). The environment is never sent: the runner was started with the
  caller's (it keeps it aside for the children) and the caller only compares a salted hash.
- Where: the same resource limits, niceness, CPU affinity, cgroup, namespaces, uid, gids
  and OOM score as the runner (`process_context`), or the command runs the usual way.
- What code: the runner lists every file it imported (its modules, the project's sources,
  each installed distribution's RECORD) with size and modification time; a command whose
  files differ runs the usual way, and the next spawns a fresh runner. A runner whose files
  changed while it was importing them (or so recently that a file system's coarse clock could
  hide a second change) does not serve.
- Anything else runs the usual way too: a terminal on stdin with `-` in the arguments,
  `server`, `serve` and `deploy`, TOKENMILL_WARM unset or 0, no runner. Once a command is
  handed over, it is never run a second time in-process: a runner that does not answer is
  an error.

The runner is started in the background, at the exit of a command that used the local
server (so the command it speeds up is the next one); it imports and then forks, with no
thread started in between (fork copies one thread). It leaves when the local server is
gone, when its code changed, on SIGTERM, and after TOKENMILL_SERVER_IDLE_TIMEOUT unused.

Runner files, in the local server's directory: ``warm.sock`` (the socket), ``warm.json``
(its pid, files, context and environment key), ``warm.log`` (what it served).

The runner process itself is ``python -m flows.entry DIR SERVER_PID``: this module
imports nothing of tokenmill's but flows.home; what it runs is handed to `serve`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import stat
import struct
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from flows.home import NotOwnError, check_own_dir, check_own_file, pid_alive, prefect_home, spawn_detached

ENV_WARM = "TOKENMILL_WARM"
SOCKET_FILE, INFO_FILE, LOG_FILE = "warm.sock", "warm.json", "warm.log"
RUNNER_MODULE = "flows.entry"
# The shell's bookkeeping, which changes between two commands of the same session: sent
# with each request, the rest of the environment must be the runner's.
VOLATILE = ("_", "PWD", "OLDPWD", "SHLVL", "COLUMNS", "LINES")
_PACKAGES = ("flows", "tasks", "pipeline_lib", "deployments")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PYTHONPATH_KEPT = "_TOKENMILL_WARM_PYTHONPATH"  # the caller's PYTHONPATH while the runner starts
# A file modified this close to the runner's start may have changed again within one tick of
# a coarse file-system clock (FAT: 2 s) without its time moving: not trusted.
RACY_S = 2.0
REPLY_TIMEOUT_S = 60.0  # for the runner's first answer, after the request is sent
_HEADER = struct.Struct("!I")
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # from the command's process to the served one
_ORIGINAL_ENV = dict(os.environ)  # before the CLI sets its own variables (flows.cli.main)


# --------------------------------------------------------------------------- shared
def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(ENV_WARM, "").strip().lower() in ("1", "true", "yes", "on")


def env_key(environ: Mapping[str, str], salt: str) -> str:
    items = sorted((k, v) for k, v in environ.items() if k not in VOLATILE)
    return hashlib.sha256(salt.encode() + json.dumps(items).encode()).hexdigest()


def process_context() -> dict:
    """What a forked child inherits from its parent and a command's process from its shell,
    beyond the environment: identity, resource limits, niceness, CPU affinity, cgroup,
    namespaces and OOM score. A command is served only where its own equals the runner's."""
    import resource

    limits = {
        name: list(resource.getrlimit(getattr(resource, name)))
        for name in sorted(dir(resource))
        if name.startswith("RLIMIT_")
    }
    context: dict = {
        "ids": [os.getuid(), os.geteuid(), os.getgid(), os.getegid(), sorted(os.getgroups())],
        "rlimits": limits,
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }
    for name, path in (("cgroup", "/proc/self/cgroup"), ("oom_score_adj", "/proc/self/oom_score_adj")):
        try:
            with open(path) as f:
                context[name] = f.read()
        except OSError:
            context[name] = None
    context["ns"] = {}
    for ns in ("mnt", "pid", "net", "user", "ipc", "uts", "cgroup"):
        with contextlib.suppress(OSError):
            context["ns"][ns] = os.readlink(f"/proc/self/ns/{ns}")
    return context


def project_files() -> list[str]:
    """The project's sources and data files (a new or removed one counts as a change too)."""
    paths = []
    for package in _PACKAGES:
        for top, dirs, files in os.walk(os.path.join(_ROOT, package)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            paths += [
                os.path.join(top, f) for f in sorted(files) if f.endswith((".py", ".so", ".txt", ".yaml", ".json"))
            ]
    return paths


def installed_records() -> list[str]:
    """Each installed distribution's RECORD (and the .pth files): a pip install, upgrade or
    removal rewrites them."""
    import sysconfig

    paths = []
    for key in ("purelib", "platlib"):
        directory = sysconfig.get_paths()[key]
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir(directory)):
                if name.endswith(".dist-info"):
                    paths.append(os.path.join(directory, name, "RECORD"))
                elif name.endswith(".pth"):
                    paths.append(os.path.join(directory, name))
        paths.append(directory)  # its listing: a distribution added or removed
    return sorted(set(paths))


def stat_files(paths: list[str]) -> list[list]:
    """[path, size, mtime_ns] of each of `paths` ([path, -1, -1] for a missing one)."""
    out = []
    for path in paths:
        try:
            st = os.stat(path)
            out.append([path, st.st_size, st.st_mtime_ns])
        except OSError:
            out.append([path, -1, -1])
    return out


def fingerprint(paths: list[str]) -> str:
    """The code a runner serves: `paths` (what it imported) and the project's files now."""
    # The interpreter by what it is (python and python3 are one), and its environment (a venv).
    h = hashlib.sha256(f"{os.path.realpath(sys.executable)}\0{sys.prefix}\0{_ROOT}".encode())
    h.update(json.dumps(stat_files(sorted(set(paths) | set(project_files())))).encode())
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


def peer(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of the Unix socket `conn`."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", creds)
    return pid, uid, gid


def read_info(directory: str) -> dict:
    """The runner's warm.json, after checking that the folder and the file are the caller's.

    Raises:
        NotOwnError, OSError, ValueError: no runner of this user's there.
    """
    check_own_dir(directory)
    path = os.path.join(directory, INFO_FILE)
    check_own_file(path)
    with open(path) as f:
        info = json.load(f)
    if not isinstance(info, dict):
        raise ValueError(f"{path}: not a runner's state")
    return info


# --------------------------------------------------------------------------- the command's side
def run_warm(argv: list[str], directory: str | None = None) -> int | None:
    """Run the command `argv` in the warm runner of the local server in `directory`; its exit
    status, or None when it has to run the usual way (no runner of this user's, another
    environment, context or code)."""
    if not enabled() or (argv and argv[0] in ("server", "serve", "deploy")):
        return None
    directory = directory or os.path.join(prefect_home(), "tokenmill")
    stdin = 0
    if os.isatty(0):  # the child is not in the terminal's foreground group: it must not read it
        if "-" in argv:
            return None
        stdin = os.open(os.devnull, os.O_RDONLY)
    # Ctrl-C, SIGTERM and hang-up are the command's from the handover on. Until its process
    # says it is ready (its own handlers installed) they are held here, then forwarded; if it
    # never starts, they are raised here again, as they would have been without the runner.
    held: list[int] = []
    child = 0

    def forward(signum, frame):
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signum)
        else:
            held.append(signum)

    previous: dict[int, Any] = {}

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        previous.clear()
        for held_signum in held:
            signal.raise_signal(held_signum)

    try:
        try:
            info = read_info(directory)
            if (
                info["env"] != env_key(_ORIGINAL_ENV, info["salt"])
                or info["context"] != process_context()
                or info["fingerprint"] != fingerprint(info["files"])
            ):
                return None
            sock_path = os.path.join(directory, SOCKET_FILE)
            check_own_file(sock_path, stat.S_IFSOCK)
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(5.0)
            conn.connect(sock_path)
            pid, uid, _ = peer(conn)
            if uid != os.getuid() or pid != info["pid"]:
                conn.close()
                return None  # not the runner its state file names
            request = {
                "argv": argv,
                "cwd": os.getcwd(),
                "umask": _umask(),
                "volatile": {k: _ORIGINAL_ENV[k] for k in VOLATILE if k in _ORIGINAL_ENV},
                "env": info["env"],
                "context": info["context"],
                "fingerprint": info["fingerprint"],
            }
            for signum in _FORWARDED:
                previous[signum] = signal.signal(signum, forward)
            _send(conn, request, [stdin, 1, 2])
        except (OSError, ValueError, KeyError, TypeError, NotOwnError):
            restore()
            return None
        # Handed over: from here on the runner may have started the command, which must not
        # run a second time in this process.
        try:
            conn.settimeout(REPLY_TIMEOUT_S)
            reply, _ = _recv(conn)
        except (OSError, ValueError, EOFError) as e:
            conn.close()
            print(
                f"tokenmill: error: the warm runner in {directory} took the command but did not answer "
                f"({type(e).__name__}); "
                f"see {os.path.join(directory, LOG_FILE)}; run it again, or with {ENV_WARM}=0",
                file=sys.stderr,
            )
            restore()
            return 1
    finally:
        if stdin:
            os.close(stdin)
    if "pid" not in reply:
        conn.close()
        restore()
        if "status" in reply:  # its process failed before it was ready (its traceback is in the log)
            return int(reply["status"])
        return None  # the runner refused before starting anything (its code or context changed)
    child = int(reply["pid"])
    for held_signum in held:  # held during the handover: the command's now
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, held_signum)
    held.clear()
    conn.settimeout(None)
    try:
        status, _ = _recv(conn)
        return int(status["status"])
    except (OSError, ValueError, KeyError, EOFError):
        print(
            f"tokenmill: error: the command's process ({child}) ended without an exit status (killed?); see "
            f"{os.path.join(directory, LOG_FILE)}",
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
def _log(directory: str, text: str) -> None:
    fd = os.open(os.path.join(directory, LOG_FILE), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")


def serve(
    directory: str, server_pid: int, preload: Callable[[], None], run: Callable[[list[str]], int], idle_s: float
) -> None:
    """The runner: `preload` (the imports), then fork a child per command that calls `run(argv)`."""
    import threading

    started = time.time()
    check_own_dir(directory)
    # The caller's environment, as it was: the children's (never sent over the socket).
    kept = os.environ.pop(_PYTHONPATH_KEPT, None)
    if kept is not None:
        if kept:
            os.environ["PYTHONPATH"] = kept
        else:
            os.environ.pop("PYTHONPATH", None)
    salt = os.urandom(16).hex()
    command_env = dict(os.environ)
    context = process_context()
    preload()
    if threading.active_count() != 1:  # fork would copy one thread of several
        _log(directory, f"not serving: {threading.active_count()} threads after the imports")
        return
    imported = {f for m in list(sys.modules.values()) if isinstance(f := getattr(m, "__file__", None), str)}
    files: list[str] = sorted(imported | set(installed_records()))
    racy = [
        p
        for p, _size, mtime in stat_files(sorted(set(files) | set(project_files())))
        if mtime >= (started - RACY_S) * 1e9
    ]
    if racy:
        _log(directory, f"not serving: {racy[0]} changed while the runner started (or just before)")
        return
    code = fingerprint(files)
    sock_path = os.path.join(directory, SOCKET_FILE)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sock_path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_mask = os.umask(0o177)  # the socket is 0600 from its creation
    try:
        listener.bind(sock_path)
    finally:
        os.umask(old_mask)
    listener.listen(16)
    listener.settimeout(5.0)
    info = {
        "pid": os.getpid(),
        "started": started,
        "salt": salt,
        "env": env_key(command_env, salt),
        "context": context,
        "files": files,
        "fingerprint": code,
        "idle_timeout_s": idle_s,
    }
    tmp = os.path.join(directory, f".{INFO_FILE}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)
    os.replace(tmp, os.path.join(directory, INFO_FILE))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel

    def leave(signum, frame):
        _log(directory, f"signal {signum}: leaving")
        sys.exit(0)

    signal.signal(signal.SIGTERM, leave)
    _log(directory, f"serving (pid {os.getpid()}, {len(files)} files watched)")
    last_used = time.monotonic()
    try:
        while (idle_s <= 0 or time.monotonic() - last_used < idle_s) and pid_alive(server_pid):
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            fds: list[int] = []
            try:
                pid, uid, _gid = peer(conn)
                if uid != os.getuid():
                    _log(directory, f"refused a connection from uid {uid} (pid {pid})")
                    continue
                last_used = time.monotonic()
                conn.settimeout(5.0)
                request, fds = _recv(conn, max_fds=3)
                now = fingerprint(files)
                if (
                    len(fds) != 3
                    or request.get("fingerprint") != now
                    or request.get("env") != info["env"]
                    or request.get("context") != context
                ):
                    _send(conn, {"refused": "code, environment or context changed"})
                    if now != code:
                        _log(directory, "code changed: leaving")
                        return
                    continue
                child = os.fork()
                if child == 0:
                    listener.close()
                    _run_child(directory, conn, request, fds, command_env, run)  # never returns
                _log(directory, f"pid {child}: tokenmill {' '.join(request['argv'])[:300]}")
            except (OSError, ValueError, KeyError, EOFError) as e:
                _log(directory, f"bad request: {e!r}")
            finally:
                conn.close()
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)
        _log(directory, "idle time-out, or the local server is gone: leaving")
    finally:
        listener.close()
        with contextlib.suppress(OSError, ValueError):
            with open(os.path.join(directory, INFO_FILE)) as f:
                if json.load(f).get("pid") == os.getpid():
                    os.unlink(os.path.join(directory, INFO_FILE))
                    os.unlink(sock_path)
        with contextlib.suppress(OSError):
            _log(directory, "stopped")


def _run_child(
    directory: str,
    conn: socket.socket,
    request: dict,
    fds: list[int],
    command_env: dict[str, str],
    run: Callable[[list[str]], int],
) -> None:
    """In the forked child: become the command's process, run it, report its status."""
    status = 1
    try:
        # The signals the caller forwards, as in a fresh process, before the caller learns this
        # pid (it holds them until then): forwarded earlier, they met the runner's handlers
        # (SIGTERM: the runner's own exit) or a process not yet the command's.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own streams
        sys.stdout = open(1, "w", closefd=False, buffering=-1 if not os.isatty(1) else 1)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False, buffering=1)  # noqa: SIM115
        os.chdir(request["cwd"])
        os.umask(int(request["umask"]))
        env = {k: v for k, v in command_env.items() if k not in VOLATILE}
        env.update({k: v for k, v in request["volatile"].items() if k in VOLATILE})
        os.environ.clear()
        os.environ.update(env)
        _ORIGINAL_ENV.clear()
        _ORIGINAL_ENV.update(env)
        import tempfile

        tempfile.tempdir = None  # TMPDIR as the command's
        sys.argv = ["tokenmill", *request["argv"]]
        _send(conn, {"pid": os.getpid()})  # ready: from here on the caller's signals are this process's
        _watch_client(conn)
        global _served
        _served = conn
        status = run(request["argv"])
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:  # before main could report it: as a fresh process, a traceback and 128 + SIGINT
        import traceback

        traceback.print_exc()
        status = 128 + signal.SIGINT
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

            cpu = sum(
                r.ru_utime + r.ru_stime
                for r in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
            )
            _log(directory, f"pid {os.getpid()}: exit {status}, {cpu:.2f} s CPU")
        with contextlib.suppress(BaseException):
            _send(conn, {"status": status})
        os._exit(status)


_served: socket.socket | None = None  # in a served command's process: the connection to its caller


def exit_now(status: int) -> None:
    """End this command's process at once, with `status` (no at-exit handlers), telling the
    caller when the process is a served command."""
    if _served is not None:
        with contextlib.suppress(BaseException):
            _send(_served, {"status": status})
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
    """Start a runner for the local server in `directory` unless one with this code,
    environment and context answers there already (the command's exit is not delayed: it
    runs detached)."""
    if not enabled(_ORIGINAL_ENV) or len(os.path.join(directory, SOCKET_FILE)) > 100:  # AF_UNIX path limit
        return
    try:
        check_own_dir(directory)
    except (OSError, NotOwnError):
        return
    try:
        info = read_info(directory)
        same = info["env"] == env_key(_ORIGINAL_ENV, info["salt"]) and info["context"] == process_context()
        if same and info["fingerprint"] == fingerprint(info["files"]) and pid_alive(info["pid"]):
            return
        _log(
            directory,
            f"pid {os.getpid()} replaces the runner {info['pid']}: its environment, context or code is "
            "not this command's",
        )
        stop(directory)  # one runner per server
    except (OSError, ValueError, KeyError, TypeError, NotOwnError):
        pass
    env = {
        **_ORIGINAL_ENV,
        _PYTHONPATH_KEPT: _ORIGINAL_ENV.get("PYTHONPATH", ""),
        "PYTHONPATH": os.pathsep.join(p for p in (_ROOT, _ORIGINAL_ENV.get("PYTHONPATH")) if p),
    }
    spawn_detached(["-m", RUNNER_MODULE, directory, str(server_pid)], env, os.path.join(directory, LOG_FILE))


def runner_pid(directory: str) -> int | None:
    """The pid of this user's runner serving in `directory`, if one runs."""
    try:
        pid = int(read_info(directory)["pid"])
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return pid if RUNNER_MODULE.encode() in f.read() else None
    except (OSError, ValueError, KeyError, TypeError, NotOwnError):
        return None


def stop(directory: str, wait_s: float = 10.0) -> int | None:
    """Stop the runner of the local server in `directory`, if one runs, and wait (up to
    `wait_s`) for it to be gone, so that nothing writes there afterwards. Its pid, or None."""
    pid = runner_pid(directory)
    if pid is None:
        return None
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + wait_s
    while pid_alive(pid) and time.monotonic() < end:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)
    return pid
