"""The fast sharder: the native document scanner, the batched shard plan and writer give the
same documents, stats and shard decisions as the per-document reader (`_iter_docs`) and
`_ShardPlan.place`, on tricky inputs; and the sharder's time grows linearly."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import tempfile

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_growth import FACTOR, LIMIT, growth

from pipeline_lib import corpus
from pipeline_lib.corpus import (
    CorpusConfig,
    DecodeStats,
    SourceBatch,
    _ShardPlan,
    iter_documents,
    iter_shard_batches,
)
from pipeline_lib.fsio import InputError
from pipeline_lib.stages import download_corpus, shard_corpus
from pipeline_lib.store import ArtifactStore

native = pytest.mark.skipif(corpus._SCAN is None, reason="the compiled core is not built")

# Pieces that exercise every rule: line ends, ASCII whitespace bytes.strip() knows, NUL,
# a BOM, valid multi-byte characters, and each kind of invalid UTF-8 Python refuses.
TEXT = [
    b"a", b"word", b" ", b"\t", b"\n", b"\n", b"\n", b"\r", b"\r\n", b"\x0b", b"\x0c", b"\x1c", b"\x00", b"\x85",
    b"\xef\xbb\xbf", b"\xc3\xa9", b"\xe2\x82\xac", b"\xf0\x9f\x9a\x80",
]  # fmt: skip
INVALID = [
    b"\xff",
    b"\xc3",
    b"\xe2\x82",
    b"\xed\xa0\x80",
    b"\xc0\xaf",
    b"\xe0\x80\xaf",
    b"\xf4\x90\x80\x80",
    b"\xf8\x88\x80\x80\x80",
]
# mostly text: a file with too many invalid bytes or NULs is refused as binary before any document
pieces = st.lists(st.sampled_from(TEXT * 4 + INVALID), max_size=60)


def documents(path: str, name: str, config: CorpusConfig, reader) -> tuple[list[tuple[bytes, int]] | str, DecodeStats]:
    """(document, position) pairs of a source through `reader`, or the InputError's message."""
    stats = DecodeStats()
    try:
        if reader == "per-document":
            return list(corpus._iter_docs(path, name, config, stats)), stats
        out: list[tuple[bytes, int]] = []
        for batch in corpus._iter_batches(path, name, config, stats):
            data = bytes(memoryview(batch.data).cast("B"))
            out += [(data[batch.offsets[k] : batch.offsets[k + 1]], int(batch.ends[k])) for k in range(len(batch))]
        return out, stats
    except InputError as e:
        return str(e), DecodeStats()  # counts of a failed read do not matter


@native
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pieces=pieces,
    documents_mode=st.sampled_from(["line", "paragraph"]),
    errors=st.sampled_from(["replace", "skip-document", "fail"]),
    block=st.sampled_from([1, 3, 8, 1 << 20]),
)
def test_scanner_matches_the_per_document_reader(pieces, documents_mode, errors, block):
    """Same documents, positions, stats and errors, whatever the block size (blocks of 1 byte
    carry every line into the next one)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "s.txt")
        with open(path, "wb") as f:
            f.write(b"".join(pieces))
        config = CorpusConfig(sources=(path,), documents=documents_mode, errors=errors)
        expected = documents(path, "s.txt", config, "per-document")
        saved = corpus._BLOCK_BYTES
        corpus._BLOCK_BYTES = block
        try:
            got = documents(path, "s.txt", config, "batches")
        finally:
            corpus._BLOCK_BYTES = saved
    assert got == expected


@native
@settings(max_examples=500, deadline=None)
@given(
    data=st.one_of(st.binary(max_size=40), st.lists(st.sampled_from(TEXT[13:] + INVALID), max_size=12).map(b"".join))
)
def test_utf8_check_is_pythons(data):
    from pipeline_lib import _tokcore

    data = data.replace(b"\n", b"") + b"x"  # one line, never blank
    packed, offsets, ends, consumed, lines, chars, empty, invalid, _ = _tokcore.scan_documents(data, 0, True)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        assert invalid.tolist() == [0] and chars == 0
    else:
        assert invalid.tolist() == [] and chars == len(text)
    assert bytes(packed) == data.rstrip(b"\r") and offsets.tolist() == [0, len(packed)] and ends.tolist() == [len(data)]
    assert (consumed, lines, empty) == (len(data), 0, 0)


@native
def test_scanner_carries_incomplete_lines_and_paragraphs():
    from pipeline_lib import _tokcore

    packed, offsets, ends, consumed, lines, chars, empty, invalid, invalid_lines = _tokcore.scan_documents(
        bytearray(b"ab\r\n \x0c\n\xffc\nlast"), 0, False
    )
    assert (bytes(packed), offsets.tolist(), ends.tolist()) == (b"ab\xffc", [0, 2, 4], [4, 10])
    assert (consumed, lines, chars, empty, invalid.tolist(), invalid_lines.tolist()) == (10, 3, 2, 1, [1], [2])
    packed, offsets, ends, consumed, lines, *_ = _tokcore.scan_documents(
        memoryview(b"p1\nl2\n \x0b\np2\n\np3\nopen"), 1, False
    )
    assert (bytes(packed), offsets.tolist(), ends.tolist(), consumed, lines) == (b"p1\nl2p2", [0, 5, 7], [6, 12], 13, 5)
    with pytest.raises(ValueError, match="mode"):
        _tokcore.scan_documents(b"x", 2, True)
    with pytest.raises(TypeError):
        _tokcore.scan_documents("text", 0, True)


@native
def test_scanner_is_interruptible():
    """Ctrl-C (here a timer's KeyboardInterrupt) stops a scan in the middle (64 MB of empty lines take ~0.4 s)."""
    from pipeline_lib import _tokcore

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    data = b"\n" * (64 << 20)
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.02)
        with pytest.raises(KeyboardInterrupt):
            _tokcore.scan_documents(data, 0, True)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert _tokcore.scan_documents(b"a\n\n", 0, True)[6] == 1  # the next call works


# --------------------------------------------------------------------------- the plan
def plan_by_document(total: int, n: int, steps) -> tuple[list[tuple[int, bool, bool, bool]], bool]:
    """The shard closes of `_ShardPlan.place` called document by document: (document index,
    before, after, oversize) where one closes, and the final oversize flag."""
    plan, events, k = _ShardPlan(total, n), [], 0
    for step in steps:
        if step[0] == "skip":
            plan.skip(step[1])
            continue
        for size in step[1]:
            before, after = plan.place(size)
            if before or after:
                events.append((k, before, after, plan.oversize))
            k += 1
    return events, plan.oversize


def plan_by_batch(total: int, n: int, steps) -> tuple[list[tuple[int, bool, bool, bool]], bool]:
    plan, events, k = _ShardPlan(total, n), [], 0
    for step in steps:
        if step[0] == "skip":
            plan.skip(step[1])
            continue
        events += [(k + i, *rest) for i, *rest in plan.place_batch(np.array(step[1], dtype=np.int64))]
        k += len(step[1])
    return events, plan.oversize


sizes = st.one_of(st.integers(1, 50), st.integers(1, 10**6), st.sampled_from([1, 10**9]))
steps = st.lists(
    st.one_of(
        st.tuples(st.just("batch"), st.lists(sizes, max_size=30)), st.tuples(st.just("skip"), st.integers(0, 100))
    ),
    max_size=8,
)


@settings(max_examples=500, deadline=None)
@given(steps=steps, n=st.integers(1, 12), slack=st.integers(0, 1000))
def test_batched_plan_closes_where_place_does(steps, n, slack):
    total = sum(s for kind, v in steps for s in (v if kind == "batch" else [v])) + slack
    if total == 0:
        total = 1
    assert plan_by_batch(total, n, steps) == plan_by_document(total, n, steps)


def test_batched_plan_on_giant_documents():
    steps = [("batch", [10, 5_000_000, 3, 3, 3]), ("skip", 7), ("batch", [1] * 1000 + [9_000_000, 2])]
    total = 10 + 5_000_000 + 9 + 7 + 1000 + 9_000_002
    for n in (1, 2, 3, 7, 100):
        got = plan_by_batch(total, n, steps)
        assert got == plan_by_document(total, n, steps)
    assert any(oversize for *_, oversize in got[0])


# --------------------------------------------------------------------------- shards
TRICKY = {
    "crlf.txt": b"one\r\ntwo\r\n\r\nthree\r\r\nfour",
    "blank.txt": b"a\n \x0b\x0c\t\nb b\n\n\n  \nc\x0bc\n\x0c\nd\n",
    "nul.txt": b"text with a \x00 NUL\nand \x00\x00 two more, then a line of one\n\x00\n",
    "bad.txt": b"fine\nbad \xff byte\n\ncut \xe2\x82\nsurrogate \xed\xa0\x80 here\n\xef\xbb\xbfbom in line\nend",
    "empty.txt": b"",
    "big.txt": b"x" * (5 << 20) + b"\n\nsmall after\n",
    "only_blank.txt": b"\n \n\t\r\n",
}


def shard_documents(store: ArtifactStore, ref) -> tuple[list[tuple[bytes, str]], list[dict]]:
    d = store.local_dir(ref.kind, ref.version)
    meta = store.manifest(ref.kind, ref.version)["meta"]
    docs = []
    for shard in meta["shards"]:
        for texts, sources in iter_shard_batches(os.path.join(d, shard["file"]), with_source=True):
            docs += zip(texts, sources)
    return docs, meta


def reference_shards(
    sources, config: CorpusConfig
) -> tuple[list[tuple[bytes, str]], list[tuple[int, bool]], DecodeStats]:
    """Documents, (documents, oversize) per shard and stats, the way the sharder decided them
    document by document (`_iter_docs` and `_ShardPlan.place`)."""
    extents = [os.path.getsize(p) for p, _ in sources]
    plan = _ShardPlan(sum(extents), config.planned_shards(sum(extents)))
    docs, shards, stats, current = [], [], DecodeStats(), None

    for (path, name), extent in zip(sources, extents):
        last = 0
        for data, pos in corpus._iter_docs(path, name, config, stats):
            before, after = plan.place(pos - last)
            last = pos
            if before and current is not None:
                shards.append((current, False))
                current = None
            current = (current or 0) + 1
            docs.append((data, name))
            if after:
                shards.append((current, plan.oversize))
                current = None
        plan.skip(extent - last)
    if current is not None:
        shards.append((current, plan.oversize))
    return docs, shards, stats


@pytest.mark.parametrize("documents_mode", ["line", "paragraph"])
@pytest.mark.parametrize("errors", ["replace", "skip-document"])
@pytest.mark.parametrize("scanner", ["native", "python"])
def test_shards_hold_the_per_document_readers_documents(tmp_path, monkeypatch, documents_mode, errors, scanner):
    if scanner == "native" and corpus._SCAN is None:
        pytest.skip("the compiled core is not built")
    if scanner == "python":
        monkeypatch.setattr(corpus, "_SCAN", None)
    for name, data in TRICKY.items():
        (tmp_path / name).write_bytes(data)
    paths = [str(tmp_path / name) for name in TRICKY]
    store = ArtifactStore(str(tmp_path / "store"))
    for n_shards in (1, 3, 6):
        config = CorpusConfig(sources=tuple(paths), documents=documents_mode, errors=errors, n_shards=n_shards)
        raw = download_corpus(store, config)
        docs, meta = shard_documents(store, shard_corpus(store, raw, config))
        raw_dir = store.local_dir(raw.kind, raw.version)
        names = [s["name"] for s in store.manifest(raw.kind, raw.version)["meta"]["sources"]]
        expected_docs, expected_shards, stats = reference_shards(
            [(os.path.join(raw_dir, "sources", n), n) for n in names], config
        )
        assert docs == expected_docs
        assert [(s["n_docs"], bool(s.get("oversize"))) for s in meta["shards"]] == expected_shards
        assert (meta["n_docs"], meta["n_bytes"], meta["n_chars"]) == (stats.documents, stats.bytes, stats.chars)
        assert (
            meta["replaced_documents"],
            meta["invalid_bytes"],
            meta["skipped_documents"],
            meta["empty_documents"],
        ) == (
            stats.replaced_documents,
            stats.invalid_bytes,
            stats.skipped_documents,
            stats.empty_documents,
        )
        text_docs = [d.encode() for p, n in zip(paths, names) for d in iter_documents(p, n, config, DecodeStats())]
        assert [d for d, _ in docs] == text_docs
    assert stats.replaced_documents if errors == "replace" else stats.skipped_documents


@pytest.mark.parametrize("documents_mode", ["line", "paragraph"])
def test_invalid_utf8_fails_naming_the_line(tmp_path, documents_mode):
    path = tmp_path / "c.txt"
    path.write_bytes(b"ok\n\nfine\nalso fine\nbad \xff\nok\n")
    store = ArtifactStore(str(tmp_path / "store"))
    config = CorpusConfig(sources=(str(path),), documents=documents_mode, errors="fail")
    line = 5 if documents_mode == "line" else 3  # the paragraph starts at line 3
    with pytest.raises(InputError, match=rf"c\.txt:{line}: invalid UTF-8 at byte"):
        shard_corpus(store, download_corpus(store, config), config)


def test_row_groups_are_bounded_and_huge_documents_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "_BATCH_DOCS", 1000)
    big = b"y" * ((4 << 20) + 1)
    path = tmp_path / "c.txt"
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(2500)) + big + b"\n" + b"tail\n" * 10)
    store = ArtifactStore(str(tmp_path / "store"))
    config = CorpusConfig(sources=(str(path),), n_shards=1)
    ref = shard_corpus(store, download_corpus(store, config), config)
    d = store.local_dir(ref.kind, ref.version)
    meta = pq.ParquetFile(os.path.join(d, "shard_000000.parquet")).metadata
    rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert rows == [1000, 1000, 500, 1, 10]
    docs, _ = shard_documents(store, ref)
    assert docs[2500] == (big, docs[0][1]) and len(docs) == 2511


def test_batches_of_the_per_document_path_keep_big_documents_uncopied():
    big = b"z" * ((4 << 20) + 1)
    docs = [(b"a", 2), (b"b", 4), (big, 5 + len(big)), (b"c", 7 + len(big))]
    batches = list(corpus._pack(iter(docs)))
    assert [len(b) for b in batches] == [2, 1, 1]
    assert batches[1].data is big and batches[1].offsets.tolist() == [0, len(big)]
    assert isinstance(batches[0], SourceBatch) and batches[0].ends.tolist() == [2, 4]


# --------------------------------------------------------------------------- growth
@pytest.mark.parametrize(
    "what, make",
    [
        ("one 4 MB line -> one 32 MB line", lambda n: b"a" * n),
        ("1 MB -> 8 MB of 3-byte lines", lambda n: b"ab\n" * (n // 3)),
    ],
)
def test_sharder_time_grows_linearly(tmp_path, what, make):
    sizes = (4 << 20, FACTOR * 4 << 20) if "line ->" in what else (1 << 20, FACTOR << 20)
    stores = []
    for size in sizes:
        path = tmp_path / f"c{size}.txt"
        path.write_bytes(make(size))
        store = ArtifactStore(str(tmp_path / f"store{size}"))
        config = CorpusConfig(sources=(str(path),), n_shards=2)
        stores.append((store, download_corpus(store, config), config))

    runs = itertools.count()

    def shard(store, raw, config):
        # the sharder itself, into a new staging area each time (shard_corpus would find the first one)
        return lambda: corpus.write_shards(store, store.stage("corpus", f"run{next(runs)}"), raw, config)

    assert growth(shard(*stores[0]), shard(*stores[1]), f"shard_corpus, {what}") <= LIMIT


# --------------------------------------------------------------------------- memory
PEAK_SCRIPT = """
import resource, sys
from pipeline_lib.corpus import CorpusConfig
from pipeline_lib.stages import download_corpus, shard_corpus
from pipeline_lib.store import ArtifactStore
config = CorpusConfig(sources=(sys.argv[1],), documents=sys.argv[3])
store = ArtifactStore(sys.argv[2])
raw = download_corpus(store, config)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
shard_corpus(store, raw, config)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024)
"""


@pytest.mark.slow
@pytest.mark.parametrize("documents_mode", ["line", "paragraph"])
def test_a_100_mb_line_takes_a_few_times_its_size(tmp_path, documents_mode):
    """One document of 100 MB (a line with no end): peak memory above the baseline stays under 4x it (~3x measured)."""
    path = tmp_path / "line.txt"
    path.write_bytes(b"word " * (20 << 20))
    done = subprocess.run(
        [sys.executable, "-c", PEAK_SCRIPT, str(path), str(tmp_path / "store"), documents_mode],
        capture_output=True,
        text=True,
        check=True,
    )
    peak = int(done.stdout.split()[-1])
    print(f"100 MB line, {documents_mode}: peak RSS +{peak / 1e6:.0f} MB")
    assert peak < 4 * path.stat().st_size
