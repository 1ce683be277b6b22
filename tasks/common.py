"""Shared pieces of the Prefect tasks: store handles, references, retries, progress.

Tasks are thin: `tasks.factory` makes them from the stage specs of `pipeline_lib.stages`;
they resolve the store, run the stage and return a small JSON-able reference.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
from collections.abc import Iterator, Mapping
from typing import Any

from pipeline_lib.corpus import shard_name
from pipeline_lib.errors import InputError, StoreError, TokenmillError, is_network_error
from pipeline_lib.store import ArtifactStore, VersionRef


@functools.lru_cache(maxsize=16)
def _store(url: str, options_json: str) -> ArtifactStore:
    return ArtifactStore(url, **json.loads(options_json))


def store_of(url: str, storage_options: dict[str, Any] | None = None) -> ArtifactStore:
    # Options may nest (s3fs's client_kwargs), so the cache key is their canonical JSON.
    return _store(url, json.dumps(storage_options or {}, sort_keys=True, default=str))


def to_ref(ref: Mapping[str, str] | VersionRef) -> VersionRef:
    """`ref` as a VersionRef: tasks hand each other VersionRefs; a mapping is its JSON form
    (a result cached before tasks returned VersionRefs, a deployment's parameter)."""
    return ref if isinstance(ref, VersionRef) else VersionRef(**ref)


# Errors a retry cannot fix: the input, the configuration, the store's content, a full disk,
# a permission, memory. Retrying them only delays the error (and repeats it in the logs).
_PERMANENT_ERRNOS = frozenset(
    getattr(errno, name) for name in ("ENOSPC", "EDQUOT", "EACCES", "EPERM", "EROFS") if hasattr(errno, name)
)


def is_transient(exc: BaseException) -> bool:
    """Whether a task that raised `exc` may succeed when run again (a refused or dropped
    connection, a timeout, an unknown error), as opposed to a failure that only a person
    can fix (bad input, a full disk, a permission, memory). A connection error counts as
    transient also when one of our errors wraps it (``InputError(...) from e``)."""
    cause: BaseException | None = exc
    for _ in range(10):
        if cause is None:
            break
        if is_network_error(cause):
            return True
        cause = cause.__cause__
    if isinstance(exc, (TokenmillError, MemoryError, OverflowError, PermissionError)):
        return False
    return not (isinstance(exc, OSError) and exc.errno in _PERMANENT_ERRNOS)


def retry_if_transient(task, task_run, state) -> bool:
    """A Prefect ``retry_condition_fn``: retry only `is_transient` failures."""
    exc = state.result(raise_on_failure=False)
    return not isinstance(exc, BaseException) or is_transient(exc)


@contextlib.contextmanager
def staging_kept(store: ArtifactStore, kind: str, version: str, shard_records: list[dict] | None) -> Iterator[None]:
    """Report a publish whose finished shards vanished from the staging area as a StoreError.

    The mapped tasks returned `shard_records`, so every shard was finished; if publishing
    then finds a shard's completion record missing (the library raises InputError: it
    cannot tell a skipped step from a removed one), the staging area was removed under this
    run, e.g. by `tokenmill gc` with a --min-age shorter than the run.
    """
    try:
        yield
    except InputError as e:
        units = [
            shard_name(r["shard"])
            for r in shard_records or []
            if isinstance(r, dict) and isinstance(r.get("shard"), int)
        ]
        staging = store.stage(kind, version)
        lost = [u for u in units if staging.done(u) is None]
        if not lost:
            raise
        shown = ", ".join(lost[:3]) + (" ..." if len(lost) > 3 else "")
        raise StoreError(
            f"{kind}/{version}: shards this run finished ({shown}) are gone from its staging area {staging.path}"
        ) from e


# Progress listeners: the CLI registers a progress-bar renderer; tasks report to it (and to
# Prefect's progress artifacts where a run should show it in the UI).
_LISTENERS: list = []


def add_progress_listener(fn) -> None:
    """Register `fn(name, done=..., advance=..., total=...)`, called as work advances in this process."""
    _LISTENERS.append(fn)


def progress(name: str, *, done: float | None = None, advance: float = 0, total: float | None = None) -> None:
    for fn in list(_LISTENERS):
        fn(name, done=done, advance=advance, total=total)
