"""Start and stop a real local Prefect server (and other supervised processes) for tests.

`prefect server start` with its own PREFECT_HOME (SQLite database inside it) on a free
port of 127.0.0.1: nothing touches ~/.prefect or another test's server. Every process is
started in a new session (its own process group) so that stopping it also stops what it
spawned (uvicorn, flow-run subprocesses, Dask workers), and stopping escalates
SIGINT -> SIGTERM -> SIGKILL with a timeout at each step, because Prefect workers and
runners need a second signal to exit.

    with PrefectServer(tmp_path / "prefect") as server:
        env = server.client_env()            # PREFECT_API_URL etc. for subprocesses
        with server.settings():              # the same, for this process
            run_deployment(...)
        proc = server.spawn(["prefect", "worker", "start", ...], "worker")

Startup is ~9 s on an idle machine (~20-30 s on a loaded 2-core one), so share one server
per test module.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen, timeouts: Sequence[float] = (8.0, 5.0, 5.0)) -> int | None:
    """Stop `proc` and its process group: SIGINT, then SIGTERM, then SIGKILL.

    Each signal goes to the whole group (the process was started with
    ``start_new_session=True``); each step waits up to its timeout for the leader to exit.
    Whatever is left of the group afterwards gets SIGKILL, so no orphan survives a test.
    """
    for sig, timeout in zip((signal.SIGINT, signal.SIGTERM, signal.SIGKILL), timeouts):
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the group (grandchildren)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    return proc.poll()


class PrefectServer:
    """A `prefect server start` subprocess with a private home directory.

    Args:
        home: directory for PREFECT_HOME (database, logs); created if missing.
        ui: serve the UI too (the browser test needs it; ~5 s more to start).
        startup_timeout: seconds to wait for ``/api/health``.
        server_env: more environment for the server process (its database URL ...).
    """

    def __init__(
        self,
        home: str | os.PathLike,
        ui: bool = False,
        startup_timeout: float = 150.0,
        server_env: dict[str, str] | None = None,
    ):
        self.home = Path(home)
        self.server_env = dict(server_env or {})  # e.g. PREFECT_API_DATABASE_CONNECTION_URL
        self.ui = ui
        self.startup_timeout = startup_timeout
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_url = f"{self.url}/api"
        self.proc: subprocess.Popen | None = None
        self.children: list[subprocess.Popen] = []
        self.log_path = self.home / "server.log"

    # ------------------------------------------------------------------ environment
    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(
            {
                "PREFECT_HOME": str(self.home),
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PREFECT_LOGGING_LEVEL": "INFO",
                "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            }
        )
        return env

    def client_env(self, **extra: str) -> dict[str, str]:
        """Environment for a process that talks to this server (flows, workers, CLI)."""
        env = self.base_env()
        env.update(
            {
                "PREFECT_API_URL": self.api_url,
                "PREFECT_LOCAL_STORAGE_PATH": str(self.home / "storage"),
                "PREFECT_SERVER_EPHEMERAL_ENABLED": "false",
            }
        )
        env.update(extra)
        return env

    @contextlib.contextmanager
    def settings(self) -> Iterator[None]:
        """Point this process's Prefect client at the server for the duration."""
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: self.api_url}):
            yield

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> PrefectServer:
        self.home.mkdir(parents=True, exist_ok=True)
        env = self.base_env()
        env["PREFECT_UI_ENABLED"] = "true" if self.ui else "false"
        # `--port` alone leaves the UI calling the API on the default port 4200: the UI's
        # API URL comes from these settings (or PREFECT_UI_API_URL), not from the flags.
        env["PREFECT_SERVER_API_HOST"] = "127.0.0.1"
        env["PREFECT_SERVER_API_PORT"] = str(self.port)
        env.update(self.server_env)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prefect server exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.healthy():
                return self
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(
            f"prefect server on {self.url} not healthy after {self.startup_timeout:.0f} s:\n{self.log_tail()}"
        )

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def spawn(
        self, argv: Sequence[str], name: str, env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None
    ) -> subprocess.Popen:
        """Start a supervised process against this server; stopped with the server.

        Output goes to ``HOME/<name>.log`` (`log_tail(name)` reads it back).
        """
        log = open(self.home / f"{name}.log", "ab")
        proc = subprocess.Popen(
            list(argv),
            env=env or self.client_env(),
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self.children.append(proc)
        return proc

    def log_tail(self, name: str = "server", n: int = 6000) -> str:
        path = self.home / f"{name}.log"
        try:
            return path.read_bytes()[-n:].decode("utf-8", "replace")
        except FileNotFoundError:
            return f"(no {path})"

    def stop(self) -> None:
        for proc in reversed(self.children):
            stop_process(proc)
        self.children.clear()
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None

    def __enter__(self) -> PrefectServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ---------------------------------------------------------------------- API helpers
def task_runs(flow_run_id, settle: float = 15.0) -> list:
    """The task runs of a flow run (any order), via the current Prefect API settings.

    Task-run states reach the server as events and are written asynchronously, so right
    after a flow run ends some task runs may have no state yet, or a non-final one: wait
    up to `settle` seconds for every one of them to reach a final state.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + settle
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            if all(r.state is not None and r.state.is_final() for r in runs) or time.monotonic() > deadline:
                return runs
            time.sleep(0.5)


def task_states(flow_run_id) -> dict[str, list[str]]:
    """``{task name: [state names in start order]}`` for a flow run.

    Mapped task runs carry no shard index in the API (their names end in a random
    suffix), so compare these lists as multisets where order is not the point.
    """
    out: dict[str, list[tuple[str, str]]] = {}
    for run in task_runs(flow_run_id):
        out.setdefault(run.name.split("[")[0].rsplit("-", 1)[0], []).append(
            (str(run.start_time or run.expected_start_time), run.state.name if run.state else "?")
        )
    return {k: [s for _, s in sorted(v)] for k, v in out.items()}


def flow_runs(flow_name: str | None = None) -> list:
    """Flow runs that have started (not the Scheduled ones), newest first, optionally of one flow."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterStartTime
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        flow_filter = FlowFilter(name=FlowFilterName(any_=[flow_name])) if flow_name else None
        started = FlowRunFilter(start_time=FlowRunFilterStartTime(is_null_=False))
        return client.read_flow_runs(flow_filter=flow_filter, flow_run_filter=started, sort=FlowRunSort.START_TIME_DESC)


def wait_for_deployment(
    name: str, timeout: float = 90.0, proc: subprocess.Popen | None = None, log: Callable[[], str] = str
) -> object:
    """Poll until deployment `flow/deployment` exists (a serve process registers it)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            try:
                return client.read_deployment_by_name(name)
            except ObjectNotFound:
                pass
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"the process that should register {name} exited with {proc.returncode}:\n{log()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"deployment {name} not registered after {timeout:.0f} s")
            time.sleep(0.5)
