"""Token shards: format, separators, document index and table, checker, reader, exports."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline_lib import stages, token_shards
from pipeline_lib.corpus import CorpusConfig, iter_shard_batches
from pipeline_lib.fsio import InputError
from pipeline_lib.store import ArtifactStore
from pipeline_lib.token_shards import (
    EncodeConfig,
    check_shards,
    encode_documents,
    export_llmc,
    export_nanogpt,
    open_tokens,
    token_dtype,
)
from pipeline_lib.tokenizer import Tokenizer

EOT = "<|endoftext|>"


def byte_tokenizer(sep_id: int = 256) -> Tokenizer:
    """Byte-level: token id = byte value; the separator gets `sep_id`."""
    return Tokenizer({bytes([i]): i for i in range(256)}, "gpt2", {EOT: sep_id})


def write_shards(directory, shards_docs, tok, config, doc_table=True) -> dict:
    """Encode lists of documents into a token directory; return the manifest meta."""
    os.makedirs(directory, exist_ok=True)
    records = []
    for i, docs in enumerate(shards_docs):
        name = f"shard_{i:06d}"
        paths = [os.path.join(directory, f"{name}{ext}") for ext in (".npy", ".idx.npy", ".docs.parquet")]
        batches = [(docs[j : j + 3], [f"src{j}"] * len(docs[j : j + 3])) for j in range(0, len(docs), 3)]
        if not doc_table:
            batches = [b[0] for b in batches]
        stats = encode_documents(
            tok, batches, paths[0], paths[1], config, name, doc_table_path=paths[2] if doc_table else None, shard=i
        )
        files = {}
        for p in paths[: 3 if doc_table else 2]:
            data = open(p, "rb").read()
            files[os.path.basename(p)] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        records.append(
            {
                "name": name,
                "n_tokens": stats.n_tokens,
                "n_docs": stats.n_docs,
                "n_bytes": stats.n_bytes,
                "sha256": files[f"{name}.npy"]["sha256"],
                "files": files,
                "val_start": stats.val_start,
                "val_docs": stats.val_docs,
            }
        )
    meta = token_shards.build_meta(
        records, {"vocab_size": tok.vocab_size, "special_tokens": tok.special_tokens}, "tokenizer/test", config
    )
    return meta


DOCS = [[b"hello", b"a\x00b", "caf\u00e9".encode(), b"x"], [b"second shard", b"!"]]


@pytest.mark.parametrize("placement", ["append", "prepend"])
def test_encode_separators_index_and_doc_table(tmp_path, placement):
    tok = byte_tokenizer()
    cfg = EncodeConfig(separator=EOT, placement=placement)
    meta = write_shards(tmp_path, DOCS, tok, cfg)
    assert meta["dtype"] == "uint16" and meta["separator"] == {"token": EOT, "id": 256, "placement": placement}
    assert check_shards(str(tmp_path), meta) == {"n_tokens": sum(len(d) + 1 for s in DOCS for d in s), "n_docs": 6}
    tokens = open_tokens(str(tmp_path / "shard_000000.npy"))
    assert isinstance(tokens, np.memmap) and tokens.dtype == np.dtype("<u2")
    expected = []
    for d in DOCS[0]:
        ids = list(d)
        expected += ids + [256] if placement == "append" else [256] + ids
    assert tokens.tolist() == expected
    index = np.load(tmp_path / "shard_000000.idx.npy", allow_pickle=False)
    assert index.dtype == np.dtype("<u8") and index.tolist() == [6, 10, 16, 18]
    table = pq.read_table(tmp_path / "shard_000000.docs.parquet").to_pydict()
    assert table["start"] == [0, 6, 10, 16] and table["n_tokens"] == [6, 4, 6, 2]
    assert table["n_bytes"] == [len(d) for d in DOCS[0]] and table["shard"] == [0] * 4
    assert table["source"] == ["src0", "src0", "src0", "src3"]
    assert table["text_sha256"] == [hashlib.sha256(d).digest() for d in DOCS[0]]
    # Every document decodes back to its bytes (NUL included).
    for start, n, d in zip(table["start"], table["n_tokens"], DOCS[0]):
        ids = [t for t in tokens[start : start + n].tolist() if t != 256]
        assert tok.decode_bytes(ids) == d


def test_uint32_when_the_vocabulary_is_large(tmp_path):
    tok = byte_tokenizer(sep_id=70_000)
    assert token_dtype(tok.vocab_size) == np.dtype("<u4") and token_dtype(65_536) == np.dtype("<u2")
    meta = write_shards(tmp_path, DOCS, tok, EncodeConfig(doc_table=False))
    assert meta["dtype"] == "uint32"
    tokens = open_tokens(str(tmp_path / "shard_000001.npy"))
    assert tokens.dtype == np.dtype("<u4") and tokens[-1] == 70_000
    check_shards(str(tmp_path), meta)
    with pytest.raises(InputError, match="uint16"):
        export_nanogpt(str(tmp_path), meta, str(tmp_path / "out"))


def test_no_separator(tmp_path):
    meta = write_shards(tmp_path, DOCS, byte_tokenizer(), EncodeConfig(separator=None))
    assert meta["separator"] is None
    assert open_tokens(str(tmp_path / "shard_000001.npy")).tolist() == list(b"second shard!")
    assert np.load(tmp_path / "shard_000001.idx.npy").tolist() == [12, 13]
    check_shards(str(tmp_path), meta)


def test_unknown_separator(tmp_path):
    with pytest.raises(InputError, match="not a special token"):
        write_shards(tmp_path, DOCS, byte_tokenizer(), EncodeConfig(separator="<|nope|>"))


# --------------------------------------------------------------------------- checker
def _tamper(tmp_path, meta, how):
    p = tmp_path / "shard_000000.npy"
    if how == "out-of-vocab":
        a = np.load(p, allow_pickle=False)
        a[1] = 300
        np.save(p, a)
        return "outside the vocabulary"
    if how == "lost-separator":
        a = np.load(p, allow_pickle=False)
        a[5] = 7
        np.save(p, a)
        return "lacks the separator"
    if how == "extra-separator":
        a = np.load(p, allow_pickle=False)
        a[0] = 256
        np.save(p, a)
        return "occurs 5 times for 4 documents"
    if how == "index-not-increasing":
        np.save(tmp_path / "shard_000000.idx.npy", np.array([6, 4, 16, 18], dtype="<u8"))
        return "not strictly increasing"
    if how == "index-dtype":
        np.save(tmp_path / "shard_000000.idx.npy", np.array([6, 10, 16, 18], dtype="<i8"))
        return "shard_000000.idx.npy"
    if how == "totals":
        meta["totals"]["n_tokens"] += 1
        return "totals say"
    if how == "count":
        meta["shards"][0]["n_tokens"] = 99
        return "manifest says 99"
    if how == "hash":
        a = np.load(p, allow_pickle=False)
        a[1], a[2] = a[2], a[1]  # same ids, same counts: only the hash notices
        np.save(p, a)
        return "sha256 does not match"
    if how == "doc-table":
        t = pq.read_table(tmp_path / "shard_000000.docs.parquet")
        pq.write_table(t.slice(0, 3), tmp_path / "shard_000000.docs.parquet")
        return "3 rows for 4 documents"
    raise AssertionError(how)


@pytest.mark.parametrize(
    "how",
    [
        "out-of-vocab",
        "lost-separator",
        "extra-separator",
        "index-not-increasing",
        "index-dtype",
        "totals",
        "count",
        "hash",
        "doc-table",
    ],
)
def test_check_shards_finds_damage(tmp_path, how):
    meta = write_shards(tmp_path, DOCS, byte_tokenizer(), EncodeConfig())
    check_shards(str(tmp_path), meta)
    match = _tamper(tmp_path, meta, how)
    with pytest.raises(InputError, match=match):
        check_shards(str(tmp_path), meta)


# --------------------------------------------------------------------------- exports
@pytest.mark.parametrize("val_fraction", [0.0, 0.25, 0.5])
def test_export_nanogpt_reproduces_the_tokens(tmp_path, val_fraction):
    docs = [[f"document {i} ".encode() * (1 + i % 5) for i in range(40)], [f"more {i}".encode() for i in range(25)]]
    meta = write_shards(tmp_path / "tok", docs, byte_tokenizer(), EncodeConfig(val_fraction=val_fraction))
    assert meta["split"]["val_fraction"] == val_fraction  # decided at encoding, recorded per shard
    written = export_nanogpt(str(tmp_path / "tok"), meta, str(tmp_path / "out"))
    train = (
        np.memmap(tmp_path / "out" / "train.bin", dtype=np.uint16, mode="r")
        if written["train"]
        else np.zeros(0, np.uint16)
    )
    val = (
        np.memmap(tmp_path / "out" / "val.bin", dtype=np.uint16, mode="r") if written["val"] else np.zeros(0, np.uint16)
    )
    shards = [np.load(tmp_path / "tok" / f"shard_00000{i}.npy") for i in range(2)]
    cuts = [s["val_start"] for s in meta["shards"]]
    # train.bin: each shard's head, val.bin: each shard's tail (its last documents), in shard order
    assert np.array_equal(train, np.concatenate([t[:c] for t, c in zip(shards, cuts)]))
    assert np.array_equal(val, np.concatenate([t[c:] for t, c in zip(shards, cuts)]))
    assert written == {"train": len(train), "val": len(val)}
    if val_fraction == 0:
        assert len(val) == 0
    else:
        assert abs(len(val) / sum(map(len, shards)) - val_fraction) < 0.05
        assert all(t[c - 1] == 256 for t, c in zip(shards, cuts)) and val[-1] == 256  # cuts on document boundaries
    assert not [p for p in os.listdir(tmp_path / "out") if p.startswith(".tmp")]


def test_export_llmc_header(tmp_path):
    meta = write_shards(tmp_path / "tok", DOCS, byte_tokenizer(), EncodeConfig())
    written = export_llmc(str(tmp_path / "tok"), meta, str(tmp_path / "out"))
    raw = np.fromfile(tmp_path / "out" / "tokens_train.bin", dtype="<i4", count=256)
    assert raw[0] == 20240520 and raw[1] == 1 and raw[2] == written["train"]
    body = np.fromfile(tmp_path / "out" / "tokens_train.bin", dtype="<u2", offset=1024)
    assert len(body) == written["train"]


def test_export_nanogpt_meta_pkl_as_train_py_reads_it(tmp_path):
    import pickle

    tok = byte_tokenizer(sep_id=300)  # vocabulary 301 ids, not nanoGPT's default 50304
    meta = write_shards(tmp_path / "tok", DOCS, tok, EncodeConfig(val_fraction=0.3))
    export_nanogpt(str(tmp_path / "tok"), meta, str(tmp_path / "out"))
    # nanoGPT's train.py: meta = pickle.load(f); meta_vocab_size = meta['vocab_size']
    with open(tmp_path / "out" / "meta.pkl", "rb") as f:
        nano = pickle.load(f)
    # padded to a multiple of 64
    assert nano["unpadded_vocab_size"] == tok.vocab_size == 301 and nano["vocab_size"] == 320
    assert nano == {
        "vocab_size": 320,
        "unpadded_vocab_size": 301,
        "dtype": "uint16",
        "separator": EOT,
        "separator_id": 300,
        "placement": "append",
        "tokenizer": "tokenizer/test",
    }
    assert type(nano) is dict and all(type(v) in (int, str) for v in nano.values())
    train = np.memmap(tmp_path / "out" / "train.bin", dtype=np.uint16, mode="r")
    val = np.memmap(tmp_path / "out" / "val.bin", dtype=np.uint16, mode="r")
    assert int(max(train.max(), val.max())) < nano["vocab_size"]
    assert not [p for p in os.listdir(tmp_path / "out") if p.startswith(".tmp")]


def _documents_with_separators(docs, placement, sep=256):
    """Each document's ids with its separator on the side `placement` gives."""
    return [list(d) + [sep] if placement == "append" else [sep] + list(d) for shard in docs for d in shard]


@pytest.mark.parametrize("exporter", ["nanogpt", "llmc"])
@pytest.mark.parametrize("encoded", ["append", "prepend"])
@pytest.mark.parametrize("wanted", [None, "append", "prepend"])
def test_exports_place_the_separator(tmp_path, exporter, encoded, wanted):
    docs = [[f"document {i} ".encode() * (1 + i % 4) for i in range(30)], [f"more {i}".encode() for i in range(12)]]
    meta = write_shards(
        tmp_path / "tok", docs, byte_tokenizer(), EncodeConfig(separator=EOT, placement=encoded, val_fraction=0.4)
    )
    check_shards(str(tmp_path / "tok"), meta)
    out = tmp_path / "out"
    if exporter == "nanogpt":
        written = export_nanogpt(str(tmp_path / "tok"), meta, str(out), separator_placement=wanted)
        train, val = (np.fromfile(out / f"{s}.bin", dtype="<u2") for s in ("train", "val"))
    else:
        written = export_llmc(str(tmp_path / "tok"), meta, str(out), separator_placement=wanted)
        train, val = (np.fromfile(out / f"tokens_{s}.bin", dtype="<u2", offset=1024) for s in ("train", "val"))
        assert [np.fromfile(out / f"tokens_{s}.bin", dtype="<i4", count=3)[2] for s in ("train", "val")] == [
            len(train),
            len(val),
        ]
    assert written == {"train": len(train), "val": len(val)} and len(val) > 0
    # each shard's first documents are training, its last ones validation (the recorded split)
    heads = [shard[: len(shard) - s["val_docs"]] for shard, s in zip(docs, meta["shards"])]
    tails = [shard[len(shard) - s["val_docs"] :] for shard, s in zip(docs, meta["shards"])]
    assert all(s["val_docs"] > 0 for s in meta["shards"])
    assert train.tolist() == [t for d in _documents_with_separators(heads, wanted or encoded) for t in d]
    assert val.tolist() == [t for d in _documents_with_separators(tails, wanted or encoded) for t in d]


def test_export_placement_needs_a_separator(tmp_path):
    meta = write_shards(tmp_path / "tok", DOCS, byte_tokenizer(), EncodeConfig(separator=None))
    for export in (export_nanogpt, export_llmc):
        with pytest.raises(InputError, match="encoded without a separator"):
            export(str(tmp_path / "tok"), meta, str(tmp_path / "out"), separator_placement="prepend")
        export(str(tmp_path / "tok"), meta, str(tmp_path / "out"))  # as encoded: fine
    with pytest.raises(InputError, match="choose append or prepend"):
        export_llmc(str(tmp_path / "tok"), meta, str(tmp_path / "out"), separator_placement="middle")


# --------------------------------------------------------------------------- stage
def test_encode_stage_on_shakespeare(tmp_path, shakespeare_text):
    store = ArtifactStore(str(tmp_path / "store"))
    src = tmp_path / "c.txt"
    src.write_text(shakespeare_text[:150_000])
    cfg = CorpusConfig(sources=(str(src),), n_shards=2)
    raw = stages.download_corpus(store, cfg)
    corpus = stages.shard_corpus(store, raw, cfg)
    cc = stages.CountConfig()
    for i in range(2):
        stages.count_shard(store, corpus, i, cc)
    tok_ref = stages.learn_tokenizer(
        store, stages.reduce_counts(store, corpus, cc), stages.TokenizerConfig(vocab_size=400)
    )
    ec = EncodeConfig()
    for i in range(2):
        stages.encode_shard(store, corpus, tok_ref, i, ec)
    ref = stages.publish_tokens(store, corpus, tok_ref, ec)
    m = store.verify(ref.kind, ref.version, strict=True)
    meta = m["meta"]
    assert meta["sources"][0]["sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()
    assert meta["tokenizer"]["version"] == tok_ref.key and meta["encoder"]["params"] == ec.params()
    assert m["parents"] == {"corpus": corpus.key, "tokenizer": tok_ref.key}
    d = store.local_dir(ref.kind, ref.version)
    check_shards(d, meta)
    tok = stages.load_tokenizer(store, tok_ref)
    sep = meta["separator"]["id"]
    cdir = store.local_dir(corpus.kind, corpus.version)
    for shard, cshard in zip(meta["shards"], store.manifest(corpus.kind, corpus.version)["meta"]["shards"]):
        tokens = open_tokens(os.path.join(d, f"{shard['name']}.npy"))
        ends = np.load(os.path.join(d, f"{shard['name']}.idx.npy")).astype(np.int64)
        docs = [doc for batch in iter_shard_batches(os.path.join(cdir, cshard["file"])) for doc in batch]
        assert len(docs) == len(ends)
        starts = np.concatenate([[0], ends[:-1]])
        for j in (0, len(docs) // 2, len(docs) - 1):
            ids = tokens[starts[j] : ends[j]].tolist()
            assert ids[-1] == sep and tok.decode_bytes(ids[:-1]) == docs[j]


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 5), max_size=12), fraction=st.sampled_from([0.0, 0.1, 0.25, 0.33, 0.5, 0.9, 1.0])
)
def test_val_start_is_the_nearest_document_boundary(lengths, fraction):
    from pipeline_lib.token_shards import val_start

    ends = np.cumsum(lengths, dtype=np.uint64)
    n_tokens = int(ends[-1]) if lengths else 0
    boundaries = [0, *ends.tolist()]
    target = (1.0 - fraction) * n_tokens
    nearest = min(boundaries, key=lambda b: abs(b - target))  # the first (smallest) on a tie
    assert val_start(ends, n_tokens, fraction) == (n_tokens if fraction == 0 or n_tokens == 0 else nearest)


@settings(max_examples=300, deadline=None)
@given(lengths=st.lists(st.integers(1, 6), min_size=1, max_size=20), data=st.data())
def test_separator_positions_of_a_token_range(lengths, data):
    from pipeline_lib.token_checks import _separator_positions

    ends = np.cumsum(lengths, dtype=np.uint64)
    start = data.draw(st.integers(0, int(ends[-1])))
    stop = data.draw(st.integers(start, int(ends[-1])))
    for placement, every in (("append", [e - 1 for e in ends.tolist()]), ("prepend", [0, *ends.tolist()[:-1]])):
        assert _separator_positions(ends, placement, start, stop).tolist() == [p for p in every if start <= p < stop]


@pytest.mark.parametrize("chunk", [1, 3, 1 << 20])
def test_index_order_is_checked_across_chunks(monkeypatch, chunk):
    from pipeline_lib import token_checks

    monkeypatch.setattr(token_checks, "_INDEX_CHUNK", chunk)
    check = token_checks._strictly_increasing_from_one
    assert check(np.array([1, 2, 5, 9], dtype=np.uint64))
    assert not check(np.array([0, 2, 5], dtype=np.uint64))  # a first document of no tokens
    assert not check(np.array([1, 2, 2, 9], dtype=np.uint64))
    assert not check(np.array([1, 4, 3, 9], dtype=np.uint64))  # down across a chunk boundary when chunk is 1 or 3
