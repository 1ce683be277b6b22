"""One large source split into ranges (`pipeline_lib.source_ranges`): the same documents, in
the same order, none lost or doubled, as the file read whole; deterministic shard names; a
rerun redoes only the unfinished range; the tokenizer of the unsplit run; and real corpus
layouts (a directory of Parquet or .jsonl.zst files) read in place."""

from __future__ import annotations

import codecs
import json
import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline_lib import corpus as corpus_lib
from pipeline_lib import source_ranges, stages
from pipeline_lib.corpus import CorpusConfig, iter_shard_batches
from pipeline_lib.store import ArtifactStore, VersionRef


def _documents(store: ArtifactStore, ref: VersionRef) -> list[bytes]:
    d = store.local_dir(ref.kind, ref.version)
    return [
        doc
        for shard in store.manifest(ref.kind, ref.version)["meta"]["shards"]
        for batch in iter_shard_batches(os.path.join(d, shard["file"]))
        for doc in batch
    ]


def _shard(root: Path, sources: list[str], **config) -> tuple[ArtifactStore, VersionRef, dict]:
    store = ArtifactStore(str(root))
    cfg = CorpusConfig(sources=tuple(sources), **config)
    ref = stages.shard_corpus(store, stages.download_corpus(store, cfg), cfg)
    return store, ref, store.manifest(ref.kind, ref.version)


_COUNTS = (
    "n_docs",
    "n_bytes",
    "n_chars",
    "replaced_documents",
    "invalid_bytes",
    "skipped_documents",
    "empty_documents",
)


def _same_as_whole(path: str, group_bytes: int, **config) -> dict:
    """Shard `path` whole and split in ranges of about `group_bytes`: the documents and counts
    agree; the split run's manifest."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            whole_store, whole, whole_manifest = _shard(Path(tmp) / "whole", [path], source_group_bytes=0, **config)
        except corpus_lib.InputError as e:  # no documents at all: the split run says the same
            with pytest.raises(corpus_lib.InputError) as split_error:
                _shard(Path(tmp) / "split", [path], source_group_bytes=group_bytes, **config)
            assert str(split_error.value) == str(e)
            return {}
        split_store, split, split_manifest = _shard(
            Path(tmp) / "split", [path], source_group_bytes=group_bytes, **config
        )
        assert _documents(split_store, split) == _documents(whole_store, whole)
        for key in _COUNTS:
            assert split_manifest["meta"][key] == whole_manifest["meta"][key], key
        return split_manifest


# Each example shards a file twice through a store (about 0.3 s): a developer's run draws
# fewer, CI (CI set) twice as many.
_CI = 2 if os.environ.get("CI") else 1

# Lines of text with the awkward parts: CRLF, blank and whitespace-only lines, long lines
# (documents spanning several ranges), invalid UTF-8, multi-byte characters.
_LINE = st.one_of(
    st.text(alphabet="ab é\t", min_size=0, max_size=30),
    st.sampled_from(["", " ", "\t \x0b", "x" * 200, "é" * 50]),
).map(lambda t: t.encode("utf-8"))
_TEXT = st.tuples(
    st.lists(st.tuples(_LINE, st.sampled_from([b"\n", b"\r\n", b"\xff\n"])), min_size=1, max_size=60),
    st.sampled_from([b"", b"last line without newline", b"\n"]),
).map(lambda parts: b"".join(line + end for line, end in parts[0]) + parts[1])


@pytest.fixture(params=["native", "python"])
def scanner(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setattr(corpus_lib, "_SCAN", None)
    elif corpus_lib._SCAN is None:
        pytest.skip("the compiled core is not built")
    return request.param


@settings(max_examples=12 * _CI, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=_TEXT, group_bytes=st.integers(min_value=1, max_value=400), documents=st.sampled_from(["line", "paragraph"])
)
def test_text_ranges_give_the_documents_of_the_whole_file(tmp_path_factory, scanner, text, group_bytes, documents):
    path = tmp_path_factory.mktemp("text") / "big.txt"
    path.write_bytes(text)
    manifest = _same_as_whole(str(path), group_bytes, documents=documents, n_shards=3)
    if manifest and len(text) > group_bytes:
        (record,) = manifest["meta"]["sources"]
        assert record["ranges"] == len(source_ranges.byte_spans(len(text), group_bytes))


@settings(max_examples=10 * _CI, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    records=st.lists(st.one_of(st.text(alphabet="xyé \n", max_size=40), st.none()), min_size=1, max_size=40),
    group_bytes=st.integers(min_value=1, max_value=300),
    crlf=st.booleans(),
)
def test_jsonl_ranges_give_the_records_of_the_whole_file(tmp_path_factory, records, group_bytes, crlf):
    path = tmp_path_factory.mktemp("jsonl") / "big.jsonl"
    end = b"\r\n" if crlf else b"\n"
    path.write_bytes(end.join(json.dumps({"text": r, "id": i}).encode() for i, r in enumerate(records)) + end)
    _same_as_whole(str(path), group_bytes, n_shards=2)


@settings(max_examples=8 * _CI, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(st.text(alphabet="pq é", max_size=30), min_size=1, max_size=80),
    row_group=st.integers(1, 20),
    group_bytes=st.integers(50, 2000),
)
def test_parquet_row_group_ranges_give_the_rows_of_the_whole_file(tmp_path_factory, rows, row_group, group_bytes):
    path = tmp_path_factory.mktemp("parquet") / "big.parquet"
    pq.write_table(pa.table({"text": rows, "n": list(range(len(rows)))}), path, row_group_size=row_group)
    _same_as_whole(str(path), group_bytes, n_shards=2)


def test_boundaries_follow_the_split_rule(tmp_path):
    data = b"ab\r\ncd\n\n \nef\ngh"
    path = tmp_path / "t.txt"
    path.write_bytes(data)
    with open(path, "rb") as f:
        line = [source_ranges.first_boundary(f, i, len(data), False, 1 << 20, "t.txt") for i in range(len(data) + 1)]
        para = [source_ranges.first_boundary(f, i, len(data), True, 1 << 20, "t.txt") for i in range(len(data) + 1)]
    # line starts: 0, 4 (after CRLF), 7, 8, 10, 13, and the end (15)
    assert line == [0, 4, 4, 4, 4, 7, 7, 7, 8, 10, 10, 13, 13, 13, 15, 15]
    # after a blank line: 8 ("\n"), 10 (" \n"), and the end
    assert para == [0, 8, 8, 8, 8, 8, 8, 8, 8, 10, 10, 15, 15, 15, 15, 15]


def test_a_bom_and_the_size_cap_are_the_whole_files(tmp_path):
    lines = [json.dumps({"text": f"record {i}"}).encode() + b"\n" for i in range(6)]
    first = tmp_path / "first.jsonl"  # a BOM opening the file is dropped, in the first range only
    first.write_bytes(codecs.BOM_UTF8 + b"".join(lines))
    _same_as_whole(str(first), 40, n_shards=2)
    inner = tmp_path / "inner.jsonl"  # one inside the file is an error whole, and split where a range starts there
    inner.write_bytes(b"".join(lines[:3]) + codecs.BOM_UTF8 + b"".join(lines[3:]))
    for group_bytes in (0, len(b"".join(lines[:3])) + 1):
        with pytest.raises(corpus_lib.InputError, match="inner.jsonl.*not valid JSON"):
            _shard(tmp_path / f"inner-{group_bytes}", [str(inner)], n_shards=2, source_group_bytes=group_bytes)
    big = tmp_path / "big.txt"
    big.write_bytes(b"line\n" * 100)
    for split in (0, 100):  # read in place (a copy is refused when it is made)
        with pytest.raises(corpus_lib.InputError, match="big.txt: 500 bytes, more than the 400-byte cap"):
            _shard(
                tmp_path / f"capped-{split}",
                [str(big)],
                source_group_bytes=split,
                max_source_bytes=400,
                source_mode="reference",
            )


def test_small_files_and_compressed_ones_are_not_split():
    cfg = CorpusConfig(source_group_bytes=100)
    records = [
        {"name": "a.txt", "size": 100},
        {"name": "b.txt.zst", "size": 500},
        {"name": "c.txt", "size": 250},
        {"name": "d.parquet", "size": 150},
    ]
    units = source_ranges.plan_units(records, cfg)
    assert [(u.sources, u.split, u.span) for u in units] == [
        (range(0, 1), False, (0, 0)),
        (range(1, 2), False, (0, 0)),  # compressed: one unit whatever its size
        (range(2, 3), True, (0, 83)),
        (range(2, 3), True, (83, 166)),
        (range(2, 3), True, (166, 250)),
        (range(3, 4), True, (0, 75)),  # Parquet: the row groups whose middle byte each range holds
        (range(3, 4), True, (75, 150)),
    ]
    whole_files = CorpusConfig(source_group_bytes=100, documents="file")
    assert len(source_ranges.plan_units(records, whole_files)) == 5  # c.txt whole; Parquet rows are documents still
    assert len(source_ranges.plan_units(records, CorpusConfig(source_group_bytes=0))) == 4


def test_each_row_group_goes_to_the_range_holding_its_middle(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": [f"row {i} " * 20 for i in range(12)]}), path, row_group_size=2)
    meta = pq.ParquetFile(path).metadata
    spans = source_ranges.byte_spans(path.stat().st_size, 700)
    picked = [source_ranges.row_groups_in(meta, span) for span in spans]
    assert [j for p in picked for j in p] == list(range(meta.num_row_groups))  # each once, in order
    assert sum(1 for p in picked if p) > 1


def test_split_shards_are_deterministic_and_a_rerun_redoes_only_the_missing_range(
    tmp_path, shakespeare_text, monkeypatch
):
    path = tmp_path / "big.txt"
    path.write_text(shakespeare_text[:60_000])
    cfg = CorpusConfig(sources=(str(path),), n_shards=6, source_group_bytes=15_000)
    store = ArtifactStore(str(tmp_path / "store"))
    raw = stages.download_corpus(store, cfg)
    n = stages.spec.unit_count(stages.SHARD, store, {"raw": raw}, cfg)
    assert n == 4
    for unit in (0, 1, 3):  # unit 2 is "killed"
        stages.shard_sources(store, raw, unit, cfg)
    ran: list[int] = []
    real = corpus_lib.shard_group

    def counted(store_, staging_, raw_, config, group):
        ran.append(group)
        return real(store_, staging_, raw_, config, group)

    monkeypatch.setattr(corpus_lib, "shard_group", counted)
    corpus = stages.shard_corpus(store, raw, cfg)
    assert ran == [2]
    monkeypatch.setattr(corpus_lib, "shard_group", real)
    other = ArtifactStore(str(tmp_path / "other"))
    again = stages.shard_corpus(other, stages.download_corpus(other, cfg), cfg)
    assert again.version == corpus.version
    mine, theirs = store.manifest(corpus.kind, corpus.version), other.manifest(again.kind, again.version)
    assert mine["files"] == theirs["files"] and mine["meta"] == theirs["meta"]
    names = [s["name"] for s in mine["meta"]["shards"]]
    assert names == sorted(names) and all(
        name.startswith(("shard_000000_", "shard_000001_", "shard_000002_", "shard_000003_")) for name in names
    )
    assert [g["sources"] for g in mine["meta"]["groups"]] == [["00000_big.txt"]] * 4
    (source,) = mine["meta"]["sources"]
    assert source["ranges"] == 4 and source["n_docs"] == mine["meta"]["n_docs"]


def test_split_corpus_learns_the_tokenizer_of_the_whole_file(tmp_path, shakespeare_text):
    path = tmp_path / "big.txt"
    path.write_text(shakespeare_text[:80_000])
    tokenizers = []
    for label, group_bytes in (("whole", 0), ("split", 9_000)):
        store = ArtifactStore(str(tmp_path / label))
        cfg = CorpusConfig(sources=(str(path),), n_shards=4, source_group_bytes=group_bytes)
        corpus = stages.shard_corpus(store, stages.download_corpus(store, cfg), cfg)
        counts = stages.CountConfig()
        for i in range(len(store.manifest(corpus.kind, corpus.version)["meta"]["shards"])):
            stages.count_shard(store, corpus, i, counts)
        tok = stages.learn_tokenizer(
            store, stages.reduce_counts(store, corpus, counts), stages.TokenizerConfig(vocab_size=400)
        )
        files = store.manifest(tok.kind, tok.version)["files"]
        tokenizers.append({name: info["sha256"] for name, info in files.items() if name != "tokenmill.json"})
    assert tokenizers[0] == tokenizers[1] and tokenizers[0]


# --------------------------------------------------------------------------- corpus layouts
@pytest.fixture
def fineweb_dir(tmp_path, shakespeare_text) -> tuple[Path, list[str]]:
    """A FineWeb-like directory: Parquet files with a `text` column among others, .jsonl.zst
    files, nested, with a Spark marker file; and the documents in the order they are read."""
    root = tmp_path / "fineweb" / "data"
    paras = [p.strip() for p in shakespeare_text[:40_000].split("\n\n") if p.strip()]
    docs: list[str] = []
    for i in range(3):
        part = paras[i * 20 : (i + 1) * 20]
        sub = root / "CC-MAIN-2024-10"
        sub.mkdir(parents=True, exist_ok=True)
        pq.write_table(
            pa.table({"id": [f"{i}-{k}" for k in range(len(part))], "text": part, "url": ["u"] * len(part)}),
            sub / f"{i:03d}_00000.parquet",
        )
        docs += part
    for i in range(2):
        part = paras[60 + i * 15 : 60 + (i + 1) * 15]
        body = "".join(json.dumps({"text": p, "id": k}) + "\n" for k, p in enumerate(part)).encode()
        (root / "jsonl").mkdir(exist_ok=True)
        (root / "jsonl" / f"shard-{i}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(body))
        docs += part
    (root / "CC-MAIN-2024-10" / "_SUCCESS").write_bytes(b"")
    return root, docs


def test_a_directory_of_parquet_and_jsonl_zst_files_is_read_in_place(tmp_path, fineweb_dir):
    root, docs = fineweb_dir
    urls = corpus_lib.expand_sources((str(root),))
    assert [Path(u).name for u in urls] == [
        "000_00000.parquet",
        "001_00000.parquet",
        "002_00000.parquet",
        "shard-0.jsonl.zst",
        "shard-1.jsonl.zst",
    ]
    store = ArtifactStore(str(tmp_path / "store"))
    cfg = CorpusConfig(sources=(str(root),), n_shards=4, source_mode="reference", source_group_bytes=0)
    raw = stages.download_corpus(store, cfg)
    assert store.manifest(raw.kind, raw.version)["files"] == {}  # no byte copied
    assert stages.spec.unit_count(stages.SHARD, store, {"raw": raw}, cfg) == 5  # one unit per file
    corpus = stages.shard_corpus(store, raw, cfg)
    assert [d.decode() for d in _documents(store, corpus)] == docs
    labels = source_ranges.unit_labels(store, raw, cfg)
    assert labels == [
        "000_00000.parquet",
        "001_00000.parquet",
        "002_00000.parquet",
        "shard-0.jsonl.zst",
        "shard-1.jsonl.zst",
    ]
    # a glob of the same layout names the same files
    assert corpus_lib.expand_sources((str(root / "*" / "*.parquet"),)) == urls[:3]


def test_an_empty_directory_is_one_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(corpus_lib.InputError, match="no files"):
        corpus_lib.expand_sources((str(tmp_path / "empty"),))


@pytest.mark.usefixtures("prefect_harness")
def test_the_flow_names_each_sharding_task_after_its_files_and_ranges(tmp_path, fineweb_dir, shakespeare_text):
    from prefect_server import task_runs

    from flows.pipeline import corpus_flow

    root, _ = fineweb_dir
    big = tmp_path / "big.txt"
    big.write_text(shakespeare_text[:30_000])
    state = corpus_flow(
        corpus={
            "sources": [str(root), str(big)],
            "n_shards": 4,
            "source_group_bytes": 10_000,
            "source_mode": "reference",
        },
        store=str(tmp_path / "store"),
        return_state=True,
    )
    assert state.is_completed(), state
    names = sorted(r.name for r in task_runs(state.state_details.flow_run_id) if r.name.startswith("shard_sources["))
    assert any("000_00000.parquet" in n for n in names), names
    assert sum("big.txt bytes" in n for n in names) == 3, names


def test_a_referenced_large_source_is_split_as_a_copied_one(tmp_path, shakespeare_text):
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps({"text": line}) + "\n" for line in shakespeare_text[:30_000].splitlines()))
    _, copied, copied_manifest = _shard(tmp_path / "copy", [str(path)], n_shards=3, source_group_bytes=8_000)
    ref_store, referenced, ref_manifest = _shard(
        tmp_path / "ref", [str(path)], n_shards=3, source_group_bytes=8_000, source_mode="reference"
    )
    raw = ref_manifest["parents"]["raw"]
    assert ref_store.manifest(*raw.split("/"))["files"] == {}  # read in place
    assert ref_manifest["files"] == copied_manifest["files"]
    assert ref_manifest["meta"]["sources"][0]["ranges"] == len(source_ranges.byte_spans(path.stat().st_size, 8_000)) > 1
