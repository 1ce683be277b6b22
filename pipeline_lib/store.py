"""Versioned, write-once artifact store over any fsspec filesystem.

Layout: ``<root>/<kind>/<version>/`` holds a version's files and its ``manifest.json``.
The manifest is written last and is the commit point: a directory without one is not a
version, readers never see it, and `gc` removes it.

* Version ids are derived, never random: a hash of the parents' version ids, the stage
  parameters and the stage's code version. The same work lands in the same place, so a
  rerun finds it and skips it.
* Work in progress lives in a *staging* area. On a local disk that is
  ``<root>/<kind>/.staging/<version>/``, renamed into place in one `os.rename` once the
  manifest is in it (so a version appears whole or not at all). Object stores have no
  rename: files go straight to the version prefix as single PUTs and the manifest is
  PUT last, create-only where the store supports it.
* Staged units of work carry completion markers (``_done/<unit>.json``), so a stage
  killed half-way resumes where it stopped (datatrove's ``completions/``).
* A published version is never written again; a second writer of the same version finds
  it published and uses it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any, BinaryIO

from pipeline_lib.fsio import InputError, filesystem, is_local, write_bytes_atomic
from pipeline_lib.version import __version__

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "tokenmill.manifest/1"
DONE_DIR = "_done"
STAGING_DIR = ".staging"
MAX_MANIFEST_BYTES = 32 << 20
_NAME_RE = re.compile(r"^[A-Za-z0-9._-]+$")
_CHUNK = 8 << 20


class StoreError(RuntimeError):
    """The store's content is missing, corrupt or inconsistent; the message names the file."""


def check_name(name: str, what: str = "artifact name") -> str:
    """Accept `[A-Za-z0-9._-]+` names only (no `..`, no separators): path-safe anywhere."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or name in (".", "..") or ".." in name:
        raise InputError(f"invalid {what} {name!r}: use letters, digits, '.', '_' and '-' only, and no '..'")
    return name


def check_relpath(relpath: str) -> str:
    """A file path inside a version: '/'-separated safe names."""
    for part in relpath.split("/"):
        check_name(part, "file name")
    return relpath


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def version_id(kind: str, parents: Mapping[str, str], params: Mapping[str, Any], code_version: str) -> str:
    """Deterministic id of a version: the same inputs, parameters and code give the same id."""
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
    h, n = hashlib.sha256(), 0
    while chunk := f.read(_CHUNK):
        h.update(chunk)
        n += len(chunk)
    return FileInfo(n, h.hexdigest())


class Staging:
    """A version being written: put files, mark units done, then `ArtifactStore.publish`."""

    def __init__(self, store: ArtifactStore, kind: str, version: str):
        self.store, self.kind, self.version = store, kind, version
        self.fs = store.fs
        if store.local:
            self.path = f"{store.root}/{kind}/{STAGING_DIR}/{version}"
        else:
            self.path = f"{store.root}/{kind}/{version}"
        self.fs.makedirs(self.path, exist_ok=True)

    def _p(self, name: str) -> str:
        return f"{self.path}/{check_relpath(name)}"

    def put_bytes(self, name: str, data: bytes) -> FileInfo:
        write_bytes_atomic(self.fs, self._p(name), data)
        return FileInfo(len(data), hashlib.sha256(data).hexdigest())

    def put_file(self, name: str, local_path: str, move: bool = False) -> FileInfo:
        """Publish a finished local file into the staging area (rename when on the same disk)."""
        with open(local_path, "rb") as f:
            info = _hash_stream(f)
        dest = self._p(name)
        if self.store.local:
            self.fs.makedirs(os.path.dirname(dest), exist_ok=True)
            if move:
                try:
                    os.replace(local_path, dest)
                    return info
                except OSError:
                    pass
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dest), prefix=".tmp-", suffix=".part")
            os.close(fd)
            shutil.copyfile(local_path, tmp)
            os.replace(tmp, dest)
        else:
            self.fs.put_file(local_path, dest)
        return info

    @contextlib.contextmanager
    def open_write(self, name: str) -> Iterator[str]:
        """Yield a local temp path to write; on success it is published as `name`."""
        tmpdir = self.path if self.store.local else None
        fd, tmp = tempfile.mkstemp(dir=tmpdir, prefix=".tmp-", suffix=".part")
        os.close(fd)
        try:
            yield tmp
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            self.put_file(name, tmp, move=True)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def exists(self, name: str) -> bool:
        return self.fs.exists(self._p(name))

    def read_bytes(self, name: str) -> bytes:
        return self.fs.cat_file(self._p(name))

    def local_path(self, name: str) -> str:
        if not self.store.local:
            raise StoreError("local_path is only available on a local store")
        return self._p(name)

    def mark_done(self, unit: str, info: Mapping[str, Any]) -> None:
        self.put_bytes(f"{DONE_DIR}/{check_name(unit)}.json", canonical_json(info))

    def done(self, unit: str) -> dict[str, Any] | None:
        """The completion record of a unit, or None if it has not finished."""
        name = f"{DONE_DIR}/{check_name(unit)}.json"
        if not self.exists(name):
            return None
        try:
            return json.loads(self.read_bytes(name))
        except json.JSONDecodeError:
            return None


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
        self.fs.makedirs(self.root, exist_ok=True)

    def __repr__(self) -> str:
        return f"ArtifactStore({self.url!r})"

    # ---------------------------------------------------------------- paths
    def version_path(self, kind: str, version: str) -> str:
        return f"{self.root}/{check_name(kind, 'kind')}/{check_name(version, 'version')}"

    def uri(self, kind: str, version: str, name: str | None = None) -> str:
        path = self.version_path(kind, version)
        if name is not None:
            path = f"{path}/{check_relpath(name)}"
        return path if self.local else self.fs.unstrip_protocol(path)

    def file_path(self, kind: str, version: str, name: str) -> str:
        return f"{self.version_path(kind, version)}/{check_relpath(name)}"

    # ---------------------------------------------------------------- writing
    def stage(self, kind: str, version: str) -> Staging:
        check_name(kind, "kind")
        check_name(version, "version")
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
        """Write the manifest last and make the version visible; idempotent per version."""
        kind, version = staging.kind, staging.version
        if self.exists(kind, version):
            self._discard(staging)
            return self.ref(kind, version)
        manifest = {
            "format": MANIFEST_FORMAT,
            "kind": kind,
            "version": version,
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "tool_version": __version__,
            "code_version": code_version,
            "parents": {k: (v.key if isinstance(v, VersionRef) else v) for k, v in (parents or {}).items()},
            "params": dict(params or {}),
            "files": {name: asdict(info) for name, info in sorted(files.items())},
            "meta": dict(meta or {}),
        }
        data = json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False, default=str).encode()
        if self.local:
            write_bytes_atomic(self.fs, f"{staging.path}/{MANIFEST}", data)
            shutil.rmtree(f"{staging.path}/{DONE_DIR}", ignore_errors=True)
            final = self.version_path(kind, version)
            try:
                os.rename(staging.path, final)
            except OSError:
                if not self.exists(kind, version):
                    raise
                self._discard(staging)
        else:
            path = f"{staging.path}/{MANIFEST}"
            try:
                with self.fs.open(path, "xb") as f:
                    f.write(data)
            except FileExistsError:
                pass
            except (NotImplementedError, ValueError):
                if not self.fs.exists(path):
                    self.fs.pipe_file(path, data)
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(f"{staging.path}/{DONE_DIR}", recursive=True)
        return self.ref(kind, version)

    def _discard(self, staging: Staging) -> None:
        if self.local:
            shutil.rmtree(staging.path, ignore_errors=True)

    # ---------------------------------------------------------------- reading
    def exists(self, kind: str, version: str) -> bool:
        return self.fs.exists(f"{self.version_path(kind, version)}/{MANIFEST}")

    def manifest(self, kind: str, version: str) -> dict[str, Any]:
        path = f"{self.version_path(kind, version)}/{MANIFEST}"
        try:
            raw = self.fs.cat_file(path)
        except FileNotFoundError:
            raise StoreError(f"{kind}/{version} is not a published version in {self.url} (no {MANIFEST})") from None
        if len(raw) > MAX_MANIFEST_BYTES:
            raise StoreError(f"{path}: manifest larger than {MAX_MANIFEST_BYTES} bytes")
        try:
            manifest = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise StoreError(f"{path}: corrupt manifest ({e})") from e
        if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
            raise StoreError(f"{path}: not a tokenmill manifest")
        return manifest

    def ref(self, kind: str, version: str) -> VersionRef:
        raw = self.fs.cat_file(f"{self.version_path(kind, version)}/{MANIFEST}")
        return VersionRef(kind, version, self.uri(kind, version), hashlib.sha256(raw).hexdigest())

    def read_bytes(self, kind: str, version: str, name: str) -> bytes:
        try:
            return self.fs.cat_file(self.file_path(kind, version, name))
        except FileNotFoundError:
            raise StoreError(f"{kind}/{version}/{name}: missing from {self.url}") from None

    def open(self, kind: str, version: str, name: str, mode: str = "rb") -> BinaryIO:
        if "r" not in mode:
            raise StoreError("published versions are read-only")
        return self.fs.open(self.file_path(kind, version, name), mode)

    def local_dir(self, kind: str, version: str, cache_dir: str | None = None) -> str:
        """A local directory with the version's files (the version itself on a local store)."""
        if self.local:
            return self.version_path(kind, version)
        cache = cache_dir or os.path.join(tempfile.gettempdir(), "tokenmill-cache")
        dest = os.path.join(cache, kind, version)
        if not os.path.exists(os.path.join(dest, MANIFEST)):
            tmp = f"{dest}.{uuid.uuid4().hex}.part"
            os.makedirs(tmp, exist_ok=True)
            self.fs.get(self.version_path(kind, version) + "/", tmp + "/", recursive=True)
            try:
                os.rename(tmp, dest)
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
        return dest

    def verify(self, kind: str, version: str) -> dict[str, Any]:
        """Re-hash every file against the manifest; raise `StoreError` naming the first bad one."""
        manifest = self.manifest(kind, version)
        for name, info in manifest["files"].items():
            path = self.file_path(kind, version, name)
            try:
                with self.fs.open(path, "rb") as f:
                    got = _hash_stream(f)
            except FileNotFoundError:
                raise StoreError(f"{kind}/{version}/{name}: listed in the manifest but missing") from None
            if got.size != info["size"]:
                raise StoreError(f"{kind}/{version}/{name}: {got.size} bytes, manifest says {info['size']}: truncated or altered")
            if got.sha256 != info["sha256"]:
                raise StoreError(f"{kind}/{version}/{name}: sha256 mismatch: the file is corrupt or was altered")
        return manifest

    # ---------------------------------------------------------------- listing
    def kinds(self) -> list[str]:
        try:
            entries = self.fs.ls(self.root, detail=True)
        except FileNotFoundError:
            return []
        return sorted(os.path.basename(e["name"].rstrip("/")) for e in entries if e["type"] == "directory" and not os.path.basename(e["name"].rstrip("/")).startswith("."))

    def _version_dirs(self, kind: str) -> list[str]:
        try:
            entries = self.fs.ls(f"{self.root}/{check_name(kind, 'kind')}", detail=True)
        except FileNotFoundError:
            return []
        return [os.path.basename(e["name"].rstrip("/")) for e in entries if e["type"] == "directory" and not os.path.basename(e["name"].rstrip("/")).startswith(".")]

    def list(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Manifests of the published versions, newest first."""
        out = []
        for k in [kind] if kind else self.kinds():
            for v in self._version_dirs(k):
                if self.exists(k, v):
                    try:
                        out.append(self.manifest(k, v))
                    except StoreError:
                        continue
        return sorted(out, key=lambda m: (m["created"], m["kind"], m["version"]), reverse=True)

    def latest(self, kind: str, **params: Any) -> dict[str, Any] | None:
        """The newest version of `kind` whose parameters include `params`."""
        for m in self.list(kind):
            if all(m["params"].get(k) == v for k, v in params.items()):
                return m
        return None

    def find(self, version_prefix: str) -> tuple[str, str]:
        """Resolve `kind/version`, a version id or a unique prefix of one."""
        if "/" in version_prefix:
            kind, version = version_prefix.split("/", 1)
            return kind, version
        hits = [(m["kind"], m["version"]) for m in self.list() if m["version"].startswith(version_prefix)]
        if len(hits) != 1:
            raise InputError(f"{version_prefix!r} matches {len(hits)} versions in {self.url}; give kind/version")
        return hits[0]

    def gc(self, dry_run: bool = False) -> list[str]:
        """Remove what no reader can see: staging areas and version dirs without a manifest."""
        removed = []
        for k in self.kinds():
            staging_root = f"{self.root}/{k}/{STAGING_DIR}"
            if self.fs.exists(staging_root):
                removed.extend(e for e in self.fs.ls(staging_root, detail=False))
            for v in self._version_dirs(k):
                if not self.exists(k, v):
                    removed.append(self.version_path(k, v))
        if not dry_run:
            for path in removed:
                self.fs.rm(path, recursive=True)
        return removed


def open_store(url: str | ArtifactStore, **storage_options: Any) -> ArtifactStore:
    return url if isinstance(url, ArtifactStore) else ArtifactStore(url, **storage_options)
