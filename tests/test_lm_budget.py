"""LM time budget: calibrate, plan the step count once, complete the schedule, record the
plan and resume on it; the final train loss is an evaluation of the train split.

No wall-clock assertions: the budget's clock is a fake one (`budget.clock`) that
advances by a set time per optimizer step and per evaluation (`FakeClock`); the one test
on the real clock compares the run's wall time with the budget plus the overshoot the
trainer states, measured by its own step times."""

import importlib
import json
import math
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load as st_load

from pipeline_lib.errors import ConfigError
from pipeline_lib.lm import TokenShards, evaluate, list_checkpoints, load_model, lr_at, preset, train
from pipeline_lib.lm.budget import PLAN_FILE, plan_steps, stretch_schedule
from pipeline_lib.lm.checkpoint import open_checkpoint
from pipeline_lib.lm.report import metrics
from pipeline_lib.lm.stage_config import LMConfig
from pipeline_lib.lm.testing import byte_token_lengths, test_device, write_byte_token_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

SHAKESPEARE = Path(__file__).resolve().parents[1] / "pipeline_lib" / "data" / "tinyshakespeare.txt"
train_mod = importlib.import_module("pipeline_lib.lm.trainer")
budget_mod = importlib.import_module("pipeline_lib.lm.budget")


class Kill(Exception):
    pass


def quiet(_msg):
    pass


@pytest.fixture(scope="module")
def byte_dir(tmp_path_factory):
    return write_byte_token_dir(tmp_path_factory.mktemp("tokens"), SHAKESPEARE.read_bytes()[:120_000], n_shards=2)


def cfg(**kw):
    base = dict(
        device=test_device(),
        max_steps=200,
        block_size=16,
        n_layer=1,
        n_head=2,
        n_embd=16,
        batch_size=2,
        eval_iters=1,
        eval_interval=10,
        log_interval=1,
        warmup_steps=4,
        ckpt_interval=1000,
        ckpt_every_s=0,
        time_budget_s=60.0,
    )
    base.update(kw)
    return preset("tiny", **base)


class FakeClock:
    """The budget's clock: each optimizer step takes `step_s`, each evaluation `eval_s`,
    checkpoints no time."""

    def __init__(self, monkeypatch, step_s=1.0, eval_s=1.0):
        self.t, self.step_s, self.eval_s = 0.0, step_s, eval_s
        monkeypatch.setattr(budget_mod, "clock", lambda: self.t)
        monkeypatch.setattr(train_mod, "_write_clock", lambda: 0.0)  # checkpoint writes take no time
        real_step, real_eval = train_mod.accumulate_gradients, train_mod.evaluate

        def step(*a, **kw):
            self.t += self.step_s
            return real_step(*a, **kw)

        def evaluate(*a, **kw):
            self.t += self.eval_s
            return real_eval(*a, **kw)

        monkeypatch.setattr(train_mod, "accumulate_gradients", step)
        monkeypatch.setattr(train_mod, "evaluate", evaluate)


def fake_clock(monkeypatch, tick=1.0):
    return FakeClock(monkeypatch, tick, tick)


def weights(ckpt_dir):
    return st_load((Path(ckpt_dir) / "model.safetensors").read_bytes())


def test_plan_steps_arithmetic():
    c = cfg(max_steps=1000, eval_interval=100, warmup_steps=4, time_budget_s=100.0)
    # 90 s left at 1 s/step, free evals: 90 more steps
    assert plan_steps(c, done=5, elapsed_s=10, step_s=1.0, eval_s=0.0) == 95
    # each eval costs 5 s: evals at 100 and at the end, and the train split at the end
    assert plan_steps(c, done=5, elapsed_s=10, step_s=1.0, eval_s=5.0) == 85
    n = plan_steps(c, done=5, elapsed_s=10, step_s=0.1, eval_s=5.0)
    cost = (n - 5) * 0.1 + (n // 100 + (n % 100 != 0) + 1) * 5.0
    assert cost <= 90 < cost + 0.1 + 5.0  # the largest that fits: one more step (or eval) would not
    assert plan_steps(c, done=5, elapsed_s=10, step_s=1e-6, eval_s=0.0) == 1000  # capped at max_steps
    # a budget already spent still gets a complete schedule: decay as long as the warmup
    assert plan_steps(c, done=5, elapsed_s=500, step_s=1.0, eval_s=1.0) == 10
    assert plan_steps(c.replace(max_steps=7), done=5, elapsed_s=500, step_s=1.0, eval_s=1.0) == 7


def test_stretch_schedule_keeps_the_shape():
    c = cfg(max_steps=400, warmup_steps=30, learning_rate=1e-3, min_lr=1e-4)
    s = stretch_schedule(c, 100)
    assert s.max_steps == 100 and s.decay_steps == 100 and s.warmup_steps == 30
    # the calibration steps (warmup and the first step after it) have the same LR in both plans
    assert all(lr_at(i, s) == lr_at(i, c) for i in range(31))
    assert lr_at(99, s) == pytest.approx(1e-4, abs=1e-6) and lr_at(100, s) == 1e-4
    e = stretch_schedule(c.replace(lr_decay_steps=230), 130)  # decay ended at 200/370 of the way
    assert e.lr_decay_steps == 30 + round(200 * 100 / 370)
    assert stretch_schedule(c, 400) is c


def test_budget_ends_training_with_the_schedule_completed(byte_dir, tmp_path, monkeypatch):
    fake_clock(monkeypatch)  # 1 s per reading: every step and every eval "takes" 1 s
    c = cfg(time_budget_s=60.0)
    logs, events = [], []
    r = train(c, byte_dir, tmp_path / "run", log=logs.append, on_step=events.append)
    planned = r.max_steps
    assert r.planned_by_budget and 2 * (c.warmup_steps + 1) <= planned < c.max_steps
    assert r.steps == planned and events[-1]["step"] == planned and events[-1]["max_steps"] == planned
    assert any(f"-> {planned} of at most 200 steps" in m for m in logs)
    plan = json.loads((tmp_path / "run" / PLAN_FILE).read_text())
    assert plan["planned_steps"] == planned and plan["calibration_steps"] == c.warmup_steps + 1
    assert (
        plan_steps(
            c, done=plan["calibration_steps"], elapsed_s=plan["elapsed_s"], step_s=plan["step_s"], eval_s=plan["eval_s"]
        )
        == planned
    )
    # the LR schedule ran to its end: the last step used the decay's last value
    lrs = [h["lr"] for h in r.history if h["step"] >= 1]
    span = c.learning_rate - c.min_lr
    assert lrs[-1] == lr_at(planned - 1, stretch_schedule(c, planned))
    assert lrs[-1] - c.min_lr < 0.01 * span < 0.5 * span < lr_at(planned - 1, c) - c.min_lr  # unstretched: mid-way
    assert lrs == sorted(lrs[: c.warmup_steps]) + sorted(lrs[c.warmup_steps :], reverse=True)
    # the reached step is recorded: checkpoint, metrics
    ckpt = open_checkpoint(r.checkpoint_dir)
    state = ckpt.json("trainer_state.json")
    assert ckpt.step == planned and state["planned_steps"] == planned
    assert state["train_config"]["max_steps"] == 200 and state["train_config"]["time_budget_s"] == 60.0
    m = metrics(r)
    assert m["steps"] == m["planned_steps"] == planned and m["planned_by_time_budget"] is True

    # more budget, more steps (same clock rate)
    fake_clock(monkeypatch)
    r2 = train(c.replace(time_budget_s=120.0), byte_dir, tmp_path / "run2", log=quiet)
    assert planned < r2.steps <= 200

    # the weights are those of a run configured with that many steps and no budget
    fixed = train(c.replace(max_steps=planned, time_budget_s=None), byte_dir, tmp_path / "fixed", log=quiet)
    assert not fixed.planned_by_budget and fixed.steps == planned
    wa, wb = weights(r.checkpoint_dir), weights(fixed.checkpoint_dir)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("ckpt_interval", [5, 1000])  # a checkpoint after the plan / none at all
def test_resume_continues_the_recorded_plan(byte_dir, tmp_path, monkeypatch, ckpt_interval):
    c = cfg(time_budget_s=40.0, ckpt_interval=ckpt_interval)
    fake_clock(monkeypatch)
    full = train(c, byte_dir, tmp_path / "full", log=quiet)

    def kill_at_12(entry):
        if entry["step"] == 12:
            raise Kill

    fake_clock(monkeypatch)
    with pytest.raises(Kill):
        train(c, byte_dir, tmp_path / "cut", log=quiet, on_step=kill_at_12)
    assert [s for s, _ in list_checkpoints(tmp_path / "cut")] == ([5, 10] if ckpt_interval == 5 else [])
    fake_clock(monkeypatch)  # not measured again: the recorded plan holds
    logs = []
    resumed = train(c, byte_dir, tmp_path / "cut", log=logs.append, resume=True)
    assert any(f"continuing the recorded plan of {full.steps} steps" in m for m in logs)
    assert resumed.steps == resumed.max_steps == full.steps
    a, b = Path(full.checkpoint_dir), Path(resumed.checkpoint_dir)
    for f in sorted(p.name for p in a.iterdir()):  # every checkpoint file, byte for byte
        assert (a / f).read_bytes() == (b / f).read_bytes(), f

    # a fresh run (resume=False) does not take an earlier plan: it measures again
    fake_clock(monkeypatch, tick=100.0)
    slow = train(c, byte_dir, tmp_path / "slow", log=quiet)
    assert slow.steps < full.steps


def test_final_train_loss_is_an_evaluation_of_the_train_split(byte_dir, tmp_path):
    c = cfg(time_budget_s=None, max_steps=6, eval_iters=3)
    r = train(c, byte_dir, tmp_path / "run", token_byte_lengths=byte_token_lengths(), log=quiet)
    last = r.history[-1]
    assert r.final_train_loss == last["train_eval_loss"] and last["train_eval_bpb"] > 0
    assert last["train_loss"] != last["train_eval_loss"]  # not the last batch
    shards = TokenShards(byte_dir)
    split = shards.split(c.val_fraction, c.model.block_size + 1)
    want = evaluate(
        load_model(r.checkpoint_dir),
        shards,
        split.train,
        block_size=c.model.block_size,
        batch_size=c.batch_size,
        eval_iters=3,
        seed=[c.seed, 0, 2],
        device=torch.device("cpu"),
        token_byte_lengths=torch.as_tensor(byte_token_lengths()),
        separator_id=shards.separator_id,
    )
    assert want["val_loss"] == pytest.approx(r.final_train_loss, rel=1e-6)
    assert want["val_bpb"] == pytest.approx(last["train_eval_bpb"], rel=1e-6)
    assert math.isfinite(metrics(r)["final_train_loss"])


def test_lm_config_minutes():
    assert LMConfig().train_config().time_budget_s == LMConfig().minutes * 60
    assert LMConfig(minutes=0.5).train_config().time_budget_s == 30.0
    assert LMConfig(minutes=None).train_config().time_budget_s is None
    for bad in (0, -1.0):
        with pytest.raises(ConfigError, match="minutes"):
            LMConfig(minutes=bad)


def test_budget_stops_a_run_that_slows_down_after_its_plan(byte_dir, tmp_path, monkeypatch):
    """The machine gets 3x slower after the plan was made: training stops before the budget
    runs out, evaluates and checkpoints the step it stopped at, and ends within the budget
    plus the stated overshoot (one step, the evaluations taking what they were measured)."""
    clock = FakeClock(monkeypatch)
    c = cfg(time_budget_s=60.0)

    def slow_down(entry):
        if entry["step"] == 8:
            clock.step_s = 3.0

    logs = []
    r = train(c, byte_dir, tmp_path / "run", log=logs.append, on_step=slow_down)
    assert r.planned_by_budget and r.stopped_by_budget and r.steps < r.max_steps
    assert any(f"stopping after step {r.steps} of {r.max_steps}" in m for m in logs)
    assert r.wall_s == clock.t and r.longest_step_s == 3.0
    assert r.wall_s <= c.time_budget_s + r.longest_step_s  # the overshoot: at most one step
    last = r.history[-1]
    assert last["step"] == r.steps and last["val_loss"] is not None and last["train_eval_loss"] is not None
    assert open_checkpoint(r.checkpoint_dir).step == r.steps
    # one step more would have ended past that: the stop was not early
    assert r.wall_s + 3.0 + 2 * 1.0 > c.time_budget_s


def test_budget_that_holds_its_plan_does_not_stop_early(byte_dir, tmp_path, monkeypatch):
    FakeClock(monkeypatch)
    r = train(cfg(time_budget_s=60.0), byte_dir, tmp_path / "run", log=quiet)
    assert r.planned_by_budget and not r.stopped_by_budget and r.steps == r.max_steps
    assert r.wall_s <= 60.0


def test_budget_bounds_the_wall_time_on_the_real_clock(byte_dir, tmp_path):
    """Real time: a budget of a few seconds and steps that get slower as it goes (as on a
    machine whose load grows). The run's wall time, measured around `train`, is within the
    budget plus the overshoot the trainer allows: one step (its longest) and its final
    evaluations and checkpoint."""
    budget = 4.0
    c = cfg(time_budget_s=budget, max_steps=100_000, eval_interval=50)

    def load_grows(entry):
        time.sleep(min(0.2, entry["step"] * 0.002))

    t0 = time.monotonic()
    r = train(c, byte_dir, tmp_path / "run", log=quiet, on_step=load_grows)
    elapsed = time.monotonic() - t0
    assert r.steps < r.max_steps and r.stopped_by_budget
    assert r.wall_s <= elapsed
    assert elapsed <= budget + r.longest_step_s + r.final_s + (elapsed - r.wall_s), (
        elapsed,
        r.longest_step_s,
        r.final_s,
    )
    assert r.wall_s <= budget + r.longest_step_s + r.final_s
