"""Golden outputs: a small bundled corpus through every stage, each output's file hashes
checked in (`tests/golden/chain.json`) beside the stage's output version.

A stage's output version is the code part of its version ids (`pipeline_lib.version`):
bumped exactly when its output bytes change. This test holds it to that, both ways:

* the output changed, the version did not: the store would hand out the old bytes under
  the old ids as if they were the new ones -> fail: bump ``output_version``;
* the version was bumped, the output did not change: every id downstream moves for
  nothing -> fail: undo the bump.

After a deliberate change (output and version both changed), regenerate the goldens:

    python tests/test_golden.py --update

The C++ core and the pure-Python reference are pinned by the same hashes (the second run
goes through the reference). Parquet files are hashed by their content (schema, row
groups, values), not their bytes, which name the pyarrow release that wrote them. The
LM's weights are not bit-exact across machines (float kernels differ by CPU and torch
build), so for the model only what the training decides exactly is pinned: its config,
the step count, and the weight file's tensor names, dtypes and shapes.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from pipeline_lib import stages
from pipeline_lib.stages import spec as engine
from pipeline_lib.stages.documents import document_stages
from pipeline_lib.stages.spec import Stage
from pipeline_lib.store import ArtifactStore, VersionRef

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden" / "chain.json"
DATA = ROOT / "pipeline_lib" / "data"
# What the golden corpus is cut from (bundled data): English prose and the multilingual sample.
CORPUS_PARTS = (("tinyshakespeare.txt", 40_000), ("multilingual.txt", 12_000))


def golden_corpus() -> str:
    parts = []
    for name, n_chars in CORPUS_PARTS:
        text = (DATA / name).read_text(encoding="utf-8")[:n_chars]
        parts.append(text[: text.rfind("\n") + 1])  # whole lines
    return "\n".join(parts)


def _lm_stage() -> Stage:
    from pipeline_lib.stages.lm import LM

    return LM


def _train_config() -> Any:
    from pipeline_lib.lm import preset

    return preset(
        "tiny",
        device="cpu",
        max_steps=12,
        block_size=16,
        n_layer=1,
        n_embd=32,
        eval_iters=1,
        warmup_steps=2,
        ckpt_every_s=0,
        seed=1337,
    )


def run_chain(root: Path, with_lm: bool = True) -> dict[str, tuple[Stage, ArtifactStore, VersionRef]]:
    """The golden corpus through every stage: stage name -> (stage, store, published ref)."""
    store = ArtifactStore(str(root / "store"))
    source = root / "golden.txt"
    source.write_text(golden_corpus(), encoding="utf-8")
    cfg = stages.CorpusConfig(sources=(str(source),), n_shards=3)
    out: dict[str, tuple[Stage, ArtifactStore, VersionRef]] = {}

    def run(stage: Stage, parents: dict[str, VersionRef], config: Any) -> VersionRef:
        if stage.units is not None:
            for i in range(engine.unit_count(stage, store, parents, config)):
                engine.run_unit(stage, store, parents, config, i)
        ref = engine.produce(stage, store, parents, config)
        out[stage.name] = (stage, store, ref)
        return ref

    raw = run(stages.DOWNLOAD, {}, cfg)
    corpus = run(stages.SHARD, {"raw": raw}, cfg)
    # Each document stage (optional, off by default) on the corpus, with its example config:
    # a branch of its own, so the default chain below stays as it is without them.
    for entry in document_stages():
        run(entry.stage, {"corpus": corpus}, entry.example)
    counts = run(stages.COUNTS, {"corpus": corpus}, stages.CountConfig())
    tok = run(stages.TOKENIZER, {"counts": counts}, stages.TokenizerConfig(vocab_size=400))
    tokens = run(stages.TOKENS, {"corpus": corpus, "tokenizer": tok}, stages.EncodeConfig())
    if with_lm:
        run(_lm_stage(), {"tokens": tokens, "tokenizer": tok}, _train_config())
    return out


# --------------------------------------------------------------------------- digests
def parquet_digest(path: str) -> str:
    """sha256 of a Parquet file's content: schema (with its metadata), row-group sizes and
    every value; not the writer's name and release in the file footer."""
    f = pq.ParquetFile(path)
    h = hashlib.sha256()
    h.update(f.schema_arrow.to_string(show_schema_metadata=True).encode())
    h.update(json.dumps([f.metadata.row_group(i).num_rows for i in range(f.metadata.num_row_groups)]).encode())
    table = f.read()
    for column in table.columns:
        values = column.to_pylist()
        h.update(json.dumps(values, default=lambda v: v.hex() if isinstance(v, bytes) else str(v)).encode())
    return h.hexdigest()


def safetensors_layout(path: str) -> str:
    """A safetensors file's tensor names, dtypes and shapes (its header without offsets)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    layout = {k: [v["dtype"], v["shape"]] for k, v in header.items() if k != "__metadata__"}
    return "layout:" + hashlib.sha256(json.dumps(layout, sort_keys=True).encode()).hexdigest()


def _model_digests(store: ArtifactStore, ref: VersionRef) -> dict[str, str]:
    metrics = json.loads(store.read_bytes(ref.kind, ref.version, "metrics.json"))
    return {
        "train_config.json": store.manifest(ref.kind, ref.version)["files"]["train_config.json"]["sha256"],
        "model.safetensors": safetensors_layout(store.local_file(ref.kind, ref.version, "model.safetensors")),
        "metrics.json#steps": str(metrics["steps"]),
    }


def output_digests(store: ArtifactStore, ref: VersionRef) -> dict[str, str]:
    """A published output's files, name -> digest: the sha256 the manifest records, or for a
    Parquet file its content's (`parquet_digest`); for a model, what is machine-independent."""
    if ref.kind == "model":
        return _model_digests(store, ref)
    files = store.manifest(ref.kind, ref.version)["files"]
    return {
        name: parquet_digest(store.local_file(ref.kind, ref.version, name))
        if name.endswith(".parquet")
        else info["sha256"]
        for name, info in sorted(files.items())
    }


def current(chain: dict[str, tuple[Stage, ArtifactStore, VersionRef]]) -> dict[str, dict[str, Any]]:
    return {
        name: {"output_version": stage.output_version, "files": output_digests(store, ref)}
        for name, (stage, store, ref) in chain.items()
    }


# --------------------------------------------------------------------------- the check
UPDATE = "python tests/test_golden.py --update"


def golden_problem(stage: str, golden: dict[str, Any] | None, now: dict[str, Any]) -> str | None:
    """Why `now` (a stage's output version and file digests) disagrees with its golden
    entry, as one line naming the fix; None when it agrees."""
    if golden is None:
        return f"{stage}: no golden entry: run `{UPDATE}` and commit tests/golden/chain.json"
    same_version = golden["output_version"] == now["output_version"]
    same_output = golden["files"] == now["files"]
    if same_version and same_output:
        return None
    changed = sorted(
        k for k in golden["files"].keys() | now["files"].keys() if golden["files"].get(k) != now["files"].get(k)
    )
    if same_version:
        return (
            f"{stage}: output changed ({', '.join(changed[:5])}) but output_version is still {now['output_version']}: "
            f"bump the stage's output_version, then run `{UPDATE}`"
        )
    if same_output:
        return (
            f"{stage}: output_version {golden['output_version']} -> {now['output_version']} but the output is "
            "byte-identical: undo the bump"
        )
    return (
        f"{stage}: output and output_version both changed ({golden['output_version']} -> {now['output_version']}): "
        f"run `{UPDATE}` and commit the goldens"
    )


def load_goldens() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {"stages": {}}


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory, torch_one_thread_module: None) -> dict[str, dict[str, Any]]:
    return current(run_chain(tmp_path_factory.mktemp("golden")))


@pytest.fixture(scope="module")
def torch_one_thread_module():
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


STAGE_NAMES = (
    "download_corpus",
    "shard_corpus",
    "reduce_counts",
    "learn_merges",
    "write_token_manifest",
    "train_lm",
) + tuple(entry.stage.name for entry in document_stages())


@pytest.mark.parametrize("stage", STAGE_NAMES)
def test_stage_output_matches_its_golden(chain, stage):
    problem = golden_problem(stage, load_goldens()["stages"].get(stage), chain[stage])
    assert problem is None, problem


def declared_stages() -> dict[str, Stage]:
    """Every `Stage` declared at module level in `pipeline_lib.stages`, by name."""
    import importlib
    import pkgutil

    import pipeline_lib.stages as package

    found = {}
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        found.update({v.name: v for v in vars(module).values() if isinstance(v, Stage)})
    return found | {entry.stage.name: entry.stage for entry in document_stages()}


def test_every_stage_has_a_golden(chain):
    """A new stage spec fails here until it runs in the golden chain and has its digests."""
    assert sorted(declared_stages()) == sorted(chain) == sorted(STAGE_NAMES) == sorted(load_goldens()["stages"])


def test_the_python_reference_makes_the_golden_output(tmp_path, monkeypatch):
    """The pure-Python reference (no compiled core) writes the same bytes as the core: the
    goldens pin both."""
    from pipeline_lib import corpus, tokenizer

    monkeypatch.setattr(tokenizer.native, "_CORE", None)
    monkeypatch.setattr(corpus, "_SCAN", None)
    goldens = load_goldens()["stages"]
    problems = [
        golden_problem(name, goldens.get(name), now)
        for name, now in current(run_chain(tmp_path, with_lm=False)).items()
    ]
    assert [p for p in problems if p] == []


@pytest.mark.parametrize(
    ("change", "want"),
    [
        (
            lambda g: {**g, "files": {**g["files"], "a.bin": "f" * 64}},
            "output changed (a.bin) but output_version is still 1: bump",
        ),
        (lambda g: {**g, "output_version": 2}, "output_version 1 -> 2 but the output is byte-identical: undo the bump"),
        (
            lambda g: {"output_version": 2, "files": {"a.bin": "0" * 64}},
            "both changed (1 -> 2): run `python tests/test_golden.py --update`",
        ),
        (lambda g: g, None),
    ],
)
def test_the_check_catches_a_change_without_a_bump_and_a_bump_without_a_change(
    change: Callable[[dict], dict], want: str | None
):
    golden = {"output_version": 1, "files": {"a.bin": "a" * 64}}
    problem = golden_problem("some_stage", golden, change(golden))
    assert problem is None if want is None else (problem is not None and want in problem), problem


# --------------------------------------------------------------------------- ids and source
# Every stage's version id (a content-addressed one: its cache identity) for fixed parents
# and configs, computed by the pipeline_lib found first on sys.path (a copy of the tree).
IDS_SCRIPT = """
import json, sys
tree, source = sys.argv[1], sys.argv[2]
# an editable install's redirect
sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("_editable")]
sys.path.insert(0, tree)
import pipeline_lib, pipeline_lib.tokenizer
from pipeline_lib import stages
from pipeline_lib.lm import preset
from pipeline_lib.stages import spec
from pipeline_lib.stages.lm import LM
from pipeline_lib.store import VersionRef
from pipeline_lib.sweep import SweepConfig, sweep_stage

assert pipeline_lib.__file__.startswith(tree), pipeline_lib.__file__
ref = lambda kind: VersionRef(kind, kind + "0" * 12, "file:///x", "0" * 64)
cfg = stages.CorpusConfig(sources=(source,), n_shards=3)
ids = {
    "download_corpus": spec.cache_identity(stages.DOWNLOAD, {}, cfg),
    "shard_corpus": stages.SHARD.version({"raw": ref("raw")}, cfg),
    "reduce_counts": stages.COUNTS.version({"corpus": ref("corpus")}, stages.CountConfig()),
    "learn_merges": stages.TOKENIZER.version({"counts": ref("counts")}, stages.TokenizerConfig()),
    "write_token_manifest": stages.TOKENS.version(
        {"corpus": ref("corpus"), "tokenizer": ref("tokenizer")}, stages.EncodeConfig()
    ),
    "train_lm": LM.version({"tokens": ref("tokens"), "tokenizer": ref("tokenizer")}, preset("tiny")),
    "compare_arms": sweep_stage(["a", "b"]).version({"a": ref("model"), "b": ref("model")}, SweepConfig()),
    "backend": pipeline_lib.tokenizer.backend_info()["backend"],
}
from pipeline_lib.stages.documents import document_stages
ids.update({e.stage.name: e.stage.version({"corpus": ref("corpus")}, e.example) for e in document_stages()})
print(json.dumps(ids))
"""


def _copy_tree(dest: Path, comment: bool) -> Path:
    """pipeline_lib copied under `dest` with its compiled core; with `comment`, a comment
    appended to every Python and C++ source file."""
    import shutil

    import pipeline_lib._tokcore as core

    shutil.copytree(ROOT / "pipeline_lib", dest / "pipeline_lib", ignore=shutil.ignore_patterns("__pycache__", "data"))
    shutil.copy2(core.__file__, dest / "pipeline_lib" / os.path.basename(core.__file__))
    edited = 0
    if comment:
        for path in sorted((dest / "pipeline_lib").rglob("*")):
            mark = {
                ".py": "\n# a comment that changes no output\n",
                ".cpp": "\n// a comment\n",
                ".h": "\n// a comment\n",
            }.get(path.suffix)
            if mark:
                path.write_text(path.read_text(encoding="utf-8") + mark, encoding="utf-8")
                edited += 1
        assert edited > 40  # every module and the core's sources
    return dest


def _ids(tree: Path, source: Path) -> dict[str, str]:
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", IDS_SCRIPT, str(tree), str(source)], capture_output=True, text=True, timeout=None
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_comment_in_any_source_file_changes_no_version_id(tmp_path):
    """Ids hash parents, params and output versions only: a comment in every Python and C++
    source file of the package (a rebuilt core included: its source hash is not in any id)
    leaves every stage's id as it was."""
    source = tmp_path / "c.txt"
    source.write_text("one document\n\nanother\n")
    plain = _ids(_copy_tree(tmp_path / "plain", comment=False), source)
    commented = _ids(_copy_tree(tmp_path / "commented", comment=True), source)
    assert plain["backend"] == "native"  # the compiled core was loaded from the copy
    assert commented == plain
    assert None not in plain.values() and len(set(plain.values())) == len(plain)


def update_goldens(root: Path) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    goldens = {
        "about": "tests/test_golden.py: file digests of every stage's output on the golden corpus; regenerate with "
        "`python tests/test_golden.py --update`",
        "corpus": [f"pipeline_lib/data/{name}[:{n}]" for name, n in CORPUS_PARTS],
        "stages": current(run_chain(root)),
    }
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(goldens, indent=2, sort_keys=True) + "\n")
    return goldens


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit(f"usage: {UPDATE}")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        written = update_goldens(Path(tmp))
    print(
        f"wrote {os.path.relpath(GOLDEN)}: "
        + ", ".join(f"{k} v{v['output_version']}" for k, v in written["stages"].items())
    )
