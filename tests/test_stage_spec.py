"""The stage spec and its engine: the version ids it declares, what it publishes, and the
one Prefect cache policy of the tasks made from it (against a real Prefect API)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import sys

import pytest

from pipeline_lib import counting, model_stage, stages, token_shards
from pipeline_lib.corpus import SHARD_CODE
from pipeline_lib.errors import StoreError
from pipeline_lib.lm.config import LMConfig
from pipeline_lib.stages import spec as engine
from pipeline_lib.store import ArtifactStore, VersionRef, version_id
from pipeline_lib.tokenizer import backend_info
from pipeline_lib.version import __version__, code_version

sys.path.insert(0, os.path.dirname(__file__))
from prefect_server import task_states  # noqa: E402


@pytest.fixture
def corpus_file(tmp_path, shakespeare_text) -> str:
    path = tmp_path / "corpus.txt"
    path.write_text(shakespeare_text[:40_000], encoding="utf-8")
    return str(path)


def _chain(store: ArtifactStore, source: str) -> dict[str, VersionRef]:
    """The whole chain through the engine, the way the tasks run it (units, then publish)."""
    cfg = stages.CorpusConfig(sources=(source,), n_shards=3)
    raw = engine.produce(stages.DOWNLOAD, store, {}, cfg)
    corpus = engine.produce(stages.SHARD, store, {"raw": raw}, cfg)
    for i in range(engine.unit_count(stages.COUNTS, store, {"corpus": corpus})):
        engine.run_unit(stages.COUNTS, store, {"corpus": corpus}, stages.CountConfig(), i)
    counts = engine.produce(stages.COUNTS, store, {"corpus": corpus}, stages.CountConfig())
    tok = engine.produce(stages.TOKENIZER, store, {"counts": counts}, stages.TokenizerConfig(vocab_size=300))
    parents = {"corpus": corpus, "tokenizer": tok}
    for i in range(engine.unit_count(stages.TOKENS, store, parents)):
        engine.run_unit(stages.TOKENS, store, parents, stages.EncodeConfig(), i)
    tokens = engine.produce(stages.TOKENS, store, parents, stages.EncodeConfig())
    return {"raw": raw, "corpus": corpus, "counts": counts, "tokenizer": tok, "tokens": tokens}


def test_engine_publishes_the_ids_the_stage_helpers_compute(tmp_path, corpus_file):
    store = ArtifactStore(str(tmp_path / "store"))
    refs = _chain(store, corpus_file)
    cfg = stages.CorpusConfig(sources=(corpus_file,), n_shards=3)
    cc, tc, ec = stages.CountConfig(), stages.TokenizerConfig(vocab_size=300), stages.EncodeConfig()
    corpus, counts, tok = refs["corpus"], refs["counts"], refs["tokenizer"]
    # Each id as the per-stage code wrote it out before the spec (kind, parents, params, code
    # modules), the helpers, the spec, and what was published: all the same.
    expected = {
        "corpus": version_id("corpus", {"raw": refs["raw"].key}, cfg.shard_params(), code_version(*SHARD_CODE)),
        "counts": version_id("counts", {"corpus": corpus.key}, cc.params(), code_version(*counting.CODE_MODULES)),
        "tokenizer": version_id("tokenizer", {"counts": counts.key}, tc.params(), code_version(*stages.TOKENIZER_MODULES)),
        "tokens": version_id("tokens", {"corpus": corpus.key, "tokenizer": tok.key}, ec.params(), code_version(*token_shards.CODE_MODULES)),
    }
    helpers = {
        "corpus": expected["corpus"],  # pipeline_lib.corpus computes it inline in shard_corpus
        "counts": stages.counts_version(corpus, cc),
        "tokenizer": stages.tokenizer_version(counts, tc),
        "tokens": stages.tokens_version(corpus, tok, ec),
    }
    specs = {
        "corpus": stages.SHARD.version({"raw": refs["raw"]}, cfg),
        "counts": stages.COUNTS.version({"corpus": corpus}, cc),
        "tokenizer": stages.TOKENIZER.version({"counts": counts}, tc),
        "tokens": stages.TOKENS.version({"corpus": corpus, "tokenizer": tok}, ec),
    }
    published = {k: refs[k].version for k in expected}
    assert expected == helpers == specs == published
    # The library's own entry points land on the same versions (and reuse them).
    assert stages.reduce_counts(store, corpus, cc) == counts
    assert stages.learn_tokenizer(store, counts, tc) == tok
    assert stages.publish_tokens(store, corpus, tok, ec) == refs["tokens"]
    assert stages.shard_corpus(store, refs["raw"], cfg) == corpus
    assert stages.download_corpus(store, cfg) == refs["raw"]
    # The LM's declared id is model_stage's.
    train = LMConfig().train_config()
    tokens = refs["tokens"]
    from pipeline_lib.stages.lm import LM

    assert LM.version({"tokens": tokens, "tokenizer": tok}, train) == model_stage.model_version(tokens, tok, train)
    assert LM.version({"tokens": tokens, "tokenizer": tok}, train) == version_id(
        "model", {"tokens": tokens.key, "tokenizer": tok.key}, train.versioned_dict(), code_version(*model_stage.LM_MODULES)
    )


def test_every_manifest_records_the_backend(tmp_path, corpus_file):
    store = ArtifactStore(str(tmp_path / "store"))
    refs = _chain(store, corpus_file)
    for ref in refs.values():
        manifest = store.manifest(ref.kind, ref.version)
        assert manifest["backend"] == backend_info(), ref.kind
        assert manifest["backend"]["backend"] in ("native", "python")
        assert manifest["parents"] == {k: v.key for k, v in refs.items() if k in _parents(ref.kind)}


def _parents(kind: str) -> tuple[str, ...]:
    return {s.kind: s.inputs for s in (stages.DOWNLOAD, stages.SHARD, stages.COUNTS, stages.TOKENIZER, stages.TOKENS)}[kind]


def test_a_spec_that_disagrees_with_its_stage_is_refused(tmp_path, corpus_file):
    store = ArtifactStore(str(tmp_path / "store"))
    cfg = stages.CorpusConfig(sources=(corpus_file,), n_shards=2)
    raw = engine.produce(stages.DOWNLOAD, store, {}, cfg)
    wrong = dataclasses.replace(stages.SHARD, params=lambda config: {**config.shard_params(), "extra": 1})
    with pytest.raises(StoreError, match="spec declares corpus/"):
        engine.produce(wrong, store, {"raw": raw}, cfg)
    with pytest.raises(ValueError, match="takes the inputs"):
        engine.produce(stages.SHARD, store, {"corpus": raw}, cfg)


def test_units_must_all_be_done_before_the_publish(tmp_path, corpus_file):
    store = ArtifactStore(str(tmp_path / "store"))
    cfg = stages.CorpusConfig(sources=(corpus_file,), n_shards=3)
    corpus = engine.produce(stages.SHARD, store, {"raw": engine.produce(stages.DOWNLOAD, store, {}, cfg)}, cfg)
    engine.run_unit(stages.COUNTS, store, {"corpus": corpus}, stages.CountConfig(), 0)
    with pytest.raises(ValueError, match="shard 1 is not done yet: run count_words"):
        engine.produce(stages.COUNTS, store, {"corpus": corpus}, stages.CountConfig())
    assert not store.list("counts")


def test_unreachable_source_has_no_cache_identity(tmp_path):
    cfg = stages.CorpusConfig(sources=(str(tmp_path / "missing.txt"),))
    assert engine.cache_identity(stages.DOWNLOAD, {}, cfg) is None


def test_code_version_of_a_module_and_of_a_package(tmp_path, monkeypatch):
    pkg = tmp_path / "codepkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("A = 1\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("B = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code_version.cache_clear()
    try:
        # a module: its file's bytes, as before packages counted
        assert code_version("codepkg.a") == f"{__version__}+{hashlib.sha256(b'A = 1' + bytes([10])).hexdigest()[:12]}"
        before = code_version("codepkg")
        (pkg / "sub" / "b.py").write_text("B = 2\n")  # a file deep in the package
        code_version.cache_clear()
        assert code_version("codepkg") != before
        assert code_version("codepkg.a") == f"{__version__}+{hashlib.sha256(b'A = 1' + bytes([10])).hexdigest()[:12]}"
    finally:
        code_version.cache_clear()
        for name in [m for m in sys.modules if m == "codepkg" or m.startswith("codepkg.")]:
            del sys.modules[name]


# --------------------------------------------------------------------------- the cache policy
def _task_states(flow_state) -> dict[str, list[str]]:
    return task_states(flow_state.state_details.flow_run_id)  # waits for the states to settle


def _storage_files(root: str) -> dict[str, bytes]:
    out = {}
    for directory, _, files in os.walk(root):
        for f in files:
            path = os.path.join(directory, f)
            with open(path, "rb") as fh:
                out[path] = fh.read()
    return out


@pytest.mark.usefixtures("prefect_harness")
def test_cache_holds_while_the_store_does(tmp_path, corpus_file):
    from prefect import flow
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH

    from tasks.counting import COUNTS

    store_url = str(tmp_path / "store")
    store = ArtifactStore(store_url)
    cfg = stages.CorpusConfig(sources=(corpus_file,), n_shards=2)
    corpus = stages.shard_corpus(store, stages.download_corpus(store, cfg), cfg)
    corpus_dict = {"kind": corpus.kind, "version": corpus.version, "uri": corpus.uri, "manifest_sha256": corpus.manifest_sha256}

    @flow(name="stage-spec-counts")
    def counts_flow() -> dict:
        return COUNTS(store_url, {"corpus": corpus_dict}, stages.CountConfig(), None)

    def run():
        state = counts_flow(return_state=True)
        assert state.is_completed(), state
        return state.result(), _task_states(state)

    first, states = run()
    assert states == {"count_words": ["Completed"] * 2, "reduce_counts": ["Completed"]}, states
    assert first["version"] == stages.counts_version(corpus, stages.CountConfig())

    again, states = run()
    assert states == {"count_words": ["Cached"] * 2, "reduce_counts": ["Cached"]}, states
    assert again == first

    # The output is deleted from the store: nothing may be served from the cache, and what
    # Prefect stored stays as it is (stale records are stepped over, not deleted).
    storage = str(PREFECT_LOCAL_STORAGE_PATH.value())
    before = _storage_files(storage)
    assert before
    shutil.rmtree(os.path.join(store_url, "counts", first["version"]))
    assert not store.exists("counts", first["version"])
    rerun, states = run()
    assert states == {"count_words": ["Completed"] * 2, "reduce_counts": ["Completed"]}, states
    assert rerun["version"] == first["version"] and rerun["manifest_sha256"] != first["manifest_sha256"]
    after = _storage_files(storage)
    assert {p: after.get(p) for p in before} == before  # every record still there, unchanged
    assert len(after) > len(before)  # the rerun's results went to new keys

    # ... and those new records are the ones a later run is served from.
    last, states = run()
    assert states == {"count_words": ["Cached"] * 2, "reduce_counts": ["Cached"]}, states
    assert last == rerun
    assert store.check_ref(VersionRef(**last))
