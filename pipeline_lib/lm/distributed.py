"""Distributed training's plumbing: the process group (torchrun's environment, or one the
caller created), and the two collectives the trainer needs besides DDP's own: every rank's
bytes gathered, and rank 0's integer broadcast."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pipeline_lib.lm.config import TrainConfig


@dataclass
class Dist:
    enabled: bool = False
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False  # we created the process group and must destroy it


def setup_dist(cfg: TrainConfig) -> Dist:
    if dist.is_available() and dist.is_initialized():
        rank = dist.get_rank()
        return Dist(True, rank, dist.get_world_size(), int(os.environ.get("LOCAL_RANK", rank)), False)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        use_cuda = torch.cuda.is_available() and not cfg.device.startswith(("cpu", "mps"))
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if use_cuda:
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
        return Dist(True, dist.get_rank(), dist.get_world_size(), local_rank, True)
    return Dist()


def gather_bytes(data: bytes, d: Dist, device: torch.device) -> list[bytes]:
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


def broadcast_int(value: int, d: Dist, device: torch.device) -> int:
    """Rank 0's `value` on every rank (collective; all ranks must call it)."""
    dev = device if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([value], dtype=torch.int64, device=dev)
    dist.broadcast(t, src=0)
    return int(t.item())
