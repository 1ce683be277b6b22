"""What a Prefect user sees of tokenmill in the UI: checked in headless Chromium.

A real `prefect server start` with the UI (tests/prefect_server.py); against it, in
subprocesses as a user runs them: `tokenmill run` (the whole chain, a tiny LM), the same
command again (nothing to do: every task Cached), and `tokenmill deploy` (the deployments
on a process work pool; no worker needed to look at them). Then Debian's chromium,
headless, fresh profile, driven through the DevTools protocol (a page target,
Runtime.evaluate, Page.captureScreenshot). Each test asserts what the page shows (its
text, its form controls, its decoded images) and saves a screenshot for a human to look
at; their directory is printed (under pytest's basetemp: keep them with --basetemp DIR):

* task-runs.png: a flow run's Task Runs tab, the mapped tasks named by shard
  (`count_words[shard=0/2]`, `encode_shard[shard=1/2]`);
* deployment-form.png, deployment-form-lm.png: the custom-run form of
  `tokenmill-pipeline/nightly-tokenize`, with the configs' field descriptions, the
  deployment's parameters filled in and a `Literal` field (`documents`, the LM `preset`)
  as a dropdown of its choices;
* cached-run-artifacts.png, cached-run-task-runs.png: the second run, whose every task is
  Cached, still lists the artifacts of the versions it reused;
* lm-report.png, token-shards.png (and v2-*): artifact pages, the loss plot a decoded
  image, in the default UI and in the V2 UI (/v2).

Skips when /usr/bin/chromium is absent (`apt-get install -y chromium chromium-driver`).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from prefect_server import PrefectServer, flow_runs, stop_process, task_states  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent
SHAKESPEARE = ROOT / "pipeline_lib" / "data" / "tinyshakespeare.txt"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} not installed (apt-get install -y chromium chromium-driver)"
    ),
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


class DevTools:
    """Just enough of the Chrome DevTools protocol: open pages, evaluate JavaScript, take screenshots."""

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

    def open(self, url: str, width: int = 1400, height: int = 1200) -> _Page:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/json/new?{url}", method="PUT")
        with urllib.request.urlopen(req, timeout=30) as r:
            target = json.load(r)
        from websockets.sync.client import connect

        page = _Page(connect(target["webSocketDebuggerUrl"], max_size=64 << 20, open_timeout=30))
        page.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        return page

    def close(self) -> None:
        stop_process(self.proc, timeouts=(3, 3, 3))


class _Page:
    def __init__(self, ws):
        self.ws, self.next_id = ws, 0

    def call(self, method: str, **params) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(result["exceptionDetails"])
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60) -> Any:
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
                text = self.text()
                raise TimeoutError(
                    f"{expression!r} still falsy after {timeout:.0f} s; the page "
                    f"shows:\n{text[:2000]}\n...\n{text[-1000:]}"
                )
            time.sleep(0.5)

    def text(self) -> str:
        with contextlib.suppress(RuntimeError):
            return self.evaluate("document.body ? document.body.innerText : ''") or ""
        return ""

    def wait_for_text(self, *expected: str, timeout: float = 60) -> str:
        """Wait until the page's visible text contains every one of `expected`; return the text."""
        self.wait_for(
            f"document.body && {json.dumps(list(expected))}.every(s => document.body.innerText.includes(s))", timeout
        )
        return self.text()

    def click_tab(self, tab_id: str) -> None:
        """Click one of the flow-run page's tabs (`task-runs`, `artifacts` ...)."""
        self.wait_for(f"!!document.querySelector('li.p-tab#{tab_id}')")
        self.evaluate(f"document.querySelector('li.p-tab#{tab_id}').click()")

    def scroll_to_text(self, text: str) -> None:
        """Scroll the element whose own text is `text` to the top of the viewport."""
        found = self.evaluate(
            f"""(() => {{ const e = Array.from(document.querySelectorAll('body *'))
                .find(e => e.children.length === 0 && e.textContent.trim() === {json.dumps(text)});
                if (e) e.scrollIntoView({{block: 'start'}}); return !!e }})()"""
        )
        assert found, f"no element reads {text!r}"

    def screenshot(self, path: Path) -> Path:
        time.sleep(1.0)  # let transitions and lazy renders settle
        shot = self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))
        assert path.stat().st_size > 10_000, f"empty screenshot {path}"
        return path

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.close()


@contextlib.contextmanager
def browser(profile: Path):
    devtools = DevTools(str(profile))
    try:
        yield devtools
    finally:
        devtools.close()


@contextlib.contextmanager
def page_at(devtools: DevTools, url: str, **size: int):
    page = devtools.open(url, **size)
    try:
        yield page
    finally:
        page.close()


# A data:image/png <img> that the browser has decoded: [complete, naturalWidth, naturalHeight].
LOSS_IMAGES = """Array.from(document.images).filter(i => i.src.startsWith('data:image/png'))
    .map(i => [i.complete, i.naturalWidth, i.naturalHeight, i.alt])"""
# Every <select> of the page: [its value, [its options' values]].
SELECTS = "Array.from(document.querySelectorAll('select')).map(s => [s.value, Array.from(s.options).map(o => o.value)])"
SHARD_TASKS = ["count_words[shard=0/2]", "count_words[shard=1/2]", "encode_shard[shard=0/2]", "encode_shard[shard=1/2]"]


@dataclass
class UIRuns:
    server: PrefectServer
    first: Any  # flow run of the first `tokenmill run`
    cached: Any  # flow run of the same command again
    artifacts: dict[str, Any]  # the first run's, by key without its "-<8 hex>" suffix
    cached_artifacts: dict[str, Any]
    deployment_id: str  # tokenmill-pipeline/nightly-tokenize


def _artifacts_by_name(flow_run_id) -> dict[str, Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    # keys are per store and corpus: "<name>-<8 hex>"
    return {a.key.rsplit("-", 1)[0]: a for a in artifacts if a.key}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Server with UI; `tokenmill run` twice (the second all Cached) and `tokenmill deploy` against it."""
    home = tmp_path_factory.mktemp("prefect-ui")
    corpus = home / "corpus.txt"
    corpus.write_text(SHAKESPEARE.read_text(encoding="utf-8")[:120_000], encoding="utf-8")
    store = home / "store"
    tiny_lm = [
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
    ]
    run = [
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
        *tiny_lm,
        "--device",
        "cpu",
    ]
    deploy = [
        sys.executable,
        "-m",
        "flows.cli",
        "deploy",
        "--store",
        str(store),
        "--corpus",
        str(corpus),
        "--create-pool",
        "--paused",
    ]
    with PrefectServer(home / "server", ui=True) as server:
        for cmd in (run, run, deploy):
            done = subprocess.run(
                cmd, env=server.client_env(), cwd=str(ROOT), capture_output=True, text=True, timeout=600
            )
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        with server.settings():
            from prefect.client.orchestration import get_client

            cached, first = flow_runs("tokenmill-pipeline")  # newest first
            with get_client(sync_client=True) as client:
                deployment = client.read_deployment_by_name("tokenmill-pipeline/nightly-tokenize")
            yield UIRuns(
                server, first, cached, _artifacts_by_name(first.id), _artifacts_by_name(cached.id), str(deployment.id)
            )


@pytest.fixture(scope="module")
def shots(tmp_path_factory, request) -> Path:
    path = tmp_path_factory.mktemp("ui-screenshots")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"\nscreenshots: {path}")
    return path


def test_run_and_artifacts_in_api(runs):
    assert runs.first.state.name == "Completed" and runs.cached.state.name == "Completed"
    arts = runs.artifacts
    assert {"token-shards", "lm-metrics", "lm-report", "tokenizer-merges", "tokenmill-summary"} <= set(arts), sorted(
        arts
    )
    assert arts["token-shards"].type == "table" and arts["lm-metrics"].type == "table"
    shards = (
        json.loads(arts["token-shards"].data)
        if isinstance(arts["token-shards"].data, str)
        else arts["token-shards"].data
    )
    assert [row["shard"] for row in shards] == ["shard_000000", "shard_000001"]
    assert arts["lm-report"].type == "markdown" and "](data:image/png;base64,iVBORw0KGgo" in arts["lm-report"].data


def test_task_list_names_the_shards(runs, shots, tmp_path):
    url = f"{runs.server.url}/runs/flow-run/{runs.first.id}"
    with browser(tmp_path / "profile") as devtools, page_at(devtools, url, height=2000) as page:
        page.wait_for_text(runs.first.name, "Completed", "tokenmill-pipeline")
        assert "Can't connect to Server API" not in page.text()  # the UI found the API on our port, not :4200
        page.click_tab("task-runs")
        text = page.wait_for_text(*SHARD_TASKS, "learn_merges", "train_lm")
        assert "stage:encode_shard" in text and "tokenmill" in text  # the tags the run list filters by
        page.screenshot(shots / "task-runs.png")


def _pipeline_field(parameter: str, name: str):
    """Field `name` of the config the pipeline flow takes as `parameter` (what the UI's form is built from)."""
    import typing

    from flows.pipeline import tokenmill_pipeline
    from pipeline_lib.config import fields_of

    config = typing.get_type_hints(tokenmill_pipeline.fn)[parameter]
    return next(f for f in fields_of(config) if f.name == name)


def test_deployment_form_has_descriptions_and_choices(runs, shots, tmp_path):
    from deployments.serve import TOKENIZE_PARAMETERS

    documents, vocab_size, preset = (
        _pipeline_field("corpus", "documents"),
        _pipeline_field("tokenizer", "vocab_size"),
        _pipeline_field("lm", "preset"),
    )
    url = f"{runs.server.url}/deployments/deployment/{runs.deployment_id}/run"
    with browser(tmp_path / "profile") as devtools, page_at(devtools, url) as page:
        # each field with the description of its config annotation (doc("..."))
        page.wait_for_text("nightly-tokenize", documents.description, vocab_size.description, preset.description)
        selects = page.wait_for(
            f"(() => {{ const s = {SELECTS}; return s.some(x => "
            f"x[1].includes({json.dumps(preset.choices[-1])})) ? s : null }})()"
        )
        choices = {tuple(options): value for value, options in selects if options and any(options)}
        # Literal fields are dropdowns of their choices; the deployment's own parameters are filled in
        assert choices[tuple(documents.choices)] == TOKENIZE_PARAMETERS["corpus"]["documents"], choices
        assert choices[tuple(preset.choices)] == preset.default, choices
        values = page.evaluate("Array.from(document.querySelectorAll('input')).map(i => i.value)")
        assert (
            str(TOKENIZE_PARAMETERS["corpus"]["n_shards"]) in values
            and str(TOKENIZE_PARAMETERS["tokenizer"]["vocab_size"]) in values
        ), values
        page.screenshot(shots / "deployment-form.png")
        page.scroll_to_text("lm (Optional)")
        page.screenshot(shots / "deployment-form-lm.png")


def test_cached_run_shows_the_artifacts_it_reused(runs, shots, tmp_path):
    with runs.server.settings():
        states = task_states(runs.cached.id)
    assert {state for names in states.values() for state in names} == {"Cached"}, states
    # the same artifact keys (store and corpus unchanged), made again by the Cached run; progress
    # artifacts only while a stage works
    made = {name for name, artifact in runs.artifacts.items() if artifact.type != "progress"}
    assert set(runs.cached_artifacts) == made, (sorted(runs.cached_artifacts), sorted(runs.artifacts))
    for name, artifact in runs.cached_artifacts.items():
        assert artifact.key == runs.artifacts[name].key and artifact.flow_run_id == runs.cached.id
    keys = [a.key for a in runs.cached_artifacts.values()]
    url = f"{runs.server.url}/runs/flow-run/{runs.cached.id}"
    with browser(tmp_path / "profile") as devtools, page_at(devtools, url, height=1600) as page:
        page.click_tab("artifacts")
        page.wait_for_text(*keys)
        page.screenshot(shots / "cached-run-artifacts.png")
        page.click_tab("task-runs")
        page.wait_for_text(*SHARD_TASKS, "Cached")
        page.screenshot(shots / "cached-run-task-runs.png")


@pytest.mark.parametrize("ui", ["", "/v2"], ids=["default-ui", "v2-ui"])
def test_artifact_pages_render_tables_and_loss_plot(runs, shots, tmp_path, ui):
    arts, prefix = runs.artifacts, "v2-" if ui else ""
    with browser(tmp_path / "profile") as devtools:
        with page_at(devtools, f"{runs.server.url}{ui}/artifacts/artifact/{arts['lm-report'].id}") as page:
            images = page.wait_for(
                f"(() => {{ const a = {LOSS_IMAGES}; return a.length && a.every(x => x[0] && x[1] > 0) ? a : null }})()"
            )
            # the matplotlib figure, decoded
            assert len(images) == 1 and images[0][1] >= 400 and images[0][2] >= 200, images
            page.screenshot(shots / f"{prefix}lm-report.png")
        for key, expected in (("token-shards", "shard_000001"), ("lm-metrics", "final_val_loss")):
            with page_at(devtools, f"{runs.server.url}{ui}/artifacts/artifact/{arts[key].id}", height=900) as page:
                page.wait_for_text(expected)
                page.screenshot(shots / f"{prefix}{key}.png")
