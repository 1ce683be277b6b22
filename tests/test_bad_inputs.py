"""Bad inputs: each gives a clear error naming the input, or a documented policy outcome,
and never a published partial version."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from chain import publish_tokens_version

from pipeline_lib.corpus import CorpusConfig, iter_shard_batches
from pipeline_lib.fsio import InputError
from pipeline_lib.stages import download_corpus, shard_corpus
from pipeline_lib.store import MANIFEST, ArtifactStore, StoreError
from pipeline_lib.token_shards import check_shards, open_tokens
from pipeline_lib.tokenizer import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def store(tmp_path) -> ArtifactStore:
    return ArtifactStore(str(tmp_path / "store"))


def ingest(store, path, **kw):
    cfg = CorpusConfig(sources=(str(path),), **kw)
    return shard_corpus(store, download_corpus(store, cfg), cfg)


def docs_of(store, ref) -> list[bytes]:
    d = store.local_dir(ref.kind, ref.version)
    return [
        doc
        for s in store.manifest(ref.kind, ref.version)["meta"]["shards"]
        for b in iter_shard_batches(os.path.join(d, s["file"]))
        for doc in b
    ]


def nothing_published(store, kind="corpus") -> bool:
    return store.list(kind) == []


# --------------------------------------------------------------------------- empty
def test_empty_corpus(store, tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(InputError, match=r"empty\.txt.*0 bytes|corpus is empty.*empty\.txt"):
        ingest(store, tmp_path / "empty.txt")
    (tmp_path / "blank.txt").write_bytes(b"\n\n  \n\r\n")
    with pytest.raises(InputError, match=r"no documents \(4 empty.*blank\.txt"):
        ingest(store, tmp_path / "blank.txt")
    with pytest.raises(InputError, match=r"no documents \(0 empty.*blank\.txt"):
        ingest(store, tmp_path / "blank.txt", documents="paragraph")
    (tmp_path / "blank.jsonl").write_bytes(b'{"text": ""}\n{"text": null}\n')
    with pytest.raises(InputError, match=r"no documents \(2 empty.*blank\.jsonl"):
        ingest(store, tmp_path / "blank.jsonl")
    assert nothing_published(store)


def test_missing_sources(store, tmp_path):
    with pytest.raises(InputError, match=r"nope\.txt.*no such file"):
        ingest(store, tmp_path / "nope.txt")
    with pytest.raises(InputError, match=r"\*\.txt.*matches no files"):
        ingest(store, tmp_path / "*.txt")
    with pytest.raises(InputError, match="is a directory"):
        ingest(store, tmp_path)
    with pytest.raises(InputError, match="errors="):
        CorpusConfig(errors="ignore")
    with pytest.raises(InputError, match="n_shards"):
        CorpusConfig(n_shards=0)


# --------------------------------------------------------------------------- invalid UTF-8
BAD = b"good line\nbad \xff\xfe here\nsplit \xe2\x82 euro\nfine again\n"


def test_invalid_utf8_replace(store, tmp_path):
    (tmp_path / "bad.txt").write_bytes(BAD)
    ref = ingest(store, tmp_path / "bad.txt", errors="replace")
    assert docs_of(store, ref) == [
        b"good line",
        "bad \ufffd\ufffd here".encode(),
        "split \ufffd euro".encode(),
        b"fine again",
    ]
    meta = store.manifest("corpus", ref.version)["meta"]
    assert meta["replaced_documents"] == 2 and meta["invalid_bytes"] == 4 and meta["skipped_documents"] == 0
    assert meta["errors_policy"] == "replace"


def test_invalid_utf8_skip_document(store, tmp_path):
    (tmp_path / "bad.txt").write_bytes(BAD)
    ref = ingest(store, tmp_path / "bad.txt", errors="skip-document")
    assert docs_of(store, ref) == [b"good line", b"fine again"]
    meta = store.manifest("corpus", ref.version)["meta"]
    assert meta["skipped_documents"] == 2 and meta["replaced_documents"] == 0 and meta["n_docs"] == 2


def test_invalid_utf8_fail(store, tmp_path):
    (tmp_path / "bad.txt").write_bytes(BAD)
    with pytest.raises(InputError, match=r"bad\.txt:2: invalid UTF-8 at byte 4"):
        ingest(store, tmp_path / "bad.txt", errors="fail")
    assert nothing_published(store)


def test_invalid_utf8_in_jsonl_and_parquet(store, tmp_path):
    (tmp_path / "bad.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n{"text": "lone \\ud800 surrogate"}\n')
    with pytest.raises(InputError, match=r"bad\.jsonl:2: invalid UTF-8"):
        ingest(store, tmp_path / "bad.jsonl", errors="fail")
    ref = ingest(store, tmp_path / "bad.jsonl", errors="replace")
    assert docs_of(store, ref) == [b"ok", "caf\ufffd".encode(), "lone \ufffd surrogate".encode()]
    ref = ingest(store, tmp_path / "bad.jsonl", errors="skip-document")
    assert docs_of(store, ref) == [b"ok"]
    pq.write_table(pa.table({"text": pa.array([b"fine", b"\xc3\x28 bad"], pa.binary())}), tmp_path / "bad.parquet")
    with pytest.raises(InputError, match=r"bad\.parquet: row 2: invalid UTF-8"):
        ingest(store, tmp_path / "bad.parquet", errors="fail")


# --------------------------------------------------------------------------- binary, NUL
@pytest.mark.parametrize("kind", ["png", "elf", "random", "utf16", "gzip-without-extension"])
def test_binary_file(store, tmp_path, kind):
    rng = np.random.default_rng(0)
    data = {
        "png": b"\x89PNG\r\n\x1a\n" + rng.bytes(5000),
        "elf": b"\x7fELF\x02\x01\x01" + bytes(5000),
        "random": rng.bytes(20000),
        "utf16": "plain English text, but in UTF-16\n".encode("utf-16") * 50,
        "gzip-without-extension": gzip.compress(b"text\n" * 1000),
    }[kind]
    (tmp_path / "data.txt").write_bytes(data)
    with pytest.raises(InputError) as e:
        ingest(store, tmp_path / "data.txt")
    assert str(e.value).startswith(f"{tmp_path / 'data.txt'}: looks like")  # the user's file, not the store's copy
    assert nothing_published(store, "raw")  # refused before it is copied into the store as a raw version
    assert nothing_published(store)


def test_messages_name_the_users_file_not_the_stores_copy(store, tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"fine\n" + b"\xff\xfe bad\n")
    with pytest.raises(InputError) as e:
        ingest(store, path, errors="fail")
    assert str(path) in str(e.value) and "00000_" not in str(e.value)


def test_nul_bytes_are_kept(store, tmp_path):
    text = b"before\x00after\nonly\x00\x00\x00\nnormal\n"
    (tmp_path / "nul.txt").write_bytes(text)
    ref = ingest(store, tmp_path / "nul.txt", n_shards=1)
    assert docs_of(store, ref) == [b"before\x00after", b"only\x00\x00\x00", b"normal"]
    # And through the byte-level tokenizer into token shards, losslessly.
    tok = Tokenizer({bytes([i]): i for i in range(256)}, "gpt2", {"<|endoftext|>": 256})
    tokens = []
    for batch in iter_shard_batches(os.path.join(store.local_dir("corpus", ref.version), "shard_000000.parquet")):
        flat, _ = tok.encode_ordinary_batch_to_numpy(batch)
        tokens += flat.tolist()
    assert tok.decode_bytes(tokens) == b"before\x00afteronly\x00\x00\x00normal"


# --------------------------------------------------------------------------- archives
def _truncate(data: bytes) -> bytes:
    return data[: len(data) * 2 // 3]


@pytest.mark.parametrize(
    "ext,compress",
    [
        (".gz", gzip.compress),
        (".bz2", bz2.compress),
        (".xz", lzma.compress),
        (".zst", lambda d: zstandard.ZstdCompressor().compress(d)),
    ],
)
def test_truncated_archive(store, tmp_path, ext, compress):
    text = b"".join(b"line %d of a longer text that compresses\n" % i for i in range(20000))
    path = tmp_path / f"corpus.txt{ext}"
    path.write_bytes(_truncate(compress(text)))
    with pytest.raises(InputError, match=rf"corpus\.txt\{ext}: (corrupt or )?truncated"):
        ingest(store, path)
    assert nothing_published(store)
    assert store.gc() is not None and nothing_published(store)


def test_corrupt_gzip(store, tmp_path):
    data = bytearray(gzip.compress(b"hello world\n" * 10000))
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "c.txt.gz").write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"c\.txt\.gz: corrupt or truncated archive"):
        ingest(store, tmp_path / "c.txt.gz")


def test_zstd_bomb_is_capped(store, tmp_path):
    path = tmp_path / "bomb.txt.zst"
    cctx = zstandard.ZstdCompressor(level=19)
    with open(path, "wb") as f, cctx.stream_writer(f) as w:
        block = b"a" * (1 << 20)
        for _ in range(1024):  # 1 GiB of text in a few hundred KB
            w.write(block)
    assert path.stat().st_size < 1 << 20
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(InputError, match=r"bomb\.txt\.zst: decompresses to more than 16,777,216 bytes.*bomb"):
        ingest(store, path, max_source_bytes=16 << 20)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 200, f"peak memory grew by {grown_mb:.0f} MB while refusing a bomb"
    assert nothing_published(store)


def _gzip_one_long_line(path, n_bytes: int) -> None:
    with gzip.open(path, "wb", compresslevel=1) as f:
        chunk = b"a" * (1 << 20)
        for _ in range(n_bytes // len(chunk)):
            f.write(chunk)


@pytest.mark.parametrize("reader", ["native", "python"])
@pytest.mark.parametrize("documents", ["line", "paragraph", "file"])
def test_one_huge_document_is_capped_with_bounded_memory(store, tmp_path, monkeypatch, reader, documents):
    """A small .gz holding one 96 MiB line: refused at --max-document-bytes (here 1 MiB)
    with one line naming the file and the flag, and memory stays near the cap's scale on
    the way (a reader that holds the line would need ~2x96 MiB)."""
    import tracemalloc

    from pipeline_lib import corpus as corpus_module

    if reader == "python":
        monkeypatch.setattr(corpus_module, "_SCAN", None)
    path = tmp_path / "one-line.txt.gz"
    _gzip_one_long_line(path, 96 << 20)
    assert path.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(InputError) as e:
            ingest(store, path, max_document_bytes=1 << 20, documents=documents)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(e.value)
    assert message.startswith(str(path)) and "--max-document-bytes" in message and "1,048,576" in message, message
    assert "\n" not in message
    assert peak < 48 << 20, f"peak {peak / 2**20:.0f} MiB while refusing a 96 MiB document with a 1 MiB cap"
    assert nothing_published(store)


def test_document_cap_names_its_flag_from_the_cli(tmp_path):
    path = tmp_path / "one-line.txt.gz"
    _gzip_one_long_line(path, 4 << 20)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "tokenizer",
            "train",
            "--corpus",
            str(path),
            "--store",
            str(tmp_path / "S"),
            "--max-document-bytes",
            "1000000",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 2, p.stderr
    # (Prefect's own log lines may surround it on stderr: the flow layer's business)
    errors = [line for line in p.stderr.splitlines() if line.startswith("tokenmill: error:")]
    assert len(errors) == 1 and "--max-document-bytes" in errors[0] and str(path) in errors[0], p.stderr
    assert "Traceback" not in p.stderr


# --------------------------------------------------------------------------- JSONL, Parquet
@pytest.mark.parametrize(
    "content,match",
    [
        (b'{"text": "a"}\n{"body": "no text here"}\n', r"bad\.jsonl:2: record has no 'text' field"),
        (b'{"text": "a"}\n{"text": 42}\n', r"bad\.jsonl:2: field 'text' is int, not text"),
        (b'{"text": "a"}\n[1, 2]\n', r"bad\.jsonl:2: expected a JSON object"),
        (b'{"text": "a"}\n{"text": "unterminated\n', r"bad\.jsonl:2: not valid JSON"),
    ],
)
def test_bad_jsonl(store, tmp_path, content, match):
    (tmp_path / "bad.jsonl").write_bytes(content)
    with pytest.raises(InputError, match=match):
        ingest(store, tmp_path / "bad.jsonl")
    assert nothing_published(store)


def test_bad_parquet(store, tmp_path):
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "cols.parquet")
    with pytest.raises(InputError, match=r"cols\.parquet: no column 'text'"):
        ingest(store, tmp_path / "cols.parquet")
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "ints.parquet")
    with pytest.raises(InputError, match=r"ints\.parquet: column 'text' has type int64, not text"):
        ingest(store, tmp_path / "ints.parquet")
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"text": ["x" * 1000] * 100}), good)
    (tmp_path / "trunc.parquet").write_bytes(good.read_bytes()[:-200])
    with pytest.raises(InputError, match=r"trunc\.parquet: not a readable Parquet file"):
        ingest(store, tmp_path / "trunc.parquet")
    (tmp_path / "x.parquet.gz").write_bytes(gzip.compress(good.read_bytes()))
    with pytest.raises(InputError, match=r"x\.parquet\.gz: a compressed Parquet file"):
        ingest(store, tmp_path / "x.parquet.gz")


# --------------------------------------------------------------------------- store
def test_hostile_artifact_names(store, tmp_path):
    for name in ("../../etc", "a/b", "..", "", "x\n", ".staging", "~", "a\\b"):
        with pytest.raises(InputError, match="invalid"):
            store.stage(name, "v1")
        with pytest.raises(InputError, match="invalid"):
            store.stage("corpus", name)
    staging = store.stage("corpus", "v1")
    with pytest.raises(InputError, match="invalid"):
        staging.put_bytes("../../../../tmp/escape.txt", b"x")
    with pytest.raises(InputError, match="publish"):
        staging.put_bytes(MANIFEST, b"{}")
    assert not os.path.exists("/tmp/escape.txt") or os.path.getmtime("/tmp/escape.txt") < os.path.getmtime(tmp_path)


def test_corrupt_manifest(store, tmp_path):
    (tmp_path / "c.txt").write_text("hello\n")
    raw = download_corpus(store, CorpusConfig(sources=(str(tmp_path / "c.txt"),)))
    path = os.path.join(store.version_path("raw", raw.version), MANIFEST)
    with open(path, "r+b") as f:
        f.seek(10)
        f.write(b"\x00garbage")
    with pytest.raises(StoreError, match=rf"raw/{raw.version}/manifest\.json: corrupt manifest"):
        store.manifest("raw", raw.version)
    with pytest.raises(StoreError, match="corrupt manifest"):
        shard_corpus(store, raw, CorpusConfig(sources=(str(tmp_path / "c.txt"),)))
    assert store.list() == []


def _npy_with_shape(path, dtype: str, shape_in_header: int, n_actual: int) -> None:
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }" % (dtype, shape_in_header)
    header = header.ljust(128 - 10 - 1) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1"))
        f.write(np.arange(n_actual, dtype=dtype).tobytes())


@pytest.mark.parametrize(
    "header_n,actual_n,match",
    [
        (1_000_000, 10, r"header says 1,000,000 tokens .* the file has 148 bytes: truncated"),
        (5, 10, r"header says 5 tokens .* the file has 148 bytes: trailing data"),
    ],
)
def test_npy_header_lies_about_shape(tmp_path, header_n, actual_n, match):
    path = tmp_path / "shard_000000.npy"
    _npy_with_shape(path, "<u2", header_n, actual_n)
    with pytest.raises(InputError, match=r"shard_000000\.npy: " + match):
        open_tokens(str(path))


def test_npy_with_wrong_dtype_or_pickle(tmp_path):
    np.save(tmp_path / "f.npy", np.zeros(4, dtype="<f4"))
    np.save(tmp_path / "b.npy", np.zeros(4, dtype=">u2"))
    np.save(tmp_path / "o.npy", np.array([{"evil": 1}], dtype=object), allow_pickle=True)
    np.save(tmp_path / "m.npy", np.zeros((2, 2), dtype="<u2"))
    (tmp_path / "junk.npy").write_bytes(b"not numpy at all")
    for name in ("f", "b", "o", "m"):
        with pytest.raises(InputError, match=rf"{name}\.npy: expected a 1-D"):
            open_tokens(str(tmp_path / f"{name}.npy"))
    with pytest.raises(InputError, match=r"junk\.npy: not a valid \.npy file"):
        open_tokens(str(tmp_path / "junk.npy"))


@pytest.fixture(scope="module")
def tokens_version(tmp_path_factory, shakespeare_text):
    store, ref, _ = publish_tokens_version(tmp_path_factory.mktemp("tok"), shakespeare_text[:50_000], vocab_size=300)
    return store, ref


def test_tokens_altered_after_publish(tokens_version):
    store, ref = tokens_version
    path = store.file_path(ref.kind, ref.version, "shard_000001.npy")
    original = open(path, "rb").read()
    try:
        a = np.load(path, allow_pickle=False)
        a[10], a[11] = a[11], a[10]  # a swap: same size, same ids, only the hash can tell
        os.chmod(path, 0o644)
        np.save(path, a)
        with pytest.raises(StoreError, match=rf"tokens/{ref.version}/shard_000001\.npy: sha256 mismatch"):
            store.verify(ref.kind, ref.version)
        with pytest.raises(StoreError, match=rf"tokens/{ref.version}/shard_000001\.npy: sha256 mismatch"):
            store.local_dir(ref.kind, ref.version)  # reads verify by default
        with pytest.raises(StoreError, match=r"shard_000001\.npy: sha256 mismatch"):
            check_shards(
                store.local_dir(ref.kind, ref.version, verify="size"), store.manifest(ref.kind, ref.version)["meta"]
            )
        with open(path, "ab") as f:
            f.write(b"\x00\x00")  # appended data: the cheap size check already sees it
        with pytest.raises(StoreError, match=r"shard_000001\.npy: .* bytes, manifest says"):
            store.local_dir(ref.kind, ref.version)
    finally:
        with open(path, "wb") as f:
            f.write(original)
    store.verify(ref.kind, ref.version, strict=True)


# --------------------------------------------------------------------------- huge line
_BIG_LINE = textwrap.dedent("""
    import json, os, resource, sys
    path, store_dir, n_mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
    words = b"the quick brown fox jumps over the lazy dog 0123456789 "
    with open(path, "wb") as f:
        rep = words * ((n_mb << 20) // len(words) // 64)
        for _ in range(64):
            f.write(rep)
        f.write(b"\\nand a short second line\\n")
    size = os.path.getsize(path)
    from pipeline_lib import stages
    from pipeline_lib.corpus import CorpusConfig
    from pipeline_lib.store import ArtifactStore
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    store = ArtifactStore(store_dir)
    cfg = CorpusConfig(sources=(path,), n_shards=2)
    corpus = stages.shard_corpus(store, stages.download_corpus(store, cfg), cfg)
    shard_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    cc = stages.CountConfig()
    for i in range(len(store.manifest("corpus", corpus.version)["meta"]["shards"])):
        stages.count_shard(store, corpus, i, cc)
    tok = stages.learn_tokenizer(store, stages.reduce_counts(store, corpus, cc), stages.TokenizerConfig(vocab_size=300))
    ec = stages.EncodeConfig()
    n = len(store.manifest("corpus", corpus.version)["meta"]["shards"])
    for i in range(n):
        stages.encode_shard(store, corpus, tok, i, ec)
    tokens = stages.publish_tokens(store, corpus, tok, ec)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    meta = store.manifest("corpus", corpus.version)["meta"]
    print(json.dumps({"size": size, "base": base, "shard_peak": shard_peak, "peak": peak, "n_docs": meta["n_docs"],
                      "longest": max(s["n_bytes"] for s in meta["shards"]),
                      "n_tokens": store.manifest("tokens", tokens.version)["meta"]["totals"]["n_tokens"]}))
""")


def test_one_100mb_line(tmp_path):
    """A single 100 MB line goes through ingest, shard, count and encode with memory a few
    times the line (measured in a fresh process: peak RSS above the post-import baseline)."""
    proc = subprocess.run(
        [sys.executable, "-c", _BIG_LINE, str(tmp_path / "line.txt"), str(tmp_path / "store"), "100"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    line = r["size"] - len(b"and a short second line\n") - 1
    assert r["n_docs"] == 2 and r["longest"] == line
    assert r["n_tokens"] > 0
    shard_x = (r["shard_peak"] - r["base"]) / line
    total_x = (r["peak"] - r["base"]) / line
    print(f"100 MB line: ingest+shard peak +{shard_x:.1f}x the line, whole chain +{total_x:.1f}x")
    assert shard_x < 5, f"ingest+shard used {shard_x:.1f}x the line"
    assert total_x < 8, f"the chain used {total_x:.1f}x the line"


def test_text_field_errors_name_the_flag(store, tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b'{"body": "no text here"}\n')
    with pytest.raises(InputError, match=r"a\.jsonl:1: record has no 'text' field.*--text-field"):
        ingest(store, tmp_path / "a.jsonl")
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "a.parquet")
    with pytest.raises(InputError, match=r"a\.parquet: no column 'text'.*--text-field"):
        ingest(store, tmp_path / "a.parquet")
    with pytest.raises(InputError, match=r"--text-field"):
        CorpusConfig(text_field="")
