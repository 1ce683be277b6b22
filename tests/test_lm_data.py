"""Token shards: validation with clear errors, split by document, windows, sampler state."""

import json

import numpy as np
import pytest

from pipeline_lib.lm.data import ShardError, TokenShards, WindowSampler
from pipeline_lib.lm.testing import write_token_dir


def arange_dir(path, vocab_size=70000, n_shards=2, doc_len=10, n_docs=20):
    """Shard i holds tokens 20000*i + 0, 1, 2, ... (no separator), documents of doc_len."""
    shards = []
    for i in range(n_shards):
        toks = 20000 * i + np.arange(doc_len * n_docs)
        shards.append([toks[j * doc_len : (j + 1) * doc_len] for j in range(n_docs)])
    return write_token_dir(path, shards, vocab_size, separator_id=None)


def test_uint32_split_and_windows(tmp_path):
    d = arange_dir(tmp_path / "t")
    ds = TokenShards(d, verify_hashes=True)
    assert ds.dtype == np.dtype("<u4") and ds.vocab_size == 70000 and ds.separator_id is None
    assert isinstance(ds.tokens(0), np.memmap)
    split = ds.split(0.25, window=5)
    # 200 tokens, target 150: boundary 150 is a document end, so val = [150, 200).
    assert [(r.shard, r.start, r.stop) for r in split.train] == [(0, 0, 150), (1, 0, 150)]
    assert [(r.shard, r.start, r.stop) for r in split.val] == [(0, 150, 200), (1, 150, 200)]
    assert not split.messages
    s = WindowSampler(ds, split.train, window=5, batch_size=64, seed=0)
    for _ in range(5):
        b = s.next_batch()
        assert b.shape == (64, 5) and b.dtype == np.int64
        assert np.all(np.diff(b, axis=1) == 1)  # contiguous: never across a shard
        assert np.all(b % 20000 < 150)  # never into val
    v = WindowSampler(ds, split.val, window=5, batch_size=64, seed=0).next_batch()
    assert np.all(v % 20000 >= 150)


def test_split_nearest_boundary(tmp_path):
    docs = [np.full(n, 7) for n in (50, 30, 15, 5)]  # ends 50, 80, 95, 100
    d = write_token_dir(tmp_path / "t", [docs], vocab_size=10, separator_id=None)
    ds = TokenShards(d)
    assert ds.dtype == np.dtype("<u2")
    assert ds.split(0.1, 2).val[0].start == 95  # target 90: nearest end is 95
    assert ds.split(0.18, 2).val[0].start == 80  # target 82: nearest is 80
    assert ds.split(0.0, 2).val == []


def test_separator_and_empty_val_message(tmp_path):
    d = write_token_dir(tmp_path / "t", [[np.arange(40)], [np.arange(30)]], vocab_size=64, separator_id=63)
    ds = TokenShards(d)
    assert ds.separator_id == 63 and int(ds.tokens(0)[-1]) == 63  # appended separator is in the stream
    split = ds.split(0.1, window=9)
    assert split.val == []
    assert len(split.messages) == 1 and "val split is EMPTY" in split.messages[0]
    assert ds.bytes_per_token == pytest.approx(70 / 72)


def test_sampler_state_roundtrip_and_seeds(tmp_path):
    ds = TokenShards(arange_dir(tmp_path / "t"))
    regions = ds.split(0.25, 9).train
    s = WindowSampler(ds, regions, 9, 4, seed=[1, 0, 0])
    s.next_batch()
    state = json.loads(json.dumps(s.state()))  # JSON-able
    a = [s.next_batch() for _ in range(3)]
    s2 = WindowSampler(ds, regions, 9, 4, seed=[99])
    s2.set_state(state)
    for x, y in zip(a, [s2.next_batch() for _ in range(3)]):
        np.testing.assert_array_equal(x, y)
    other_rank = WindowSampler(ds, regions, 9, 4, seed=[1, 1, 0]).next_batch()
    assert not np.array_equal(WindowSampler(ds, regions, 9, 4, seed=[1, 0, 0]).next_batch(), other_rank)


def _good(tmp_path):
    return write_token_dir(tmp_path / "t", [[np.arange(20)] * 3, [np.arange(10)] * 2], vocab_size=32, separator_id=31)


def test_truncated_shard_names_file(tmp_path):
    d = _good(tmp_path)
    p = d / "shard_000001.npy"
    p.write_bytes(p.read_bytes()[:-3])
    with pytest.raises(ShardError, match=r"shard_000001\.npy.*truncated"):
        TokenShards(d)


def test_wrong_dtype_and_count(tmp_path):
    d = _good(tmp_path)
    np.save(d / "shard_000000.npy", np.arange(63, dtype="<u4"))
    with pytest.raises(ShardError, match=r"shard_000000\.npy: dtype <u4 but expected <u2"):
        TokenShards(d)
    np.save(d / "shard_000000.npy", np.arange(60, dtype="<u2"))
    with pytest.raises(ShardError, match=r"shard_000000\.npy: holds 60 elements but the manifest says 63"):
        TokenShards(d)


def test_garbage_and_missing_files(tmp_path):
    d = _good(tmp_path)
    (d / "shard_000000.npy").write_bytes(b"not numpy at all")
    with pytest.raises(ShardError, match=r"shard_000000\.npy: not a valid \.npy"):
        TokenShards(d)
    d = _good(tmp_path / "b")
    (d / "shard_000001.idx.npy").unlink()
    with pytest.raises(ShardError, match=r"shard_000001\.idx\.npy: file not found"):
        TokenShards(d)
    d = _good(tmp_path / "c")
    np.save(d / "shard_000001.idx.npy", np.array([11, 20], dtype="<u8"))
    with pytest.raises(ShardError, match=r"shard_000001\.idx\.npy: last document end is 20 but the shard holds 22"):
        TokenShards(d)
    with pytest.raises(ShardError, match=r"manifest\.json: file not found"):
        TokenShards(tmp_path / "nowhere")
    d = _good(tmp_path / "e")
    (d / "manifest.json").write_text("{bad json")
    with pytest.raises(ShardError, match=r"manifest\.json: not valid JSON"):
        TokenShards(d)


def test_hash_and_out_of_vocab(tmp_path):
    d = _good(tmp_path)
    arr = np.load(d / "shard_000000.npy")
    arr[5] = 40  # same size, different content, id outside the vocabulary of 32
    np.save(d / "shard_000000.npy", arr)
    with pytest.raises(ShardError, match=r"shard_000000\.npy: sha256"):
        TokenShards(d, verify_hashes=True)
    ds = TokenShards(d)  # sizes are fine; the bad id shows when sampled
    s = WindowSampler(ds, [r for r in ds.split(0.0, 8).train if r.shard == 0], 63, 1, seed=0)
    with pytest.raises(ShardError, match=r"shard_000000\.npy: token id 40"):
        s.next_batch()
