"""One factory turns a `pipeline_lib` stage spec into Prefect tasks; one cache policy for all.

    counts = stage_tasks(stages.COUNTS, after=...)   # reduce_counts, and count_words per shard
    ref = counts(store_url, {"corpus": corpus_ref}, CountConfig(), storage_options)

A stage task calls the engine (`pipeline_lib.stages.spec.produce`, `run_unit`) and returns what
tasks hand each other: a `VersionRef` (kind, version, uri, manifest sha256; stored as JSON in
the task's result) or, for a unit task, the unit's completion record. Retries, where a stage
asks for them, are for transient failures only (`retry_if_transient`).

Caching (`StoreCachePolicy`): the key is the output's identity (its version id, which
already hashes the inputs' ids, the config and the stage's output version; plus the unit for a unit task) and
the store. A cached result counts only while the store still holds what it describes: the
policy reads the record Prefect has under the key and checks it against the store. When the
store lost it (wiped, `gc`, quarantined), the key moves to the next generation
(``<key>.1``, ``<key>.2``, ...), so the task runs again and its new result is recorded there;
stale records stay where they are, never deleted by us, and are skipped. A rerun therefore
finds the first generation whose record the store still backs: Cached.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast
from uuid import UUID

from prefect import Task, get_run_logger, task, unmapped
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import CachePolicy

from pipeline_lib.errors import CancelledError
from pipeline_lib.stages import spec as engine
from pipeline_lib.stages.spec import Stage
from pipeline_lib.store import ArtifactStore, VersionRef
from tasks.common import progress, retry_if_transient, staging_kept, store_of, to_ref

# How many stale generations of one key to step over before giving up on caching that run
# (each generation is one lost output: a store wiped this often is not worth caching).
MAX_GENERATIONS = 32


@dataclass
class StoreCachePolicy(CachePolicy):
    """Cache a stage task on its output's identity and store, valid while the store holds it."""

    stage: Stage | None = None
    unit: bool = False  # a unit task of a mapped stage (its key names the unit)

    def _stage(self) -> Stage:
        # a dataclass field with a default, for CachePolicy's sake
        assert self.stage is not None, "StoreCachePolicy needs its stage"
        return self.stage

    def compute_key(
        self, task_ctx, inputs: dict[str, Any], flow_parameters: dict[str, Any], **kwargs: Any
    ) -> str | None:
        stage = self._stage()
        store = store_of(inputs["store_url"], inputs.get("storage_options"))
        parents = {name: to_ref(ref) for name, ref in (inputs.get("parents") or {}).items()}
        config = inputs["config"]
        identity = engine.cache_identity(stage, parents, config)
        if identity is None:  # not knowable before the run (an unreachable source): no caching
            return None
        if self.unit:
            assert stage.units is not None
            first, last = _unit_span(inputs)
            name, unit = stage.units.name, f"-{engine.unit_name(first)}" + (f"-{last:06d}" if last != first else "")
        else:
            name, unit = stage.name, ""
        base = f"{name}-{identity}{unit}-{hashlib.sha256(store.url.encode()).hexdigest()[:8]}"
        results = task_ctx.result_store
        for generation in range(MAX_GENERATIONS):
            key = base if generation == 0 else f"{base}.{generation}"
            if not results.exists(key):
                return key
            try:
                value = results.read(key).result
            except Exception:  # an unreadable record: step over it like a stale one
                continue
            if self.holds(store, parents, config, inputs, value):
                return key
        return None

    def holds(
        self, store: ArtifactStore, parents: dict[str, VersionRef], config: Any, inputs: dict[str, Any], value: Any
    ) -> bool:
        """Whether the store still backs `value`, a result recorded under this task's key."""
        stage = self._stage()
        if self.unit:
            first, last = _unit_span(inputs)
            return engine.unit_present(stage, store, parents, config, range(first, last + 1))
        try:
            ref = to_ref(value)
        except TypeError:
            return False
        return ref.kind == stage.kind and engine.output_current(store, ref)


def _unit_span(parameters: dict[str, Any]) -> tuple[int, int]:
    """(first, last) unit of a unit task's group, from its parameters."""
    first = parameters["unit"]
    last = parameters.get("last")
    return first, first if last is None else last


def _unit_run_name(units_name: str):
    def name(parameters: dict[str, Any]) -> str:
        first, last = _unit_span(parameters)
        shards = f"shard={first}" if last == first else f"shards={first}-{last}"
        label = parameters.get("label")
        return f"{units_name}[{shards}/{parameters.get('n_units')}]" + (f" {label}" if label else "")

    return name


class _Progress:
    """A stage's progress callback ``(done, total)``: the CLI's bars, a log line per tenth,
    and a Prefect progress artifact (updated per percent) where the stage asks for one."""

    def __init__(self, name: str, artifact_key: str | None):
        self.name, self.logger = name, get_run_logger()
        # Prefect types these helpers as sync-or-async; called from a sync task they return the value.
        self.artifact = (
            cast(UUID, create_progress_artifact(progress=0.0, key=artifact_key, description=f"{name} progress"))
            if artifact_key
            else None
        )
        self.tenth = self.percent = 0

    def __call__(self, done: int, total: int) -> None:
        progress(self.name, done=done, total=total)
        fraction = done / total if total else 1.0
        if math.floor(fraction * 10) > self.tenth:
            self.tenth = math.floor(fraction * 10)
            self.logger.info("%s: %s / %s", self.name, f"{done:,}", f"{total:,}")
        if self.artifact is not None and math.floor(fraction * 100) > self.percent:
            self.percent = math.floor(fraction * 100)
            update_progress_artifact(self.artifact, progress=float(self.percent))

    def finish(self) -> None:
        if self.artifact is not None:
            update_progress_artifact(self.artifact, progress=100.0)


def _follow(futures, sizes: list[int], units_name: str, store_url: str, parents: Mapping[str, VersionRef]) -> None:
    """A live progress artifact of a mapped stage (shards done / total), keyed per stage, store
    and input as the other artifacts, updated in the flow as the groups of units finish.

    The groups are waited for in order (`wait`, as `result` would), not with Prefect's
    `as_completed`, whose done-callbacks hung a flow here: the count moves when the oldest
    unfinished group is done, a moment late where a later group finished first."""
    total = sum(sizes)
    inputs = "|".join(f"{name}={ref.version}" for name, ref in sorted(parents.items()))
    key = f"{units_name.replace('_', '-')}-progress-{hashlib.sha256(f'{store_url}|{inputs}'.encode()).hexdigest()[:8]}"
    artifact = cast(
        UUID, create_progress_artifact(progress=0.0, key=key, description=f"{units_name}: 0 / {total:,} shards done")
    )
    done, shown = 0, -1
    for future, n in zip(futures, sizes):
        _wait_awake(future)
        done += n
        percent = 100 * done // total if total else 100
        if percent > shown:  # one API call per percent (the last one included), not per task run
            shown = percent
            update_progress_artifact(
                artifact,
                progress=100.0 * done / total if total else 100.0,
                description=f"{units_name}: {done:,} / {total:,} shards done",
            )


def _group_labels(
    stage: Stage, store: ArtifactStore, refs: Mapping[str, VersionRef], config: Any, groups: list[range]
) -> list[str | None]:
    """What each group of units reads (its first and last unit's labels), for its task run's name."""
    if stage.units is None or stage.units.labels is None:
        return [None] * len(groups)
    labels = stage.units.labels(store, refs, config)
    return [labels[g.start] if len(g) == 1 else f"{labels[g.start]} .. {labels[g.stop - 1]}" for g in groups]


# How often the flow's main thread wakes while it waits for mapped tasks. A signal (the
# SIGTERM of a cancel, flows.cancellable) may be delivered to a worker thread that is in the
# compiled core; Python runs its handler only in the main thread, and only once that thread
# runs again: a wait without a timeout would hold it until the task ends.
WAKE_S = 0.2


def _wait_awake(future) -> None:
    """`future.wait()`, in short waits, so that the main thread runs signal handlers."""
    done = getattr(getattr(future, "wrapped_future", None), "done", None)
    if not callable(done):
        future.wait()
        return
    while not done():
        future.wait(timeout=WAKE_S)


def _task_options(retries: int) -> dict[str, Any]:
    options: dict[str, Any] = {"persist_result": True, "result_serializer": "json"}
    if retries:
        # Backoff (2 s, 8 s, 32 s ...): a server that answered 429 or 503 needs more than a moment.
        options.update(
            retries=retries,
            retry_delay_seconds=[2 * 4**i for i in range(retries)],
            retry_condition_fn=retry_if_transient,
        )
    return options


def _named(fn, name: str):
    """`fn` under the stage's name: Prefect tells tasks apart by qualname and code (every
    stage task shares the code), and a traceback (the CLI's ``in FILE:LINE (function)``)
    then names the stage that failed."""
    fn.__code__ = fn.__code__.replace(co_name=name, co_qualname=name)
    fn.__name__ = fn.__qualname__ = name
    return fn


@dataclass(frozen=True)
class StageTasks:
    """A stage's Prefect tasks: `task` makes (publishes) the output, `unit_task` does a
    group of consecutive units of a mapped stage. Calling it runs the stage inside a flow:
    the groups mapped on the flow's task runner, then the publish."""

    stage: Stage
    task: Task
    unit_task: Task | None = None

    after: Callable[[ArtifactStore, VersionRef, Any], None] | None = None
    # Work between the units and the publish, in the flow (the counts tree's merges).
    before_publish: Callable[[str, Mapping[str, VersionRef], Any, dict | None], None] | None = None

    def __call__(
        self,
        store_url: str,
        parents: Mapping[str, VersionRef],
        config: Any,
        storage_options: dict | None = None,
        bytes_per_task: int = 0,
    ) -> VersionRef:
        """Run the stage; a mapped stage's units go in groups of about `bytes_per_task`
        bytes (one task per group, `engine.unit_groups`; 0: one task per unit)."""
        parents = {name: to_ref(r) for name, r in parents.items()}
        if self.unit_task is None:
            ref = to_ref(cast(VersionRef, self.task(store_url, parents, config, None, storage_options)))
        else:
            groups = engine.unit_groups(
                self.stage, store_of(store_url, storage_options), parents, bytes_per_task, config
            )
            n = sum(len(g) for g in groups)
            labels = _group_labels(self.stage, store_of(store_url, storage_options), parents, config, groups)
            futures = self.unit_task.map(
                store_url,
                unmapped(parents),
                unmapped(config),
                [g.start for g in groups],
                unmapped(storage_options),
                unmapped(n),
                [g.stop - 1 for g in groups],
                labels,
            )
            _follow(futures, [g.stop - g.start for g in groups], self.stage.units.name, store_url, parents)  # type: ignore[union-attr]
            cancelled = next((f.state for f in futures if f.state.is_cancelled()), None)
            if cancelled is not None:  # a unit task stopped in the core (flows.cancellable): the stage is cancelled
                raise CancelledError(cancelled.message or f"{self.stage.name}: cancelled")
            # A unit task returns its group's records (a record alone: a result cached before groups).
            records = [
                record for group in futures.result() for record in (group if isinstance(group, list) else [group])
            ]
            if self.before_publish is not None:
                self.before_publish(store_url, parents, config, storage_options)
            # A result cached before tasks returned VersionRefs is its JSON form: to_ref reads both.
            ref = to_ref(cast(VersionRef, self.task(store_url, parents, config, records, storage_options)))
        if self.after is not None:
            # In the flow, not in the task: a Cached task does not run, and a nightly run with
            # nothing to do must still show (and link) the artifacts of the versions it reused.
            self.after(store_of(store_url, storage_options), ref, get_run_logger())
        return ref


def stage_tasks(
    stage: Stage,
    *,
    after: Callable[[ArtifactStore, VersionRef, Any], None] | None = None,
    unit_after: Callable[[dict[str, Any], Any], None] | None = None,
    retries: int = 0,
    progress_artifact: str | None = None,
) -> StageTasks:
    """The Prefect tasks of `stage`, cached with `StoreCachePolicy`.

    after(store, ref, logger): what the run shows once the output is there (log lines,
        Prefect artifacts), called in the flow, so Cached runs show it too;
        unit_after(record, logger): likewise per unit, in the unit's task.
    retries: retries of the publish task, for transient failures only.
    progress_artifact: key of a Prefect progress artifact to follow the stage's progress.
    """

    def run_stage(
        store_url: str,
        parents: Mapping[str, VersionRef],
        config: Any,
        unit_records: list[dict] | None = None,
        storage_options: dict | None = None,
    ) -> VersionRef:
        logger = get_run_logger()
        store = store_of(store_url, storage_options)
        refs = {name: to_ref(ref) for name, ref in parents.items()}
        report = _Progress(stage.name, progress_artifact)
        if stage.units is None:
            ref = engine.produce(stage, store, refs, config, progress=report, log=logger.info)
        else:
            version = stage.version(refs, config)
            assert version is not None  # a mapped stage's id is known before it runs
            with staging_kept(store, stage.kind, version, unit_records):
                ref = engine.produce(stage, store, refs, config, progress=report, log=logger.info)
        report.finish()
        return ref

    tags = ["tokenmill", f"stage:{stage.name}"]
    publish = task(name=stage.name, cache_policy=StoreCachePolicy(stage=stage), tags=tags, **_task_options(retries))(
        _named(run_stage, stage.name)
    )
    if stage.units is None:
        return StageTasks(stage, publish, after=after)

    units_name = stage.units.name

    def run_units(
        store_url: str,
        parents: Mapping[str, VersionRef],
        config: Any,
        unit: int,
        storage_options: dict | None = None,
        n_units: int | None = None,
        last: int | None = None,
        label: str | None = None,
    ) -> list[dict[str, Any]]:
        """Units `unit`..`last` (one unit when `last` is None), one after the other; each is
        skipped when already done, so a rerun after a crash redoes only the unfinished ones.
        `label` (what the units read) only names the task run."""
        store = store_of(store_url, storage_options)
        refs = {name: to_ref(ref) for name, ref in parents.items()}
        # the flow passes the count it mapped
        total = n_units if n_units is not None else engine.unit_count(stage, store, refs, config)
        records = []
        for index in range(unit, (unit if last is None else last) + 1):
            try:
                record = engine.run_unit(stage, store, refs, config, index)
            except CancelledError as e:
                return cast(list, cancelled_state(f"{units_name} shard {index}", e))
            if unit_after is not None:
                unit_after(record, get_run_logger())
            progress(f"{units_name} (shards)", advance=1, total=total)
            records.append(record)
        return records

    unit_task = task(
        name=units_name,
        cache_policy=StoreCachePolicy(stage=stage, unit=True),
        tags=["tokenmill", f"stage:{units_name}"],  # not the publish task's stage tag
        task_run_name=_unit_run_name(units_name),
        **_task_options(0),
    )(_named(run_units, units_name))
    return StageTasks(stage, publish, unit_task, after=after)


def cancelled_state(what: str, error: CancelledError):
    """The state a task returns when its native call was cancelled (the flow run is being
    cancelled, flows.cancellable): Cancelled, not Failed, and never cached."""
    from prefect.states import Cancelled

    message = (
        f"{what}: cancelled in the compiled core ({error}); its partial output stays in the staging area for "
        "`tokenmill gc`"
    )
    get_run_logger().warning(message)
    return Cancelled(message=message)


def artifact_key(base: str, store: ArtifactStore, ref: VersionRef) -> str:
    """A Prefect artifact key per store and corpus (`base-<8 hex>`), so that runs on other
    stores or corpora do not overwrite each other's artifact history."""
    return f"{base}-{hashlib.sha256(f'{store.url}|{corpus_of(store, ref)}'.encode()).hexdigest()[:8]}"


def corpus_of(store: ArtifactStore, ref: VersionRef) -> str:
    """The key (``corpus/<version>``) of the corpus `ref` descends from, or "" if none."""
    for _ in range(12):  # raw -> corpus -> [document stages] -> counts -> tokenizer -> tokens -> model
        if ref.kind == "corpus":
            return ref.key
        parents = store.manifest(ref.kind, ref.version).get("parents") or {}
        role = next((r for r in ("corpus", "tokens", "counts", "tokenizer") if parents.get(r)), None)
        if role is None:
            return ""
        ref = store.parent(ref, role)
    return ""
