"""Stage: train the GPT on a tokens version and publish the model version.

`pipeline_lib.model_stage.train_language_model` reuses, claims, trains (resumably) and
publishes by itself; its module is part of the model's code version, so it stays there.
Imported on its own (`pipeline_lib.stages.lm`), not by the package: model_stage imports
`pipeline_lib.stages`.
"""

from __future__ import annotations

from typing import Any

from pipeline_lib import model_stage
from pipeline_lib.lm.config import TrainConfig
from pipeline_lib.model_stage import LM_MODULES, MODEL_KIND
from pipeline_lib.stages.spec import Context, Stage
from pipeline_lib.store import VersionRef


def _params(config: TrainConfig) -> dict[str, Any]:
    return config.versioned_dict()


def _train(ctx: Context) -> VersionRef:
    config, progress = ctx.config, ctx.progress

    def on_step(event: dict[str, Any]) -> None:
        if progress is not None:
            progress(event["step"], event.get("max_steps", config.max_steps))  # the time budget's plan, once made

    return model_stage.train_language_model(
        ctx.store,
        ctx.inputs["tokens"],
        ctx.inputs["tokenizer"],
        config,
        log=ctx.log,
        on_step=on_step,
    )


LM = Stage(
    name="train_lm",
    kind=MODEL_KIND,
    inputs=("tokens", "tokenizer"),
    config=TrainConfig,
    code=LM_MODULES,
    run=_train,
    params=_params,
    publishes=True,
)
