"""The lab page (`tokenmill lab page`): its data, its self-containedness and, in headless
Chromium (slow marker), that it loads without a console error, that the merge slider
changes the tokens, and a screenshot for docs/ (docs/lab-page.png)."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

from flows.cli import main
from pipeline_lib import lab, lab_page
from pipeline_lib.tokenizer import Tokenizer, get_encoding

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
TEXT = "The cat sat on the mat. Byte pair encoding merges the most frequent pair, again and again."


@pytest.fixture(scope="module")
def tok(shakespeare_text) -> Tokenizer:
    return Tokenizer.train([shakespeare_text[:100_000]], 0, special_tokens=(), n_merges=300)


def page_data(page: str) -> dict:
    found = re.search(r'<script type="application/json" id="lab-data">(.*?)</script>', page, re.S)
    assert found
    return json.loads(found.group(1).replace("<\\/", "</"))


def test_slider_states_end_in_the_encoding_and_start_in_bytes(tok):
    data = lab_page.slider_data(tok, TEXT)
    starts = [p for piece in data["pieces"] for p in piece["states"][0]["parts"]]
    assert len(starts) == len(TEXT.encode())
    ends = [data["ids"][p] for piece in data["pieces"] for p in piece["states"][-1]["parts"]]
    assert ends == tok.encode_ordinary(TEXT)
    assert data["steps"] == [m[2] for m in tok.merges or []]


def test_page_is_self_contained(tok):
    production = {"gpt2": get_encoding("gpt2")}
    page = lab_page.build_page(TEXT + " </script>", tok, "mine", production)
    data = page_data(page)
    assert [i for i, _ in data["tokens"]] == tok.encode_ordinary(TEXT + " </script>")
    # nothing fetched
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|\bhref=|https?://(?!www\.w3\.org/2000/svg)", page)
    assert page.count("</script>") == 2  # the text's own "</script>" is escaped in the JSON
    assert ">gpt2</text>" in page  # the production encoding labelled on the curve
    assert [r["index"] for r in data["compare"]] == [0, 1, 2, 3]  # characters, words, mine, gpt2


def test_lab_page_cli(tmp_path, capsys):
    out = tmp_path / "lab.html"
    assert main(["lab", "page", "--text", TEXT, "--merges", "50", "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"lab page -> {out}")
    data = page_data(out.read_text(encoding="utf-8"))
    assert len(data["slider"]["steps"]) == 50
    assert main(["lab", "page", "--text", TEXT, "--tokenizer", "gpt2", "--out", str(out)]) == 0
    assert [i for i, _ in page_data(out.read_text(encoding="utf-8"))["tokens"]] == get_encoding("gpt2").encode(TEXT)
    assert main(["lab", "page", "--text", TEXT, "--merges", "0", "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith("tokenmill: error: --merges 0")


@pytest.mark.slow
@pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} not installed (apt-get install -y chromium chromium-driver)"
)
def test_lab_page_in_chromium(tok, tmp_path):
    sys.path.insert(0, os.path.dirname(__file__))
    from test_browser import browser

    page_file = tmp_path / "lab.html"
    production = {n: get_encoding(n) for n in ("gpt2", "cl100k_base", "o200k_base")}
    page_file.write_text(
        lab_page.build_page(TEXT, tok, "byte-level BPE, 300 merges on tiny Shakespeare", production), encoding="utf-8"
    )
    events: list[dict] = []
    with browser(tmp_path / "profile") as devtools:
        page = devtools.open("about:blank", width=1200, height=1100)
        try:

            def call(method: str, **params):
                page.next_id += 1
                page.ws.send(json.dumps({"id": page.next_id, "method": method, "params": params}))
                while True:
                    msg = json.loads(page.ws.recv(timeout=60))
                    if msg.get("id") == page.next_id:
                        assert "error" not in msg, msg
                        return msg["result"]
                    events.append(msg)

            def evaluate(expression: str):
                return call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

            call("Runtime.enable")
            call("Log.enable")
            call("Page.enable")
            call("Page.navigate", url=page_file.as_uri())
            deadline = time.monotonic() + 60
            while evaluate("document.readyState") != "complete" or not evaluate(
                "document.querySelectorAll('#replay .tok').length"
            ):
                assert time.monotonic() < deadline, "the page did not render its tokens"
                time.sleep(0.2)
            full = evaluate("Array.from(document.querySelectorAll('#replay .tok')).map(e => e.textContent)")
            assert "".join(full).replace("␣", " ") == TEXT
            assert full == lab.token_texts(tok, tok.encode_ordinary(TEXT))
            hover = evaluate("document.querySelector('#tokens .tok').title")
            assert hover == f"id {tok.encode_ordinary(TEXT)[0]}: {full[0]}"
            # The slider back to 0 merges: the bytes; half-way: between the two.
            slide = (
                "(k => { const s = document.getElementById('slider'); s.value = k; s.dispatchEvent(new "
                "Event('input')); return Array.from(document.querySelectorAll('#replay .tok')).map(e => "
                "e.textContent) })"
            )
            none = evaluate(f"{slide}(0)")
            half = evaluate(f"{slide}(150)")
            assert len(none) == len(TEXT.encode()) > len(half) > len(full)
            assert evaluate("document.getElementById('slider-label').textContent").startswith("150 of 300 merges")
            assert evaluate("document.querySelectorAll('#curve circle.production').length") == 3
            evaluate(f"{slide}(40)")
            shot = call("Page.captureScreenshot", format="png")
        finally:
            page.close()
    import base64

    (ROOT / "docs" / "lab-page.png").write_bytes(base64.b64decode(shot["data"]))
    errors = [
        e
        for e in events
        if e.get("method") == "Runtime.exceptionThrown"
        or (e.get("method") == "Runtime.consoleAPICalled" and e["params"].get("type") in ("error", "assert"))
        or (e.get("method") == "Log.entryAdded" and e["params"]["entry"].get("level") == "error")
    ]
    assert not errors, errors


def test_lab_page_flow_links_the_page(prefect_harness, tmp_path, tok):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    from flows.lab import lab_page_flow

    page = tmp_path / "lab.html"
    rows = lab_page.compare_rows(TEXT, [("mine", tok)])
    page.write_text(lab_page.build_page(TEXT, tok, "mine", {}, rows), encoding="utf-8")
    state = lab_page_flow(
        str(page),
        "tokenmill lab: mine",
        [{k: r[k] for k in ("name", "tokens", "chars_per_token")} for r in rows],
        return_state=True,
    )
    assert state.result() == page.resolve().as_uri()
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id]))
        )
    by_key = {a.key: a for a in found}
    assert page.resolve().as_uri() in by_key["lab-page"].data
    assert f"| mine | {len(tok.encode_ordinary(TEXT))} | " in by_key["lab-page-compare"].data
