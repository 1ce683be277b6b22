"""The stage spec and its engine: the version ids it declares, what it publishes, and the
one Prefect cache policy of the tasks made from it (against a real Prefect API)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys

import pytest

from pipeline_lib import stages
from pipeline_lib.lm.stage_config import LMConfig
from pipeline_lib.stages import spec as engine
from pipeline_lib.stages.lm import LM, model_version
from pipeline_lib.store import ArtifactStore, VersionRef, version_id
from pipeline_lib.tokenizer import backend_info
from pipeline_lib.version import FORMAT_VERSION, output_code

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
    for i in range(engine.unit_count(stages.SHARD, store, {"raw": raw}, cfg)):
        engine.run_unit(stages.SHARD, store, {"raw": raw}, cfg, i)
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


def _expected(stage: engine.Stage, parents: dict[str, VersionRef], params: dict) -> str:
    """A version id as the spec defines it: kind, parents' keys, params, output version; nothing else."""
    return version_id(stage.kind, {k: v.key for k, v in parents.items()}, params, output_code(stage.output_version))


def test_engine_publishes_the_ids_the_stage_helpers_compute(tmp_path, corpus_file):
    store = ArtifactStore(str(tmp_path / "store"))
    refs = _chain(store, corpus_file)
    cfg = stages.CorpusConfig(sources=(corpus_file,), n_shards=3)
    cc, tc, ec = stages.CountConfig(), stages.TokenizerConfig(vocab_size=300), stages.EncodeConfig()
    raw, corpus, counts, tok = refs["raw"], refs["corpus"], refs["counts"], refs["tokenizer"]
    content = [
        {"name": s["name"], "sha256": s["sha256"]} for s in store.manifest("raw", raw.version)["meta"]["sources"]
    ]
    expected = {
        "raw": _expected(stages.DOWNLOAD, {}, {"content": content}),
        "corpus": _expected(stages.SHARD, {"raw": raw}, cfg.shard_params()),
        "counts": _expected(stages.COUNTS, {"corpus": corpus}, cc.params()),
        "tokenizer": _expected(stages.TOKENIZER, {"counts": counts}, tc.params()),
        "tokens": _expected(stages.TOKENS, {"corpus": corpus, "tokenizer": tok}, ec.params()),
    }
    helpers = {
        "raw": expected["raw"],  # content-addressed: known once fetched
        "corpus": expected["corpus"],
        "counts": stages.counts_version(corpus, cc),
        "tokenizer": stages.tokenizer_version(counts, tc),
        "tokens": stages.tokens_version(corpus, tok, ec),
    }
    specs = {
        "raw": expected["raw"],
        "corpus": stages.SHARD.version({"raw": raw}, cfg),
        "counts": stages.COUNTS.version({"corpus": corpus}, cc),
        "tokenizer": stages.TOKENIZER.version({"counts": counts}, tc),
        "tokens": stages.TOKENS.version({"corpus": corpus, "tokenizer": tok}, ec),
    }
    published = {k: refs[k].version for k in expected}
    assert expected == helpers == specs == published
    for ref in refs.values():  # the manifest records the code part of the id: the output version
        stage = {s.kind: s for s in (stages.DOWNLOAD, stages.SHARD, stages.COUNTS, stages.TOKENIZER, stages.TOKENS)}[
            ref.kind
        ]
        assert store.manifest(ref.kind, ref.version)["code_version"] == output_code(stage.output_version)
    # The library's own entry points land on the same versions (and reuse them).
    assert stages.reduce_counts(store, corpus, cc) == counts
    assert stages.learn_tokenizer(store, counts, tc) == tok
    assert stages.publish_tokens(store, corpus, tok, ec) == refs["tokens"]
    assert stages.shard_corpus(store, raw, cfg) == corpus
    assert stages.download_corpus(store, cfg) == raw
    # The LM's declared id.
    train = LMConfig().train_config()
    tokens = refs["tokens"]
    assert LM.version({"tokens": tokens, "tokenizer": tok}, train) == model_version(tokens, tok, train)
    assert model_version(tokens, tok, train) == _expected(
        LM, {"tokens": tokens, "tokenizer": tok}, train.versioned_dict()
    )


def test_versions_of_an_older_id_scheme_stay_readable(tmp_path, corpus_file, monkeypatch):
    """A store written when ids hashed the source (code "<release>+<hash>") stays readable:
    reading a version never recomputes its id. Its versions verify, are reused by their ids,
    and feed later stages, which publish under today's ids with the old keys as parents."""
    store = ArtifactStore(str(tmp_path / "store"))
    with monkeypatch.context() as patch:
        patch.setattr(engine, "output_code", lambda _n: "0.1.0+0123456789ab")
        old = _chain(store, corpus_file)
    assert store.manifest("counts", old["counts"].version)["code_version"] == "0.1.0+0123456789ab"
    for ref in old.values():
        assert store.usable(ref.kind, ref.version) and store.check_ref(ref)
        store.verify(ref.kind, ref.version, strict=True)
    tc = stages.TokenizerConfig(vocab_size=300)
    assert stages.tokenizer_version(old["counts"], tc) != old["tokenizer"].version  # today's id for the same work
    tok = stages.learn_tokenizer(store, old["counts"], tc)
    assert store.manifest("tokenizer", tok.version)["parents"] == {"counts": old["counts"].key}
    assert store.read_bytes("tokenizer", tok.version, "vocab.tiktoken") == store.read_bytes(
        "tokenizer", old["tokenizer"].version, "vocab.tiktoken"
    )
    # A bumped output version is a new id for new runs; the published one stays.
    bumped = dataclasses.replace(stages.TOKENIZER, output_version=stages.TOKENIZER.output_version + 1)
    assert bumped.version({"counts": old["counts"]}, tc) not in (tok.version, old["tokenizer"].version)
    assert store.usable("tokenizer", tok.version)


def test_every_manifest_records_the_backend(tmp_path, corpus_file):
    store = ArtifactStore(str(tmp_path / "store"))
    refs = _chain(store, corpus_file)
    for ref in refs.values():
        manifest = store.manifest(ref.kind, ref.version)
        assert manifest["backend"] == backend_info(), ref.kind
        assert manifest["backend"]["backend"] in ("native", "python")
        assert manifest["parents"] == {k: v.key for k, v in refs.items() if k in _parents(ref.kind)}


def _parents(kind: str) -> tuple[str, ...]:
    return {s.kind: s.inputs for s in (stages.DOWNLOAD, stages.SHARD, stages.COUNTS, stages.TOKENIZER, stages.TOKENS)}[
        kind
    ]


def test_a_stage_without_params_or_identify_is_refused(tmp_path, corpus_file):
    store = ArtifactStore(str(tmp_path / "store"))
    cfg = stages.CorpusConfig(sources=(corpus_file,), n_shards=2)
    raw = engine.produce(stages.DOWNLOAD, store, {}, cfg)
    with pytest.raises(ValueError, match="neither params nor identify"):
        engine.produce(dataclasses.replace(stages.DOWNLOAD, identify=None), store, {}, cfg)
    with pytest.raises(ValueError, match="takes the inputs"):
        engine.produce(stages.SHARD, store, {"corpus": raw}, cfg)


def test_an_output_version_is_a_positive_integer():
    with pytest.raises(ValueError, match="output version"):
        output_code(0)
    assert output_code(3) == f"format{FORMAT_VERSION}.output3"


def test_units_must_all_be_done_before_the_publish(tmp_path, corpus_file):
    store = ArtifactStore(str(tmp_path / "store"))
    cfg = stages.CorpusConfig(sources=(corpus_file,), n_shards=3)
    corpus = stages.shard_corpus(store, engine.produce(stages.DOWNLOAD, store, {}, cfg), cfg)
    engine.run_unit(stages.COUNTS, store, {"corpus": corpus}, stages.CountConfig(), 0)
    with pytest.raises(ValueError, match="shard 1 is not done yet: run count_words"):
        engine.produce(stages.COUNTS, store, {"corpus": corpus}, stages.CountConfig())
    assert not store.list("counts")


def test_unreachable_source_has_no_cache_identity(tmp_path):
    cfg = stages.CorpusConfig(sources=(str(tmp_path / "missing.txt"),))
    assert engine.cache_identity(stages.DOWNLOAD, {}, cfg) is None


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
    corpus_dict = {
        "kind": corpus.kind,
        "version": corpus.version,
        "uri": corpus.uri,
        "manifest_sha256": corpus.manifest_sha256,
    }

    @flow(name="stage-spec-counts")
    def counts_flow() -> VersionRef:
        return COUNTS(store_url, {"corpus": corpus_dict}, stages.CountConfig(), None)

    def run():
        state = counts_flow(return_state=True)
        assert state.is_completed(), state
        return state.result(), _task_states(state)

    first, states = run()
    assert states == {"count_words": ["Completed"] * 2, "reduce_counts": ["Completed"]}, states
    assert isinstance(first, VersionRef)  # what tasks hand each other
    assert first.version == stages.counts_version(corpus, stages.CountConfig())

    again, states = run()
    assert states == {"count_words": ["Cached"] * 2, "reduce_counts": ["Cached"]}, states
    assert again == first

    # The output is deleted from the store: nothing may be served from the cache, and what
    # Prefect stored stays as it is (stale records are stepped over, not deleted).
    storage = str(PREFECT_LOCAL_STORAGE_PATH.value())
    before = _storage_files(storage)
    assert before
    shutil.rmtree(os.path.join(store_url, "counts", first.version))
    assert not store.exists("counts", first.version)
    rerun, states = run()
    assert states == {"count_words": ["Completed"] * 2, "reduce_counts": ["Completed"]}, states
    assert rerun.version == first.version and rerun.manifest_sha256 != first.manifest_sha256
    after = _storage_files(storage)
    assert {p: after.get(p) for p in before} == before  # every record still there, unchanged
    assert len(after) > len(before)  # the rerun's results went to new keys

    # ... and those new records are the ones a later run is served from.
    last, states = run()
    assert states == {"count_words": ["Cached"] * 2, "reduce_counts": ["Cached"]}, states
    assert last == rerun
    assert store.check_ref(last)
