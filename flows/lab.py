"""The tokenizer comparison as a Prefect flow: the table and the plot become run artifacts;
and the lab page attached to a run (`lab_page_flow`: a link artifact to the HTML file).

    compare_flow(corpus="s3://bucket/text.txt", compare=CompareConfig(units=("byte", "char", "word")))

The measuring is `pipeline_lib.lab.compare`; this module only reads the texts, runs it as a
task and publishes a table artifact (one row per tokenizer) and a Markdown artifact (the
plot, the table, fertility per language). `tokenmill compare --flow` runs it.
"""

# No `from __future__ import annotations`: Prefect validates the flow's parameters against
# the config class itself (see flows/pipeline.py).
import base64
import os
import tempfile
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

from pipeline_lib import lab
from pipeline_lib.config import validate


def read_text(url: str, storage_options: dict | None) -> str:
    from pipeline_lib.fsio import read_bytes

    return read_bytes(url, **(storage_options or {})).decode("utf-8", "replace")


@task(name="compare_tokenizers")
def compare_tokenizers(
    corpus: str,
    config: lab.CompareConfig,
    multilingual: str | None,
    encoding_files: dict[str, str],
    storage_options: dict | None,
) -> dict[str, Any]:
    logger = get_run_logger()
    text = read_text(corpus, storage_options)
    sample = read_text(multilingual, storage_options) if multilingual else None
    return lab.compare(text, config, corpus, sample, encoding_files, progress=logger.info)


def publish_artifacts(result: dict[str, Any], key: str = "tokenizer-comparison") -> None:
    """A table artifact of the rows and a Markdown artifact with the plot, the table and fertility."""
    create_table_artifact(
        key=key,
        table=[
            {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if k != "size_axis"}
            for row in result["rows"]
        ],
        description=f"Tokenizers measured on the same held-out text ({result['heldout_chars']:,} characters of "
        f"{result['source']})",
    )
    with tempfile.TemporaryDirectory(prefix="compare-") as tmp:
        png = os.path.join(tmp, "compare.png")
        lab.plot_comparison(result, png)
        with open(png, "rb") as f:
            image = base64.b64encode(f.read()).decode()
    create_markdown_artifact(
        key=f"{key}-report",
        markdown="![compression against vocabulary "
        f"size](data:image/png;base64,{image})\n\n{lab.compare_text(result, markdown=True)}",
        description="Compression, tokens per word, embedding size and throughput of each tokenizer; fertility per "
        "language",
    )


@flow(name="tokenmill-compare", flow_run_name="compare")
def compare_flow(
    corpus: str | None = None,
    compare: lab.CompareConfig = lab.CompareConfig(),
    multilingual: str | None = None,
    encoding_files: dict[str, str] | None = None,
    out: str | None = None,
    storage_options: dict | None = None,
) -> dict[str, Any]:
    """Compare tokenizers on the held-out end of `corpus` (default: the bundled tiny
    Shakespeare), fertility on the `multilingual` UDHR sample (default: the bundled one;
    "none": left out); write compare.md/.json/.png into `out` when given."""
    from pipeline_lib.corpus import DEFAULT_CORPUS
    from pipeline_lib.report import MULTILINGUAL

    config = validate(lab.CompareConfig, compare, "compare")
    sample = None if (multilingual or "").lower() == "none" else multilingual or MULTILINGUAL
    result = compare_tokenizers(corpus or DEFAULT_CORPUS, config, sample, dict(encoding_files or {}), storage_options)
    publish_artifacts(result)
    if out:
        lab.write_comparison(result, out)
    return result


@flow(name="tokenmill-lab-page", flow_run_name="lab-page")
def lab_page_flow(page: str, title: str, rows: list[dict[str, Any]]) -> str:
    """Attach a written lab page to a Prefect run: a link artifact to the HTML file (it
    needs no server: open it from the link) and a Markdown table of the compare rows
    (tokenizer, tokens, chars/token). Returns the page's URI."""
    uri = Path(page).resolve().as_uri()
    create_link_artifact(
        key="lab-page",
        link=uri,
        link_text=title,
        description="The tokenizer lab page: tokens, merge slider, compression curve, compare table",
    )
    table = "\n".join(f"| {r['name']} | {r['tokens']:,} | {r['chars_per_token']:.2f} |" for r in rows)
    create_markdown_artifact(
        key="lab-page-compare",
        markdown=f"## {title}\n\n[the lab page]({uri})\n\n| tokenizer | tokens | chars/token "
        f"|\n|---|---:|---:|\n{table}\n",
        description="The page's text under each tokenizer",
    )
    get_run_logger().info("lab page: %s", uri)
    return uri
