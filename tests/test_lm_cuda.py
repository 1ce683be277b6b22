"""The LM's CUDA tier: a compiled bf16 run, fused AdamW state in checkpoints, resume against
an uninterrupted run, sampling, the memory plan against the allocator's peak, the time
budget and MFU. Runs with TOKENMILL_TEST_DEVICE=cuda on a GPU; elsewhere every test is
skipped with its reason (and counted in the summary), never silently passed.

Needs torch, numpy, safetensors and pytest only: `benchmarks/gpu_check.py` runs it with
``--noconftest`` on a bare GPU image, so its fixtures are its own."""

import time

import numpy as np
import pytest
import torch

from pipeline_lib.lm.testing import TEST_DEVICE_ENV, test_device, write_token_dir

DEVICE = test_device()
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not DEVICE.startswith("cuda"), reason=f"the CUDA tier: set {TEST_DEVICE_ENV}=cuda on a GPU (it is {DEVICE!r})"
    ),
    pytest.mark.skipif(
        DEVICE.startswith("cuda") and not torch.cuda.is_available(),
        reason=f"{TEST_DEVICE_ENV}={DEVICE} but CUDA is not available",
    ),
]


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    """Random documents over a 1000-id vocabulary with a separator, 2 shards, a val split."""
    rng = np.random.default_rng(0)
    shards = [
        [rng.integers(0, 999, size=int(n)).astype(np.uint16) for n in rng.integers(50, 400, size=300)] for _ in range(2)
    ]
    return write_token_dir(
        tmp_path_factory.mktemp("tokens"), shards, vocab_size=1000, separator_id=999, val_fraction=0.1
    )


def cfg(**kw):
    from pipeline_lib.lm.config import preset

    base = dict(
        device=DEVICE,
        max_steps=12,
        eval_interval=6,
        eval_iters=2,
        log_interval=1,
        ckpt_interval=6,
        ckpt_every_s=0,
        warmup_steps=2,
    )
    base.update(kw)
    return preset("tiny", **base)


def quiet(_msg):
    pass


def test_compiled_bf16_run_learns_and_reports_mfu(tokens, tmp_path):
    from pipeline_lib.lm.trainer import train

    r = train(cfg(compile=True, max_steps=30, ckpt_interval=30), tokens, tmp_path / "run", log=quiet)
    assert r.device.startswith("cuda") and r.steps == 30
    losses = [h["train_loss"] for h in r.history if h.get("train_loss") is not None]
    assert losses[-1] < losses[0]
    assert r.mfu_measured is not None and 0 < r.mfu_measured < 1  # against the matmul rate measured at start
    assert r.mfu is None or 0 < r.mfu < 1  # None on a card the datasheet table does not know


def test_fused_adamw_state_is_checkpointed_and_loads_back(tokens, tmp_path):
    from pipeline_lib.lm.checkpoint import load_optimizer_into, open_checkpoint
    from pipeline_lib.lm.model import GPT
    from pipeline_lib.lm.trainer import train

    r = train(cfg(max_steps=6), tokens, tmp_path / "run", log=quiet)
    ckpt = open_checkpoint(r.checkpoint_dir)
    opt = ckpt.tensors("optimizer.safetensors")
    assert ckpt.json("optimizer.json")["type"] == "AdamW"
    assert any(k.endswith(".exp_avg") for k in opt) and any(k.endswith(".exp_avg_sq") for k in opt)
    model = GPT(ckpt.model_config()).to(DEVICE)
    fused = model.configure_optimizer(0.0, 1e-3, (0.9, 0.95), fused=True)
    load_optimizer_into(fused, ckpt)
    state = next(iter(fused.state.values()))
    assert state["exp_avg"].device.type == "cuda"


def test_resume_matches_the_uninterrupted_run(tokens, tmp_path):
    """Bitwise where the kernels are deterministic; CUDA's attention and matmul reductions
    may not be, so the stated tolerance is 1e-4 on the weights after 12 steps."""
    from safetensors.torch import load_file

    from pipeline_lib.lm.trainer import train

    class Kill(Exception):
        pass

    def kill_at_8(entry):
        if entry["step"] == 8:
            raise Kill

    c = cfg(dtype="float32")
    full = train(c, tokens, tmp_path / "full", log=quiet)
    with pytest.raises(Kill):
        train(c, tokens, tmp_path / "cut", log=quiet, on_step=kill_at_8)
    resumed = train(c, tokens, tmp_path / "cut", log=quiet, resume=True)
    a = load_file(f"{full.checkpoint_dir}/model.safetensors")
    b = load_file(f"{resumed.checkpoint_dir}/model.safetensors")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-4, msg=k)


def test_sampling_on_cuda_is_seeded(tokens, tmp_path):
    from pipeline_lib.lm.checkpoint import load_model
    from pipeline_lib.lm.sampling import sample
    from pipeline_lib.lm.trainer import train

    r = train(cfg(max_steps=4), tokens, tmp_path / "run", log=quiet)
    model = load_model(r.checkpoint_dir, device=DEVICE)
    one = sample(model, [999], 30, temperature=1.0, top_k=50, seed=3)
    two = sample(model, [999], 30, temperature=1.0, top_k=50, seed=3)
    assert one == two and len(one) >= 1 and max(one) < 1000


def test_memory_plan_against_the_allocator(tokens, tmp_path):
    """The plan (without allocating) against torch.cuda.max_memory_allocated for a model
    whose memory is not all fixed overheads: within 20 %."""
    from pipeline_lib.lm.plan import memory_plan
    from pipeline_lib.lm.trainer import train

    c = cfg(
        max_steps=2, n_layer=4, n_head=4, n_embd=256, block_size=256, batch_size=8, ckpt_interval=1000, eval_iters=1
    )
    torch.cuda.reset_peak_memory_stats()
    train(c, tokens, tmp_path / "run", log=quiet)
    peak = torch.cuda.max_memory_allocated()
    plan = memory_plan(c, vocab_size=1000, device="cuda", bf16=torch.cuda.is_bf16_supported())
    assert abs(plan.total_bytes - peak) <= 0.2 * peak, (plan.total_bytes, peak)


def test_time_budget_bounds_the_run(tokens, tmp_path):
    from pipeline_lib.lm.trainer import train

    budget = 8.0
    t0 = time.monotonic()
    r = train(cfg(max_steps=100_000, time_budget_s=budget, ckpt_interval=1000), tokens, tmp_path / "run", log=quiet)
    elapsed = time.monotonic() - t0
    assert r.planned_by_budget and r.steps < 100_000
    assert r.wall_s <= budget + r.longest_step_s + r.final_s, (r.wall_s, r.longest_step_s, r.final_s)
    assert elapsed - r.wall_s < 1.0
