"""tokenmill language-model stage: a GPT (or the tutorial's MLP, preset "mlp") trained on token shards.

    from pipeline_lib.lm import GPTConfig, TrainConfig, train, load_model, sample

    cfg = preset("small", max_steps=500)                # or TrainConfig(model=GPTConfig(...), ...)
    result = train(cfg, "tokens/", "runs/lm")            # -> TrainResult
    model = load_model("runs/lm")                        # latest complete checkpoint (checked against its marker)
    ids = sample(model, [sep_id], 200, temperature=0.8, top_k=50, seed=0)

CLI: ``python -m pipeline_lib.lm train ...`` / ``sample ...`` / ``plan ...`` (the memory plan).

This package works on local paths and knows nothing of the artifact store; a model
published there is loaded with `pipeline_lib.model_stage.load_published_model`, which
checks its weights against the version manifest.
"""

# The names below load on first use (PEP 562): `pipeline_lib.lm.config` (the LM's config,
# which every flow's signature names) must import without torch, which most of the rest needs.
# The functions `train` and `sample` live in modules named otherwise (`trainer`, `sampling`):
# importing a submodule binds its name on the package, which would hide a function of that name.
import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what __getattr__ below resolves at runtime, spelled out for type checkers
    from pipeline_lib.lm.checkpoint import CheckpointError, latest_checkpoint, list_checkpoints, load_model
    from pipeline_lib.lm.config import PRESETS, GPTConfig, MLPConfig, TrainConfig, preset
    from pipeline_lib.lm.data import ShardError, TokenShards, WindowSampler
    from pipeline_lib.lm.mlp import MLPLanguageModel
    from pipeline_lib.lm.model import GPT, build_model
    from pipeline_lib.lm.report import metrics, write_loss_plot, write_metrics
    from pipeline_lib.lm.sampling import sample
    from pipeline_lib.lm.trainer import TrainResult, bits_per_byte, evaluate, lr_at, train

_SOURCES = {
    "checkpoint": ("CheckpointError", "latest_checkpoint", "list_checkpoints", "load_model"),
    "config": ("PRESETS", "GPTConfig", "MLPConfig", "TrainConfig", "preset"),
    "data": ("ShardError", "TokenShards", "WindowSampler"),
    "mlp": ("MLPLanguageModel",),
    "model": ("GPT", "build_model"),
    "report": ("metrics", "write_loss_plot", "write_metrics"),
    "sampling": ("sample",),
    "trainer": ("TrainResult", "bits_per_byte", "evaluate", "lr_at", "train"),
}
_MODULE_OF = {name: module for module, names in _SOURCES.items() for name in names}


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULE_OF))


__all__ = [
    "GPT",
    "PRESETS",
    "CheckpointError",
    "GPTConfig",
    "MLPConfig",
    "MLPLanguageModel",
    "ShardError",
    "TokenShards",
    "TrainConfig",
    "TrainResult",
    "WindowSampler",
    "bits_per_byte",
    "build_model",
    "evaluate",
    "latest_checkpoint",
    "list_checkpoints",
    "load_model",
    "lr_at",
    "metrics",
    "preset",
    "sample",
    "train",
    "write_loss_plot",
    "write_metrics",
]
