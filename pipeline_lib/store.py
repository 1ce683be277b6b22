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
each step is done on the storage is one of two backends, chosen once per store:

`LocalBackend`: local disk (``file://`` or a plain path)
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

`ObjectBackend`: object stores (``s3://``, ``gs://``, ``memory://`` ...)
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
import re
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any, BinaryIO

from pipeline_lib.errors import StoreError  # re-exported
from pipeline_lib.fsio import (
    InputError,
    _umask,
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
from pipeline_lib.store_backend import StorageBackend
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
# Proof of authorship for gc: every directory the store makes in a staging area (the
# staging root itself, each version's staging area, work and temp dirs) gets this file
# before it gets its final name, and an object store writes PUBLISHING_MARKER under a
# version prefix before copying files there. gc removes only what carries one.
STAGING_MARKER = ".tokenmill-staging"
PUBLISHING_MARKER = ".tokenmill-publishing"
MARKER_FORMAT = "tokenmill.staging/1"
NEW_DIR_PREFIX = ".new-"
MAX_MANIFEST_BYTES = 32 << 20
MAX_NAME_LEN = 200
MAX_PATH_DEPTH = 8
_NAME_RE = re.compile(r"[A-Za-z0-9._-]+")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_VERSION_ID_RE = re.compile(r"[0-9a-f]{20}")  # what `version_id` makes
_MARKER_BYTES = json.dumps({"format": MARKER_FORMAT}, sort_keys=True).encode()
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
        raise InputError(f"invalid {what} {shown!r}: use 1-{MAX_NAME_LEN} letters, digits, '.', '_' and '-', not starting with '.' and without '..'")
    return name


_BUCKET_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "r2"})


def check_store_url(url: str, durable: bool = False) -> str:
    """Refuse a store URL that cannot be one, with a line saying what is wrong with it:
    a chained URL (``simplecache::s3://...``, ``dir::/tmp``: their layering would put the
    store somewhere else than it says), an object-store URL without a bucket, an unknown
    protocol; with `durable` (a command whose results must outlive it) also ``memory://``."""
    if not isinstance(url, str) or not url.strip():
        raise InputError(f"--store {url!r}: give a directory or a URL such as s3://bucket/prefix")
    if "::" in url:
        raise InputError(
            f"--store {url}: chained URLs ({url.split('::', 1)[0]}::...) are not supported for a store: give a directory or a plain URL such as s3://bucket/prefix"
        )
    if "://" in url:
        protocol, rest = url.split("://", 1)
        protocol = protocol.lower()
        import fsspec

        if protocol not in fsspec.available_protocols():
            raise InputError(f"--store {url}: unknown protocol {protocol!r}: give a directory or a URL such as s3://bucket/prefix")
        if protocol in _BUCKET_PROTOCOLS and not rest.split("/", 1)[0].strip():
            raise InputError(f"--store {url}: no bucket: give {protocol}://BUCKET or {protocol}://BUCKET/PREFIX")
        if durable and protocol == "memory":
            raise InputError(f"--store {url}: an in-memory store vanishes with everything in it when the command ends: give a directory or a durable URL")
    return url


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


def _backend() -> dict[str, Any]:
    from pipeline_lib.tokenizer import backend_info  # lazy: nothing else in the store needs it

    return dict(backend_info())


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
            raise StoreError(f"{path}: corrupt store marker (not JSON): restore it, or choose another --store") from None
        fmt = marker.get("format") if isinstance(marker, dict) else None
        if not isinstance(fmt, str) or not fmt.startswith("tokenmill.store/"):
            raise StoreError(f"{path}: not a tokenmill store marker (format {fmt!r})")
        if fmt != STORE_FORMAT:
            raise StoreError(f"{self.url} is a store of format {fmt!r}; this tokenmill reads {STORE_FORMAT!r}: upgrade tokenmill")
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
                    f"{self.url} is not empty and is not a tokenmill store (it has no {STORE_MARKER}): choose a new or empty directory for --store"
                )
        self._owned = True

    def _write_marker(self) -> None:
        marker = canonical_json({"format": STORE_FORMAT, "created": dt.datetime.now(dt.UTC).isoformat(), "tool_version": __version__})
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
                raise StoreError(f"cannot publish {staging.kind}/{staging.version}: {name} is not in the staging area") from None
            if size != info["size"]:
                raise StoreError(f"cannot publish {staging.kind}/{staging.version}: {name} has {size:,} bytes, the file list says {info['size']:,}")

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
                with self._backend.open_read(path) as f:
                    got = _hash_stream(f)
            else:
                got = FileInfo(self._backend.size(path), info["sha256"])
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
        return self._backend.local_dir(kind, version, manifest, manifest_raw, cache_dir, verify)

    def local_file(self, kind: str, version: str, name: str, cache_dir: str | None = None) -> str:
        """A local path to one file of a version: the file itself on a local store, else a
        hash-checked download of that file alone (a worker reading one shard fetches one shard)."""
        manifest = self.manifest(kind, version)
        info = manifest["files"].get(name)
        if info is None:
            raise StoreError(f"{kind}/{version} has no file {name!r}")
        return self._backend.local_file(kind, version, name, info, cache_dir)

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
        self, kind: str, version: str, with_dependents: bool = False, dry_run: bool = False, with_unused_parents: bool = False
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
            raise InputError(f"{kind}/{version}: {len(dependents)} version(s) depend on it ({shown}): add --with-dependents to remove them too")
        order = [*dependents, f"{kind}/{version}"]
        if with_unused_parents:
            order += self._unused_ancestors(order)
        if dry_run:
            return order
        self.ensure_store()
        for key in order:
            k, v = key.split("/", 1)
            self._backend.remove_version(k, v)
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
            kind, version = version_prefix.split("/", 1)
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
            (os.path.basename(os.path.dirname(os.path.dirname(p))), os.path.basename(p)[: -len(CLAIM_SUFFIX)]) for p in found.held if p.endswith(CLAIM_SUFFIX)
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
        return any(is_dir and self._backend.exists(f"{p}/{MANIFEST}") for n, p, is_dir in self._backend.entries(base) if not n.startswith("."))

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
        shutil.rmtree(self._backend.work_path(check_name(kind, "kind"), check_name(version, "version")), ignore_errors=True)

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


def _check_local(path: str, label: str, info: Mapping[str, Any], full: bool) -> None:
    """A local copy of a published file against its manifest entry (full: size and sha256,
    hashed once per process while unchanged; else the size only)."""
    if full:
        check_local_file(path, info["size"], info["sha256"], label)
        return
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        raise StoreError(f"{label}: missing") from None
    if size != info["size"]:
        raise StoreError(f"{label}: {size:,} bytes, manifest says {info['size']:,}: truncated or altered")


def _local_age(path: str) -> float:
    """Seconds since anything under the local `path` last changed (inf if nothing is there)."""
    newest = 0.0
    for dirpath, _, filenames in os.walk(path):
        with contextlib.suppress(OSError):
            newest = max(newest, os.lstat(dirpath).st_mtime)
        for f in filenames:
            with contextlib.suppress(OSError):
                newest = max(newest, os.lstat(os.path.join(dirpath, f)).st_mtime)
    with contextlib.suppress(OSError):
        newest = max(newest, os.lstat(path).st_mtime)
    return time.time() - newest if newest else float("inf")


def _remove_local(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)  # (rmtree unlinks symlinks inside, never follows them)
    else:
        os.unlink(path)


def _has_local_marker(directory: str, name: str = STAGING_MARKER) -> bool:
    """Whether a local directory (not a link) holds one of the store's markers (a regular file)."""
    try:
        if not stat.S_ISDIR(os.lstat(directory).st_mode):
            return False
        st = os.lstat(os.path.join(directory, name))
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_size > 4096:
        return False
    try:
        with open(os.path.join(directory, name), "rb") as f:
            return json.loads(f.read(4096)).get("format") == MARKER_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _make_marked_dir(path: str) -> None:
    """Create the local directory `path` with the staging marker already in it: it is made
    under a temporary name (``.new-*``, itself marked), then renamed, so no directory of
    this name exists without the proof that the store wrote it."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=NEW_DIR_PREFIX)
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0700 would hide published versions from the user's group
        with open(os.path.join(tmp, STAGING_MARKER), "wb") as f:
            f.write(_MARKER_BYTES)
        try:
            os.rename(tmp, path)
        except OSError:
            if not os.path.isdir(path):  # not a concurrent creator's directory: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class LocalBackend(StorageBackend):
    """Local disk (``file://`` or a plain path).

    Staging in ``<kind>/.staging/<version>/``, temp files in ``<kind>/.staging/.tmp/`` (the
    same disk, so a finished file is committed by a rename). Puts hold a shared `flock` on
    ``.staging/.lock``, `publish` an exclusive one; publish makes the files read-only
    (0444), writes the manifest and renames the directory into place in one `os.rename`.
    Claims are `flock`ed files; work and scratch dirs live in the staging area. Every
    path must resolve under the store root (`safe`).
    """

    local = True

    def __init__(self, store: ArtifactStore, root: str):
        self.store, self.fs = store, store.fs
        self.root = os.path.abspath(root)
        self._real_root = os.path.realpath(self.root)

    # ---------------------------------------------------------------- paths
    def safe(self, path: str) -> str:
        real = os.path.realpath(path)
        if real != self._real_root and not real.startswith(self._real_root.rstrip("/") + "/"):
            raise InputError(f"{path} resolves to {real}, outside the store root {self._real_root}")
        return path

    def invalidate(self, path: str) -> None:
        """Nothing to forget: local listings are never cached."""

    def uri(self, path: str) -> str:
        return path

    def staging_paths(self, kind: str, version: str) -> tuple[str, str | None]:
        staging_root = f"{self.root}/{kind}/{STAGING_DIR}"
        return self.safe(f"{staging_root}/{version}"), self.safe(f"{staging_root}/{TMP_DIR}")

    def make_staging_dirs(self, staging: Staging) -> None:
        """Create the staging and temp directories on first write (reads never create them),
        each marked as the store's before it gets its name."""
        if os.path.isdir(staging.path) and (staging.tmp_dir is None or os.path.isdir(staging.tmp_dir)):
            return
        _make_marked_dir(os.path.dirname(staging.path))
        _make_marked_dir(staging.path)
        if staging.tmp_dir is not None:  # always set here: staging_paths above names one
            _make_marked_dir(staging.tmp_dir)

    def make_dir(self, path: str) -> None:
        """A work or scratch directory in a staging area: the area and it marked as the store's."""
        _make_marked_dir(os.path.dirname(path))
        _make_marked_dir(path)

    def scratch_path(self, kind: str) -> str:
        return self.safe(f"{self.root}/{kind}/{STAGING_DIR}/{TMP_DIR}")

    def work_path(self, kind: str, version: str) -> str:
        return self.safe(f"{self.root}/{kind}/{STAGING_DIR}/{version}{WORK_SUFFIX}")

    # ---------------------------------------------------------------- identity
    def root_is_empty(self) -> bool:
        """No entries but the temp files of a concurrent creator's marker (``.tmp-*``)."""
        try:
            return all(name.startswith(".tmp-") for name in os.listdir(self.root))
        except FileNotFoundError:
            return True
        except NotADirectoryError:
            raise StoreError(f"{self.store.url} is a file, not a directory: choose another --store") from None

    def write_marker(self, path: str, marker: bytes) -> None:
        os.makedirs(self.root, exist_ok=True)
        write_bytes_atomic(self.fs, path, marker)  # two creators write equivalent markers

    # ---------------------------------------------------------------- writing
    @contextlib.contextmanager
    def lock(self, kind: str, exclusive: bool, create: bool = True) -> Iterator[None]:
        """Puts share it, `publish` holds it alone: no put lands in a published version.
        With `create` False (readers) nothing is created and a missing lock is no wait."""
        if fcntl is None:
            yield
            return
        directory = self.safe(f"{self.root}/{check_name(kind, 'kind')}/{STAGING_DIR}")
        if not create:
            # A reader waiting for a publish in progress: a missing or unopenable lock
            # (a read-only store) means nobody can be publishing here.
            try:
                fd = os.open(f"{directory}/{LOCK_FILE}", os.O_RDONLY)
            except OSError:
                yield
                return
        else:
            _make_marked_dir(directory)
            fd = os.open(f"{directory}/{LOCK_FILE}", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # closing releases the lock; so does the process dying

    def _commit(self, staging: Staging, tmp: str, dest: str) -> None:
        """Move a finished, fsynced temp file to `dest` unless the version is published."""
        with self.lock(staging.kind, exclusive=False):
            if staging.published():
                return  # the version is out: never write into it (tmp is removed by the caller)
            directory = os.path.dirname(dest)
            os.makedirs(directory, exist_ok=True)
            os.replace(tmp, dest)
            fsync_dir(directory)

    def put_bytes(self, staging: Staging, dest: str, data: bytes) -> None:
        self.make_staging_dirs(staging)
        fd, tmp = tempfile.mkstemp(dir=staging.tmp_dir, prefix=".tmp-", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            self._commit(staging, tmp, dest)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def put_file(self, staging: Staging, dest: str, local_path: str, move: bool) -> FileInfo:
        self.make_staging_dirs(staging)
        if move:
            with open(local_path, "rb") as f:
                info = _hash_stream(f)
            fsync_file(local_path)
            try:
                self._commit(staging, local_path, dest)
                if os.path.exists(local_path):  # published meanwhile: the move was skipped
                    os.unlink(local_path)
                return info
            except OSError:
                pass  # another device: copy below
        fd, tmp = tempfile.mkstemp(dir=staging.tmp_dir, prefix=".tmp-", suffix=".part")
        os.close(fd)
        try:
            info = _copy_hashed(local_path, tmp)
            self._commit(staging, tmp, dest)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if move:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(local_path)
        return info

    def staged_local_dir(self, staging: Staging, names: list[str], directory: str) -> str:
        """The staging area itself: its files are already local."""
        for name in names:
            if not os.path.isfile(f"{staging.path}/{name}"):
                raise StoreError(f"{staging.kind}/{staging.version} (staging): {name} is missing")
        return staging.path

    def publish(self, staging: Staging, file_map: Mapping[str, Any], data: bytes) -> None:
        """Under the exclusive lock: drop what is not listed, chmod 0444, write the
        manifest, rename the staging directory to ``<kind>/<version>``."""
        kind, version = staging.kind, staging.version
        with self.lock(kind, exclusive=True):
            if self.store.exists(kind, version):
                self.discard(staging)
                return
            self.make_staging_dirs(staging)
            self.store._check_staged(staging, file_map)  # (a staging area removed by gc fails here)
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
            final = self.store.version_path(kind, version)
            if os.path.lexists(final):  # a directory without a manifest: an orphan, not a version
                if not _has_local_marker(final):
                    raise StoreError(f"cannot publish {kind}/{version}: {final} is in the way and was not written by the store: move it elsewhere")
                trash = f"{self.root}/{kind}/{STAGING_DIR}/{TMP_DIR}/trash-{uuid.uuid4().hex}"
                os.rename(final, trash)
                shutil.rmtree(trash, ignore_errors=True)
            os.rename(staging.path, final)
            fsync_dir(os.path.dirname(final))

    def discard(self, staging: Staging) -> None:
        shutil.rmtree(staging.path, ignore_errors=True)

    # ---------------------------------------------------------------- reading
    def exists(self, manifest_path: str) -> bool:
        return os.path.isfile(manifest_path)

    def size(self, path: str) -> int:
        return os.path.getsize(path)

    def open_read(self, path: str) -> BinaryIO:
        return open(path, "rb")

    def check_in_place(self, kind: str, version: str, manifest: Mapping[str, Any]) -> None:
        """For `usable`: every file against the manifest (hashed once per process while unchanged)."""
        for name, info in manifest["files"].items():
            _check_local(self.store.file_path(kind, version, name), f"{kind}/{version}/{name}", info, full=True)

    def local_dir(self, kind: str, version: str, manifest: Mapping[str, Any], manifest_raw: bytes, cache_dir: str | None, verify: str) -> str:
        """The version directory itself, checked in place."""
        if verify != "none":
            for name, info in manifest["files"].items():
                _check_local(self.store.file_path(kind, version, name), f"{kind}/{version}/{name}", info, verify == "full")
        return self.store.version_path(kind, version)

    def local_file(self, kind: str, version: str, name: str, info: Mapping[str, Any], cache_dir: str | None) -> str:
        """The published file itself, checked in place."""
        path = self.store.file_path(kind, version, name)
        _check_local(path, f"{kind}/{version}/{name}", info, full=True)
        return path

    # ---------------------------------------------------------------- claims, gc, quarantine
    @contextlib.contextmanager
    def claim(self, kind: str, version: str, poll_s: float, ttl_s: float) -> Iterator[None]:
        """An `flock`ed ``<kind>/.staging/<version>.claim``: the kernel releases it when
        its holder dies, so it needs no lease (`poll_s` and `ttl_s` are unused)."""
        directory = self.safe(f"{self.root}/{kind}/{STAGING_DIR}")
        _make_marked_dir(directory)
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

    def claim_held(self, path: str) -> bool:
        """Whether a staging entry is a claim a live process holds (gc keeps those)."""
        return path.rstrip("/").endswith(CLAIM_SUFFIX) and _held(path)

    def remove_version(self, kind: str, version: str) -> None:
        """Take a published version away whole (one rename out of sight), then delete it."""
        final = self.store.version_path(kind, version)
        trash_dir = self.scratch_path(kind)
        self.make_dir(trash_dir)
        trash = f"{trash_dir}/trash-{uuid.uuid4().hex}"
        with self.lock(kind, exclusive=True):
            os.rename(final, trash)
            fsync_dir(os.path.dirname(final))
        shutil.rmtree(trash, ignore_errors=True)

    def entries(self, path: str) -> list[tuple[str, str, bool]]:
        """(name, path, is a directory) of each entry of a local directory, links not
        followed: a symlink or anything that resolves outside the store is reported as a
        file, which `survey` never takes for the store's own directory."""
        try:
            listing = list(os.scandir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []
        out = []
        for e in listing:
            is_dir = e.is_dir(follow_symlinks=False)
            if e.is_symlink() or not self.inside(e.path):
                is_dir = False
            out.append((e.name, f"{path}/{e.name}", is_dir))
        return sorted(out)

    def inside(self, path: str) -> bool:
        """Whether `path` is no link and resolves under the store root."""
        if os.path.islink(path):
            return False
        real = os.path.realpath(path)
        return real.startswith(self._real_root.rstrip("/") + "/")

    def is_link(self, path: str) -> bool:
        return os.path.islink(path)

    def has_marker(self, directory: str, name: str = STAGING_MARKER) -> bool:
        return self.inside(directory) and _has_local_marker(directory, name)

    def local_work_entries(self) -> list[str]:
        """Work areas outside the store: none, they are all in its staging areas."""
        return []

    def age(self, path: str) -> float:
        return _local_age(path)

    def remove(self, path: str) -> None:
        _remove_local(path)

    def move_aside(self, src: str, dest: str) -> None:
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        os.rename(src, dest)
        fsync_dir(os.path.dirname(src))


class ObjectBackend(StorageBackend):
    """Object stores (``s3://``, ``gs://``, ``memory://`` ...): no rename, no locks.

    Each put is one PUT into ``<kind>/.staging/<version>/`` (multipart uploads complete
    atomically), skipped once the version's manifest exists. `publish` copies the staged
    files server-side under the version prefix, then PUTs the manifest create-only (s3fs
    mode ``"xb"`` -> ``IfNoneMatch: *``): of two concurrent publishers exactly one manifest
    wins and the other adopts it. Reads download into a local cache, hashing as they go.
    Claims are lease objects; work and scratch dirs are in a local area keyed by the
    store's URL (`area`). s3fs caches listings, so every existence check forgets them first.
    """

    local = False

    def __init__(self, store: ArtifactStore, root: str):
        self.store, self.fs, self.root = store, store.fs, root
        self._marked: set[str] = set()  # prefixes whose staging marker this process has PUT

    # ---------------------------------------------------------------- paths
    def safe(self, path: str) -> str:
        """Object keys cannot escape the root through links: names alone are checked."""
        return path

    def invalidate(self, path: str) -> None:
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(path)

    def uri(self, path: str) -> str:
        return self.fs.unstrip_protocol(path)

    def staging_paths(self, kind: str, version: str) -> tuple[str, str | None]:
        return f"{self.root}/{kind}/{STAGING_DIR}/{version}", None  # temp files: the system's temp dir

    def make_staging_dirs(self, staging: Staging) -> None:
        """No directories to make: the staging root's and the staging area's markers are
        PUT before their first file (once per process)."""
        self._mark(f"{self.root}/{staging.kind}/{STAGING_DIR}")
        self._mark(staging.path)

    def _mark(self, prefix: str) -> None:
        if prefix not in self._marked:
            self.fs.pipe_file(f"{prefix}/{STAGING_MARKER}", _MARKER_BYTES)
            self._marked.add(prefix)

    def has_marker(self, prefix: str, name: str = STAGING_MARKER) -> bool:
        path = f"{prefix}/{name}"
        self.invalidate(path)
        try:
            raw = self.fs.cat_file(path)
        except (FileNotFoundError, IsADirectoryError, OSError):
            return False
        try:
            return len(raw) <= 4096 and json.loads(raw).get("format") == MARKER_FORMAT
        except (ValueError, AttributeError):
            return False

    def make_dir(self, path: str) -> None:
        """A work or scratch directory in this store's local area."""
        os.makedirs(path, exist_ok=True)

    def area(self) -> str:
        """Local disk space of this store (work dirs, temp files), one per store URL."""
        digest = hashlib.sha256(f"{protocol_of(self.fs)}://{self.root}".encode()).hexdigest()[:16]
        return os.path.join(tempfile.gettempdir(), "tokenmill-stores", digest)

    def scratch_path(self, kind: str) -> str:
        return os.path.join(self.area(), kind, TMP_DIR)

    def work_path(self, kind: str, version: str) -> str:
        return os.path.join(self.area(), kind, f"{version}{WORK_SUFFIX}")

    # ---------------------------------------------------------------- identity
    def root_is_empty(self) -> bool:
        self.invalidate(self.root)
        try:
            return not self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return True

    def write_marker(self, path: str, marker: bytes) -> None:
        with contextlib.suppress(FileExistsError):
            self.fs.makedirs(self.root, exist_ok=True)
        write_bytes_create_only(self.fs, path, marker)  # a concurrent creator's marker stands

    # ---------------------------------------------------------------- writing
    @contextlib.contextmanager
    def lock(self, kind: str, exclusive: bool, create: bool = True) -> Iterator[None]:
        """No lock: the create-only manifest PUT alone decides who publishes."""
        yield

    def put_bytes(self, staging: Staging, dest: str, data: bytes) -> None:
        if not staging.published():
            self.make_staging_dirs(staging)
            self.fs.pipe_file(dest, data)

    def put_file(self, staging: Staging, dest: str, local_path: str, move: bool) -> FileInfo:
        with open(local_path, "rb") as f:
            info = _hash_stream(f)
        if not staging.published():
            self.make_staging_dirs(staging)
            self.fs.put_file(local_path, dest)
        if move:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(local_path)
        return info

    def staged_local_dir(self, staging: Staging, names: list[str], directory: str) -> str:
        """Download the staged files into `directory`."""
        for name in names:
            target = os.path.join(directory, *name.split("/"))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            try:
                with self.fs.open(f"{staging.path}/{name}", "rb") as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst, _CHUNK)
            except FileNotFoundError:
                raise StoreError(f"{staging.kind}/{staging.version} (staging): {name} is missing") from None
        return directory

    def publish(self, staging: Staging, file_map: Mapping[str, Any], data: bytes) -> None:
        """Copy the staged files under the version's prefix (server-side copies), then PUT
        the manifest create-only. Until the manifest lands, the version prefix holds only
        whole files of the same bytes any writer of this version would copy; a publisher
        killed between the copies and the manifest leaves a manifest-less prefix that
        readers ignore and `gc` collects."""
        kind, version = staging.kind, staging.version
        self.invalidate(staging.path)
        try:
            self.store._check_staged(staging, file_map)
        except StoreError:
            if self.store.exists(kind, version):  # a concurrent writer of this version published it and took the staging area
                return
            raise
        final = self.store.version_path(kind, version)
        if not self.store.exists(kind, version):
            self.fs.pipe_file(f"{final}/{PUBLISHING_MARKER}", _MARKER_BYTES)  # gc's proof that the store wrote this prefix
        for name in file_map:
            if self.store.exists(kind, version):  # a concurrent writer published: adopt its version
                break
            try:
                self.fs.copy(f"{staging.path}/{name}", f"{final}/{name}")
            except FileNotFoundError:  # the shared staging area went away under us
                if self.store.exists(kind, version):  # ... taken by a concurrent writer that published
                    return
                raise StoreError(f"cannot publish {kind}/{version}: {name} vanished from the staging area (was `tokenmill gc` run meanwhile?); rerun") from None
        created = write_bytes_create_only(self.fs, f"{final}/{MANIFEST}", data)
        if not created:  # a concurrent writer published first: its manifest stands
            self.invalidate(final)
        elif not self.store.exists(kind, version):
            raise StoreError(f"{kind}/{version}: the manifest was written but cannot be read back")
        with contextlib.suppress(FileNotFoundError, OSError):
            self.fs.rm_file(f"{final}/{PUBLISHING_MARKER}")
        self.discard(staging)

    def discard(self, staging: Staging) -> None:
        with contextlib.suppress(FileNotFoundError, OSError):
            self.fs.rm(staging.path, recursive=True)
        self.invalidate(staging.path)

    # ---------------------------------------------------------------- reading
    def exists(self, manifest_path: str) -> bool:
        self.invalidate(manifest_path)
        return self.fs.exists(manifest_path)

    def size(self, path: str) -> int:
        return self.fs.info(path)["size"]

    def open_read(self, path: str) -> BinaryIO:
        return self.fs.open(path, "rb")

    def check_in_place(self, kind: str, version: str, manifest: Mapping[str, Any]) -> None:
        """For `usable`: the manifest alone (reads verify each file they download)."""

    def _download(self, kind: str, version: str, name: str, info: Mapping[str, Any], target: str) -> None:
        """One published file into the local `target`, hashed on the way, checked against `info`."""
        try:
            with self.fs.open(self.store.file_path(kind, version, name), "rb") as src, open(target, "wb") as dst:
                n, digest = hash_stream(src, dst)
        except FileNotFoundError:
            raise StoreError(f"{kind}/{version}/{name}: listed in the manifest but missing from {self.store.url}") from None
        if n != info["size"] or digest != info["sha256"]:
            raise StoreError(f"{kind}/{version}/{name}: downloaded {n:,} bytes that do not match the manifest's size/sha256: corrupt or altered")

    @staticmethod
    def _cache_current(dest: str, manifest_raw: bytes) -> bool:
        try:
            with open(os.path.join(dest, MANIFEST), "rb") as f:
                return f.read() == manifest_raw
        except OSError:
            return False

    def local_dir(self, kind: str, version: str, manifest: Mapping[str, Any], manifest_raw: bytes, cache_dir: str | None, verify: str) -> str:
        """A hash-checked download into ``<cache>/<kind>/<version>`` (with the manifest),
        reused while its manifest is the store's and its files still match."""
        cache = cache_dir or os.path.join(tempfile.gettempdir(), "tokenmill-cache")
        dest = os.path.join(cache, kind, version)
        if self._cache_current(dest, manifest_raw):
            try:
                if verify != "none":
                    for name, info in manifest["files"].items():
                        _check_local(os.path.join(dest, *name.split("/")), f"{kind}/{version}/{name} (cached)", info, verify == "full")
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
                self._download(kind, version, name, info, target)
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

    def local_file(self, kind: str, version: str, name: str, info: Mapping[str, Any], cache_dir: str | None) -> str:
        """A hash-checked download of that file alone (a worker reading one shard fetches one
        shard), cached under the file's sha256."""
        cache = cache_dir or os.path.join(tempfile.gettempdir(), "tokenmill-cache")
        dest = os.path.join(cache, kind, f"{version}.files", info["sha256"][:16], *check_relpath(name).split("/"))
        if os.path.exists(dest):
            with contextlib.suppress(StoreError):
                _check_local(dest, f"{kind}/{version}/{name} (cached)", info, full=True)
                return dest
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        tmp = f"{dest}.{uuid.uuid4().hex}.part"
        try:
            self._download(kind, version, name, info, tmp)
            os.replace(tmp, dest)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return dest

    # ---------------------------------------------------------------- claims, gc, quarantine
    @contextlib.contextmanager
    def claim(self, kind: str, version: str, poll_s: float, ttl_s: float) -> Iterator[None]:
        """A lease object ``<kind>/.staging/<version>.claim`` created create-only, renewed
        every `ttl_s / 3` s by a background thread; an expired one (its holder died) is
        taken over."""
        import threading

        self._mark(f"{self.root}/{kind}/{STAGING_DIR}")
        path = f"{self.root}/{kind}/{STAGING_DIR}/{version}{CLAIM_SUFFIX}"
        holder = uuid.uuid4().hex
        while True:
            body = canonical_json({"holder": holder, "expires": time.time() + ttl_s})
            if write_bytes_create_only(self.fs, path, body):
                break
            try:
                self.invalidate(path)
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

    def claim_held(self, path: str) -> bool:
        """Whether a lease object is live: unexpired (its holder renews it every `ttl_s / 3`
        s). An unreadable lease counts as abandoned, as `claim` treats it."""
        if not path.rstrip("/").endswith(CLAIM_SUFFIX):
            return False
        self.invalidate(path)
        try:
            lease = json.loads(self.fs.cat_file(path))
            return float(lease["expires"]) >= time.time()
        except (FileNotFoundError, OSError, ValueError, KeyError, TypeError):
            return False

    def remove_version(self, kind: str, version: str) -> None:
        """The manifest first (the version is gone for every reader), then its files."""
        final = self.store.version_path(kind, version)
        self.fs.rm_file(f"{final}/{MANIFEST}")
        self.invalidate(final)
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(final, recursive=True)
        self.invalidate(final)

    def entries(self, path: str) -> list[tuple[str, str, bool]]:
        """(name, path, is a directory) of each entry under a prefix."""
        self.invalidate(path)
        try:
            listing = self.fs.ls(path, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        out = []
        for e in listing:
            full = e["name"].rstrip("/")
            name = full.rsplit("/", 1)[-1]
            if full == path.rstrip("/").lstrip("/") or full == path.rstrip("/"):
                continue
            out.append((name, f"{path}/{name}", e.get("type") == "directory"))
        return sorted(out)

    def inside(self, path: str) -> bool:
        """Object keys cannot be links."""
        return True

    def is_link(self, path: str) -> bool:
        return False

    def local_work_entries(self) -> list[str]:
        """The work and scratch dirs of this store in its local area."""
        area = self.area()
        if not os.path.isdir(area):
            return []
        return [os.path.join(area, k, e) for k in os.listdir(area) for e in os.listdir(os.path.join(area, k))]

    def _in_area(self, path: str) -> bool:
        return path.startswith(self.area().rstrip(os.sep) + os.sep)

    def age(self, path: str) -> float:
        if self._in_area(path):
            return _local_age(path)
        newest = 0.0
        for info in self.fs.find(path, detail=True).values():
            stamp = info.get("LastModified") or info.get("mtime") or info.get("created") or info.get("updated")
            if isinstance(stamp, dt.datetime):
                newest = max(newest, stamp.timestamp())
            elif isinstance(stamp, (int, float)):
                newest = max(newest, float(stamp))
        return time.time() - newest if newest else float("inf")

    def remove(self, path: str) -> None:
        if self._in_area(path):
            _remove_local(path)
        else:
            self.fs.rm(path, recursive=True)

    def move_aside(self, src: str, dest: str) -> None:
        self.invalidate(src)
        self.fs.mv(src, dest, recursive=True)
        self.invalidate(src)
