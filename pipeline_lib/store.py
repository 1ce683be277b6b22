"""Versioned, write-once artifact store over any fsspec filesystem.

Layout: ``<root>/<kind>/<version>/`` holds a version's files and its ``manifest.json``.
The manifest is the commit point: a directory without one is not a version, readers
never see it, and `gc` removes it.

* Version ids are derived, never random: a hash of the parents' version ids, the stage
  parameters and the stage's code version. The same work lands in the same place, so a
  rerun finds it and skips it, and two writers of the same work meet at the same id.
* The manifest records lineage (parents and their manifest hashes), parameters, every
  file's size and sha256, totals, creation time and tool / code versions. `verify`
  re-hashes the files against it; `read_bytes` checks the one file it reads; `local_dir`
  checks sizes (a remote version is hashed while it is downloaded into the cache).

Local disk (``file://`` or a plain path)
    Work in progress lives in ``<root>/<kind>/.staging/<version>/``; temporary files in
    ``<root>/<kind>/.staging/.tmp/`` (same filesystem, outside any version directory).
    Every file is written to a temp name, fsynced and `os.replace`d into the staging
    directory. `publish` writes the manifest into the staging directory, fsyncs it and
    renames the whole directory to ``<kind>/<version>`` in one `os.rename`, then fsyncs
    the parent. Why a directory rename rather than writing in place with the manifest
    last: the version appears whole or not at all even to tools that ignore manifests
    (``ls``, a nanoGPT loader pointed at the directory), a published directory is never
    written into, and `rename` onto an existing version fails, which is write-once for
    free. Puts take a shared `flock` on ``.staging/.lock`` and `publish` an exclusive
    one, so a slow second writer can never drop a file into a version after it was
    published: it sees the manifest and skips the write.

Object stores (``s3://``, ``gs://``, ``memory://`` ...)
    There is no rename: files go straight to ``<kind>/<version>/`` as single PUTs
    (multipart uploads complete atomically), and the manifest is PUT last with
    create-only semantics (s3fs mode ``"xb"`` -> ``IfNoneMatch: *``), so of two
    concurrent publishers exactly one manifest wins and the other adopts it. A writer
    checks for the manifest before each PUT, so it stops writing into a published
    version (a small race remains between the check and the PUT; the stages' outputs are
    deterministic, so such a late PUT rewrites identical bytes, and `verify` would catch
    anything else).

Staged units of work carry completion markers (``_done/<unit>.json``), so a stage killed
half-way resumes where it stopped (datatrove's ``completions/``); markers are removed
before the manifest is written.

Names (kinds, versions, file path parts) are ``[A-Za-z0-9._-]`` only, never ``.``/``..``
or containing ``..``, never starting with ``.`` (reserved for the store's own entries),
and on local disk the resolved path must stay under the store root (no symlink escapes).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any, BinaryIO

from pipeline_lib.fsio import (
    InputError,
    check_local_file,
    filesystem,
    fsync_dir,
    fsync_file,
    hash_stream,
    is_local,
    protocol_of,
    write_bytes_atomic,
    write_bytes_create_only,
)
from pipeline_lib.errors import StoreError  # re-exported
from pipeline_lib.version import __version__

try:  # POSIX advisory locks; without them (Windows) local publishes are not serialised
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "tokenmill.manifest/1"
DONE_DIR = "_done"
STAGING_DIR = ".staging"
TMP_DIR = ".tmp"
LOCK_FILE = ".lock"
QUARANTINE_DIR = ".quarantine"
WORK_SUFFIX = ".work"
CLAIM_SUFFIX = ".claim"
STORE_MARKER = "tokenmill-store.json"
STORE_FORMAT = "tokenmill.store/1"
MAX_MANIFEST_BYTES = 32 << 20
MAX_NAME_LEN = 200
MAX_PATH_DEPTH = 8
_NAME_RE = re.compile(r"[A-Za-z0-9._-]+")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_CHUNK = 8 << 20
_log = logging.getLogger("tokenmill.store")


def check_name(name: str, what: str = "artifact name") -> str:
    """Accept `[A-Za-z0-9._-]+` names only: no separators, no `..`, no leading `.`."""
    if (
        not isinstance(name, str)
        or not _NAME_RE.fullmatch(name)  # fullmatch: "abc\n" must not pass as "abc"
        or name.startswith(".")
        or ".." in name
        or len(name) > MAX_NAME_LEN
    ):
        shown = name if not isinstance(name, str) or len(name) <= 80 else name[:80] + "..."
        raise InputError(
            f"invalid {what} {shown!r}: use 1-{MAX_NAME_LEN} letters, digits, '.', '_' and '-', "
            "not starting with '.' and without '..'"
        )
    return name


def check_relpath(relpath: str) -> str:
    """A file path inside a version: '/'-separated safe names, at most a few levels deep."""
    if not isinstance(relpath, str) or not relpath:
        raise InputError(f"invalid file name {relpath!r}")
    parts = relpath.split("/")
    if len(parts) > MAX_PATH_DEPTH:
        raise InputError(f"invalid file name {relpath!r}: more than {MAX_PATH_DEPTH} levels deep")
    for part in parts:
        check_name(part, "file name")
    return relpath


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def version_id(kind: str, parents: Mapping[str, str], params: Mapping[str, Any], code_version: str) -> str:
    """Deterministic id of a version: the same inputs, parameters and code give the same id."""
    check_name(kind, "kind")
    payload = canonical_json({"kind": kind, "parents": dict(parents), "params": dict(params), "code": code_version})
    return hashlib.sha256(payload).hexdigest()[:20]


@dataclass(frozen=True)
class FileInfo:
    size: int
    sha256: str


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


def _hash_stream(f: BinaryIO) -> FileInfo:
    return FileInfo(*hash_stream(f))


def _copy_hashed(src: str, dst: str) -> FileInfo:
    """Copy a local file while hashing it, fsync the copy."""
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        info = FileInfo(*hash_stream(fi, fo))
        fo.flush()
        os.fsync(fo.fileno())
    return info


def _held(path: str) -> bool:
    """Whether a local claim file is locked by a live process right now."""
    if fcntl is None:
        return True
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # (closing releases the probe's own lock)
    return False


class Staging:
    """A version being written: put files, mark units done, then `ArtifactStore.publish`.

    Several processes may stage the same version at once (one per mapped unit of work, or
    two runs of the same stage): every put is atomic per file, and once the version is
    published the remaining puts are skipped.
    """

    def __init__(self, store: ArtifactStore, kind: str, version: str):
        self.store, self.kind, self.version = store, kind, version
        self.fs = store.fs
        if store.local:
            self.path = store._safe(f"{store.root}/{kind}/{STAGING_DIR}/{version}")
            self.tmp_dir = store._safe(f"{store.root}/{kind}/{STAGING_DIR}/{TMP_DIR}")
        else:
            self.path = f"{store.root}/{kind}/{STAGING_DIR}/{version}"
            self.tmp_dir = None
        self.written: dict[str, FileInfo] = {}  # what open_write published, by name

    def __repr__(self) -> str:
        return f"Staging({self.store.url!r}, {self.kind!r}, {self.version!r})"

    def _dirs(self) -> None:
        """Create the staging and temp directories on first write (reads never create them)."""
        if self.tmp_dir is not None:
            os.makedirs(self.path, exist_ok=True)
            os.makedirs(self.tmp_dir, exist_ok=True)

    def _p(self, name: str) -> str:
        check_relpath(name)
        if name == MANIFEST:
            raise InputError(f"{MANIFEST} is written by ArtifactStore.publish only")
        path = f"{self.path}/{name}"
        return self.store._safe(path) if self.store.local else path

    def published(self) -> bool:
        return self.store.exists(self.kind, self.version)

    # ------------------------------------------------------------ local commit
    def _commit_local(self, tmp: str, dest: str) -> None:
        """Move a finished, fsynced temp file to `dest` unless the version is published."""
        with self.store._lock(self.kind, exclusive=False):
            if self.published():
                return  # the version is out: never write into it (tmp is removed by the caller)
            directory = os.path.dirname(dest)
            os.makedirs(directory, exist_ok=True)
            os.replace(tmp, dest)
            fsync_dir(directory)

    # ------------------------------------------------------------ puts
    def put_bytes(self, name: str, data: bytes) -> FileInfo:
        dest = self._p(name)
        info = FileInfo(len(data), hashlib.sha256(data).hexdigest())
        if self.store.local:
            self._dirs()
            fd, tmp = tempfile.mkstemp(dir=self.tmp_dir, prefix=".tmp-", suffix=".part")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                self._commit_local(tmp, dest)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        elif not self.published():
            self.fs.pipe_file(dest, data)
        return info

    def put_file(self, name: str, local_path: str, move: bool = False) -> FileInfo:
        """Publish a finished local file into the staging area (a rename when on the same disk)."""
        dest = self._p(name)
        if self.store.local:
            self._dirs()
            if move:
                with open(local_path, "rb") as f:
                    info = _hash_stream(f)
                fsync_file(local_path)
                try:
                    self._commit_local(local_path, dest)
                    if os.path.exists(local_path):  # published meanwhile: the move was skipped
                        os.unlink(local_path)
                    return info
                except OSError:
                    pass  # another device: copy below
            fd, tmp = tempfile.mkstemp(dir=self.tmp_dir, prefix=".tmp-", suffix=".part")
            os.close(fd)
            try:
                info = _copy_hashed(local_path, tmp)
                self._commit_local(tmp, dest)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            if move:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(local_path)
            return info
        with open(local_path, "rb") as f:
            info = _hash_stream(f)
        if not self.published():
            self.fs.put_file(local_path, dest)
        if move:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(local_path)
        return info

    @contextlib.contextmanager
    def open_write(self, name: str) -> Iterator[str]:
        """Yield a local temp path to write; on success it is published as `name`.

        On a local store the temp file is on the store's disk (outside the version
        directory), so publishing it is a rename.
        """
        self._p(name)  # validate the name before any work is done
        self._dirs()
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
        if not self.store.local:
            self.store._invalidate(path)
        return self.fs.exists(path)

    def read_bytes(self, name: str) -> bytes:
        try:
            return self.fs.cat_file(self._p(name))
        except FileNotFoundError:
            raise StoreError(f"{self.kind}/{self.version} (staging): {name} is missing") from None

    def local_path(self, name: str) -> str:
        if not self.store.local:
            raise StoreError("local_path is only available on a local store")
        self._dirs()
        return self._p(name)

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
        self.url = url
        self.storage_options = storage_options
        self.fs, root = filesystem(url, **storage_options)
        self.local = is_local(self.fs)
        self.root = root.rstrip("/") or "/"
        if self.local:
            self.root = os.path.abspath(self.root)
            self._real_root = os.path.realpath(self.root)
        self._owned = False  # the marker was found or written through this handle

    # ---------------------------------------------------------------- identity
    def _marker_path(self) -> str:
        return f"{self.root}/{STORE_MARKER}"

    def is_store(self) -> bool:
        """Whether the root holds a tokenmill store marker of the format this code reads."""
        path = self._marker_path()
        if not self.local:
            self._invalidate(path)
        try:
            with self.fs.open(path, "rb") as f:
                raw = f.read(1 << 16)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return False
        try:
            marker = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise StoreError(f"{path}: corrupt store marker (not JSON): restore it, or choose another --store") from None
        fmt = marker.get("format") if isinstance(marker, dict) else None
        if not isinstance(fmt, str) or not fmt.startswith("tokenmill.store/"):
            raise StoreError(f"{path}: not a tokenmill store marker (format {fmt!r})")
        if fmt != STORE_FORMAT:
            raise StoreError(f"{self.url} is a store of format {fmt!r}; this tokenmill reads {STORE_FORMAT!r}: upgrade tokenmill")
        return True

    def _root_is_empty(self) -> bool:
        """No entries but the temp files of a concurrent creator's marker (``.tmp-*``)."""
        if self.local:
            try:
                return all(name.startswith(".tmp-") for name in os.listdir(self.root))
            except FileNotFoundError:
                return True
            except NotADirectoryError:
                raise StoreError(f"{self.url} is a file, not a directory: choose another --store") from None
        self._invalidate(self.root)
        try:
            return not self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
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
            if self._root_is_empty():
                self._write_marker()
            elif not self.is_store():  # re-checked: a concurrent creator may have marked it meanwhile
                raise StoreError(
                    f"{self.url} is not empty and is not a tokenmill store (it has no {STORE_MARKER}): "
                    "choose a new or empty directory for --store"
                )
        self._owned = True

    def _write_marker(self) -> None:
        marker = canonical_json({"format": STORE_FORMAT, "created": dt.datetime.now(dt.timezone.utc).isoformat(), "tool_version": __version__})
        if self.local:
            os.makedirs(self.root, exist_ok=True)
            write_bytes_atomic(self.fs, self._marker_path(), marker)  # two creators write equivalent markers
        else:
            with contextlib.suppress(FileExistsError):
                self.fs.makedirs(self.root, exist_ok=True)
            write_bytes_create_only(self.fs, self._marker_path(), marker)  # a concurrent creator's marker stands
        if not self.is_store():
            raise StoreError(f"{self._marker_path()}: written but cannot be read back")

    def __repr__(self) -> str:
        return f"ArtifactStore({self.url!r})"

    # ---------------------------------------------------------------- paths
    def _safe(self, path: str) -> str:
        """On local disk, refuse a path whose resolved location leaves the store root."""
        if self.local:
            real = os.path.realpath(path)
            if real != self._real_root and not real.startswith(self._real_root.rstrip("/") + "/"):
                raise InputError(f"{path} resolves to {real}, outside the store root {self._real_root}")
        return path

    def _invalidate(self, path: str) -> None:
        """Forget cached listings (s3fs caches them; another process may have written)."""
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(path)

    def version_path(self, kind: str, version: str) -> str:
        return self._safe(f"{self.root}/{check_name(kind, 'kind')}/{check_name(version, 'version')}")

    def uri(self, kind: str, version: str, name: str | None = None) -> str:
        path = self.version_path(kind, version)
        if name is not None:
            path = f"{path}/{check_relpath(name)}"
        return path if self.local else self.fs.unstrip_protocol(path)

    def file_path(self, kind: str, version: str, name: str) -> str:
        return self._safe(f"{self.version_path(kind, version)}/{check_relpath(name)}")

    def _manifest_path(self, kind: str, version: str) -> str:
        return f"{self.version_path(kind, version)}/{MANIFEST}"

    @contextlib.contextmanager
    def _lock(self, kind: str, exclusive: bool) -> Iterator[None]:
        if not self.local or fcntl is None:
            yield
            return
        directory = self._safe(f"{self.root}/{check_name(kind, 'kind')}/{STAGING_DIR}")
        os.makedirs(directory, exist_ok=True)
        fd = os.open(f"{directory}/{LOCK_FILE}", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # closing releases the lock; so does the process dying

    def settled_exists(self, kind: str, version: str) -> bool:
        """`exists`, after any publish of this kind in progress has finished (local stores
        publish under an exclusive lock; this waits for it). For a writer whose reads failed
        because a concurrent writer was moving the staging area into place."""
        with self._lock(kind, exclusive=False):
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
            self._discard(staging)
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
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds"),
            "tool_version": __version__,
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
        if self.local:
            self._publish_local(staging, file_map, data)
        else:
            self._publish_remote(staging, file_map, data)
        return self.ref(kind, version)

    def _check_staged(self, staging: Staging, file_map: Mapping[str, Mapping[str, Any]]) -> None:
        for name, info in file_map.items():
            path = f"{staging.path}/{name}"
            try:
                size = os.path.getsize(path) if self.local else self.fs.info(path)["size"]
            except FileNotFoundError:
                raise StoreError(f"cannot publish {staging.kind}/{staging.version}: {name} is not in the staging area") from None
            if size != info["size"]:
                raise StoreError(
                    f"cannot publish {staging.kind}/{staging.version}: {name} has {size:,} bytes, the file list says {info['size']:,}"
                )

    def _publish_local(self, staging: Staging, file_map: Mapping[str, Any], data: bytes) -> None:
        kind, version = staging.kind, staging.version
        with self._lock(kind, exclusive=True):
            if self.exists(kind, version):
                self._discard(staging)
                return
            staging._dirs()
            self._check_staged(staging, file_map)  # (a staging area removed by gc fails here)
            # Drop what is not part of the version (completion markers, scratch dirs).
            for dirpath, dirnames, filenames in os.walk(staging.path, topdown=False):
                for fname in filenames:
                    full = os.path.join(dirpath, fname)
                    rel = os.path.relpath(full, staging.path).replace(os.sep, "/")
                    if rel not in file_map:
                        os.unlink(full)
                for dname in dirnames:
                    full = os.path.join(dirpath, dname)
                    if os.path.islink(full):
                        os.unlink(full)
                    elif not os.listdir(full):
                        os.rmdir(full)
            for name in file_map:  # published files are read-only; a writer must go through a new version
                os.chmod(f"{staging.path}/{name}", 0o444)
            write_bytes_atomic(self.fs, f"{staging.path}/{MANIFEST}", data)
            os.chmod(f"{staging.path}/{MANIFEST}", 0o444)
            final = self.version_path(kind, version)
            if os.path.lexists(final):  # a directory without a manifest: an orphan, not a version
                trash = f"{self.root}/{kind}/{STAGING_DIR}/{TMP_DIR}/trash-{uuid.uuid4().hex}"
                os.rename(final, trash)
                shutil.rmtree(trash, ignore_errors=True)
            os.rename(staging.path, final)
            fsync_dir(os.path.dirname(final))

    def _publish_remote(self, staging: Staging, file_map: Mapping[str, Any], data: bytes) -> None:
        """Copy the staged files under the version's prefix (server-side copies), then PUT
        the manifest create-only. Until the manifest lands, the version prefix holds only
        whole files of the same bytes any writer of this version would copy; a publisher
        killed between the copies and the manifest leaves a manifest-less prefix that
        readers ignore and `gc` collects."""
        kind, version = staging.kind, staging.version
        self._invalidate(staging.path)
        try:
            self._check_staged(staging, file_map)
        except StoreError:
            if self.exists(kind, version):  # a concurrent writer of this version published it and took the staging area
                return
            raise
        final = self.version_path(kind, version)
        for name in file_map:
            if self.exists(kind, version):  # a concurrent writer published: adopt its version
                break
            try:
                self.fs.copy(f"{staging.path}/{name}", f"{final}/{name}")
            except FileNotFoundError:  # the shared staging area went away under us
                if self.exists(kind, version):  # ... taken by a concurrent writer that published
                    return
                raise StoreError(f"cannot publish {kind}/{version}: {name} vanished from the staging area (was `tokenmill gc` run meanwhile?); rerun") from None
        created = write_bytes_create_only(self.fs, f"{final}/{MANIFEST}", data)
        if not created:  # a concurrent writer published first: its manifest stands
            self._invalidate(final)
        elif not self.exists(kind, version):
            raise StoreError(f"{kind}/{version}: the manifest was written but cannot be read back")
        self._discard(staging)

    def _discard(self, staging: Staging) -> None:
        if self.local:
            shutil.rmtree(staging.path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError, OSError):
                self.fs.rm(staging.path, recursive=True)
            self._invalidate(staging.path)

    # ---------------------------------------------------------------- reading
    def exists(self, kind: str, version: str) -> bool:
        """Whether `kind/version` is published (has its manifest)."""
        path = self._manifest_path(kind, version)
        if self.local:
            return os.path.isfile(path)
        self._invalidate(path)
        return self.fs.exists(path)

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
            manifest = self.manifest(kind, version)
            if self.local:
                for name, info in manifest["files"].items():
                    self._local_check(self.file_path(kind, version, name), f"{kind}/{version}/{name}", info, full=True)
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
        if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
            raise StoreError(f"{path}: corrupt manifest (not a {MANIFEST_FORMAT} manifest)")
        if manifest.get("kind") != kind or manifest.get("version") != version:
            raise StoreError(f"{path}: corrupt manifest (it describes {manifest.get('kind')}/{manifest.get('version')})")
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
        for key, typ in (("params", dict), ("meta", dict), ("parents", dict), ("created", str)):
            if not isinstance(manifest.get(key), typ):
                raise StoreError(f"{path}: corrupt manifest: {key!r} missing or not a {typ.__name__}")
        return manifest

    def manifest(self, kind: str, version: str) -> dict[str, Any]:
        """The parsed, checked manifest of a published version (raises `StoreError`)."""
        return self._parse_manifest(self._read_manifest_bytes(kind, version), kind, version)

    def ref(self, kind: str, version: str) -> VersionRef:
        raw = self._read_manifest_bytes(kind, version)
        self._parse_manifest(raw, kind, version)
        return VersionRef(kind, version, self.uri(kind, version), hashlib.sha256(raw).hexdigest())

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
                raise StoreError(f"{kind}/{version}/{name}: {len(data):,} bytes, manifest says {info['size']:,}: truncated or altered")
            if hashlib.sha256(data).hexdigest() != info["sha256"]:
                raise StoreError(f"{kind}/{version}/{name}: sha256 mismatch: the file is corrupt or was altered")
        return data

    def open(self, kind: str, version: str, name: str) -> BinaryIO:
        """A published file opened for reading, after checking it against the manifest."""
        return open(self.local_file(kind, version, name), "rb")

    def _check_file(self, kind: str, version: str, name: str, info: Mapping[str, Any], path: str, full: bool) -> None:
        try:
            if full:
                with open(path, "rb") if self.local else self.fs.open(path, "rb") as f:
                    got = _hash_stream(f)
            else:
                got = FileInfo(os.path.getsize(path) if self.local else self.fs.info(path)["size"], info["sha256"])
        except (FileNotFoundError, IsADirectoryError):
            raise StoreError(f"{kind}/{version}/{name}: listed in the manifest but missing") from None
        if got.size != info["size"]:
            raise StoreError(f"{kind}/{version}/{name}: {got.size:,} bytes, manifest says {info['size']:,}: truncated or altered")
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
        if self.local:
            if verify != "none":
                for name, info in manifest["files"].items():
                    self._local_check(self.file_path(kind, version, name), f"{kind}/{version}/{name}", info, verify == "full")
            return self.version_path(kind, version)
        cache = cache_dir or os.path.join(tempfile.gettempdir(), "tokenmill-cache")
        dest = os.path.join(cache, kind, version)
        if self._cache_current(dest, manifest_raw):
            try:
                if verify != "none":
                    for name, info in manifest["files"].items():
                        self._local_check(os.path.join(dest, *name.split("/")), f"{kind}/{version}/{name} (cached)", info, verify == "full")
                return dest
            except StoreError as e:  # a damaged cache copy is ours to replace: download it again
                _log.warning("%s; downloading %s/%s again", e, kind, version)
                old = f"{dest}.{uuid.uuid4().hex}.old"
                with contextlib.suppress(OSError):
                    os.rename(dest, old)
                shutil.rmtree(old, ignore_errors=True)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        tmp = f"{dest}.{uuid.uuid4().hex}.part"
        try:
            for name, info in manifest["files"].items():
                target = os.path.join(tmp, *name.split("/"))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                try:
                    with self.fs.open(self.file_path(kind, version, name), "rb") as src, open(target, "wb") as dst:
                        n, digest = hash_stream(src, dst)
                except FileNotFoundError:
                    raise StoreError(f"{kind}/{version}/{name}: listed in the manifest but missing from {self.url}") from None
                if n != info["size"] or digest != info["sha256"]:
                    raise StoreError(f"{kind}/{version}/{name}: downloaded {n:,} bytes that do not match the manifest's size/sha256: corrupt or altered")
            with open(os.path.join(tmp, MANIFEST), "wb") as f:
                f.write(manifest_raw)
            for _ in range(2):
                try:
                    os.rename(tmp, dest)
                    break
                except OSError:
                    if self._cache_current(dest, manifest_raw):
                        break  # another process filled the cache with this version meanwhile
                    old = f"{dest}.{uuid.uuid4().hex}.old"  # a stale copy: move it aside
                    with contextlib.suppress(OSError):
                        os.rename(dest, old)
                    shutil.rmtree(old, ignore_errors=True)
            else:
                raise StoreError(f"cannot fill the cache directory {dest}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return dest

    def local_file(self, kind: str, version: str, name: str, cache_dir: str | None = None) -> str:
        """A local path to one file of a version: the file itself on a local store, else a
        hash-checked download of that file alone (a worker reading one shard fetches one shard)."""
        manifest = self.manifest(kind, version)
        info = manifest["files"].get(name)
        if info is None:
            raise StoreError(f"{kind}/{version} has no file {name!r}")
        if self.local:
            path = self.file_path(kind, version, name)
            self._local_check(path, f"{kind}/{version}/{name}", info, full=True)
            return path
        cache = cache_dir or os.path.join(tempfile.gettempdir(), "tokenmill-cache")
        dest = os.path.join(cache, kind, f"{version}.files", info["sha256"][:16], *check_relpath(name).split("/"))
        if os.path.exists(dest):
            with contextlib.suppress(StoreError):
                self._local_check(dest, f"{kind}/{version}/{name} (cached)", info, full=True)
                return dest
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        tmp = f"{dest}.{uuid.uuid4().hex}.part"
        try:
            with self.fs.open(self.file_path(kind, version, name), "rb") as src, open(tmp, "wb") as dst:
                n, digest = hash_stream(src, dst)
            if n != info["size"] or digest != info["sha256"]:
                raise StoreError(f"{kind}/{version}/{name}: downloaded {n:,} bytes that do not match the manifest's size/sha256: corrupt or altered")
            os.replace(tmp, dest)
        except FileNotFoundError:
            raise StoreError(f"{kind}/{version}/{name}: listed in the manifest but missing from {self.url}") from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return dest

    @staticmethod
    def _cache_current(dest: str, manifest_raw: bytes) -> bool:
        try:
            with open(os.path.join(dest, MANIFEST), "rb") as f:
                return f.read() == manifest_raw
        except OSError:
            return False

    @staticmethod
    def _local_check(path: str, label: str, info: Mapping[str, Any], full: bool) -> None:
        if full:
            check_local_file(path, info["size"], info["sha256"], label)
            return
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            raise StoreError(f"{label}: missing") from None
        if size != info["size"]:
            raise StoreError(f"{label}: {size:,} bytes, manifest says {info['size']:,}: truncated or altered")

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
            if not self.local:
                self._invalidate(base)
            for rel, _ in self._relative_files(base):
                if rel != MANIFEST and rel not in manifest["files"]:
                    raise StoreError(f"{kind}/{version}/{rel}: a file the manifest does not list")
        return manifest

    def _relative_files(self, base: str) -> list[tuple[str, str]]:
        """(path relative to `base`, full path) of every file under `base`."""
        if not self.local:
            self._invalidate(base)
        prefix = base.rstrip("/") + "/"
        out = []
        for path in self.fs.find(base):
            full = path if path.startswith(prefix) or not prefix.startswith("/") else "/" + path.lstrip("/")
            out.append((full[len(prefix) :] if full.startswith(prefix) else full, path))
        return out

    # ---------------------------------------------------------------- listing
    def _dirs(self, path: str) -> list[str]:
        if not self.local:
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
            kind, version = version_prefix.split("/", 1)
            return check_name(kind, "kind"), check_name(version, "version")
        check_name(version_prefix, "version")
        hits = [(m["kind"], m["version"]) for m in self.list() if m["version"].startswith(version_prefix)]
        if len(hits) != 1:
            raise InputError(f"{version_prefix!r} matches {len(hits)} versions in {self.url}; give kind/version")
        return hits[0]

    def _age(self, path: str) -> float:
        """Seconds since anything under `path` last changed."""
        newest = 0.0
        if self.local:
            for dirpath, _, filenames in os.walk(path):
                with contextlib.suppress(OSError):
                    newest = max(newest, os.lstat(dirpath).st_mtime)
                for f in filenames:
                    with contextlib.suppress(OSError):
                        newest = max(newest, os.lstat(os.path.join(dirpath, f)).st_mtime)
            with contextlib.suppress(OSError):
                newest = max(newest, os.lstat(path).st_mtime)
        else:
            for info in self.fs.find(path, detail=True).values():
                stamp = info.get("LastModified") or info.get("mtime") or info.get("created") or info.get("updated")
                if isinstance(stamp, dt.datetime):
                    newest = max(newest, stamp.timestamp())
                elif isinstance(stamp, (int, float)):
                    newest = max(newest, float(stamp))
        return time.time() - newest if newest else float("inf")

    def gc(self, dry_run: bool = False, min_age_s: float = 0.0) -> list[str]:
        """Remove what no reader can see: staging areas, work and temp dirs, and version
        dirs without a manifest. Only in a tokenmill store (refused elsewhere), and only
        entries the store's own layout names: ``<kind>/.staging/*`` (not its lock) and
        ``<kind>/<version>`` dirs with no manifest; for a remote store also its local
        work area. Quarantined versions (``<kind>/.quarantine``) are kept for inspection.

        `min_age_s` spares anything changed more recently (a writer may still be at work:
        removing its staging area makes its publish fail with a clear error, never
        publishes a partial version).
        """
        if not self.is_store():
            raise StoreError(f"{self.url} is not a tokenmill store (no {STORE_MARKER}): gc deletes nothing there")
        candidates = []
        for k in self.kinds():
            staging_root = f"{self.root}/{k}/{STAGING_DIR}"
            if self.fs.exists(staging_root):
                for e in self.fs.ls(staging_root, detail=False):
                    name = e.rstrip("/").rsplit("/", 1)[-1]
                    if name != LOCK_FILE and not (self.local and name.endswith(CLAIM_SUFFIX) and _held(e)):
                        candidates.append(e.rstrip("/"))
            for v in self._version_dirs(k):
                if not self.exists(k, v):
                    candidates.append(self.version_path(k, v))
        if not self.local and os.path.isdir(self._local_area()):
            for k in os.listdir(self._local_area()):
                candidates.extend(os.path.join(self._local_area(), k, e) for e in os.listdir(os.path.join(self._local_area(), k)))
        removed = [p for p in candidates if min_age_s <= 0 or self._age(p) >= min_age_s]
        if not dry_run:
            for path in removed:
                with contextlib.suppress(FileNotFoundError):
                    if os.path.isabs(path) and (self.local or path.startswith(self._local_area())):
                        if os.path.isdir(path) and not os.path.islink(path):
                            shutil.rmtree(path)
                        else:
                            os.unlink(path)
                    else:
                        self.fs.rm(path, recursive=True)
        return removed

    # ---------------------------------------------------------------- work areas
    def _local_area(self) -> str:
        """Local disk space of a remote store (work dirs, temp files), one per store URL."""
        digest = hashlib.sha256(f"{protocol_of(self.fs)}://{self.root}".encode()).hexdigest()[:16]
        return os.path.join(tempfile.gettempdir(), "tokenmill-stores", digest)

    def scratch_dir(self, kind: str) -> str:
        """A local directory for temporary files of `kind`'s stages, where `gc` finds leftovers.

        On a local store it is on the store's own disk (``<kind>/.staging/.tmp``), so a
        finished file is published by a rename. Use ``tempfile.mkdtemp(dir=...)`` in it.
        """
        check_name(kind, "kind")
        self.ensure_store()
        if self.local:
            path = self._safe(f"{self.root}/{kind}/{STAGING_DIR}/{TMP_DIR}")
        else:
            path = os.path.join(self._local_area(), kind, TMP_DIR)
        os.makedirs(path, exist_ok=True)
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
        if self.local:
            path = self._safe(f"{self.root}/{kind}/{STAGING_DIR}/{version}{WORK_SUFFIX}")
        else:
            path = os.path.join(self._local_area(), kind, f"{version}{WORK_SUFFIX}")
        os.makedirs(path, exist_ok=True)
        return path

    def drop_work_dir(self, kind: str, version: str) -> None:
        path = (
            f"{self.root}/{kind}/{STAGING_DIR}/{check_name(version, 'version')}{WORK_SUFFIX}"
            if self.local
            else os.path.join(self._local_area(), check_name(kind, "kind"), f"{version}{WORK_SUFFIX}")
        )
        shutil.rmtree(path, ignore_errors=True)

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
        if self.local:
            with self._local_claim(kind, version):
                yield
        else:
            with self._lease(kind, version, poll_s, ttl_s):
                yield

    @contextlib.contextmanager
    def _local_claim(self, kind: str, version: str) -> Iterator[None]:
        directory = self._safe(f"{self.root}/{kind}/{STAGING_DIR}")
        os.makedirs(directory, exist_ok=True)
        path = f"{directory}/{version}{CLAIM_SUFFIX}"
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if fcntl is not None:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                try:  # the file may have been unlinked by the holder we waited for: retry on a fresh one
                    same = os.path.samestat(os.fstat(fd), os.stat(path))
                except FileNotFoundError:
                    same = False
                if same:
                    try:
                        yield
                    finally:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(path)
                    return
            finally:
                os.close(fd)

    @contextlib.contextmanager
    def _lease(self, kind: str, version: str, poll_s: float, ttl_s: float) -> Iterator[None]:
        import threading

        path = f"{self.root}/{kind}/{STAGING_DIR}/{version}{CLAIM_SUFFIX}"
        holder = uuid.uuid4().hex
        while True:
            body = canonical_json({"holder": holder, "expires": time.time() + ttl_s})
            if write_bytes_create_only(self.fs, path, body):
                break
            try:
                self._invalidate(path)
                lease = json.loads(self.fs.cat_file(path))
                expired = float(lease["expires"]) < time.time()
            except FileNotFoundError:
                continue
            except (ValueError, KeyError, TypeError):
                expired = True  # unreadable: treat as abandoned
            if expired:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(path)
                continue
            time.sleep(poll_s)
        stop = threading.Event()

        def renew() -> None:
            while not stop.wait(ttl_s / 3):
                with contextlib.suppress(Exception):  # a failed renewal is retried; expiry is the backstop
                    self.fs.pipe_file(path, canonical_json({"holder": holder, "expires": time.time() + ttl_s}))

        thread = threading.Thread(target=renew, name=f"tokenmill-lease-{kind}-{version}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            with contextlib.suppress(Exception):
                self.fs.rm_file(path)

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
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%f")
        dest = self._safe(f"{self.root}/{kind}/{QUARANTINE_DIR}/{version}-{stamp}")
        if self.local:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            os.rename(src, dest)
            fsync_dir(os.path.dirname(src))
        else:
            self._invalidate(src)
            self.fs.mv(src, dest, recursive=True)
            self._invalidate(src)
        _log.warning("quarantined %s/%s in %s: %s -> %s", kind, version, self.url, reason, dest)
        return dest

