"""The pipeline's stages as plain functions over an `ArtifactStore`: no Prefect here.

Each stage reads its inputs by `VersionRef`, writes one versioned output and returns its
ref. A stage whose output version already exists returns at once; mapped stages (one
call per shard) write into the output's staging area with a completion marker per shard,
so a killed run resumes with the shards it had not finished.

    download_corpus -> shard_corpus -> count_shard* -> reduce_counts -> learn_tokenizer
        -> encode_shard* -> publish_tokens -> (lm training, in pipeline_lib.lm)
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Annotated, Any

from pipeline_lib import counting, token_shards
from pipeline_lib.config import STRICT, doc
from pipeline_lib.corpus import CorpusConfig, download_corpus, shard_corpus  # noqa: F401  (re-exported: the whole chain from one module)
from pipeline_lib.counting import COUNTS_FILE, COUNTS_KIND, CountConfig
from pipeline_lib.fsio import InputError
from pipeline_lib.report import notable_tokens
from pipeline_lib.store import ArtifactStore, FileInfo, Staging, VersionRef, version_id
from pipeline_lib.token_shards import TOKENS_KIND, EncodeConfig
from pipeline_lib.tokenizer import ENDOFTEXT, Tokenizer
from pipeline_lib.version import code_version

TOKENIZER_KIND = "tokenizer"


@dataclass(frozen=True)
class TokenizerConfig:
    __pydantic_config__ = STRICT

    vocab_size: Annotated[int, doc("total ids: 256 bytes + merges + special tokens")] = 4096
    special_tokens: Annotated[tuple[str, ...], doc("special tokens, appended after the merges in this order")] = (ENDOFTEXT,)
    min_frequency: Annotated[int, doc("stop merging when the best pair occurs fewer times")] = 2

    def __post_init__(self):
        if self.vocab_size < 256 + len(self.special_tokens):
            raise InputError(f"vocab_size={self.vocab_size} is too small: need at least 256 + {len(self.special_tokens)} special token(s)")
        if self.vocab_size > 1 << 31:
            raise InputError(f"vocab_size={self.vocab_size} is too large")
        if len(set(self.special_tokens)) != len(self.special_tokens):
            raise InputError(f"duplicate special tokens in {self.special_tokens}")
        if self.min_frequency < 1:
            raise InputError("min_frequency must be at least 1")

    def params(self) -> dict[str, Any]:
        return {**asdict(self), "special_tokens": list(self.special_tokens)}


# The report's corpus: paragraphs, and more shards than the pipeline's, for a held-out part
# per language (the defaults of `tokenmill report` and report_flow).
REPORT_CORPUS = CorpusConfig(n_shards=10, documents="paragraph")


def _code(modules: Sequence[str]) -> str:
    return code_version(*modules)


# --------------------------------------------------------------------------- counting
def counts_version(corpus: VersionRef, config: CountConfig) -> str:
    return version_id(COUNTS_KIND, {"corpus": corpus.key}, config.params(), _code(counting.CODE_MODULES))


def corpus_shards(store: ArtifactStore, corpus: VersionRef) -> list[dict[str, Any]]:
    return store.manifest(corpus.kind, corpus.version)["meta"]["shards"]


def _shard_unit(store: ArtifactStore, kind: str, version: str, shard: int) -> tuple[Any, str, dict[str, Any] | None]:
    """(staging area, unit name, completion record or None) of one shard of a mapped stage."""
    unit = f"shard_{shard:06d}"
    if store.usable(kind, version):
        return None, unit, {"shard": shard, "cached": True}
    staging = store.stage(kind, version)
    return staging, unit, staging.done(unit)


def _run_unit(store: ArtifactStore, kind: str, version: str, shard: int, work: Callable[[Staging, str], dict[str, Any]]) -> dict[str, Any]:
    """One shard of a mapped stage: a finished shard is skipped; otherwise `work` writes it
    into the staging area under a claim, so two runs never do the same shard at once, and
    its completion record is written last."""
    staging, unit, done = _shard_unit(store, kind, version, shard)
    if done is not None:
        return done
    with store.claim(kind, f"{version}.{unit}"):
        staging, unit, done = _shard_unit(store, kind, version, shard)  # finished by the run we waited for?
        if done is not None:
            return done
        record = work(staging, unit)
        staging.mark_done(unit, record)
        return record


def count_shard(store: ArtifactStore, corpus: VersionRef, shard: int, config: CountConfig) -> dict[str, Any]:
    """Count one corpus shard into the counts version's staging area (skips a finished shard)."""

    def work(staging: Staging, unit: str) -> dict[str, Any]:
        info = corpus_shards(store, corpus)[shard]
        path = store.local_file(corpus.kind, corpus.version, info["file"])
        pieces, counts = counting.count_shard(path, config.pattern)
        with staging.open_write(f"parts/{unit}.parquet") as tmp:
            counting.write_counts(tmp, pieces, counts)
        return {"shard": shard, "n_pieces": len(pieces), "n_occurrences": int(counts.sum()), "n_docs": info["n_docs"], "n_bytes": info["n_bytes"]}

    return _run_unit(store, COUNTS_KIND, counts_version(corpus, config), shard, work)


def reduce_counts(store: ArtifactStore, corpus: VersionRef, config: CountConfig) -> VersionRef:
    """Sum the per-shard counts into ``counts.parquet`` and publish the counts version."""
    version = counts_version(corpus, config)
    return store.produce(COUNTS_KIND, version, lambda: _reduce_counts(store, corpus, config, version))


def _reduce_counts(store: ArtifactStore, corpus: VersionRef, config: CountConfig, version: str) -> VersionRef:
    staging = store.stage(COUNTS_KIND, version)
    shards = corpus_shards(store, corpus)
    records = []
    for i in range(len(shards)):
        record = staging.done(f"shard_{i:06d}")
        if record is None:
            raise InputError(f"counts of corpus shard {i} are missing: run count_shard for every shard first")
        records.append(record)
    names = [f"parts/shard_{i:06d}.parquet" for i in range(len(shards))]
    with tempfile.TemporaryDirectory(prefix="counts-", dir=store.scratch_dir(COUNTS_KIND)) as tmpdir:
        parts_dir = staging.local_dir(names, tmpdir)  # in place on local disk, else downloaded
        pieces, counts = counting.reduce_counts([os.path.join(parts_dir, *n.split("/")) for n in names], config.pattern)
    with staging.open_write(COUNTS_FILE) as tmp:
        counting.write_counts(tmp, pieces, counts)
    files = {COUNTS_FILE: staging.written[COUNTS_FILE]}
    # The per-shard parts are not listed: publish drops them (deleting them here would pull
    # them from under a concurrent run of this stage).
    meta = {
        "pattern": config.pattern,
        "n_pieces": len(pieces),
        "n_occurrences": int(counts.sum()),
        "shards": records,
        "top_pieces": [[p.decode("utf-8", "replace"), int(c)] for p, c in sorted(zip(pieces, counts.tolist()), key=lambda x: -x[1])[:20]],
    }
    return store.publish(staging, files=files, parents={"corpus": corpus}, params=config.params(), code_version=_code(counting.CODE_MODULES), meta=meta)


# --------------------------------------------------------------------------- merges
TOKENIZER_MODULES = ("pipeline_lib.tokenizer", "pipeline_lib.bpe_reference", "pipeline_lib.stages")


def learn_tokenizer(
    store: ArtifactStore,
    counts: VersionRef,
    config: TokenizerConfig,
    progress: Callable[[int, int], None] | None = None,
) -> VersionRef:
    """Learn merges from a counts version; publish the tokenizer files."""
    code = _code(TOKENIZER_MODULES)
    version = version_id(TOKENIZER_KIND, {"counts": counts.key}, config.params(), code)
    return store.produce(TOKENIZER_KIND, version, lambda: _learn_tokenizer(store, counts, config, progress, version, code))


def _learn_tokenizer(store: ArtifactStore, counts: VersionRef, config: TokenizerConfig, progress, version: str, code: str) -> VersionRef:
    cmeta = store.manifest(counts.kind, counts.version)
    path = os.path.join(store.local_dir(counts.kind, counts.version), COUNTS_FILE)
    pieces, cnt = counting.read_counts(path)
    tok = Tokenizer.train(
        dict(zip(pieces, cnt.tolist())), config.vocab_size, pattern=cmeta["meta"]["pattern"],
        special_tokens=config.special_tokens, min_frequency=config.min_frequency, progress=progress,
    )
    staging = store.stage(TOKENIZER_KIND, version)
    files = {}
    for name, data in tokenizer_files(tok).items():
        files[name] = staging.put_bytes(name, data)
    notable = notable_tokens(tok, 10)
    meta = {
        **tok.metadata(),
        "n_merges": len(tok.merges or []),
        "requested_vocab_size": config.vocab_size,
        "first_merges": notable["first"],
        "last_merges": notable["last"],
        "longest_tokens": notable["longest"],
    }
    return store.publish(staging, files=files, parents={"counts": counts}, params=config.params(), code_version=code, meta=meta)


def tokenizer_files(tok: Tokenizer) -> dict[str, bytes]:
    from pipeline_lib.tokenizer import META_FILE, RANKS_FILE

    return {RANKS_FILE: tok.ranks_text(), META_FILE: json.dumps(tok.metadata(), indent=2, ensure_ascii=False).encode()}


def load_tokenizer(store: ArtifactStore, ref: VersionRef) -> Tokenizer:
    return Tokenizer.load(store.local_dir(ref.kind, ref.version))


# --------------------------------------------------------------------------- encoding
def tokens_version(corpus: VersionRef, tokenizer: VersionRef, config: EncodeConfig) -> str:
    return version_id(TOKENS_KIND, {"corpus": corpus.key, "tokenizer": tokenizer.key}, config.params(), _code(token_shards.CODE_MODULES))


def encode_shard(store: ArtifactStore, corpus: VersionRef, tokenizer: VersionRef, shard: int, config: EncodeConfig) -> dict[str, Any]:
    """Encode one corpus shard into the tokens version's staging area (skips a finished shard)."""

    def work(staging: Staging, unit: str) -> dict[str, Any]:
        tok = load_tokenizer(store, tokenizer)
        info = corpus_shards(store, corpus)[shard]
        src = store.local_file(corpus.kind, corpus.version, info["file"])
        names = [f"{unit}.npy", f"{unit}.idx.npy"] + ([f"{unit}.docs.parquet"] if config.doc_table else [])
        with contextlib.ExitStack() as stack:
            tmps = [stack.enter_context(staging.open_write(n)) for n in names]
            stats = token_shards.encode_shard_file(tok, src, tmps[0], tmps[1], config, unit, shard, tmps[2] if config.doc_table else None)
        infos = {n: staging.written[n] for n in names}
        return {**asdict(stats), "shard": shard, "sha256": infos[names[0]].sha256, "files": {n: asdict(fi) for n, fi in infos.items()}}

    return _run_unit(store, TOKENS_KIND, tokens_version(corpus, tokenizer, config), shard, work)


def publish_tokens(store: ArtifactStore, corpus: VersionRef, tokenizer: VersionRef, config: EncodeConfig) -> VersionRef:
    """Check every encoded shard and publish the tokens version with its manifest."""
    version = tokens_version(corpus, tokenizer, config)
    return store.produce(TOKENS_KIND, version, lambda: _publish_tokens(store, corpus, tokenizer, config, version))


def _publish_tokens(store: ArtifactStore, corpus: VersionRef, tokenizer: VersionRef, config: EncodeConfig, version: str) -> VersionRef:
    staging = store.stage(TOKENS_KIND, version)
    tmeta = store.manifest(tokenizer.kind, tokenizer.version)["meta"]
    n = len(corpus_shards(store, corpus))
    records = []
    for i in range(n):
        record = staging.done(f"shard_{i:06d}")
        if record is None:
            raise InputError(f"shard {i} of {corpus.key} is not encoded yet: run encode_shard for every shard first")
        records.append(record)
    files = {name: FileInfo(**fi) for r in records for name, fi in r["files"].items()}
    meta = token_shards.build_meta(
        records, tmeta, tokenizer.key, config, code_version=_code(token_shards.CODE_MODULES),
        corpus_key=corpus.key, corpus_meta=store.manifest(corpus.kind, corpus.version)["meta"],
    )
    with tempfile.TemporaryDirectory(prefix="tokens-", dir=store.scratch_dir(TOKENS_KIND)) as tmpdir:
        token_shards.check_shards(staging.local_dir(files, tmpdir), meta, deep=False)
    return store.publish(staging, files=files, parents={"corpus": corpus, "tokenizer": tokenizer}, params=config.params(), code_version=_code(token_shards.CODE_MODULES), meta=meta)


def compression_summary(tokens_meta: dict[str, Any]) -> dict[str, float]:
    totals = tokens_meta["totals"]
    n_sep = totals["n_docs"] if tokens_meta.get("separator") else 0
    n_text_tokens = max(1, totals["n_tokens"] - n_sep)
    return {
        "bytes_per_token": totals["n_bytes"] / n_text_tokens,
        "tokens": totals["n_tokens"],
        "bytes": totals["n_bytes"],
        "docs": totals["n_docs"],
    }


def shard_table(tokens_meta: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for s in tokens_meta["shards"]:
        n_text = s["n_tokens"] - (s["n_docs"] if tokens_meta.get("separator") else 0)
        rows.append({
            "shard": s["name"], "docs": s["n_docs"], "bytes": s["n_bytes"], "tokens": s["n_tokens"],
            "bytes/token": round(s["n_bytes"] / max(1, n_text), 3),
        })
    return rows


__all__ = [
    "CorpusConfig", "CountConfig", "EncodeConfig", "TokenizerConfig", "download_corpus", "shard_corpus",
    "count_shard", "reduce_counts", "learn_tokenizer", "encode_shard", "publish_tokens", "load_tokenizer",
]
