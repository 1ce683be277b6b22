"""Prefect task: learn BPE merges from the reduced counts; the merge log of a tokenizer."""

from __future__ import annotations

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from pipeline_lib import lab, stages
from pipeline_lib.store import ArtifactStore, VersionRef
from tasks.factory import artifact_key, stage_tasks

# flows.console prints records with this extra as their message alone (no Prefect prefix).
PLAIN = {"plain": True}


def _learned(store, ref, logger) -> None:
    meta = store.manifest(ref.kind, ref.version)["meta"]
    if meta.get("plan"):
        logger.info("%s", meta["plan"], extra=PLAIN)
    logger.info("tokenizer: %d ids (%d merges) -> %s", meta["vocab_size"], meta["n_merges"], ref.uri)
    if meta.get("training_compression"):
        logger.info("%s", lab.compression_line(meta["training_compression"]), extra=PLAIN)
    create_markdown_artifact(
        key=artifact_key("tokenizer-merges", store, ref),
        markdown=merges_markdown(meta),
        description=f"Tokenizer {ref.version}: first and last merges",
    )


def _show(token: str) -> str:
    return "`" + token.replace("`", "ˋ").replace("\n", "\\n").replace("\t", "\\t").replace(" ", "␣") + "`"


def merges_markdown(meta: dict) -> str:
    rows = "\n".join(
        f"| {i + 1} | {_show(a)} | {_show(b)} |"
        for i, (a, b) in enumerate(zip(meta["first_merges"], meta["last_merges"]))
    )
    return (
        f"## Tokenizer: {meta['vocab_size']:,} ids, {meta['n_merges']:,} merges, unit `{meta.get('unit', 'byte')}`, "
        f"pattern `{meta['pattern']}`\n\n"
        f"Special tokens: {', '.join(_show(t) for t in meta['special_tokens']) or 'none'}\n\n"
        f"| # | first merges | last merges |\n|---|---|---|\n{rows}\n\n"
        f"Longest tokens: {', '.join(_show(t) for t in meta['longest_tokens'])}\n"
    )


def show_merge_log(store: ArtifactStore, ref: VersionRef, every: int, logger) -> list[dict]:
    """Log every `every`-th merge of a published tokenizer (pair, new token, its count when
    merged) and make them a Prefect table artifact; returns the rows."""
    rows = lab.merge_log(stages.load_tokenizer(store, ref), every)
    for row in rows:
        logger.info("%s", lab.merge_line(row), extra=PLAIN)
    create_table_artifact(
        key=artifact_key("tokenizer-merge-log", store, ref),
        table=rows,
        description=f"Tokenizer {ref.version}: every {every}th merge, with the pair's count when it was merged",
    )
    return rows


def training_pieces(store: ArtifactStore, ref: VersionRef, tok) -> tuple[list[bytes], list[int]]:
    """The pieces a published tokenizer was trained on (its counts parent), as its unit
    counts them (the word unit: words), with their counts."""
    import os

    from pipeline_lib import bpe_reference
    from pipeline_lib.counting import COUNTS_FILE, read_counts

    parent = store.parent(ref, "counts")
    pieces, counts = read_counts(os.path.join(store.local_dir(parent.kind, parent.version), COUNTS_FILE))
    if tok.unit == "word":
        words = bpe_reference.word_counts(dict(zip(pieces, counts.tolist())), tok.pattern, tok.lowercase)
        return list(words), list(words.values())
    return pieces, counts.tolist()


def show_train_trace(store: ArtifactStore, ref: VersionRef, logger, max_pieces: int = 20) -> dict:
    """Log the training pieces after each merge (the most frequent `max_pieces`) and keep
    them as a Markdown artifact; returns the trace (`lab.train_trace`)."""
    tok = stages.load_tokenizer(store, ref)
    trace = lab.train_trace(tok, *training_pieces(store, ref, tok), max_pieces=max_pieces)
    text = lab.train_trace_text(trace)
    for line in text.splitlines():
        logger.info("%s", line, extra=PLAIN)
    create_markdown_artifact(
        key=artifact_key("tokenizer-train-trace", store, ref),
        markdown=f"```\n{text}\n```\n",
        description=f"Tokenizer {ref.version}: the training pieces after each merge",
    )
    return trace


TOKENIZER = stage_tasks(stages.TOKENIZER, after=_learned)
learn_merges = TOKENIZER.task
