"""The documents of one corpus source, document by document: text files by line, paragraph
or whole file, JSONL records, Parquet rows (`_iter_docs`, which defines the rules the
compiled scanner follows), with the invalid-UTF-8 policy (`CorpusConfig.errors`, counted in
`DecodeStats`), the binary-file sniff and the per-document cap."""

from __future__ import annotations

import codecs
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline_lib.corpus_config import _BIG_DOC, CorpusConfig, _split_name
from pipeline_lib.corpus_reads import _binary_values
from pipeline_lib.corpus_streams import _InPlace, open_source
from pipeline_lib.fsio import InputError

_SNIFF_BYTES = 1 << 16


# Magic numbers of common binary formats that are not text (compressed ones are handled
# by extension; a compressed file without its extension is refused here).
_BINARY_MAGIC = {
    b"\x7fELF": "an ELF executable",
    b"\x89PNG": "a PNG image",
    b"\xff\xd8\xff": "a JPEG image",
    b"GIF8": "a GIF image",
    b"%PDF": "a PDF document",
    b"PK\x03\x04": "a ZIP archive",
    b"\x1f\x8b": "gzip data (name it .gz)",
    b"BZh": "bzip2 data (name it .bz2)",
    b"\xfd7zXZ\x00": "xz data (name it .xz)",
    b"\x28\xb5\x2f\xfd": "zstd data (name it .zst)",
    b"PAR1": "a Parquet file (name it .parquet)",
    b"\x93NUMPY": "a NumPy array",
    b"SQLite format 3\x00": "an SQLite database",
}


@dataclass
class DecodeStats:
    documents: int = 0
    bytes: int = 0
    chars: int = 0
    replaced_documents: int = 0
    invalid_bytes: int = 0  # bytes replaced by U+FFFD (policy "replace")
    skipped_documents: int = 0  # documents dropped for invalid UTF-8 (policy "skip-document")
    empty_documents: int = 0

    def add(self, other: DecodeStats) -> None:
        for k, v in asdict(other).items():
            setattr(self, k, getattr(self, k) + v)


_INVALID = threading.local()  # bytes replaced by the running decode, per thread


def _count_replace(e: UnicodeError) -> tuple[str, int]:
    if not isinstance(e, UnicodeDecodeError):  # registered for decoding only
        raise e
    _INVALID.n = getattr(_INVALID, "n", 0) + e.end - e.start
    return "\ufffd", e.end


codecs.register_error("tokenmill-count-replace", _count_replace)


def _decode_policy(data: bytes, errors: str, where: str, stats: DecodeStats) -> str | None:
    """`data` as text, applying the invalid-UTF-8 policy (counts replaced / skipped)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        if errors == "fail":
            raise InputError(
                f"{where}: invalid UTF-8 at byte {e.start} ({e.reason}); use errors='replace' or "
                "'skip-document' to go on"
            ) from None
        if errors == "skip-document":
            stats.skipped_documents += 1
            return None
        _INVALID.n = 0
        text = data.decode("utf-8", "tokenmill-count-replace")
        stats.replaced_documents += 1
        stats.invalid_bytes += _INVALID.n
        return text


def _check_utf8(data: bytes, errors: str, where: str, stats: DecodeStats) -> bytes | None:
    """`data` if it is UTF-8; else per the policy: repaired bytes, None (skip) or an error."""
    n_chars = _utf8_chars(data)
    if n_chars is None:
        text = _decode_policy(data, errors, where, stats)
        if text is None:
            return None
        data = text.encode("utf-8")
        n_chars = len(text)
    return _counted(data, n_chars, stats)


def _utf8_chars(data: bytes) -> int | None:
    """Characters in `data` if it is valid UTF-8, else None; big documents are checked in
    slices so no str of their full size is ever built."""
    if len(data) <= _BIG_DOC:
        try:
            return len(data.decode("utf-8"))
        except UnicodeDecodeError:
            return None
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(data)
    n = 0
    try:
        for start in range(0, len(data), _BIG_DOC):
            n += len(decoder.decode(view[start : start + _BIG_DOC], final=start + _BIG_DOC >= len(data)))
    except UnicodeDecodeError:
        return None
    return n


def _check_str(text: str, errors: str, where: str, stats: DecodeStats) -> bytes | None:
    """UTF-8 bytes of a str from JSON (which can hold lone surrogates UTF-8 cannot carry)."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as e:
        if errors == "fail":
            raise InputError(
                f"{where}: lone surrogate {text[e.start]!r} at character {e.start}, not encodable as UTF-8; use "
                "errors='replace' or 'skip-document'"
            ) from None
        if errors == "skip-document":
            stats.skipped_documents += 1
            return None
        # Join valid surrogate pairs, replace lone ones with U+FFFD (the tokenizer's rule).
        fixed = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        stats.replaced_documents += 1
        stats.invalid_bytes += sum(1 for ch in text if "\ud800" <= ch <= "\udfff") - 2 * (len(text) - len(fixed))
        text, data = fixed, fixed.encode("utf-8")
    return _counted(data, len(text), stats)


def _counted(data: bytes, n_chars: int, stats: DecodeStats) -> bytes | None:
    if not data or data.isspace():  # nothing but ASCII whitespace: no content, no document
        stats.empty_documents += 1
        return None
    stats.documents += 1
    stats.bytes += len(data)
    stats.chars += n_chars
    return data


def _sniff_binary(head: bytes, name: str) -> None:
    """Refuse a file that is not text: a known binary signature, many NULs or non-UTF-8.

    A few NUL or control bytes in text are fine (kept, the tokenizer is byte-level).
    """
    if not head:
        return
    for magic, what in _BINARY_MAGIC.items():
        if head.startswith(magic):
            raise InputError(f"{name}: looks like {what}, not text")
    nul = head.count(0)
    invalid = len(head) - len(head.decode("utf-8", "ignore").encode("utf-8"))
    if len(head) >= 4 and (invalid > len(head) // 10 + 4 or nul > len(head) * 3 // 10):
        hint = (
            " (UTF-16 text? convert it to UTF-8)"
            if head[:2] in (b"\xff\xfe", b"\xfe\xff") or head[1::2].count(0) > len(head) // 4
            else ""
        )
        raise InputError(
            f"{name}: looks like a binary file, not text ({nul} NUL and {invalid} non-UTF-8 bytes in the "
            f"first {len(head):,} bytes){hint}"
        )


def _check_looks_like_text(path: str, label: str, config: CorpusConfig) -> None:
    """The sniff `_iter_docs` does, on a fetched source's first bytes (decompressed)."""
    fmt, comp = _split_name(label)
    if fmt == ".parquet":
        return  # binary by nature; its text column is checked when it is read
    with open_source(path, label, config.max_source_bytes) as f:
        _sniff_binary(f.peek(_SNIFF_BYTES)[:_SNIFF_BYTES], label)


def _document_too_big(name: str, where: str, cap: int) -> InputError:
    return InputError(
        f"{name}{where}: a document of more than {cap:,} bytes; raise --max-document-bytes to allow it (memory grows "
        "to a few times it), "
        "or cut the text into smaller documents (--documents line / paragraph)"
    )


def _iter_docs(
    path: str | _InPlace, name: str, config: CorpusConfig, stats: DecodeStats
) -> Iterator[tuple[bytes, int]]:
    """(document UTF-8 bytes, source bytes consumed so far) for one local source file (or a referenced one)."""
    fmt, comp = _split_name(name)
    if fmt == ".parquet":
        if comp:
            raise InputError(
                f"{name}: a compressed Parquet file; Parquet compresses internally, store it as plain .parquet"
            )
        yield from _iter_parquet(path, name, config, stats)
        return
    errors = config.errors
    pos = 0
    with open_source(path, name, config.max_source_bytes) as f:
        if not getattr(path, "offset", 0):  # a range inside a file starts at an arbitrary line
            _sniff_binary(f.peek(_SNIFF_BYTES)[:_SNIFF_BYTES], name)
        cap = config.max_document_bytes
        if fmt in (".jsonl", ".ndjson", ".json"):
            field = config.text_field
            lineno = 0
            while line := f.readline(cap + 1):
                lineno += 1
                if len(line) > cap:
                    raise _document_too_big(name, f":{lineno}", cap)
                pos += len(line)
                # the file's first line only
                if lineno == 1 and line.startswith(codecs.BOM_UTF8) and not getattr(path, "offset", 0):
                    line = line[len(codecs.BOM_UTF8) :]
                if not line.strip():
                    continue
                text = _decode_policy(line, errors, f"{name}:{lineno}", stats)
                if text is None:
                    continue
                try:
                    record = json.loads(text)
                except json.JSONDecodeError as e:
                    raise InputError(f"{name}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
                if not isinstance(record, dict):
                    raise InputError(f"{name}:{lineno}: expected a JSON object per line, found {type(record).__name__}")
                if field not in record:
                    raise InputError(
                        f"{name}:{lineno}: record has no {field!r} field (fields: {sorted(record)[:10]}); name the "
                        "field holding the text with --text-field"
                    )
                value = record[field]
                if value is None:
                    stats.empty_documents += 1
                    continue
                if not isinstance(value, str):
                    raise InputError(f"{name}:{lineno}: field {field!r} is {type(value).__name__}, not text")
                data = _check_str(value, errors, f"{name}:{lineno}", stats)
                if data is not None:
                    yield data, pos
        elif config.documents == "file":
            raw = f.read(cap + 1)
            if len(raw) > cap:
                raise _document_too_big(name, "", cap)
            data = _check_utf8(raw, errors, name, stats)
            if data is not None:
                yield data, len(raw)
        elif config.documents == "line":
            lineno = 0
            while line := f.readline(cap + 1):
                lineno += 1
                if len(line) > cap:
                    raise _document_too_big(name, f":{lineno}", cap)
                pos += len(line)
                stripped = line.rstrip(b"\r\n")
                del line  # drop the unstripped copy before checking (a huge line counts twice otherwise)
                data = _check_utf8(stripped, errors, f"{name}:{lineno}", stats)
                del stripped
                if data is not None:
                    yield data, pos
                data = None
        else:  # paragraph: blank-line separated
            para: list[bytes] = []
            para_bytes = 0
            start = 1
            lineno = 0
            while line := f.readline(cap + 1):
                lineno += 1
                if line.strip():
                    if not para:
                        start = lineno
                    para.append(line)
                    para_bytes += len(line)
                    if para_bytes > cap:
                        raise _document_too_big(name, f":{start}", cap)
                    pos += len(line)
                    continue
                if para:
                    data = _check_utf8(b"".join(para).rstrip(b"\r\n"), errors, f"{name}:{start}", stats)
                    para, para_bytes = [], 0
                    if data is not None:
                        yield data, pos
                pos += len(line)
            if para:
                data = _check_utf8(b"".join(para).rstrip(b"\r\n"), errors, f"{name}:{start}", stats)
                if data is not None:
                    yield data, pos


def iter_documents(path: str, name: str, config: CorpusConfig, stats: DecodeStats) -> Iterator[str]:
    """Yield the documents of one local source file as text."""
    for data, _ in _iter_docs(path, name, config, stats):
        yield data.decode("utf-8")


def _text_column(pf: pq.ParquetFile, name: str, field: str) -> None:
    names = pf.schema_arrow.names
    if field not in names:
        raise InputError(
            f"{name}: no column {field!r} (columns: {names[:20]}); name the column holding the text with --text-field"
        )
    typ = pf.schema_arrow.field(field).type
    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    ok = (
        pa.types.is_string(typ)
        or pa.types.is_large_string(typ)
        or pa.types.is_binary(typ)
        or pa.types.is_large_binary(typ)
        or getattr(pa.types, "is_string_view", lambda t: False)(typ)
        or getattr(pa.types, "is_binary_view", lambda t: False)(typ)
    )
    if not ok:
        raise InputError(f"{name}: column {field!r} has type {typ}, not text")


def _parquet_file(path: str | _InPlace) -> pq.ParquetFile:
    return pq.ParquetFile(path.open(seekable=True) if isinstance(path, _InPlace) else path)


def _iter_parquet(
    path: str | _InPlace, name: str, config: CorpusConfig, stats: DecodeStats
) -> Iterator[tuple[bytes, int]]:
    try:
        pf = _parquet_file(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{name}: not a readable Parquet file ({e})") from e
    _text_column(pf, name, config.text_field)
    pos = row = 0
    try:
        for batch in pf.iter_batches(
            columns=[config.text_field], batch_size=4096, row_groups=getattr(path, "row_groups", None)
        ):
            off, buf, valid = _binary_values(batch.column(0))
            for i in range(len(off) - 1):
                row += 1
                if valid is not None and not valid[i]:
                    stats.empty_documents += 1
                    continue
                n = int(off[i + 1] - off[i])
                if n > config.max_document_bytes:
                    raise _document_too_big(name, f": row {row}", config.max_document_bytes)
                pos += n
                if pos > config.max_source_bytes:
                    raise InputError(
                        f"{name}: holds more than {config.max_source_bytes:,} bytes of text ; raise "
                        "--max-source-bytes to allow it"
                    )
                data = _check_utf8(bytes(buf[off[i] : off[i + 1]]), config.errors, f"{name}: row {row}", stats)
                if data is not None:
                    yield data, pos
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as e:
        raise InputError(f"{name}: corrupt Parquet file ({e})") from e


def _source_extent(path: str | _InPlace, name: str, config: CorpusConfig) -> int:
    """Bytes `_iter_docs` will walk through for this source (decompressed).

    Free for uncompressed files; one decompression pass for compressed ones (which also
    finds a truncated archive or a bomb before anything is written); the text column's
    byte length for Parquet.
    """
    fmt, comp = _split_name(name)
    if fmt == ".parquet":
        if comp:
            raise InputError(
                f"{name}: a compressed Parquet file; Parquet compresses internally, store it as plain .parquet"
            )
        try:
            pf = _parquet_file(path)
            _text_column(pf, name, config.text_field)
            total = 0
            for batch in pf.iter_batches(
                columns=[config.text_field], batch_size=65536, row_groups=getattr(path, "row_groups", None)
            ):
                off, _, valid = _binary_values(batch.column(0))
                lengths = np.diff(off)
                total += int(lengths.sum() if valid is None else lengths[valid].sum())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as e:
            raise InputError(f"{name}: not a readable Parquet file ({e})") from e
        if total > config.max_source_bytes:
            raise InputError(
                f"{name}: holds more than {config.max_source_bytes:,} bytes of text ; raise "
                "--max-source-bytes to allow it"
            )
        return total
    if not comp:
        size = path.record["size"] if isinstance(path, _InPlace) else os.path.getsize(path)
        if size > config.max_source_bytes:
            raise InputError(
                f"{name}: {size:,} bytes, more than the {config.max_source_bytes:,}-byte cap; raise "
                "--max-source-bytes to allow it"
            )
        return size
    total = 0
    with open_source(path, name, config.max_source_bytes) as f:
        while n := len(f.read(1 << 20)):
            total += n
    return total
