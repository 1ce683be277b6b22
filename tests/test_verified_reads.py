"""Verified reads: every reader of a published tokens version checks each file it uses
against the version's manifest (size and sha256), hashing it once per process while it is
unchanged; a directory of one's own keeps working with the size checks; exports get the
user's umask."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import time
from dataclasses import asdict

import numpy as np
import pytest

from pipeline_lib import fsio
from pipeline_lib.errors import ShardError, StoreError
from pipeline_lib.lm.data import TokenShards
from pipeline_lib.lm.testing import write_token_dir
from pipeline_lib.store import ArtifactStore, FileInfo
from pipeline_lib.token_shards import (
    EncodeConfig,
    build_meta,
    check_shards,
    encode_documents,
    export_llmc,
    export_nanogpt,
    open_index,
    open_tokens,
)
from pipeline_lib.tokenizer import Tokenizer

EOT = "<|endoftext|>"
DOCS = [[f"document {i} ".encode() * (1 + i % 4) for i in range(12)], [f"second {i}".encode() for i in range(9)]]


def byte_tokenizer() -> Tokenizer:
    return Tokenizer({bytes([i]): i for i in range(256)}, "gpt2", {EOT: 256})


def encode_into(tok, cfg, shard_docs, i, paths):
    name = f"shard_{i:06d}"
    stats = encode_documents(
        tok, [(shard_docs, ["src"] * len(shard_docs))], *paths[:2], cfg, name, doc_table_path=paths[2], shard=i
    )
    return name, stats


def published_version(root) -> tuple[str, dict]:
    """A tokens version staged and published by ArtifactStore, as the encode stage does."""
    store = ArtifactStore(str(root / "store"))
    staging = store.stage("tokens", "v1")
    tok, cfg = byte_tokenizer(), EncodeConfig()
    records = []
    for i, docs in enumerate(DOCS):
        names = [f"shard_{i:06d}{ext}" for ext in (".npy", ".idx.npy", ".docs.parquet")]
        with contextlib.ExitStack() as stack:
            tmps = [stack.enter_context(staging.open_write(n)) for n in names]
            _, stats = encode_into(tok, cfg, docs, i, tmps)
        infos = {n: staging.written[n] for n in names}
        records.append(
            {**asdict(stats), "sha256": infos[names[0]].sha256, "files": {n: asdict(fi) for n, fi in infos.items()}}
        )
    meta = build_meta(
        records, {"vocab_size": tok.vocab_size, "special_tokens": tok.special_tokens}, "tokenizer/test", cfg
    )
    files = {n: FileInfo(**fi) for r in records for n, fi in r["files"].items()}
    ref = store.publish(staging, files=files, meta=meta)
    return store.version_path(ref.kind, ref.version), meta


def own_directory(path) -> tuple[str, dict]:
    """The same files written straight into a directory: no store manifest."""
    os.makedirs(path)
    tok, cfg = byte_tokenizer(), EncodeConfig()
    records = []
    for i, docs in enumerate(DOCS):
        paths = [str(path / f"shard_{i:06d}{ext}") for ext in (".npy", ".idx.npy", ".docs.parquet")]
        _, stats = encode_into(tok, cfg, docs, i, paths)
        records.append({**asdict(stats), "sha256": hashlib.sha256(read(paths[0])).hexdigest()})
    return str(path), build_meta(
        records, {"vocab_size": tok.vocab_size, "special_tokens": tok.special_tokens}, "tokenizer/test", cfg
    )


def read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def rewrite_in_place(path: str, data: bytes) -> None:
    """Write `data` over the file at `path` (same inode, same size)."""
    # Kernels before 6.13 stamp writes with a coarse clock (one tick, 4-10 ms), so a write
    # in the tick of the last stat can leave (mtime, ctime) unchanged, which no stat-keyed
    # memo can see; wait a tick so this test is about our memo, not the kernel's clock.
    time.sleep(0.02)
    os.chmod(path, 0o644)  # published files are read-only
    with open(path, "r+b") as f:
        f.write(data)
    os.chmod(path, 0o444)


def flip_byte(path: str, back_from_end: int = 4) -> bytes:
    """Flip one payload byte in place (same size); return the original content."""
    original = read(path)
    data = bytearray(original)
    data[-back_from_end] ^= 0x01  # (default: the low byte of the token before the last separator)
    rewrite_in_place(path, bytes(data))
    return original


@pytest.fixture
def hashes(monkeypatch):
    """A fresh verification memo and a counter of the files really hashed."""
    monkeypatch.setattr(fsio, "_VERIFIED", {})
    calls: collections.Counter[str] = collections.Counter()
    real = fsio.hash_file

    def counting(path):
        calls[os.path.basename(path)] += 1
        return real(path)

    monkeypatch.setattr(fsio, "hash_file", counting)
    return calls


READERS = {
    "TokenShards": lambda d, meta, out: TokenShards(d),
    "open_tokens": lambda d, meta, out: open_tokens(os.path.join(d, "shard_000001.npy")),
    "check_shards": lambda d, meta, out: check_shards(d, meta),
    "export_nanogpt": lambda d, meta, out: export_nanogpt(d, meta, out),
    "export_llmc": lambda d, meta, out: export_llmc(d, meta, out),
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_same_size_flip_is_refused_then_healed(tmp_path, hashes, reader):
    d, meta = published_version(tmp_path)
    out = str(tmp_path / "out")
    use = READERS[reader]
    use(d, meta, out)  # sound: reads fine
    path = os.path.join(d, "shard_000001.npy")
    original = flip_byte(path)
    for _ in range(2):  # refused every time: a failed check is never remembered as a pass
        with pytest.raises((StoreError, ShardError), match=r"shard_000001\.npy: sha256 mismatch.*tokenmill run") as err:
            use(d, meta, out)
    assert isinstance(err.value, ShardError if reader == "TokenShards" else StoreError)
    if reader.startswith("export"):
        assert not [p for p in os.listdir(out) if p.startswith(".tmp")]
    rewrite_in_place(path, original)
    use(d, meta, out)  # the original bytes pass again
    assert hashes["shard_000001.npy"] == 4  # sound, flipped (twice), restored: each a real hash


def test_flipped_index_and_doc_table_are_refused(tmp_path, hashes):
    d, _ = published_version(tmp_path)
    flip_byte(os.path.join(d, "shard_000000.idx.npy"), back_from_end=8)  # low byte of the last end
    with pytest.raises(ShardError, match=r"shard_000000\.idx\.npy: sha256 mismatch"):
        TokenShards(d)
    with pytest.raises(StoreError, match=r"shard_000000\.idx\.npy: sha256 mismatch"):
        open_index(os.path.join(d, "shard_000000.idx.npy"))
    d2, meta2 = published_version(tmp_path / "b")
    flip_byte(os.path.join(d2, "shard_000001.docs.parquet"), back_from_end=40)
    with pytest.raises(StoreError, match=r"shard_000001\.docs\.parquet: sha256 mismatch"):
        check_shards(d2, meta2)
    TokenShards(d2)  # does not read document tables


def test_each_file_is_hashed_once_per_process(tmp_path, hashes):
    d, meta = published_version(tmp_path)
    TokenShards(d)
    used = {f"shard_00000{i}{ext}" for i in range(2) for ext in (".npy", ".idx.npy")}
    assert dict(hashes) == {name: 1 for name in used}  # the counter sees the real hashing
    TokenShards(d)
    open_tokens(os.path.join(d, "shard_000000.npy"))
    open_index(os.path.join(d, "shard_000001.idx.npy"))
    export_nanogpt(d, meta, str(tmp_path / "out"))
    assert dict(hashes) == {name: 1 for name in used}
    check_shards(d, meta)  # reads the document tables too: those are hashed, once
    tables = {f"shard_00000{i}.docs.parquet" for i in range(2)}
    assert dict(hashes) == {name: 1 for name in used | tables}
    check_shards(d, meta)
    assert sum(hashes.values()) == len(used | tables)
    # Any write makes the next read hash again, even one that leaves the same bytes.
    path = os.path.join(d, "shard_000000.npy")
    rewrite_in_place(path, read(path))
    TokenShards(d)
    assert hashes["shard_000000.npy"] == 2 and sum(hashes.values()) == len(used | tables) + 1


def test_a_store_read_counts_for_the_readers(tmp_path, hashes):
    d, meta = published_version(tmp_path)
    store = ArtifactStore(str(tmp_path / "store"))
    assert store.local_dir("tokens", "v1") == d  # verify="full": hashes every file once
    n = sum(hashes.values())
    assert n == len(json.loads(read(os.path.join(d, "manifest.json")))["files"])
    TokenShards(d)
    check_shards(d, meta)
    export_llmc(d, meta, str(tmp_path / "out"))
    assert sum(hashes.values()) == n


def test_opt_out_reads_a_corrupt_file_with_size_checks_only(tmp_path, hashes):
    d, meta = published_version(tmp_path)
    flip_byte(os.path.join(d, "shard_000001.npy"))
    assert len(open_tokens(os.path.join(d, "shard_000001.npy"), verify=False))
    TokenShards(d, verify=False)
    check_shards(d, meta, deep=False)
    export_nanogpt(d, meta, str(tmp_path / "out"), verify=False)
    assert not hashes


def test_own_directory_without_manifest_still_loads(tmp_path, hashes):
    d, meta = own_directory(tmp_path / "own")
    expected = open_tokens(os.path.join(d, "shard_000000.npy")).tolist()
    assert check_shards(d, meta)["n_docs"] == sum(len(x) for x in DOCS)
    export_nanogpt(d, meta, str(tmp_path / "out"))
    head = meta["shards"][0]["val_start"]  # train.bin opens with shard 0's training documents
    assert np.fromfile(tmp_path / "out" / "train.bin", dtype="<u2")[:head].tolist() == expected[:head]
    # no store manifest: nothing to check against but sizes (and meta's hashes, in check_shards' scan)
    assert not hashes
    # A manifest.json that is not the store's (lm.testing's) is a directory of one's own too.
    t = write_token_dir(tmp_path / "lm", [[np.arange(20)] * 3], vocab_size=32, separator_id=31)
    a = np.load(t / "shard_000000.npy")
    a[5] = 6  # same size, other content: no store manifest, so only sizes are checked
    np.save(t / "shard_000000.npy", a)
    assert not TokenShards(t).published and int(TokenShards(t).tokens(0)[5]) == 6
    assert open_tokens(str(t / "shard_000000.npy"))[5] == 6
    with pytest.raises(ShardError, match=r"shard_000000\.npy: sha256"):
        TokenShards(t, verify_hashes=True)  # asked for: hashed against the meta's sha256


def test_unlisted_file_and_corrupt_manifest(tmp_path):
    d, _ = published_version(tmp_path)
    stray = os.path.join(d, "extra.npy")
    np.save(stray, np.arange(4, dtype="<u2"))
    with pytest.raises(StoreError, match=r"extra\.npy: not in its version's manifest\.json"):
        open_tokens(stray)
    m = os.path.join(d, "manifest.json")
    os.chmod(m, 0o644)
    raw = read(m)
    with open(m, "wb") as f:
        f.write(raw[:-20])
    with pytest.raises(StoreError, match=r"manifest\.json: corrupt manifest"):
        open_tokens(os.path.join(d, "shard_000000.npy"))
    with pytest.raises(ShardError, match=r"manifest\.json: not valid JSON"):
        TokenShards(d)
    manifest = json.loads(raw)
    manifest["files"]["shard_000000.npy"]["sha256"] = "0" * 64
    with open(m, "w") as f:
        json.dump(manifest, f)
    with pytest.raises(ShardError, match=r"shard_000000\.npy: sha256 mismatch"):
        TokenShards(d)


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_exports_get_the_users_umask(tmp_path, umask, mode):
    d, meta = published_version(tmp_path)
    old = os.umask(umask)
    fsio._umask.cache_clear()  # read once per process: make this test's umask the one read
    try:
        export_nanogpt(d, meta, str(tmp_path / "nano"))
        export_llmc(d, meta, str(tmp_path / "llmc"))
        Tokenizer.train(["some text to learn from"], vocab_size=260, special_tokens=()).save(str(tmp_path / "tok"))
    finally:
        os.umask(old)
        fsio._umask.cache_clear()
    for p in (
        "nano/train.bin",
        "nano/val.bin",
        "llmc/tokens_train.bin",
        "llmc/tokens_val.bin",
        "tok/vocab.tiktoken",
        "tok/tokenmill.json",
    ):
        assert os.stat(tmp_path / p).st_mode & 0o777 == mode, p
