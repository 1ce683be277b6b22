"""The GPU path, checked on the CPU: precision choice and the GradScaler path, batch
transfer, the padded vocabulary, the batch arithmetic, torch.compile, the memory plan."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from pipeline_lib.lm import GPT, GPTConfig, load_model, preset, sample, train
from pipeline_lib.lm.checkpoint import open_checkpoint, read_weights_config, weights_bytes
from pipeline_lib.lm.plan import activation_bytes, autocast_dtype, memory_plan
from pipeline_lib.lm.testing import write_byte_token_dir
from pipeline_lib.lm.trainer import _to_batch, accumulate_gradients, grad_scaler

pytestmark = pytest.mark.usefixtures("torch_one_thread")

SHAKESPEARE = Path(__file__).resolve().parents[1] / "pipeline_lib" / "data" / "tinyshakespeare.txt"


@pytest.fixture(scope="module")
def byte_dir(tmp_path_factory):
    return write_byte_token_dir(tmp_path_factory.mktemp("tokens"), SHAKESPEARE.read_bytes()[:200_000], n_shards=2)


def tiny(**kw):
    base = dict(
        device="cpu",
        max_steps=4,
        block_size=32,
        n_layer=1,
        n_embd=32,
        n_head=2,
        batch_size=4,
        eval_iters=1,
        eval_interval=100,
        ckpt_every_s=0,
    )
    return preset("tiny", **{**base, **kw})


def quiet(_msg):
    pass


# -- precision -------------------------------------------------------------------------


def test_autocast_dtype_choice():
    assert autocast_dtype("auto", "cuda", bf16_supported=True) is torch.bfloat16
    assert autocast_dtype("auto", "cuda", bf16_supported=False) is torch.float16  # V100, T4: fp16 + GradScaler
    assert autocast_dtype("auto", "cpu", bf16_supported=True) is None
    assert autocast_dtype("auto", "mps", bf16_supported=False) is None
    assert autocast_dtype("float16", "cpu", False) is torch.float16 and autocast_dtype("float32", "cuda", True) is None
    assert grad_scaler(torch.float16, torch.device("cpu")).is_enabled()
    assert (
        not grad_scaler(torch.bfloat16, torch.device("cpu")).is_enabled()
        and not grad_scaler(None, torch.device("cpu")).is_enabled()
    )


def test_a_disabled_scaler_changes_nothing():
    """The float32 / bfloat16 step goes through the scaler too: disabled, it is the plain step."""
    torch.manual_seed(0)
    a = GPT(GPTConfig(vocab_size=50, block_size=8, n_layer=1, n_head=2, n_embd=16))
    b = GPT(a.config)
    b.load_state_dict(a.state_dict())
    x = torch.randint(0, 50, (4, 9))
    opt_a, opt_b = (m.configure_optimizer(0.1, 1e-2, (0.9, 0.95)) for m in (a, b))
    scaler = grad_scaler(None, torch.device("cpu"))
    accumulate_gradients(a, x[:, :-1], x[:, 1:], 2, contextlib.nullcontext, scaler)
    scaler.unscale_(opt_a)
    scaler.step(opt_a)
    scaler.update()
    for half in (slice(0, 2), slice(2, 4)):  # by hand: two micro-batches, each loss halved
        (b(x[half, :-1], x[half, 1:], return_logits=False)[1] / 2).backward()
    opt_b.step()
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), name


def test_float16_with_grad_scaler_trains_and_resumes_exactly(byte_dir, tmp_path):
    cfg = tiny(dtype="float16", max_steps=4)
    logs = []
    full = train(cfg, byte_dir, tmp_path / "full", log=logs.append)
    assert any("fp16 autocast + GradScaler" in m for m in logs)
    assert all(math.isfinite(h["train_loss"]) for h in full.history if h["train_loss"] is not None)
    state = open_checkpoint(full.checkpoint_dir).json("trainer_state.json")
    assert state["grad_scaler"]["scale"] > 0 and "_growth_tracker" in state["grad_scaler"]  # checkpointed

    def crash_at_2(entry):
        if entry["step"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg.replace(ckpt_interval=1), byte_dir, tmp_path / "resumed", log=quiet, on_step=crash_at_2)
    resumed = train(cfg.replace(ckpt_interval=1), byte_dir, tmp_path / "resumed", log=quiet, resume=True)
    assert resumed.steps == 4
    a, b = load_model(full.checkpoint_dir), load_model(resumed.checkpoint_dir)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), name


# -- batch transfer --------------------------------------------------------------------


def test_batches_reach_a_device_by_the_non_blocking_path():
    arr = np.arange(2 * 9, dtype=np.int64).reshape(2, 9)
    x, y = _to_batch(arr, torch.device("cpu"))
    assert (
        x.dtype == torch.int64
        and torch.equal(x, torch.from_numpy(arr[:, :-1]))
        and torch.equal(y, torch.from_numpy(arr[:, 1:]))
    )
    assert x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr() == arr.ctypes.data  # to the CPU: no copy
    # another device takes the same .to(device, non_blocking=True) call (pinned first when a GPU is present)
    mx, my = _to_batch(arr, torch.device("meta"))
    assert mx.device.type == "meta" and mx.shape == (2, 8) and my.shape == (2, 8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_pinned_transfer_to_cuda():
    arr = np.random.default_rng(0).integers(0, 1000, size=(4, 33))
    x, y = _to_batch(arr, torch.device("cuda"))
    torch.cuda.synchronize()
    assert (
        x.is_cuda
        and torch.equal(x.cpu(), torch.from_numpy(arr[:, :-1]))
        and torch.equal(y.cpu(), torch.from_numpy(arr[:, 1:]))
    )


# -- the padded vocabulary -------------------------------------------------------------


def test_padded_vocabulary_is_never_in_the_loss_or_sampled(tmp_path):
    cfg = GPTConfig(vocab_size=257, block_size=16, n_layer=1, n_head=2, n_embd=16)
    assert cfg.padded_vocab_size == 320
    torch.manual_seed(0)
    m = GPT(cfg).eval()
    assert (
        m.transformer.wte.weight.shape == (320, 16)
        and m.num_params(non_embedding=False) == sum(p.numel() for p in m.parameters()) - 63 * 16
    )
    with torch.no_grad():  # padded rows that would win every softmax, were they in it
        m.transformer.wte.weight[257:] = 50 * m.transformer.ln_f.weight
    x = torch.randint(0, 257, (2, 16))
    logits, loss = m(x[:, :-1], x[:, 1:])
    assert logits.shape == (2, 15, 257)
    hidden = m.transformer.ln_f(
        m.transformer.h[0](m.transformer.drop(m.transformer.wte(x[:, :-1]) + m.transformer.wpe(torch.arange(15))))
    )
    want = F.cross_entropy((hidden @ m.transformer.wte.weight[:257].T).reshape(-1, 257), x[:, 1:].reshape(-1))
    assert loss is not None and torch.allclose(loss, want, atol=1e-5)
    ids = sample(m, [1, 2, 3], 40, temperature=1.0, top_k=None, seed=0)
    assert max(ids) < 257
    # the weights file keeps the padded table and its config; it loads back to the same logits
    path = tmp_path / "model.safetensors"
    path.write_bytes(weights_bytes(m))
    assert read_weights_config(path) == cfg
    again = load_model(path)
    assert torch.equal(again(x[:, :-1], x[:, 1:])[0], logits)


def test_weights_written_before_padding_still_load():
    assert (
        GPTConfig.from_dict(
            {"vocab_size": 257, "block_size": 8, "n_layer": 1, "n_head": 1, "n_embd": 8}
        ).padded_vocab_size
        == 257
    )
    assert GPTConfig(vocab_size=257).to_dict()["pad_vocab_to"] == 64


# -- the batch arithmetic --------------------------------------------------------------


def test_tokens_per_step_do_not_depend_on_the_world_size():
    cfg = preset("gpt2-124m")
    assert cfg.total_batch_tokens == 524288 and cfg.accum_steps == 32 and cfg.tokens_per_step == 524288
    assert [cfg.micro_steps_per_rank(n) for n in (1, 2, 8)] == [32, 16, 4]
    with pytest.raises(ValueError, match="do not divide among 3 ranks"):
        cfg.micro_steps_per_rank(3)
    small = preset("small", grad_accum_steps=4)
    assert small.tokens_per_step == 16 * 128 * 4 and small.micro_steps_per_rank(2) == 2
    assert preset("gpt2-124m", grad_accum_steps=8).total_batch_tokens is None  # an explicit count replaces the total
    with pytest.raises(ValueError, match="not a multiple of batch_size"):
        preset("small", total_batch_tokens=1000)
    with pytest.raises(ValueError, match="not both"):
        preset("small", total_batch_tokens=4096).replace(grad_accum_steps=2, total_batch_tokens=4096)


def test_a_run_warns_when_it_spans_many_epochs(byte_dir, tmp_path):
    logs = []
    r = train(tiny(max_steps=2, batch_size=64, block_size=64), byte_dir, tmp_path / "big-step", log=logs.append)
    assert not any("epochs" in m for m in r.messages)
    r = train(
        tiny(max_steps=2, batch_size=64, block_size=256, total_batch_tokens=64 * 256 * 2),
        byte_dir,
        tmp_path / "huge",
        log=logs.append,
    )
    assert any("one optimizer step draws 32,768 tokens" in m for m in r.messages)
    cfg = tiny(max_steps=40_000, time_budget_s=None)
    from pipeline_lib.lm.trainer import _epoch_warnings

    assert any("epochs" in m for m in _epoch_warnings(cfg, cfg.tokens_per_step, 180_000, "tokens version v"))


# -- torch.compile ---------------------------------------------------------------------


def test_the_model_compiles_to_one_graph_with_the_eager_loss():
    """torch.compile's graph capture (dynamo + AOT autograd, no code generation) of the
    model: the same loss and gradients as eager. Code generation: the slow test below."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=100, block_size=16, n_layer=2, n_head=2, n_embd=32))
    x = torch.randint(0, 100, (3, 17))
    _, eager = m(x[:, :-1], x[:, 1:])
    eager.backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
    _, loss = compiled(x[:, :-1], x[:, 1:])
    loss.backward()
    assert torch.allclose(loss, eager, atol=1e-6)
    for n, p in m.named_parameters():
        assert torch.allclose(p.grad, grads[n], atol=1e-6), n


@pytest.mark.slow
def test_compiled_training_matches_eager(byte_dir, tmp_path):
    """torch.compile with inductor (C++ code generation on the CPU): the losses of a short
    run within float tolerance of eager's."""
    torch._dynamo.reset()
    eager = train(tiny(max_steps=3, log_interval=1), byte_dir, tmp_path / "eager", log=quiet)
    compiled = train(tiny(max_steps=3, log_interval=1, compile=True), byte_dir, tmp_path / "compiled", log=quiet)
    a = [h["train_loss"] for h in eager.history if h["train_loss"] is not None]
    b = [h["train_loss"] for h in compiled.history if h["train_loss"] is not None]
    assert len(a) == len(b) == 3 and np.allclose(a, b, rtol=1e-4), (a, b)


# -- the memory plan -------------------------------------------------------------------


def test_memory_plan_of_gpt2_124m_allocates_nothing():
    plan = memory_plan(preset("gpt2-124m"), 50257, "cuda", world_size=8)
    assert plan.n_params == 124_439_808 and plan.n_tensor_values == 124_439_808 + 47 * 768
    assert (
        plan.params_bytes == plan.grads_bytes == 4 * plan.n_tensor_values
        and plan.optimizer_bytes == 8 * plan.n_tensor_values
    )
    assert plan.tokens_per_step == 524288 and plan.micro_steps_per_rank == 4 and plan.precision == "bf16 autocast"
    assert 5 << 30 < plan.activations_bytes < 15 << 30  # 16 x 1024 windows of a 12-layer, 768-wide model
    assert memory_plan(preset("gpt2-124m"), 50257, "cuda", bf16=False).precision == "fp16 autocast + GradScaler"
    text = "\n".join(plan.lines())
    assert (
        "parameters" in text
        and "AdamW state" in text
        and "activations" in text
        and "total" in text
        and "524,288" in text
    )


def test_activation_estimate_bounds_what_autograd_keeps():
    """The plan's activation bytes against the tensors autograd saves for backward in one
    float32 micro-batch of the "small" model on the CPU: the estimate is an upper bound,
    within 2x."""
    cfg = preset("small", vocab_size=4096, batch_size=4)
    model = GPT(cfg.model)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    x = torch.randint(0, 4096, (cfg.batch_size, cfg.model.block_size + 1))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x[:, :-1], x[:, 1:], return_logits=False)  # the loss path training takes
    measured = sum(kept.values())
    estimate = activation_bytes(cfg, act_bytes=4, fused_attention=True)
    assert measured <= estimate <= 2 * measured, (measured, estimate)


def test_plan_command(capsys):
    from pipeline_lib.lm.__main__ import main

    assert main(["plan", "--preset", "gpt2-124m", "--device", "cuda", "--world-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "16 windows x 16 micro-steps x 2 rank(s)" in out and "GiB" in out
    assert main(["plan", "--preset", "gpt2-124m", "--world-size", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "python -m pipeline_lib.lm plan: error: 32 micro-steps per optimizer step do not divide among 3 ranks: "
    ) + ("set grad_accum_steps (or total_batch_tokens) to a multiple of the world size")
    assert main(["plan", "--preset", "tiny", "--batch-size", "0"]) == 2
    assert capsys.readouterr().err.strip().endswith("(set with --batch-size)")


def test_micro_batch_fitted_to_the_memory_keeps_the_tokens_per_step():
    from pipeline_lib.lm.plan import fit_micro_batch, memory_plan

    cfg = preset("gpt2-124m", vocab_size=50257)
    rows = cfg.batch_size * cfg.accum_steps  # 512 windows per step
    b80 = fit_micro_batch(cfg, 80 << 30)
    assert b80 > cfg.batch_size and rows % b80 == 0
    fitted = cfg.replace(batch_size=b80, grad_accum_steps=rows // b80)
    assert fitted.tokens_per_step == cfg.tokens_per_step
    assert memory_plan(fitted).total_bytes <= 0.75 * (80 << 30)
    bigger = cfg.replace(batch_size=2 * b80, grad_accum_steps=rows // (2 * b80))
    assert 2 * b80 > rows or memory_plan(bigger).total_bytes > 0.75 * (80 << 30)  # the largest that fits
    assert fit_micro_batch(cfg, 140 << 30) >= b80
    assert fit_micro_batch(cfg, 1 << 30) == cfg.batch_size  # nothing larger fits: the configured one


def test_mfu_against_the_datasheet_and_the_measured_rate():
    from pipeline_lib.lm.perf import Peak, measure_matmul_flops

    rate = measure_matmul_flops(torch.device("cpu"), torch.float32, n=64, reps=2)
    assert rate > 0
    p = Peak("H100 SXM", 989e12, 782e12)
    m = p.mfu(flops_per_token=6e9, tokens_per_s=50_000, world_size=1)
    assert m["mfu"] == pytest.approx(6e9 * 5e4 / 989e12) and m["mfu_measured"] == pytest.approx(6e9 * 5e4 / 782e12)
    unknown = Peak("Some Future GPU", None, 500e12)
    assert unknown.mfu(6e9, 5e4, 1)["mfu"] is None and "not in the datasheet table" in unknown.describe()
