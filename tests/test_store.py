"""ArtifactStore: the same behaviour on local disk, in memory and on S3 (a local moto server).

Every test runs against each backend (`store_url` is parametrized): publish protocol,
write-once, invisibility of unpublished work, verification on read, listing, gc, names.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid

import pytest
from s3_server import s3_options  # noqa: F401  (session fixture: a local S3 server)

from pipeline_lib.fsio import InputError
from pipeline_lib.store import MANIFEST, ArtifactStore, FileInfo, StoreError, VersionRef, check_name, version_id

BACKENDS = ["file", "file-url", "memory", "s3"]


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture
def store_args(backend, tmp_path, request) -> tuple[str, dict]:
    if backend == "file":
        return str(tmp_path / "store"), {}
    if backend == "file-url":
        return f"file://{tmp_path}/store", {}
    if backend == "memory":
        return f"memory://store-{uuid.uuid4().hex}", {}
    from s3_server import s3_url

    return s3_url(), request.getfixturevalue("s3_options")


@pytest.fixture
def store(store_args) -> ArtifactStore:
    url, opts = store_args
    return ArtifactStore(url, **opts)


def fresh(store: ArtifactStore) -> ArtifactStore:
    """A second handle on the same store (another process would have its own)."""
    return ArtifactStore(store.url, **store.storage_options)


def publish_simple(store, kind="notes", version="v1", files=None, **kw) -> VersionRef:
    files = files if files is not None else {"a.txt": b"hello", "sub/b.bin": bytes(range(256)) * 10}
    staging = store.stage(kind, version)
    infos = {name: staging.put_bytes(name, data) for name, data in files.items()}
    return store.publish(staging, files=infos, **kw)


def overwrite(store: ArtifactStore, kind: str, version: str, name: str, data: bytes) -> None:
    """Tamper with a published file behind the store's back."""
    path = f"{store.version_path(kind, version)}/{name}"
    if store.local:
        os.chmod(path, 0o644)
        with open(path, "wb") as f:
            f.write(data)
    else:
        store.fs.pipe_file(path, data)


# --------------------------------------------------------------------------- publish
def test_roundtrip_and_manifest(store):
    parent = publish_simple(store, "parent", "p1", params={"x": 1})
    staging = store.stage("notes", "v1")
    a = staging.put_bytes("a.txt", b"hello")
    src = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"tm-src-{uuid.uuid4().hex}")
    with open(src, "wb") as f:
        f.write(b"x" * 100_000)
    b = staging.put_file("data/b.bin", src, move=True)
    assert not os.path.exists(src)
    with staging.open_write("c.txt") as tmp:
        with open(tmp, "wb") as f:
            f.write(b"written through open_write")
    c = FileInfo(26, hashlib.sha256(b"written through open_write").hexdigest())
    assert not store.exists("notes", "v1")
    ref = store.publish(
        staging,
        files={"a.txt": a, "data/b.bin": b, "c.txt": c},
        parents={"parent": parent},
        params={"lr": 0.1, "name": "x"},
        code_version="code-1",
        meta={"n_docs": 3},
    )
    assert isinstance(ref, VersionRef) and ref.key == "notes/v1"
    assert store.exists("notes", "v1")
    raw = store.read_bytes("notes", "v1", MANIFEST)
    assert ref.manifest_sha256 == hashlib.sha256(raw).hexdigest()
    m = store.manifest("notes", "v1")
    assert m["parents"] == {"parent": "parent/p1"}
    assert m["parent_manifests"] == {"parent": parent.manifest_sha256}
    assert m["params"] == {"lr": 0.1, "name": "x"}
    assert m["code_version"] == "code-1" and m["tool_version"] and m["created"]
    assert m["meta"] == {"n_docs": 3}
    assert m["files"]["a.txt"] == {"size": 5, "sha256": hashlib.sha256(b"hello").hexdigest()}
    assert m["files"]["data/b.bin"] == {"size": 100_000, "sha256": hashlib.sha256(b"x" * 100_000).hexdigest()}
    assert m["totals"] == {"n_files": 3, "n_bytes": 5 + 100_000 + 26}
    assert store.read_bytes("notes", "v1", "a.txt") == b"hello"
    assert store.read_bytes("notes", "v1", "c.txt") == b"written through open_write"
    d = store.local_dir("notes", "v1")
    with open(os.path.join(d, "data", "b.bin"), "rb") as f:
        assert f.read() == b"x" * 100_000
    assert store.verify("notes", "v1", strict=True)["version"] == "v1"
    assert store.check_ref(ref)
    assert store.uri("notes", "v1").endswith("notes/v1")


def test_unpublished_work_is_invisible_and_gc_removes_it(store):
    publish_simple(store, "notes", "done")
    staging = store.stage("notes", "half")
    staging.put_bytes("a.txt", b"partial")
    staging.mark_done("unit1", {"n": 1})
    other = fresh(store)
    assert not other.exists("notes", "half")
    assert [m["version"] for m in other.list("notes")] == ["done"]
    assert other.latest("notes")["version"] == "done"
    with pytest.raises(StoreError, match="not a published version"):
        other.manifest("notes", "half")
    with pytest.raises(StoreError):
        other.read_bytes("notes", "half", "a.txt")
    with pytest.raises(StoreError):
        other.local_dir("notes", "half")
    assert other.gc(min_age_s=3600) == []  # fresh work is spared with an age threshold
    listed = other.gc(dry_run=True)
    assert listed and all("half" in p or ".tmp" in p for p in listed)
    removed = other.gc()
    assert sorted(removed) == sorted(listed)
    assert other.gc() == []
    assert store.stage("notes", "half").done("unit1") is None  # the marker went with it
    assert other.exists("notes", "done") and other.verify("notes", "done")


def test_completion_markers(store):
    staging = store.stage("work", "v1")
    assert staging.done("shard_000000") is None
    staging.mark_done("shard_000000", {"n_tokens": 5})
    assert fresh(store).stage("work", "v1").done("shard_000000") == {"n_tokens": 5}
    info = staging.put_bytes("x.bin", b"x")
    store.publish(staging, files={"x.bin": info})
    assert set(store.manifest("work", "v1")["files"]) == {"x.bin"}
    store.verify("work", "v1", strict=True)  # markers are not part of the version


def test_write_once(store):
    first = publish_simple(store, files={"a.txt": b"one"}, meta={"run": 1})
    second_store = fresh(store)
    staging = second_store.stage("notes", "v1")
    info = staging.put_bytes("a.txt", b"two, longer")  # a late writer: must not land
    again = second_store.publish(staging, files={"a.txt": info}, meta={"run": 2})
    assert again == first
    assert store.manifest("notes", "v1")["meta"] == {"run": 1}
    assert store.read_bytes("notes", "v1", "a.txt") == b"one"
    store.verify("notes", "v1", strict=True)


def test_publish_refuses_missing_or_wrong_files(store):
    staging = store.stage("notes", "v1")
    info = staging.put_bytes("a.txt", b"hello")
    with pytest.raises(StoreError, match="b.txt"):
        store.publish(staging, files={"a.txt": info, "b.txt": FileInfo(3, "0" * 64)})
    with pytest.raises(StoreError, match="a.txt"):
        store.publish(staging, files={"a.txt": FileInfo(999, info.sha256)})
    with pytest.raises(InputError):
        store.publish(staging, files={MANIFEST: info})
    assert not store.exists("notes", "v1")
    assert store.publish(staging, files={"a.txt": info}).key == "notes/v1"


def test_version_id_is_deterministic():
    a = version_id("tokens", {"corpus": "corpus/1", "tok": "tokenizer/2"}, {"b": 1, "a": [1, 2]}, "c1")
    b = version_id("tokens", {"tok": "tokenizer/2", "corpus": "corpus/1"}, {"a": [1, 2], "b": 1}, "c1")
    assert a == b and check_name(a) == a
    assert a != version_id("tokens", {"corpus": "corpus/1", "tok": "tokenizer/3"}, {"b": 1, "a": [1, 2]}, "c1")
    assert a != version_id("tokens", {"corpus": "corpus/1", "tok": "tokenizer/2"}, {"b": 2, "a": [1, 2]}, "c1")
    assert a != version_id("tokens", {"corpus": "corpus/1", "tok": "tokenizer/2"}, {"b": 1, "a": [1, 2]}, "c2")


# --------------------------------------------------------------------------- verification
def test_verify_names_the_corrupted_file(store):
    publish_simple(store)
    original = bytes(range(256)) * 10
    flipped = bytearray(original)
    flipped[100] ^= 1
    overwrite(store, "notes", "v1", "sub/b.bin", bytes(flipped))
    reader = fresh(store)
    with pytest.raises(StoreError, match=r"notes/v1/sub/b\.bin: sha256 mismatch"):
        reader.verify("notes", "v1")
    with pytest.raises(StoreError, match=r"sub/b\.bin"):
        reader.read_bytes("notes", "v1", "sub/b.bin")
    assert reader.read_bytes("notes", "v1", "a.txt") == b"hello"  # the other file is fine
    overwrite(store, "notes", "v1", "sub/b.bin", original[:-1])
    with pytest.raises(StoreError, match=r"sub/b\.bin: 2,559 bytes, manifest says 2,560"):
        fresh(store).verify("notes", "v1")
    store.fs.rm(f"{store.version_path('notes', 'v1')}/sub/b.bin")
    with pytest.raises(StoreError, match=r"sub/b\.bin: listed in the manifest but missing"):
        fresh(store).verify("notes", "v1")


def test_local_dir_checks_files(store, tmp_path):
    publish_simple(store)
    overwrite(store, "notes", "v1", "a.txt", b"HELLO, and more")
    with pytest.raises(StoreError, match=r"a\.txt"):
        fresh(store).local_dir("notes", "v1", cache_dir=str(tmp_path / "cache"))


def test_remote_cache_refreshes_and_detects_tampering(store, tmp_path):
    if store.local:
        pytest.skip("remote stores only")
    publish_simple(store)
    cache = str(tmp_path / "cache")
    d = store.local_dir("notes", "v1", cache_dir=cache)
    assert open(os.path.join(d, "a.txt"), "rb").read() == b"hello"
    with open(os.path.join(d, "a.txt"), "wb") as f:
        f.write(b"HELLO")  # same size: only a full check sees it
    assert store.local_dir("notes", "v1", cache_dir=cache, verify="size") == d  # a size check cannot see it
    assert open(os.path.join(d, "a.txt"), "rb").read() == b"HELLO"
    assert store.local_dir("notes", "v1", cache_dir=cache) == d  # the default full check does, and heals the cache
    assert open(os.path.join(d, "a.txt"), "rb").read() == b"hello"


@pytest.mark.parametrize("damage", ["garbage", "truncated", "wrong-kind", "hostile-file-name", "not-a-dict"])
def test_corrupt_manifest(store, damage):
    publish_simple(store)
    publish_simple(store, "notes", "v2")
    path = f"{store.version_path('notes', 'v1')}/{MANIFEST}"
    raw = store.fs.cat_file(path)
    m = json.loads(raw)
    if damage == "garbage":
        new = b"\x00\xff{not json"
    elif damage == "truncated":
        new = raw[: len(raw) // 2]
    elif damage == "wrong-kind":
        m["kind"] = "other"
        new = json.dumps(m).encode()
    elif damage == "hostile-file-name":
        m["files"]["../../../etc/passwd"] = {"size": 1, "sha256": "0" * 64}
        new = json.dumps(m).encode()
    else:
        new = b"[1, 2, 3]"
    overwrite(store, "notes", "v1", MANIFEST, new)
    reader = fresh(store)
    with pytest.raises(StoreError, match=r"notes/v1/manifest\.json: corrupt manifest"):
        reader.manifest("notes", "v1")
    with pytest.raises(StoreError, match="corrupt manifest"):
        reader.verify("notes", "v1")
    assert [m["version"] for m in reader.list("notes")] == ["v2"]  # unreadable versions are left out


# --------------------------------------------------------------------------- listing
def test_list_latest_find(store):
    publish_simple(store, "tokenizer", "aaa111", params={"vocab_size": 512})
    publish_simple(store, "tokenizer", "bbb222", params={"vocab_size": 1024})
    publish_simple(store, "tokenizer", "ccc333", params={"vocab_size": 512})
    publish_simple(store, "tokens", "ddd444", params={})
    reader = fresh(store)
    assert reader.kinds() == ["tokenizer", "tokens"]
    assert [m["version"] for m in reader.list("tokenizer")] == ["ccc333", "bbb222", "aaa111"]
    assert [m["version"] for m in reader.list("tokenizer", vocab_size=512)] == ["ccc333", "aaa111"]
    assert reader.latest("tokenizer")["version"] == "ccc333"
    assert reader.latest("tokenizer", vocab_size=1024)["version"] == "bbb222"
    assert reader.latest("tokenizer", vocab_size=7) is None
    assert reader.latest("nothing") is None
    assert len(reader.list()) == 4
    assert reader.find("bbb") == ("tokenizer", "bbb222")
    assert reader.find("tokens/ddd444") == ("tokens", "ddd444")
    with pytest.raises(InputError, match="matches 0 versions"):
        reader.find("zzz")


# --------------------------------------------------------------------------- names
HOSTILE = [
    "",
    ".",
    "..",
    "../x",
    "a/../b",
    "a/b",
    "/etc",
    "x\n",
    "x\x00y",
    "a b",
    "..hidden",
    "a..b",
    ".staging",
    "ｆｕｌｌｗｉｄｔｈ",
    "x" * 300,
    "C:\\x",
    "~root",
    "$(id)",
    "name;rm",
]


def test_hostile_names_are_refused(store):
    staging = store.stage("notes", "v1")
    for name in HOSTILE:
        with pytest.raises(InputError):
            store.stage(name, "v1")
        with pytest.raises(InputError):
            store.stage("notes", name)
        if name != "a/b":  # a valid path inside a version
            with pytest.raises(InputError):
                staging.put_bytes(name, b"x")
            with pytest.raises(InputError):
                staging.put_bytes(f"sub/{name}", b"x")
            with pytest.raises(InputError):
                staging.mark_done(name, {})
        with pytest.raises(InputError):
            store.exists("notes", name)
        with pytest.raises(InputError):
            store.read_bytes(name, "v1", "a.txt")
        with pytest.raises(InputError):
            store.find(f"notes/{name}")
    info = staging.put_bytes("ok.txt", b"x")
    store.publish(staging, files={"ok.txt": info})
    for name in HOSTILE:
        with pytest.raises(InputError):
            store.read_bytes("notes", "v1", name if name != "a/b" else "../a")
    store.verify("notes", "v1", strict=True)
    assert store.kinds() == ["notes"]


def test_symlink_escape_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    store = ArtifactStore(str(tmp_path / "store"))
    store.ensure_store()
    os.symlink(outside, tmp_path / "store" / "evil")
    with pytest.raises(InputError, match="outside the store root"):
        store.stage("evil", "v1")
    staging = store.stage("notes", "v1")
    staging.put_bytes("ok.txt", b"fine")
    os.symlink(outside, os.path.join(staging.path, "link"))
    with pytest.raises(InputError, match="outside the store root"):
        staging.put_bytes("link/x.txt", b"x")
    assert list(outside.iterdir()) == []


def test_manifest_size_cap(store, monkeypatch):
    import pipeline_lib.store as store_mod

    publish_simple(store)
    monkeypatch.setattr(store_mod, "MAX_MANIFEST_BYTES", 64)
    with pytest.raises(StoreError, match="larger than 64 bytes"):
        fresh(store).manifest("notes", "v1")


def test_staged_files_are_readable_as_a_local_directory(store, tmp_path):
    """`Staging.local_dir`: the staging area itself on local disk, a download elsewhere."""
    staging = store.stage("notes", "v1")
    staging.put_bytes("parts/a.bin", b"aa")
    staging.put_bytes("b.txt", b"bb")
    root = staging.local_dir(["parts/a.bin", "b.txt"], str(tmp_path / "dl"))
    with open(os.path.join(root, "parts", "a.bin"), "rb") as f:
        assert f.read() == b"aa"
    with open(os.path.join(root, "b.txt"), "rb") as f:
        assert f.read() == b"bb"
    with pytest.raises(StoreError, match="nope.bin is missing"):
        staging.local_dir(["nope.bin"], str(tmp_path / "dl2"))


def test_nothing_is_visible_under_a_version_before_its_manifest(store):
    staging = store.stage("notes", "v1")
    infos = {"a.txt": staging.put_bytes("a.txt", b"hello"), "sub/b.bin": staging.put_bytes("sub/b.bin", b"x" * 1000)}
    staging.mark_done("unit1", {"n": 1})
    base = store.version_path("notes", "v1")
    store._invalidate(base)
    assert not store.fs.exists(base) or store.fs.find(base) == []  # a tool listing the prefix sees nothing
    store.publish(staging, files=infos)
    assert sorted(rel for rel, _ in store._relative_files(base)) == ["a.txt", MANIFEST, "sub/b.bin"]
    store._invalidate(staging.path)
    assert not store.fs.exists(staging.path) or store.fs.find(staging.path) == []  # the staging area is gone
