"""The tokenmill flows: the whole chain, and each stage as a flow of its own.

    download_corpus -> shard_corpus -> count_words (mapped) -> reduce_counts -> learn_merges
        -> encode_shard (mapped) -> write_token_manifest -> train_lm

Tasks hand each other small references (kind, version, uri, manifest sha256), never data.
Every task is cached on the version id of what it writes, so a rerun recomputes nothing
and a changed parameter recomputes only what depends on it. Mapped stages run on the
flow's task runner: threads by default (the compiled core releases the GIL), processes,
or Dask (`flows.runners`).
"""

# No `from __future__ import annotations` here: the flows' annotations must be the config
# classes themselves, not strings. Prefect validates a flow's parameters against them, and a
# served flow runs a cloudpickled copy of the function whose globals hold only the names its
# body uses: a string annotation ("CorpusConfig") would not resolve there.
import dataclasses
import typing
from typing import Any

from prefect import flow, get_run_logger, tags
from prefect.artifacts import create_markdown_artifact

from pipeline_lib.config import ReportConfig, validate
from pipeline_lib.corpus import CorpusConfig
from pipeline_lib.counting import CountConfig
from pipeline_lib.lm.stage_config import LMConfig
from pipeline_lib.patterns import is_custom
from pipeline_lib.stage_configs import stage_configs
from pipeline_lib.stages import REPORT_CORPUS, TokenizerConfig, compression_summary
from pipeline_lib.stages.documents import DocumentStages, document_stages, enabled
from pipeline_lib.store import VersionRef
from pipeline_lib.token_shards import EncodeConfig
from tasks.common import store_of, to_ref
from tasks.corpus import DOWNLOAD, SHARD
from tasks.counting import COUNTS
from tasks.documents import DOCUMENT_TASKS
from tasks.encoding import TOKENS
from tasks.factory import artifact_key
from tasks.lm import TRAIN
from tasks.report import tokenizer_report
from tasks.tokenizer import TOKENIZER, show_merge_log, show_train_trace

DEFAULT_STORE = "./artifacts"

# Every stage's parameters are one config (pipeline_lib.config): a flow takes the configs of
# the stages it runs, as parameters named here. Prefect validates a dict given for one (a
# deployment's parameters) against the config's fields before the run starts.
CONFIG_PARAMETERS: dict[str, type] = {name: cls for name, cls in stage_configs().items() if name != "sample"}


def config_parameters(fn) -> dict[str, type]:
    """``{parameter: config class}`` of a flow (or its function): the configs it takes (not
    the `VersionRef`s of its inputs)."""
    fn = getattr(fn, "fn", fn)
    hints = typing.get_type_hints(fn)
    return {
        name: tp
        for name, tp in hints.items()
        if isinstance(tp, type) and dataclasses.is_dataclass(tp) and tp is not VersionRef
    }


def check_parameters(fn, parameters: dict[str, Any]) -> dict[str, Any]:
    """`parameters` for flow `fn` with each config given as a dict validated (ConfigError
    naming the parameter and field otherwise); an unknown parameter is refused too."""
    fn = getattr(fn, "fn", fn)
    import inspect

    known = set(inspect.signature(fn).parameters)
    not_taken = sorted(set(parameters) - known)
    if not_taken:
        from pipeline_lib.errors import ConfigError

        raise ConfigError(f"{fn.__name__}: unknown parameter(s) {not_taken}; it takes {sorted(known)}")
    configs = config_parameters(fn)
    return {k: (validate(configs[k], v, k) if k in configs else v) for k, v in parameters.items()}


# --------------------------------------------------------------------------- run names and tags
# What a data engineer reads in the UI's run list: `pipeline-tinyshakespeare-cl100k-4k@artifacts`,
# `tokenizer-cl100k-32k@tm` ... and tags to filter by (stage tags come from tasks.factory).
def _field(config: Any, name: str, default: Any) -> Any:
    """A config field, whether the flow got the config or (from a deployment) a dict."""
    if isinstance(config, dict):
        return config.get(name, default)
    return getattr(config, name, default)


def _short(url: Any) -> str:
    """The last path component of a store or corpus URL, without extensions: `s3://b/tm` -> `tm`."""
    text = str(url or "").rstrip("/")
    tail = text.rsplit("/", 1)[-1] or text
    return tail.split(".", 1)[0] or tail


def _vocab(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _corpus_name(corpus: Any) -> str:
    sources = _field(corpus, "sources", None) or CorpusConfig().sources
    name = _short(sources[0] if isinstance(sources, (list, tuple)) else sources)
    return name + (f"+{len(sources) - 1}" if isinstance(sources, (list, tuple)) and len(sources) > 1 else "")


def _run_name(kind: str):
    """A `flow_run_name` callable: the kind, what the run works on, and the store."""

    def name() -> str:
        from prefect.runtime import flow_run

        p = flow_run.parameters or {}
        store = _short(p.get("store", DEFAULT_STORE))
        count, tok = p.get("count", CountConfig()), p.get("tokenizer", TokenizerConfig())
        pattern = _field(count, "pattern", CountConfig().pattern)
        if is_custom(pattern):
            pattern = "regex"  # the regex itself is in the parameters; a name stays short
        tok_unit = _field(tok, "unit", "byte")
        if tok_unit != "byte":
            pattern = f"{tok_unit}-{pattern}"
        vocab = _vocab(int(_field(tok, "vocab_size", TokenizerConfig().vocab_size)))
        if kind == "pipeline":
            return f"pipeline-{_corpus_name(p.get('corpus', CorpusConfig()))}-{pattern}-{vocab}@{store}"
        if kind == "tokenizer":
            return f"tokenizer-{pattern}-{vocab}@{store}"
        if kind == "tokenizer-train":
            return f"tokenizer-{_corpus_name(p.get('corpus', CorpusConfig()))}-{pattern}-{vocab}@{store}"
        if kind in ("corpus", "report"):
            return f"{kind}-{_corpus_name(p.get('corpus', CorpusConfig()))}@{store}"
        return f"{kind}@{store}"

    return name


def _run_tags(store: str, corpus: Any = None, corpus_ref: VersionRef | None = None) -> list[str]:
    """Tags for the task runs of a flow run: the store and the corpus they work on."""
    out = ["tokenmill", f"store:{_short(store)}"]
    if corpus is not None:
        out.append(f"corpus:{_corpus_name(corpus)}")
    elif corpus_ref:
        out.append(f"corpus:{to_ref(corpus_ref).version[:12]}")
    return out


def _with_storage(corpus: CorpusConfig, storage_options: dict | None) -> CorpusConfig:
    return dataclasses.replace(validate(CorpusConfig, corpus, "corpus"), storage_options=storage_options or {})


def _corpus(
    store: str, corpus: CorpusConfig, storage_options: dict | None, documents: DocumentStages | None = None
) -> VersionRef:
    """The corpus shards, then each document stage `documents` turns on (`--dedup exact`),
    each reading the shards the one before wrote; counting and encoding read the last."""
    cfg = _with_storage(corpus, storage_options)
    raw = DOWNLOAD(store, {}, cfg, storage_options)
    ref = SHARD(store, {"raw": raw}, cfg, storage_options)
    for entry, config in enabled(validate(DocumentStages, documents, "documents")):
        ref = DOCUMENT_TASKS[entry.option](store, {"corpus": ref}, config, storage_options)
    return ref


def _bytes_per_task(corpus: CorpusConfig | dict | None) -> int:
    """The corpus config's byte budget per task of the per-shard stages (None: the default)."""
    return validate(CorpusConfig, corpus, "corpus").task_bytes


def _tokenizer(
    store: str,
    corpus_ref: VersionRef,
    count: CountConfig,
    tokenizer: TokenizerConfig,
    storage_options: dict | None,
    corpus: CorpusConfig | None,
) -> VersionRef:
    count, tokenizer = validate(CountConfig, count, "count"), validate(TokenizerConfig, tokenizer, "tokenizer")
    counts = COUNTS(store, {"corpus": corpus_ref}, count, storage_options, _bytes_per_task(corpus))
    return TOKENIZER(store, {"counts": counts}, tokenizer, storage_options)


def _encode(
    store: str,
    corpus_ref: VersionRef,
    tokenizer_ref: VersionRef,
    encode: EncodeConfig,
    storage_options: dict | None,
    corpus: CorpusConfig | None,
) -> VersionRef:
    encode = validate(EncodeConfig, encode, "encode")
    return TOKENS(
        store, {"corpus": corpus_ref, "tokenizer": tokenizer_ref}, encode, storage_options, _bytes_per_task(corpus)
    )


@flow(name="tokenmill-corpus", flow_run_name=_run_name("corpus"))
def corpus_flow(
    corpus: CorpusConfig = CorpusConfig(),
    store: str = DEFAULT_STORE,
    storage_options: dict | None = None,
    documents: DocumentStages = DocumentStages(),
) -> VersionRef:
    """Download the corpus into the store and split it into Parquet shards (then the
    document stages `documents` turns on: the returned ref is their output)."""
    with tags(*_run_tags(store, corpus)):
        return _corpus(store, corpus, storage_options, documents)


@flow(name="tokenmill-tokenizer", flow_run_name=_run_name("tokenizer"))
def tokenizer_flow(
    corpus_ref: VersionRef,
    store: str = DEFAULT_STORE,
    count: CountConfig = CountConfig(),
    tokenizer: TokenizerConfig = TokenizerConfig(),
    storage_options: dict | None = None,
    corpus: CorpusConfig | None = None,
    log_merges: int = 0,
    trace: bool = False,
) -> VersionRef:
    """Count pieces per shard in parallel, reduce, learn the merges (a tokenizer version).
    `corpus`: the config `corpus_ref` was made with, for its byte budget per counting task
    (none: the default); `log_merges` N: log every N-th merge and make a table artifact of
    them (0: none); `trace`: log the training pieces after each merge (an artifact too)."""
    with tags(*_run_tags(store, corpus_ref=corpus_ref)):
        ref = _tokenizer(store, corpus_ref, count, tokenizer, storage_options, corpus)
        if log_merges:
            show_merge_log(store_of(store, storage_options), ref, log_merges, get_run_logger())
        if trace:
            show_train_trace(store_of(store, storage_options), ref, get_run_logger())
        return ref


@flow(name="tokenmill-tokenizer-train", flow_run_name=_run_name("tokenizer-train"))
def tokenizer_train_flow(
    corpus: CorpusConfig = CorpusConfig(),
    count: CountConfig = CountConfig(),
    tokenizer: TokenizerConfig = TokenizerConfig(),
    store: str = DEFAULT_STORE,
    storage_options: dict | None = None,
    log_merges: int = 0,
    trace: bool = False,
    documents: DocumentStages = DocumentStages(),
) -> VersionRef:
    """`corpus_flow` then `tokenizer_flow` in one flow run (what `tokenmill tokenizer train`
    runs): the same tasks, tags and artifacts, without a second flow run's start and end."""
    with tags(*_run_tags(store, corpus)):
        corpus_ref = _corpus(store, corpus, storage_options, documents)
    return tokenizer_flow.fn(corpus_ref, store, count, tokenizer, storage_options, corpus, log_merges, trace)


@flow(name="tokenmill-encode", flow_run_name=_run_name("encode"))
def encode_flow(
    corpus_ref: VersionRef,
    tokenizer_ref: VersionRef,
    store: str = DEFAULT_STORE,
    encode: EncodeConfig = EncodeConfig(),
    storage_options: dict | None = None,
    corpus: CorpusConfig | None = None,
) -> VersionRef:
    """Encode every corpus shard in parallel and publish the token shards.
    `corpus`: the config `corpus_ref` was made with, for its byte budget per encoding task
    (none: the default)."""
    with tags(*_run_tags(store, corpus_ref=corpus_ref)):
        return _encode(store, corpus_ref, tokenizer_ref, encode, storage_options, corpus)


@flow(name="tokenmill-encode-corpus", flow_run_name=_run_name("encode"))
def encode_corpus_flow(
    corpus: CorpusConfig,
    tokenizer_ref: VersionRef,
    store: str = DEFAULT_STORE,
    encode: EncodeConfig = EncodeConfig(),
    storage_options: dict | None = None,
    documents: DocumentStages = DocumentStages(),
) -> VersionRef:
    """`corpus_flow` then `encode_flow` in one flow run (what `tokenmill encode` runs): a
    corpus encoded with an existing tokenizer, without a second flow run's start and end."""
    with tags(*_run_tags(store, corpus)):
        corpus_ref = _corpus(store, corpus, storage_options, documents)
    return encode_flow.fn(corpus_ref, tokenizer_ref, store, encode, storage_options, corpus)


@flow(name="tokenmill-lm", flow_run_name=_run_name("lm"))
def lm_flow(
    tokens_ref: VersionRef,
    tokenizer_ref: VersionRef,
    store: str = DEFAULT_STORE,
    lm: LMConfig = LMConfig(),
    storage_options: dict | None = None,
) -> VersionRef:
    """Train the GPT on a tokens version."""
    cfg = validate(LMConfig, lm, "lm").train_config()
    with tags(*_run_tags(store)):
        return TRAIN(store, {"tokens": tokens_ref, "tokenizer": tokenizer_ref}, cfg, storage_options)


@flow(name="tokenmill-report", flow_run_name=_run_name("report"))
def report_flow(
    corpus: CorpusConfig = REPORT_CORPUS,
    report: ReportConfig = ReportConfig(),
    store: str = DEFAULT_STORE,
    storage_options: dict | None = None,
) -> VersionRef:
    """The seeds' questions on any corpus: compression vs vocabulary size, fertility per language."""
    with tags(*_run_tags(store, corpus)):
        corpus_ref = _corpus(store, corpus, storage_options)
        return tokenizer_report(store, corpus_ref, validate(ReportConfig, report, "report"), storage_options)


@flow(name="tokenmill-pipeline", flow_run_name=_run_name("pipeline"))
def tokenmill_pipeline(
    corpus: CorpusConfig = CorpusConfig(),
    count: CountConfig = CountConfig(),
    tokenizer: TokenizerConfig = TokenizerConfig(),
    encode: EncodeConfig = EncodeConfig(),
    lm: LMConfig = LMConfig(),
    store: str = DEFAULT_STORE,
    train_model: bool = True,
    storage_options: dict | None = None,
    documents: DocumentStages = DocumentStages(),
) -> dict[str, Any]:
    """The whole chain: corpus -> shards -> [document stages, e.g. dedup, when on] ->
    counts -> tokenizer -> token shards -> GPT.

    Returns the references of every artifact and the headline figures.
    """
    logger = get_run_logger()
    lm = validate(LMConfig, lm, "lm")  # every config is checked before any stage runs
    corpus = validate(CorpusConfig, corpus, "corpus")
    documents = validate(DocumentStages, documents, "documents")
    with tags(*_run_tags(store, corpus)):
        corpus_ref = _corpus(store, corpus, storage_options, documents)
        tokenizer_ref = _tokenizer(store, corpus_ref, count, tokenizer, storage_options, corpus)
        tokens = _encode(store, corpus_ref, tokenizer_ref, encode, storage_options, corpus)
        model = (
            TRAIN(store, {"tokens": tokens, "tokenizer": tokenizer_ref}, lm.train_config(), storage_options)
            if train_model
            else None
        )

    summary = summarize(store, corpus_ref, tokenizer_ref, tokens, model, storage_options)
    summary_key = artifact_key("tokenmill-summary", store_of(store, storage_options), tokens)
    create_markdown_artifact(
        key=summary_key, markdown=summary_markdown(summary), description="tokenmill run: artifacts and headline figures"
    )
    logger.info("done: %s", {k: v for k, v in summary["figures"].items()})
    return summary


def summarize(
    store_url: str,
    corpus: VersionRef,
    tokenizer: VersionRef,
    tokens: VersionRef,
    model: VersionRef | None,
    storage_options: dict | None = None,
) -> dict[str, Any]:
    """The run's summary, a JSON document: its refs (in their JSON form), the artifacts'
    URIs, the headline figures and a sample."""
    store = store_of(store_url, storage_options)
    cmeta = store.manifest(corpus.kind, corpus.version)["meta"]
    tmeta = store.manifest(tokenizer.kind, tokenizer.version)["meta"]
    kmeta = store.manifest(tokens.kind, tokens.version)["meta"]
    comp = compression_summary(kmeta)
    n_text_tokens = comp["tokens"] - (kmeta["totals"]["n_docs"] if kmeta.get("separator") else 0)
    figures: dict[str, Any] = {
        "vocab_size": tmeta["vocab_size"],
        "n_merges": tmeta["n_merges"],
        "pattern": tmeta["pattern"],
        "documents": cmeta["n_docs"],
        "corpus_bytes": cmeta["n_bytes"],
        "corpus_chars": cmeta.get("n_chars"),
        "tokens_written": kmeta["totals"]["n_tokens"],
        "bytes_per_token": round(comp["bytes_per_token"], 3),
        "chars_per_token": round(cmeta["n_chars"] / max(1, n_text_tokens), 3) if cmeta.get("n_chars") else None,
    }
    figures.update(_document_figures(store, corpus))
    artifacts = {k: r.uri for k, r in (("corpus", corpus), ("tokenizer", tokenizer), ("tokens", tokens))}
    sample = None
    if model is not None:
        mm = store.manifest(model.kind, model.version)["meta"]
        figures.update(
            {
                "train_loss": mm["metrics"].get("final_train_loss"),
                "val_loss": mm["metrics"].get("final_val_loss"),
                "val_bpb": mm["metrics"].get("val_bpb"),
                "lm_steps": mm["metrics"].get("steps"),
                "lm_params": mm.get("n_params"),
            }
        )
        artifacts["model"] = model.uri
        artifacts["loss_curve"] = store.uri(model.kind, model.version, "loss.png")
        sample = mm["samples"][0] if mm["samples"] else None
    refs = {"corpus": corpus, "tokenizer": tokenizer, "tokens": tokens, "model": model}
    return {
        "refs": {k: r.to_dict() if r is not None else None for k, r in refs.items()},
        "artifacts": artifacts,
        "figures": figures,
        "sample": sample,
    }


def _document_figures(store: Any, corpus: VersionRef) -> dict[str, Any]:
    """The figures of the document stages that made `corpus` (``dedup_documents_removed``
    ...), walking from the last one back to the corpus."""
    by_kind = {entry.stage.kind: entry for entry in document_stages()}
    figures: dict[str, Any] = {}
    ref = corpus
    while ref.kind in by_kind:
        entry = by_kind[ref.kind]
        meta = store.manifest(ref.kind, ref.version)["meta"]
        figures = {
            f"{entry.option}_{k}": v for k, v in entry.summary(meta).items() if isinstance(v, (int, float))
        } | figures
        ref = store.parent(ref, "corpus")
    return figures


def summary_markdown(summary: dict[str, Any]) -> str:
    f = summary["figures"]
    rows = "\n".join(f"| {k} | {v} |" for k, v in f.items())
    arts = "\n".join(f"- **{k}**: `{v}`" for k, v in summary["artifacts"].items())
    sample = f"\n### Sample\n\n```text\n{summary['sample']}\n```\n" if summary.get("sample") else ""
    return f"## tokenmill run\n\n| figure | value |\n|---|---|\n{rows}\n\n### Artifacts\n\n{arts}\n{sample}"
