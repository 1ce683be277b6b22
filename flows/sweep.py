"""The sweep flow: which tokenizer makes the better model, at equal compute.

    corpus -> for each arm (unit, vocabulary size): counts -> tokenizer -> tokens
           -> plan equal compute -> train_lm per arm -> compare_arms -> sweep version

Every step is an ordinary stage task (flows.pipeline's subflow helpers, tasks.lm.TRAIN), so
each arm's artifacts are ordinary versions: a rerun is all Cached, and adding a vocabulary
size trains only the new arm. The planning and the comparison live in `pipeline_lib.sweep`.

Where the arms train: on the thread runner (the default) one after another. Arms in one
process share torch's intra-op thread pool and the GIL, so run side by side on 2 cores
they would only slow each other down, and their throughput figures (and, with
``--compute time``, how far each gets in its budget) would measure each other rather than
the arm. On the processes runner and on Dask (``--runner dask``: a LocalCluster, or a
cluster's workers with ``--dask-address``) the arms are mapped and train in parallel, one
per worker.
"""

# No `from __future__ import annotations`: Prefect validates the parameters against the
# config classes themselves (see flows.pipeline).
from typing import Any, cast

from prefect import flow, get_run_logger, tags, unmapped
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.context import FlowRunContext
from prefect.task_runners import ThreadPoolTaskRunner

from flows.pipeline import DEFAULT_STORE, _corpus, _corpus_name, _encode, _run_tags, _short, _tokenizer
from pipeline_lib import sweep as sweep_lib
from pipeline_lib.config import validate
from pipeline_lib.corpus import CorpusConfig
from pipeline_lib.counting import CountConfig
from pipeline_lib.errors import ConfigError, InputError
from pipeline_lib.lm.stage_config import LMConfig
from pipeline_lib.stages import TokenizerConfig
from pipeline_lib.store import VersionRef
from pipeline_lib.sweep import SweepConfig
from pipeline_lib.token_shards import EncodeConfig
from tasks.common import store_of, to_ref
from tasks.factory import artifact_key
from tasks.lm import TRAIN
from tasks.sweep import compare_task


def _sweep_run_name() -> str:
    from prefect.runtime import flow_run

    p = flow_run.parameters or {}
    try:
        sweep = validate(SweepConfig, p.get("sweep"), "sweep")
    except ConfigError:  # the run reports it; the name is only a name
        sweep = SweepConfig()
    arms = "+".join(sweep.units) + "-" + ",".join(str(v) for v in sorted(sweep.vocab_sizes))
    corpus, store = _corpus_name(p.get("corpus", CorpusConfig())), _short(p.get("store", DEFAULT_STORE))
    return f"sweep-{corpus}-{arms}-{sweep.compute}@{store}"


def arms_in_parallel() -> bool:
    """Whether this flow run's task runner trains the arms side by side (see module doc)."""
    ctx = FlowRunContext.get()
    return ctx is not None and not isinstance(ctx.task_runner, ThreadPoolTaskRunner)


def _train_arms(
    store: str, data: dict[str, dict[str, VersionRef]], plan: sweep_lib.Plan, storage_options: dict | None
) -> dict[str, VersionRef]:
    names = list(data)
    configs = [plan.lm[name].train_config() for name in names]
    if arms_in_parallel():
        futures = TRAIN.task.map(store, [data[n] for n in names], configs, unmapped(None), unmapped(storage_options))
        return {name: to_ref(ref) for name, ref in zip(names, futures.result())}
    return {
        name: to_ref(cast(VersionRef, TRAIN.task(store, data[name], cfg, None, storage_options)))
        for name, cfg in zip(names, configs)
    }


@flow(name="tokenmill-sweep", flow_run_name=_sweep_run_name)
def sweep_flow(
    corpus: CorpusConfig = CorpusConfig(),
    count: CountConfig = CountConfig(),
    tokenizer: TokenizerConfig = TokenizerConfig(),
    encode: EncodeConfig = EncodeConfig(),
    lm: LMConfig = LMConfig(),
    sweep: SweepConfig = SweepConfig(),
    store: str = DEFAULT_STORE,
    storage_options: dict | None = None,
) -> dict[str, Any]:
    """Train a tokenizer per (unit, vocabulary size) on one corpus, the same GPT on each at
    equal compute, and compare them in val bits per byte: a table and a plot."""
    logger = get_run_logger()
    count, tokenizer = validate(CountConfig, count, "count"), validate(TokenizerConfig, tokenizer, "tokenizer")
    corpus, lm, sweep = (
        validate(CorpusConfig, corpus, "corpus"),
        validate(LMConfig, lm, "lm"),
        validate(SweepConfig, sweep, "sweep"),
    )
    try:
        arms = sweep_lib.arms(sweep, tokenizer)  # every arm's configs checked before any work
    except InputError as e:
        raise ConfigError(f"sweep.{e}") from e
    with tags(*_run_tags(store, corpus), "sweep"):
        corpus_ref = _corpus(store, corpus, storage_options)
        data: dict[str, dict[str, VersionRef]] = {}
        for arm in arms:
            tokenizer_ref = _tokenizer(store, corpus_ref, count, arm.tokenizer, storage_options, corpus)
            tokens_ref = _encode(store, corpus_ref, tokenizer_ref, encode, storage_options, corpus)
            data[arm.name] = {"tokens": tokens_ref, "tokenizer": tokenizer_ref}
        st = store_of(store, storage_options)
        ids = {name: st.manifest("tokens", refs["tokens"].version)["meta"]["vocab_size"] for name, refs in data.items()}
        plan = sweep_lib.plan(sweep, lm, ids)
        where = "in parallel on the task runner" if arms_in_parallel() else "one at a time (thread runner)"
        logger.info("sweep: %d arms, %s, training %s", len(arms), plan.describe(), where)
        models = _train_arms(store, data, plan, storage_options)
        ref = compare_task(store, models, sweep, storage_options)

    # In the flow, not in a task: a Cached run shows the artifacts too.
    result, png = _read_result(st, ref)
    key = artifact_key("tokenmill-sweep", st, next(iter(models.values())))
    create_markdown_artifact(
        key=key,
        markdown=sweep_lib.summary_markdown(result, sweep_lib.plot_data_uri(png)),
        description="tokenizer sweep at equal compute",
    )
    create_table_artifact(
        key=f"{key}-table",
        table=[{h: sweep_lib.format_cell(k, r.get(k)) for h, k in sweep_lib.TABLE_COLUMNS} for r in result["rows"]],
        description="tokenizer sweep: one row per arm",
    )
    logger.info("sweep: %s", st.uri(ref.kind, ref.version, "sweep.md"))
    # A JSON document, as the pipeline's summary: the refs in their JSON form.
    return {
        "sweep": ref.to_dict(),
        "models": {n: r.to_dict() for n, r in models.items()},
        "tokens": {n: d["tokens"].to_dict() for n, d in data.items()},
        "result": result,
    }


def _read_result(st, ref: VersionRef) -> tuple[dict[str, Any], bytes]:
    import json

    result = json.loads(st.read_bytes(ref.kind, ref.version, "sweep.json"))
    return result, st.read_bytes(ref.kind, ref.version, "sweep.png")
