"""The trainer's checkpoints: what each rank contributes (its RNG and sampler state), the
background writer (host copies on the training thread, serialising, hashing and fsync on
its own), and a checkpoint read back whole and checked before a run resumes from it (rank 0
choosing the newest that is sound, moving damaged ones aside)."""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from pipeline_lib.errors import CheckpointError
from pipeline_lib.lm.checkpoint import list_checkpoints, open_checkpoint, quarantine_checkpoint, write_checkpoint
from pipeline_lib.lm.config import ModelConfig
from pipeline_lib.lm.data import WindowSampler
from pipeline_lib.lm.distributed import Dist, broadcast_int

_log = logging.getLogger("tokenmill.lm")


class SamplerState(Protocol):
    """A sampler, or the trainer's prefetcher in front of one: its state to resume from."""

    def state(self) -> dict[str, Any]: ...


LogFn = Callable[[str], None]


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode()


def unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def rank_rng_state(sampler: WindowSampler | SamplerState, device: torch.device) -> dict[str, Any]:
    return {
        "torch_cpu": _b64(torch.get_rng_state()),
        "torch_cuda": _b64(torch.cuda.get_rng_state(device)) if device.type == "cuda" else None,
        # None: training draws nothing from Python's `random`, and other threads of the process
        # (Prefect's) do, so its state would make the same training write different bytes.
        "python": None,
        "sampler": sampler.state(),
    }


@dataclass
class Resume:
    """A checkpoint read whole and checked, before anything is built from it."""

    path: Path
    step: int
    model_config: ModelConfig
    weights: dict[str, torch.Tensor]
    opt_meta: dict[str, Any]
    opt_tensors: dict[str, torch.Tensor]
    state: dict[str, Any]  # trainer_state.json
    data_state: dict[str, Any]
    rng_json: dict[str, Any]
    rng_tensors: dict[str, torch.Tensor]


def read_resume(path: Path, verify: bool = True) -> Resume:
    """Every file of a checkpoint, checked against its marker (sha256 with `verify`) and
    parsed; any damage raises `CheckpointError` naming the file."""
    ckpt = open_checkpoint(path, verify=verify)
    r = Resume(
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


def pick_resume(out_dir: Path, d: Dist, device: torch.device, emit: LogFn, warn: LogFn) -> Resume | None:
    """The newest checkpoint in out_dir that reads back whole, or None (fresh start).

    Rank 0 chooses, moving each corrupt checkpoint aside (`quarantine_checkpoint`) with a
    warning that names the fallback; the other ranks load the checkpoint it chose.
    """
    chosen: Resume | None = None
    if d.rank == 0:
        ckpts = list_checkpoints(out_dir)
        if not ckpts:
            emit(f"resume: no complete checkpoint in {out_dir}; starting from scratch")
        for i in range(len(ckpts) - 1, -1, -1):
            path = ckpts[i][1]
            try:
                chosen = read_resume(path)
                break
            except CheckpointError as e:
                try:
                    where = f"moved aside to {quarantine_checkpoint(path)}"
                except OSError as oe:
                    where = f"could not move it aside ({oe})"
                then = (
                    f"falling back to the previous checkpoint {ckpts[i - 1][1].name}"
                    if i > 0
                    else ("no valid checkpoint left: starting from scratch")
                )
                warn(f"resume: checkpoint {path.name} is unusable ({e}); {where}; {then}")
    if d.enabled:
        step = broadcast_int(chosen.step if chosen is not None else -1, d, device)
        if d.rank != 0 and step >= 0:
            chosen = read_resume(out_dir / f"ckpt_{step:06d}", verify=False)  # rank 0 hashed it
    return chosen


class CheckpointWriter:
    """Writes checkpoints on a background thread, one at a time: the training thread
    copies the tensors to host memory (`host_copy`, page-locked buffers reused from one
    checkpoint to the next on a GPU) and goes on; serialising, hashing, fsync and the
    rename happen here. A failed write is raised by the next `submit` or `wait`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock  # times the writes (the time budget's clock, in the trainer)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._buffers: dict[str, torch.Tensor] = {}
        self.last_write_s = 0.0

    def host_copy(self, prefix: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """CPU copies of `tensors` (the caller synchronises the device before using them)."""
        self.wait()  # the buffers may still be read by the previous write
        out = {}
        for name, t in tensors.items():
            t = t.detach()
            if t.device.type == "cpu":
                out[name] = t.contiguous().clone()
                continue
            buf = self._buffers.get(prefix + name)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                buf = self._buffers[prefix + name] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            out[name] = buf.copy_(t, non_blocking=True)
        return out

    def submit(self, out_dir: Path, step: int, files: Callable[[], dict[str, bytes]], keep_last: int) -> Path:
        self.wait()

        def write() -> None:
            t0 = self.clock()
            try:
                write_checkpoint(out_dir, step, files(), keep_last)
            except BaseException as e:  # handed to the training thread
                self._error = e
            finally:
                self.last_write_s = self.clock() - t0

        self._thread = threading.Thread(target=write, name=f"tokenmill-checkpoint-{step}", daemon=True)
        self._thread.start()
        return out_dir / f"ckpt_{step:06d}"

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def close(self) -> None:
        """On the way out of a failed run: let the write in progress complete, quietly."""
        try:
            self.wait()
        except BaseException as e:
            _log.warning("checkpoint write failed: %s", e)
