"""The tokenmill flows: the whole chain, and each stage as a flow of its own.

    download_corpus -> shard_corpus -> count_words (mapped) -> reduce_counts -> learn_merges
        -> encode_shard (mapped) -> write_token_manifest -> train_lm

Tasks hand each other small references (kind, version, uri, manifest sha256), never data.
Every task is cached on the version id of what it writes, so a rerun recomputes nothing
and a changed parameter recomputes only what depends on it. Mapped stages run on the
flow's task runner: threads by default (the compiled core releases the GIL), processes,
or Dask (`flows.runners`).
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, unmapped
from prefect.artifacts import create_markdown_artifact

from pipeline_lib.corpus import DEFAULT_CORPUS, CorpusConfig
from pipeline_lib.counting import CountConfig
from pipeline_lib.stages import TokenizerConfig, compression_summary
from pipeline_lib.token_shards import EncodeConfig
from tasks.common import store_of, to_ref
from tasks.corpus import download_corpus, shard_corpus
from tasks.counting import count_words, reduce_counts
from tasks.encoding import encode_shard, write_token_manifest
from tasks.lm import train_lm
from tasks.report import tokenizer_report
from tasks.tokenizer import learn_merges

DEFAULT_STORE = "./artifacts"


def _corpus_config(corpus, shards, documents, text_field, errors, storage_options, **extra) -> CorpusConfig:
    return CorpusConfig(
        sources=tuple(corpus or [DEFAULT_CORPUS]), documents=documents, text_field=text_field,
        errors=errors, n_shards=shards, storage_options=storage_options or {}, **extra,
    )


def _tokenizer_config(vocab_size: int, special_tokens: list[str] | None, min_frequency: int) -> TokenizerConfig:
    specials = special_tokens if special_tokens is not None else ["<|endoftext|>"]
    return TokenizerConfig(vocab_size=vocab_size, special_tokens=tuple(specials), min_frequency=min_frequency)


def _n_shards(store_url: str, corpus: dict, storage_options: dict | None) -> int:
    ref = to_ref(corpus)
    return len(store_of(store_url, storage_options).manifest(ref.kind, ref.version)["meta"]["shards"])


@flow(name="tokenmill-corpus")
def corpus_flow(
    corpus: list[str] | None = None,
    store: str = DEFAULT_STORE,
    shards: int = 2,
    documents: str = "line",
    text_field: str = "text",
    errors: str = "replace",
    max_source_bytes: int = 64 << 30,
    storage_options: dict | None = None,
) -> dict[str, str]:
    """Download the corpus into the store and split it into Parquet shards."""
    cfg = _corpus_config(corpus, shards, documents, text_field, errors, storage_options, max_source_bytes=max_source_bytes)
    raw = download_corpus(store, cfg, storage_options)
    return shard_corpus(store, raw, cfg, storage_options)


@flow(name="tokenmill-tokenizer")
def tokenizer_flow(
    corpus_ref: dict[str, str],
    store: str = DEFAULT_STORE,
    pattern: str = "cl100k",
    vocab_size: int = 4096,
    special_tokens: list[str] | None = None,
    min_frequency: int = 2,
    storage_options: dict | None = None,
) -> dict[str, str]:
    """Count pieces per shard in parallel, reduce, learn merges: a tokenizer version."""
    count_cfg = CountConfig(pattern=pattern)
    n = _n_shards(store, corpus_ref, storage_options)
    records = count_words.map(store, unmapped(corpus_ref), range(n), unmapped(count_cfg), unmapped(storage_options))
    counts = reduce_counts(store, corpus_ref, count_cfg, records.result(), storage_options)
    tok_cfg = _tokenizer_config(vocab_size, special_tokens, min_frequency)
    return learn_merges(store, counts, tok_cfg, storage_options)


@flow(name="tokenmill-encode")
def encode_flow(
    corpus_ref: dict[str, str],
    tokenizer_ref: dict[str, str],
    store: str = DEFAULT_STORE,
    separator: str | None = "<|endoftext|>",
    placement: str = "append",
    threads_per_shard: int = 1,
    storage_options: dict | None = None,
) -> dict[str, str]:
    """Encode every corpus shard in parallel and publish the token shards."""
    cfg = EncodeConfig(separator=separator, placement=placement, workers=threads_per_shard)
    n = _n_shards(store, corpus_ref, storage_options)
    records = encode_shard.map(store, unmapped(corpus_ref), unmapped(tokenizer_ref), range(n), unmapped(cfg), unmapped(storage_options))
    return write_token_manifest(store, corpus_ref, tokenizer_ref, cfg, records.result(), storage_options)


def lm_config(preset: str = "small", steps: int | None = None, device: str = "auto", seed: int = 1337, **overrides: Any):
    from pipeline_lib.lm import preset as lm_preset

    if steps is not None:
        overrides["max_steps"] = steps
        cfg = lm_preset(preset, device=device, seed=seed, **overrides)
        # Keep eval/checkpoint cadence sensible for short runs.
        interval = max(1, min(cfg.eval_interval, steps // 4 or 1))
        return cfg.replace(eval_interval=interval, ckpt_interval=max(interval, min(cfg.ckpt_interval, steps)),
                           warmup_steps=min(cfg.warmup_steps, max(0, steps // 10)))
    return lm_preset(preset, device=device, seed=seed, **overrides)


@flow(name="tokenmill-lm")
def lm_flow(
    tokens_ref: dict[str, str],
    tokenizer_ref: dict[str, str],
    store: str = DEFAULT_STORE,
    preset: str = "small",
    steps: int | None = None,
    device: str = "auto",
    seed: int = 1337,
    model_overrides: dict[str, Any] | None = None,
    storage_options: dict | None = None,
) -> dict[str, str]:
    """Train the GPT on a tokens version."""
    cfg = lm_config(preset, steps, device, seed, **(model_overrides or {}))
    return train_lm(store, tokens_ref, tokenizer_ref, cfg, storage_options)


@flow(name="tokenmill-report")
def report_flow(
    corpus: list[str] | None = None,
    store: str = DEFAULT_STORE,
    shards: int = 10,
    documents: str = "paragraph",
    pattern: str = "cl100k",
    vocab_sizes: list[int] | None = None,
    storage_options: dict | None = None,
) -> dict[str, str]:
    """The seeds' questions on any corpus: compression vs vocabulary size, fertility per language."""
    corpus_ref = corpus_flow(corpus, store, shards, documents, storage_options=storage_options)
    sizes = vocab_sizes or [256, 300, 491, 512, 1024, 2048, 4096, 8192, 16384, 32768]
    return tokenizer_report(store, corpus_ref, pattern, sizes, storage_options)


@flow(name="tokenmill-pipeline")
def tokenmill_pipeline(
    corpus: list[str] | None = None,
    store: str = DEFAULT_STORE,
    shards: int = 2,
    documents: str = "paragraph",
    text_field: str = "text",
    errors: str = "replace",
    pattern: str = "cl100k",
    vocab_size: int = 4096,
    special_tokens: list[str] | None = None,
    min_frequency: int = 2,
    separator: str | None = "<|endoftext|>",
    placement: str = "append",
    lm_preset: str = "small",
    lm_steps: int | None = 400,
    device: str = "auto",
    seed: int = 1337,
    model_overrides: dict[str, Any] | None = None,
    train_model: bool = True,
    storage_options: dict | None = None,
) -> dict[str, Any]:
    """The whole chain: corpus -> shards -> counts -> tokenizer -> token shards -> GPT.

    Returns the references of every artifact and the headline figures.
    """
    logger = get_run_logger()
    corpus_cfg = _corpus_config(corpus, shards, documents, text_field, errors, storage_options)
    raw = download_corpus(store, corpus_cfg, storage_options)
    corpus_ref = shard_corpus(store, raw, corpus_cfg, storage_options)
    n = _n_shards(store, corpus_ref, storage_options)

    count_cfg = CountConfig(pattern=pattern)
    count_records = count_words.map(store, unmapped(corpus_ref), range(n), unmapped(count_cfg), unmapped(storage_options))
    counts = reduce_counts(store, corpus_ref, count_cfg, count_records.result(), storage_options)
    tok_cfg = _tokenizer_config(vocab_size, special_tokens, min_frequency)
    tokenizer = learn_merges(store, counts, tok_cfg, storage_options)

    enc_cfg = EncodeConfig(separator=separator, placement=placement, workers=1)
    enc_records = encode_shard.map(store, unmapped(corpus_ref), unmapped(tokenizer), range(n), unmapped(enc_cfg), unmapped(storage_options))
    tokens = write_token_manifest(store, corpus_ref, tokenizer, enc_cfg, enc_records.result(), storage_options)

    model = None
    if train_model:
        cfg = lm_config(lm_preset, lm_steps, device, seed, **(model_overrides or {}))
        model = train_lm(store, tokens, tokenizer, cfg, storage_options)

    summary = summarize(store, corpus_ref, tokenizer, tokens, model, storage_options)
    create_markdown_artifact(key="tokenmill-summary", markdown=summary_markdown(summary), description="tokenmill run: artifacts and headline figures")
    logger.info("done: %s", {k: v for k, v in summary["figures"].items()})
    return summary


def summarize(store_url: str, corpus: dict, tokenizer: dict, tokens: dict, model: dict | None, storage_options: dict | None = None) -> dict[str, Any]:
    store = store_of(store_url, storage_options)
    cmeta = store.manifest(corpus["kind"], corpus["version"])["meta"]
    tmeta = store.manifest(tokenizer["kind"], tokenizer["version"])["meta"]
    kmeta = store.manifest(tokens["kind"], tokens["version"])["meta"]
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
    artifacts = {k: store.uri(r["kind"], r["version"]) for k, r in (("corpus", corpus), ("tokenizer", tokenizer), ("tokens", tokens)) }
    sample = None
    if model is not None:
        mm = store.manifest(model["kind"], model["version"])["meta"]
        figures.update({
            "train_loss": mm["metrics"].get("final_train_loss"),
            "val_loss": mm["metrics"].get("final_val_loss"),
            "val_bpb": mm["metrics"].get("val_bpb"),
            "lm_steps": mm["metrics"].get("steps"),
            "lm_params": mm.get("n_params"),
        })
        artifacts["model"] = store.uri(model["kind"], model["version"])
        artifacts["loss_curve"] = store.uri(model["kind"], model["version"], "loss.png")
        sample = mm["samples"][0] if mm["samples"] else None
    return {"refs": {"corpus": corpus, "tokenizer": tokenizer, "tokens": tokens, "model": model}, "artifacts": artifacts, "figures": figures, "sample": sample}


def summary_markdown(summary: dict[str, Any]) -> str:
    f = summary["figures"]
    rows = "\n".join(f"| {k} | {v} |" for k, v in f.items())
    arts = "\n".join(f"- **{k}**: `{v}`" for k, v in summary["artifacts"].items())
    sample = f"\n### Sample\n\n```text\n{summary['sample']}\n```\n" if summary.get("sample") else ""
    return f"## tokenmill run\n\n| figure | value |\n|---|---|\n{rows}\n\n### Artifacts\n\n{arts}\n{sample}"
