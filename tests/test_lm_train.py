"""Training: loss falls, exact resume, checkpoints, DDP (gloo, world size 1), bits/byte."""

import importlib
import json
import math
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from pipeline_lib.lm import (
    GPT,
    CheckpointError,
    GPTConfig,
    TokenShards,
    bits_per_byte,
    evaluate,
    latest_checkpoint,
    list_checkpoints,
    load_model,
    lr_at,
    preset,
    train,
)
from pipeline_lib.lm.checkpoint import load_optimizer_into, open_checkpoint
from pipeline_lib.lm.testing import byte_token_lengths, test_device, write_byte_token_dir, write_token_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

SHAKESPEARE = Path(__file__).resolve().parents[1] / "pipeline_lib" / "data" / "tinyshakespeare.txt"


@pytest.fixture(scope="module")
def byte_dir(tmp_path_factory):
    """Tiny Shakespeare as raw-byte tokens (vocab 256 + separator), 2 uint16 shards."""
    return write_byte_token_dir(tmp_path_factory.mktemp("tokens"), SHAKESPEARE.read_bytes(), n_shards=2)


def tiny(**kw):
    base = dict(device=test_device(), log_interval=1, eval_iters=2, eval_interval=1000, ckpt_interval=1000)
    base.update(kw)
    return preset("tiny", **base)


def quiet(_msg):
    pass


def test_small_cpu_model_trains_on_one_thread_and_gives_the_count_back(byte_dir, tmp_path, monkeypatch):
    """The rule sampling follows: one intra-op thread under ONE_THREAD_BELOW parameters on the
    CPU, torch's own count again afterwards; a larger model keeps torch's count."""
    # the module (the package's `sample` is the function)
    lm_sample = importlib.import_module("pipeline_lib.lm.sampling")

    torch.set_num_threads(2)
    seen = []
    train(
        tiny(max_steps=2),
        byte_dir,
        tmp_path / "small",
        log=quiet,
        on_step=lambda _e: seen.append(torch.get_num_threads()),
    )
    assert seen == [1, 1] and torch.get_num_threads() == 2
    monkeypatch.setattr(lm_sample, "ONE_THREAD_BELOW", 0)  # every model is "large" now
    seen.clear()
    train(
        tiny(max_steps=2),
        byte_dir,
        tmp_path / "large",
        log=quiet,
        on_step=lambda _e: seen.append(torch.get_num_threads()),
    )
    assert seen == [2, 2] and torch.get_num_threads() == 2


def test_loss_falls(byte_dir, tmp_path):
    cfg = tiny(max_steps=30, eval_interval=15, eval_iters=4, warmup_steps=5, learning_rate=1e-2, min_lr=1e-3)
    evals = []
    r = train(cfg, byte_dir, tmp_path / "run", token_byte_lengths=byte_token_lengths(), log=quiet, on_eval=evals.append)
    assert [e["step"] for e in evals] == [0, 15, 30]
    first_val, last_val = evals[0]["val_loss"], evals[-1]["val_loss"]
    assert abs(first_val - math.log(257)) < 0.1  # uniform-ish at init
    assert last_val < first_val - 1.5, (first_val, last_val)
    losses = [h["train_loss"] for h in r.history if h["train_loss"] is not None]
    assert len(losses) == 30 and np.mean(losses[-5:]) < losses[0] - 1.5
    assert r.steps == 30 and r.final_val_loss == last_val
    # the final train loss is the train split on eval_iters fixed batches, like val, not the last batch
    assert r.final_train_loss == r.history[-1]["train_eval_loss"] == evals[-1]["train_eval_loss"] != losses[-1]
    # one byte per text token, separators out of both sums: bits/byte is the text targets' nats / ln 2
    assert r.val_bpb is not None and 0 < r.val_bpb < first_val / math.log(2) - 1.5
    assert r.tokens_per_s and r.tokens_per_s > 0 and r.mfu is None
    assert set(r.history[-1]) >= {"step", "train_loss", "val_loss", "val_bpb", "lr", "tokens_per_s"}
    assert Path(r.checkpoint_dir).name == "ckpt_000030"


def _weights(path):
    return load_file(str(Path(path) / "model.safetensors"))


def test_exact_resume_with_dropout(byte_dir, tmp_path):
    cfg = tiny(
        max_steps=12, dropout=0.1, grad_accum_steps=2, ckpt_interval=4, keep_last=2, eval_interval=4, warmup_steps=3
    )
    full = train(cfg, byte_dir, tmp_path / "full", log=quiet)
    assert [s for s, _ in list_checkpoints(tmp_path / "full")] == [8, 12]  # keep_last=2

    class Crash(Exception):
        pass

    def crash_at_7(entry):
        if entry["step"] == 7:
            raise Crash

    with pytest.raises(Crash):
        train(cfg, byte_dir, tmp_path / "cut", log=quiet, on_step=crash_at_7)
    assert latest_checkpoint(tmp_path / "cut").name == "ckpt_000004"
    with pytest.raises(ValueError, match="already holds checkpoint"):
        train(cfg, byte_dir, tmp_path / "cut", log=quiet)
    logs = []
    resumed = train(cfg, byte_dir, tmp_path / "cut", log=logs.append, resume=True)
    assert any("resuming at step 4" in m for m in logs)

    def strip(h):
        return [(e["step"], e["train_loss"], e["val_loss"], e["val_bpb"], e["lr"]) for e in h]

    assert strip(resumed.history) == strip(full.history)  # bitwise equal losses
    a, b = _weights(full.checkpoint_dir), _weights(resumed.checkpoint_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.steps == 12 and resumed.final_val_loss == full.final_val_loss


def test_checkpoint_loads_back(byte_dir, tmp_path):
    cfg = tiny(max_steps=3)
    r = train(cfg, byte_dir, tmp_path / "run", log=quiet)
    ckpt = Path(r.checkpoint_dir)
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(
        [
            "model.safetensors",
            "optimizer.safetensors",
            "optimizer.json",
            "trainer_state.json",
            "rng_state.safetensors",
            "rng_state.json",
            "data_state.json",
            "checkpoint.json",
        ]
    )
    m = load_model(tmp_path / "run")
    assert not m.training and m.lm_head.weight is m.transformer.wte.weight
    saved = _weights(ckpt)
    state = m.state_dict()
    assert all(torch.equal(state[k], v) for k, v in saved.items())
    assert torch.equal(state["lm_head.weight"], saved["transformer.wte.weight"])
    assert m.config == GPTConfig(vocab_size=257, block_size=64, n_layer=2, n_head=2, n_embd=64)
    # the optimizer state goes back in too
    c = open_checkpoint(ckpt)
    opt = m.configure_optimizer(0.0, 1e-3, (0.9, 0.95))
    load_optimizer_into(opt, c)
    saved_opt = c.tensors("optimizer.safetensors")
    p0 = opt.param_groups[0]["params"][0]
    assert torch.equal(opt.state[p0]["exp_avg"], saved_opt["state.0.exp_avg"])
    assert float(opt.state[p0]["step"]) == 3
    data = json.loads((ckpt / "data_state.json").read_text())
    assert data["step"] == 3 and data["samplers"][0]["bit_generator"] == "PCG64"


def test_incomplete_and_corrupt_checkpoints(byte_dir, tmp_path):
    out = tmp_path / "run"
    r = train(tiny(max_steps=2), byte_dir, out, log=quiet)
    good = Path(r.checkpoint_dir)
    # an interrupted later save: a directory without the completion marker, and a temp dir
    (out / "ckpt_000009").mkdir()
    (out / "ckpt_000009" / "model.safetensors").write_bytes(b"partial")
    (out / ".tmp-ckpt_000010-abc").mkdir()
    assert latest_checkpoint(out) == good
    load_model(out)  # uses the complete one

    bad = out / "ckpt_000009"
    (bad / "checkpoint.json").write_text("{not json")
    assert latest_checkpoint(out) == good
    with pytest.raises(CheckpointError, match=r"ckpt_000009/checkpoint\.json: not valid JSON"):
        load_model(bad)

    weights = good / "model.safetensors"
    blob = weights.read_bytes()
    weights.write_bytes(blob[:-100])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: .*truncated"):
        load_model(out)
    weights.write_bytes(blob[:-1] + bytes([blob[-1] ^ 0xFF]))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: sha256 mismatch"):
        load_model(good)
    rng = good / "rng_state.json"
    rng_blob = rng.read_bytes()
    rng.unlink()
    with pytest.raises(CheckpointError, match=r"rng_state\.json: missing"):
        open_checkpoint(good, verify=False)
    rng.write_bytes(rng_blob)
    # resume heals instead of failing: the corrupt (only) checkpoint is moved aside, training restarts
    logs = []
    r = train(tiny(max_steps=4), byte_dir, out, log=logs.append, resume=True)
    assert any("ckpt_000002 is unusable" in m and "starting from scratch" in m for m in logs)
    assert r.steps == 4 and not any("resuming" in m for m in logs)
    assert [s for s, _ in list_checkpoints(out)][-1] == 4
    assert len(list(out.glob(".corrupt-ckpt_000002-*/ckpt_000002"))) == 1


def test_resume_over_incomplete_dir(byte_dir, tmp_path):
    out = tmp_path / "run"
    train(tiny(max_steps=2, ckpt_interval=2), byte_dir, out, log=quiet)
    (out / "ckpt_000004").mkdir()  # left by a crash during the save of step 4
    r = train(tiny(max_steps=4, ckpt_interval=2), byte_dir, out, log=quiet, resume=True)
    assert Path(r.checkpoint_dir) == out / "ckpt_000004"
    assert [s for s, _ in list_checkpoints(out)] == [2, 4]
    open_checkpoint(out / "ckpt_000004")
    assert sorted(p.name for p in out.iterdir()) == ["ckpt_000002", "ckpt_000004"]


def test_resume_without_checkpoint_starts_fresh_and_bf16_autocast(byte_dir, tmp_path):
    logs = []
    r = train(tiny(max_steps=2, dtype="bfloat16"), byte_dir, tmp_path / "run", log=logs.append, resume=True)
    assert any("starting from scratch" in m for m in logs) and "bf16 autocast" in logs[1]
    assert math.isfinite(r.final_train_loss)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_world_size_1_gloo(byte_dir, tmp_path):
    cfg = tiny(max_steps=4, grad_accum_steps=2, dropout=0.1, eval_interval=2, ckpt_interval=2)
    plain = train(cfg, byte_dir, tmp_path / "plain", log=quiet)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        logs = []
        ddp = train(cfg, byte_dir, tmp_path / "ddp", log=logs.append)
        assert dist.is_initialized()  # a caller's process group is left alone
    finally:
        dist.destroy_process_group()
    assert "DDP x1" in logs[0]
    for a, b in zip(plain.history, ddp.history):
        assert a["step"] == b["step"]
        for k in ("train_loss", "val_loss"):
            if a[k] is None:
                assert b[k] is None
            else:
                assert b[k] == pytest.approx(a[k], rel=1e-5)
    state = json.loads((Path(ddp.checkpoint_dir) / "data_state.json").read_text())
    assert state["world_size"] == 1 and len(state["samplers"]) == 1


def test_bits_per_byte_hand_checked(tmp_path):
    assert bits_per_byte(8 * math.log(2), 4) == pytest.approx(2.0)
    # vocab 4, every token is id 1 (2 bytes); the manifest claims 4 bytes per token.
    d = write_token_dir(
        tmp_path / "t", [[np.ones(100, dtype=np.int64)]], vocab_size=4, separator_id=None, n_bytes=[400]
    )
    ds = TokenShards(d)
    model = GPT(GPTConfig(vocab_size=4, block_size=8, n_layer=1, n_head=1, n_embd=8))
    with torch.no_grad():
        model.transformer.wte.weight.zero_()  # tied: logits are all 0 -> uniform, ln 4 nats/token
    kw = dict(block_size=8, batch_size=3, eval_iters=2, seed=0, device=torch.device("cpu"))
    exact = evaluate(model, ds, ds.split(0.0, 9).train, token_byte_lengths=torch.tensor([0, 2, 5, 7]), **kw)
    assert exact["val_loss"] == pytest.approx(math.log(4))
    assert exact["val_tokens"] == 2 * 3 * 8 and exact["val_bytes"] == 2 * 48
    assert exact["val_bpb"] == pytest.approx(1.0)  # 2 bits per token / 2 bytes per token
    approx = evaluate(model, ds, ds.split(0.0, 9).train, bytes_per_token=ds.bytes_per_text_token, **kw)
    assert approx["val_bpb"] == pytest.approx(0.5)  # 2 bits / 4 bytes (manifest ratio)


def test_bits_per_byte_leaves_the_separator_out(tmp_path):
    # documents of 3 tokens (id 1, 2 bytes each) + separator 3: a quarter of the targets are the separator
    d = write_token_dir(
        tmp_path / "t", [[np.ones(3, dtype=np.int64)] * 30], vocab_size=4, separator_id=3, n_bytes=[180]
    )
    ds = TokenShards(d)
    model = GPT(GPTConfig(vocab_size=4, block_size=8, n_layer=1, n_head=1, n_embd=8))
    with torch.no_grad():
        model.transformer.wte.weight.zero_()  # uniform: ln 4 nats for every target, the separator's too
    kw = dict(block_size=8, batch_size=3, eval_iters=2, seed=0, device=torch.device("cpu"), separator_id=3)
    exact = evaluate(model, ds, ds.split(0.0, 9).train, token_byte_lengths=torch.tensor([0, 2, 2, 0]), **kw)
    assert exact["val_loss"] == pytest.approx(math.log(4))  # every target, as nanoGPT's loss
    assert exact["val_bpb"] == pytest.approx(1.0)  # 2 bits per text token / 2 bytes: the separators' nats left out
    assert ds.bytes_per_text_token == pytest.approx(2.0)
    approx = evaluate(model, ds, ds.split(0.0, 9).train, bytes_per_token=ds.bytes_per_text_token, **kw)
    assert approx["val_bpb"] == pytest.approx(1.0)
    counted = evaluate(
        model, ds, ds.split(0.0, 9).train, token_byte_lengths=torch.tensor([0, 2, 2, 0]), **{**kw, "separator_id": None}
    )
    assert counted["val_bpb"] > 1.2  # what counting the separators' nats over the text's bytes gave


def test_empty_val_is_reported(tmp_path):
    d = write_token_dir(tmp_path / "t", [[np.arange(200) % 50]], vocab_size=64, separator_id=63)
    logs = []
    with pytest.warns(UserWarning, match="val split is EMPTY"):
        r = train(tiny(max_steps=2), d, tmp_path / "run", log=logs.append)
    assert any("val split is EMPTY" in m for m in logs) and any("EMPTY" in m for m in r.messages)
    assert all(str(d) not in m and "tokens version test" in m for m in r.messages)  # no local path in metrics
    assert r.final_val_loss is None and r.val_bpb is None and r.final_train_loss is not None


def test_lr_schedule():
    cfg = preset("tiny", max_steps=100, warmup_steps=10, learning_rate=1.0, min_lr=0.1)
    assert lr_at(0, cfg) == pytest.approx(1 / 11)
    assert lr_at(9, cfg) == pytest.approx(10 / 11)
    assert lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(55, cfg) == pytest.approx(0.55)  # halfway down the cosine
    assert lr_at(100, cfg) == lr_at(500, cfg) == pytest.approx(0.1)
    lrs = [lr_at(s, cfg) for s in range(10, 101)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
