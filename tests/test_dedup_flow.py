"""The dedup stage in a real flow run (a temporary Prefect API): `documents` turns it on,
counting and encoding read its output, and its counts show in the run's artifacts."""

from __future__ import annotations

import json

import pytest

from pipeline_lib import ArtifactStore

pytestmark = [pytest.mark.usefixtures("prefect_harness"), pytest.mark.filterwarnings("ignore:the corpus gave only")]

LINES = [
    "to be or not to be",
    "that is the question",
    "to be or not to be",
    "whether tis nobler",
    "that is the question",
    "in the mind",
]


def test_the_pipeline_with_dedup_on_shows_its_counts(tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    from flows.pipeline import tokenmill_pipeline

    source = tmp_path / "dups.txt"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    store_url = str(tmp_path / "store")
    params = {
        "corpus": {"sources": [str(source)], "n_shards": 2},
        "store": store_url,
        "tokenizer": {"vocab_size": 300},
        "train_model": False,
    }
    state = tokenmill_pipeline(return_state=True, documents={"dedup": {"mode": "exact"}}, **params)
    assert state.is_completed(), state
    summary = state.result()
    assert summary["refs"]["corpus"]["kind"] == "dedup"
    assert summary["figures"]["documents"] == 4
    assert summary["figures"]["dedup_documents_removed"] == 2
    assert summary["figures"]["dedup_bytes_removed"] == len(LINES[0]) + len(LINES[1])
    store = ArtifactStore(store_url)
    tokens = summary["refs"]["tokens"]
    assert store.manifest(tokens["kind"], tokens["version"])["meta"]["totals"]["n_docs"] == 4
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id]))
        )
    tables = {a.key.rsplit("-", 1)[0]: a for a in artifacts if a.key}
    rows = {row["figure"]: row["value"] for row in json.loads(tables["dedup-summary"].data)}
    assert rows["documents_in"] == 6 and rows["documents_out"] == 4 and rows["documents_removed"] == 2

    # Off (the default): the corpus itself is counted and encoded, as before dedup existed.
    off = tokenmill_pipeline(return_state=True, **params)
    assert off.is_completed(), off
    assert off.result()["refs"]["corpus"]["kind"] == "corpus"
    assert off.result()["figures"]["documents"] == 6
