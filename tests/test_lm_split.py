"""One train/val split, decided at encoding and recorded in the token manifest: the trainer
and both exports hold out the same documents, so no validation token of the trainer is in
an exported train file."""

from __future__ import annotations

import numpy as np
import pytest
from chain import publish_tokens_version

from pipeline_lib.errors import InputError, ShardError
from pipeline_lib.lm.data import TokenShards
from pipeline_lib.lm.testing import write_token_dir
from pipeline_lib.token_shards import check_shards, export_llmc, export_nanogpt


@pytest.fixture(scope="module")
def two_shard_tokens(tmp_path_factory, shakespeare_text):
    """A published tokens version of 2 shards, through the stages (as `tokenmill run`)."""
    store, ref, _ = publish_tokens_version(tmp_path_factory.mktemp("split"), shakespeare_text[:120_000], vocab_size=300)
    return store.local_dir(ref.kind, ref.version), store.manifest(ref.kind, ref.version)["meta"]


def _regions(shards: TokenShards, regions) -> np.ndarray:
    return np.concatenate([np.asarray(shards.tokens(r.shard)[r.start : r.stop]) for r in regions])


def test_the_manifest_records_one_split_at_document_boundaries(two_shard_tokens):
    directory, meta = two_shard_tokens
    assert meta["split"]["val_fraction"] == 0.1
    check_shards(directory, meta)  # val_start checked against each shard's document index
    for s in meta["shards"]:
        ends = np.load(f"{directory}/{s['name']}.idx.npy")
        assert s["val_start"] in ends and s["val_docs"] == int(np.sum(ends > s["val_start"])) > 0
        assert abs(s["val_start"] / s["n_tokens"] - 0.9) < 0.02


@pytest.mark.parametrize("exporter", ["nanogpt", "llmc"])
def test_no_val_token_of_the_trainer_is_in_the_exported_train_file(two_shard_tokens, tmp_path, exporter):
    directory, meta = two_shard_tokens
    shards = TokenShards(directory)
    split = shards.split(None, window=129)  # as the trainer calls it (TrainConfig.val_fraction None)
    assert len(split.val) == 2  # the tail of each of the 2 shards: the case that leaked
    if exporter == "nanogpt":
        written = export_nanogpt(directory, meta, str(tmp_path))
        train, val = (np.fromfile(tmp_path / f"{s}.bin", dtype="<u2") for s in ("train", "val"))
    else:
        written = export_llmc(directory, meta, str(tmp_path))
        train, val = (np.fromfile(tmp_path / f"tokens_{s}.bin", dtype="<u2", offset=1024) for s in ("train", "val"))
    # The exported files are exactly the trainer's regions, in shard order.
    assert np.array_equal(train, _regions(shards, split.train))
    assert np.array_equal(val, _regions(shards, split.val))
    assert written == {"train": split.n_train_tokens, "val": split.n_val_tokens}
    # and, position by position, no token the trainer validates on is in train.bin
    in_train = {(r.shard, p) for r in split.train for p in range(r.start, r.stop)}
    assert not any((r.shard, p) in in_train for r in split.val for p in range(r.start, r.stop))


def test_a_fraction_other_than_the_recorded_one_is_refused(two_shard_tokens, tmp_path):
    directory, meta = two_shard_tokens
    with pytest.raises(InputError, match=r"split at encoding with val_fraction=0.1.*--val-fraction 0.3"):
        export_nanogpt(directory, meta, str(tmp_path), val_fraction=0.3)
    with pytest.raises(ShardError, match=r"val_fraction 0\.3 asked.*--val-fraction 0\.3"):
        TokenShards(directory).split(0.3, window=9)
    export_llmc(directory, meta, str(tmp_path), val_fraction=0.1)  # the recorded one: a check that passes


def test_a_split_off_a_document_boundary_is_caught(tmp_path):
    docs = [[np.arange(10), np.arange(10)], [np.arange(20)]]
    d = write_token_dir(tmp_path / "t", docs, vocab_size=64, separator_id=63, val_fraction=0.4)
    shards = TokenShards(d)
    # targets 13.2 and 12.6: shard 0 splits at 11, shard 1 (one document) has no val
    assert shards.val_starts() == [11, 21]
    import json

    m = json.loads((d / "manifest.json").read_text())
    m["meta"]["shards"][0]["val_start"] = 5
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ShardError, match="val_start 5 is not a document boundary"):
        TokenShards(d).split(None, window=3)


def test_a_manifest_without_a_recorded_split_gets_the_same_rule(tmp_path):
    docs = [[np.full(n, 7) for n in (50, 30, 15, 5)]]  # ends 50, 80, 95, 100
    plain = TokenShards(write_token_dir(tmp_path / "a", docs, vocab_size=10, separator_id=None))
    recorded = TokenShards(write_token_dir(tmp_path / "b", docs, vocab_size=10, separator_id=None, val_fraction=0.1))
    assert plain.recorded_val_fraction is None and recorded.recorded_val_fraction == 0.1
    assert plain.val_starts() == recorded.val_starts() == [95]  # default 0.1: target 90, nearest end 95
    assert plain.val_starts(0.18) == [80]
