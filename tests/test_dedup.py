"""Exact document dedup, the optional document stage between sharding and counting: its
counts, its place in the chain (counting and encoding read its output), the chain's ids
unchanged when it is off, and what registering a document stage takes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import pyarrow.parquet as pq
import pytest

from pipeline_lib import stages
from pipeline_lib.config import STRICT, doc
from pipeline_lib.dedup import DedupConfig
from pipeline_lib.stages import spec as engine
from pipeline_lib.stages.documents import DocumentStage, document_stages, documents_config, register, unregister
from pipeline_lib.stages.documents.dedup import DEDUP
from pipeline_lib.stages.spec import Context, Output, Stage
from pipeline_lib.store import ArtifactStore, VersionRef

ROOT = Path(__file__).resolve().parent.parent
# A few lines teach few merges: the tokenizer's warning about it is expected here.
pytestmark = pytest.mark.filterwarnings("ignore:the corpus gave only")

# 10 documents (one per line), 4 of them repeats of an earlier one: 6 distinct.
LINES = [
    "alpha beta",
    "gamma",
    "alpha beta",
    "delta epsilon zeta",
    "gamma",
    "eta",
    "theta iota",
    "alpha beta",
    "eta",
    "kappa",
]


def _run(stage: Stage, store: ArtifactStore, parents: dict[str, VersionRef], config: Any) -> VersionRef:
    if stage.units is not None:
        for i in range(engine.unit_count(stage, store, parents, config)):
            engine.run_unit(stage, store, parents, config, i)
    return engine.produce(stage, store, parents, config)


def chain(root: Path, dedup: DedupConfig, lines: list[str] = LINES, **configs: Any) -> dict[str, VersionRef]:
    """The chain to the token shards, with the document stages `dedup` turns on between the
    shards and the counts, as the flows run it."""
    root.mkdir(parents=True, exist_ok=True)
    store = ArtifactStore(str(root / "store"))
    source = root / "dups.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    cfg = stages.CorpusConfig(sources=(str(source),), n_shards=3)
    refs = {"raw": _run(stages.DOWNLOAD, store, {}, cfg)}
    refs["corpus"] = refs["documents"] = _run(stages.SHARD, store, {"raw": refs["raw"]}, cfg)
    documents = documents_config()(dedup=dedup, **configs)
    for entry in document_stages():
        config = getattr(documents, entry.option)
        if entry.enabled(config):
            refs["documents"] = refs[entry.option] = _run(entry.stage, store, {"corpus": refs["documents"]}, config)
    refs["counts"] = _run(stages.COUNTS, store, {"corpus": refs["documents"]}, stages.CountConfig())
    refs["tokenizer"] = _run(
        stages.TOKENIZER, store, {"counts": refs["counts"]}, stages.TokenizerConfig(vocab_size=300)
    )
    refs["tokens"] = _run(
        stages.TOKENS, store, {"corpus": refs["documents"], "tokenizer": refs["tokenizer"]}, stages.EncodeConfig()
    )
    return refs


def _meta(root: Path, ref: VersionRef) -> dict[str, Any]:
    return ArtifactStore(str(root / "store")).manifest(ref.kind, ref.version)["meta"]


def test_dedup_on_drops_the_repeated_documents_and_counts_them(tmp_path):
    refs = chain(tmp_path, DedupConfig(mode="exact"))
    meta = _meta(tmp_path, refs["dedup"])
    removed = [line for i, line in enumerate(LINES) if line in LINES[:i]]
    removed_bytes = sum(len(line.encode()) for line in removed)
    assert meta["dedup"] == {
        "mode": "exact",
        "documents_in": 10,
        "documents_out": 6,
        "documents_removed": 4,
        "bytes_in": sum(len(line.encode()) for line in LINES),
        "bytes_out": sum(len(line.encode()) for line in LINES) - removed_bytes,
        "bytes_removed": removed_bytes,
    }
    assert meta["n_docs"] == 6 == sum(s["n_docs"] for s in meta["shards"])
    store = ArtifactStore(str(tmp_path / "store"))
    kept = [
        t
        for s in meta["shards"]
        for t in pq.read_table(store.local_file("dedup", refs["dedup"].version, s["file"])).column("text").to_pylist()
    ]
    assert kept == list(dict.fromkeys(LINES))  # the first of each, in corpus order
    # Counting and encoding read the dedup output, not the corpus.
    assert store.manifest("counts", refs["counts"].version)["parents"] == {"corpus": refs["dedup"].key}
    assert store.manifest("tokens", refs["tokens"].version)["parents"]["corpus"] == refs["dedup"].key
    assert _meta(tmp_path, refs["tokens"])["totals"]["n_docs"] == 6
    assert _meta(tmp_path, refs["corpus"])["n_docs"] == 10


def test_dedup_off_leaves_the_chain_and_its_ids_as_they_are(tmp_path):
    off = chain(tmp_path / "off", DedupConfig())
    on = chain(tmp_path / "on", DedupConfig(mode="exact"))
    assert "dedup" not in off
    # counted from the corpus itself
    assert off["counts"].version == stages.counts_version(off["corpus"], stages.CountConfig())
    assert _meta(tmp_path / "off", off["tokens"])["totals"]["n_docs"] == 10
    assert on["corpus"].version == off["corpus"].version
    assert on["counts"].version != off["counts"].version


def test_dedup_output_is_deterministic(tmp_path):
    first = chain(tmp_path / "a", DedupConfig(mode="exact"))["dedup"]
    second = chain(tmp_path / "b", DedupConfig(mode="exact"))["dedup"]
    assert first.version == second.version
    files = [ArtifactStore(str(tmp_path / d / "store")).manifest("dedup", first.version)["files"] for d in ("a", "b")]
    assert files[0] == files[1]


def test_dedup_config_refuses_an_unknown_mode():
    from pipeline_lib.config import validate
    from pipeline_lib.errors import ConfigError

    with pytest.raises(ConfigError, match="mode"):
        validate(DedupConfig, {"mode": "fuzzy"}, "dedup")


# --------------------------------------------------------------------------- a new stage
def _lowercase(ctx: Context) -> Output:
    """A toy document stage: every document lowercased (written as the dedup writes)."""
    import pyarrow as pa

    from pipeline_lib.corpus import SHARD_SCHEMA

    corpus = ctx.inputs["corpus"]
    assert ctx.staging is not None
    shards = []
    for s in engine.corpus_shards(ctx.store, corpus):
        table = pq.read_table(ctx.store.local_file(corpus.kind, corpus.version, s["file"]))
        lowered = pa.table(
            [
                pa.array([t.lower() for t in table.column("text").to_pylist()], pa.large_string()),
                table.column("source"),
            ],
            schema=SHARD_SCHEMA,
        )
        with ctx.staging.open_write(s["file"]) as tmp:
            pq.write_table(lowered, tmp)
        shards.append(dict(s))
    return Output(
        files=dict(ctx.staging.written),
        meta={"shards": shards, "n_docs": sum(s["n_docs"] for s in shards), "lowercased": True},
    )


@dataclasses.dataclass(frozen=True)
class ToyLowercaseConfig:
    __pydantic_config__ = STRICT

    lowercase_documents: Annotated[bool, doc("lowercase every document before counting")] = False

    def params(self) -> dict[str, Any]:
        return {}

    def enabled(self) -> bool:
        return self.lowercase_documents


@pytest.fixture
def toy_stage():
    stage = Stage(
        name="lowercase_documents",
        kind="lowered",
        inputs=("corpus",),
        config=ToyLowercaseConfig,
        output_version=1,
        run=_lowercase,
    )
    entry = register(
        DocumentStage(
            stage,
            option="lowered",
            title="toy options",
            summary=lambda meta: {"documents": meta["n_docs"]},
            example=ToyLowercaseConfig(True),
        )
    )
    yield entry
    unregister("lowered")


def test_the_documents_type_is_the_same_once_a_stage_has_come_and_gone():
    """The flows keep the `documents` type they were defined with: the same set of stages
    (after a registered stage is removed again) gives back that very class, or every flow
    run after it would refuse its parameters (one test's toy stage did that to 16 others)."""
    before = documents_config()
    stage = Stage(
        name="noop_documents",
        kind="noop",
        inputs=("corpus",),
        config=ToyLowercaseConfig,
        output_version=1,
        run=_lowercase,
    )
    register(DocumentStage(stage, option="noop", title="noop", summary=dict, example=ToyLowercaseConfig(True)))
    try:
        assert documents_config() is not before and "noop" in {f.name for f in dataclasses.fields(documents_config())}
    finally:
        unregister("noop")
    assert documents_config() is before


def test_a_registered_stage_is_picked_up_by_configs_cli_and_flow_parameters(tmp_path, toy_stage):
    """Registering a document stage (its spec and config: the two files of a new stage) is
    all it takes: the configs by name, the CLI's options, the flows' `documents` parameter
    and the chain run it, with no other edit."""
    from flows.cli import RUN_CONFIGS, build_parser, configs_from_args
    from pipeline_lib.config import validate
    from pipeline_lib.stage_configs import stage_configs

    config_cls = toy_stage.stage.config
    assert stage_configs()["lowered"] is config_cls
    args = build_parser(["run"]).parse_args(["run", "--lowercase-documents", "--dedup", "exact"])
    documents = configs_from_args(args, RUN_CONFIGS)["documents"]
    assert documents.lowered == config_cls(lowercase_documents=True) and documents.dedup == DedupConfig(mode="exact")
    assert (
        validate(
            documents_config(), {"lowered": {"lowercase_documents": True}}, "documents"
        ).lowered.lowercase_documents
        is True
    )

    refs = chain(
        tmp_path,
        DedupConfig(mode="exact"),
        lines=["Alpha", "alpha", "Beta", "Alpha"],
        lowered=config_cls(lowercase_documents=True),
    )
    store = ArtifactStore(str(tmp_path / "store"))
    # In option order: dedup (Alpha, alpha, Beta), then lowercase; counting reads the last.
    assert store.manifest("counts", refs["counts"].version)["parents"] == {"corpus": refs["lowered"].key}
    assert store.manifest("lowered", refs["lowered"].version)["parents"] == {"corpus": refs["dedup"].key}
    assert _meta(tmp_path, refs["tokens"])["totals"]["n_docs"] == 3


def test_a_new_document_stage_is_two_files():
    """The dedup stage, as added: a library module and its stage spec. Everything else
    that names it is data (the golden digests); no module of the flows, tasks, CLI or
    deployments names the dedup stage or its config."""
    new_stage_files = {"pipeline_lib/dedup.py", "pipeline_lib/stages/documents/dedup.py"}
    naming = set()
    for layer in ("pipeline_lib", "tasks", "flows", "deployments"):
        for path in (ROOT / layer).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            if "DedupConfig" in text or "DEDUP" in text or "pipeline_lib.dedup" in text:
                naming.add(str(path.relative_to(ROOT)))
    assert naming == new_stage_files
    assert {e.stage.name for e in document_stages()} >= {DEDUP.name}


def test_the_cli_runs_dedup_in_the_chain_with_one_flag():
    """`--dedup exact` is generated from DedupConfig like every stage option, in the
    commands that make a corpus."""
    from flows.cli import build_parser

    for command in (["run"], ["tokenizer", "train"], ["encode"]):
        args = build_parser(command).parse_args([*command, "--dedup", "exact"])
        assert getattr(args, "DedupConfig.mode") == "exact"


def test_deployment_parameters_turn_dedup_on_and_refuse_a_bad_mode():
    """A deployment (or a run triggered in the UI) gives the flows' `documents` parameter as
    a dict: it is validated against the registered configs like every stage config."""
    from flows.pipeline import check_parameters, tokenmill_pipeline
    from pipeline_lib.errors import ConfigError

    checked = check_parameters(tokenmill_pipeline, {"documents": {"dedup": {"mode": "exact"}}})
    assert checked["documents"].dedup == DedupConfig(mode="exact")
    with pytest.raises(ConfigError, match=r"documents\.dedup\.mode"):
        check_parameters(tokenmill_pipeline, {"documents": {"dedup": {"mode": "fuzzy"}}})
