"""Prefect task: train the GPT on the token shards and publish the model version."""

from __future__ import annotations

import base64
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, create_table_artifact, update_progress_artifact

from pipeline_lib.model_stage import MODEL_KIND, model_version, train_language_model
from tasks.common import checked_key, progress, ref_dict, store_of, to_ref


def _lm_key(context, parameters: dict[str, Any]) -> str:
    version = model_version(to_ref(parameters["tokens"]), to_ref(parameters["tokenizer"]), parameters["config"])
    store = store_of(parameters["store_url"], parameters.get("storage_options"))
    return checked_key(store, f"lm-{version}", store.usable(MODEL_KIND, version))


@task(name="train_lm", cache_key_fn=_lm_key, persist_result=True, result_serializer="json")
def train_lm(store_url: str, tokens: dict[str, str], tokenizer: dict[str, str], config, storage_options: dict | None = None) -> dict[str, str]:
    logger = get_run_logger()
    store = store_of(store_url, storage_options)
    progress_id = create_progress_artifact(progress=0.0, key="lm-training", description="LM training steps")

    def on_eval(event: dict[str, Any]) -> None:
        update_progress_artifact(progress_id, progress=100.0 * event["step"] / max(1, config.max_steps))

    def on_step(event: dict[str, Any]) -> None:
        progress("train_lm (steps)", done=event["step"], total=config.max_steps)

    ref = train_language_model(store, to_ref(tokens), to_ref(tokenizer), config, log=logger.info, on_eval=on_eval, on_step=on_step)
    update_progress_artifact(progress_id, progress=100.0)
    manifest = store.manifest(ref.kind, ref.version)
    m = manifest["meta"]["metrics"]
    create_table_artifact(
        key="lm-metrics",
        table=[{"metric": k, "value": v} for k, v in m.items() if not isinstance(v, (list, dict))],
        description=f"Model {ref.version}: final metrics",
    )
    png = store.read_bytes(ref.kind, ref.version, "loss.png")
    samples = "\n\n".join(f"```text\n{s}\n```" for s in manifest["meta"]["samples"])
    create_markdown_artifact(
        key="lm-report",
        markdown=(
            f"## Language model {ref.version}\n\n"
            f"![loss curve](data:image/png;base64,{base64.b64encode(png).decode()})\n\n"
            f"Loss curve file: `{store.uri(ref.kind, ref.version, 'loss.png')}`\n\n### Samples\n\n{samples}\n"
        ),
        description="Loss curve (train/val) and generated samples",
    )
    return ref_dict(ref)
