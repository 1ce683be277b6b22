"""Real flow runs under a temporary Prefect API: the whole chain, caching, partial recompute."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from pipeline_lib import ArtifactStore, Tokenizer
from pipeline_lib.token_shards import check_shards

sys.path.insert(0, os.path.dirname(__file__))
from prefect_server import task_runs, task_states  # noqa: E402

pytestmark = pytest.mark.usefixtures("prefect_harness")

LM = {"lm": {"preset": "tiny", "steps": 6, "n_layer": 1, "n_embd": 32, "n_head": 2, "block_size": 32, "batch_size": 4}}


def _params(corpus: str, store: str, vocab_size: int, shards: int = 2, **kwargs) -> dict:
    """The pipeline's parameters as a deployment gives them: config dicts."""
    return {
        "corpus": {"sources": [corpus], "n_shards": shards, "documents": "paragraph"},
        "store": store,
        "tokenizer": {"vocab_size": vocab_size},
        **kwargs,
    }


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory, shakespeare_text) -> str:
    path = tmp_path_factory.mktemp("corpus") / "shakespeare_head.txt"
    path.write_text(shakespeare_text[:120_000], encoding="utf-8")
    return str(path)


def _task_states(flow_state) -> dict[str, list[str]]:
    return task_states(flow_state.state_details.flow_run_id)  # waits for the states to settle


def _run(**kwargs):
    from flows.pipeline import tokenmill_pipeline

    state = tokenmill_pipeline(return_state=True, **kwargs)
    assert state.is_completed(), state
    return state.result(), _task_states(state)


@pytest.fixture(scope="module")
def first_run(small_corpus, tmp_path_factory):
    store = str(tmp_path_factory.mktemp("store"))
    summary, states = _run(**_params(small_corpus, store, 400, **LM))
    return store, summary, states


def test_full_chain_publishes_every_artifact(first_run, small_corpus):
    store_url, summary, states = first_run
    assert set(states) >= {
        "download_corpus",
        "shard_corpus",
        "count_words",
        "reduce_counts",
        "learn_merges",
        "encode_shard",
        "write_token_manifest",
        "train_lm",
    }
    assert all(s == "Completed" for names in states.values() for s in names), states
    assert len(states["count_words"]) == 2 and len(states["encode_shard"]) == 2
    store = ArtifactStore(store_url)
    kinds = {m["kind"] for m in store.list()}
    assert kinds == {"raw", "corpus", "counts", "tokenizer", "tokens", "model"}
    for m in store.list():
        store.verify(m["kind"], m["version"])  # every file matches its manifest

    refs = summary["refs"]
    tok = Tokenizer.load(store.local_dir("tokenizer", refs["tokenizer"]["version"]))
    assert tok.vocab_size == 400
    tokens_manifest = store.manifest("tokens", refs["tokens"]["version"])
    meta = tokens_manifest["meta"]
    check_shards(store.local_dir("tokens", refs["tokens"]["version"]), meta)
    assert meta["dtype"] == "uint16"
    assert tokens_manifest["parents"] == {
        "corpus": f"corpus/{refs['corpus']['version']}",
        "tokenizer": f"tokenizer/{refs['tokenizer']['version']}",
    }

    # The shards decode back to the corpus documents, separators between them.
    text = open(small_corpus, encoding="utf-8").read()
    tokens_dir = store.local_dir("tokens", refs["tokens"]["version"])
    decoded = []
    for shard in meta["shards"]:
        ids = np.load(os.path.join(tokens_dir, f"{shard['name']}.npy"), mmap_mode="r", allow_pickle=False)
        decoded.append(tok.decode(ids))
    docs = "".join(decoded).split("<|endoftext|>")[:-1]
    assert docs == [p.strip("\n") for p in text.split("\n\n") if p.strip()]

    figures = summary["figures"]
    assert figures["vocab_size"] == 400
    assert figures["chars_per_token"] > 1.5
    assert figures["val_loss"] is not None and figures["lm_steps"] == 6
    model_dir = store.local_dir("model", refs["model"]["version"])
    assert os.path.getsize(os.path.join(model_dir, "loss.png")) > 1000
    assert os.path.exists(os.path.join(model_dir, "model.safetensors"))


def test_rerun_recomputes_nothing(first_run, small_corpus):
    store_url, summary, _ = first_run
    again, states = _run(**_params(small_corpus, store_url, 400, **LM))
    assert all(s == "Cached" for names in states.values() for s in names), states
    assert again["refs"] == summary["refs"]


def test_runs_read_well_in_the_ui(first_run, small_corpus):
    """Run names say what and where, task runs name their shard, tags carry stage, store and
    corpus, and a run whose every task is Cached still shows the artifacts of what it reused,
    under keys of this store and corpus."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    store_url, _, _ = first_run
    from flows.pipeline import tokenmill_pipeline

    state = tokenmill_pipeline(return_state=True, **_params(small_corpus, store_url, 400, **LM))
    assert state.is_completed()
    flow_run_id = state.state_details.flow_run_id
    runs = task_runs(flow_run_id)  # task-run states reach the server as events: let them settle
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(flow_run_id)
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    store_name = os.path.basename(store_url.rstrip("/"))
    assert flow_run.name == f"pipeline-shakespeare_head-cl100k-400@{store_name}", flow_run.name
    assert {r.state.name for r in runs} == {"Cached"}
    names = sorted(r.name for r in runs)
    assert "count_words[shard=0/2]" in names and "encode_shard[shard=1/2]" in names, names
    count_run = next(r for r in runs if r.name == "count_words[shard=0/2]")
    assert {"tokenmill", "stage:count_words", f"store:{store_name}", "corpus:shakespeare_head"} <= set(
        count_run.tags
    ), count_run.tags
    assert "stage:reduce_counts" not in count_run.tags  # a unit task carries its own stage only
    # a progress artifact per mapped stage, finished: all its shards done
    progress = {a.key.rsplit("-", 1)[0]: a for a in artifacts if a.type == "progress" and a.key}
    for stage in ("count-words", "encode-shard"):
        assert progress[f"{stage}-progress"].data == 100.0, (stage, progress[f"{stage}-progress"])
        assert progress[f"{stage}-progress"].description.endswith("2 / 2 shards done"), progress[
            f"{stage}-progress"
        ].description
    keys = {a.key.rsplit("-", 1)[0]: a.key for a in artifacts if a.key and a.type != "progress"}
    assert {"word-counts", "tokenizer-merges", "token-shards", "lm-metrics", "lm-report", "tokenmill-summary"} <= set(
        keys
    ), sorted(keys)
    suffixes = {k.rsplit("-", 1)[1] for k in keys.values()}
    assert len(suffixes) == 1 and len(suffixes.pop()) == 8  # one key suffix: this store and corpus


def test_changed_vocab_size_recomputes_only_downstream(first_run, small_corpus):
    store_url, summary, _ = first_run
    changed, states = _run(**_params(small_corpus, store_url, 420, **LM))
    for name in ("download_corpus", "shard_corpus", "count_words", "reduce_counts"):
        assert set(states[name]) == {"Cached"}, (name, states)
    for name in ("learn_merges", "encode_shard", "write_token_manifest", "train_lm"):
        assert set(states[name]) == {"Completed"}, (name, states)
    assert changed["refs"]["corpus"] == summary["refs"]["corpus"]
    assert changed["refs"]["tokenizer"] != summary["refs"]["tokenizer"]
    assert changed["figures"]["vocab_size"] == 420


def test_lost_store_is_recomputed_not_served_from_cache(small_corpus, tmp_path):
    """A cached task whose output vanished from the store must run again."""
    import shutil

    store_url = str(tmp_path / "store")
    first, _ = _run(**_params(small_corpus, store_url, 300, train_model=False))
    shutil.rmtree(store_url)
    again, states = _run(**_params(small_corpus, store_url, 300, train_model=False))
    assert all(s == "Completed" for names in states.values() for s in names), states
    versions = {k: r["version"] for k, r in first["refs"].items() if r}
    assert {k: r["version"] for k, r in again["refs"].items() if r} == versions  # same content, same ids
    store = ArtifactStore(store_url)
    for m in store.list():
        store.verify(m["kind"], m["version"])
