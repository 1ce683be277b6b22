"""The download stage's side of a corpus: expand source URLs and globs through fsspec,
fingerprint them, copy them into a ``raw`` version (`fetch_sources`, `stage_sources`) or
record them to be read in place (`reference_sources`)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

from pipeline_lib.corpus_config import RAW_KIND, CorpusConfig, _split_name
from pipeline_lib.corpus_documents import _check_looks_like_text
from pipeline_lib.corpus_streams import _redact, _source_info, _stamp
from pipeline_lib.fsio import InputError, filesystem, hash_stream, is_local, protocol_of
from pipeline_lib.store import ArtifactStore, FileInfo, Staging


def expand_sources(sources: tuple[str, ...], **storage_options: Any) -> list[str]:
    """Expand globs; each source must name at least one file."""
    if isinstance(sources, str):
        sources = (sources,)
    urls: list[str] = []
    for src in sources:
        fs, path = filesystem(src, **storage_options)
        globbing = protocol_of(fs) not in ("http", "https") and any(ch in path for ch in "*?[")
        if globbing:
            try:
                hits = sorted(h for h in fs.glob(path) if not fs.isdir(h))
            except OSError as e:
                raise InputError(f"corpus source {_redact(src)!r}: cannot list it ({e})") from e
            if not hits:
                raise InputError(f"corpus source {_redact(src)!r} matches no files")
            urls.extend(fs.unstrip_protocol(h) if "://" in src else h for h in hits)
        else:
            try:
                info = fs.info(path)
            except FileNotFoundError:
                raise InputError(f"corpus source {_redact(src)!r}: no such file") from None
            except PermissionError as e:  # an HTTP 401/403 (pipeline_lib.fsio.http_status_error)
                raise InputError(f"corpus source {_redact(src)!r}: {e}") from e
            except OSError as e:
                raise InputError(f"corpus source {_redact(src)!r}: cannot reach it ({e})") from e
            if info.get("type") == "directory":
                urls.extend(_directory_files(fs, path, src))
                continue
            urls.append(src)
    return urls


def _directory_files(fs: Any, path: str, src: str) -> list[str]:
    """The files under a directory source, all levels down, in path order (a corpus layout like
    FineWeb's ``data/<dump>/*.parquet``); names starting with "." or "_" (``_SUCCESS``, ``.crc``) are left out."""
    try:
        hits = sorted(h for h in fs.find(path) if not os.path.basename(h).startswith((".", "_")))
    except OSError as e:
        raise InputError(f"corpus source {_redact(src)!r}: cannot list it ({e})") from e
    if not hits:
        raise InputError(
            f"corpus source {_redact(src)!r} is a directory with no files; give files, a glob like "
            f"{src.rstrip('/')}/*.txt, or a directory holding them"
        )
    return [fs.unstrip_protocol(h) if "://" in src else h for h in hits]


def source_fingerprint(sources: tuple[str, ...], **storage_options: Any) -> list[dict[str, Any]]:
    """Cheap identity of the sources (size, mtime / ETag) for cache keys, without reading them."""
    out = []
    for url in expand_sources(sources, **storage_options):
        fs, path = filesystem(url, **storage_options)
        info = fs.info(path)
        out.append({"url": _redact(url), "size": info.get("size"), "stamp": _stamp(info)})
    return out


def _source_name(url: str, i: int) -> str:
    """A store-safe file name for source number `i` that keeps its extensions."""
    path = urllib.parse.urlsplit(url).path if "://" in url else url
    base = os.path.basename(path.rstrip("/")) or "source"
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", base)
    safe = re.sub(r"\.{2,}", ".", safe).strip(".") or "source"
    if len(safe) > 150:  # keep the tail: it holds the format and compression extensions
        safe = safe[-150:].lstrip(".")
    return f"{i:05d}_{safe}"


@contextlib.contextmanager
def fetch_sources(store: ArtifactStore, config: CorpusConfig) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Copy mode: fetch the sources into the store's scratch area, hashing them; yields the
    `raw` version's params (``{"content": [name, sha256 per source]}``, what its id hashes)
    and the fetched files, for `stage_sources`. The fetched files are removed on exit.

    Streams each source in bounded chunks while hashing it. Idempotent: a retry (or a
    second run) downloads again and lands on the same version id, which is published
    once; a killed download leaves only temp files that `gc` removes.
    """
    sources = config.sources
    assert sources is not None  # __post_init__ fills in the default
    urls = expand_sources(sources, **config.storage_options)
    try:
        tmpdir = tempfile.mkdtemp(prefix="download-", dir=store.scratch_dir(RAW_KIND))
    except OSError as e:
        if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        # A read-only store (a published copy on a read-only mount): the sources are hashed
        # beside it, and reusing their raw version needs no write; publishing a new one fails.
        tmpdir = tempfile.mkdtemp(prefix="tokenmill-download-")
    try:
        fetched: list[dict[str, Any]] = []
        for i, url in enumerate(urls):
            fs, path = filesystem(url, **config.storage_options)
            local = os.path.join(tmpdir, f"{i:05d}")
            try:
                with fs.open(path, "rb") as src, open(local, "wb") as dst:
                    size, digest = hash_stream(src, dst)
                    dst.flush()
                    os.fsync(dst.fileno())
            except FileNotFoundError:
                raise InputError(f"corpus source {_redact(url)!r}: no such file") from None
            except IsADirectoryError:
                raise InputError(f"corpus source {_redact(url)!r} is a directory") from None
            fetched.append(
                {"url": _redact(url), "local": local, "name": _source_name(url, i), "size": size, "sha256": digest}
            )
        if sum(f["size"] for f in fetched) == 0:
            shown = ", ".join(repr(_redact(u)) for u in urls[:5]) + (" ..." if len(urls) > 5 else "")
            raise InputError(f"the corpus is empty: {shown} hold 0 bytes")
        for f in fetched:  # refuse what is not text before it becomes a raw version nobody wants
            _check_looks_like_text(f["local"], _user_label(f, f["name"]), config)
        yield {"content": [{"name": f["name"], "sha256": f["sha256"]} for f in fetched]}, fetched
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def stage_sources(
    staging: Staging, fetched: list[dict[str, Any]], config: CorpusConfig
) -> tuple[dict[str, FileInfo], dict[str, Any]]:
    """The fetched sources moved into a `raw` version's staging area: (files, meta)."""
    assert config.sources is not None  # __post_init__ fills in the default
    files: dict[str, FileInfo] = {}
    for f in fetched:
        files[f"sources/{f['name']}"] = staging.put_file(f"sources/{f['name']}", f["local"], move=True)
        if files[f"sources/{f['name']}"] != FileInfo(f["size"], f["sha256"]):
            raise InputError(f"corpus source {f['url']!r} changed on local disk while it was being stored")
    meta = {
        "sources": [{k: f[k] for k in ("url", "name", "size", "sha256")} for f in fetched],
        "n_bytes": sum(f["size"] for f in fetched),
        "fingerprint": source_fingerprint(config.sources, **config.storage_options),
    }
    return files, meta


def reference_sources(config: CorpusConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """Reference mode (``source_mode="reference"``): the `raw` version's params and meta
    for sources read in place.

    Nothing is read: the version records each source's URL (without credentials or query),
    size and ETag / modification time, and its id hashes them, so a changed source is a new
    version. A source without an ETag or modification time cannot be referenced.
    """
    assert config.sources is not None  # __post_init__ fills in the default
    urls = expand_sources(config.sources, **config.storage_options)
    records: list[dict[str, Any]] = []
    for i, url in enumerate(urls):
        info = _source_info(url, config.storage_options)
        if not _stamp(info) or info.get("size") is None:
            raise InputError(
                f"corpus source {_redact(url)!r} has no ETag or modification time (or no size): it cannot be read in "
                "place safely; use --source-mode copy"
            )
        record = {"url": _redact(url), "name": _source_name(url, i), "size": int(info["size"]), "stamp": _stamp(info)}
        fs, path = filesystem(url, **config.storage_options)
        if is_local(fs):
            # A local file's size and mtime are easy to keep while its bytes change (and
            # mtime is easy to set): its content is recorded too, and sharding refuses
            # bytes that hash otherwise. Object stores' ETags change with the content.
            with fs.open(path, "rb") as f:
                record["sha256"] = hash_stream(f)[1]
        records.append(record)
    n_bytes = sum(int(r["size"]) for r in records)
    if n_bytes == 0:
        raise InputError(f"the corpus is empty: {', '.join(repr(r['url']) for r in records[:5])} hold 0 bytes")
    params = {"reference": [{k: r[k] for k in ("url", "size", "stamp", "sha256") if k in r} for r in records]}
    return params, {"mode": "reference", "sources": records, "n_bytes": n_bytes}


def _user_label(smeta: Mapping[str, Any], name: str) -> str:
    """What to call a source in messages: the (redacted) path or URL the user gave, when it
    has the same format and compression extensions as the stored name, else that name."""
    url = smeta.get("url")
    if isinstance(url, str) and url and _split_name(url) == _split_name(name):
        return url
    return name
