"""Prefect task: learn BPE merges from the reduced counts; the merge log of a tokenizer."""

from __future__ import annotations

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from pipeline_lib import lab, stages
from pipeline_lib.store import ArtifactStore, VersionRef
from tasks.factory import artifact_key, stage_tasks


def _learned(store, ref, logger) -> None:
    meta = store.manifest(ref.kind, ref.version)["meta"]
    logger.info("tokenizer: %d ids (%d merges) -> %s", meta["vocab_size"], meta["n_merges"], ref.uri)
    create_markdown_artifact(
        key=artifact_key("tokenizer-merges", store, ref),
        markdown=merges_markdown(meta),
        description=f"Tokenizer {ref.version}: first and last merges",
    )


def _show(token: str) -> str:
    return "`" + token.replace("`", "ˋ").replace("\n", "\\n").replace("\t", "\\t").replace(" ", "␣") + "`"


def merges_markdown(meta: dict) -> str:
    rows = "\n".join(f"| {i + 1} | {_show(a)} | {_show(b)} |" for i, (a, b) in enumerate(zip(meta["first_merges"], meta["last_merges"])))
    return (
        f"## Tokenizer: {meta['vocab_size']:,} ids, {meta['n_merges']:,} merges, unit `{meta.get('unit', 'byte')}`, pattern `{meta['pattern']}`\n\n"
        f"Special tokens: {', '.join(_show(t) for t in meta['special_tokens']) or 'none'}\n\n"
        f"| # | first merges | last merges |\n|---|---|---|\n{rows}\n\n"
        f"Longest tokens: {', '.join(_show(t) for t in meta['longest_tokens'])}\n"
    )


def show_merge_log(store: ArtifactStore, ref: VersionRef, every: int, logger) -> list[dict]:
    """Log every `every`-th merge of a published tokenizer (pair, new token, its count when
    merged) and make them a Prefect table artifact; returns the rows."""
    rows = lab.merge_log(stages.load_tokenizer(store, ref), every)
    for row in rows:
        logger.info("%s", lab.merge_line(row))
    create_table_artifact(
        key=artifact_key("tokenizer-merge-log", store, ref),
        table=rows,
        description=f"Tokenizer {ref.version}: every {every}th merge, with the pair's count when it was merged",
    )
    return rows


TOKENIZER = stage_tasks(stages.TOKENIZER, after=_learned)
learn_merges = TOKENIZER.task
