"""Versioned, write-once artifact store over any fsspec filesystem.

Layout: ``<root>/<kind>/<version>/`` holds a version's files and its ``manifest.json``.
The manifest is the commit point: a directory without one is not a version, readers
never see it, and `gc` removes it.

* Version ids are derived, never random: a hash of the parents' version ids, the stage
  parameters and the stage's code version. The same work lands in the same place, so a
  rerun finds it and skips it, and two writers of the same work meet at the same id.
* The manifest records lineage (parents and their manifest hashes), parameters, every
  file's size and sha256, totals, creation time and tool / code versions. `verify`
  re-hashes the files against it; `read_bytes` checks the one file it reads; `local_dir`,
  `local_file` and `open` check sizes and sha256s (a local file hashed once per process
  while unchanged, a remote one while it is downloaded into the cache).

Writing: `stage` a version, put files into its staging area (``<kind>/.staging/<version>/``,
shared by every writer of that version), `publish` it. Publishing checks the staged files
against the file list, writes the manifest last and makes the version visible whole: readers
never see a version half-written, and a published version is never written into again (a
put that finds the manifest is skipped). The protocol (names, ids, manifests, verification,
`usable` / `produce` / `claim` / `gc` / `quarantine` decisions) is `ArtifactStore`'s; how
each step is done on the storage is one of two backends, chosen once per store (the
store's names and checks are in `store_layout`, shared with them):

`LocalBackend` (`store_local`): local disk (``file://`` or a plain path)
    Temp files in ``<kind>/.staging/.tmp/`` (same filesystem, outside any version
    directory); every file is written to a temp name, fsynced and `os.replace`d into the
    staging directory. `publish` makes the files read-only (0444), writes the manifest into
    the staging directory, fsyncs it and renames the whole directory to ``<kind>/<version>``
    in one `os.rename`, then fsyncs the parent. Why a directory rename rather than writing
    in place with the manifest last: the version appears whole or not at all even to tools
    that ignore manifests (``ls``, a nanoGPT loader pointed at the directory), a published
    directory is never written into, and `rename` onto an existing version fails, which is
    write-once for free. Puts take a shared `flock` on ``.staging/.lock`` and `publish` an
    exclusive one, so a slow second writer can never drop a file into a version after it
    was published. Reads use the files in place, hashed once per process while unchanged.

`ObjectBackend` (`store_object`): object stores (``s3://``, ``gs://``, ``memory://`` ...)
    There is no rename: each put is a single PUT into the staging prefix (multipart
    uploads complete atomically); `publish` copies the staged files server-side under
    ``<kind>/<version>/`` and PUTs the manifest last with create-only semantics (s3fs mode
    ``"xb"`` -> ``IfNoneMatch: *``), so a tool listing the version prefix sees nothing
    before the manifest, and of two concurrent publishers exactly one manifest wins and
    the other adopts it. Reads are hash-checked downloads into a local cache; work and
    scratch directories live in a local area keyed by the store's URL.

Staged units of work carry completion markers (``_done/<unit>.json``), so a stage killed
half-way resumes where it stopped (datatrove's ``completions/``); markers are removed
before the manifest is written.

Names (kinds, versions, file path parts) are ``[A-Za-z0-9._-]`` only, never ``.``/``..``
or containing ``..``, never starting with ``.`` (reserved for the store's own entries),
and on local disk the resolved path must stay under the store root (no symlink escapes).
"""

from __future__ import annotations

import builtins
import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any, BinaryIO

from pipeline_lib.errors import StoreError  # re-exported
from pipeline_lib.fsio import InputError, filesystem, is_local
from pipeline_lib.store_backend import StorageBackend
from pipeline_lib.store_layout import (
    _NAME_RE,
    _SHA256_RE,
    _VERSION_ID_RE,
    CLAIM_SUFFIX,
    DONE_DIR,
    LOCK_FILE,
    MANIFEST,
    MANIFEST_FORMAT,
    MAX_MANIFEST_BYTES,
    NEW_DIR_PREFIX,
    PUBLISHING_MARKER,
    QUARANTINE_DIR,
    STAGING_DIR,
    STAGING_MARKER,
    STORE_FORMAT,
    STORE_MARKER,
    WORK_SUFFIX,
    FileInfo,
    _hash_stream,
    canonical_json,
    check_name,
    check_relpath,
    check_store_url,
)
from pipeline_lib.store_local import LocalBackend
from pipeline_lib.store_object import ObjectBackend
from pipeline_lib.version import __version__

_log = logging.getLogger("tokenmill.store")

# (kind, version, sha256 of the manifest's bytes) of manifests found sound, oldest first.
_SOUND_MANIFESTS: dict[tuple[str, str, bytes], None] = {}
_SOUND_MANIFESTS_MAX = 4096


def _backend() -> dict[str, Any]:
    from pipeline_lib.tokenizer import backend_info  # lazy: nothing else in the store needs it

    return dict(backend_info())


def version_id(kind: str, parents: Mapping[str, str], params: Mapping[str, Any], code_version: str) -> str:
    """Deterministic id of a version: the same inputs, parameters and code give the same id."""
    check_name(kind, "kind")
    payload = canonical_json({"kind": kind, "parents": dict(parents), "params": dict(params), "code": code_version})
    return hashlib.sha256(payload).hexdigest()[:20]


@dataclass
class StoreSurvey:
    """What `ArtifactStore.survey` found under a store's root (paths)."""

    collectable: list[str]  # the store's own leftovers: gc removes them (age permitting)
    foreign: list[str]  # not provably written by the store: listed, never deleted
    held: list[str]  # live claims and the staging areas / work dirs they cover


@dataclass(frozen=True)
class VersionRef:
    """What tasks pass around: a pointer to a published version, never its data."""

    kind: str
    version: str
    uri: str
    manifest_sha256: str

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.version}"

    def to_dict(self) -> dict[str, str]:
        """Its JSON form (what a task result or a flow parameter stores)."""
        return {"kind": self.kind, "version": self.version, "uri": self.uri, "manifest_sha256": self.manifest_sha256}


def split_key(key: str) -> tuple[str, str]:
    """(kind, version) of a version key ``kind/version`` (a manifest's parents, the CLI's
    REF): the one place that text form is taken apart."""
    kind, sep, version = str(key).partition("/")
    if not sep or not kind or not version:
        raise InputError(f"{key!r}: not a version key (kind/version)")
    return kind, version


class Staging:
    """A version being written: put files, mark units done, then `ArtifactStore.publish`.

    Several processes may stage the same version at once (one per mapped unit of work, or
    two runs of the same stage): every put is atomic per file, and once the version is
    published the remaining puts are skipped. Where the staging area lives and how a file
    gets into it is the store's backend's business (`LocalBackend`, `ObjectBackend`).
    """

    def __init__(self, store: ArtifactStore, kind: str, version: str):
        self.store, self.kind, self.version = store, kind, version
        self.fs = store.fs
        # path: the staging area; tmp_dir: where temp files are made (None: the system's)
        self.path, self.tmp_dir = store._backend.staging_paths(kind, version)
        self.written: dict[str, FileInfo] = {}  # what open_write published, by name

    def __repr__(self) -> str:
        return f"Staging({self.store.url!r}, {self.kind!r}, {self.version!r})"

    def _p(self, name: str) -> str:
        check_relpath(name)
        if name == MANIFEST:
            raise InputError(f"{MANIFEST} is written by ArtifactStore.publish only")
        return self.store._safe(f"{self.path}/{name}")

    def published(self) -> bool:
        return self.store.exists(self.kind, self.version)

    # ------------------------------------------------------------ puts
    def put_bytes(self, name: str, data: bytes) -> FileInfo:
        dest = self._p(name)
        self.store._backend.put_bytes(self, dest, data)
        return FileInfo(len(data), hashlib.sha256(data).hexdigest())

    def put_file(self, name: str, local_path: str, move: bool = False) -> FileInfo:
        """Publish a finished local file into the staging area (a rename when on the same disk)."""
        return self.store._backend.put_file(self, self._p(name), local_path, move)

    @contextlib.contextmanager
    def open_write(self, name: str) -> Iterator[str]:
        """Yield a local temp path to write; on success it is published as `name`.

        On a local store the temp file is on the store's disk (outside the version
        directory), so publishing it is a rename.
        """
        self._p(name)  # validate the name before any work is done
        self.store._backend.make_staging_dirs(self)
        fd, tmp = tempfile.mkstemp(dir=self.tmp_dir, prefix=".tmp-", suffix=".part")
        os.close(fd)
        try:
            yield tmp
            self.written[name] = self.put_file(name, tmp, move=True)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    # ------------------------------------------------------------ reads
    def exists(self, name: str) -> bool:
        path = self._p(name)
        self.store._invalidate(path)
        return self.fs.exists(path)

    def read_bytes(self, name: str) -> bytes:
        try:
            return self.fs.cat_file(self._p(name))
        except FileNotFoundError:
            raise StoreError(f"{self.kind}/{self.version} (staging): {name} is missing") from None

    def local_dir(self, names: Iterable[str], directory: str) -> str:
        """A local directory holding the staged files `names` under their names, to read.

        On local disk it is the staging area itself (nothing is copied); for an object
        store the files are downloaded into `directory` (a scratch directory the caller
        removes). Read only: write through `put_*` / `open_write`.

        Raises:
            StoreError: a file is not in the staging area (never staged, or taken away by
                a concurrent publisher or `gc`).
        """
        return self.store._backend.staged_local_dir(self, [check_relpath(n) for n in names], directory)

    def mark_done(self, unit: str, info: Mapping[str, Any]) -> None:
        self.put_bytes(f"{DONE_DIR}/{check_name(unit, 'unit name')}.json", canonical_json(info))

    def done(self, unit: str) -> dict[str, Any] | None:
        """The completion record of a unit, or None if it has not finished."""
        name = f"{DONE_DIR}/{check_name(unit, 'unit name')}.json"
        try:
            raw = self.fs.cat_file(self._p(name))
        except (FileNotFoundError, StoreError):
            return None
        if len(raw) > MAX_MANIFEST_BYTES:
            return None
        try:
            record = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
        return record if isinstance(record, dict) else None


class ArtifactStore:
    """Versioned artifacts under one fsspec URL.

    >>> store = ArtifactStore("memory://demo-store")
    >>> staging = store.stage("notes", "v1")
    >>> info = staging.put_bytes("a.txt", b"hello")
    >>> ref = store.publish(staging, files={"a.txt": info})
    >>> store.read_bytes("notes", "v1", "a.txt")
    b'hello'
    """

    def __init__(self, url: str, **storage_options: Any):
        self.url = check_store_url(url)
        self.storage_options = storage_options
        self.fs, root = filesystem(url, **storage_options)
        # Everything that differs between local disk and object stores is the backend's,
        # chosen here once; the rest of this class is the protocol both follow.
        backend = LocalBackend if is_local(self.fs) else ObjectBackend
        self._backend: StorageBackend = backend(self, root.rstrip("/") or "/")
        self.local = self._backend.local  # for diagnostics and tests: code asks the backend
        self.root = self._backend.root
        self._owned = False  # the marker was found or written through this handle

    # ---------------------------------------------------------------- identity
    def _marker_path(self) -> str:
        return f"{self.root}/{STORE_MARKER}"

    def is_store(self) -> bool:
        """Whether the root holds a tokenmill store marker of the format this code reads."""
        path = self._marker_path()
        self._invalidate(path)
        try:
            with self.fs.open(path, "rb") as f:
                raw = f.read(1 << 16)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return False
        try:
            marker = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise StoreError(
                f"{path}: corrupt store marker (not JSON): restore it, or choose another --store"
            ) from None
        fmt = marker.get("format") if isinstance(marker, dict) else None
        if not isinstance(fmt, str) or not fmt.startswith("tokenmill.store/"):
            raise StoreError(f"{path}: not a tokenmill store marker (format {fmt!r})")
        if fmt != STORE_FORMAT:
            raise StoreError(
                f"{self.url} is a store of format {fmt!r}; this tokenmill reads {STORE_FORMAT!r}: upgrade tokenmill"
            )
        return True

    def ensure_store(self) -> None:
        """Make sure the root is a tokenmill store before anything is written or deleted.

        A missing or empty directory becomes a store (its marker is written first); a
        directory with a marker is one; anything else is refused, so that a mistyped
        ``--store`` never writes into, and `gc` never deletes from, somebody's folder.
        """
        if self._owned:
            return
        if not self.is_store():
            if self._backend.root_is_empty():
                self._write_marker()
            elif not self.is_store():  # re-checked: a concurrent creator may have marked it meanwhile
                raise StoreError(
                    f"{self.url} is not empty and is not a tokenmill store (it has no {STORE_MARKER}): choose a new "
                    "or empty directory for --store"
                )
        self._owned = True

    def _write_marker(self) -> None:
        marker = canonical_json(
            {"format": STORE_FORMAT, "created": dt.datetime.now(dt.UTC).isoformat(), "tool_version": __version__}
        )
        self._backend.write_marker(self._marker_path(), marker)
        if not self.is_store():
            raise StoreError(f"{self._marker_path()}: written but cannot be read back")

    def __repr__(self) -> str:
        return f"ArtifactStore({self.url!r})"

    # ---------------------------------------------------------------- paths
    def _safe(self, path: str) -> str:
        """On local disk, refuse a path whose resolved location leaves the store root."""
        return self._backend.safe(path)

    def _invalidate(self, path: str) -> None:
        """Forget cached listings (s3fs caches them; another process may have written)."""
        self._backend.invalidate(path)

    def version_path(self, kind: str, version: str) -> str:
        return self._safe(f"{self.root}/{check_name(kind, 'kind')}/{check_name(version, 'version')}")

    def uri(self, kind: str, version: str, name: str | None = None) -> str:
        path = self.version_path(kind, version)
        if name is not None:
            path = f"{path}/{check_relpath(name)}"
        return self._backend.uri(path)

    def file_path(self, kind: str, version: str, name: str) -> str:
        return self._safe(f"{self.version_path(kind, version)}/{check_relpath(name)}")

    def _manifest_path(self, kind: str, version: str) -> str:
        return f"{self.version_path(kind, version)}/{MANIFEST}"

    def settled_exists(self, kind: str, version: str) -> bool:
        """`exists`, after any publish of this kind in progress has finished (local stores
        publish under an exclusive lock; this waits for it). For a writer whose reads failed
        because a concurrent writer was moving the staging area into place."""
        with self._backend.lock(kind, exclusive=False, create=False):
            return self.exists(kind, version)

    # ---------------------------------------------------------------- writing
    def stage(self, kind: str, version: str) -> Staging:
        check_name(kind, "kind")
        check_name(version, "version")
        self.ensure_store()
        self.version_path(kind, version)  # path checks
        return Staging(self, kind, version)

    def publish(
        self,
        staging: Staging,
        *,
        files: Mapping[str, FileInfo],
        parents: Mapping[str, VersionRef | str] | None = None,
        params: Mapping[str, Any] | None = None,
        code_version: str = "",
        meta: Mapping[str, Any] | None = None,
    ) -> VersionRef:
        """Write the manifest last and make the version visible; idempotent per version.

        The listed files must all be in the staging area with their recorded sizes;
        anything else there (completion markers, scratch) is removed, not published.
        If the version is already published (by an earlier run or a concurrent writer),
        this writer's staging is dropped and the published version's ref returned.
        """
        kind, version = staging.kind, staging.version
        if staging.store is not self and staging.store.url != self.url:
            raise StoreError(f"{staging!r} belongs to another store than {self.url}")
        if self.exists(kind, version):
            self._backend.discard(staging)
            return self.ref(kind, version)
        file_map: dict[str, dict[str, Any]] = {}
        for name, info in sorted(files.items()):
            check_relpath(name)
            if name == MANIFEST or name.split("/")[0] == DONE_DIR:
                raise InputError(f"{name!r} is reserved and cannot be a published file")
            if not isinstance(info, FileInfo):
                info = FileInfo(**dict(info))
            if not isinstance(info.size, int) or info.size < 0 or not _SHA256_RE.fullmatch(str(info.sha256)):
                raise InputError(f"{name}: bad file info {info!r}")
            file_map[name] = asdict(info)
        parent_keys: dict[str, str] = {}
        parent_manifests: dict[str, str] = {}
        for k, v in (parents or {}).items():
            if isinstance(v, VersionRef):
                parent_keys[k] = v.key
                parent_manifests[k] = v.manifest_sha256
            else:
                parent_keys[k] = str(v)
        manifest = {
            "format": MANIFEST_FORMAT,
            "kind": kind,
            "version": version,
            "created": dt.datetime.now(dt.UTC).isoformat(timespec="microseconds"),
            "tool_version": __version__,
            "backend": _backend(),  # which tokenizer backend ran: native core (its source hash) or Python
            "code_version": code_version,
            "parents": parent_keys,
            "parent_manifests": parent_manifests,
            "params": dict(params or {}),
            "files": file_map,
            "totals": {"n_files": len(file_map), "n_bytes": sum(f["size"] for f in file_map.values())},
            "meta": dict(meta or {}),
        }
        data = json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False, default=str).encode()
        if len(data) > MAX_MANIFEST_BYTES:
            raise StoreError(f"{kind}/{version}: manifest of {len(data):,} bytes exceeds {MAX_MANIFEST_BYTES:,}")
        self._backend.publish(staging, file_map, data)
        return self.ref(kind, version)

    def _check_staged(self, staging: Staging, file_map: Mapping[str, Mapping[str, Any]]) -> None:
        for name, info in file_map.items():
            try:
                size = self._backend.size(f"{staging.path}/{name}")
            except FileNotFoundError:
                raise StoreError(
                    f"cannot publish {staging.kind}/{staging.version}: {name} is not in the staging area"
                ) from None
            if size != info["size"]:
                raise StoreError(
                    f"cannot publish {staging.kind}/{staging.version}: {name} has {size:,} bytes, the "
                    f"file list says {info['size']:,}"
                )

    # ---------------------------------------------------------------- reading
    def exists(self, kind: str, version: str) -> bool:
        """Whether `kind/version` is published (has its manifest)."""
        return self._backend.exists(self._manifest_path(kind, version))

    def usable(self, kind: str, version: str) -> bool:
        """Whether `kind/version` is published and sound, for a stage deciding to reuse it.

        A version whose manifest is unreadable, or (on a local store) one of whose files no
        longer matches its manifest, is quarantined (moved aside, logged, never deleted)
        and reported absent, so the stage recomputes it: a rerun heals the store instead
        of failing on it forever. On a local store each file is hashed once per process
        while unchanged; on an object store only the manifest is checked (reads verify
        each file they download).
        """
        if not self.exists(kind, version):
            return False
        try:
            self._backend.check_in_place(kind, version, self.manifest(kind, version))
        except StoreError as e:
            if not self.exists(kind, version):  # moved away meanwhile (a concurrent quarantine)
                return False
            with contextlib.suppress(FileNotFoundError, OSError):
                self.quarantine(kind, version, str(e))
            return self.exists(kind, version) and self.usable(kind, version)
        return True

    def _read_manifest_bytes(self, kind: str, version: str) -> bytes:
        path = self._manifest_path(kind, version)
        try:
            with self.fs.open(path, "rb") as f:
                raw = f.read(MAX_MANIFEST_BYTES + 1)
        except FileNotFoundError:
            raise StoreError(f"{kind}/{version} is not a published version in {self.url} (no {MANIFEST})") from None
        except IsADirectoryError:
            raise StoreError(f"{path}: corrupt manifest (a directory)") from None
        if len(raw) > MAX_MANIFEST_BYTES:
            raise StoreError(f"{path}: manifest larger than {MAX_MANIFEST_BYTES:,} bytes: refusing to parse it")
        return raw

    def _parse_manifest(self, raw: bytes, kind: str, version: str) -> dict[str, Any]:
        path = self._manifest_path(kind, version)
        try:
            manifest = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise StoreError(f"{path}: corrupt manifest ({e})") from e
        # The checks below depend on these bytes alone: bytes already found sound are not
        # checked again (a sharding unit of a 10,000-file corpus reads the raw manifest twice).
        key = (kind, version, hashlib.sha256(raw).digest())
        if key in _SOUND_MANIFESTS:
            return manifest  # type: ignore[no-any-return]
        if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
            raise StoreError(f"{path}: corrupt manifest (not a {MANIFEST_FORMAT} manifest)")
        if manifest.get("kind") != kind or manifest.get("version") != version:
            raise StoreError(
                f"{path}: corrupt manifest (it describes {manifest.get('kind')}/{manifest.get('version')})"
            )
        files = manifest.get("files")
        if not isinstance(files, dict):
            raise StoreError(f"{path}: corrupt manifest (no file list)")
        for name, info in files.items():
            try:
                check_relpath(name)
            except InputError as e:
                raise StoreError(f"{path}: corrupt manifest: {e}") from None
            if (
                not isinstance(info, dict)
                or not isinstance(info.get("size"), int)
                or info["size"] < 0
                or not isinstance(info.get("sha256"), str)
                or not _SHA256_RE.fullmatch(info["sha256"])
            ):
                raise StoreError(f"{path}: corrupt manifest: bad entry for {name!r}")
        for field, typ in (("params", dict), ("meta", dict), ("parents", dict), ("created", str)):
            if not isinstance(manifest.get(field), typ):
                raise StoreError(f"{path}: corrupt manifest: {field!r} missing or not a {typ.__name__}")
        if len(_SOUND_MANIFESTS) >= _SOUND_MANIFESTS_MAX:
            _SOUND_MANIFESTS.pop(next(iter(_SOUND_MANIFESTS)))
        _SOUND_MANIFESTS[key] = None
        return manifest

    def manifest(self, kind: str, version: str) -> dict[str, Any]:
        """The parsed, checked manifest of a published version (raises `StoreError`)."""
        return self._parse_manifest(self._read_manifest_bytes(kind, version), kind, version)

    def ref(self, kind: str, version: str) -> VersionRef:
        raw = self._read_manifest_bytes(kind, version)
        self._parse_manifest(raw, kind, version)
        return VersionRef(kind, version, self.uri(kind, version), hashlib.sha256(raw).hexdigest())

    def parent(self, ref: VersionRef, role: str) -> VersionRef:
        """The version `ref` was made from under the input name `role` ("corpus", ...)."""
        parents = self.manifest(ref.kind, ref.version).get("parents") or {}
        if role not in parents:
            raise StoreError(f"{ref.key} has no {role!r} parent (its parents: {sorted(parents)})")
        return self.ref(*split_key(parents[role]))

    def check_ref(self, ref: VersionRef) -> bool:
        """Whether `ref` still points at this exact published manifest."""
        try:
            return self.ref(ref.kind, ref.version).manifest_sha256 == ref.manifest_sha256
        except StoreError:
            return False

    def _entry(self, manifest: Mapping[str, Any], name: str) -> dict[str, Any]:
        check_relpath(name)
        info = manifest["files"].get(name)
        if info is None:
            raise StoreError(f"{manifest['kind']}/{manifest['version']}/{name}: not a file of this version")
        return info

    def read_bytes(self, kind: str, version: str, name: str, verify: bool = True) -> bytes:
        """A published file's bytes, checked against the manifest's size and sha256."""
        if name == MANIFEST:
            return self._read_manifest_bytes(kind, version)
        manifest = self.manifest(kind, version)
        info = self._entry(manifest, name)
        try:
            data = self.fs.cat_file(self.file_path(kind, version, name))
        except FileNotFoundError:
            raise StoreError(f"{kind}/{version}/{name}: listed in the manifest but missing from {self.url}") from None
        if verify:
            if len(data) != info["size"]:
                raise StoreError(
                    f"{kind}/{version}/{name}: {len(data):,} bytes, manifest says {info['size']:,}: "
                    "truncated or altered"
                )
            if hashlib.sha256(data).hexdigest() != info["sha256"]:
                raise StoreError(f"{kind}/{version}/{name}: sha256 mismatch: the file is corrupt or was altered")
        return data

    def open(self, kind: str, version: str, name: str) -> BinaryIO:
        """A published file opened for reading, after checking it against the manifest."""
        return open(self.local_file(kind, version, name), "rb")

    def _check_file(self, kind: str, version: str, name: str, info: Mapping[str, Any], path: str, full: bool) -> None:
        try:
            if full:
                with self._backend.open_read(path) as f:
                    got = _hash_stream(f)
            else:
                got = FileInfo(self._backend.size(path), info["sha256"])
        except (FileNotFoundError, IsADirectoryError):
            raise StoreError(f"{kind}/{version}/{name}: listed in the manifest but missing") from None
        if got.size != info["size"]:
            raise StoreError(
                f"{kind}/{version}/{name}: {got.size:,} bytes, manifest says {info['size']:,}: truncated or altered"
            )
        if got.sha256 != info["sha256"]:
            raise StoreError(f"{kind}/{version}/{name}: sha256 mismatch: the file is corrupt or was altered")

    def local_dir(self, kind: str, version: str, cache_dir: str | None = None, verify: str = "full") -> str:
        """A local directory with the version's files (the version itself on a local store).

        `verify`: "full" (default) checks every file's size and sha256 against the
        manifest, hashing each file once per process while it is unchanged
        (`fsio.check_local_file`); "size" checks sizes only; "none" skips the checks (for
        callers that verify each file they read themselves). A remote version is always
        hashed while it is downloaded into the cache, and the cache is refreshed when its
        manifest differs from the store's.
        """
        if verify not in ("size", "full", "none"):
            raise InputError(f"verify={verify!r}: choose size, full or none")
        manifest_raw = self._read_manifest_bytes(kind, version)
        manifest = self._parse_manifest(manifest_raw, kind, version)
        return self._backend.local_dir(kind, version, manifest, manifest_raw, cache_dir, verify)

    def local_file(self, kind: str, version: str, name: str, cache_dir: str | None = None) -> str:
        """A local path to one file of a version: the file itself on a local store, else a
        hash-checked download of that file alone (a worker reading one shard fetches one shard)."""
        return self.local_files(kind, version, [name], cache_dir)[0]

    def local_files(
        self, kind: str, version: str, names: Iterable[str], cache_dir: str | None = None
    ) -> builtins.list[str]:
        """`local_file` of each of `names`, the manifest read once."""
        files = self.manifest(kind, version)["files"]
        paths = []
        for name in names:
            info = files.get(name)
            if info is None:
                raise StoreError(f"{kind}/{version} has no file {name!r}")
            paths.append(self._backend.local_file(kind, version, name, info, cache_dir))
        return paths

    def verify(self, kind: str, version: str, strict: bool = False) -> dict[str, Any]:
        """Re-hash every file against the manifest; raise `StoreError` naming the first bad one.

        With `strict`, files in the version directory that the manifest does not list are
        an error too.
        """
        manifest = self.manifest(kind, version)
        for name, info in manifest["files"].items():
            self._check_file(kind, version, name, info, self.file_path(kind, version, name), full=True)
        if strict:
            base = self.version_path(kind, version)
            for rel, _ in self._relative_files(base):
                if rel != MANIFEST and rel not in manifest["files"]:
                    raise StoreError(f"{kind}/{version}/{rel}: a file the manifest does not list")
        return manifest

    def verify_all(self) -> builtins.list[tuple[str, str | None]]:
        """Verify every published version (each directory under a kind holding a manifest):
        (``kind/version``, None when sound or the one-line fault). Foreign entries are
        `foreign_entries`' business, quarantined versions are not checked."""
        results: builtins.list[tuple[str, str | None]] = []
        for kind in self.kinds():
            for version in self._version_dirs(kind):
                if not self.exists(kind, version):
                    continue
                try:
                    self.verify(kind, version)
                    results.append((f"{kind}/{version}", None))
                except (StoreError, InputError, OSError) as e:
                    results.append((f"{kind}/{version}", str(e)))
        return results

    def dependents(self, kind: str, version: str) -> builtins.list[str]:
        """Every published version that descends from `kind/version` (its children, theirs
        ...), as ``kind/version`` keys, the farthest descendants first."""
        key = f"{check_name(kind, 'kind')}/{check_name(version, 'version')}"
        children: dict[str, builtins.list[str]] = {}
        for m in self.list():
            for parent in m["parents"].values():
                children.setdefault(str(parent), []).append(f"{m['kind']}/{m['version']}")
        order: builtins.list[str] = []
        seen = {key}

        def visit(k: str) -> None:
            for child in sorted(children.get(k, [])):
                if child not in seen:
                    seen.add(child)
                    visit(child)
                    order.append(child)

        visit(key)
        return order

    def _unused_ancestors(self, removed: builtins.list[str]) -> builtins.list[str]:
        """The ancestors of the `removed` versions that no other version derives from once
        those are gone (children before their parents)."""
        parents = {f"{m['kind']}/{m['version']}": [str(p) for p in m["parents"].values()] for m in self.list()}
        gone, out = set(removed), []
        frontier = [p for key in removed for p in parents.get(key, [])]
        while frontier:
            key = frontier.pop(0)
            if key in gone or key not in parents:
                continue
            if any(key in ps for child, ps in parents.items() if child not in gone):
                continue  # still a parent of a version that stays
            gone.add(key)
            out.append(key)
            frontier.extend(parents[key])
        return out

    def remove_version(
        self,
        kind: str,
        version: str,
        with_dependents: bool = False,
        dry_run: bool = False,
        with_unused_parents: bool = False,
    ) -> builtins.list[str]:
        """Delete a published version (and with `with_dependents` every version derived
        from it, those first; with `with_unused_parents` then every ancestor no remaining
        version derives from); returns the removed ``kind/version`` keys in order.

        Refused when other versions depend on it and `with_dependents` is False. Each
        version disappears whole: locally its directory is renamed into the staging area's
        temp dir, then deleted; on an object store its manifest goes first.
        """
        if not self.exists(kind, version):
            raise InputError(f"{kind}/{version} is not a published version in {self.url}")
        dependents = self.dependents(kind, version)
        if dependents and not with_dependents:
            shown = ", ".join(dependents[:5]) + (f" and {len(dependents) - 5} more" if len(dependents) > 5 else "")
            raise InputError(
                f"{kind}/{version}: {len(dependents)} version(s) depend on it ({shown}): add "
                "--with-dependents to remove them too"
            )
        order = [*dependents, f"{kind}/{version}"]
        if with_unused_parents:
            order += self._unused_ancestors(order)
        if dry_run:
            return order
        self.ensure_store()
        for key in order:
            self._backend.remove_version(*split_key(key))
        return order

    def _relative_files(self, base: str) -> list[tuple[str, str]]:
        """(path relative to `base`, full path) of every file under `base`."""
        self._invalidate(base)
        prefix = base.rstrip("/") + "/"
        out = []
        for path in self.fs.find(base):
            full = path if path.startswith(prefix) or not prefix.startswith("/") else "/" + path.lstrip("/")
            out.append((full[len(prefix) :] if full.startswith(prefix) else full, path))
        return out

    # ---------------------------------------------------------------- listing
    def _dirs(self, path: str) -> list[str]:
        self._invalidate(path)
        try:
            entries = self.fs.ls(path, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        names = []
        for e in entries:
            if e.get("type") != "directory":
                continue
            name = e["name"].rstrip("/").rsplit("/", 1)[-1]
            with contextlib.suppress(InputError):
                names.append(check_name(name))
        return sorted(names)

    def kinds(self) -> list[str]:
        return self._dirs(self.root)

    def _version_dirs(self, kind: str) -> list[str]:
        return self._dirs(f"{self.root}/{check_name(kind, 'kind')}")

    def list(self, kind: str | None = None, **params: Any) -> list[dict[str, Any]]:
        """Manifests of the published versions (optionally with these params), newest first.

        Versions whose manifest is unreadable or corrupt are left out (`verify` names them).
        """
        out = []
        for k in [check_name(kind, "kind")] if kind else self.kinds():
            for v in self._version_dirs(k):
                try:
                    m = self.manifest(k, v)
                except StoreError:
                    continue
                if all(m["params"].get(p) == val for p, val in params.items()):
                    out.append(m)
        return sorted(out, key=lambda m: (m["created"], m["kind"], m["version"]), reverse=True)

    def latest(self, kind: str, **params: Any) -> dict[str, Any] | None:
        """The newest version of `kind` whose parameters include `params`."""
        found = self.list(kind, **params)
        return found[0] if found else None

    def find(self, version_prefix: str) -> tuple[str, str]:
        """Resolve `kind/version`, a version id or a unique prefix of one."""
        if not isinstance(version_prefix, str) or not version_prefix:
            raise InputError(f"{version_prefix!r}: give kind/version or a version id")
        if "/" in version_prefix:
            kind, version = split_key(version_prefix)
            return check_name(kind, "kind"), check_name(version, "version")
        check_name(version_prefix, "version")
        hits = [(m["kind"], m["version"]) for m in self.list() if m["version"].startswith(version_prefix)]
        if len(hits) != 1:
            raise InputError(f"{version_prefix!r} matches {len(hits)} versions in {self.url}; give kind/version")
        return hits[0]

    def survey(self, deep: bool = False) -> StoreSurvey:
        """Sort every entry under the root into the store's own leftovers (`collectable`),
        live claims and what they cover (`held`), and what the store cannot prove it
        wrote (`foreign`). The store's own: the marker, kinds (a directory with a marked
        ``.staging`` or a published version), published versions, ``.quarantine``, and in
        a marked ``.staging`` the claims and the marked directories; a version directory
        without a manifest only when its name is a version id and it carries the
        publishing marker. Links and paths resolving outside the root are foreign, never
        followed. With `deep`, files inside published versions that their manifests do not
        list are foreign too.
        """
        if not self.is_store():
            raise StoreError(f"{self.url} is not a tokenmill store (no {STORE_MARKER}): gc deletes nothing there")
        b = self._backend
        found = StoreSurvey([], [], [])
        for name, path, is_dir in b.entries(self.root):
            if name == STORE_MARKER or (name.startswith(".tmp-") and not is_dir):
                continue  # the marker and a concurrent creator's temp copy of it
            if not is_dir or not _NAME_RE.fullmatch(name) or name.startswith(".") or not self._is_kind(name):
                found.foreign.append(path)
                continue
            self._survey_kind(name, path, found, deep)
        held = {
            (os.path.basename(os.path.dirname(os.path.dirname(p))), os.path.basename(p)[: -len(CLAIM_SUFFIX)])
            for p in found.held
            if p.endswith(CLAIM_SUFFIX)
        }
        for path in b.local_work_entries():  # a live claim keeps its work dir in the local area too
            kind, name = os.path.basename(os.path.dirname(path)), os.path.basename(path)
            if name.endswith(WORK_SUFFIX) and (kind, name[: -len(WORK_SUFFIX)]) in held:
                found.held.append(path)
            else:
                found.collectable.append(path)
        return found

    def _is_kind(self, kind: str) -> bool:
        base = f"{self.root}/{kind}"
        if self._backend.has_marker(f"{base}/{STAGING_DIR}"):
            return True
        return any(
            is_dir and self._backend.exists(f"{p}/{MANIFEST}")
            for n, p, is_dir in self._backend.entries(base)
            if not n.startswith(".")
        )

    def _survey_kind(self, kind: str, base: str, found: StoreSurvey, deep: bool) -> None:
        b = self._backend
        for name, path, is_dir in b.entries(base):
            if name == QUARANTINE_DIR and is_dir:
                continue  # kept for inspection
            if name == STAGING_DIR and is_dir and b.has_marker(path):
                self._survey_staging(path, found)
            elif name.startswith(NEW_DIR_PREFIX) and is_dir and b.has_marker(path):
                found.collectable.append(path)  # a marked directory killed before its rename
            elif not is_dir or name.startswith(".") or not _NAME_RE.fullmatch(name) or ".." in name:
                found.foreign.append(path)
            elif b.exists(f"{path}/{MANIFEST}"):
                if deep:
                    self._survey_version(kind, name, path, found)
            elif _VERSION_ID_RE.fullmatch(name) and b.has_marker(path, PUBLISHING_MARKER):
                found.collectable.append(path)  # a publish killed before its manifest
            else:
                found.foreign.append(path)

    def _survey_staging(self, staging_root: str, found: StoreSurvey) -> None:
        b = self._backend
        own, held = [], set()
        for name, path, is_dir in b.entries(staging_root):
            if name in (LOCK_FILE, STAGING_MARKER) and not is_dir:
                continue
            if not is_dir and name.endswith(CLAIM_SUFFIX) and b.inside(path) and not b.is_link(path):
                if b.claim_held(path):
                    held.add(name[: -len(CLAIM_SUFFIX)])
                    found.held.append(path)
                else:
                    own.append((name, path))
            elif is_dir and b.has_marker(path):
                own.append((name, path))
            else:
                found.foreign.append(path)
        for name, path in own:  # a live claim keeps its version's staging area and work dir
            if name in held or (name.endswith(WORK_SUFFIX) and name[: -len(WORK_SUFFIX)] in held):
                found.held.append(path)
            else:
                found.collectable.append(path)

    def _survey_version(self, kind: str, version: str, base: str, found: StoreSurvey) -> None:
        try:
            listed = set(self.manifest(kind, version)["files"])
        except StoreError:
            return  # verify reports it
        for rel, path in self._relative_files(base):
            if rel not in listed and rel not in (MANIFEST, PUBLISHING_MARKER):
                found.foreign.append(path)

    def contains_local_path(self, path: str) -> bool:
        """Whether the local `path` (existing or not, links resolved) lies inside this
        store's root: where `gc` and `verify` look, so no export may go there."""
        if not self.local:
            return False
        real = os.path.realpath(os.path.abspath(path))
        root = os.path.realpath(self.root)
        return real == root or real.startswith(root.rstrip("/") + "/")

    def foreign_entries(self) -> builtins.list[str]:
        """What lies under the root that the store did not write (never deleted by `gc`)."""
        return self.survey(deep=True).foreign

    def gc(self, dry_run: bool = False, min_age_s: float = 0.0) -> builtins.list[str]:
        """Remove what no reader can see and the store can prove it wrote: marked staging
        areas, work and temp dirs, claims no live process holds, and manifest-less version
        dirs carrying the publishing marker (see `survey`); for a remote store also its
        local work area. Only in a tokenmill store (refused elsewhere). Foreign entries,
        quarantined versions and live claims (with their staging areas and work dirs),
        whatever their age, are kept. Each path's resolved location is checked again just
        before it is removed: gc never follows a link out of the store.

        `min_age_s` spares anything changed more recently (a writer may still be at work:
        removing its staging area makes its publish fail with a clear error, never
        publishes a partial version).
        """
        candidates = self.survey().collectable
        removed = [p for p in candidates if min_age_s <= 0 or self._backend.age(p) >= min_age_s]
        if not dry_run:
            kept = []
            for path in removed:
                if not self._backend.inside(path):
                    continue  # became a link meanwhile
                with contextlib.suppress(FileNotFoundError):
                    self._backend.remove(path)
                kept.append(path)
            removed = kept
        return removed

    # ---------------------------------------------------------------- work areas
    def scratch_dir(self, kind: str) -> str:
        """A local directory for temporary files of `kind`'s stages, where `gc` finds leftovers.

        On a local store it is on the store's own disk (``<kind>/.staging/.tmp``), so a
        finished file is published by a rename. Use ``tempfile.mkdtemp(dir=...)`` in it.
        """
        check_name(kind, "kind")
        self.ensure_store()
        path = self._backend.scratch_path(kind)
        self._backend.make_dir(path)
        return path

    def work_dir(self, kind: str, version: str) -> str:
        """A local directory for resumable work on `kind/version` (checkpoints, partial
        outputs), private to this store and this version. It survives a killed run, so a
        rerun resumes from it; remove it once the version is published (`drop_work_dir`).
        On a local store it lives in the store's staging area (``<kind>/.staging/<version>.work``);
        for a remote store in a local area keyed by the store's URL. `gc` removes stale ones.
        """
        check_name(kind, "kind")
        check_name(version, "version")
        self.ensure_store()
        path = self._backend.work_path(kind, version)
        self._backend.make_dir(path)
        return path

    def drop_work_dir(self, kind: str, version: str) -> None:
        shutil.rmtree(
            self._backend.work_path(check_name(kind, "kind"), check_name(version, "version")), ignore_errors=True
        )

    @contextlib.contextmanager
    def claim(self, kind: str, version: str, poll_s: float = 2.0, ttl_s: float = 120.0) -> Iterator[None]:
        """Hold the exclusive right to produce `kind/version` while the block runs.

        Two runs that would compute the same version wait for each other instead of doing
        the work twice: the second one blocks here, and when it gets the claim it finds the
        version published (check `exists` inside the block). Local stores use an `flock`ed
        file in the staging area (released when the process dies); object stores a lease
        object created with create-only semantics and renewed every `ttl_s / 3` seconds by a
        background thread; a lease older than `ttl_s` (its holder died) is taken over.
        The claim is advisory: the publish protocol alone keeps versions whole.
        """
        check_name(kind, "kind")
        check_name(version, "version")
        self.ensure_store()
        with self._backend.claim(kind, version, poll_s, ttl_s):
            yield

    def produce(self, kind: str, version: str, make: Callable[[], VersionRef]) -> VersionRef:
        """The one path every stage takes to its output: reuse `kind/version` if it is
        published and sound (`usable`), else claim it (a concurrent run of the same work
        waits here, then finds it published) and call `make`, which stages and publishes it.
        If `make` fails because a concurrent writer published the version meanwhile (its
        staging area moved away under us), that version is adopted."""
        if self.usable(kind, version):
            return self.ref(kind, version)
        with self.claim(kind, version):
            if self.usable(kind, version):
                return self.ref(kind, version)
            try:
                return make()
            except (InputError, StoreError, OSError):
                if self.settled_exists(kind, version):
                    return self.ref(kind, version)
                raise

    # ---------------------------------------------------------------- quarantine
    def quarantine(self, kind: str, version: str, reason: str) -> str:
        """Move a corrupt version aside (``<kind>/.quarantine/<version>-<time>``) so a rerun
        recomputes it; returns where it went. Nothing is deleted."""
        self.ensure_store()
        src = self.version_path(kind, version)
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%f")
        dest = self._safe(f"{self.root}/{kind}/{QUARANTINE_DIR}/{version}-{stamp}")
        self._backend.move_aside(src, dest)
        _log.warning("quarantined %s/%s in %s: %s -> %s", kind, version, self.url, reason, dest)
        return dest


# =============================================================================== backends
# Everything that differs between local disk and object stores, one class each. The
# store calls them with paths it has built and checked (`check_name`, `_safe`); they
# call back into the store for the protocol's own questions (`exists`, `_check_staged`).
