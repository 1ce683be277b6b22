"""The pipeline's LM stage parameters (`LMConfig`): what `tokenmill run`, the flows and the
deployments take, checked by pydantic like every stage's config. Kept apart from
`pipeline_lib.lm.config` so that the model and the trainer need no pydantic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pipeline_lib.config import STRICT, doc
from pipeline_lib.errors import ConfigError
from pipeline_lib.lm.config import TrainConfig, _is_int, preset

# What the pipeline's LM stage takes: a preset, the run length and a few overrides. It is
# the one place their defaults live (CLI options, flow parameters and deployments derive
# from these fields); `train_config()` turns it into the full `TrainConfig`.
# The run length is a cap and a time budget: `steps` at most, planned down to what fits in
# `minutes` (see `plan_steps` in train.py). The default, 1 minute of the "small" model, keeps
# `tokenmill run` (everything, fixed costs included) well within 90 s on an idle 2-core
# machine: ~200 steps there, the preset's whole 600 on a faster one. `steps` None keeps the
# preset's own count (and its schedule); a number replaces it.

MODEL_OVERRIDES = ("n_layer", "n_head", "n_embd", "n_hidden", "block_size", "batch_size")


@dataclass(frozen=True)
class LMConfig:
    __pydantic_config__ = STRICT

    preset: Annotated[
        Literal["tiny", "small", "gpt2-124m", "mlp"],
        doc("model size and recipe (mlp: not a GPT, the first BPE tutorial's MLP language model)"),
    ] = "small"
    steps: Annotated[
        int | None,
        doc("optimizer steps, at most (none: the preset's own: 600 for small, 19073 for gpt2-124m, 141500 for mlp)"),
    ] = None
    minutes: Annotated[
        float | None,
        doc(
            "time budget of the LM training: after a few measured steps the run is planned to the step count "
            "that fits (at most --lm-steps) and the LR schedule completes there (none: all the steps)"
        ),
    ] = 1.0
    device: Annotated[str, doc("auto (CUDA, else MPS, else CPU), cpu, cuda, cuda:N, mps")] = "auto"
    seed: Annotated[int, doc("seed for model init, dropout and data order")] = 1337
    n_layer: Annotated[int | None, doc("override the preset's n_layer (transformer blocks)")] = None
    n_head: Annotated[int | None, doc("override the preset's n_head (attention heads per block)")] = None
    n_embd: Annotated[
        int | None, doc("override the preset's n_embd (residual stream width; the mlp's embedding width per token)")
    ] = None
    n_hidden: Annotated[int | None, doc("override the mlp preset's n_hidden (tanh units of its hidden layer)")] = None
    block_size: Annotated[
        int | None, doc("override the preset's block_size (context length in tokens; the mlp reads this many)")
    ] = None
    batch_size: Annotated[int | None, doc("override the preset's batch_size (windows per micro-batch)")] = None

    def __post_init__(self) -> None:
        if self.steps is not None and (not _is_int(self.steps) or self.steps < 1):
            raise ConfigError(f"steps={self.steps!r}: the LM needs at least 1 optimizer step")
        if self.minutes is not None and not (isinstance(self.minutes, (int, float)) and self.minutes > 0):
            raise ConfigError(f"minutes={self.minutes!r}: the LM time budget must be > 0 minutes (or none)")
        try:
            self.train_config()
        except ValueError as e:
            raise ConfigError(str(e)) from e

    def train_config(self) -> TrainConfig:
        """The full training config: the preset with these overrides. A short run gets a
        proportionate eval/checkpoint cadence and warmup."""
        overrides = {k: getattr(self, k) for k in MODEL_OVERRIDES if getattr(self, k) is not None}
        overrides["time_budget_s"] = None if self.minutes is None else float(self.minutes) * 60.0
        if self.steps is None:
            return preset(self.preset, device=self.device, seed=self.seed, **overrides)
        steps = self.steps
        cfg = preset(self.preset, device=self.device, seed=self.seed, max_steps=steps, **overrides)
        interval = max(1, min(cfg.eval_interval, steps // 4 or 1))
        return cfg.replace(
            eval_interval=interval,
            ckpt_interval=max(interval, min(cfg.ckpt_interval, steps)),
            warmup_steps=min(cfg.warmup_steps, max(0, steps // 10)),
        )
