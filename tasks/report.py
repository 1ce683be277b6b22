"""Prefect task: the tokenizer report (compression curve, fertility, notable tokens)."""

from __future__ import annotations

import base64
import json

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from pipeline_lib import report as report_lib
from pipeline_lib.config import ReportConfig
from pipeline_lib.store import VersionRef
from tasks.common import store_of, to_ref


@task(name="tokenizer_report")
def tokenizer_report(
    store_url: str, corpus: VersionRef, config: ReportConfig, storage_options: dict | None = None
) -> VersionRef:
    store = store_of(store_url, storage_options)
    ref = report_lib.tokenizer_report(store, to_ref(corpus), config.pattern, list(config.vocab_sizes))
    report = json.loads(store.read_bytes(ref.kind, ref.version, "report.json"))
    png = base64.b64encode(store.read_bytes(ref.kind, ref.version, "compression.png")).decode()
    md = store.read_bytes(ref.kind, ref.version, "report.md").decode()
    create_markdown_artifact(
        key="tokenizer-report",
        markdown=f"![compression](data:image/png;base64,{png})\n\n{md}",
        description="Compression vs vocabulary size, fertility per language",
    )
    char_level = {r["vocab_size"]: r["chars_per_token"] for r in report["char_level"]["compression"]}
    rows = [{**r, "char_level_bpe_chars_per_token": char_level.get(r["vocab_size"])} for r in report["compression"]]
    create_table_artifact(
        key="compression-curve",
        table=[{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in rows],
        description="Held-out compression per vocabulary size: byte-level BPE, and character-level BPE trained in the "
        "same run",
    )
    return ref
