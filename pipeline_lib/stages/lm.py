"""Stage: train the GPT on a tokens version and publish the model version.

`pipeline_lib.model_stage.train_and_stage` trains (resumably: checkpoints in the store's
work dir for this version) and stages the files; the engine versions, claims and publishes
them like every stage's, and `model_stage.after_publish` then drops the work dir.
Imported on its own (`pipeline_lib.stages.lm`), not by the package: it pulls in torch.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from pipeline_lib import model_stage
from pipeline_lib.lm.config import TrainConfig
from pipeline_lib.model_stage import MODEL_KIND
from pipeline_lib.stages import spec
from pipeline_lib.stages.spec import Context, Output, Stage
from pipeline_lib.store import ArtifactStore, VersionRef


def _params(config: TrainConfig) -> dict[str, Any]:
    return config.versioned_dict()


def _train(
    ctx: Context,
    on_eval: Callable[[dict[str, Any]], None] | None = None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    n_samples: int = 2,
    sample_tokens: int = 160,
) -> Output:
    config, progress = ctx.config, ctx.progress
    assert ctx.staging is not None  # the engine publishes this stage

    def step(event: dict[str, Any]) -> None:
        if progress is not None:
            progress(event["step"], event.get("max_steps", config.max_steps))  # the time budget's plan, once made
        if on_step is not None:
            on_step(event)

    files, meta = model_stage.train_and_stage(
        ctx.store,
        ctx.staging,
        ctx.inputs["tokens"],
        ctx.inputs["tokenizer"],
        config,
        log=ctx.log,
        on_eval=on_eval,
        on_step=step,
        n_samples=n_samples,
        sample_tokens=sample_tokens,
    )
    return Output(files=files, meta=meta)


def _published(ctx: Context, ref: VersionRef) -> None:
    model_stage.after_publish(ctx.store, ref, ctx.log)


LM = Stage(
    name="train_lm",
    kind=MODEL_KIND,
    inputs=("tokens", "tokenizer"),
    config=TrainConfig,
    output_version=1,
    run=_train,
    params=_params,
    published=_published,
)


def model_version(tokens: VersionRef, tokenizer: VersionRef, train_config: TrainConfig) -> str:
    """The model version id: tokens and tokenizer ids, the config fields that decide the
    weights (`TrainConfig.versioned_dict`) and the LM's output version."""
    version = LM.version({"tokens": tokens, "tokenizer": tokenizer}, train_config)
    assert version is not None  # a stage with params: never content-addressed
    return version


def train_language_model(
    store: ArtifactStore,
    tokens: VersionRef,
    tokenizer: VersionRef,
    train_config: TrainConfig,
    *,
    log: Callable[[str], None] | None = None,
    on_eval: Callable[[dict[str, Any]], None] | None = None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    n_samples: int = 2,
    sample_tokens: int = 160,
) -> VersionRef:
    """Train (or resume) a GPT on `tokens` and publish it as a `model` version.

    Returns the published version's ref; a version already published (and sound: see
    `ArtifactStore.usable`) is returned as is, and a concurrent run of the same version
    waits for the first one and returns its ref.

    Raises:
        InputError: tokens and tokenizer disagree on the vocabulary size.
        StoreError: an input file does not match its manifest.
    """
    run = functools.partial(_train, on_eval=on_eval, on_step=on_step, n_samples=n_samples, sample_tokens=sample_tokens)
    stage = dataclasses.replace(LM, run=run)
    return spec.produce(stage, store, {"tokens": tokens, "tokenizer": tokenizer}, train_config, log=log)
