"""Prefect tasks of the document stages (`pipeline_lib.stages.documents`), made from the
registry: a new document stage gets its task, log line and table artifact here unasked."""

from __future__ import annotations

from typing import Any

from prefect.artifacts import create_table_artifact

from pipeline_lib.stages.documents import DocumentStage, document_stages
from tasks.factory import StageTasks, artifact_key, stage_tasks


def _shown(entry: DocumentStage):
    def after(store, ref, logger) -> None:
        figures = dict(entry.summary(store.manifest(ref.kind, ref.version)["meta"]))
        logger.info(
            "%s: %s -> %s", entry.stage.name, ", ".join(f"{k} {_number(v)}" for k, v in figures.items()), ref.uri
        )
        create_table_artifact(
            key=artifact_key(f"{entry.option.replace('_', '-')}-summary", store, ref),
            table=[{"figure": k, "value": v} for k, v in figures.items()],
            description=f"{entry.stage.name} {ref.version}: {entry.title}",
        )

    return after


def _number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def document_tasks() -> dict[str, StageTasks]:
    """``{option: StageTasks}`` of every registered document stage."""
    return {entry.option: stage_tasks(entry.stage, after=_shown(entry)) for entry in document_stages()}


DOCUMENT_TASKS = document_tasks()
