"""Stage: exact document dedup (optional, off by default); the work is `pipeline_lib.dedup`'s."""

from __future__ import annotations

from pipeline_lib import dedup
from pipeline_lib.dedup import DEDUP_KIND, DedupConfig
from pipeline_lib.stages.documents import ROLE, DocumentStage, register
from pipeline_lib.stages.spec import Context, Output, Stage, corpus_shards


def _dedup(ctx: Context) -> Output:
    corpus, store = ctx.inputs[ROLE], ctx.store
    assert ctx.staging is not None  # the engine publishes this stage
    paths = [store.local_file(corpus.kind, corpus.version, s["file"]) for s in corpus_shards(store, corpus)]
    files, meta = dedup.write_deduped(ctx.staging, paths, store.manifest(corpus.kind, corpus.version)["meta"])
    return Output(files=files, meta=meta)


DEDUP = Stage(name="dedup_documents", kind=DEDUP_KIND, inputs=(ROLE,), config=DedupConfig, output_version=1, run=_dedup)

register(
    DocumentStage(
        DEDUP,
        option="dedup",
        title="dedup options (drop repeated documents before counting and encoding)",
        summary=dedup.summary,
        example=DedupConfig(mode="exact"),
    )
)
