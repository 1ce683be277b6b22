"""DDP on the CPU: two processes on the gloo backend compute the gradient one process
computes for the same total batch, and a 2-rank training run follows the 1-process one."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from pipeline_lib.lm import GPT, TokenShards, WindowSampler, load_model, preset, train
from pipeline_lib.lm.testing import write_byte_token_dir
from pipeline_lib.lm.trainer import _to_batch, accumulate_gradients, grad_scaler

pytestmark = pytest.mark.usefixtures("torch_one_thread")

SHAKESPEARE = Path(__file__).resolve().parents[1] / "pipeline_lib" / "data" / "tinyshakespeare.txt"
WORLD = 2


@pytest.fixture(scope="module")
def byte_dir(tmp_path_factory):
    return write_byte_token_dir(tmp_path_factory.mktemp("tokens"), SHAKESPEARE.read_bytes()[:100_000], n_shards=2)


def tiny(**kw):
    base = dict(
        device="cpu",
        max_steps=3,
        block_size=32,
        n_layer=1,
        n_embd=32,
        n_head=2,
        batch_size=4,
        grad_accum_steps=4,
        eval_iters=2,
        ckpt_every_s=0,
    )
    return preset("tiny", **{**base, **kw})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_step_gradient(model, shards: TokenShards, cfg, rank: int, world: int) -> torch.nn.Module:
    """What the trainer does for one step's gradient: this rank's slice, accumulated."""
    split = shards.split(None, cfg.model.block_size + 1)
    sampler = WindowSampler(
        shards, split.train, cfg.model.block_size + 1, cfg.batch_size * cfg.accum_steps, seed=[cfg.seed, 0, 0]
    )
    micro = cfg.micro_steps_per_rank(world)
    x, y = _to_batch(
        sampler.next_batch(slice(rank * micro * cfg.batch_size, (rank + 1) * micro * cfg.batch_size)),
        torch.device("cpu"),
    )
    accumulate_gradients(model, x, y, micro, contextlib.nullcontext, grad_scaler(None, torch.device("cpu")))
    return model


def _worker(rank: int, ports: tuple[int, int], data_dir: str, out: str) -> None:
    """One rank: one step's gradient under DDP, then a training run (the trainer creating
    the process group from the environment, as under torchrun)."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(ports[0]), RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(1)
    cfg = tiny()
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    model = None
    try:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(GPT(cfg.model.with_vocab(257)))
        _one_step_gradient(model, TokenShards(data_dir), cfg, rank, WORLD)
        if rank == 0:
            save_file({n: p.grad.contiguous() for n, p in model.module.named_parameters()}, f"{out}/grad.safetensors")
    finally:
        # The DDP wrapper holds the group: dropped first, the group dies inside
        # destroy_process_group, not in a later collection that deadlocks with gloo's threads.
        model = None
        gc.collect()
        dist.destroy_process_group()
    os.environ["MASTER_PORT"] = str(ports[1])
    result = train(cfg, data_dir, f"{out}/run", log=lambda _m: None)
    if rank == 0:
        Path(out, "result.json").write_text(json.dumps({"history": result.history, "steps": result.steps}))


@pytest.fixture(scope="module")
def ddp_out(byte_dir, tmp_path_factory):
    """Two ranks on gloo, each a fresh interpreter (spawned: forking a test process that
    already runs Prefect's and torch's threads can leave a child stuck or dead): their
    gradient of one step and their training run."""
    out = tmp_path_factory.mktemp("ddp")
    mp.start_processes(
        _worker,
        args=((_free_port(), _free_port()), str(byte_dir), str(out)),
        nprocs=WORLD,
        join=True,
        start_method="spawn",
    )
    return out


def test_two_ranks_compute_the_one_process_gradient(byte_dir, ddp_out):
    ddp = load_file(str(ddp_out / "grad.safetensors"))
    torch.manual_seed(0)
    single = _one_step_gradient(GPT(tiny().model.with_vocab(257)), TokenShards(byte_dir), tiny(), rank=0, world=1)
    for name, p in single.named_parameters():
        assert p.grad is not None and torch.allclose(ddp[name], p.grad, rtol=1e-4, atol=1e-7), name
    assert any(float(g.abs().max()) > 0 for g in ddp.values())


def test_a_two_rank_run_follows_the_one_process_run(byte_dir, ddp_out, tmp_path):
    one = train(tiny(), byte_dir, tmp_path / "one", log=lambda _m: None)
    two = json.loads((ddp_out / "result.json").read_text())
    assert two["steps"] == one.steps == 3
    loss_one = [h["train_loss"] for h in one.history if h["train_loss"] is not None]
    loss_two = [h["train_loss"] for h in two["history"] if h["train_loss"] is not None]
    assert np.allclose(loss_one, loss_two, rtol=1e-4), (loss_one, loss_two)  # same windows, same weights, step by step
    val_one = [h["val_loss"] for h in one.history if h.get("val_loss") is not None]
    val_two = [h["val_loss"] for h in two["history"] if h.get("val_loss") is not None]
    # the same val batches, split between ranks
    assert len(val_one) == 2 and np.allclose(val_one, val_two, rtol=1e-4), (val_one, val_two)
    assert np.isclose(one.history[-1]["train_eval_loss"], two["history"][-1]["train_eval_loss"], rtol=1e-4)
    ckpt = sorted((ddp_out / "run").glob("ckpt_*"))[-1]
    state = json.loads((ckpt / "data_state.json").read_text())
    assert state["world_size"] == 2 and state["samplers"][0] == state["samplers"][1]  # one data order, shared
    trainer = json.loads((ckpt / "trainer_state.json").read_text())
    assert trainer["tokens_per_step"] == 4 * 32 * 4  # batch x context x micro-steps, whatever the world size
    a, b = load_model(one.checkpoint_dir), load_model(ckpt)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.allclose(pa, pb, atol=1e-4), name
