"""The storage backend interface: what `ArtifactStore` asks of the storage under it.

`ArtifactStore` owns the protocol (names, ids, manifests, verification, the reuse / claim /
gc / quarantine decisions); a backend does each step on one kind of storage. Two implement
it: `LocalBackend` in `pipeline_lib.store_local` (local disk: renames and `flock`) and
`ObjectBackend` in `pipeline_lib.store_object` (object stores: create-only PUTs and lease
objects). Both declare this Protocol as their base, so mypy checks every method's
signature against it.

Paths are the backend's own (absolute local paths, or bucket keys); `Staging` is the
version's staging area (`pipeline_lib.store.Staging`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

if TYPE_CHECKING:  # annotations only: store.py imports this module
    from pipeline_lib.store import FileInfo, Staging


class StorageBackend(Protocol):
    """How each step of the store's protocol is done on one kind of storage."""

    local: bool  # files are on local disk (read in place, renamed into place)
    root: str  # the store's root, as this backend spells paths

    # paths
    def safe(self, path: str) -> str:
        """`path`, checked to lie under the store root (raises InputError otherwise)."""
        ...

    def invalidate(self, path: str) -> None:
        """Forget cached listings under `path` (before an existence check)."""
        ...

    def uri(self, path: str) -> str: ...

    def staging_paths(self, kind: str, version: str) -> tuple[str, str | None]:
        """(staging directory, temp directory or None) of `kind/version`."""
        ...

    def make_staging_dirs(self, staging: Staging) -> None: ...

    def scratch_path(self, kind: str) -> str: ...

    def work_path(self, kind: str, version: str) -> str: ...

    # identity
    def root_is_empty(self) -> bool: ...

    def write_marker(self, path: str, marker: bytes) -> None: ...

    # writing
    def lock(self, kind: str, exclusive: bool, create: bool = True) -> contextlib.AbstractContextManager[None]:
        """Puts share it, publish holds it alone (a no-op where the storage has no locks); with
        `create` False (readers) nothing is created and a missing lock is no wait."""
        ...

    def put_bytes(self, staging: Staging, dest: str, data: bytes) -> None: ...

    def put_file(self, staging: Staging, dest: str, local_path: str, move: bool) -> FileInfo: ...

    def staged_local_dir(self, staging: Staging, names: list[str], directory: str) -> str:
        """A local directory holding the staged files `names` (in place, or copied into `directory`)."""
        ...

    def publish(self, staging: Staging, file_map: Mapping[str, Any], data: bytes) -> None:
        """Make the staged version visible whole, with `data` as its manifest."""
        ...

    def discard(self, staging: Staging) -> None: ...

    # reading
    def exists(self, manifest_path: str) -> bool: ...

    def size(self, path: str) -> int: ...

    def open_read(self, path: str) -> BinaryIO: ...

    def check_in_place(self, kind: str, version: str, manifest: Mapping[str, Any]) -> None: ...

    def local_dir(
        self,
        kind: str,
        version: str,
        manifest: Mapping[str, Any],
        manifest_raw: bytes,
        cache_dir: str | None,
        verify: str,
    ) -> str: ...

    def local_file(self, kind: str, version: str, name: str, info: Mapping[str, Any], cache_dir: str | None) -> str: ...

    # claims and housekeeping
    def claim(self, kind: str, version: str, poll_s: float, ttl_s: float) -> contextlib.AbstractContextManager[None]:
        """Held by one process at a time per `kind/version`; a dead holder's claim expires."""
        ...

    def claim_held(self, path: str) -> bool: ...

    def local_work_entries(self) -> list[str]: ...

    def age(self, path: str) -> float: ...

    def remove(self, path: str) -> None: ...

    def move_aside(self, src: str, dest: str) -> None: ...

    def remove_version(self, kind: str, version: str) -> None:
        """Take a published version away whole, then delete it (`tokenmill rm`)."""

    def make_dir(self, path: str) -> None:
        """A work or scratch directory in a staging area, it and the area marked as the store's."""

    def entries(self, path: str) -> list[tuple[str, str, bool]]:
        """(name, path, is a directory) of each entry under `path`, links not followed."""
        ...

    def inside(self, path: str) -> bool:
        """Whether `path` is no link and resolves under the store root."""
        ...

    def is_link(self, path: str) -> bool: ...

    def has_marker(self, directory: str, name: str = ...) -> bool:
        """Whether `directory` carries the store's marker `name` (the staging marker by default)."""
        ...
