"""`LocalBackend`: the store's protocol on local disk (renames, `flock`, files read in place).

See `pipeline_lib.store` for the protocol and why each step is done this way.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, BinaryIO

from pipeline_lib.errors import StoreError
from pipeline_lib.fsio import InputError, _umask, check_local_file, fsync_dir, fsync_file, write_bytes_atomic
from pipeline_lib.store_backend import StorageBackend
from pipeline_lib.store_layout import (
    _MARKER_BYTES,
    CLAIM_SUFFIX,
    LOCK_FILE,
    MANIFEST,
    MARKER_FORMAT,
    NEW_DIR_PREFIX,
    STAGING_DIR,
    STAGING_MARKER,
    TMP_DIR,
    WORK_SUFFIX,
    FileInfo,
    _copy_hashed,
    _hash_stream,
    _held,
    check_name,
    fcntl,
)

if TYPE_CHECKING:  # annotations only: store.py imports this module
    from pipeline_lib.store import ArtifactStore, Staging

_log = logging.getLogger("tokenmill.store")


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
                    raise StoreError(
                        f"cannot publish {kind}/{version}: {final} is in the way and was not written by "
                        "the store: move it elsewhere"
                    )
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

    def local_dir(
        self,
        kind: str,
        version: str,
        manifest: Mapping[str, Any],
        manifest_raw: bytes,
        cache_dir: str | None,
        verify: str,
    ) -> str:
        """The version directory itself, checked in place."""
        if verify != "none":
            for name, info in manifest["files"].items():
                _check_local(
                    self.store.file_path(kind, version, name), f"{kind}/{version}/{name}", info, verify == "full"
                )
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
