"""Reports of a training run: a loss plot (matplotlib, Agg backend) and a metrics dict.

`metrics` is everything about a run; it splits into `versioned_metrics` (a function of the
training alone: the same for every run of it, so it can live in a content-addressed
version) and `run_metrics` (timings, device, paths, resume notes: `RUN_METRICS`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from pipeline_lib.lm.trainer import TrainResult

# Metrics that describe one invocation (how fast, where, what was resumed), not the model.
RUN_METRICS = ("tokens_per_s", "mfu", "mfu_measured", "wall_s", "device", "checkpoint_dir", "run_messages")


def write_loss_plot(
    history: list[dict[str, Any]], path_png: str | os.PathLike[str], title: str = "GPT training"
) -> Path:
    """Train and val loss (nats/token) against step, val bits/byte on a second axis.

    Uses the Agg canvas directly (no pyplot, no global backend switch)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    tr = [(h["step"], h["train_loss"]) for h in history if h.get("train_loss") is not None]
    va = [(h["step"], h["val_loss"]) for h in history if h.get("val_loss") is not None]
    bpb = [(h["step"], h["val_bpb"]) for h in history if h.get("val_bpb") is not None]
    if tr:
        ax.plot(*zip(*tr), label="train loss", color="tab:blue", linewidth=1)
    if va:
        ax.plot(*zip(*va), label="val loss", color="tab:orange", marker="o", markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if bpb:
        ax2 = ax.twinx()
        ax2.plot(*zip(*bpb), label="val bits/byte", color="tab:green", linestyle="--", marker=".")
        ax2.set_ylabel("bits/byte")
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    if handles:
        ax.legend(handles, labels, loc="upper right")
    ax.set_title(title)
    fig.tight_layout()
    path = Path(path_png)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def _num(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else x


def metrics(result: TrainResult) -> dict[str, Any]:
    """A flat JSON-able summary of a run."""
    vals = [h["val_loss"] for h in result.history if h.get("val_loss") is not None]
    return {
        "final_train_loss": _num(result.final_train_loss),
        "final_val_loss": _num(result.final_val_loss),
        "best_val_loss": min(vals) if vals else None,
        "val_bpb": _num(result.val_bpb),
        "steps": result.steps,  # reached
        "planned_steps": result.max_steps,  # the run's length: max_steps, or the time budget's plan
        "planned_by_time_budget": result.planned_by_budget,
        "stopped_by_time_budget": result.stopped_by_budget,  # before the plan's end: the machine slowed down
        "tokens_per_s": _num(result.tokens_per_s),
        "mfu": _num(result.mfu),
        "mfu_measured": _num(result.mfu_measured),
        "wall_s": _num(result.wall_s),
        "n_params": result.n_params,
        "device": result.device,
        "checkpoint_dir": result.checkpoint_dir,
        "messages": list(result.messages),
        "run_messages": list(result.run_messages),
    }


def versioned_metrics(result: TrainResult) -> dict[str, Any]:
    """`metrics` without `RUN_METRICS`: losses, bits/byte, steps, parameters, data warnings."""
    return {k: v for k, v in metrics(result).items() if k not in RUN_METRICS}


def run_metrics(result: TrainResult) -> dict[str, Any]:
    """The `RUN_METRICS` of `metrics`: throughput, MFU, device, checkpoint path, resume notes."""
    m = metrics(result)
    return {k: m[k] for k in RUN_METRICS}


def write_metrics(result: TrainResult, path_json: str | os.PathLike[str]) -> Path:
    path = Path(path_json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(metrics(result), indent=2) + "\n")
    return path
