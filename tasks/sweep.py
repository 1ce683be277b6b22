"""Prefect task: compare a sweep's arms (their model versions) and publish the ``sweep`` version."""

from __future__ import annotations

from collections.abc import Mapping

from pipeline_lib.store import VersionRef
from pipeline_lib.sweep import SweepConfig, sweep_stage
from tasks.factory import stage_tasks


def compare_task(
    store_url: str, models: Mapping[str, VersionRef], config: SweepConfig, storage_options: dict | None = None
) -> VersionRef:
    """Run the `compare_arms` stage over `models` (arm name -> model ref) in the current flow.

    The stage's inputs are the sweep's arms, so its task is made per sweep; it is cached
    like every stage task, on the version id (which hashes the arms' model ids)."""
    return stage_tasks(sweep_stage(list(models)))(store_url, models, config, storage_options)
