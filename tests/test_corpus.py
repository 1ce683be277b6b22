"""Corpus ingestion: formats, compression, sources, download idempotence, sharding, counts."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import lzma
import os
import uuid

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from pipeline_lib import corpus as corpus_module
from pipeline_lib import counting, stages
from pipeline_lib.corpus import (
    CorpusConfig,
    DecodeStats,
    iter_documents,
    iter_shard_batches,
    source_fingerprint,
)
from pipeline_lib.fsio import InputError
from pipeline_lib.stages import download_corpus, shard_corpus
from pipeline_lib.store import ArtifactStore

DOCS = [
    "First document, plain ASCII.",
    "Zweites Dokument: äöü ß",
    "第三个文档",
    "emoji 🚀 and tabs\tinside",
    "last one",
]


def corpus_docs(store: ArtifactStore, ref) -> list[bytes]:
    """Every document of a corpus version, in shard order."""
    out = []
    d = store.local_dir(ref.kind, ref.version)
    for shard in store.manifest(ref.kind, ref.version)["meta"]["shards"]:
        for batch in iter_shard_batches(os.path.join(d, shard["file"])):
            out.extend(batch)
    return out


def ingest(store, sources, **kw):
    cfg = CorpusConfig(sources=tuple(sources) if not isinstance(sources, str) else sources, **kw)
    raw = download_corpus(store, cfg)
    return raw, shard_corpus(store, raw, cfg)


@pytest.fixture
def store(tmp_path) -> ArtifactStore:
    return ArtifactStore(str(tmp_path / "store"))


def write_compressed(path, data: bytes) -> None:
    ext = os.path.splitext(str(path))[1]
    opener = {
        ".gz": gzip.compress,
        ".bz2": bz2.compress,
        ".xz": lzma.compress,
        ".zst": lambda d: zstandard.ZstdCompressor().compress(d),
    }
    with open(path, "wb") as f:
        f.write(opener[ext](data) if ext in opener else data)


# --------------------------------------------------------------------------- formats
@pytest.mark.parametrize("ext", ["", ".gz", ".bz2", ".xz", ".zst"])
def test_text_lines_any_compression(store, tmp_path, ext):
    text = ("\n".join(DOCS) + "\n\n").encode()
    path = tmp_path / f"c.txt{ext}"
    write_compressed(path, text)
    raw, corpus = ingest(store, [str(path)], n_shards=2)
    assert corpus_docs(store, corpus) == [d.encode() for d in DOCS]
    meta = store.manifest("corpus", corpus.version)["meta"]
    assert meta["n_docs"] == len(DOCS) and meta["empty_documents"] == 1
    assert meta["n_bytes"] == sum(len(d.encode()) for d in DOCS)
    source = store.manifest("raw", raw.version)["meta"]["sources"][0]
    assert source["size"] == path.stat().st_size and source["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_paragraph_and_file_documents(store, tmp_path):
    (tmp_path / "a.txt").write_bytes(b"para one\nline two\r\n\n\npara two\n")
    (tmp_path / "b.txt").write_bytes(b"whole\n\nfile")
    _, corpus = ingest(store, [str(tmp_path / "a.txt")], documents="paragraph", n_shards=1)
    assert corpus_docs(store, corpus) == [b"para one\nline two", b"para two"]
    _, corpus = ingest(store, [str(tmp_path / "b.txt")], documents="file", n_shards=1)
    assert corpus_docs(store, corpus) == [b"whole\n\nfile"]


@pytest.mark.parametrize("ext", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_jsonl_text_field(store, tmp_path, ext):
    lines = [json.dumps({"id": i, "content": d, "text": "wrong field"}) for i, d in enumerate(DOCS)]
    lines.insert(2, "")  # blank lines are skipped
    lines.append(json.dumps({"id": 99, "content": None}))  # null text: an empty document
    path = tmp_path / f"c{ext}"
    write_compressed(path, "\n".join(lines).encode())
    _, corpus = ingest(store, [str(path)], text_field="content")
    assert corpus_docs(store, corpus) == [d.encode() for d in DOCS]
    assert store.manifest("corpus", corpus.version)["meta"]["empty_documents"] == 1


def test_parquet_text_column(store, tmp_path):
    pq.write_table(pa.table({"id": list(range(5)), "body": DOCS}), tmp_path / "s.parquet", row_group_size=2)
    pq.write_table(pa.table({"body": pa.array([d.encode() for d in DOCS], pa.binary())}), tmp_path / "b.parquet")
    pq.write_table(pa.table({"body": pa.array(DOCS + [None]).dictionary_encode()}), tmp_path / "d.parquet")
    for name in ("s", "b", "d"):
        _, corpus = ingest(store, [str(tmp_path / f"{name}.parquet")], text_field="body", n_shards=2)
        assert corpus_docs(store, corpus) == [d.encode() for d in DOCS], name


def test_many_sources_globs_and_memory_urls(store, tmp_path):
    d = tmp_path / "src"
    d.mkdir()
    for i in range(3):
        (d / f"part-{i}.txt").write_text(f"doc {i}a\ndoc {i}b\n")
    fs = fsspec.filesystem("memory")
    root = f"/corpus-{uuid.uuid4().hex}"
    fs.pipe_file(f"{root}/x.jsonl", b'{"text": "from memory"}\n')
    _, corpus = ingest(store, [str(d / "part-*.txt"), f"memory://{root}/x.jsonl"], n_shards=3)
    assert corpus_docs(store, corpus) == [
        b"doc 0a",
        b"doc 0b",
        b"doc 1a",
        b"doc 1b",
        b"doc 2a",
        b"doc 2b",
        b"from memory",
    ]
    fp = source_fingerprint((str(d / "part-*.txt"),))
    assert [f["size"] for f in fp] == [14, 14, 14]
    cfg = CorpusConfig(sources=str(d / "part-0.txt"))  # a single string is one source
    assert cfg.sources == (str(d / "part-0.txt"),)


def test_iter_documents_public_api(tmp_path):
    (tmp_path / "x.txt").write_text("a\nb\n\nc\n")
    stats = DecodeStats()
    docs = list(iter_documents(str(tmp_path / "x.txt"), "x.txt", CorpusConfig(), stats))
    assert docs == ["a", "b", "c"] and stats.documents == 3 and stats.empty_documents == 1


# --------------------------------------------------------------------------- download
def test_download_is_idempotent_and_content_addressed(store, tmp_path):
    src = tmp_path / "c.txt"
    src.write_text("one\ntwo\n")
    cfg = CorpusConfig(sources=(str(src),))
    first = download_corpus(store, cfg)
    # A retry after a crash mid-download: leftovers in the staging area do not matter.
    staging = store.stage("raw", first.version)
    staging.put_bytes("sources/00000_c.txt", b"partial")
    again = download_corpus(store, cfg)
    assert again == first and [m["version"] for m in store.list("raw")] == [first.version]
    store.verify("raw", first.version, strict=True)
    assert store.read_bytes("raw", first.version, "sources/00000_c.txt") == b"one\ntwo\n"
    src.write_text("one\ntwo\nthree\n")
    changed = download_corpus(store, cfg)
    assert changed.version != first.version  # new content, new version
    store.gc()
    assert sorted(m["version"] for m in store.list("raw")) == sorted([first.version, changed.version])


def test_download_streams_in_bounded_chunks(store, tmp_path, monkeypatch):
    import pipeline_lib.fsio as fsio_mod

    src = tmp_path / "big.txt"
    src.write_bytes(b"0123456789\n" * 100_000)
    reads = []
    real_open = fsspec.implementations.local.LocalFileSystem._open

    def spy_open(self, path, mode="rb", **kw):
        f = real_open(self, path, mode, **kw)
        if path.endswith("big.txt"):
            real_read = f.read

            def read(n=-1):
                reads.append(n)
                return real_read(n)

            f.read = read
        return f

    monkeypatch.setattr(fsspec.implementations.local.LocalFileSystem, "_open", spy_open)
    monkeypatch.setattr(fsio_mod, "CHUNK", 64 << 10)
    raw = download_corpus(store, CorpusConfig(sources=(str(src),)))
    assert reads and all(0 < n <= 64 << 10 for n in reads)  # never a whole-file read
    assert store.manifest("raw", raw.version)["meta"]["sources"][0]["size"] == 1_100_000


def test_source_names_are_sanitised(store, tmp_path):
    odd = tmp_path / "weird name; rm -rf ~ ..é.txt.gz"
    odd.write_bytes(gzip.compress(b"hello\n"))
    raw, corpus = ingest(store, [str(odd)], n_shards=1)
    name = store.manifest("raw", raw.version)["meta"]["sources"][0]["name"]
    assert name.endswith(".txt.gz") and "/" not in name and " " not in name and ".." not in name
    assert corpus_docs(store, corpus) == [b"hello"]


# --------------------------------------------------------------------------- sharding
def test_shards_are_balanced_and_split_at_documents(store, shakespeare_text):
    path = os.path.join(os.path.dirname(corpus_module.__file__), "data", "tinyshakespeare.txt")
    _, corpus = ingest(store, [path], n_shards=4)
    meta = store.manifest("corpus", corpus.version)["meta"]
    sizes = [s["n_bytes"] for s in meta["shards"]]
    assert len(sizes) == 4 and max(sizes) / min(sizes) < 1.02
    expected = [line.encode() for line in shakespeare_text.splitlines() if line]
    assert corpus_docs(store, corpus) == expected  # order and boundaries preserved
    assert sum(s["n_docs"] for s in meta["shards"]) == meta["n_docs"] == len(expected)
    assert meta["sources"][0]["n_docs"] == len(expected)


@pytest.mark.parametrize("giant_at", ["start", "middle", "end"])
def test_one_giant_document_among_many_small_ones(store, tmp_path, giant_at):
    """A document larger than a shard's share gets a shard of its own, the others stay
    balanced (cutting at fixed k/n marks once gave 10 MB / 12 bytes / 4.8 MB / 4.9 MB)."""
    small = [f"line {i} " + "y" * (i % 50) for i in range(40_000)]  # ~1.3 MB in all
    giant = "G" * (1 << 20)
    at = {"start": 0, "middle": len(small) // 3, "end": len(small)}[giant_at]
    docs = small[:at] + [giant] + small[at:]
    (tmp_path / "c.txt").write_text("\n".join(docs) + "\n")
    _, corpus = ingest(store, [str(tmp_path / "c.txt")], n_shards=4)
    meta = store.manifest("corpus", corpus.version)["meta"]
    shards = meta["shards"]
    assert len(shards) == 4
    alone = [s for s in shards if s.get("oversize")]
    assert len(alone) == 1 and alone[0]["n_docs"] == 1 and alone[0]["n_bytes"] == len(giant)
    rest = [s["n_bytes"] for s in shards if not s.get("oversize")]
    if giant_at != "end":  # streaming, no look-ahead: a giant last document leaves the shard before it short
        assert max(rest) / min(rest) < 1.1, rest  # the small documents share the other shards evenly
    assert min(rest) > 100_000  # never a sliver (once: 12 bytes)
    assert corpus_docs(store, corpus) == [d.encode() for d in docs]
    balance = meta["balance"]
    assert balance["oversize_shards"] == [alone[0]["name"]]
    assert balance["max_bytes"] == len(giant) and balance["min_bytes"] == min(rest)


def test_shard_bytes_sets_the_shard_size(store, tmp_path):
    (tmp_path / "c.txt").write_text("".join(f"document {i:05d}\n" for i in range(10_000)))  # 150,000 bytes
    _, corpus = ingest(store, [str(tmp_path / "c.txt")], shard_bytes=20_000)
    sizes = [s["n_bytes"] for s in store.manifest("corpus", corpus.version)["meta"]["shards"]]
    assert len(sizes) == 8  # ceil(150,000 / 20,000)
    assert max(sizes) / min(sizes) < 1.01


def test_sharding_is_deterministic(tmp_path):
    src = tmp_path / "c.txt.zst"
    write_compressed(src, "\n".join(f"document {i} " + "x" * (i % 97) for i in range(5000)).encode())
    a, b = ArtifactStore(str(tmp_path / "a")), ArtifactStore(str(tmp_path / "b"))
    _, ca = ingest(a, [str(src)], n_shards=3)
    _, cb = ingest(b, [str(src)], n_shards=3)
    assert ca.version == cb.version
    for name, info in a.manifest("corpus", ca.version)["files"].items():
        assert info == b.manifest("corpus", cb.version)["files"][name]
        assert a.read_bytes("corpus", ca.version, name) == b.read_bytes("corpus", cb.version, name)


def test_more_shards_than_documents(store, tmp_path):
    (tmp_path / "c.txt").write_text("a\nb\n")
    _, corpus = ingest(store, [str(tmp_path / "c.txt")], n_shards=5)
    meta = store.manifest("corpus", corpus.version)["meta"]
    assert [s["n_docs"] for s in meta["shards"]] == [1, 1]


# --------------------------------------------------------------------------- counting
def test_counts_do_not_depend_on_the_number_of_shards(tmp_path, shakespeare_text):
    src = tmp_path / "c.txt"
    src.write_text(shakespeare_text[:200_000])
    tables = []
    for n in (1, 3):
        store = ArtifactStore(str(tmp_path / f"s{n}"))
        _, corpus = ingest(store, [str(src)], n_shards=n)
        cc = stages.CountConfig(pattern="gpt2")
        for i in range(n):
            stages.count_shard(store, corpus, i, cc)
        ref = stages.reduce_counts(store, corpus, cc)
        tables.append(store.read_bytes(ref.kind, ref.version, counting.COUNTS_FILE))
        pieces, counts = counting.read_counts(
            os.path.join(store.local_dir(ref.kind, ref.version), counting.COUNTS_FILE)
        )
        assert pieces == sorted(pieces) and len(set(pieces)) == len(pieces)
        assert int(counts.sum()) == store.manifest(ref.kind, ref.version)["meta"]["n_occurrences"]
    assert tables[0] == tables[1]  # byte-identical, whatever the sharding


def test_read_counts_rejects_bad_tables(tmp_path):
    pq.write_table(pa.table({"piece": pa.array([b"a"]), "count": pa.array([0], pa.int64())}), tmp_path / "zero.parquet")
    pq.write_table(pa.table({"piece": pa.array(["a"]), "count": pa.array([1.5])}), tmp_path / "types.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"PAR1 not really")
    for name, match in (("zero", "positive"), ("types", "binary"), ("junk", "not a readable counts file")):
        with pytest.raises(InputError, match=match):
            counting.read_counts(str(tmp_path / f"{name}.parquet"))
    counting.write_counts(str(tmp_path / "ok.parquet"), [b"a", b"b"], np.array([3, 4]))
    assert counting.read_counts(str(tmp_path / "ok.parquet"))[0] == [b"a", b"b"]


# --------------------------------------------------------------------------- sources in place
def _s3():
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    import s3_server

    return s3_server


def _shard_files(store: ArtifactStore, ref) -> dict[str, str]:
    return {name: info["sha256"] for name, info in store.manifest(ref.kind, ref.version)["files"].items()}


def test_reference_mode_reads_s3_sources_in_place(store, shakespeare_text):
    s3 = _s3()
    options = s3.storage_options()
    base = s3.s3_url("sources")
    text = shakespeare_text[:50_000].encode()
    fs = fsspec.filesystem("s3", **options)
    fs.pipe_file(f"{base}/a.txt", text)
    fs.pipe_file(f"{base}/b.txt.gz", gzip.compress(text[:20_000]))
    sources = (f"{base}/a.txt", f"{base}/b.txt.gz")
    raw_ref, corpus_ref = ingest(store, sources, n_shards=3, source_mode="reference", storage_options=options)
    raw = store.manifest(raw_ref.kind, raw_ref.version)
    assert raw["files"] == {} and raw["meta"]["mode"] == "reference"
    assert [(r["url"], r["size"]) for r in raw["meta"]["sources"]] == [
        (sources[0], len(text)),
        (sources[1], len(gzip.compress(text[:20_000]))),
    ]
    assert all(r["stamp"] for r in raw["meta"]["sources"])  # S3's ETag
    # Read in place, the shards are the very ones a copy gives; the sha256 is of the bytes read.
    copy_store = ArtifactStore(str(store.url) + "-copy")
    _, copied = ingest(copy_store, sources, n_shards=3, storage_options=options)
    assert _shard_files(store, corpus_ref) == _shard_files(copy_store, copied)
    meta = store.manifest(corpus_ref.kind, corpus_ref.version)["meta"]
    assert meta["sources"][0]["sha256"] == hashlib.sha256(text).hexdigest()
    assert meta["sources"] == [{**s, "stamp": r["stamp"]} for s, r in zip(meta["sources"], raw["meta"]["sources"])]
    assert corpus_docs(store, corpus_ref) == corpus_docs(copy_store, copied)


def test_reference_mode_refuses_a_source_that_changed(store, shakespeare_text):
    s3 = _s3()
    options = s3.storage_options()
    url = f"{s3.s3_url('sources')}/a.txt"
    fs = fsspec.filesystem("s3", **options)
    fs.pipe_file(url, b"one\ntwo\n")
    cfg = CorpusConfig(sources=(url,), source_mode="reference", storage_options=options)
    raw = download_corpus(store, cfg)
    fs.pipe_file(url, b"one\ntwo\nthree\n")
    # Reusing the recorded version (here: sharding it again) finds the source changed.
    with pytest.raises(InputError) as e:
        shard_corpus(store, raw, cfg)
    message = str(e.value)
    assert (
        url in message
        and "size 8 -> 14 bytes" in message
        and "ETag/modified" in message
        and "--source-mode copy" in message
    ), message
    assert store.list("corpus") == []  # nothing published
    again = download_corpus(store, cfg)  # recording it again: a new version
    assert again.version != raw.version
    assert corpus_docs(store, shard_corpus(store, again, cfg)) == [b"one", b"two", b"three"]


def test_reference_mode_refuses_a_local_file_changed_under_the_same_size_and_mtime(store, tmp_path):
    src = tmp_path / "c.txt"
    src.write_bytes(b"one\ntwo\n")
    cfg = CorpusConfig(sources=(str(src),), source_mode="reference", n_shards=1)
    raw = download_corpus(store, cfg)
    st = os.stat(src)
    src.write_bytes(b"ONE\nTWO\n")  # same size ...
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))  # ... same mtime, other bytes
    with pytest.raises(InputError) as e:
        shard_corpus(store, raw, cfg)
    assert str(src) in str(e.value) and "sha256 differs" in str(e.value) and "--source-mode copy" in str(e.value)
    assert store.list("corpus") == []  # nothing derived from it was published
    again = download_corpus(store, cfg)  # recording it again hashes the new bytes: a new raw version
    assert again.version != raw.version
    assert corpus_docs(store, shard_corpus(store, again, cfg)) == [b"ONE", b"TWO"]


def test_reference_and_copy_are_different_raw_versions(store, tmp_path):
    src = tmp_path / "c.txt"
    src.write_text("one\ntwo\n")
    copied = download_corpus(store, CorpusConfig(sources=(str(src),)))
    # a local file: its mtime
    referenced = download_corpus(store, CorpusConfig(sources=(str(src),), source_mode="reference"))
    assert copied.version != referenced.version
    assert stages.DOWNLOAD.fingerprint is not None
    assert stages.DOWNLOAD.fingerprint(CorpusConfig(sources=(str(src),))) != stages.DOWNLOAD.fingerprint(
        CorpusConfig(sources=(str(src),), source_mode="reference")
    )
    with pytest.raises(InputError, match="source_mode='nope'"):
        CorpusConfig(source_mode="nope")  # type: ignore[arg-type]


class _Files:
    """A loopback HTTP server of in-memory files: HEAD and GET with byte ranges, an ETag
    (the content's hash) unless told not to send one."""

    def __init__(self, etag: bool = True):
        import http.server
        import threading

        files: dict[str, bytes] = {}
        self.files = files

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _head(self) -> bytes | None:
                body = files.get(self.path)
                if body is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                start, end = 0, len(body)
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes="):
                    a, _, b = rng[6:].partition("-")
                    start, end = int(a or 0), min(len(body), int(b) + 1 if b else len(body))
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(end - start))
                self.send_header("Accept-Ranges", "bytes")
                if etag:
                    self.send_header("ETag", f'"{hashlib.md5(body).hexdigest()}"')
                self.end_headers()
                return body[start:end]

            def do_HEAD(self):
                self._head()

            def do_GET(self):
                part = self._head()
                if part is not None:
                    self.wfile.write(part)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_reference_mode_over_http_needs_an_etag(store):
    with _Files() as server:
        body = b"alpha\nbeta\ngamma\n"
        server.files["/corpus.txt"] = body
        cfg = CorpusConfig(sources=(f"{server.url}/corpus.txt",), source_mode="reference")
        raw = download_corpus(store, cfg)
        assert (
            store.manifest("raw", raw.version)["meta"]["sources"][0]["stamp"]
            == '"' + hashlib.md5(body).hexdigest() + '"'
        )
        assert corpus_docs(store, shard_corpus(store, raw, cfg)) == [b"alpha", b"beta", b"gamma"]
        server.files["/corpus.txt"] = b"alpha\nBETA\ngamma\n"  # same size, new ETag
        with pytest.raises(InputError, match="changed since it was recorded in place.*ETag/modified"):
            shard_corpus(store, raw, CorpusConfig(sources=cfg.sources, source_mode="reference", n_shards=3))
    with _Files(etag=False) as server:
        server.files["/corpus.txt"] = b"alpha\n"
        with pytest.raises(InputError, match="no ETag or modification time.*--source-mode copy"):
            download_corpus(store, CorpusConfig(sources=(f"{server.url}/corpus.txt",), source_mode="reference"))
