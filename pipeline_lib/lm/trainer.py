"""The training loop: `train`, whose steps (`_Run`'s methods) read top to bottom.

    set_up_data     the token shards, their split, the training sampler (one step ahead)
    set_up_model    the checkpoint to resume from, model, optimizer, restored state
    set_up_plan     max_steps, or the time budget's recorded plan; MFU's peaks
    train:          evaluate at step 0, then for each optimizer step:
      optimizer_step    lr from the schedule (linear warmup, cosine to min_lr);
                        micro-steps on this rank's slice of the step's windows (forward
                        under autocast, loss / micro-steps, backward through the GradScaler:
                        a no-op unless float16; DDP all-reduces on the last micro-step);
                        the next step's windows drawn meanwhile; unscale, clip, AdamW
      budget_says_stop  under a time budget: plan once calibrated, stop before it runs out
      log_entry         train loss (read from the device only here), tokens/s, MFU
      evaluate_if_due   val loss, bits/byte; at the last step the train split too
      checkpoint_if_due copy to host memory, written on a background thread

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

Time budget (`TrainConfig.time_budget_s`, docs/lm.md): the first steps are a calibration (at most
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
After every step `Budget` checks the time left against the recent step time: a run whose
machine slows down after the plan stops early (evaluated and checkpointed there) rather
than overrun the budget by more than about one step.

Self-healing resume: the newest checkpoint that passes its marker's sha256 checks and
parses is used; a corrupt one is moved aside (``.corrupt-ckpt_*``) with a warning on the
"tokenmill.lm" logger naming the fallback (the previous checkpoint, or a fresh start).

Reproducible files: checkpoints hold no timings, paths or other run-dependent values
(`RUN_KEYS` are stripped from the history they store), so a run and its resumed twin
write the same bytes. Timings stay in `TrainResult` and the log.
"""

from __future__ import annotations

import contextlib
import gc
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

import pipeline_lib.lm.budget as time_budget  # its `clock` looked up at each use: tests replace it
from pipeline_lib.lm.budget import (
    CALIBRATION_STEPS,
    Budget,
    is_pos_int,
    make_plan,
    plan_key,
    read_plan,
    stretch_schedule,
)
from pipeline_lib.lm.checkpoint import (
    _json_bytes,
    latest_checkpoint,
    load_optimizer_state,
    load_state_into,
    model_state_tensors,
    optimizer_snapshot,
    safetensors_bytes,
    weights_file_bytes,
)
from pipeline_lib.lm.checkpointing import CheckpointWriter, Resume, pick_resume, rank_rng_state, unb64
from pipeline_lib.lm.config import TrainConfig
from pipeline_lib.lm.data import Region, TokenShards, WindowSampler
from pipeline_lib.lm.distributed import Dist, broadcast_int, gather_bytes, setup_dist
from pipeline_lib.lm.model import build_model
from pipeline_lib.lm.perf import Peak, Throughput
from pipeline_lib.lm.plan import PRECISION_NAMES, autocast_dtype, fit_micro_batch
from pipeline_lib.lm.sampling import one_thread_for

LogFn = Callable[[str], None]
EventFn = Callable[[dict[str, Any]], None]

_log = logging.getLogger("tokenmill.lm")
_clock = time.monotonic  # the checkpoint time cadence's clock (a module global for tests)
# Times the background checkpoint writes, which the time budget counts at the end of a run. Not
# the budget's clock: a write overlaps training steps, which a test's fake budget clock advances.
_write_clock = time.monotonic

# History entry keys that measure the run rather than the model: kept in memory and in the
# log, stripped from every file (checkpoints, published history) by `versioned_history`.
RUN_KEYS = ("tokens_per_s", "mfu", "mfu_measured")


def versioned_history(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history without `RUN_KEYS`: the same for every run of the same training."""
    return [{k: v for k, v in h.items() if k not in RUN_KEYS} for h in history]


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
    mfu: float | None = None  # model FLOPs utilisation of this invocation against the card's datasheet peak (CUDA only)
    mfu_measured: float | None = None  # the same against the matmul rate measured at start (CUDA only)
    device: str = "cpu"
    messages: list[str] = field(default_factory=list)  # warnings about the data (e.g. empty val split)
    run_messages: list[str] = field(default_factory=list)  # about this invocation (resume fallbacks)
    max_steps: int | None = None  # the step count the run was planned to (the budget's plan, else max_steps)
    planned_by_budget: bool = False  # max_steps came from the time budget's plan
    stopped_by_budget: bool = False  # the budget ran out before max_steps (see `Budget`)
    wall_s: float | None = None  # from the start of `train` to its result, by the budget's clock
    # under a time budget: the longest step (start to start, evaluations and checkpoints excluded)
    longest_step_s: float | None = None
    # under a time budget: from the last step's end to the result (final evaluations, checkpoint)
    final_s: float | None = None
    ckpt_copy_s: float | None = None  # the last checkpoint: the training thread's part (state to host memory)
    ckpt_write_s: float | None = None  # the last checkpoint: the background write (serialise, hash, fsync)
    micro_batch: int | None = None  # windows per forward pass (batch_size unless fitted to the GPU's memory)


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


def grad_scaler(amp_dtype: torch.dtype | None, device: torch.device) -> torch.amp.GradScaler:
    """Loss scaling for float16 autocast; a disabled scaler (a pass-through) otherwise."""
    return torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)


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
    d: Dist | None = None,
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
            _, loss = model(x, y, reduction="none", return_logits=False)
        losses = loss.double()
        nats += losses.sum()
        n_tok += y.numel()
        text = (
            (y != separator_id).reshape(-1)
            if separator_id is not None
            else torch.ones(y.numel(), dtype=torch.bool, device=y.device)
        )
        text_nats += losses[text].sum()
        n_text += text.sum()
        if token_byte_lengths is not None:
            n_bytes += token_byte_lengths[y].sum().double()
    stats = torch.stack(
        [nats, torch.tensor(float(n_tok), dtype=torch.float64, device=device), n_bytes, text_nats, n_text]
    )
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
                _, loss = model(x[rows], y[rows], return_logits=False)
            loss = loss / micro_steps
            scaler.scale(loss).backward()
        loss_sum += loss.detach()
    return loss_sum


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
            f"one optimizer step draws {tokens_per_step:,} tokens, {per_step:.0%} of the {n_train_tokens:,} training "
            f"tokens of {data}: "
            "use a smaller batch (batch_size, grad_accum_steps, total_batch_tokens) or more data"
        )
    epochs = cfg.max_steps * per_step
    if epochs > MANY_EPOCHS:
        out.append(
            f"{cfg.max_steps:,} steps of {tokens_per_step:,} tokens are {epochs:.0f} epochs of the {n_train_tokens:,} "
            "training tokens "
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


# -- the loop's parts --------------------------------------------------------------------


class _Prefetch:
    """The training windows, one step ahead: `take` gives the step's (inputs, targets) on
    the device, `prefetch` draws the next step's and starts their copy (from page-locked
    memory, without blocking, on a GPU) while the device still computes. `state` is the
    sampler's state before any batch not yet taken: what a checkpoint must record for an
    exact resume."""

    def __init__(self, sampler: WindowSampler, rows: slice, device: torch.device) -> None:
        self.sampler, self.rows, self.device = sampler, rows, device
        self._next: tuple[torch.Tensor, torch.Tensor] | None = None
        self._state_before_next: dict[str, Any] | None = None

    def prefetch(self) -> None:
        if self._next is None:
            self._state_before_next = self.sampler.state()
            self._next = _to_batch(self.sampler.next_batch(self.rows), self.device)

    def take(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.prefetch()
        assert self._next is not None
        batch, self._next = self._next, None
        return batch

    def state(self) -> dict[str, Any]:
        if self._next is not None and self._state_before_next is not None:
            return self._state_before_next
        return self.sampler.state()

    def set_state(self, state: dict[str, Any]) -> None:
        self.sampler.set_state(state)
        self._next = None


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
    """Train a GPT (or the MLP) on the token directory `data_dir`, checkpointing into `out_dir`.

    token_byte_lengths: optional (vocab_size,) array of UTF-8 byte lengths per token id
    (0 for the separator), for exact bits/byte; else the manifest's bytes/token is used.
    log(str) gets progress lines (rank 0; default print); on_eval(entry) each evaluation
    and on_step(entry) each step, after that step's checkpoint was taken (rank 0; the
    files are written in the background and complete when `train` returns).
    resume: overrides train_config.resume — continue from out_dir's latest complete checkpoint.
    """
    t_start = time_budget.clock()
    d = setup_dist(train_config)
    run: _Run | None = None
    try:
        # small models on the CPU train on one intra-op thread, entered once the model is built
        with contextlib.ExitStack() as stack:
            run = _Run(t_start, train_config, Path(data_dir), Path(out_dir), log or print, d, stack)
            run.set_up_data(token_byte_lengths)
            run.set_up_model(train_config.resume if resume is None else resume)
            run.set_up_plan()
            return run.train(on_eval, on_step)
    finally:
        if d.owns_group:
            # The DDP wrapper holds the process group: drop it first, so that the group is
            # destroyed inside destroy_process_group (which lets go of the GIL) and not by a
            # later collection that holds the GIL while gloo's threads need it (a deadlock).
            run = None
            gc.collect()
            dist.destroy_process_group()


class _Run:
    """One `train` call, in the order it happens: set up (device, data, model, the step
    plan), then `train`: evaluate at step 0, and per optimizer step `step`, `log_entry`,
    `evaluate_if_due`, `checkpoint_if_due`, `budget_says_stop`; then the result."""

    def __init__(
        self,
        t_start: float,
        cfg: TrainConfig,
        data_dir: Path,
        out_dir: Path,
        log: LogFn,
        d: Dist,
        stack: contextlib.ExitStack,
    ) -> None:
        self.t_start, self.cfg, self.data_dir, self.out_dir, self.d, self.stack = (
            t_start,
            cfg,
            data_dir,
            out_dir,
            d,
            stack,
        )
        self.master = d.rank == 0
        self.emit: LogFn = log if self.master else (lambda _msg: None)
        self.messages: list[str] = []  # about the data: published with the model
        self.run_messages: list[str] = []  # about this invocation: kept out of versioned files
        # -- device and precision
        self.device = device = resolve_device(cfg.device, d.local_rank if d.enabled else None)
        if device.type == "cuda":
            torch.cuda.set_device(device)
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        self.amp_dtype = autocast_dtype(
            cfg.dtype, device.type, device.type == "cuda" and torch.cuda.is_bf16_supported()
        )
        self.scaler = grad_scaler(self.amp_dtype, device)
        self.writer = CheckpointWriter(clock=lambda: _write_clock())
        stack.callback(self.writer.close)  # a run that fails still completes the checkpoint it started

    def autocast(self) -> Any:
        return (
            torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)
            if self.amp_dtype is not None
            else nullcontext()
        )

    def warn_run(self, msg: str) -> None:
        self.run_messages.append(msg)
        if self.master:
            _log.warning(msg)
        self.emit(f"WARNING: {msg}")

    def warn_data(self, msg: str, *, stacklevel_warning: bool = False) -> None:
        self.messages.append(msg)
        self.emit(f"WARNING: {msg}")
        if self.master:
            if stacklevel_warning:
                warnings.warn(msg, stacklevel=5)
            else:
                _log.warning(msg)

    # -- setup ---------------------------------------------------------------------------

    def set_up_data(self, token_byte_lengths: np.ndarray | None) -> None:
        """The token shards, their train/val split, the training sampler and the byte
        lengths for bits/byte."""
        cfg, d = self.cfg, self.d
        # verify_shards (default): a published version's files against its store manifest
        # (TokenShards' default; hashed once per process, so after `store.local_dir` it costs a
        # stat), a directory of one's own against its meta's sha256. False: size checks only.
        self.shards = shards = TokenShards(self.data_dir, verify=cfg.verify_shards, verify_hashes=cfg.verify_shards)
        mcfg = cfg.model
        if mcfg.vocab_size is None:
            mcfg = mcfg.with_vocab(shards.vocab_size)
        elif mcfg.vocab_size < shards.vocab_size:
            raise ValueError(
                f"{type(mcfg).__name__}.vocab_size {mcfg.vocab_size} is smaller than the data's "
                f"vocab_size {shards.vocab_size}"
            )
        self.mcfg = mcfg
        window = mcfg.block_size + 1
        self.split = split = shards.split(cfg.val_fraction, window)
        data_name = f"tokens version {shards.version}" if shards.version else str(shards.data_dir)
        for m in split.messages:
            # The kept copy (it goes into published metrics) names the data version, not the
            # local directory, which differs from one store or cache to the next.
            kept = m.replace(str(shards.data_dir), f"tokens version {shards.version}") if shards.version else m
            self.messages.append(kept)
            self.emit(f"WARNING: {m}")
            if self.master:
                warnings.warn(m, stacklevel=4)
        # One draw of the whole step's windows on every rank, each reading its slice (see the module doc).
        rows = cfg.micro_steps_per_rank(d.world_size) * cfg.batch_size
        sampler = WindowSampler(shards, split.train, window, cfg.batch_size * cfg.accum_steps, seed=[cfg.seed, 0, 0])
        self.batches = _Prefetch(sampler, slice(d.rank * rows, (d.rank + 1) * rows), self.device)
        self.tokens_per_step = cfg.tokens_per_step
        for m in _epoch_warnings(cfg, self.tokens_per_step, split.n_train_tokens, data_name):
            self.warn_data(m)
        self.has_val = bool(split.val)
        self.token_bytes: torch.Tensor | None = None
        if token_byte_lengths is not None:
            arr = np.asarray(token_byte_lengths)
            if arr.ndim != 1 or arr.shape[0] < shards.vocab_size or not np.issubdtype(arr.dtype, np.integer):
                raise ValueError(
                    f"token_byte_lengths must be a 1-D integer array of length >= vocab_size {shards.vocab_size}, got "
                    f"dtype {arr.dtype} shape {arr.shape}"
                )
            if (arr < 0).any():
                raise ValueError("token_byte_lengths must be >= 0")
            self.token_bytes = torch.as_tensor(arr.astype(np.int64), device=self.device)
        elif self.has_val and shards.bytes_per_token is None:
            self.messages.append("no token_byte_lengths and no n_bytes in the manifest: val bits/byte unavailable")

    def set_up_model(self, resume: bool) -> None:
        """The checkpoint to resume from (read whole and checked first), the model, the
        optimizer, their restored state, and the micro-batch."""
        cfg, d, device = self.cfg, self.d, self.device
        latest = latest_checkpoint(self.out_dir)
        if latest is not None and not resume:
            raise ValueError(
                f"{self.out_dir} already holds checkpoint {latest.name}; pass resume=True to continue it "
                "or use an empty out_dir"
            )
        self.resume = resume
        self.ckpt = ckpt = pick_resume(self.out_dir, d, device, self.emit, self.warn_run) if resume else None
        if ckpt is not None and ckpt.model_config != self.mcfg:
            raise ValueError(
                f"{ckpt.path}: checkpoint model {ckpt.model_config} differs from the requested {self.mcfg}"
            )
        # same init on every rank; DDP broadcasts rank 0's anyway
        torch.manual_seed(cfg.seed + d.rank)
        self.raw_model = raw_model = build_model(self.mcfg).to(device)
        # One intra-op thread for a small model on the CPU, the rule sampling follows. A trade:
        # on an idle 2-core machine the "small" preset trained at 11,500 tokens/s on one thread
        # and 20,900 on two, but at load ~3 at 9,000 on one and 2,100 on two (every split op waits
        # for a descheduled worker): `python benchmarks/bench_lm.py --steps 10 --threads 1 2`.
        # The time budget makes up part of the idle loss; the collapse under load it cannot.
        self.stack.enter_context(one_thread_for(raw_model))
        self.optimizer = raw_model.configure_optimizer(
            cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), fused=device.type == "cuda"
        )
        self.start_step = 0
        self.history: list[dict[str, Any]] = []
        if ckpt is not None:
            load_state_into(raw_model, ckpt.weights, ckpt.path / "model.safetensors")
            load_optimizer_state(self.optimizer, ckpt.opt_meta, ckpt.opt_tensors, ckpt.path / "optimizer.json")
            self.start_step = ckpt.step
            # Entries restored from a checkpoint carry no timings (see RUN_KEYS).
            self.history = [{**h, **{k: None for k in RUN_KEYS}} for h in ckpt.state["history"]]
            saved_version = (ckpt.state.get("data") or {}).get("version")
            if saved_version != self.shards.version:
                self.warn_run(
                    f"resume: data version {self.shards.version!r} differs from the checkpoint's {saved_version!r}"
                )
        model: torch.nn.Module = raw_model
        if cfg.compile:
            # An OptimizedModule at runtime; the stubs only promise a callable. Evaluation runs
            # the model uncompiled: a second graph (eval mode, no grad) would cost more to compile
            # than the few forward passes it speeds up.
            mode = None if cfg.compile_mode == "default" else cfg.compile_mode
            model = cast(torch.nn.Module, torch.compile(model, mode=mode))
        if d.enabled:
            model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        self.model = model
        self.micro_batch = self._micro_batch()
        if ckpt is not None:
            self._restore_randomness(ckpt)

    def _micro_batch(self) -> int:
        """Windows per forward pass: cfg.batch_size, or with fit_micro_batch on a GPU the
        largest that the memory plan fits in the card (the tokens per step unchanged)."""
        cfg, rows = self.cfg, self.cfg.micro_steps_per_rank(self.d.world_size) * self.cfg.batch_size
        if not cfg.fit_micro_batch or self.device.type != "cuda":
            return cfg.batch_size

        free, _total = torch.cuda.mem_get_info(self.device)
        bf16 = self.amp_dtype != torch.float16
        b = fit_micro_batch(cfg.replace(vocab_size=self.mcfg.vocab_size), free, world_size=self.d.world_size, bf16=bf16)
        self.emit(
            f"micro-batch {b} windows (memory plan, {free / (1 << 30):.1f} GiB free): {rows // b} micro-steps per step"
        )
        return b

    def _restore_randomness(self, ckpt: Resume) -> None:
        """The sampler, the GradScaler and the RNG states of the checkpoint: last, after
        everything that may consume randomness."""
        d, device = self.d, self.device
        data_state, rng_json, rng_t = ckpt.data_state, ckpt.rng_json, ckpt.rng_tensors
        self.batches.set_state(data_state["samplers"][0])  # the same on every rank
        if ckpt.state.get("grad_scaler"):
            self.scaler.load_state_dict(ckpt.state["grad_scaler"])
        if data_state.get("world_size") == d.world_size:
            torch.set_rng_state(rng_t[f"rank{d.rank}.torch_cpu"])
            if device.type == "cuda" and f"rank{d.rank}.torch_cuda" in rng_t:
                torch.cuda.set_rng_state(rng_t[f"rank{d.rank}.torch_cuda"], device)
            py = rng_json["python"][d.rank]
            if py is not None:  # a checkpoint written before training stopped recording it
                random.setstate((py[0], tuple(py[1]), py[2]))
        else:
            self.warn_run(
                f"resume: world size changed ({data_state.get('world_size')} -> {d.world_size}); the data order "
                "continues "
                "exactly but dropout is re-seeded, so with dropout the run is not an exact continuation"
            )
            torch.manual_seed(self.cfg.seed + d.rank + 7919 * self.start_step)

    def set_up_plan(self) -> None:
        """The step plan: max_steps, or under a time budget the count a calibration chose
        (once: a resumed run takes the recorded one), and the throughput accounting."""
        cfg, d, ckpt = self.cfg, self.d, self.ckpt
        self.plan_key = plan_key(cfg, d.world_size)
        self.planned: int | None = None
        if cfg.time_budget_s is not None:
            saved = ckpt.state.get("planned_steps") if ckpt is not None else None
            if is_pos_int(saved):
                self.planned = saved
            elif self.resume:
                plan = read_plan(self.out_dir, self.plan_key)
                self.planned = plan["planned_steps"] if plan is not None else None
            if d.enabled:  # every rank follows rank 0's plan
                self.planned = broadcast_int(self.planned or 0, d, self.device) or None
            if self.planned is not None:
                self.emit(f"time budget: continuing the recorded plan of {self.planned} steps")
        self.run_cfg = stretch_schedule(cfg, self.planned) if self.planned is not None else cfg
        # Steps measured before planning; their learning rates are the same under any plan.
        self.cal_end = min(cfg.max_steps, max(min(cfg.warmup_steps + 1, CALIBRATION_STEPS), self.start_step + 1))
        self.n_params = self.raw_model.num_params()
        self.flops_per_token = self.raw_model.flops_per_token()
        self.peak = Peak.of(self.device, self.amp_dtype, cfg.peak_flops)
        dev = self.device
        self.emit(
            f"device {dev} ({PRECISION_NAMES[self.amp_dtype]}{', compiled' if cfg.compile else ''}"
            f"{f', DDP x{d.world_size}' if d.enabled else ''}) | {self.n_params:,} params | "
            f"data {self.shards.n_tokens:,} tokens: train {self.split.n_train_tokens:,} / val "
            f"{self.split.n_val_tokens:,} | "
            f"{self.tokens_per_step:,} tokens/step"
            + (f" | resuming at step {self.start_step} from {ckpt.path}" if ckpt is not None else "")
        )
        if dev.type == "cuda":
            self.emit(self.peak.describe())

    # -- the loop ------------------------------------------------------------------------

    def train(self, on_eval: EventFn | None, on_step: EventFn | None) -> TrainResult:
        self.on_eval = on_eval if self.master else None
        self.step = self.start_step
        self.last_ckpt: Path | None = self.ckpt.path if self.ckpt is not None else None
        self.ckpt_copy_s: float | None = None
        self.budget = Budget(self.cfg.time_budget_s, self.t_start)
        self.evaluate_at_start()
        self.model.train()
        self.throughput = Throughput(time.perf_counter())
        every_s = float(self.cfg.ckpt_every_s)
        self.last_save_t = _clock()
        stop = False
        while self.step < self.run_cfg.max_steps and not stop:
            self.budget.step_starts()
            lr = lr_at(self.step, self.run_cfg)
            loss, time_due = self.optimizer_step(lr, every_s)
            self.step += 1
            stop = self.budget_says_stop()
            entry = self.log_entry(loss, lr, last=stop or self.step == self.run_cfg.max_steps)
            self.evaluate_if_due(entry)
            self.checkpoint_if_due(entry, time_due)
            if self.master and on_step is not None:
                on_step(self.event(entry))
        self.finish_checkpoints()
        return self.result()

    def evaluate_at_start(self) -> None:
        if self.start_step != 0 or not self.has_val:
            return
        entry = {"step": 0, "train_loss": None, "lr": lr_at(0, self.run_cfg), "tokens_per_s": None, "mfu": None}
        t_eval = self.budget.now()
        entry.update({k: v for k, v in self.run_eval().items() if k in ("val_loss", "val_bpb")})
        self.budget.eval_took(t_eval)
        self.history.append(entry)
        self.emit(_fmt(entry, self.run_cfg.max_steps))
        if self.on_eval is not None:
            self.on_eval(self.event(entry))

    def optimizer_step(self, lr: float, every_s: float) -> tuple[torch.Tensor, bool]:
        """One optimizer step: this rank's micro-steps, clip, AdamW. Returns the loss as a
        device tensor (read only when logged: no wait for the device per step) and whether
        a checkpoint is due by time (every rank's vote under DDP)."""
        cfg, d = self.cfg, self.d
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        x_all, y_all = self.batches.take()
        micro_steps = x_all.size(0) // self.micro_batch
        loss_sum = accumulate_gradients(self.model, x_all, y_all, micro_steps, self.autocast, self.scaler)
        self.batches.prefetch()  # the next step's windows, drawn while the device computes this one
        self.scaler.unscale_(self.optimizer)
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        time_due = every_s > 0 and _clock() - self.last_save_t >= every_s
        if d.enabled:
            # One all-reduce for the loss and the "a checkpoint is due" vote: every rank
            # must take part in a save, and their clocks may disagree.
            packed = torch.stack([loss_sum.float(), torch.tensor(float(time_due), device=loss_sum.device)])
            if dist.get_backend() != "nccl":
                packed = packed.cpu()
            dist.all_reduce(packed, op=dist.ReduceOp.SUM)
            loss_sum = packed[0] / d.world_size
            time_due = bool(packed[1].item() > 0)
        return loss_sum, time_due

    def budget_says_stop(self) -> bool:
        """Under a time budget: plan the step count once the calibration steps are done,
        and stop before the budget runs out (see `Budget`). Rank 0 decides."""
        budget = self.budget
        if budget.seconds is None:
            return False
        now = budget.t_decided = time_budget.clock()
        step_times = budget.step_times_until(now)
        if self.planned is None and self.step >= self.cal_end:
            self.planned = make_plan(
                self.cfg,
                self.out_dir,
                self.plan_key,
                self.emit,
                rank0=(lambda n: broadcast_int(n, self.d, self.device)) if self.d.enabled else None,
                write=self.master,
                done=self.step,
                elapsed_s=now - self.t_start,
                step_times=step_times,
                eval_s=budget.eval_s,
                evals=self.has_val,
            )
            self.run_cfg = stretch_schedule(self.cfg, self.planned)
        if self.step >= self.run_cfg.max_steps:
            return False
        next_evals = self.has_val and (self.step + 1) % self.cfg.eval_interval == 0
        stop = budget.no_time_for_another_step(now, step_times, next_evals, final_evals=1 + self.has_val)
        if self.d.enabled:
            stop = bool(broadcast_int(int(stop), self.d, self.device))
        if stop:
            budget.stopped_at = self.step
            self.emit(
                f"time budget {budget.seconds:g} s: stopping after step {self.step} of {self.run_cfg.max_steps} "
                f"({now - self.t_start:.1f} s used, {budget.recent_step_s(step_times):.3f} s/step lately): "
                "another step and the final evaluation would overrun it by more than a step"
            )
        return stop

    def log_entry(self, loss: torch.Tensor, lr: float, last: bool) -> dict[str, Any]:
        """The step's history entry. The loss is read from the device (a wait) only on
        logged steps, evaluated steps, the last and the first of this invocation."""
        cfg, step = self.cfg, self.step
        self.last = last
        evaluates = (self.has_val and step % cfg.eval_interval == 0) or last
        entry: dict[str, Any] = {
            "step": step,
            "train_loss": None,
            "val_loss": None,
            "val_bpb": None,
            "lr": lr,
            "tokens_per_s": None,
            "mfu": None,
        }
        self.logged = step % cfg.log_interval == 0 or evaluates or last or step == self.start_step + 1
        if self.logged:
            train_loss = float(loss.item())  # waits for the device
            if not math.isfinite(train_loss):
                raise FloatingPointError(f"non-finite training loss {train_loss} at step {step}")
            tps = self.throughput.at(time.perf_counter(), step, self.tokens_per_step)
            entry.update(
                train_loss=train_loss, tokens_per_s=tps, **self.peak.mfu(self.flops_per_token, tps, self.d.world_size)
            )
        return entry

    def evaluate_if_due(self, entry: dict[str, Any]) -> None:
        evaluated = False
        t_eval = self.budget.now()
        if self.has_val and (self.step % self.cfg.eval_interval == 0 or self.last):
            entry.update({k: v for k, v in self.run_eval().items() if k in ("val_loss", "val_bpb")})
            evaluated = True
        if self.last:  # the train split on fixed batches too, comparable with val (not one batch)
            ev = self.run_eval(self.split.train, 2)
            entry.update(train_eval_loss=ev["val_loss"], train_eval_bpb=ev["val_bpb"])
            evaluated = True
        if evaluated:
            self.budget.eval_took(t_eval, final=self.last)
        if self.logged:
            self.history.append(entry)
            self.emit(_fmt(entry, self.run_cfg.max_steps))
        if evaluated and self.on_eval is not None:
            self.on_eval(self.event(entry))

    def run_eval(self, regions: list[Region] | None = None, stream: int = 1) -> dict[str, Any]:
        return evaluate(
            self.raw_model,  # uncompiled: see set_up_model
            self.shards,
            self.split.val if regions is None else regions,
            block_size=self.mcfg.block_size,
            batch_size=self.cfg.batch_size,
            eval_iters=self.cfg.eval_iters,
            seed=[self.cfg.seed, 0, stream],  # one draw shared by the ranks, each evaluating its share
            device=self.device,
            autocast=self.autocast,
            token_byte_lengths=self.token_bytes,
            bytes_per_token=self.shards.bytes_per_text_token,
            separator_id=self.shards.separator_id,
            d=self.d,
        )

    def checkpoint_if_due(self, entry: dict[str, Any], time_due: bool) -> None:
        if self.step % self.run_cfg.ckpt_steps == 0 or self.last or time_due:
            t0 = time_budget.clock()  # the budget's clock: what the budget counts, and a test's fake one
            self.last_ckpt = self.save() or self.last_ckpt
            taken = self.ckpt_copy_s = time_budget.clock() - t0
            self.budget.ckpt_took(taken, taken + self.writer.last_write_s)
            self.last_save_t = _clock()

    def save(self) -> Path | None:
        """Take a checkpoint of this step: every rank's RNG and sampler state gathered to
        rank 0, which copies the weights and optimizer state to host memory and leaves
        the writing (serialise, hash, fsync, rename) to a background thread."""
        d, step, cfg = self.d, self.step, self.cfg
        blobs = gather_bytes(json.dumps(rank_rng_state(self.batches, self.device)).encode(), d, self.device)
        path = None
        if self.master:
            ranks = [json.loads(b) for b in blobs]
            rng_tensors = {}
            for r, st in enumerate(ranks):
                rng_tensors[f"rank{r}.torch_cpu"] = unb64(st["torch_cpu"])
                if st["torch_cuda"] is not None:
                    rng_tensors[f"rank{r}.torch_cuda"] = unb64(st["torch_cuda"])
            weights = self.writer.host_copy("model.", model_state_tensors(self.raw_model, to_cpu=False))
            opt_state, opt_json = optimizer_snapshot(self.optimizer)
            opt_tensors = self.writer.host_copy("optimizer.", opt_state)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # the host copies are complete
            small = {
                "optimizer.json": opt_json,
                "trainer_state.json": _json_bytes(
                    {
                        "step": step,
                        "lr": lr_at(step, self.run_cfg),
                        "planned_steps": self.planned,  # the time budget's plan (None: max_steps)
                        # only what decides the weights: no paths, timings or run-only settings
                        "train_config": cfg.versioned_dict(),
                        "model_config": self.mcfg.to_dict(),
                        "world_size": d.world_size,
                        "tokens_per_step": self.tokens_per_step,
                        "grad_scaler": self.scaler.state_dict(),  # {} unless float16
                        "data": {
                            "version": self.shards.version,
                            "vocab_size": self.shards.vocab_size,
                            "n_tokens": self.shards.n_tokens,
                            "separator_id": self.shards.separator_id,
                        },
                        "history": versioned_history(self.history),
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
            config = self.raw_model.config

            def files() -> dict[str, bytes]:  # on the writer's thread
                return {
                    "model.safetensors": weights_file_bytes(weights, config),
                    "optimizer.safetensors": safetensors_bytes(opt_tensors),
                    **small,
                }

            path = self.writer.submit(self.out_dir, step, files, cfg.keep_last)
            self.emit(f"checkpoint {path}")
        if d.enabled:
            dist.barrier()
        return path

    def finish_checkpoints(self) -> None:
        self.writer.wait()

    def event(self, entry: dict[str, Any]) -> dict[str, Any]:  # for on_eval / on_step: with the planned total
        return {**entry, "max_steps": self.run_cfg.max_steps}

    def result(self) -> TrainResult:
        history, peak = self.history, self.peak
        tokens_per_s = self.throughput.overall(self.tokens_per_step)
        train_evals = [h["train_eval_loss"] for h in history if h.get("train_eval_loss") is not None]
        train_losses = [h["train_loss"] for h in history if h.get("train_loss") is not None]
        val_entries = [h for h in history if h.get("val_loss") is not None]
        mfu = peak.mfu(self.flops_per_token, tokens_per_s, self.d.world_size) if tokens_per_s else {}
        end = time_budget.clock()
        timed = self.budget.seconds is not None
        return TrainResult(
            final_train_loss=(train_evals or train_losses or [None])[-1],
            final_val_loss=val_entries[-1]["val_loss"] if val_entries else None,
            val_bpb=val_entries[-1]["val_bpb"] if val_entries else None,
            steps=self.step,
            tokens_per_s=tokens_per_s,
            history=history,
            checkpoint_dir=str(self.last_ckpt) if self.last_ckpt is not None else None,
            n_params=self.n_params,
            mfu=mfu.get("mfu"),
            mfu_measured=mfu.get("mfu_measured"),
            device=str(self.device),
            messages=self.messages,
            run_messages=self.run_messages,
            max_steps=self.run_cfg.max_steps,
            planned_by_budget=self.planned is not None,
            stopped_by_budget=self.budget.stopped_at is not None,
            wall_s=end - self.t_start,
            longest_step_s=max(self.budget.step_times, default=None) if timed else None,
            final_s=end - self.budget.t_decided if timed and self.budget.t_decided is not None else None,
            micro_batch=self.micro_batch,
            ckpt_copy_s=self.ckpt_copy_s,
            ckpt_write_s=self.writer.last_write_s if self.ckpt_copy_s is not None else None,
        )
