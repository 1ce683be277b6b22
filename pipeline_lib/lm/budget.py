"""The time budget of a training run (`TrainConfig.time_budget_s`; docs/lm.md).

Calibrate, then plan: after the first steps (`CALIBRATION_STEPS` at most, within warmup) the
run commits to the step count that fits (`plan_steps`) and the LR schedule is stretched over
it (`stretch_schedule`); the plan is recorded in out_dir (`PLAN_FILE`) and in checkpoints, so
a resumed run keeps it. Then, after every step, `Budget` stops a run whose machine slowed
down before it overruns the budget by more than about one step.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline_lib.lm.checkpoint import _json_bytes
from pipeline_lib.lm.config import TrainConfig

clock = time.monotonic  # the budget's clock (a module global for tests)
CALIBRATION_STEPS = 10  # most steps measured before a time-budgeted run is planned
PLAN_FILE = "plan.json"  # in out_dir: the step plan of a time-budgeted run


def plan_steps(
    cfg: TrainConfig, *, done: int, elapsed_s: float, step_s: float, eval_s: float, evals: bool = True
) -> int:
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


def plan_key(cfg: TrainConfig, world_size: int) -> str:
    blob = json.dumps({"train_config": cfg.versioned_dict(), "world_size": world_size}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def read_plan(out_dir: Path, key: str) -> dict[str, Any] | None:
    """The plan recorded in out_dir by an earlier run of the same config, if any."""
    try:
        plan = json.loads((out_dir / PLAN_FILE).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(plan, dict) and plan.get("key") == key and is_pos_int(plan.get("planned_steps"))
    return plan if ok else None


def is_pos_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def write_plan(out_dir: Path, plan: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{PLAN_FILE}.tmp-{os.getpid()}"
    tmp.write_bytes(_json_bytes(plan))
    os.replace(tmp, out_dir / PLAN_FILE)


class Budget:
    """The time budget's bookkeeping: step, evaluation and checkpoint times as measured.

    A step's time is start to start less the evaluations and checkpoint taken in it,
    which are counted on their own. After each step training stops when the next one
    (at the longest of the last few step times: a machine that slows down is seen at
    once), the evaluations due at it and the final evaluations and checkpoint would end
    more than one such step past the budget. The overshoot this allows: one step, plus
    however much the next step, the final evaluations and the checkpoint take beyond
    what was measured before them."""

    RECENT = 5  # steps whose times predict the next one

    def __init__(self, seconds: float | None, t_start: float) -> None:
        self.seconds, self.t_start = seconds, t_start
        self.step_times: list[float] = []
        self.eval_s: float | None = None
        self.ckpt_s = 0.0  # the last checkpoint's copy and background write
        self.stopped_at: int | None = None
        self.t_decided: float | None = None  # when the last step's stop-or-go was decided
        self._t_step: float | None = None
        self._excluded = 0.0  # evaluations and checkpoints of the current step

    def now(self) -> float | None:
        """The budget clock's time, when there is a budget (None: nothing is timed)."""
        return clock() if self.seconds is not None else None

    def step_starts(self) -> None:
        t = self.now()
        if t is None:
            return
        if self._t_step is not None:
            self.step_times.append(t - self._t_step - self._excluded)
        self._t_step, self._excluded = t, 0.0

    def step_times_until(self, now: float) -> list[float]:
        """The finished steps' times and the current one's so far (its optimizer step)."""
        assert self._t_step is not None
        return [*self.step_times, now - self._t_step]

    def eval_took(self, t_eval: float | None, final: bool = False) -> None:
        if t_eval is None:
            return
        seconds = clock() - t_eval
        self._excluded += seconds
        if not final:  # the final ones (val and train split) are two: the next run's estimate is one
            self.eval_s = seconds

    def ckpt_took(self, on_this_thread: float, in_all: float) -> None:
        self._excluded += on_this_thread
        self.ckpt_s = in_all

    def recent_step_s(self, step_times: list[float]) -> float:
        return max(step_times[-self.RECENT :], default=0.0)

    def no_time_for_another_step(self, now: float, step_times: list[float], next_evals: bool, final_evals: int) -> bool:
        assert self.seconds is not None
        step_s = self.recent_step_s(step_times)
        eval_s = self.eval_s or 0.0
        need = step_s + (eval_s if next_evals else 0.0) + final_evals * eval_s + self.ckpt_s
        return now + need > self.t_start + self.seconds + step_s


def make_plan(
    cfg: TrainConfig,
    out_dir: Path,
    key: str,
    emit: Callable[[str], None],
    rank0: Callable[[int], int] | None = None,
    write: bool = True,
    *,
    done: int,
    elapsed_s: float,
    step_times: list[float],
    eval_s: float | None,
    evals: bool,
) -> int:
    """Commit a time-budgeted run to its step count, recorded in out_dir. Under DDP `rank0`
    gives rank 0's count to every rank, and only rank 0 `write`s and logs it."""
    # The first step of a process pays one-off costs (allocations, kernel selection).
    timed = step_times[1:] or step_times
    step_s = sum(timed) / len(timed)
    if eval_s is None:  # resumed before any evaluation of this process: a forward pass is ~1/3 of a step
        eval_s = step_s * cfg.eval_iters / 3
    planned = plan_steps(cfg, done=done, elapsed_s=elapsed_s, step_s=step_s, eval_s=eval_s, evals=evals)
    if rank0 is not None:
        planned = rank0(planned)
    if write:
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
        write_plan(out_dir, plan)
        need = elapsed_s + (planned - done) * step_s
        over = (
            f" (~{need:.0f} s: the shortest complete schedule overruns the budget)"
            if need > (cfg.time_budget_s or 0)
            else ""
        )
        emit(
            f"time budget {cfg.time_budget_s:g} s: {elapsed_s:.1f} s used, {step_s:.3f} s/step, {eval_s:.2f} s/eval "
            f"-> {planned} of at most {cfg.max_steps} steps, LR schedule stretched to end there{over}"
        )
    return planned
