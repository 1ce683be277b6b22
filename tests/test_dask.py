"""The mapped stages on Dask give the same artifacts, byte for byte, as the default runner.

The whole chain without the LM runs twice under the session's Prefect harness: with the
default thread runner into one store, and with `DaskTaskRunner` on a 2-worker
`LocalCluster` (worker processes that read and write the store through fsspec) into
another. Version ids are content-derived, so equal ids plus equal file hashes mean the
runner changed nothing. A second test (slow) runs the mapped stages on an existing
cluster given by address (`--dask-address`).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import prefect_dask  # noqa: F401
from prefect_server import task_states

pytestmark = pytest.mark.usefixtures("prefect_harness")

PARAMS = {"tokenizer": {"vocab_size": 300}, "train_model": False}
SHARDS = 4


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, shakespeare_text) -> str:
    path = tmp_path_factory.mktemp("corpus") / "shakespeare_head.txt"
    path.write_text(shakespeare_text[:200_000], encoding="utf-8")
    return str(path)


def _run(corpus: str, store: str, task_runner=None) -> tuple[dict, dict[str, list[str]]]:
    from flows.pipeline import tokenmill_pipeline

    flow = tokenmill_pipeline if task_runner is None else tokenmill_pipeline.with_options(task_runner=task_runner)
    state = flow(corpus={"sources": [corpus], "n_shards": SHARDS}, store=store, return_state=True, **PARAMS)
    assert state.is_completed(), state
    return state.result(), task_states(state.state_details.flow_run_id)


def _snapshot(store_url: str) -> dict[str, dict[str, str]]:
    """``{kind/version: {file: sha256 of the bytes on disk}}`` for every published version."""
    from pipeline_lib import ArtifactStore

    store = ArtifactStore(store_url)
    out = {}
    for m in store.list():
        root = Path(store.local_dir(m["kind"], m["version"]))
        files = {}
        for name, info in m["files"].items():
            data = (root / name).read_bytes()
            digest = hashlib.sha256(data).hexdigest()
            assert digest == info["sha256"] and len(data) == info["size"], f"{m['kind']}/{m['version']}/{name}"
            files[name] = digest
        out[f"{m['kind']}/{m['version']}"] = files
    return out


@pytest.fixture(scope="module")
def threads_run(corpus, tmp_path_factory):
    store = str(tmp_path_factory.mktemp("store-threads"))
    summary, states = _run(corpus, store)
    return store, summary, states


def test_dask_local_cluster_matches_default_runner(threads_run, corpus, tmp_path):
    from flows.runners import make_task_runner

    store_t, summary_t, _ = threads_run
    store_d = str(tmp_path / "store-dask")
    runner = make_task_runner("dask", workers=2, dask_cluster_kwargs={"dashboard_address": None})
    summary_d, states = _run(corpus, store_d, runner)
    # Computed on the cluster, not read back from the threads run's cache.
    assert states["encode_shard"] == ["Completed"] * 4 and states["count_words"] == ["Completed"] * 4, states
    assert {k: r["version"] for k, r in summary_d["refs"].items() if r} == {
        k: r["version"] for k, r in summary_t["refs"].items() if r
    }
    snap_t, snap_d = _snapshot(store_t), _snapshot(store_d)
    assert set(snap_t) == set(snap_d)
    assert {k.split("/")[0] for k in snap_d} == {"raw", "corpus", "counts", "tokenizer", "tokens"}
    assert snap_d == snap_t
    # The manifests: no runner-specific bytes; only the publish time (`created`) differs, and
    # the parents' manifest hashes that follow from it (docs/operations.md, section 6).
    manifests_t, manifests_d = _manifests(store_t), _manifests(store_d)
    assert set(manifests_t) == set(manifests_d)
    for key, mt in manifests_t.items():
        md = manifests_d[key]
        differ = {k for k in set(mt) | set(md) if mt.get(k) != md.get(k)}
        assert differ <= {"created", "parent_manifests"}, (key, {k: (mt.get(k), md.get(k)) for k in differ})


def _manifests(store_url: str) -> dict[str, dict]:
    from pipeline_lib import ArtifactStore

    store = ArtifactStore(store_url)
    return {f"{m['kind']}/{m['version']}": store.manifest(m["kind"], m["version"]) for m in store.list()}


@pytest.mark.slow
def test_dask_existing_cluster_by_address(threads_run, corpus, tmp_path):
    from distributed import LocalCluster

    from flows.runners import make_task_runner

    store_t, summary_t, _ = threads_run
    store_d = str(tmp_path / "store-dask-address")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        summary_d, states = _run(corpus, store_d, make_task_runner("dask", dask_address=cluster.scheduler_address))
        assert len(cluster.scheduler_info["workers"]) == 2  # the runner used the cluster, did not resize it
        # The mapped stages ran on the cluster's workers (the scheduler saw them).
        assert {"count_words", "encode_shard"} <= set(cluster.scheduler.task_prefixes)
    assert states["encode_shard"] == ["Completed"] * 4, states
    assert summary_d["refs"]["tokens"]["version"] == summary_t["refs"]["tokens"]["version"]
    assert _snapshot(store_d) == _snapshot(store_t)
