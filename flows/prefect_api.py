"""The Prefect API that tokenmill's flows report to, and tokenmill's local server.

With PREFECT_API_URL set (environment, profile or prefect.toml), flows report to that
server. Without it, `flow_api` gives them tokenmill's local server, started once and reused
(`flows.server_manager`). Why not Prefect's own temporary server, which
starts with each command and stops with it: it costs 8-20 s of every run on a loaded
2-core machine and fails after its 20 s start-up timeout (docs/operations.md, section 1).
TOKENMILL_PREFECT_SERVER=temporary still selects it (with a start-up timeout of
TOKENMILL_SERVER_STARTUP_TIMEOUT seconds).

What a command's flows cost the API, whichever it is: a task run asks for concurrency slots only
for tags that have a limit (`TagLimits`; Prefect 3.9's task engine still asks for every set of
tags). Against a server (PREFECT_API_URL), flow runs send tokenmill's heartbeat (every 30 s, for
the zombie-run automation, deployments/automations.py) unless PREFECT_FLOWS_HEARTBEAT_FREQUENCY
is set; with the local server they send none unless it is set, and clients fetch no CSRF token
from a server that wants none (`local_client_settings`). Measured on `tokenmill tokenizer
train`: 41 API requests before, 15 after (benchmarks/bench_cli.py has the timings).

This module imports nothing heavy: `tokenmill server status` and the CLI's parsing use it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flows import warm
from flows.concurrency_slots import SlotWaitLog, TagLimits
from flows.home import pid_alive as _pid_alive
from flows.server_manager import (
    _DB_URL_VARS as _DB_URL_VARS,
)
from flows.server_manager import (
    _PACKAGE_ROOT as _PACKAGE_ROOT,
)
from flows.server_manager import (
    _STORAGE_VARS as _STORAGE_VARS,
)
from flows.server_manager import (
    AUTH_FILE as AUTH_FILE,
)
from flows.server_manager import (
    AUTH_USER as AUTH_USER,
)
from flows.server_manager import (
    CLIENTS_DIR as CLIENTS_DIR,
)
from flows.server_manager import (
    DB_FILE as DB_FILE,
)
from flows.server_manager import (
    DEFAULT_IDLE_TIMEOUT_S as DEFAULT_IDLE_TIMEOUT_S,
)
from flows.server_manager import (
    DEFAULT_SLOT_WAIT_LOG_S as DEFAULT_SLOT_WAIT_LOG_S,
)
from flows.server_manager import (
    DEFAULT_STARTUP_TIMEOUT_S as DEFAULT_STARTUP_TIMEOUT_S,
)
from flows.server_manager import (
    ENV_IDLE_TIMEOUT as ENV_IDLE_TIMEOUT,
)
from flows.server_manager import (  # the local server's manager; its names stay importable from here
    ENV_MODE as ENV_MODE,
)
from flows.server_manager import (
    ENV_SLOT_WAIT_LOG as ENV_SLOT_WAIT_LOG,
)
from flows.server_manager import (
    ENV_STARTUP_TIMEOUT as ENV_STARTUP_TIMEOUT,
)
from flows.server_manager import (
    LOCK_FILE as LOCK_FILE,
)
from flows.server_manager import (
    LOG_FILE as LOG_FILE,
)
from flows.server_manager import (
    MEMO_FILE as MEMO_FILE,
)
from flows.server_manager import (
    SERVER_MODULE as SERVER_MODULE,
)
from flows.server_manager import (
    STATE_FILE as STATE_FILE,
)
from flows.server_manager import (
    STORAGE_DIR as STORAGE_DIR,
)
from flows.server_manager import (
    LocalServer as LocalServer,
)
from flows.server_manager import (
    ServerError as ServerError,
)
from flows.server_manager import (
    prefect_home as prefect_home,
)
from flows.server_manager import (
    read_float_env as read_float_env,
)
from flows.server_manager import (
    server_dir as server_dir,
)
from pipeline_lib.errors import InputError


@contextlib.contextmanager
def _environ(updates: dict[str, str]) -> Iterator[None]:
    previous = {k: os.environ.get(k) for k in updates}
    os.environ.update(updates)
    try:
        yield
    finally:
        for k, v in previous.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def flow_api() -> Iterator[str | None]:
    """Point the flows run inside (and the worker processes they start) at a Prefect API:
    PREFECT_API_URL when set, else tokenmill's local server, started if needed. Yields the
    URL of the local server, or None when another API is used. Task runs inside ask the API
    for concurrency slots only for tags that have a limit (`TagLimits`).

    Raises:
        ServerError: the local server did not start (one line naming its log and the fix).
        InputError: a bad TOKENMILL_* setting.
    """
    from prefect.settings import (
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        get_current_settings,
        temporary_settings,
    )

    settings = get_current_settings()
    slot_wait_s = read_float_env(ENV_SLOT_WAIT_LOG, DEFAULT_SLOT_WAIT_LOG_S)
    if os.environ.get("PREFECT_API_URL") or settings.api.url:  # the environment, a profile or prefect.toml
        # A shared server may run the zombie automation: tokenmill's heartbeat, unless set.
        with (
            temporary_settings(set_defaults=_heartbeat_default()),
            TagLimits.installed(),
            SlotWaitLog.installed(slot_wait_s),
        ):
            yield None
        return
    startup_timeout = read_float_env(ENV_STARTUP_TIMEOUT, DEFAULT_STARTUP_TIMEOUT_S)
    mode = os.environ.get(ENV_MODE, "").strip().lower() or "local"
    if mode == "temporary":  # Prefect's per-command server, with room to start
        raw = os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS")
        updates: dict[Any, Any] = (
            {} if raw else {PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: max(1, round(startup_timeout))}
        )
        with temporary_settings(updates=updates), TagLimits.installed(), SlotWaitLog.installed(slot_wait_s):
            yield None
        return
    if mode != "local":
        raise InputError(
            f"{ENV_MODE}={mode!r}: expected local (tokenmill's reused local server) or temporary "
            "(Prefect's per-command one)"
        )
    local = LocalServer(server_dir())
    with local.registered():
        state = local.ensure(startup_timeout)
        env, updates, defaults = local_client_settings(local, state["api_url"], settings)
        watchdog = ServerWatchdog(local, state["pid"])
        try:
            with (
                _environ(env),
                temporary_settings(updates=updates, set_defaults=defaults),
                TagLimits.installed(),
                SlotWaitLog.installed(slot_wait_s),
                watchdog,
            ):
                yield state["api_url"]
        finally:
            warm.spawn(str(local.directory), state["pid"])  # for the next command (flows.warm)
            print(still_running_line(state, warm.enabled()), file=sys.stderr, flush=True)


def still_running_line(state: dict[str, Any], runner: bool) -> str:
    """What a command that used the local server leaves running, and for how long."""
    idle = float(state.get("idle_timeout_s") or 0)
    until = f"until {idle / 60:g} min without a command" if idle > 0 else "until stopped"
    what = "and its warm runner keep" if runner else "keeps"
    return (
        f"tokenmill's local Prefect server (pid {state['pid']}) {what} running {until} (stop: `tokenmill server stop`)"
    )


class ServerWatchdog:
    """While inside: checks every `INTERVAL_S` that the local server's process is alive; when
    it is gone (killed), prints one line and ends the command at once (exit 1). Otherwise
    Prefect's clients would retry for minutes, then print their own failures to log to the
    API and an error naming PREFECT_API_URL, which the user never set. The store is safe
    against an exit at any point (docs/reliability.md)."""

    INTERVAL_S = 0.5

    def __init__(self, local: LocalServer, pid: int):
        self.local, self.pid = local, pid
        self._done = threading.Event()

    def __enter__(self) -> ServerWatchdog:
        threading.Thread(target=self._watch, name="tokenmill-server-watchdog", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()

    def _alive(self) -> bool:
        with contextlib.suppress(ChildProcessError):  # it is this command's child when it started it: reap it
            if os.waitpid(self.pid, os.WNOHANG)[0] == self.pid:
                return False
        return _pid_alive(self.pid)

    def _watch(self) -> None:
        while not self._done.wait(self.INTERVAL_S):
            if not self._alive() and not self._done.is_set():
                with contextlib.suppress(OSError, ValueError):
                    sys.stdout.flush()
                with contextlib.suppress(OSError):
                    os.write(
                        2,
                        f"tokenmill's local Prefect server stopped (pid {self.pid}); run the command again to "
                        "restart it\n".encode(),
                    )
                warm.exit_now(1)


HEARTBEAT_S = 30  # seconds between tokenmill's flow-run heartbeats (Prefect's minimum)


def _heartbeat_default() -> dict[Any, Any]:
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY

    return {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: HEARTBEAT_S}


def local_client_settings(
    local: LocalServer, api_url: str, settings: Any
) -> tuple[dict[str, str], dict[Any, Any], dict[Any, Any]]:
    """What the flows of a command (and the worker processes they start) use with the local
    server at `api_url`, given the current Prefect `settings`: (environment variables,
    settings updates, settings defaults, which yield to the user's own)."""
    from prefect.settings import (
        PREFECT_API_AUTH_STRING,
        PREFECT_API_URL,
        PREFECT_CLIENT_CSRF_SUPPORT_ENABLED,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        PREFECT_LOCAL_STORAGE_PATH,
        PREFECT_UI_URL,
    )

    # PREFECT_UI_URL "": the server has no UI, so no "View at <url>" lines pointing at one.
    auth = local.auth_string()
    env = {"PREFECT_API_URL": api_url, "PREFECT_UI_URL": "", "PREFECT_API_AUTH_STRING": auth}
    updates: dict[Any, Any] = {PREFECT_API_URL: api_url, PREFECT_UI_URL: "", PREFECT_API_AUTH_STRING: auth}
    default_storage = Path(settings.home).absolute() / "storage"  # Prefect's, shared with other flows
    if (
        not any(os.environ.get(v) for v in _STORAGE_VARS)
        and Path(settings.results.local_storage_path).absolute() == default_storage
    ):
        env["PREFECT_LOCAL_STORAGE_PATH"] = str(local.storage_dir)
        updates[PREFECT_LOCAL_STORAGE_PATH] = str(local.storage_dir)
    if not settings.server.api.csrf_protection_enabled:
        # The server started with these settings asks for no CSRF token; a client would fetch
        # one (and be told so) before its first write, once per client.
        env["PREFECT_CLIENT_CSRF_SUPPORT_ENABLED"] = "false"
        updates[PREFECT_CLIENT_CSRF_SUPPORT_ENABLED] = False
    # Heartbeats feed the zombie-run automation (docs/operations.md), which a local server has
    # only when its user installs it and sets PREFECT_FLOWS_HEARTBEAT_FREQUENCY (kept then).
    # Prefect's default (180 s) would make each flow run wait up to 1 s at its end for the
    # heartbeat thread to wake.
    defaults = {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
    return env, updates, defaults
