"""tokenmill language-model stage: a GPT trained on token shards.

    from pipeline_lib.lm import GPTConfig, TrainConfig, train, load_model, sample

    cfg = preset("small", max_steps=500)                # or TrainConfig(model=GPTConfig(...), ...)
    result = train(cfg, "tokens/", "runs/lm")            # -> TrainResult
    model = load_model("runs/lm")                        # latest complete checkpoint (checked against its marker)
    ids = sample(model, [sep_id], 200, temperature=0.8, top_k=50, seed=0)

CLI: ``python -m pipeline_lib.lm train ...`` / ``python -m pipeline_lib.lm sample ...``.

This package works on local paths and knows nothing of the artifact store; a model
published there is loaded with `pipeline_lib.model_stage.load_published_model`, which
checks its weights against the version manifest.
"""

from pipeline_lib.lm.checkpoint import CheckpointError, latest_checkpoint, list_checkpoints, load_model
from pipeline_lib.lm.config import PRESETS, GPTConfig, TrainConfig, preset
from pipeline_lib.lm.data import ShardError, TokenShards, WindowSampler
from pipeline_lib.lm.model import GPT
from pipeline_lib.lm.report import metrics, write_loss_plot, write_metrics
from pipeline_lib.lm.sample import sample
from pipeline_lib.lm.train import TrainResult, bits_per_byte, evaluate, lr_at, train

__all__ = [
    "GPT",
    "PRESETS",
    "CheckpointError",
    "GPTConfig",
    "ShardError",
    "TokenShards",
    "TrainConfig",
    "TrainResult",
    "WindowSampler",
    "bits_per_byte",
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
