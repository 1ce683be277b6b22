"""The store's names and layout on storage, shared by `ArtifactStore` and its backends.

The reserved entry names (manifest, staging, markers, claims), the name and URL checks,
the canonical JSON that manifests and ids are hashed over, and file hashing.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any, BinaryIO

from pipeline_lib.fsio import InputError, hash_stream

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
            f"invalid {what} {shown!r}: use 1-{MAX_NAME_LEN} letters, digits, '.', '_' and '-', not "
            "starting with '.' and without '..'"
        )
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
            f"--store {url}: chained URLs ({url.split('::', 1)[0]}::...) are not supported for a store: give a "
            "directory or a plain URL such as s3://bucket/prefix"
        )
    if "://" in url:
        protocol, rest = url.split("://", 1)
        protocol = protocol.lower()
        import fsspec

        if protocol not in fsspec.available_protocols():
            raise InputError(
                f"--store {url}: unknown protocol {protocol!r}: give a directory or a URL such as s3://bucket/prefix"
            )
        if protocol in _BUCKET_PROTOCOLS and not rest.split("/", 1)[0].strip():
            raise InputError(f"--store {url}: no bucket: give {protocol}://BUCKET or {protocol}://BUCKET/PREFIX")
        if durable and protocol == "memory":
            raise InputError(
                f"--store {url}: an in-memory store vanishes with everything in it when the command "
                "ends: give a directory or a durable URL"
            )
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


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


@dataclass(frozen=True)
class FileInfo:
    size: int
    sha256: str


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
