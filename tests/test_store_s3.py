"""S3-specific store behaviour against a local S3 server (moto), through s3fs + endpoint_url:
create-only manifests (IfNoneMatch), two processes publishing one version, and the whole
corpus -> tokens chain with the sources and the store both on S3."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
from s3_server import s3_options, s3_url  # noqa: F401  (session fixture)

from pipeline_lib.fsio import filesystem, write_bytes_create_only
from pipeline_lib.store import ArtifactStore, StoreError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_endpoint_url_reaches_the_local_server(s3_options):
    url = s3_url()
    store = ArtifactStore(url, **s3_options)
    assert not store.local and store.fs.protocol[0] in ("s3", "s3a")
    staging = store.stage("notes", "v1")
    store.publish(staging, files={"a.txt": staging.put_bytes("a.txt", b"hi")})
    # Seen through a plain boto3 client: the objects really are on the server.
    import boto3

    bucket, prefix = url[len("s3://") :].split("/", 1)
    client = boto3.client(
        "s3",
        endpoint_url=s3_options["client_kwargs"]["endpoint_url"],
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"])
    # (the staging root's marker stays: gc's proof that `notes` is the store's kind)
    assert keys == [
        f"{prefix}/notes/.staging/.tokenmill-staging",
        f"{prefix}/notes/v1/a.txt",
        f"{prefix}/notes/v1/manifest.json",
        f"{prefix}/tokenmill-store.json",
    ]


def test_create_only_put(s3_options):
    fs, path = filesystem(s3_url() + "/m.json", **s3_options)
    assert write_bytes_create_only(fs, path, b"first") is True
    assert write_bytes_create_only(fs, path, b"second") is False
    assert fs.cat_file(path) == b"first"


def test_losing_publisher_adopts_the_winners_manifest(s3_options, monkeypatch):
    url = s3_url()
    a, b = ArtifactStore(url, **s3_options), ArtifactStore(url, **s3_options)
    sa, sb = a.stage("notes", "v1"), b.stage("notes", "v1")
    ia, ib = sa.put_bytes("x.txt", b"same"), sb.put_bytes("x.txt", b"same")
    first = a.publish(sa, files={"x.txt": ia}, meta={"writer": "a"})
    # b checked for the manifest before a wrote it (its first check says "absent"), and
    # a's publish took the shared staging area: b adopts a's version.
    real_exists, calls = ArtifactStore.exists, []

    def exists_first_false(self, k, v):
        calls.append((k, v))
        return False if len(calls) == 1 else real_exists(self, k, v)

    monkeypatch.setattr(ArtifactStore, "exists", exists_first_false)
    second = b.publish(sb, files={"x.txt": ib}, meta={"writer": "b"})
    monkeypatch.undo()
    assert second == first and len(calls) > 1
    assert a.manifest("notes", "v1")["meta"] == {"writer": "a"}
    a.verify("notes", "v1", strict=True)


_WRITER = textwrap.dedent("""
    import json, sys, time
    from pipeline_lib.store import ArtifactStore
    url, opts, who, start = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    store = ArtifactStore(url, **opts)
    staging = store.stage("notes", "v1")
    files = {}
    while time.time() < start:
        time.sleep(0.005)
    for i in range(5):
        files[f"part{i}.bin"] = staging.put_bytes(f"part{i}.bin", bytes([i]) * 50_000)
    ref = store.publish(staging, files=files, meta={"writer": who})
    print(json.dumps({"sha": ref.manifest_sha256, "writer": store.manifest("notes", "v1")["meta"]["writer"]}))
""")


def test_two_processes_publish_the_same_version(s3_options):
    url = s3_url()
    start = time.time() + 2.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, url, json.dumps(s3_options), who, str(start)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for who in ("a", "b")
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert results[0] == results[1]  # both ended up with the one published manifest
    store = ArtifactStore(url, **s3_options)
    assert [m["version"] for m in store.list("notes")] == ["v1"]
    store.verify("notes", "v1", strict=True)


def test_chain_on_s3(s3_options, tmp_path, shakespeare_text):
    from pipeline_lib import stages, token_shards
    from pipeline_lib.corpus import CorpusConfig

    src_fs, src = filesystem(s3_url("corpus") + "/part-0.txt", **s3_options)
    head = shakespeare_text[:60_000]
    src_fs.pipe_file(src, head[:30_000].encode())
    src_fs.pipe_file(src.replace("part-0", "part-1"), head[30_000:].encode())
    glob = "s3://" + src.rsplit("/", 1)[0] + "/part-*.txt"
    store = ArtifactStore(s3_url(), **s3_options)
    cfg = CorpusConfig(sources=(glob,), n_shards=2, storage_options=s3_options)
    raw = stages.download_corpus(store, cfg)
    assert [s["size"] for s in store.manifest("raw", raw.version)["meta"]["sources"]] == [
        30_000,
        len(head[30_000:].encode()),
    ]
    corpus = stages.shard_corpus(store, raw, cfg)
    cc = stages.CountConfig()
    for i in range(2):
        stages.count_shard(store, corpus, i, cc)
    counts = stages.reduce_counts(store, corpus, cc)
    tok = stages.learn_tokenizer(store, counts, stages.TokenizerConfig(vocab_size=300))
    ec = token_shards.EncodeConfig()
    for i in range(2):
        stages.encode_shard(store, corpus, tok, i, ec)
    tokens = stages.publish_tokens(store, corpus, tok, ec)
    for m in store.list():
        store.verify(m["kind"], m["version"], strict=True)
    meta = store.manifest(tokens.kind, tokens.version)["meta"]
    d = store.local_dir(tokens.kind, tokens.version, cache_dir=str(tmp_path / "cache"))
    assert token_shards.check_shards(d, meta)["n_docs"] == store.manifest(corpus.kind, corpus.version)["meta"]["n_docs"]
    # Tampering on the server is caught on the next download.
    path = f"{store.version_path(tokens.kind, tokens.version)}/shard_000000.npy"
    data = bytearray(store.fs.cat_file(path))
    data[-1] ^= 1
    store.fs.pipe_file(path, bytes(data))
    with pytest.raises(StoreError, match="shard_000000.npy"):
        store.local_dir(tokens.kind, tokens.version, cache_dir=str(tmp_path / "cache2"))
