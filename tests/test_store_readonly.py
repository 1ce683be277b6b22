"""A complete store on a read-only mount is reusable: every stage finds its version and
nothing needs write access. The mount is a real read-only bind mount (root bypasses
permission bits, so chmod -R a-w would prove nothing); skipped where mounting is refused."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from chain import publish_tokens_version

from pipeline_lib import stages
from pipeline_lib.corpus import CorpusConfig
from pipeline_lib.store import ArtifactStore
from pipeline_lib.token_shards import EncodeConfig


@contextlib.contextmanager
def read_only_view(src: Path, dst: Path) -> Iterator[Path]:
    dst.mkdir()
    if subprocess.run(["mount", "--bind", str(src), str(dst)], capture_output=True, check=False).returncode != 0:
        pytest.skip(
            "bind mounts are not permitted here (a read-only store needs a real read-only mount: root ignores "
            "chmod a-w)"
        )
    try:
        if (
            subprocess.run(["mount", "-o", "remount,ro,bind", str(dst)], capture_output=True, check=False).returncode
            != 0
        ):
            pytest.skip("read-only remounts are not permitted here")
        with pytest.raises(OSError):
            (dst / "probe").write_bytes(b"x")  # really read-only, even for root
        yield dst
    finally:
        subprocess.run(["umount", "-l", str(dst)], check=False)


def test_a_complete_store_on_a_read_only_mount_is_reused(tmp_path, shakespeare_text):
    store, tokens, tok = publish_tokens_version(tmp_path, shakespeare_text[:100_000], 300)
    before = sorted(p.relative_to(tmp_path / "store") for p in (tmp_path / "store").rglob("*"))
    with read_only_view(tmp_path / "store", tmp_path / "ro") as ro:
        s2 = ArtifactStore(str(ro))
        cfg = CorpusConfig(sources=(str(tmp_path / "c.txt"),), n_shards=2)
        corpus = stages.shard_corpus(s2, stages.download_corpus(s2, cfg), cfg)
        cc = stages.CountConfig()
        for i in range(2):
            stages.count_shard(s2, corpus, i, cc)
        tok2 = stages.learn_tokenizer(s2, stages.reduce_counts(s2, corpus, cc), stages.TokenizerConfig(vocab_size=300))
        ec = EncodeConfig()
        for i in range(2):
            stages.encode_shard(s2, corpus, tok2, i, ec)
        tokens2 = stages.publish_tokens(s2, corpus, tok2, ec)
        assert (tokens2.version, tok2.version) == (tokens.version, tok.version)
        p = subprocess.run(
            [sys.executable, "-m", "flows.cli", "verify", "--all", "--store", str(ro)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert p.returncode == 0 and f"tokens/{tokens.version}: " in p.stdout, p.stderr
        p = subprocess.run(
            [sys.executable, "-m", "flows.cli", "gc", "--dry-run", "--store", str(ro)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert p.returncode == 0, p.stderr
    assert sorted(p.relative_to(tmp_path / "store") for p in (tmp_path / "store").rglob("*")) == before
