"""One `Stage` spec per stage, and the one engine that runs them all (no Prefect here).

A stage declares what it makes and from what; the engine does the rest, the same way for
every stage:

    version id = version_id(kind, {input: ref.key}, params(config), output_code(output_version))
    reuse it if the store holds it and it is sound (`store.produce` -> `usable`)
    else claim it, stage the files (`run`), publish the manifest (parents, params, code)

`output_version` is the stage's declared output version: bumped exactly when its output
bytes change, which the golden-output tests (`tests/test_golden.py`) hold it to. No source
is hashed, so moving or editing code keeps every id.

A mapped stage also declares `units`: one unit of work per corpus shard, each written into
the output's staging area under a claim of its own with a completion record (`mark_done`)
last, so a killed run resumes with the shards it had not finished; its `run` then reads the
records and returns what to publish. Units are run in groups of consecutive shards
(`unit_groups`, by a byte budget per group), so that a corpus of thousands of small shards
is a few dozen tasks for an orchestrator, each still resumable shard by shard.

A content-addressed stage (download) has no `params`: its id hashes what it found. It
declares `identify`, a context manager that finds (and, for a copy, fetches into scratch)
its input and yields `Identified(params, found)`; the engine computes the id from those
params and runs `run` with ``ctx.found`` under the claim, like any other stage. A stage
that keeps work outside the staging area for resuming (the LM's checkpoints) drops it in
`published`, called once the output is published.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pipeline_lib.corpus import MIN_TASKS, shard_name
from pipeline_lib.errors import InputError
from pipeline_lib.store import ArtifactStore, FileInfo, Staging, VersionRef, version_id
from pipeline_lib.version import output_code

_log = logging.getLogger("tokenmill.stages")


@dataclass(frozen=True)
class Output:
    """What a stage's `run` staged: the files to publish (name -> FileInfo) and the manifest's meta."""

    files: Mapping[str, FileInfo]
    meta: Mapping[str, Any]


@dataclass(frozen=True)
class Context:
    """What a stage's `run` (or one unit of a mapped stage) works with."""

    store: ArtifactStore
    inputs: Mapping[str, VersionRef]
    config: Any
    version: str | None  # None: a content-addressed stage before `identify`
    code_version: str
    staging: Staging | None = None  # the output's staging area (None for `identify`)
    unit: str | None = None  # a unit's name ("shard_000003") and index, for a unit of work
    index: int | None = None
    records: tuple[dict[str, Any], ...] = ()  # a mapped stage's unit records, in unit order
    progress: Callable[[int, int], None] | None = None  # (done, total), for long runs
    log: Callable[[str], None] | None = None
    found: Any = None  # what a content-addressed stage's `identify` found


@dataclass(frozen=True)
class Identified:
    """What a content-addressed stage's `identify` found: the params its id hashes (the
    content's hashes, or a referenced source's stamps), and what its `run` stages."""

    params: Mapping[str, Any]
    found: Any = None


def config_params(config: Any) -> Mapping[str, Any]:
    return config.params()


def corpus_shards(store: ArtifactStore, corpus: VersionRef) -> list[dict[str, Any]]:
    """The shard records of a corpus version (file, documents, bytes), in shard order."""
    return store.manifest(corpus.kind, corpus.version)["meta"]["shards"]


def corpus_shard_count(
    store: ArtifactStore, inputs: Mapping[str, VersionRef], config: Any = None, role: str = "corpus"
) -> int:
    return len(corpus_shards(store, inputs[role]))


def corpus_shard_bytes(
    store: ArtifactStore, inputs: Mapping[str, VersionRef], config: Any = None, role: str = "corpus"
) -> list[int]:
    return [int(s["n_bytes"]) for s in corpus_shards(store, inputs[role])]


@dataclass(frozen=True)
class Units:
    """The per-shard work of a mapped stage, done before its `run` publishes.

    `run(ctx)` writes unit `ctx.index` into `ctx.staging` and returns its completion record
    (a JSON-able dict). By default there is one unit per shard of the input named `over`
    (a role: corpus shards, whichever stage wrote them); else `count(store, inputs, config)`
    is how many units there are and `sizes(store, inputs, config)` their sizes in bytes
    (what `unit_groups` balances).
    """

    name: str
    run: Callable[[Context], dict[str, Any]]
    count: Callable[[ArtifactStore, Mapping[str, VersionRef], Any], int] | None = None
    sizes: Callable[[ArtifactStore, Mapping[str, VersionRef], Any], list[int]] | None = None
    over: str = "corpus"
    # What each unit reads, for its task run's name (the corpus stage: its files); None: the unit's number alone.
    labels: Callable[[ArtifactStore, Mapping[str, VersionRef], Any], list[str]] | None = None

    def n_units(self, store: ArtifactStore, inputs: Mapping[str, VersionRef], config: Any) -> int:
        return (
            self.count(store, inputs, config)
            if self.count is not None
            else corpus_shard_count(store, inputs, config, self.over)
        )

    def unit_sizes(self, store: ArtifactStore, inputs: Mapping[str, VersionRef], config: Any) -> list[int]:
        return (
            self.sizes(store, inputs, config)
            if self.sizes is not None
            else corpus_shard_bytes(store, inputs, config, self.over)
        )


@dataclass(frozen=True)
class Stage:
    """A stage: its output kind, its inputs (parent names), its config type, its output
    version, and its `run`, which stages the output's files and returns them as an `Output`.

    name: the stage's name in the flow (the Prefect task's name).
    output_version: bump it when, and only when, the stage's output bytes change for the same
        inputs and params (the golden-output tests check both ways); it is the code part of
        the version id.
    params: the config's part of the version id (default: ``config.params()``); None for a
        content-addressed stage (download), whose id hashes what `identify` found.
    identify: a content-addressed stage's context manager: `Identified` (see module doc).
    fingerprint: for a content-addressed stage, what identifies its output before it runs
        (for caching); it may raise InputError when that cannot be known (the run reports).
    published: called with the context and the ref once the output is published.
    """

    name: str
    kind: str
    inputs: tuple[str, ...]
    config: type
    output_version: int
    run: Callable[[Context], Output]
    units: Units | None = None
    params: Callable[[Any], Mapping[str, Any]] | None = config_params
    identify: Callable[[Context], contextlib.AbstractContextManager[Identified]] | None = None
    fingerprint: Callable[[Any], Any] | None = None
    published: Callable[[Context, VersionRef], None] | None = None

    def code_version(self) -> str:
        return output_code(self.output_version)

    def version(self, inputs: Mapping[str, VersionRef], config: Any) -> str | None:
        """The output's version id for these inputs and config (None: content-addressed)."""
        inputs = check_inputs(self, inputs)
        if self.params is None:
            return None
        return version_id(
            self.kind, {name: ref.key for name, ref in inputs.items()}, dict(self.params(config)), self.code_version()
        )


def check_inputs(stage: Stage, inputs: Mapping[str, VersionRef]) -> dict[str, VersionRef]:
    if set(inputs) != set(stage.inputs):
        raise InputError(f"stage {stage.name} takes the inputs {list(stage.inputs)}, got {sorted(inputs)}")
    for name, ref in inputs.items():
        if not isinstance(ref, VersionRef):
            raise InputError(f"stage {stage.name}: input {name!r} must be a VersionRef, got {type(ref).__name__}")
    return {name: inputs[name] for name in stage.inputs}


def cache_identity(stage: Stage, inputs: Mapping[str, VersionRef], config: Any) -> str | None:
    """What names this stage's output before it runs: its version id, or for a
    content-addressed stage a hash of its fingerprint and code version. None when it cannot
    be known (an unreachable source): nothing to reuse."""
    version = stage.version(inputs, config)
    if version is not None:
        return version
    if stage.fingerprint is None:
        return None
    try:
        fingerprint = stage.fingerprint(config)
    except InputError:
        return None
    payload = json.dumps([stage.kind, fingerprint, stage.code_version()], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def unit_name(index: int) -> str:
    return shard_name(index)


def unit_count(stage: Stage, store: ArtifactStore, inputs: Mapping[str, VersionRef], config: Any = None) -> int:
    if stage.units is None:
        raise InputError(f"stage {stage.name} is not a mapped stage")
    return stage.units.n_units(store, check_inputs(stage, inputs), config)


def group_units(sizes: Sequence[int], task_bytes: int) -> list[range]:
    """Consecutive units grouped into tasks of about `task_bytes` bytes each.

    ``ceil(total / task_bytes)`` groups, but at least ``MIN_TASKS`` (one unit per group
    when there are no more units than that) and at most one per unit; `task_bytes` 0
    means one unit per group. Each group aims at the bytes left over the groups left (so
    a big unit early does not starve the later groups) and holds at least one unit.

    >>> len(group_units([1 << 20] * 10_000, 64 << 20))  # 10,000 shards of 1 MiB, 64 MiB per task
    157
    >>> group_units([5, 5], 64 << 20)  # few shards: one task each
    [range(0, 1), range(1, 2)]
    """
    n = len(sizes)
    if task_bytes < 0:
        raise InputError(f"task_bytes={task_bytes}: give a positive number of bytes, or 0 for one task per shard")
    total = sum(sizes)
    n_groups = n if task_bytes == 0 else min(n, max(MIN_TASKS, -(-total // task_bytes)))
    if n_groups >= n:
        return [range(i, i + 1) for i in range(n)]
    groups: list[range] = []
    start, current, remaining = 0, 0, total
    for i, size in enumerate(sizes):
        current += size
        left = n_groups - len(groups)  # groups still to make, this one included
        if left > 1 and (current >= remaining / left or n - i - 1 == left - 1):
            groups.append(range(start, i + 1))
            start, remaining, current = i + 1, remaining - current, 0
    groups.append(range(start, n))
    return groups


def unit_groups(
    stage: Stage, store: ArtifactStore, inputs: Mapping[str, VersionRef], task_bytes: int, config: Any = None
) -> list[range]:
    """The units of a mapped stage in groups of about `task_bytes` (see `group_units`)."""
    if stage.units is None:
        raise InputError(f"stage {stage.name} is not a mapped stage")
    return group_units(stage.units.unit_sizes(store, check_inputs(stage, inputs), config), task_bytes)


# --------------------------------------------------------------------------- the engine
@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None on another C library."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_memory() -> None:
    """Hand the memory a stage freed back to the system: glibc's malloc and Arrow's pool keep
    freed pages for reuse, so the next stage's peak would stack on the last one's leftovers
    (the pipeline runs its stages one after the other in one process)."""
    with contextlib.suppress(Exception):
        pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def produce(
    stage: Stage,
    store: ArtifactStore,
    inputs: Mapping[str, VersionRef],
    config: Any,
    *,
    progress: Callable[[int, int], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> VersionRef:
    """The stage's output for `inputs` and `config`: reused if the store holds it (sound),
    else made under the claim and published. For a mapped stage every unit must be done."""
    inputs = check_inputs(stage, inputs)
    version = stage.version(inputs, config)
    code = stage.code_version()
    parents = {name: ref.key for name, ref in inputs.items()}
    if version is not None:
        assert stage.params is not None  # Stage.version is None exactly when params is
        return _make(stage, store, inputs, config, version, dict(stage.params(config)), progress=progress, log=log)
    if stage.identify is None:
        raise InputError(f"stage {stage.name} has neither params nor identify: its version id cannot be known")
    with stage.identify(Context(store, inputs, config, None, code, progress=progress, log=log)) as identified:
        params = dict(identified.params)
        version = version_id(stage.kind, parents, params, code)
        return _make(stage, store, inputs, config, version, params, found=identified.found, progress=progress, log=log)


def _make(
    stage: Stage,
    store: ArtifactStore,
    inputs: Mapping[str, VersionRef],
    config: Any,
    version: str,
    params: dict[str, Any],
    *,
    found: Any = None,
    progress: Callable[[int, int], None] | None,
    log: Callable[[str], None] | None,
) -> VersionRef:
    """Reuse `stage.kind/version`, or claim it, run the stage into its staging area and publish."""
    code = stage.code_version()
    context = Context(store, inputs, config, version, code, progress=progress, log=log, found=found)

    def make() -> VersionRef:
        staging = store.stage(stage.kind, version)
        records = _unit_records(stage, store, inputs, staging, config) if stage.units is not None else ()
        try:
            out = stage.run(dataclasses.replace(context, staging=staging, records=records))
        finally:
            release_memory()
        if not isinstance(out, Output):
            raise TypeError(f"stage {stage.name}: run returned {type(out).__name__}, not an Output")
        # The unit parts a mapped stage left in staging and did not list are dropped by
        # publish (deleting them here would pull them from under a concurrent run).
        ref = store.publish(staging, files=out.files, parents=inputs, params=params, code_version=code, meta=out.meta)
        made.append(ref)
        if stage.published is not None:
            stage.published(context, ref)
        return ref

    if store.usable(stage.kind, version):
        return store.ref(stage.kind, version)
    made: list[VersionRef] = []
    ref = store.produce(stage.kind, version, make)
    if not made:  # it was not there a moment ago: a concurrent run made it while we waited for the claim
        _log.info("%s/%s was published by a concurrent run", stage.kind, version)
    return ref


def _unit_records(
    stage: Stage, store: ArtifactStore, inputs: Mapping[str, VersionRef], staging: Staging, config: Any
) -> tuple[dict[str, Any], ...]:
    units = stage.units
    assert units is not None  # only called for a mapped stage
    records = []
    for i in range(units.n_units(store, inputs, config)):
        record = staging.done(unit_name(i))
        if record is None:
            raise InputError(
                f"{stage.kind}/{staging.version}: shard {i} is not done yet: run {units.name} for every shard first"
            )
        records.append(record)
    return tuple(records)


def _unit_state(
    stage: Stage, store: ArtifactStore, version: str, index: int
) -> tuple[Staging | None, dict[str, Any] | None]:
    """(staging area, completion record or None) of one unit; no staging once published."""
    if store.usable(stage.kind, version):
        return None, {"shard": index, "cached": True}
    staging = store.stage(stage.kind, version)
    return staging, staging.done(unit_name(index))


def run_unit(
    stage: Stage, store: ArtifactStore, inputs: Mapping[str, VersionRef], config: Any, index: int
) -> dict[str, Any]:
    """One unit of a mapped stage: a finished unit is skipped; otherwise its work writes it
    into the staging area under a claim, so two runs never do the same unit at once, and
    its completion record is written last."""
    if stage.units is None:
        raise InputError(f"stage {stage.name} is not a mapped stage")
    inputs = check_inputs(stage, inputs)
    version = stage.version(inputs, config)
    if version is None:
        raise InputError(f"stage {stage.name} is content-addressed: it cannot have units")
    unit = unit_name(index)
    staging, done = _unit_state(stage, store, version, index)
    if done is not None:
        return done
    with store.claim(stage.kind, f"{version}.{unit}"):
        staging, done = _unit_state(stage, store, version, index)  # finished by the run we waited for?
        if done is not None:
            return done
        assert staging is not None  # _unit_state gives one whenever the unit is not done
        try:
            record = stage.units.run(
                Context(store, inputs, config, version, stage.code_version(), staging, unit=unit, index=index)
            )
        finally:
            release_memory()
        staging.mark_done(unit, record)
        return record


def unit_present(
    stage: Stage, store: ArtifactStore, inputs: Mapping[str, VersionRef], config: Any, index: int | Sequence[int]
) -> bool:
    """Whether unit `index` (or every unit of a group) needs no work: the output is
    published, or the units are staged."""
    version = stage.version(inputs, config)
    if version is None:
        raise InputError(f"stage {stage.name} is content-addressed: it cannot have units")
    if store.usable(stage.kind, version):
        return True
    staging = store.stage(stage.kind, version)
    return all(staging.done(unit_name(i)) is not None for i in ([index] if isinstance(index, int) else index))


def output_current(store: ArtifactStore, ref: VersionRef) -> bool:
    """Whether the store still holds `ref` (sound, and the very manifest it points to)."""
    return store.usable(ref.kind, ref.version) and store.check_ref(ref)
