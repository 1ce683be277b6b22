"""`ObjectBackend`: the store's protocol on object stores (create-only PUTs, lease objects,
hash-checked downloads into a local cache).

See `pipeline_lib.store` for the protocol and why each step is done this way.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, BinaryIO

from pipeline_lib.errors import StoreError
from pipeline_lib.fsio import hash_stream, protocol_of, write_bytes_create_only
from pipeline_lib.store_backend import StorageBackend
from pipeline_lib.store_layout import (
    _CHUNK,
    _MARKER_BYTES,
    CLAIM_SUFFIX,
    MANIFEST,
    MARKER_FORMAT,
    PUBLISHING_MARKER,
    STAGING_DIR,
    STAGING_MARKER,
    TMP_DIR,
    WORK_SUFFIX,
    FileInfo,
    _hash_stream,
    canonical_json,
    check_relpath,
)
from pipeline_lib.store_local import _check_local, _local_age, _remove_local

if TYPE_CHECKING:  # annotations only: store.py imports this module
    from pipeline_lib.store import ArtifactStore, Staging

_log = logging.getLogger("tokenmill.store")


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
            # a concurrent writer of this version published it and took the staging area
            if self.store.exists(kind, version):
                return
            raise
        final = self.store.version_path(kind, version)
        if not self.store.exists(kind, version):
            # gc's proof that the store wrote this prefix
            self.fs.pipe_file(f"{final}/{PUBLISHING_MARKER}", _MARKER_BYTES)
        for name in file_map:
            if self.store.exists(kind, version):  # a concurrent writer published: adopt its version
                break
            try:
                self.fs.copy(f"{staging.path}/{name}", f"{final}/{name}")
            except FileNotFoundError:  # the shared staging area went away under us
                if self.store.exists(kind, version):  # ... taken by a concurrent writer that published
                    return
                raise StoreError(
                    f"cannot publish {kind}/{version}: {name} vanished from the staging area (was "
                    "`tokenmill gc` run meanwhile?); rerun"
                ) from None
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
            raise StoreError(
                f"{kind}/{version}/{name}: listed in the manifest but missing from {self.store.url}"
            ) from None
        if n != info["size"] or digest != info["sha256"]:
            raise StoreError(
                f"{kind}/{version}/{name}: downloaded {n:,} bytes that do not match the manifest's "
                "size/sha256: corrupt or altered"
            )

    @staticmethod
    def _cache_current(dest: str, manifest_raw: bytes) -> bool:
        try:
            with open(os.path.join(dest, MANIFEST), "rb") as f:
                return f.read() == manifest_raw
        except OSError:
            return False

    def local_dir(
        self,
        kind: str,
        version: str,
        manifest: Mapping[str, Any],
        manifest_raw: bytes,
        cache_dir: str | None,
        verify: str,
    ) -> str:
        """A hash-checked download into ``<cache>/<kind>/<version>`` (with the manifest),
        reused while its manifest is the store's and its files still match."""
        cache = cache_dir or os.path.join(tempfile.gettempdir(), "tokenmill-cache")
        dest = os.path.join(cache, kind, version)
        if self._cache_current(dest, manifest_raw):
            try:
                if verify != "none":
                    for name, info in manifest["files"].items():
                        _check_local(
                            os.path.join(dest, *name.split("/")),
                            f"{kind}/{version}/{name} (cached)",
                            info,
                            verify == "full",
                        )
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
