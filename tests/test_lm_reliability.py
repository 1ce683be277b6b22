"""LM stage reliability: same id -> same bytes, per-store work dirs, checkpoint cadence,
self-healing resume, verified reads, one producer per version."""

import hashlib
import importlib
import itertools
import json
import logging
import os
import stat
import tempfile
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load as st_load

from pipeline_lib.errors import ShardError, StoreError
from pipeline_lib.lm import list_checkpoints, load_model, preset, train
from pipeline_lib.lm.checkpoint import safetensors_bytes, weights_bytes
from pipeline_lib.lm.testing import write_token_dir
from pipeline_lib.model_stage import MODEL_KIND, load_published_model
from pipeline_lib.stages import tokenizer_files
from pipeline_lib.stages.lm import model_version, train_language_model
from pipeline_lib.store import ArtifactStore
from pipeline_lib.tokenizer import Tokenizer

pytestmark = pytest.mark.usefixtures("torch_one_thread")

SHAKESPEARE = Path(__file__).resolve().parents[1] / "pipeline_lib" / "data" / "tinyshakespeare.txt"
train_mod = importlib.import_module("pipeline_lib.lm.trainer")


def quiet(_msg):
    pass


class Kill(Exception):
    """Stands in for a SIGKILL at the end of a step (after that step's checkpoint, if any)."""


def kill_at(k):
    def on_step(entry):
        if entry["step"] == k:
            raise Kill

    return on_step


def cfg(**kw):
    base = {
        "device": "cpu",
        "max_steps": 12,
        "block_size": 32,
        "n_layer": 1,
        "n_head": 2,
        "n_embd": 32,
        "batch_size": 4,
        "eval_iters": 2,
        "eval_interval": 6,
        "log_interval": 1,
        "warmup_steps": 2,
        "ckpt_every_s": 0,
    }
    base.update(kw)
    return preset("tiny", **base)


@pytest.fixture(scope="module")
def corpus():
    text = SHAKESPEARE.read_text(encoding="utf-8")[:60_000]
    tok = Tokenizer.train([text], vocab_size=320, pattern="gpt2")
    docs = [np.asarray(tok.encode_ordinary(p + "\n\n"), dtype=np.int64) for p in text.split("\n\n") if p.strip()]
    return tok, docs


@pytest.fixture(scope="module")
def token_dir(corpus, tmp_path_factory):
    tok, docs = corpus
    half = len(docs) // 2
    return write_token_dir(
        tmp_path_factory.mktemp("tokens"),
        [docs[:half], docs[half:]],
        tok.vocab_size,
        tok.special_tokens["<|endoftext|>"],
    )


def make_store(url, corpus, tmp):
    """A store holding a tokenizer and a tokens version with fixed ids (the same in every
    store, so the model version id is the same too)."""
    tok, docs = corpus
    store = ArtifactStore(str(url))
    staging = store.stage("tokenizer", "tok-test")
    files = {n: staging.put_bytes(n, b) for n, b in tokenizer_files(tok).items()}
    tokenizer = store.publish(staging, files=files, meta=tok.metadata())
    half = len(docs) // 2
    d = write_token_dir(tmp, [docs[:half], docs[half:]], tok.vocab_size, tok.special_tokens["<|endoftext|>"])
    meta = json.loads((d / "manifest.json").read_text())["meta"]
    staging = store.stage("tokens", "tokens-test")
    files = {p.name: staging.put_file(p.name, str(p)) for p in sorted(d.glob("shard_*"))}
    tokens = store.publish(staging, files=files, parents={"tokenizer": tokenizer}, meta=meta)
    return store, tokens, tokenizer


def stage_run(store, tokens, tokenizer, config, **kw):
    kw.setdefault("log", quiet)
    return train_language_model(store, tokens, tokenizer, config, n_samples=1, sample_tokens=16, **kw)


def file_hashes(store, ref):
    """{name: sha256} of every file of a version, hashed from the bytes on disk."""
    names = store.manifest(ref.kind, ref.version)["files"]
    return {n: hashlib.sha256(store.read_bytes(ref.kind, ref.version, n, verify=False)).hexdigest() for n in names}


def flip_byte(path, offset=-1):
    p = Path(path)
    os.chmod(p, stat.S_IRUSR | stat.S_IWUSR)  # published files are read-only
    blob = bytearray(p.read_bytes())
    blob[offset] ^= 0x01
    p.write_bytes(bytes(blob))


@pytest.fixture()
def sys_tmp(tmp_path, monkeypatch):
    """A private system temp dir, so the tests can see what the stage leaves there."""
    d = tmp_path / "systmp"
    d.mkdir()
    monkeypatch.setenv("TMPDIR", str(d))
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


# -- 1. same id, same bytes ---------------------------------------------------------------


def test_safetensors_bytes_are_canonical():
    t = {"b": torch.arange(5, dtype=torch.float32), "a": torch.ones(3, dtype=torch.int64)}
    meta = {f"k{i}": str(i) for i in range(8)}
    blobs = {safetensors_bytes(t, meta) for _ in range(20)}  # safetensors alone gives ~10 distinct orders
    assert len(blobs) == 1
    blob = blobs.pop()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + n])
    assert list(header["__metadata__"]) == sorted(meta) and n % 8 == 0
    back = st_load(blob)
    assert torch.equal(back["a"], t["a"]) and torch.equal(back["b"], t["b"])
    torch.manual_seed(0)
    from pipeline_lib.lm import GPT, GPTConfig

    m = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=1, n_embd=8))
    assert len({weights_bytes(m) for _ in range(10)}) == 1


def test_same_version_same_bytes_in_two_stores(corpus, tmp_path, sys_tmp):
    a, tokens, tokenizer = make_store(tmp_path / "a", corpus, tmp_path / "ta")
    b, tokens_b, tokenizer_b = make_store(tmp_path / "b", corpus, tmp_path / "tb")
    c = cfg()
    ra = stage_run(a, tokens, tokenizer, c)
    rb = stage_run(b, tokens_b, tokenizer_b, c.replace(ckpt_every_s=1e-9, keep_last=3))  # run-only fields differ
    assert ra.version == rb.version == model_version(tokens, tokenizer, c)
    ha, hb = file_hashes(a, ra), file_hashes(b, rb)
    assert ha == hb and len(ha) >= 13  # every file, checkpoint included, byte for byte
    assert "model.safetensors" in ha and "checkpoint/model.safetensors" not in ha  # the weights stored once
    assert a.manifest(ra.kind, ra.version)["files"] == b.manifest(rb.kind, rb.version)["files"]
    for name in ("model.safetensors", "checkpoint/optimizer.safetensors"):  # canonical headers, not luck
        blob = a.read_bytes(ra.kind, ra.version, name)
        n = int.from_bytes(blob[:8], "little")
        header = blob[8 : 8 + n].rstrip(b" ")
        assert header == json.dumps(json.loads(header), sort_keys=True, separators=(",", ":")).encode(), name
    # timings live in the manifest's run record and the log, never in a versioned file
    ma = a.manifest(ra.kind, ra.version)
    assert ma["meta"]["run"]["tokens_per_s"] > 0 and ma["meta"]["run"]["device"] == "cpu"
    for name in ("metrics.json", "history.json", "checkpoint/trainer_state.json", "train_config.json"):
        text = a.read_bytes(ra.kind, ra.version, name).decode()
        assert '"tokens_per_s"' not in text and '"mfu"' not in text and str(tmp_path) not in text, name
    assert "device" not in json.loads(a.read_bytes(ra.kind, ra.version, "train_config.json"))


# -- 2. work dirs private to a store; no temp leaks ------------------------------------------


def test_checkpoint_in_one_store_does_not_leak_into_another(corpus, tmp_path, sys_tmp):
    tag = uuid.uuid4().hex[:8]
    a, tokens, tokenizer = make_store(f"memory://lm-{tag}-a", corpus, tmp_path / "ta")
    b, tokens_b, tokenizer_b = make_store(f"memory://lm-{tag}-b", corpus, tmp_path / "tb")
    c = cfg(ckpt_interval=4)
    version = model_version(tokens, tokenizer, c)
    with pytest.raises(Kill):
        stage_run(a, tokens, tokenizer, c, on_step=kill_at(6))
    work_a = a.work_dir(MODEL_KIND, version)
    assert [s for s, _ in list_checkpoints(work_a)] == [4]
    logs_b = []
    rb = stage_run(b, tokens_b, tokenizer_b, c, log=logs_b.append)
    assert rb.version == version and not any("resuming" in m for m in logs_b)  # fresh, not store a's step 4
    assert [str(p) for p in sys_tmp.glob(f"tokenmill-stores/*/{MODEL_KIND}/{version}.work")] == [work_a]  # b's dropped
    assert [s for s, _ in list_checkpoints(work_a)] == [4]  # store a's work untouched
    logs_a = []
    ra = stage_run(a, tokens, tokenizer, c, log=logs_a.append)
    assert any("resuming at step 4" in m for m in logs_a)
    assert file_hashes(a, ra) == file_hashes(b, rb)  # resumed == uninterrupted, byte for byte


def test_local_store_leaves_nothing_in_system_temp(corpus, tmp_path, sys_tmp):
    store, tokens, tokenizer = make_store(tmp_path / "store", corpus, tmp_path / "t")
    c = cfg(max_steps=6)
    with pytest.raises(Kill):
        stage_run(store, tokens, tokenizer, c, on_step=kill_at(4))
    ref = stage_run(store, tokens, tokenizer, c)
    leaked = [p.name for p in sys_tmp.iterdir() if p.name.startswith("tokenmill")]
    assert leaked == []
    staging = tmp_path / "store" / MODEL_KIND / ".staging"
    assert not (staging / f"{ref.version}.work").exists()  # work dir dropped after publish
    assert list(staging.glob(".tmp/model-*")) == []  # the scratch output dir is removed too


# -- 3. checkpoint cadence ------------------------------------------------------------------


def record_writes(monkeypatch):
    """{step: the complete checkpoints right after that step's (background) write}."""
    written = {}
    writer = importlib.import_module("pipeline_lib.lm.checkpointing")  # the background writer's module
    real = writer.write_checkpoint

    def write(out_dir, step, files, keep_last):
        path = real(out_dir, step, files, keep_last)
        written[step] = [s for s, _ in list_checkpoints(out_dir)]
        return path

    monkeypatch.setattr(writer, "write_checkpoint", write)
    return written


def test_step_cadence_protects_a_short_run_and_resume_is_exact(token_dir, tmp_path, monkeypatch):
    c = cfg(max_steps=30, eval_interval=10)  # ckpt_interval 0: every 30 // 10 = 3 steps
    written = record_writes(monkeypatch)
    full = train(c, token_dir, tmp_path / "full", log=quiet)
    assert sorted(written) == list(range(3, 31, 3))
    assert written[3] == [3] and written[6] == [3, 6] and written[27] == [24, 27]  # keep_last=2
    assert [s for s, _ in list_checkpoints(tmp_path / "full")] == [27, 30]

    with pytest.raises(Kill):
        train(c, token_dir, tmp_path / "cut", log=quiet, on_step=kill_at(17))
    assert [s for s, _ in list_checkpoints(tmp_path / "cut")] == [12, 15]
    logs = []
    resumed = train(c, token_dir, tmp_path / "cut", log=logs.append, resume=True)
    assert any("resuming at step 15" in m for m in logs)
    a, b = Path(full.checkpoint_dir), Path(resumed.checkpoint_dir)
    wa, wb = st_load((a / "model.safetensors").read_bytes()), st_load((b / "model.safetensors").read_bytes())
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    for f in sorted(p.name for p in a.iterdir()):  # every checkpoint file, byte for byte
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


@pytest.mark.parametrize("tick, every_s, want", [(10.0, 5.0, [4, 5]), (0.0, 5.0, [5]), (10.0, 0, [5])])
def test_time_cadence(token_dir, tmp_path, monkeypatch, tick, every_s, want):
    clock = itertools.count(0.0, tick)  # a fake clock: `tick` seconds pass between readings
    monkeypatch.setattr(train_mod, "_clock", lambda: next(clock))
    written = record_writes(monkeypatch)
    out = tmp_path / "run"
    train(cfg(max_steps=5, ckpt_interval=1000, ckpt_every_s=every_s), token_dir, out, log=quiet)
    assert [s for s, _ in list_checkpoints(out)] == want
    assert (1 in written) is (want != [5])  # a checkpoint after step 1 only when the clock says one is due


# -- 4. self-healing resume -----------------------------------------------------------------


def test_resume_falls_back_to_previous_then_fresh(token_dir, tmp_path, caplog):
    c = cfg(max_steps=8, ckpt_interval=2)
    full = train(c, token_dir, tmp_path / "full", log=quiet)
    want = (Path(full.checkpoint_dir) / "model.safetensors").read_bytes()
    out = tmp_path / "run"

    with pytest.raises(Kill):
        train(c, token_dir, out, log=quiet, on_step=kill_at(5))
    assert [s for s, _ in list_checkpoints(out)] == [2, 4]
    flip_byte(out / "ckpt_000004" / "model.safetensors", offset=-5)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tokenmill.lm"):
        logs = []
        r = train(c, token_dir, out, log=logs.append, resume=True)
    warned = [rec.getMessage() for rec in caplog.records if rec.name == "tokenmill.lm"]
    assert len(warned) == 1 and "ckpt_000004 is unusable" in warned[0] and "sha256 mismatch" in warned[0]
    assert "falling back to the previous checkpoint ckpt_000002" in warned[0]
    assert any("resuming at step 2" in m for m in logs) and r.run_messages == warned
    assert (Path(r.checkpoint_dir) / "model.safetensors").read_bytes() == want  # still exact
    assert len(list(out.glob(".corrupt-ckpt_000004-*/ckpt_000004"))) == 1  # kept for inspection

    out2 = tmp_path / "run2"
    with pytest.raises(Kill):
        train(c, token_dir, out2, log=quiet, on_step=kill_at(5))
    for s in (2, 4):
        flip_byte(out2 / f"ckpt_{s:06d}" / "model.safetensors", offset=-5)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tokenmill.lm"):
        logs = []
        r = train(c, token_dir, out2, log=logs.append, resume=True)
    warned = [rec.getMessage() for rec in caplog.records if rec.name == "tokenmill.lm"]
    assert len(warned) == 2 and "falling back to the previous checkpoint ckpt_000002" in warned[0]
    assert "ckpt_000002 is unusable" in warned[1] and "starting from scratch" in warned[1]
    assert not any("resuming" in m for m in logs) and r.steps == 8
    assert (Path(r.checkpoint_dir) / "model.safetensors").read_bytes() == want


# -- 5. verified reads ----------------------------------------------------------------------


def test_published_model_and_shards_are_verified_on_read(corpus, tmp_path, sys_tmp):
    store, tokens, tokenizer = make_store(tmp_path / "store", corpus, tmp_path / "t")
    ref = stage_run(store, tokens, tokenizer, cfg(max_steps=4))
    gpt = load_published_model(store, ref)
    want = st_load(store.read_bytes(ref.kind, ref.version, "model.safetensors"))
    assert all(torch.equal(gpt.state_dict()[k], v) for k, v in want.items())

    path = store.file_path(ref.kind, ref.version, "model.safetensors")
    size = os.path.getsize(path)
    flip_byte(path, offset=size // 2)  # same size, inside the weights
    assert os.path.getsize(path) == size
    with pytest.raises(StoreError, match=r"model/.*/model\.safetensors: sha256 mismatch"):
        load_published_model(store, ref.version)
    load_model(path)  # a bare path is the caller's own file: loaded unchecked, as documented

    shard = store.file_path(tokens.kind, tokens.version, "shard_000001.npy")
    flip_byte(shard, offset=os.path.getsize(shard) - 3)
    with pytest.raises(StoreError, match=r"tokens/tokens-test/shard_000001\.npy: sha256 mismatch"):
        stage_run(store, tokens, tokenizer, cfg(max_steps=5))


def test_own_token_dir_is_hashed_unless_opted_out(corpus, tmp_path):
    tok, docs = corpus
    d = write_token_dir(tmp_path / "own", [docs[:40], docs[40:80]], tok.vocab_size, tok.special_tokens["<|endoftext|>"])
    flip_byte(d / "shard_000000.npy", offset=-2)
    with pytest.raises(ShardError, match=r"shard_000000\.npy"):
        train(cfg(max_steps=2), d, tmp_path / "run", log=quiet)
    r = train(cfg(max_steps=2, verify_shards=False), d, tmp_path / "run2", log=quiet)  # sizes only
    assert r.steps == 2


def test_sampling_refuses_non_finite_logits():
    from pipeline_lib.lm import GPT, GPTConfig, sample

    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=1, n_embd=8)).eval()
    with torch.no_grad():
        m.transformer.wte.weight[3, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="non-finite logits"):
        sample(m, [3], 5, seed=0)


# -- 6. one producer per version ------------------------------------------------------------


def test_concurrent_runs_train_once(corpus, tmp_path, sys_tmp, monkeypatch, caplog):
    store, tokens, tokenizer = make_store(tmp_path / "store", corpus, tmp_path / "t")
    from pipeline_lib import lm

    calls = []
    real_train = lm.train

    def counting_train(*a, **kw):
        calls.append(threading.get_ident())
        threading.Event().wait(0.5)  # keep the claim long enough for the other run to queue on it
        return real_train(*a, **kw)

    monkeypatch.setattr(lm, "train", counting_train)
    c = cfg(max_steps=6)
    start = threading.Barrier(2)
    refs, errors = [], []

    def run():
        try:
            start.wait()
            refs.append(
                train_language_model(
                    ArtifactStore(str(tmp_path / "store")),
                    tokens,
                    tokenizer,
                    c,
                    log=quiet,
                    n_samples=1,
                    sample_tokens=8,
                )
            )
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    with caplog.at_level(logging.INFO, logger="tokenmill"):  # the engine's logger, tokenmill.stages
        threads = [threading.Thread(target=run) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert not errors, errors
    assert len(calls) == 1 and len(refs) == 2 and refs[0] == refs[1]
    assert any("published by a concurrent run" in r.getMessage() for r in caplog.records)
    assert store.exists(MODEL_KIND, refs[0].version)
