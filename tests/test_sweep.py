"""The tokenizer sweep: equal-compute planning, the comparison, and real flow runs on a tiny
corpus with tiny models (under the session Prefect server)."""

from __future__ import annotations

import json
import math
import os
import sys

import pytest

from pipeline_lib import ArtifactStore
from pipeline_lib.errors import ConfigError
from pipeline_lib.lm.stage_config import LMConfig
from pipeline_lib.sweep import SweepConfig, model_cost, plan

sys.path.insert(0, os.path.dirname(__file__))
from prefect_server import task_states  # noqa: E402

TINY_LM = {"preset": "tiny", "steps": 12, "n_layer": 1, "n_embd": 32, "n_head": 2, "block_size": 32, "batch_size": 4}


# --------------------------------------------------------------------------- planning
def test_model_cost_is_the_models_own_count():
    """Counted on the meta device, the same as the real model: tied token table once,
    FLOPs per token with the token table (the unembedding) in N."""
    from pipeline_lib.lm.model import GPT

    cfg = LMConfig(**TINY_LM).train_config()
    for vocab in (300, 1024):
        gpt = GPT(cfg.model.with_vocab(vocab))
        cost = model_cost(cfg, vocab)
        assert cost.n_params == gpt.num_params(non_embedding=False)
        assert cost.n_embedding == vocab * 32 + 32 * 32  # token table + position table
        assert cost.n_params - cost.n_embedding == sum(p.numel() for p in gpt.transformer.h.parameters()) + sum(
            p.numel() for p in gpt.transformer.ln_f.parameters()
        )
        assert cost.flops_per_token == gpt.flops_per_token()
        assert cost.tokens_per_step == 4 * 32
    small, big = model_cost(cfg, 300), model_cost(cfg, 1024)
    assert big.flops_per_token - small.flops_per_token == 6 * (1024 - 300) * 32  # the unembedding's 6 V d


def test_equal_flops_plan_gives_bigger_vocabularies_fewer_steps():
    lm = LMConfig(**TINY_LM)
    sweep = SweepConfig(vocab_sizes=(300, 1024, 4096))
    p = plan(sweep, lm, {"byte-300": 300, "byte-1024": 1024, "byte-4096": 4096})
    assert p.compute == "flops" and p.minutes_per_arm is None
    steps = {name: cfg.train_config().max_steps for name, cfg in p.lm.items()}
    assert steps["byte-300"] == 12 and steps["byte-300"] > steps["byte-1024"] > steps["byte-4096"] >= 1
    for name, cfg in p.lm.items():
        tc = cfg.train_config()
        assert tc.time_budget_s is None  # a time budget would cut arms short unequally
        spent = tc.max_steps * model_cost(tc, int(name.split("-")[1])).flops_per_step
        assert p.flops_per_arm is not None and abs(spent / p.flops_per_arm - 1) <= 0.5 / tc.max_steps  # whole steps
    given = plan(SweepConfig(vocab_sizes=(300,), flops_per_arm=p.flops_per_arm / 2), lm, {"byte-300": 300})
    assert given.lm["byte-300"].train_config().max_steps == 6
    with pytest.raises(ConfigError, match="--flops-per-arm .* buys arm byte-300 no training step"):
        plan(SweepConfig(vocab_sizes=(300,), flops_per_arm=1.0), lm, {"byte-300": 300})
    timed = plan(
        SweepConfig(vocab_sizes=(300,), compute="time"), LMConfig(**{**TINY_LM, "minutes": 0.5}), {"byte-300": 300}
    )
    assert timed.minutes_per_arm == 0.5 and timed.lm["byte-300"].train_config().time_budget_s == 30.0
    with pytest.raises(ConfigError, match="--compute time .* give --lm-minutes"):
        plan(
            SweepConfig(vocab_sizes=(300,), compute="time"), LMConfig(**{**TINY_LM, "minutes": None}), {"byte-300": 300}
        )


def test_bad_vocab_size_is_one_error_line_before_any_work(tmp_path, capsys):
    from flows.cli import main

    store = tmp_path / "store"
    assert main(["sweep", "--vocab-sizes", "512,100", "--store", str(store)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tokenmill: error: --vocab-sizes 512 100:") and "too small" in err[0], (
        err
    )
    assert not store.exists()
    assert main(["sweep", "--units", "byte,syllable", "--store", str(store)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tokenmill: error: --units byte syllable:"), err
    assert not store.exists()


# --------------------------------------------------------------------------- flow runs
@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory, shakespeare_text, prefect_harness):
    corpus = tmp_path_factory.mktemp("corpus") / "shakespeare_head.txt"
    corpus.write_text(shakespeare_text[:60_000], encoding="utf-8")
    params = {
        "corpus": {"sources": [str(corpus)], "n_shards": 1, "documents": "paragraph"},
        "lm": TINY_LM,
        "sweep": {"vocab_sizes": [300, 600]},
        "store": str(tmp_path_factory.mktemp("store")),
    }
    return params, _run(params)


def _run(params: dict):
    from flows.sweep import sweep_flow

    state = sweep_flow(return_state=True, **params)
    assert state.is_completed(), state
    flow_run_id = state.state_details.flow_run_id
    return {**state.result(), "flow_run_id": flow_run_id}, task_states(flow_run_id)


def test_sweep_compares_arms_at_equal_flops(sweep_run):
    params, (out, states) = sweep_run
    store = ArtifactStore(params["store"])
    result = out["result"]
    rows = {r["arm"]: r for r in result["rows"]}
    assert list(rows) == ["byte-300", "byte-600"]  # one row per arm
    # counts shared
    assert (
        len(states["train_lm"]) == 2
        and len(states["learn_merges"]) == 2
        and states["reduce_counts"] == ["Completed", "Cached"]
    )

    # equal compute: the smallest vocabulary trains the asked steps, the other fewer, same FLOPs within half a step
    assert rows["byte-300"]["steps"] == TINY_LM["steps"] and rows["byte-600"]["steps"] < TINY_LM["steps"]
    budget = result["flops_per_arm"]
    for r in rows.values():
        assert abs(r["train_flops"] / budget - 1) <= 0.5 / r["steps"]
        assert r["train_flops"] == r["steps"] * r["tokens_per_step"] * r["flops_per_token"]
    assert rows["byte-600"]["bytes_per_token"] > rows["byte-300"]["bytes_per_token"] > 1.0
    assert (
        rows["byte-600"]["embedding_params"] - rows["byte-300"]["embedding_params"]
        == (rows["byte-600"]["vocab_size"] - rows["byte-300"]["vocab_size"]) * 32
    )

    # bits per byte: the model's val loss over the bytes its tokens encode (separators: 0 bytes)
    for name, r in rows.items():
        model = store.manifest("model", out["models"][name]["version"])
        assert r["val_bpb"] == model["meta"]["metrics"]["val_bpb"] and math.isfinite(r["val_bpb"])
        tokens = store.manifest("tokens", out["tokens"][name]["version"])["meta"]
        stream_bytes_per_token = tokens["totals"]["n_bytes"] / tokens["totals"]["n_tokens"]
        assert r["val_bpb"] == pytest.approx(r["val_loss"] / math.log(2) / stream_bytes_per_token, rel=0.2)
        assert r["tokens_per_s"] > 0 and r["bytes_per_s"] == pytest.approx(r["tokens_per_s"] * stream_bytes_per_token)
        # where the arm started: the untrained model's step-0 evaluation, above where it ended
        history = json.loads(store.read_bytes("model", out["models"][name]["version"], "history.json"))
        assert (
            r["start_val_bpb"] == history[0]["val_bpb"]
            and history[0]["step"] == 0
            and r["start_val_bpb"] > r["val_bpb"]
        )

    # the sweep version: content-addressed, its parents the arms' models, table and plot as files
    ref = out["sweep"]
    manifest = store.manifest("sweep", ref["version"])
    assert manifest["parents"] == {name: f"model/{m['version']}" for name, m in out["models"].items()}
    store.verify("sweep", ref["version"])
    assert json.loads(store.read_bytes("sweep", ref["version"], "sweep.json")) == result
    table = store.read_bytes("sweep", ref["version"], "sweep.md").decode()
    assert table.count("| byte-") == 2 and "![sweep](sweep.png)" in table and "| start bpb | val bpb |" in table
    assert store.read_bytes("sweep", ref["version"], "sweep.png").startswith(b"\x89PNG")


def test_rerun_is_cached_and_shows_the_table(sweep_run):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    params, (first, _) = sweep_run
    again, states = _run(params)
    assert all(s == "Cached" for names in states.values() for s in names), states
    assert again["sweep"] == first["sweep"] and again["models"] == first["models"]
    with get_client(sync_client=True) as client:  # made in the flow: a Cached run shows them too
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[again["flow_run_id"]]))
        )
    markdown = [a for a in artifacts if a.type == "markdown" and (a.key or "").startswith("tokenmill-sweep-")]
    assert len(markdown) == 1 and "data:image/png;base64," in markdown[0].data and "| byte-600 |" in markdown[0].data
    tables = [a for a in artifacts if a.type == "table" and (a.key or "").startswith("tokenmill-sweep-")]
    assert len(tables) == 1 and len(json.loads(tables[0].data)) == 2


@pytest.mark.slow
def test_new_sizes_and_units_train_only_their_arms(sweep_run):
    params, (first, _) = sweep_run
    wider, states = _run({**params, "sweep": {"vocab_sizes": [300, 600, 800], "units": ["byte", "char"]}})
    assert sorted(states["train_lm"]) == ["Cached"] * 2 + ["Completed"] * 4, states
    assert {k: wider["models"][k] for k in first["models"]} == first["models"]
    rows = wider["result"]["rows"]
    assert [r["arm"] for r in rows] == ["byte-300", "byte-600", "byte-800", "char-300", "char-600", "char-800"]
    budget = wider["result"]["flops_per_arm"]
    assert all(abs(r["train_flops"] / budget - 1) <= 0.5 / r["steps"] and math.isfinite(r["val_bpb"]) for r in rows)
    chars = {r["arm"]: r for r in rows if r["unit"] == "char"}
    assert chars["char-800"]["bytes_per_token"] > chars["char-300"]["bytes_per_token"] > 1.0


@pytest.mark.slow
def test_arms_train_in_parallel_on_processes_with_the_same_results(sweep_run, tmp_path):
    """On a process pool the arms are mapped side by side; the model versions (ids and
    figures) are the ones the thread runner made one at a time."""
    from prefect.task_runners import ProcessPoolTaskRunner

    from flows.sweep import sweep_flow

    params, (first, _) = sweep_run
    state = sweep_flow.with_options(task_runner=ProcessPoolTaskRunner(max_workers=2))(
        return_state=True, **{**params, "store": str(tmp_path / "store")}
    )
    assert state.is_completed(), state
    out = state.result()
    assert {k: m["version"] for k, m in out["models"].items()} == {k: m["version"] for k, m in first["models"].items()}
    same = ("val_loss", "val_bpb", "steps", "train_flops", "bytes_per_token")
    assert [{k: r[k] for k in same} for r in out["result"]["rows"]] == [
        {k: r[k] for k in same} for r in first["result"]["rows"]
    ]
