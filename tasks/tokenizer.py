"""Prefect task: learn BPE merges from the reduced counts."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from pipeline_lib import stages
from pipeline_lib.stages import TOKENIZER_KIND, TOKENIZER_MODULES, TokenizerConfig
from pipeline_lib.store import version_id
from pipeline_lib.version import code_version
from tasks.common import checked_key, progress, ref_dict, store_of, to_ref


def _merges_key(context, parameters: dict[str, Any]) -> str:
    counts, cfg = to_ref(parameters["counts"]), parameters["config"]
    version = version_id(TOKENIZER_KIND, {"counts": counts.key}, cfg.params(), code_version(*TOKENIZER_MODULES))
    store = store_of(parameters["store_url"], parameters.get("storage_options"))
    return checked_key(store, f"merges-{version}", store.usable(TOKENIZER_KIND, version))


@task(name="learn_merges", cache_key_fn=_merges_key, persist_result=True, result_serializer="json")
def learn_merges(store_url: str, counts: dict[str, str], config: TokenizerConfig, storage_options: dict | None = None) -> dict[str, str]:
    logger = get_run_logger()
    store = store_of(store_url, storage_options)

    def on_merges(done: int, total: int) -> None:
        progress("learn_merges", done=done, total=total)
        if done % 10_000 < 1000:
            logger.info("merges: %d / %d", done, total)

    ref = stages.learn_tokenizer(store, to_ref(counts), config, progress=on_merges)
    meta = store.manifest(ref.kind, ref.version)["meta"]
    logger.info("tokenizer: %d ids (%d merges) -> %s", meta["vocab_size"], meta["n_merges"], ref.uri)
    create_markdown_artifact(
        key="tokenizer-merges",
        markdown=merges_markdown(meta),
        description=f"Tokenizer {ref.version}: first and last merges",
    )
    return ref_dict(ref)


def _show(token: str) -> str:
    return "`" + token.replace("`", "ˋ").replace("\n", "\\n").replace("\t", "\\t").replace(" ", "␣") + "`"


def merges_markdown(meta: dict) -> str:
    rows = "\n".join(
        f"| {i + 1} | {_show(a)} | {_show(b)} |"
        for i, (a, b) in enumerate(zip(meta["first_merges"], meta["last_merges"]))
    )
    return (
        f"## Tokenizer: {meta['vocab_size']:,} ids, {meta['n_merges']:,} merges, pattern `{meta['pattern']}`\n\n"
        f"Special tokens: {', '.join(_show(t) for t in meta['special_tokens']) or 'none'}\n\n"
        f"| # | first merges | last merges |\n|---|---|---|\n{rows}\n\n"
        f"Longest tokens: {', '.join(_show(t) for t in meta['longest_tokens'])}\n"
    )
