"""The failure classifier: every failure of a command as one line and an exit status.

Every failure ends in one ``tokenmill: error: ...`` line on stderr that names the file,
URL or store and what to do, and an exit status: 2 bad input (InputError, ConfigError),
1 any other failure, 130 Ctrl-C, 143 SIGTERM. No traceback on the console: it goes to a
log file (always; the line names the file for unexpected errors, i.e. bugs) and, while a
flow runs, to Prefect's run logs. `--debug` / TOKENMILL_DEBUG=1 prints it as well.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import os
import re
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from flows.home import prefect_home
from pipeline_lib.errors import CancelledError, InputError, TokenmillError, is_network_error

# 141: 128 + SIGPIPE, as a shell reports it
EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_BROKEN_PIPE = 1, 2, 130, 143, 141
ENV_DEBUG = "TOKENMILL_DEBUG"  # also read by flows.console (not imported here: it imports Prefect)
ENV_LOG_DIR = "TOKENMILL_LOG_DIR"  # default: $PREFECT_HOME/logs, i.e. ~/.prefect/logs
KEEP_LOG_FILES = 50
# Prefect's documented override of one logging.yml key (PREFECT_LOGGING_[PATH]_[TO]_[KEY]):
# its console handler becomes flows.console.ConsoleHandler, which drops run-failure
# tracebacks, here and in the worker processes that inherit the environment.
PREFECT_CONSOLE_CLASS = ("PREFECT_LOGGING_HANDLERS_CONSOLE_CLASS", "flows.console.ConsoleHandler")
# prefect.server.api.server
_EPHEMERAL_TIMEOUT = "Timed out while attempting to connect to ephemeral Prefect API server"
RERUN_RESUMES = "then rerun the same command (finished stages are reused; nothing was published half)"
RERUN_READ_ONLY = "then rerun the command"
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OUR_DIRS = tuple(os.path.join(_PACKAGE_ROOT, d) + os.sep for d in ("pipeline_lib", "tasks", "flows", "deployments"))

# One error line per command: `report_failure` prints it, unless the bounded exit after a
# SIGTERM (flows.signals) printed it first.
_error_line_lock = threading.Lock()
_error_line_printed = threading.Event()


class Terminated(BaseException):
    """SIGTERM outside a flow run (inside one, Prefect's engine raises its TerminationSignal)."""


@dataclass(frozen=True)
class Failure:
    message: str  # one line, without the "tokenmill: error: " prefix
    exit_code: int
    unexpected: bool = False  # a bug: the line points at the log file


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc`, its causes and contexts, and the error botocore wraps (``kwargs['error']``)."""
    out: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or any(e is seen for seen in out):
            continue
        out.append(e)
        wrapped = getattr(e, "kwargs", None)
        todo += [
            wrapped.get("error")
            if isinstance(wrapped, dict) and isinstance(wrapped.get("error"), BaseException)
            else None,
            e.__cause__,
            e.__context__,
        ]
    return out


def _where(exc: BaseException) -> str:
    """`` in FILE:LINE (function)`` of the innermost frame in tokenmill's own code, if any."""
    found = ""
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        path = frame.f_code.co_filename
        if path.startswith(_OUR_DIRS):
            found = f" in {os.path.relpath(path, _PACKAGE_ROOT)}:{lineno} ({frame.f_code.co_name})"
    return found


def _one_line(text: object, limit: int = 2000) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _errno_in(e: BaseException, *names: str) -> bool:
    codes = {getattr(errno, n) for n in names if hasattr(errno, n)}
    return isinstance(e, OSError) and e.errno in codes


_DISK_FULL_TEXT = re.compile(
    r"no space left on device|disk quota exceeded|errno 28\b|code: 28\b|StorageFull|errno "
    r"122\b",
    re.IGNORECASE,
)
_REFUSED_TEXT = re.compile(r"connection refused|connect call failed", re.IGNORECASE)


def _is_disk_full(e: BaseException) -> bool:
    # Native writers (pyarrow, torch, safetensors) report ENOSPC in their own exception types.
    return _errno_in(e, "ENOSPC", "EDQUOT") or (
        not isinstance(e, TokenmillError) and bool(_DISK_FULL_TEXT.search(str(e)))
    )


def _type_names(e: BaseException) -> set[str]:
    """``package.Class`` for the classes of `e` (matched by name: botocore, aiohttp and httpx
    are optional or Prefect's, and need not be importable here)."""
    return {c.__module__.split(".")[0] + "." + c.__name__ for c in type(e).__mro__}


def _url_of(chain: list[BaseException]) -> str | None:
    """The URL or host a network error names (botocore's endpoint, httpx's request, aiohttp's host)."""
    for e in chain:
        kwargs = getattr(e, "kwargs", None)
        if isinstance(kwargs, dict) and kwargs.get("endpoint_url"):
            return str(kwargs["endpoint_url"]).split("?", 1)[0]
        with contextlib.suppress(Exception):
            request = getattr(e, "request", None)  # httpx raises RuntimeError when unset
            if request is not None and getattr(request, "url", None):
                return str(request.url).split("?", 1)[0]
        host, port = getattr(e, "host", None), getattr(e, "port", None)
        if isinstance(host, str) and port:
            return f"{host}:{port}"
    return None


def _redact(text: str) -> str:
    """Hide credentials in URLs (``scheme://user:secret@host``)."""
    return re.sub(r"(\w+://)[^/@\s'\"]+@", r"\1***@", text)


_SECRET_OPTION = re.compile(r"secret|password|token|key|credential", re.IGNORECASE)


def _redact_argv(argv: list[str]) -> list[str]:
    """The command line with the values of secret-looking --storage-option pairs hidden."""
    out = []
    for i, arg in enumerate(argv):
        prefix, pair = "", None
        if i and argv[i - 1] == "--storage-option":
            pair = arg
        elif arg.startswith("--storage-option="):
            prefix, pair = arg.split("=", 1)[0] + "=", arg.split("=", 1)[1]
        if pair is not None and "=" in pair and _SECRET_OPTION.search(pair.split("=", 1)[0]):
            arg = f"{prefix}{pair.split('=', 1)[0]}=***"
        out.append(_redact(arg))
    return out


def describe_failure(exc: BaseException, store: str | None = None, resumable: bool = True) -> Failure:
    """The one line and exit status that report `exc` (see the section comment above): those
    of the first of `_RULES` that matches it, else an unexpected error (a bug).

    `store` is named when the error itself names no file; `resumable`: the command runs
    stages, which a rerun resumes (else the advice is just to rerun it).
    """
    chain = _chain(exc)
    store_part = f"the store {store}" if store else "the store"
    filename = next((str(e.filename) for e in chain if isinstance(e, OSError) and e.filename), None)
    facts = _Facts(
        exc,
        chain,
        _where(exc),
        RERUN_RESUMES if resumable else RERUN_READ_ONLY,
        store_part,
        filename,
        filename or store_part,
    )
    for rule in _RULES:
        if (failure := rule(facts)) is not None:
            return failure
    return Failure(f"unexpected {type(exc).__name__}: {_one_line(exc, 500)}{facts.at}", EXIT_FAILURE, unexpected=True)


@dataclass(frozen=True)
class _Facts:
    """What the rules read about a failure, found once."""

    exc: BaseException
    chain: list[BaseException]  # `exc`, its causes and contexts (`_chain`)
    at: str  # where in tokenmill's code it was raised (`_where`), or ""
    rerun: str  # the advice most lines end with
    store_part: str  # "the store URL"
    filename: str | None  # the file an OSError in the chain names
    target: str  # that file, else the store


def _interrupted(f: _Facts) -> Failure | None:
    """Ctrl-C, SIGTERM (ours outside a flow run, Prefect's TerminationSignal in one), a cancel."""
    exc, rerun = f.exc, f.rerun
    if type(exc).__name__ == "TerminationSignal" or isinstance(exc, Terminated):
        signum = getattr(exc, "signal", None) or (exc.args[0] if exc.args else signal.SIGTERM)
        if signum == signal.SIGINT:
            return Failure(f"interrupted (Ctrl-C); {rerun}", EXIT_INTERRUPTED)
        return Failure(f"terminated (SIGTERM); {rerun}", EXIT_TERMINATED)
    if isinstance(exc, (KeyboardInterrupt, CancelledError)):
        what = _one_line(exc) if isinstance(exc, CancelledError) and str(exc) else "interrupted (Ctrl-C)"
        return Failure(f"{what}; {rerun}", EXIT_INTERRUPTED)
    return None


def _our_error(f: _Facts) -> Failure | None:
    """Our own errors say what to do already: bad input, or a failure the code foresaw."""
    exc, rerun = f.exc, f.rerun
    if isinstance(exc, InputError):
        return Failure(_one_line(exc), EXIT_BAD_INPUT)
    if isinstance(exc, TokenmillError):
        message = _one_line(exc)
        if "staging" in message:
            message += (
                "; if `tokenmill gc` ran meanwhile, it removed this run's staging area: "
                f"{rerun.removeprefix('then ')}, and give gc a --min-age longer than your runs"
            )
        return Failure(message, EXIT_FAILURE)
    return None


def _disk_full(f: _Facts) -> Failure | None:
    if full := next((e for e in f.chain if _is_disk_full(e)), None):
        what = (
            "disk quota exceeded (EDQUOT)"
            if _errno_in(full, "EDQUOT") or "quota" in str(full).lower()
            else ("no space left on device (ENOSPC)")
        )
        return Failure(
            f"{what} writing {f.target}: free space there (`tokenmill gc` removes unpublished leftovers) or choose "
            f"another --store, {f.rerun}",
            EXIT_FAILURE,
        )
    return None


def _out_of_memory(f: _Facts) -> Failure | None:
    if any(isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError" for e in f.chain):
        return Failure(
            f"out of memory{f.at}: use more --shards (smaller shards), fewer --workers, or a smaller --lm-preset / "
            f"--batch-size, {f.rerun}",
            EXIT_FAILURE,
        )
    return None


def _permission_denied(f: _Facts) -> Failure | None:
    """A file named: its access; else the store's credentials."""
    if denied := next(
        (e for e in f.chain if isinstance(e, PermissionError) or _errno_in(e, "EACCES", "EPERM", "EROFS")), None
    ):
        if f.filename:
            reason = "read-only file system" if _errno_in(denied, "EROFS") else "permission denied"
            return Failure(
                f"{reason}: {f.filename}: give this user access to it or choose another --store / path, {f.rerun}",
                EXIT_FAILURE,
            )
        return Failure(
            f"permission denied for {f.store_part} ({_one_line(denied, 300)}): check the credentials "
            f"(--storage-option key=... / AWS_PROFILE) and the bucket's policy, {f.rerun}",
            EXIT_FAILURE,
        )
    return None


def _temporary_server_timeout(f: _Facts) -> Failure | None:
    if any(isinstance(e, RuntimeError) and str(e).startswith(_EPHEMERAL_TIMEOUT) for e in f.chain):
        return Failure(
            "Prefect's temporary API server did not start in time (TOKENMILL_PREFECT_SERVER=temporary): unset "
            "TOKENMILL_PREFECT_SERVER to use tokenmill's reused local server, allow it more time "
            "(TOKENMILL_SERVER_STARTUP_TIMEOUT=600) or set PREFECT_API_URL to a running server (prefect server "
            f"start), {f.rerun}",
            EXIT_FAILURE,
        )
    return None


def _prefect_api_server_error(f: _Facts) -> Failure | None:
    """An HTTP 5xx from the Prefect API (only Prefect's client speaks httpx here); other
    statuses are left to the rules after this one."""
    if status := next((e for e in f.chain if _type_names(e) & {"httpx.HTTPStatusError"}), None):
        response = getattr(status, "response", None)
        code = getattr(response, "status_code", "?")
        url = _url_of(f.chain) or "the Prefect API"
        if isinstance(code, int) and code >= 500:
            return Failure(
                f"the Prefect API at {url} failed (HTTP {code}): check that server and its log (tokenmill's local one: "
                f"tokenmill server status; restart it with tokenmill server stop), {f.rerun}",
                EXIT_FAILURE,
            )
    return None


def _unreachable(f: _Facts) -> Failure | None:
    """A network error: the Prefect API down, a connection refused, no answer in time, other."""
    chain, rerun = f.chain, f.rerun
    if net := next((e for e in chain if is_network_error(e)), None):
        url = _url_of(chain) or f.store_part
        if any(_type_names(e) & {"httpx.TransportError"} for e in chain):
            return Failure(
                f"cannot reach the Prefect API at {url} ({_one_line(net, 300)}): start that server (prefect server "
                "start) "
                f"or unset PREFECT_API_URL to use tokenmill's local one, {rerun}",
                EXIT_FAILURE,
            )
        if any(
            isinstance(e, ConnectionRefusedError) or _errno_in(e, "ECONNREFUSED") or _REFUSED_TEXT.search(str(e))
            for e in chain
        ):
            return Failure(
                f"cannot connect to {url}: connection refused: check that the server is running and the address "
                f"(--storage-option endpoint_url=...) is right, {rerun}",
                EXIT_FAILURE,
            )
        if timeout := next(
            (e for e in chain if isinstance(e, TimeoutError) or "timeout" in type(e).__name__.lower()), None
        ):
            return Failure(
                f"no answer from {url} in time, after retries ({type(timeout).__name__}): the server is down, paused "
                "or overloaded (or allow it more time, e.g. --storage-option config_kwargs='{\"read_timeout\": 120}'); "
                f"when it answers, {rerun.removeprefix('then ')}",
                EXIT_FAILURE,
            )
        return Failure(
            f"cannot reach {url}: {_one_line(net, 300)}: check the network and the address, {rerun}", EXIT_FAILURE
        )
    return None


def _numeric_overflow(f: _Facts) -> Failure | None:
    if overflow := next((e for e in f.chain if isinstance(e, OverflowError)), None):
        return Failure(
            f"numeric overflow{f.at} ({_one_line(overflow, 300)}): a number is out of range; check the numeric options "
            "(--vocab-size, --shards, --lm-steps, --batch-size...) and the input files",
            EXIT_FAILURE,
        )
    return None


def _other_os_error(f: _Facts) -> Failure | None:
    exc, filename = f.exc, f.filename
    if isinstance(exc, OSError):
        reason = exc.strerror or _one_line(exc, 300)
        message = f"{f.target}: {reason}" if filename else f"{_one_line(exc, 300)} (while working on {f.target})"
        if filename and "/.staging/" in filename:
            message += (
                "; if `tokenmill gc` ran meanwhile, it removed this run's staging area: give gc a --min-age "
                "longer than your runs"
            )
        return Failure(f"{message}; {f.rerun}", EXIT_FAILURE)
    return None


# In order: the first that matches describes the failure (a chain can hold several causes).
_RULES: tuple[Callable[[_Facts], Failure | None], ...] = (
    _interrupted,
    _our_error,
    _disk_full,
    _out_of_memory,
    _permission_denied,
    _temporary_server_timeout,
    _prefect_api_server_error,
    _unreachable,
    _numeric_overflow,
    _other_os_error,
)


def _log_dir() -> str:
    if os.environ.get(ENV_LOG_DIR):
        return os.path.expanduser(os.environ[ENV_LOG_DIR])
    return os.path.join(prefect_home(), "logs")


def write_failure_log(exc: BaseException, argv: list[str], line: str) -> str | None:
    """Write the command, the error line and the full traceback to a new file in the log
    directory (owner-only: a traceback can show paths and URLs); keep the newest
    `KEEP_LOG_FILES`. Returns the file's path, or None when it cannot be written (the
    disk that is full may be this one)."""
    try:
        directory = _log_dir()
        os.makedirs(directory, mode=0o700, exist_ok=True)
        now = dt.datetime.now()
        path = os.path.join(directory, f"tokenmill-{now:%Y%m%d-%H%M%S-%f}-{os.getpid()}.log")
        text = f"{now.isoformat()} tokenmill {' '.join(_redact_argv(argv))}\ntokenmill: error: {line}\n\n" + "".join(
            traceback.format_exception(exc)
        )
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as f:
            f.write(_redact(text))
        logs = sorted(n for n in os.listdir(directory) if n.startswith("tokenmill-") and n.endswith(".log"))
        for old in logs[:-KEEP_LOG_FILES]:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, old))
        return path
    except OSError:
        return None


def report_failure(
    exc: BaseException, argv: list[str], store: str | None = None, debug: bool = False, resumable: bool = True
) -> int:
    """Print the one ``tokenmill: error:`` line for `exc` (the traceback too with `debug`),
    log the traceback to a file, and return the exit status."""
    failure = describe_failure(exc, store, resumable)
    log_file = write_failure_log(exc, argv, failure.message)
    line = failure.message
    if failure.unexpected:
        where = f"the full traceback is in {log_file}" if log_file else "the traceback could not be logged"
        line += f" (a bug in tokenmill: {where}; rerun with --debug to print it)"
    with _error_line_lock:  # once: the exit a SIGTERM bounds (_exit_now) may print it instead
        if not _error_line_printed.is_set():
            if debug:
                traceback.print_exception(exc, file=sys.stderr)
            print(f"tokenmill: error: {_redact(line)}", file=sys.stderr, flush=True)
            _error_line_printed.set()
    return failure.exit_code
