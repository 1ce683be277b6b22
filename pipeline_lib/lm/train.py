"""The training loop: one function, `train`, read top to bottom.

    setup (distributed, device, data, model, optimizer, resume)
    eval at step 0
    for each optimizer step:
        lr from the schedule (linear warmup, cosine to min_lr)
        accum_steps / world_size micro-steps on each rank: its slice of the step's windows,
        forward under autocast, loss / micro-steps, backward (through the GradScaler: a
        no-op unless float16)
        (DDP averages the ranks' gradients: the mean over all of the step's windows)
        (DDP: gradients all-reduced only on the last micro-step, via no_sync on the others)
        unscale, clip grads to grad_clip, AdamW step
        log (train loss, lr, tokens/s, MFU); eval (val loss, bits/byte); checkpoint

Distributed: launched by torchrun (RANK / WORLD_SIZE / LOCAL_RANK in the environment) the
process group is created here (NCCL on CUDA, else gloo); if the caller already created
one it is used as is. An optimizer step is `TrainConfig.tokens_per_step` tokens whatever
the world size: every rank draws the step's windows from one shared seed and takes its
slice (`micro_steps_per_rank` micro-steps of batch_size), so N ranks compute the gradient
one process would with accum_steps micro-steps. Dropout seeds are offset by rank; only
rank 0 logs and writes checkpoints (after gathering every rank's RNG and sampler state).

Precision (`autocast_dtype`): bfloat16 autocast on a GPU that has it, float16 with a
`torch.amp.GradScaler` on one that does not, float32 elsewhere. The scaler is always in
the loop, disabled (`enabled=False`: scale, unscale and update do nothing, `step` is the
optimizer's) unless float16, so the CPU runs the code path a float16 GPU does; its state
is checkpointed.

Bits per byte counts the text: the targets that are the document separator (which encodes
no bytes) are left out of its nats, as their zero bytes are of its bytes. The val loss
(nats per token) keeps every target, as nanoGPT's does.

Exact resume: a checkpoint after step k holds the weights, the optimizer state, the step,
the torch / python RNG states and the numpy sampler state of every rank. Evaluation uses
its own freshly seeded sampler and no dropout, so it consumes no training randomness; a
run resumed from step k therefore continues bitwise like the uninterrupted run (on CPU).

Checkpoint cadence: every `TrainConfig.ckpt_steps` steps (a tenth of the run unless set),
whenever `ckpt_every_s` seconds passed since the last save (the decision is shared by all
ranks through the per-step loss all-reduce), and at the last step; the newest `keep_last`
are kept. Saving reads the RNG states without drawing from them, so the cadence never
changes the result.

Time budget (`TrainConfig.time_budget_s`): the first steps are a calibration (at most
`CALIBRATION_STEPS`, and within warmup + 1 steps, whose learning rates do not depend on
the run length). After them the run commits to a step count, `plan_steps`: the most
(up to max_steps) whose remaining steps and evaluations fit in what is left of the
budget at the measured seconds per step and per evaluation. The schedule is stretched
over that count (`stretch_schedule`: same warmup, cosine decay ending at the new last
step), so the weights are those of a run configured with that many steps from the
start. The plan is decided once: rank 0 decides, every rank follows; it is written to
``plan.json`` in out_dir and into every later checkpoint (``planned_steps``), and a
resumed run takes it from there instead of measuring again. Which count a budget buys
depends on the machine, so the step count reached is part of what a run publishes.

Self-healing resume: the newest checkpoint that passes its marker's sha256 checks and
parses is used; a corrupt one is moved aside (``.corrupt-ckpt_*``) with a warning on the
"tokenmill.lm" logger naming the fallback (the previous checkpoint, or a fresh start).

Reproducible files: checkpoints hold no timings, paths or other run-dependent values
(`RUN_KEYS` are stripped from the history they store), so a run and its resumed twin
write the same bytes. Timings stay in `TrainResult` and the log.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import math
import os
import random
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from pipeline_lib.errors import CheckpointError
from pipeline_lib.lm.checkpoint import (
    _json_bytes,
    latest_checkpoint,
    list_checkpoints,
    load_optimizer_state,
    load_state_into,
    open_checkpoint,
    optimizer_files,
    quarantine_checkpoint,
    safetensors_bytes,
    weights_bytes,
    write_checkpoint,
)
from pipeline_lib.lm.config import GPTConfig, TrainConfig
from pipeline_lib.lm.data import Region, TokenShards, WindowSampler
from pipeline_lib.lm.model import GPT
from pipeline_lib.lm.sample import one_thread_for

LogFn = Callable[[str], None]
EventFn = Callable[[dict[str, Any]], None]

_log = logging.getLogger("tokenmill.lm")
_clock = time.monotonic  # the checkpoint time cadence's clock (a module global for tests)
_budget_clock = time.monotonic  # the time budget's clock (likewise)
CALIBRATION_STEPS = 10  # most steps measured before a time-budgeted run is planned
PLAN_FILE = "plan.json"  # in out_dir: the step plan of a time-budgeted run

# History entry keys that measure the run rather than the model: kept in memory and in the
# log, stripped from every file (checkpoints, published history) by `versioned_history`.
RUN_KEYS = ("tokens_per_s", "mfu")


def versioned_history(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history without `RUN_KEYS`: the same for every run of the same training."""
    return [{k: v for k, v in h.items() if k not in RUN_KEYS} for h in history]


# Dense bf16 tensor-core peak FLOP/s by GPU name (first substring match wins).
PEAK_FLOPS_BF16: list[tuple[str, float]] = [
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("H200", 989e12),
    ("GH200", 989e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
]


@dataclass
class TrainResult:
    final_train_loss: float | None  # train split at the last step, on eval_iters fixed batches like val
    final_val_loss: float | None  # last evaluation (None if there is no val split)
    val_bpb: float | None  # bits per byte at the last evaluation
    steps: int  # optimizer steps completed (including those before a resume)
    tokens_per_s: float | None  # training throughput of this invocation, all ranks
    history: list[dict[str, Any]]  # {step, train_loss, val_loss, val_bpb, lr, tokens_per_s, mfu}
    checkpoint_dir: str | None  # the last checkpoint written / resumed from
    n_params: int = 0
    mfu: float | None = None  # model FLOPs utilisation of this invocation (CUDA only)
    device: str = "cpu"
    messages: list[str] = field(default_factory=list)  # warnings about the data (e.g. empty val split)
    run_messages: list[str] = field(default_factory=list)  # about this invocation (resume fallbacks)
    max_steps: int | None = None  # the step count the run was planned to (the budget's plan, else max_steps)
    planned_by_budget: bool = False  # max_steps came from the time budget's plan


# -- small pieces ------------------------------------------------------------------------


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to learning_rate over warmup_steps, then cosine decay to min_lr."""
    if step < cfg.warmup_steps:
        return cfg.learning_rate * (step + 1) / (cfg.warmup_steps + 1)
    if step >= cfg.decay_steps:
        return cfg.min_lr
    ratio = (step - cfg.warmup_steps) / (cfg.decay_steps - cfg.warmup_steps)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return cfg.min_lr + coeff * (cfg.learning_rate - cfg.min_lr)


def plan_steps(cfg: TrainConfig, *, done: int, elapsed_s: float, step_s: float, eval_s: float, evals: bool = True) -> int:
    """The step count a time-budgeted run commits to, `done` steps and `elapsed_s` seconds in.

    The largest count up to cfg.max_steps for which the remaining steps (`step_s` each)
    and evaluations (`eval_s` each: every eval_interval steps when `evals`, at the last
    step, and the train split's at the last step) fit in what is left of
    cfg.time_budget_s. At least 2 * (warmup_steps + 1), a decay as long as the warmup, so
    the schedule completes even when a budget too small for that is overrun.
    """
    if cfg.time_budget_s is None:
        raise ValueError("plan_steps needs a TrainConfig with time_budget_s")
    left = cfg.time_budget_s - elapsed_s
    every = cfg.eval_interval

    def cost(n: int) -> float:
        n_evals = (n // every - done // every + (n % every != 0)) if evals else 0
        return (n - done) * step_s + (n_evals + 1) * eval_s

    lo, hi = min(cfg.max_steps, max(done, 2 * (cfg.warmup_steps + 1))), cfg.max_steps
    if cost(lo) > left:
        return lo
    while lo < hi:  # cost grows with n: the largest n that fits
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if cost(mid) <= left else (lo, mid - 1)
    return lo


def stretch_schedule(cfg: TrainConfig, steps: int) -> TrainConfig:
    """`cfg` planned to `steps` optimizer steps: the same warmup, and the cosine decay
    ending at the new last step (an explicit lr_decay_steps is scaled with the run)."""
    if steps == cfg.max_steps:
        return cfg
    decay = None
    w = cfg.warmup_steps
    if cfg.lr_decay_steps is not None and cfg.max_steps > w:
        decay = w + max(1, round((cfg.lr_decay_steps - w) * max(0, steps - w) / (cfg.max_steps - w)))
    return cfg.replace(max_steps=steps, lr_decay_steps=decay)


def _plan_key(cfg: TrainConfig, world_size: int) -> str:
    blob = json.dumps({"train_config": cfg.versioned_dict(), "world_size": world_size}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _read_plan(out_dir: Path, key: str) -> dict[str, Any] | None:
    """The plan recorded in out_dir by an earlier run of the same config, if any."""
    try:
        plan = json.loads((out_dir / PLAN_FILE).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(plan, dict) and plan.get("key") == key and _is_pos_int(plan.get("planned_steps"))
    return plan if ok else None


def _is_pos_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def _write_plan(out_dir: Path, plan: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{PLAN_FILE}.tmp-{os.getpid()}"
    tmp.write_bytes(_json_bytes(plan))
    os.replace(tmp, out_dir / PLAN_FILE)


def bits_per_byte(nats: float, n_bytes: float) -> float:
    """Total cross entropy in nats over some tokens -> bits per byte of the text they encode."""
    if n_bytes <= 0:
        raise ValueError(f"bits_per_byte needs a positive byte count, got {n_bytes}")
    return nats / (math.log(2) * n_bytes)


def resolve_device(name: str = "auto", local_rank: int | None = None) -> torch.device:
    """auto: CUDA if available, else MPS, else CPU. Under DDP "cuda" means cuda:LOCAL_RANK."""
    if name == "auto":
        if torch.cuda.is_available():
            name = "cuda"
        elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            name = "mps"
        else:
            name = "cpu"
    if name == "cuda" and local_rank is not None:
        name = f"cuda:{local_rank}"
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} requested but CUDA is not available")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def peak_flops_for(device: torch.device) -> float | None:
    """Peak dense bf16 FLOP/s of a CUDA device from `PEAK_FLOPS_BF16`; None elsewhere."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, flops in PEAK_FLOPS_BF16:
        if key in name:
            return flops
    return None


@dataclass
class _Dist:
    enabled: bool = False
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False  # we created the process group and must destroy it


def _setup_dist(cfg: TrainConfig) -> _Dist:
    if dist.is_available() and dist.is_initialized():
        rank = dist.get_rank()
        return _Dist(True, rank, dist.get_world_size(), int(os.environ.get("LOCAL_RANK", rank)), False)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        use_cuda = torch.cuda.is_available() and not cfg.device.startswith(("cpu", "mps"))
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if use_cuda:
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
        return _Dist(True, dist.get_rank(), dist.get_world_size(), local_rank, True)
    return _Dist()


def _gather_bytes(data: bytes, d: _Dist, device: torch.device) -> list[bytes]:
    """Every rank's `data`, in rank order (collective; all ranks must call it)."""
    if not d.enabled:
        return [data]
    dev = device if dist.get_backend() == "nccl" else torch.device("cpu")
    n = torch.tensor([len(data)], dtype=torch.int64, device=dev)
    sizes = [torch.zeros_like(n) for _ in range(d.world_size)]
    dist.all_gather(sizes, n)
    width = int(max(int(s.item()) for s in sizes))
    buf = torch.zeros(width, dtype=torch.uint8, device=dev)
    if data:
        buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev)
    outs = [torch.zeros_like(buf) for _ in range(d.world_size)]
    dist.all_gather(outs, buf)
    return [bytes(o[: int(s.item())].cpu().numpy().tobytes()) for o, s in zip(outs, sizes)]


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode()


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def _rank_rng_state(sampler: WindowSampler, device: torch.device) -> dict[str, Any]:
    return {
        "torch_cpu": _b64(torch.get_rng_state()),
        "torch_cuda": _b64(torch.cuda.get_rng_state(device)) if device.type == "cuda" else None,
        # None: training draws nothing from Python's `random`, and other threads of the process
        # (Prefect's) do, so its state would make the same training write different bytes.
        "python": None,
        "sampler": sampler.state(),
    }


def _can_pin() -> bool:
    return torch.cuda.is_available()


def _to_batch(arr: np.ndarray, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of a (B, window) batch on `device`: copied from page-locked host
    memory without blocking when a GPU is present (pinning needs one), by the same call
    otherwise (to the CPU it is no copy at all)."""
    t = torch.from_numpy(arr)
    if _can_pin() and device.type != "cpu":
        t = t.pin_memory()
    t = t.to(device, non_blocking=True)
    return t[:, :-1], t[:, 1:]


def autocast_dtype(dtype: str, device_type: str, bf16_supported: bool) -> torch.dtype | None:
    """The autocast dtype of `TrainConfig.dtype` on a device (None: float32, no autocast).

    auto: bfloat16 on CUDA when the GPU supports it, else float16 (with a GradScaler);
    float32 on the CPU and MPS."""
    if dtype == "auto":
        if device_type != "cuda":
            return None
        return torch.bfloat16 if bf16_supported else torch.float16
    return {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def grad_scaler(amp_dtype: torch.dtype | None, device: torch.device) -> torch.amp.GradScaler:
    """Loss scaling for float16 autocast; a disabled scaler (a pass-through) otherwise."""
    return torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)


def _broadcast_int(value: int, d: _Dist, device: torch.device) -> int:
    """Rank 0's `value` on every rank (collective; all ranks must call it)."""
    dev = device if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([value], dtype=torch.int64, device=dev)
    dist.broadcast(t, src=0)
    return int(t.item())


@dataclass
class _Resume:
    """A checkpoint read whole and checked, before anything is built from it."""

    path: Path
    step: int
    model_config: GPTConfig
    weights: dict[str, torch.Tensor]
    opt_meta: dict[str, Any]
    opt_tensors: dict[str, torch.Tensor]
    state: dict[str, Any]  # trainer_state.json
    data_state: dict[str, Any]
    rng_json: dict[str, Any]
    rng_tensors: dict[str, torch.Tensor]


def _read_resume(path: Path, verify: bool = True) -> _Resume:
    """Every file of a checkpoint, checked against its marker (sha256 with `verify`) and
    parsed; any damage raises `CheckpointError` naming the file."""
    ckpt = open_checkpoint(path, verify=verify)
    r = _Resume(
        path=ckpt.path,
        step=ckpt.step,
        model_config=ckpt.model_config(),
        weights=ckpt.tensors("model.safetensors"),
        opt_meta=ckpt.json("optimizer.json"),
        opt_tensors=ckpt.tensors("optimizer.safetensors"),
        state=ckpt.json("trainer_state.json"),
        data_state=ckpt.json("data_state.json"),
        rng_json=ckpt.json("rng_state.json"),
        rng_tensors=ckpt.tensors("rng_state.safetensors"),
    )
    try:
        ok = (
            int(r.state["step"]) == r.step
            and isinstance(r.state["history"], list)
            and isinstance(r.opt_meta, dict)
            and isinstance(r.data_state["samplers"], list)
            and isinstance(r.rng_json["python"], list)
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{r.path}: malformed trainer, data or RNG state ({type(e).__name__}: {e})") from e
    if not ok:
        raise CheckpointError(f"{r.path}: trainer, data or RNG state does not match the checkpoint's step {r.step}")
    return r


def _pick_resume(out_dir: Path, d: _Dist, device: torch.device, emit: LogFn, warn: LogFn) -> _Resume | None:
    """The newest checkpoint in out_dir that reads back whole, or None (fresh start).

    Rank 0 chooses, moving each corrupt checkpoint aside (`quarantine_checkpoint`) with a
    warning that names the fallback; the other ranks load the checkpoint it chose.
    """
    chosen: _Resume | None = None
    if d.rank == 0:
        ckpts = list_checkpoints(out_dir)
        if not ckpts:
            emit(f"resume: no complete checkpoint in {out_dir}; starting from scratch")
        for i in range(len(ckpts) - 1, -1, -1):
            path = ckpts[i][1]
            try:
                chosen = _read_resume(path)
                break
            except CheckpointError as e:
                try:
                    where = f"moved aside to {quarantine_checkpoint(path)}"
                except OSError as oe:
                    where = f"could not move it aside ({oe})"
                then = f"falling back to the previous checkpoint {ckpts[i - 1][1].name}" if i > 0 else "no valid checkpoint left: starting from scratch"
                warn(f"resume: checkpoint {path.name} is unusable ({e}); {where}; {then}")
    if d.enabled:
        step = _broadcast_int(chosen.step if chosen is not None else -1, d, device)
        if d.rank != 0 and step >= 0:
            chosen = _read_resume(out_dir / f"ckpt_{step:06d}", verify=False)  # rank 0 hashed it
    return chosen


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    shards: TokenShards,
    regions: list[Region],
    *,
    block_size: int,
    batch_size: int,
    eval_iters: int,
    seed: int | list[int],
    device: torch.device,
    autocast: Callable[[], Any] = nullcontext,
    token_byte_lengths: torch.Tensor | None = None,
    bytes_per_token: float | None = None,
    separator_id: int | None = None,
    d: _Dist | None = None,
) -> dict[str, float | None]:
    """Mean val loss (nats/token, every target) and bits per byte over eval_iters seeded batches.

    bits/byte = nats of the text targets / (ln 2 * bytes they encode): the separator's
    targets (`separator_id`, no bytes) are left out of both; the bytes from
    `token_byte_lengths[target]` or, without it, n_text_targets * `bytes_per_token` (the
    manifest's bytes per text token). Under DDP every rank draws the same eval_iters
    batches and evaluates every world_size-th of them, summed over ranks: the figures of
    one process evaluating them all, in 1/world_size of its time.
    """
    world, rank = (d.world_size, d.rank) if d is not None and d.enabled else (1, 0)
    sampler = WindowSampler(shards, regions, block_size + 1, batch_size, seed=seed)
    was_training = model.training
    model.eval()
    nats = torch.zeros((), dtype=torch.float64, device=device)
    text_nats = torch.zeros((), dtype=torch.float64, device=device)
    n_bytes = torch.zeros((), dtype=torch.float64, device=device)
    n_text = torch.zeros((), dtype=torch.float64, device=device)
    n_tok = 0
    for i in range(eval_iters):
        mine = i % world == rank
        batch = sampler.next_batch(None if mine else slice(0, 0))  # another rank's batch: drawn, not read
        if not mine:
            continue
        x, y = _to_batch(batch, device)
        with autocast():
            _, loss = model(x, y, reduction="none")
        losses = loss.double()
        nats += losses.sum()
        n_tok += y.numel()
        text = (y != separator_id).reshape(-1) if separator_id is not None else torch.ones(y.numel(), dtype=torch.bool, device=y.device)
        text_nats += losses[text].sum()
        n_text += text.sum()
        if token_byte_lengths is not None:
            n_bytes += token_byte_lengths[y].sum().double()
    stats = torch.stack([nats, torch.tensor(float(n_tok), dtype=torch.float64, device=device), n_bytes, text_nats, n_text])
    if d is not None and d.enabled:
        if dist.get_backend() != "nccl":
            stats = stats.cpu()
        dist.all_reduce(stats, op=dist.ReduceOp.SUM)
    model.train(was_training)
    total_nats, total_tok, total_bytes, total_text_nats, total_text = (float(v) for v in stats.cpu())
    if token_byte_lengths is None:
        total_bytes = total_text * bytes_per_token if bytes_per_token else 0.0
    return {
        "val_loss": total_nats / total_tok,
        "val_bpb": bits_per_byte(total_text_nats, total_bytes) if total_bytes > 0 else None,
        "val_tokens": total_tok,
        "val_bytes": total_bytes,
    }


def accumulate_gradients(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    micro_steps: int,
    autocast: Callable[[], Any],
    scaler: torch.amp.GradScaler,
) -> torch.Tensor:
    """This rank's part of one optimizer step's gradient: `micro_steps` forward/backward
    passes over equal slices of (x, y), each loss divided by `micro_steps`; DDP averages
    the ranks' gradients (all-reduced on the last micro-step only, `no_sync` before), so
    the gradient is the mean over the whole step's windows on any world size. Returns
    this rank's mean loss."""
    loss_sum = torch.zeros((), device=x.device)
    per = x.size(0) // micro_steps
    for micro in range(micro_steps):
        rows = slice(micro * per, (micro + 1) * per)
        sync = model.no_sync() if (isinstance(model, DDP) and micro < micro_steps - 1) else nullcontext()
        with sync:
            with autocast():
                _, loss = model(x[rows], y[rows])
            loss = loss / micro_steps
            scaler.scale(loss).backward()
        loss_sum += loss.detach()
    return loss_sum


_PRECISION = {None: "fp32", torch.bfloat16: "bf16 autocast", torch.float16: "fp16 autocast + GradScaler"}
EPOCH_FRACTION_PER_STEP = 0.1  # warn when one step draws more than this share of the train split
MANY_EPOCHS = 10  # warn when the run draws more than this many times the train split


def _epoch_warnings(cfg: TrainConfig, tokens_per_step: int, n_train_tokens: int, data: str) -> list[str]:
    """Warnings when a step is a large part of an epoch, or the run many epochs (the model
    would see the same windows again and again: a smaller batch or more data is wanted)."""
    if n_train_tokens <= 0:
        return []
    out = []
    per_step = tokens_per_step / n_train_tokens
    if per_step > EPOCH_FRACTION_PER_STEP:
        out.append(
            f"one optimizer step draws {tokens_per_step:,} tokens, {per_step:.0%} of the {n_train_tokens:,} training tokens of {data}: "
            "use a smaller batch (batch_size, grad_accum_steps, total_batch_tokens) or more data"
        )
    epochs = cfg.max_steps * per_step
    if epochs > MANY_EPOCHS:
        out.append(
            f"{cfg.max_steps:,} steps of {tokens_per_step:,} tokens are {epochs:.0f} epochs of the {n_train_tokens:,} training tokens "
            f"of {data} (a time budget may stop it sooner): expect overfitting; use fewer steps or more data"
        )
    return out


def _fmt(entry: dict[str, Any], max_steps: int) -> str:
    parts = [f"step {entry['step']:>6}/{max_steps}"]
    if entry.get("train_loss") is not None:
        parts.append(f"train loss {entry['train_loss']:.4f}")
    if entry.get("train_eval_loss") is not None:
        parts.append(f"train split {entry['train_eval_loss']:.4f}")
    if entry.get("val_loss") is not None:
        bpb = entry.get("val_bpb")
        parts.append(f"val loss {entry['val_loss']:.4f}" + (f" bpb {bpb:.4f}" if bpb is not None else ""))
    parts.append(f"lr {entry['lr']:.2e}")
    if entry.get("tokens_per_s") is not None:
        parts.append(f"{entry['tokens_per_s']:,.0f} tok/s")
    if entry.get("mfu") is not None:
        parts.append(f"mfu {entry['mfu']:.1%}")
    return " | ".join(parts)


# -- the loop ----------------------------------------------------------------------------


def train(
    train_config: TrainConfig,
    data_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    token_byte_lengths: np.ndarray | None = None,
    log: LogFn | None = None,
    on_eval: EventFn | None = None,
    on_step: EventFn | None = None,
    resume: bool | None = None,
) -> TrainResult:
    """Train a GPT on the token directory `data_dir`, checkpointing into `out_dir`.

    token_byte_lengths: optional (vocab_size,) array of UTF-8 byte lengths per token id
    (0 for the separator), for exact bits/byte; else the manifest's bytes/token is used.
    log(str) gets progress lines (rank 0; default print); on_eval(entry) each evaluation
    and on_step(entry) each step, after that step's checkpoint (rank 0).
    resume: overrides train_config.resume — continue from out_dir's latest complete checkpoint.
    """
    t_start = _budget_clock()
    d = _setup_dist(train_config)
    try:
        # small models on the CPU train on one intra-op thread, entered once the model is built
        with contextlib.ExitStack() as threads:
            return _train(
                t_start,
                train_config,
                Path(data_dir),
                Path(out_dir),
                token_byte_lengths,
                log or print,
                on_eval,
                on_step,
                train_config.resume if resume is None else resume,
                d,
                threads,
            )
    finally:
        if d.owns_group:
            dist.destroy_process_group()


def _train(
    t_start: float,
    cfg: TrainConfig,
    data_dir: Path,
    out_dir: Path,
    token_byte_lengths: np.ndarray | None,
    log: LogFn,
    on_eval: EventFn | None,
    on_step: EventFn | None,
    resume: bool,
    d: _Dist,
    threads: contextlib.ExitStack,
) -> TrainResult:
    master = d.rank == 0
    emit: LogFn = log if master else (lambda _msg: None)
    messages: list[str] = []
    run_messages: list[str] = []

    def warn_run(msg: str) -> None:  # about this invocation, not the data: kept out of versioned files
        run_messages.append(msg)
        if master:
            _log.warning(msg)
        emit(f"WARNING: {msg}")

    # -- device and precision
    device = resolve_device(cfg.device, d.local_rank if d.enabled else None)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    amp_dtype = autocast_dtype(cfg.dtype, device.type, device.type == "cuda" and torch.cuda.is_bf16_supported())
    scaler = grad_scaler(amp_dtype, device)

    def autocast() -> Any:
        return torch.autocast(device_type=device.type, dtype=amp_dtype) if amp_dtype is not None else nullcontext()

    # -- data
    # verify_shards (default): a published version's files against its store manifest
    # (TokenShards' default; hashed once per process, so after `store.local_dir` it costs a
    # stat), a directory of one's own against its meta's sha256. False: size checks only.
    shards = TokenShards(data_dir, verify=cfg.verify_shards, verify_hashes=cfg.verify_shards)
    mcfg = cfg.model
    if mcfg.vocab_size is None:
        mcfg = mcfg.with_vocab(shards.vocab_size)
    elif mcfg.vocab_size < shards.vocab_size:
        raise ValueError(f"GPTConfig.vocab_size {mcfg.vocab_size} is smaller than the data's vocab_size {shards.vocab_size}")
    window = mcfg.block_size + 1
    split = shards.split(cfg.val_fraction, window)
    for m in split.messages:
        # The kept copy (it goes into published metrics) names the data version, not the
        # local directory, which differs from one store or cache to the next.
        messages.append(m.replace(str(shards.data_dir), f"tokens version {shards.version}") if shards.version else m)
        emit(f"WARNING: {m}")
        if master:
            warnings.warn(m, stacklevel=3)
    # One draw of the whole step's windows on every rank, each reading its slice (see the module doc).
    micro_steps = cfg.micro_steps_per_rank(d.world_size)
    rank_rows = slice(d.rank * micro_steps * cfg.batch_size, (d.rank + 1) * micro_steps * cfg.batch_size)
    train_sampler = WindowSampler(shards, split.train, window, cfg.batch_size * cfg.accum_steps, seed=[cfg.seed, 0, 0])
    tokens_per_step = cfg.tokens_per_step
    for m in _epoch_warnings(cfg, tokens_per_step, split.n_train_tokens, f"tokens version {shards.version}" if shards.version else str(shards.data_dir)):
        messages.append(m)
        emit(f"WARNING: {m}")
        if master:
            _log.warning(m)
    has_val = bool(split.val)
    tbl: torch.Tensor | None = None
    if token_byte_lengths is not None:
        arr = np.asarray(token_byte_lengths)
        if arr.ndim != 1 or arr.shape[0] < shards.vocab_size or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(
                f"token_byte_lengths must be a 1-D integer array of length >= vocab_size {shards.vocab_size}, got dtype {arr.dtype} shape {arr.shape}"
            )
        if (arr < 0).any():
            raise ValueError("token_byte_lengths must be >= 0")
        tbl = torch.as_tensor(arr.astype(np.int64), device=device)
    elif has_val and shards.bytes_per_token is None:
        messages.append("no token_byte_lengths and no n_bytes in the manifest: val bits/byte unavailable")

    # -- checkpoint to resume from (read whole and checked before anything is built)
    latest = latest_checkpoint(out_dir)
    if latest is not None and not resume:
        raise ValueError(f"{out_dir} already holds checkpoint {latest.name}; pass resume=True to continue it or use an empty out_dir")
    ckpt = _pick_resume(out_dir, d, device, emit, warn_run) if resume else None
    if ckpt is not None and ckpt.model_config != mcfg:
        raise ValueError(f"{ckpt.path}: checkpoint model {ckpt.model_config} differs from the requested {mcfg}")

    # -- model and optimizer (same init on every rank; DDP broadcasts rank 0's anyway)
    torch.manual_seed(cfg.seed + d.rank)
    raw_model = GPT(mcfg).to(device)
    # One intra-op thread for a small model on the CPU, the rule sampling follows. A trade:
    # on an idle 2-core machine the "small" preset trained at 11,500 tokens/s on one thread
    # and 20,900 on two, but at load ~3 at 9,000 on one and 2,100 on two (every split op waits
    # for a descheduled worker): `python benchmarks/bench_lm.py --steps 10 --threads 1 2`.
    # The time budget makes up part of the idle loss; the collapse under load it cannot.
    threads.enter_context(one_thread_for(raw_model))
    optimizer = raw_model.configure_optimizer(cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), fused=device.type == "cuda")
    start_step = 0
    history: list[dict[str, Any]] = []
    if ckpt is not None:
        load_state_into(raw_model, ckpt.weights, ckpt.path / "model.safetensors")
        load_optimizer_state(optimizer, ckpt.opt_meta, ckpt.opt_tensors, ckpt.path / "optimizer.json")
        start_step = ckpt.step
        # Entries restored from a checkpoint carry no timings (see RUN_KEYS).
        history = [{**h, **{k: None for k in RUN_KEYS}} for h in ckpt.state["history"]]
        saved_version = (ckpt.state.get("data") or {}).get("version")
        if saved_version != shards.version:
            warn_run(f"resume: data version {shards.version!r} differs from the checkpoint's {saved_version!r}")
    model: torch.nn.Module = raw_model
    if cfg.compile:
        # an OptimizedModule at runtime; the stubs only promise a callable
        model = cast(torch.nn.Module, torch.compile(model))
    eval_model = model
    if d.enabled:
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)

    if ckpt is not None:  # restore randomness last, after everything that may consume it
        data_state, rng_json, rng_t = ckpt.data_state, ckpt.rng_json, ckpt.rng_tensors
        train_sampler.set_state(data_state["samplers"][0])  # the same on every rank
        if ckpt.state.get("grad_scaler"):
            scaler.load_state_dict(ckpt.state["grad_scaler"])
        if data_state.get("world_size") == d.world_size:
            torch.set_rng_state(rng_t[f"rank{d.rank}.torch_cpu"])
            if device.type == "cuda" and f"rank{d.rank}.torch_cuda" in rng_t:
                torch.cuda.set_rng_state(rng_t[f"rank{d.rank}.torch_cuda"], device)
            py = rng_json["python"][d.rank]
            if py is not None:  # a checkpoint written before training stopped recording it
                random.setstate((py[0], tuple(py[1]), py[2]))
        else:
            warn_run(
                f"resume: world size changed ({data_state.get('world_size')} -> {d.world_size}); the data order continues "
                "exactly but dropout is re-seeded, so with dropout the run is not an exact continuation"
            )
            torch.manual_seed(cfg.seed + d.rank + 7919 * start_step)

    # -- the step plan: max_steps, or (time budget) the count a calibration chose, once
    budget = cfg.time_budget_s
    plan_key = _plan_key(cfg, d.world_size)
    planned: int | None = None
    if budget is not None:
        saved = ckpt.state.get("planned_steps") if ckpt is not None else None
        if _is_pos_int(saved):
            planned = saved
        elif resume:
            plan = _read_plan(out_dir, plan_key)
            planned = plan["planned_steps"] if plan is not None else None
        if d.enabled:  # every rank follows rank 0's plan
            planned = _broadcast_int(planned or 0, d, device) or None
        if planned is not None:
            emit(f"time budget: continuing the recorded plan of {planned} steps")
    run_cfg = stretch_schedule(cfg, planned) if planned is not None else cfg
    # Steps measured before planning; their learning rates are the same under any plan.
    cal_end = min(cfg.max_steps, max(min(cfg.warmup_steps + 1, CALIBRATION_STEPS), start_step + 1))

    n_params = raw_model.num_params()
    flops_per_token = raw_model.flops_per_token()
    peak = cfg.peak_flops or peak_flops_for(device)
    emit(
        f"device {device} ({_PRECISION[amp_dtype]}{', compiled' if cfg.compile else ''}"
        f"{f', DDP x{d.world_size}' if d.enabled else ''}) | {n_params / 1e6:.2f}M params | "
        f"data {shards.n_tokens:,} tokens: train {split.n_train_tokens:,} / val {split.n_val_tokens:,} | "
        f"{tokens_per_step:,} tokens/step" + (f" | resuming at step {start_step} from {ckpt.path}" if ckpt is not None else "")
    )

    def run_eval(regions: list[Region] = split.val, stream: int = 1) -> dict[str, Any]:
        return evaluate(
            eval_model,
            shards,
            regions,
            block_size=mcfg.block_size,
            batch_size=cfg.batch_size,
            eval_iters=cfg.eval_iters,
            seed=[cfg.seed, 0, stream],  # one draw shared by the ranks, each evaluating its share
            device=device,
            autocast=autocast,
            token_byte_lengths=tbl,
            bytes_per_token=shards.bytes_per_text_token,
            separator_id=shards.separator_id,
            d=d,
        )

    def save(step: int) -> Path | None:
        blobs = _gather_bytes(json.dumps(_rank_rng_state(train_sampler, device)).encode(), d, device)
        path = None
        if master:
            ranks = [json.loads(b) for b in blobs]
            rng_tensors = {}
            for r, st in enumerate(ranks):
                rng_tensors[f"rank{r}.torch_cpu"] = _unb64(st["torch_cpu"])
                if st["torch_cuda"] is not None:
                    rng_tensors[f"rank{r}.torch_cuda"] = _unb64(st["torch_cuda"])
            opt_tensors, opt_json = optimizer_files(optimizer)
            files = {
                "model.safetensors": weights_bytes(raw_model),
                "optimizer.safetensors": opt_tensors,
                "optimizer.json": opt_json,
                "trainer_state.json": _json_bytes(
                    {
                        "step": step,
                        "lr": lr_at(step, run_cfg),
                        "planned_steps": planned,  # the time budget's plan (None: max_steps)
                        # only what decides the weights: no paths, timings or run-only settings
                        "train_config": cfg.versioned_dict(),
                        "model_config": mcfg.to_dict(),
                        "world_size": d.world_size,
                        "tokens_per_step": tokens_per_step,
                        "grad_scaler": scaler.state_dict(),  # {} unless float16
                        "data": {
                            "version": shards.version,
                            "vocab_size": shards.vocab_size,
                            "n_tokens": shards.n_tokens,
                            "separator_id": shards.separator_id,
                        },
                        "history": versioned_history(history),
                    }
                ),
                "rng_state.safetensors": safetensors_bytes(rng_tensors),
                "rng_state.json": _json_bytes({"world_size": d.world_size, "python": [st["python"] for st in ranks]}),
                "data_state.json": _json_bytes(
                    {
                        "step": step,
                        "world_size": d.world_size,
                        "seed": cfg.seed,
                        "samplers": [st["sampler"] for st in ranks],
                    }
                ),
            }
            path = write_checkpoint(out_dir, step, files, cfg.keep_last)
            emit(f"checkpoint {path}")
        if d.enabled:
            dist.barrier()
        return path

    def event(entry: dict[str, Any]) -> dict[str, Any]:  # for on_eval / on_step: with the planned total
        return {**entry, "max_steps": run_cfg.max_steps}

    last_ckpt: Path | None = ckpt.path if ckpt is not None else None
    eval_s: float | None = None  # one evaluation's seconds, for the time budget's plan
    if start_step == 0 and has_val:
        entry = {"step": 0, "train_loss": None, "lr": lr_at(0, run_cfg), "tokens_per_s": None, "mfu": None}
        t_eval = _budget_clock()
        entry.update({k: v for k, v in run_eval().items() if k in ("val_loss", "val_bpb")})
        eval_s = _budget_clock() - t_eval
        history.append(entry)
        emit(_fmt(entry, run_cfg.max_steps))
        if master and on_eval is not None:
            on_eval(event(entry))

    # -- train
    model.train()
    step = start_step
    timed_tokens, timed_s = 0, 0.0
    every_steps, every_s = run_cfg.ckpt_steps, float(cfg.ckpt_every_s)
    last_save_t = _clock()
    step_starts: list[float] = []  # when this invocation's steps began, until the plan is made
    while step < run_cfg.max_steps:
        lr = lr_at(step, run_cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        t0 = time.perf_counter()
        if budget is not None and planned is None:
            step_starts.append(_budget_clock())
        x_all, y_all = _to_batch(train_sampler.next_batch(rank_rows), device)
        loss_sum = accumulate_gradients(model, x_all, y_all, micro_steps, autocast, scaler)
        scaler.unscale_(optimizer)
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        time_due = every_s > 0 and _clock() - last_save_t >= every_s
        if d.enabled:
            # One all-reduce for the loss and the "a checkpoint is due" vote: every rank
            # must take part in a save, and their clocks may disagree.
            packed = torch.stack([loss_sum.float(), torch.tensor(float(time_due), device=loss_sum.device)])
            if dist.get_backend() != "nccl":
                packed = packed.cpu()
            dist.all_reduce(packed, op=dist.ReduceOp.SUM)
            loss_sum = packed[0] / d.world_size
            time_due = bool(packed[1].item() > 0)
        train_loss = float(loss_sum.item())  # waits for the device
        dt = time.perf_counter() - t0
        step += 1
        if not math.isfinite(train_loss):
            raise FloatingPointError(f"non-finite training loss {train_loss} at step {step}")
        if budget is not None and planned is None and step >= cal_end:
            # A step's time is start to start: its logging, callbacks and checkpoints count too.
            now = _budget_clock()
            step_times = [b - a for a, b in zip(step_starts, [*step_starts[1:], now])]
            planned = _make_plan(
                cfg,
                d,
                device,
                out_dir,
                plan_key,
                emit,
                done=step,
                elapsed_s=now - t_start,
                step_times=step_times,
                eval_s=eval_s,
                evals=has_val,
            )
            run_cfg = stretch_schedule(cfg, planned)
            every_steps = run_cfg.ckpt_steps
        if step > start_step + 1 or cfg.max_steps - start_step == 1:  # skip the warm-up step
            timed_tokens += tokens_per_step
            timed_s += dt
        tps = tokens_per_step / dt
        entry = {
            "step": step,
            "train_loss": train_loss,
            "val_loss": None,
            "val_bpb": None,
            "lr": lr,
            "tokens_per_s": tps,
            "mfu": flops_per_token * tps / (peak * d.world_size) if peak else None,
        }
        last = step == run_cfg.max_steps
        evaluated = False
        if has_val and (step % cfg.eval_interval == 0 or last):
            entry.update({k: v for k, v in run_eval().items() if k in ("val_loss", "val_bpb")})
            evaluated = True
        if last:  # the train split on fixed batches too, comparable with val (not one batch)
            ev = run_eval(split.train, 2)
            entry.update(train_eval_loss=ev["val_loss"], train_eval_bpb=ev["val_bpb"])
            evaluated = True
        if step % cfg.log_interval == 0 or evaluated or last:
            history.append(entry)
            emit(_fmt(entry, run_cfg.max_steps))
        if evaluated and master and on_eval is not None:
            on_eval(event(entry))
        if step % every_steps == 0 or last or time_due:
            last_ckpt = save(step) or last_ckpt
            last_save_t = _clock()
        if master and on_step is not None:
            on_step(event(entry))

    tokens_per_s = timed_tokens / timed_s if timed_s > 0 else None
    train_evals = [h["train_eval_loss"] for h in history if h.get("train_eval_loss") is not None]
    train_losses = [h["train_loss"] for h in history if h.get("train_loss") is not None]
    val_entries = [h for h in history if h.get("val_loss") is not None]
    return TrainResult(
        final_train_loss=(train_evals or train_losses or [None])[-1],
        final_val_loss=val_entries[-1]["val_loss"] if val_entries else None,
        val_bpb=val_entries[-1]["val_bpb"] if val_entries else None,
        steps=step,
        tokens_per_s=tokens_per_s,
        history=history,
        checkpoint_dir=str(last_ckpt) if last_ckpt is not None else None,
        n_params=n_params,
        mfu=flops_per_token * tokens_per_s / (peak * d.world_size) if (peak and tokens_per_s) else None,
        device=str(device),
        messages=messages,
        run_messages=run_messages,
        max_steps=run_cfg.max_steps,
        planned_by_budget=planned is not None,
    )


def _make_plan(
    cfg: TrainConfig,
    d: _Dist,
    device: torch.device,
    out_dir: Path,
    key: str,
    emit: LogFn,
    *,
    done: int,
    elapsed_s: float,
    step_times: list[float],
    eval_s: float | None,
    evals: bool,
) -> int:
    """Commit a time-budgeted run to its step count (rank 0 decides; recorded in out_dir)."""
    # The first step of a process pays one-off costs (allocations, kernel selection).
    timed = step_times[1:] or step_times
    step_s = sum(timed) / len(timed)
    if eval_s is None:  # resumed before any evaluation of this process: a forward pass is ~1/3 of a step
        eval_s = step_s * cfg.eval_iters / 3
    planned = plan_steps(cfg, done=done, elapsed_s=elapsed_s, step_s=step_s, eval_s=eval_s, evals=evals)
    if d.enabled:
        planned = _broadcast_int(planned, d, device)
    if d.rank == 0:
        plan = {
            "key": key,
            "planned_steps": planned,
            "max_steps": cfg.max_steps,
            "time_budget_s": cfg.time_budget_s,
            "calibration_steps": done,
            "elapsed_s": round(elapsed_s, 3),
            "step_s": round(step_s, 5),
            "eval_s": round(eval_s, 4),
        }
        _write_plan(out_dir, plan)
        need = elapsed_s + (planned - done) * step_s
        over = f" (~{need:.0f} s: the shortest complete schedule overruns the budget)" if need > (cfg.time_budget_s or 0) else ""
        emit(
            f"time budget {cfg.time_budget_s:g} s: {elapsed_s:.1f} s used, {step_s:.3f} s/step, {eval_s:.2f} s/eval "
            f"-> {planned} of at most {cfg.max_steps} steps, LR schedule stretched to end there{over}"
        )
    return planned
