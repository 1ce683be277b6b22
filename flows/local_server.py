"""The process of tokenmill's local Prefect API server: ``python -m flows.local_server DIR``.

`flows.prefect_api` starts it, detached, when a command runs flows and no PREFECT_API_URL
is set; later commands reuse it. It serves Prefect's own API app as Prefect's temporary
server does (``create_app(ephemeral=True)``: the API and the services a temporary server
runs, no UI), on 127.0.0.1 and a port the system picks, with its SQLite database in DIR;
every request but /api/health needs the credential its starter put in its environment
(PREFECT_SERVER_API_AUTH_STRING, from DIR/api-auth).

It writes ``DIR/server.json`` (pid, port, URL) as soon as its socket is bound, then loads
the app; clients wait for ``/api/health``. It exits by itself after
TOKENMILL_SERVER_IDLE_TIMEOUT seconds (default 900; 0: never) without a request while no
tokenmill command is registered in ``DIR/clients/`` (a command registers its pid there for
its whole run, so a long task that sends nothing keeps the server up), and on SIGTERM or
SIGINT (`tokenmill server stop`). It removes ``server.json`` when it exits.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

from flows.prefect_api import DEFAULT_IDLE_TIMEOUT_S, ENV_IDLE_TIMEOUT, SERVER_MODULE, LocalServer, read_float_env


class _Activity:
    """ASGI middleware that records the time of the last request."""

    def __init__(self, app):
        self.app = app
        self.last = time.monotonic()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "lifespan":
            self.last = time.monotonic()
        await self.app(scope, receive, send)


def _watch_idle(server, activity: _Activity, local: LocalServer, idle_s: float) -> None:
    step = max(0.5, min(30.0, idle_s / 4))
    while not server.should_exit:
        time.sleep(step)
        if local.live_clients():  # a running command counts as activity, requests or not
            activity.last = time.monotonic()
        elif time.monotonic() - activity.last >= idle_s:
            print(f"tokenmill local server: idle for {idle_s:.0f} s, stopping", flush=True)
            server.should_exit = True


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(f"usage: python -m {SERVER_MODULE} DIR", file=sys.stderr)
        return 2
    local = LocalServer(Path(argv[0]))
    idle_s = read_float_env(ENV_IDLE_TIMEOUT, DEFAULT_IDLE_TIMEOUT_S)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    state = {
        "pid": os.getpid(),
        "port": port,
        "api_url": f"http://127.0.0.1:{port}/api",
        "started": time.time(),
        "idle_timeout_s": idle_s,
    }
    # every request needs the credential in AUTH_FILE
    state["auth"] = bool(os.environ.get("PREFECT_SERVER_API_AUTH_STRING"))
    local.write_state(state)
    try:
        import uvicorn
        from prefect.server.api.server import create_app

        activity = _Activity(create_app(ephemeral=True, final=True))
        server = uvicorn.Server(
            uvicorn.Config(activity, lifespan="on", log_level="warning", timeout_graceful_shutdown=10)
        )
        if idle_s > 0:
            threading.Thread(
                target=_watch_idle, args=(server, activity, local, idle_s), daemon=True, name="idle-watch"
            ).start()
        server.run(sockets=[sock])
        return 0 if server.started else 3
    finally:
        local.remove_state(os.getpid())


if __name__ == "__main__":
    print(f"tokenmill local server: pid {os.getpid()}, {json.dumps(sys.argv[1:])}", flush=True)
    sys.exit(main(sys.argv[1:]))
