"""Prefect task: train the GPT on the token shards and publish the model version."""

from __future__ import annotations

import base64

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from pipeline_lib.stages.lm import LM
from tasks.factory import artifact_key, stage_tasks


def _trained(store, ref, logger) -> None:
    manifest = store.manifest(ref.kind, ref.version)
    m = manifest["meta"]["metrics"]
    create_table_artifact(
        key=artifact_key("lm-metrics", store, ref),
        table=[{"metric": k, "value": v} for k, v in m.items() if not isinstance(v, (list, dict))],
        description=f"Model {ref.version}: final metrics",
    )
    png = store.read_bytes(ref.kind, ref.version, "loss.png")
    samples = "\n\n".join(f"```text\n{s}\n```" for s in manifest["meta"]["samples"])
    create_markdown_artifact(
        key=artifact_key("lm-report", store, ref),
        markdown=(
            f"## Language model {ref.version}\n\n"
            f"![loss curve](data:image/png;base64,{base64.b64encode(png).decode()})\n\n"
            f"Loss curve file: `{store.uri(ref.kind, ref.version, 'loss.png')}`\n\n### Samples\n\n{samples}\n"
        ),
        description="Loss curve (train/val) and generated samples",
    )


TRAIN = stage_tasks(LM, after=_trained, progress_artifact="lm-training")
train_lm = TRAIN.task
