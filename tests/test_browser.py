"""The Prefect UI shows a pipeline run and our artifacts: checked in headless Chromium.

A real `prefect server start` with the UI (tests/prefect_server.py), the whole chain with a
tiny LM run against it in a subprocess (PREFECT_API_URL set), then:

* the API: the flow run Completed; the table artifacts 'token-shards' and 'lm-metrics' and
  the markdown 'lm-report' (loss plot inlined as a data:image/png) belong to it;
* the UI: Debian's chromium, headless, fresh profile. `--dump-dom` of the flow run page
  (name, state, flow); the artifact pages through the DevTools protocol (a page target,
  Runtime.evaluate), where the loss plot must be a decoded image (complete, naturalWidth
  > 0), in the default UI and in the V2 UI (/v2); screenshots saved for a human to look at
  (their directory is printed; keep it with --basetemp).

Skips when /usr/bin/chromium is absent (`apt-get install -y chromium chromium-driver`).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from prefect_server import PrefectServer, flow_runs, stop_process  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent
SHAKESPEARE = ROOT / "pipeline_lib" / "data" / "tinyshakespeare.txt"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} not installed (apt-get install -y chromium chromium-driver)"),
]

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--hide-scrollbars",
]


def chromium(args: list[str], profile: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, timeout=timeout, start_new_session=True)


def dump_dom(url: str, profile: str, budget_ms: int = 20000) -> str:
    """The DOM after the page's scripts ran for `budget_ms` of virtual time."""
    done = chromium([f"--virtual-time-budget={budget_ms}", "--dump-dom", url], profile)
    return done.stdout.decode("utf-8", "replace")


def screenshot(url: str, path: str, profile: str, size: str = "1400,1400", budget_ms: int = 20000) -> str:
    chromium([f"--virtual-time-budget={budget_ms}", f"--window-size={size}", f"--screenshot={path}", url], profile)
    assert os.path.getsize(path) > 10_000, f"empty screenshot of {url}"
    return path


class DevTools:
    """Just enough of the Chrome DevTools protocol: open a page, evaluate JavaScript."""

    def __init__(self, profile: str):
        self.proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        port_file = Path(profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.2)
        self.port = int(port_file.read_text().split()[0])

    def open(self, url: str):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/json/new?{url}", method="PUT")
        with urllib.request.urlopen(req, timeout=30) as r:
            target = json.load(r)
        from websockets.sync.client import connect

        return _Page(connect(target["webSocketDebuggerUrl"], max_size=64 << 20, open_timeout=30))

    def close(self) -> None:
        stop_process(self.proc, timeouts=(3, 3, 3))


class _Page:
    def __init__(self, ws):
        self.ws, self.next_id = ws, 0

    def call(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"])
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60):
        """Poll a JavaScript expression until it is truthy; return its value."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(expression)
            except RuntimeError:  # the page is still loading (no body yet, navigation)
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression!r} still falsy after {timeout:.0f} s")
            time.sleep(0.5)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.close()


# A data:image/png <img> that the browser has decoded: [complete, naturalWidth, naturalHeight].
LOSS_IMAGES = """Array.from(document.images).filter(i => i.src.startsWith('data:image/png'))
    .map(i => [i.complete, i.naturalWidth, i.naturalHeight, i.alt])"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Server with UI + one pipeline run with a tiny LM; yields (server, flow run, artifacts by key)."""
    home = tmp_path_factory.mktemp("prefect-ui")
    corpus = home / "corpus.txt"
    corpus.write_text(SHAKESPEARE.read_text(encoding="utf-8")[:120_000], encoding="utf-8")
    store = home / "store"
    with PrefectServer(home / "server", ui=True) as server:
        cmd = [
            sys.executable,
            "-m",
            "flows.cli",
            "run",
            "--store",
            str(store),
            "--corpus",
            str(corpus),
            "--vocab-size",
            "300",
            "--lm-preset",
            "tiny",
            "--lm-steps",
            "6",
            "--n-layer",
            "1",
            "--n-head",
            "2",
            "--n-embd",
            "32",
            "--block-size",
            "32",
            "--batch-size",
            "4",
            "--device",
            "cpu",
        ]
        done = subprocess.run(cmd, env=server.client_env(), cwd=str(ROOT), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        with server.settings():
            from prefect.client.orchestration import get_client
            from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

            (flow_run,) = flow_runs("tokenmill-pipeline")
            with get_client(sync_client=True) as client:
                artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run.id])))
            # keys are per store and corpus: "<name>-<8 hex>"
            yield server, flow_run, {a.key.rsplit("-", 1)[0]: a for a in artifacts if a.key}


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    path = Path(tempfile.mkdtemp(prefix="tokenmill-ui-shots-"))
    print(f"\nscreenshots: {path}")
    return path


def test_run_and_artifacts_in_api(run):
    _, flow_run, arts = run
    assert flow_run.state.name == "Completed"
    assert {"token-shards", "lm-metrics", "lm-report", "tokenizer-merges", "tokenmill-summary"} <= set(arts), sorted(arts)
    assert arts["token-shards"].type == "table" and arts["lm-metrics"].type == "table"
    shards = json.loads(arts["token-shards"].data) if isinstance(arts["token-shards"].data, str) else arts["token-shards"].data
    assert [row["shard"] for row in shards] == ["shard_000000", "shard_000001"]
    assert arts["lm-report"].type == "markdown" and "](data:image/png;base64,iVBORw0KGgo" in arts["lm-report"].data


def test_flow_run_page_shows_completed_run(run, shots, tmp_path):
    server, flow_run, _ = run
    url = f"{server.url}/runs/flow-run/{flow_run.id}"
    dom = dump_dom(url, str(tmp_path / "profile"))
    assert flow_run.name in dom and "Completed" in dom and "tokenmill-pipeline" in dom, dom[-2000:]
    assert "Can't connect to Server API" not in dom  # the UI found the API on our port, not :4200
    screenshot(url, str(shots / "flow-run.png"), str(tmp_path / "profile"), size="1400,1800")


@pytest.mark.parametrize("ui", ["", "/v2"], ids=["default-ui", "v2-ui"])
def test_artifact_pages_render_tables_and_loss_plot(run, shots, tmp_path, ui):
    server, flow_run, arts = run
    devtools = DevTools(str(tmp_path / "profile"))
    try:
        page = devtools.open(f"{server.url}{ui}/artifacts/artifact/{arts['lm-report'].id}")
        try:
            images = page.wait_for(f"(() => {{ const a = {LOSS_IMAGES}; return a.length && a.every(x => x[0] && x[1] > 0) ? a : null }})()")
        finally:
            page.close()
        assert len(images) == 1 and images[0][1] >= 400 and images[0][2] >= 200, images  # the matplotlib figure, decoded
        for key, expected in (("token-shards", "shard_000001"), ("lm-metrics", "final_val_loss")):
            page = devtools.open(f"{server.url}{ui}/artifacts/artifact/{arts[key].id}")
            try:
                page.wait_for(f"document.body && document.body.innerText.includes({json.dumps(expected)})")
            finally:
                page.close()
    finally:
        devtools.close()
    name = "v2-" if ui else ""
    screenshot(f"{server.url}{ui}/artifacts/artifact/{arts['lm-report'].id}", str(shots / f"{name}lm-report.png"), str(tmp_path / "shot-profile"))
    screenshot(
        f"{server.url}{ui}/artifacts/artifact/{arts['token-shards'].id}",
        str(shots / f"{name}token-shards.png"),
        str(tmp_path / "shot-profile"),
        size="1400,900",
    )
