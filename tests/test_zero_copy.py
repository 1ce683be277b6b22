"""Documents as (buffer, offsets): the native buffer entry points equal the list ones, bad
offsets are refused, and counting / encoding a shard a `DocBatch` at a time gives what the
list API gives."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline_lib import _tokcore as tokcore
from pipeline_lib import stages
from pipeline_lib.corpus import CorpusConfig, DocBatch, iter_shard_batches, iter_shard_buffers
from pipeline_lib.counting import BoundedCounts, CountConfig, count_shard
from pipeline_lib.store import ArtifactStore
from pipeline_lib.token_shards import EncodeConfig, encode_documents, encode_shard_file, sha256_documents
from pipeline_lib.tokenizer import PieceCounts, Tokenizer, native

PROP = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
# Documents: ASCII, multi-byte characters, invalid UTF-8 bytes, empty ones.
piece = st.one_of(
    st.text(alphabet="ab c\n\t'1.", max_size=20).map(str.encode),
    st.text(max_size=12).map(str.encode),
    st.binary(max_size=12),
    st.sampled_from([b"\xff\xfe", b"\xe2\x82", b"caf\xc3\xa9", "日本語 ".encode(), "👍🏽".encode()]),
)
documents = st.lists(st.lists(piece, max_size=6).map(b"".join), max_size=30)


@pytest.fixture(scope="module")
def tokenizer(shakespeare_text) -> Tokenizer:
    return Tokenizer.train([shakespeare_text[:200_000]], vocab_size=700, pattern="cl100k", workers=1)


@pytest.fixture(scope="module")
def shards(tmp_path_factory, shakespeare_text, multilingual_text):
    """Two corpus shards of a mixed corpus, written by `shard_corpus`."""
    src = tmp_path_factory.mktemp("src") / "corpus.txt"
    src.write_text(shakespeare_text + multilingual_text, encoding="utf-8")
    store = ArtifactStore(str(tmp_path_factory.mktemp("store")))
    config = CorpusConfig(sources=(str(src),), n_shards=2)
    corpus = stages.shard_corpus(store, stages.download_corpus(store, config), config)
    return [store.local_file(corpus.kind, corpus.version, s["file"]) for s in stages.corpus_shards(store, corpus)]


def as_buffer(docs: list[bytes], lead: bytes = b"") -> tuple[bytes, np.ndarray]:
    """The documents after `lead` in one buffer: offsets need not start at 0."""
    offsets = np.cumsum([len(lead)] + [len(d) for d in docs], dtype=np.int64)
    return lead + b"".join(docs), offsets


def counts_of(counter) -> tuple[list[bytes], list[int], int]:
    pieces, counts = counter.to_arrays()
    return pieces, counts.tolist(), counter.total


@PROP
@given(docs=documents, lead=st.binary(max_size=5), pattern=st.sampled_from(["gpt2", "cl100k", "o200k"]))
def test_add_buffer_counts_what_add_batch_counts(docs, lead, pattern):
    by_list, by_buffer = (
        tokcore.PieceCounter(tokcore.PATTERN_IDS[pattern]),
        tokcore.PieceCounter(tokcore.PATTERN_IDS[pattern]),
    )
    by_list.add_batch(docs)
    by_buffer.add_buffer(*as_buffer(docs, lead))
    assert counts_of(by_buffer) == counts_of(by_list)


@PROP
@given(docs=documents, lead=st.binary(max_size=5), threads=st.sampled_from([1, 2]))
def test_encode_ordinary_buffer_equals_encode_ordinary_batch(tokenizer, docs, lead, threads):
    data, offsets = as_buffer(docs, lead)
    ids, ends = tokenizer._encoder.encode_ordinary_buffer(data, offsets, threads)
    ref_ids, ref_ends = tokenizer._encoder.encode_ordinary_batch(docs, threads)
    assert ids.dtype == np.uint32 and ends.dtype == np.uint64
    assert ids.tolist() == ref_ids.tolist() and ends.tolist() == ref_ends.tolist()


def test_buffer_entry_points_on_a_one_megabyte_document_and_any_buffer_type(tokenizer, multilingual_text):
    big = (multilingual_text.encode() * 20)[: 1 << 20] + b"\xff tail"
    docs = [b"", big, b"x", b""]
    data, offsets = as_buffer(docs, b"lead")
    ref_ids, ref_ends = tokenizer.encode_ordinary_batch_to_numpy(docs, 2)
    for buffer in (data, memoryview(data), np.frombuffer(data, dtype=np.uint8), bytearray(data)):
        ids, ends = tokenizer.encode_ordinary_buffer_to_numpy(buffer, offsets, 2)
        assert np.array_equal(ids, ref_ids) and np.array_equal(ends, ref_ends)
    counter, reference = tokcore.PieceCounter(1), tokcore.PieceCounter(1)
    counter.add_buffer(memoryview(data), offsets.astype(np.uint64))
    reference.add_batch(docs)
    assert counts_of(counter) == counts_of(reference)


def test_bad_offsets_are_refused_and_leave_the_counter_usable(tokenizer):
    data = b"hello world"
    counter = tokcore.PieceCounter(1)
    for offsets, message in [
        ([0, 5, 3], "non-decreasing"),
        ([0, 12], "past the end of data"),
        ([-1, 3], "must be >= 0"),
        ([], "at least one"),
        (np.zeros((2, 2), np.int64), "one-dimensional"),
    ]:
        with pytest.raises(ValueError, match=message):
            counter.add_buffer(data, offsets)
        with pytest.raises(ValueError, match=message):
            tokenizer._encoder.encode_ordinary_buffer(data, offsets, 1)
    with pytest.raises(TypeError, match="integers"):
        counter.add_buffer(data, [0.0, 5.0])
    with pytest.raises(TypeError, match="bytes-like"):
        counter.add_buffer("hello", [0, 5])
    counter.add_buffer(data, [0, 5, 11])
    assert counts_of(counter) == ([b" world", b"hello"], [1, 1], 2)
    ids, ends = tokenizer._encoder.encode_ordinary_buffer(data, [3], 1)  # no documents
    assert len(ids) == 0 and ends.tolist() == [0]


def test_python_split_paths_take_buffers_too(shakespeare_text):
    """A custom regex (split in Python) and the word unit fall back to the list of documents."""
    docs = [b"Hello there, friend!", b"", b"caf\xc3\xa9 \xff ok", b"a b c"]
    data, offsets = as_buffer(docs, b"xx")
    for tok in (
        Tokenizer.train([shakespeare_text[:50_000]], vocab_size=300, pattern=r"\w+|\s+|[^\w\s]+", workers=1),
        Tokenizer.train([shakespeare_text[:50_000]], vocab_size=300, unit="word", workers=1),
    ):
        ids, ends = tok.encode_ordinary_buffer_to_numpy(data, offsets, 1)
        ref_ids, ref_ends = tok.encode_ordinary_batch_to_numpy(docs, 1)
        assert np.array_equal(ids, ref_ids) and np.array_equal(ends, ref_ends)
        with pytest.raises(ValueError, match="non-decreasing"):
            tok.encode_ordinary_buffer_to_numpy(data, offsets[::-1], 1)


@PROP
@given(
    docs=st.lists(st.one_of(st.binary(max_size=200), st.integers(50, 130).map(lambda n: b"x" * n)), max_size=20),
    lead=st.binary(max_size=3),
)
def test_sha256_documents_equals_hashlib(docs, lead, monkeypatch):
    """Every padding case (lengths around 55/56 and 64 bytes included), with the CPU's SHA
    instructions and without, and the pure-Python fallback."""
    data, offsets = as_buffer(docs, lead)
    expected = b"".join(hashlib.sha256(d).digest() for d in docs)
    assert tokcore.sha256_documents(data, offsets) == expected
    assert tokcore.sha256_documents(data, offsets, portable=True) == expected
    batch = DocBatch(memoryview(data), offsets)
    assert sha256_documents(batch) == expected
    with monkeypatch.context() as patch:
        patch.setattr(native, "_CORE", None)
        assert sha256_documents(batch) == expected


def test_sha256_of_a_big_document_and_bad_offsets():
    big = os.urandom((1 << 20) + 17)
    assert (
        tokcore.sha256_documents(big, [0, len(big), len(big)])
        == hashlib.sha256(big).digest() + hashlib.sha256(b"").digest()
    )
    with pytest.raises(ValueError, match="non-decreasing"):
        tokcore.sha256_documents(big, [5, 4])


@PROP
@given(docs=documents)
def test_doc_batch_from_docs_round_trips(docs):
    batch = DocBatch.from_docs(docs, [f"s{i}" for i in range(len(docs))])
    assert batch.docs() == docs and len(batch) == len(docs) and batch.n_bytes == sum(map(len, docs))
    assert batch.lengths().tolist() == [len(d) for d in docs] and batch.sources.to_pylist() == [
        f"s{i}" for i in range(len(docs))
    ]


@pytest.mark.parametrize("batch_bytes", [4 << 20, 20_000])
def test_shard_buffers_hold_the_shard_in_batches_of_about_batch_bytes(shards, batch_bytes):
    batches = list(iter_shard_buffers(shards[0], batch_bytes=batch_bytes, with_source=True))
    reference = list(iter_shard_batches(shards[0], with_source=True))
    assert [d for b in batches for d in b.docs()] == [d for docs, _ in reference for d in docs]
    assert [s for b in batches for s in b.sources.to_pylist()] == [s for _, sources in reference for s in sources]
    sizes = [b.n_bytes for b in batches]
    row_groups = pq.ParquetFile(shards[0]).num_row_groups
    assert len(batches) >= sum(sizes) // (2 * batch_bytes) and max(sizes) <= 2 * batch_bytes
    assert len(batches) <= row_groups + 2 * sum(sizes) // batch_bytes  # no tiny batches beyond one per row group


@pytest.mark.parametrize("pattern", ["cl100k", "gpt2", r"\w+|\W+"], ids=["cl100k", "gpt2", "regex"])
def test_count_shard_counts_what_the_list_api_counts(shards, pattern):
    config = CountConfig(pattern=pattern)
    for path in shards[:1] if pattern.startswith("\\") else shards:  # the regex is split in Python: one shard
        reference = PieceCounts(pattern)
        for docs in iter_shard_batches(path):
            reference.add_documents(docs)
        ref_pieces, ref_counts = reference.to_arrays()
        pieces, counts, record = count_shard(path, config)
        assert pieces == ref_pieces and counts.tolist() == ref_counts.tolist() and record == {}
        small_batches = BoundedCounts(config, "a shard")  # offsets that do not start at 0
        for batch in iter_shard_buffers(path, batch_bytes=20_000):
            small_batches.add_batch(batch)
        pieces, counts = small_batches.to_arrays()
        assert pieces == ref_pieces and counts.tolist() == ref_counts.tolist()


@pytest.mark.parametrize("placement", ["append", "prepend"])
def test_encode_shard_file_writes_what_the_list_api_gives(tmp_path, tokenizer, shards, placement):
    config = EncodeConfig(placement=placement, workers=1)
    sep = tokenizer.special_tokens["<|endoftext|>"]
    path = shards[1]
    docs, sources = [], []
    for batch_docs, batch_sources in iter_shard_batches(path, with_source=True):
        docs += batch_docs
        sources += batch_sources
    flat, offsets = tokenizer.encode_ordinary_batch_to_numpy(docs, 1)
    per_doc = [flat[a:b].tolist() for a, b in zip(offsets.tolist(), offsets[1:].tolist())]
    expected = [t for ids in per_doc for t in ([sep, *ids] if placement == "prepend" else [*ids, sep])]
    ends = np.cumsum([len(ids) + 1 for ids in per_doc])

    whole = [str(tmp_path / f) for f in ("t.npy", "t.idx.npy", "t.docs.parquet")]
    small = [str(tmp_path / f) for f in ("s.npy", "s.idx.npy", "s.docs.parquet")]
    batches = iter_shard_buffers(path, batch_bytes=20_000, with_source=True)  # offsets that do not start at 0
    for out, stats in [
        (
            whole,
            encode_shard_file(tokenizer, path, *whole[:2], config, "shard_000001", shard=1, doc_table_path=whole[2]),
        ),
        (
            small,
            encode_documents(tokenizer, batches, *small[:2], config, "shard_000001", doc_table_path=small[2], shard=1),
        ),
    ]:
        assert np.load(out[0], allow_pickle=False).tolist() == expected
        assert np.load(out[1], allow_pickle=False).tolist() == ends.tolist()
        assert (stats.n_docs, stats.n_tokens, stats.n_bytes) == (len(docs), len(expected), sum(map(len, docs)))
        table = pq.read_table(out[2]).to_pydict()
        assert table["shard"] == [1] * len(docs) and table["start"] == (ends - np.diff(ends, prepend=0)).tolist()
        assert table["n_tokens"] == [len(ids) + 1 for ids in per_doc] and table["n_bytes"] == [len(d) for d in docs]
        assert table["source"] == sources and table["text_sha256"] == [hashlib.sha256(d).digest() for d in docs]

    plain = [str(tmp_path / f) for f in ("p.npy", "p.idx.npy")]
    encode_shard_file(tokenizer, path, *plain, EncodeConfig(separator=None, workers=2), "shard_000001")
    assert np.load(plain[0], allow_pickle=False).tolist() == flat.tolist() and not os.path.exists(
        tmp_path / "p.docs.parquet"
    )
    assert np.load(plain[1], allow_pickle=False).tolist() == offsets[1:].tolist()
