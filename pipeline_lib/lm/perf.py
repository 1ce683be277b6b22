"""Throughput and MFU: tokens per second between logged steps, and model FLOPs utilisation
against the card's datasheet peak (`PEAK_FLOPS_BF16`) and against a matmul rate measured
once at start (an unknown card says so instead of guessing)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

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


def peak_flops_for(device: torch.device) -> float | None:
    """Peak dense bf16 FLOP/s of a CUDA device from `PEAK_FLOPS_BF16`; None elsewhere."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, flops in PEAK_FLOPS_BF16:
        if key in name:
            return flops
    return None


class Throughput:
    """Tokens per second between logged steps (the loss read there waits for the device,
    so the times are the device's), and over the whole invocation after its first step."""

    def __init__(self, t0: float) -> None:
        self.t_prev = t0
        self.step_prev: int | None = None
        self.first: tuple[float, int] | None = None
        self.last: tuple[float, int] | None = None
        self.first_rate: float | None = None

    def at(self, now: float, step: int, tokens_per_step: int) -> float | None:
        steps = 1 if self.step_prev is None else step - self.step_prev
        dt = now - self.t_prev
        rate = steps * tokens_per_step / dt if dt > 0 else None
        if self.first is None:
            self.first, self.first_rate = (now, step), rate
        self.last = (now, step)
        self.t_prev, self.step_prev = now, step
        return rate

    def overall(self, tokens_per_step: int) -> float | None:
        if self.first is None or self.last is None:
            return None
        (t0, s0), (t1, s1) = self.first, self.last
        if s1 == s0:  # one step: its own rate, warm-up included
            return self.first_rate
        return (s1 - s0) * tokens_per_step / (t1 - t0) if t1 > t0 else None


def measure_matmul_flops(device: torch.device, dtype: torch.dtype, n: int = 8192, reps: int = 10) -> float:
    """FLOP/s of an n x n x n matmul in `dtype` on `device`, timed once (a few hundred ms
    on a GPU): the rate this card reaches, beside its datasheet's."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(2):
        a @ b
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync()
    return 2.0 * n**3 * reps / (time.perf_counter() - t0)


@dataclass
class Peak:
    """What MFU is measured against: the card's datasheet peak (dense, the autocast dtype's
    tensor cores; `PEAK_FLOPS_BF16`) and the matmul rate measured at start."""

    card: str
    datasheet: float | None
    measured: float | None

    @classmethod
    def of(cls, device: torch.device, amp_dtype: torch.dtype | None, given: float | None) -> Peak:
        if device.type != "cuda":
            return cls(device.type, given, None)
        name = torch.cuda.get_device_name(device)
        measured = measure_matmul_flops(device, amp_dtype or torch.float32)
        return cls(name, given or peak_flops_for(device), measured)

    def mfu(self, flops_per_token: float, tokens_per_s: float | None, world_size: int) -> dict[str, float | None]:
        def share(peak: float | None) -> float | None:
            return flops_per_token * tokens_per_s / (peak * world_size) if (peak and tokens_per_s) else None

        return {"mfu": share(self.datasheet), "mfu_measured": share(self.measured)}

    def describe(self) -> str:
        measured = (
            f"{self.measured / 1e12:.0f} TFLOP/s measured (8192^3 matmul)" if self.measured else ("no measured rate")
        )
        if self.datasheet is None:
            return f"MFU: {self.card} is not in the datasheet table (PEAK_FLOPS_BF16): MFU against the {measured} only"
        return f"MFU against {self.card}'s datasheet peak {self.datasheet / 1e12:.0f} TFLOP/s and {measured}"
