"""Deployments against a real local Prefect server, and failures as the UI shows them.

One `prefect server start` per module (tests/prefect_server.py: own PREFECT_HOME, free
port on 127.0.0.1). `tokenmill serve` registers the deployments of deployments/serve.py
and runs a triggered pipeline run; `prefect deploy` from deployments/prefect.yaml plus a
`process` worker does the same. The module takes ~75 s on a loaded 2-core machine
(server start ~17-25 s of it). Failure behaviour is read back from the API the UI
reads: a bad corpus URL fails `download_corpus` after its retries with our message, and a
run killed mid-encoding resumes with the finished shards Cached.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, os.path.dirname(__file__))
from prefect_server import (  # noqa: E402
    PrefectServer,
    flow_runs,
    free_port,
    stop_process,
    task_runs,
    task_states,
    wait_for_deployment,
)

ROOT = Path(__file__).resolve().parent.parent
SHAKESPEARE = ROOT / "pipeline_lib" / "data" / "tinyshakespeare.txt"


def tiny(corpus: str) -> dict:
    """Trigger-time parameters of a tiny run: config dicts (a dict replaces the deployment's whole dict)."""
    return {"corpus": {"sources": [corpus], "n_shards": 2}, "tokenizer": {"vocab_size": 300}, "train_model": False}


RUN_TIMEOUT = 240  # seconds for one tiny triggered run, generous for a loaded 2-core machine


# ----------------------------------------------------------------------------- no server
def _yaml_deployments() -> list[dict]:
    return yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())["deployments"]


def _flow_of(entrypoint: str) -> str:
    return entrypoint.rsplit(".", 1)[1]


def test_prefect_yaml_mirrors_serve_specs():
    from deployments import entrypoints
    from deployments.serve import TIMEZONE, WORK_POOL, deployment_specs
    from deployments.steps import job_env, pull_steps

    specs = {(s.flow, s.name): s for s in deployment_specs("/s", ["/c.txt"])}
    docs = {(_flow_of(d["entrypoint"]), d["name"]): d for d in _yaml_deployments()}
    assert set(docs) == set(specs)
    # Same parameters, same fixed values; store/corpus sources/storage_options come from
    # the deploy-time settings step in the YAML and from serve()'s arguments.
    settings = {
        "store": "/s",
        "corpus": ["/c.txt"],
        "storage_options": None,
        "env": job_env("remote-file-system/r"),
        "dask_env": job_env("remote-file-system/r", "dask"),
        "repo": "/r",
        "branch": "b",
        "install": "i",
    }
    for key, d in docs.items():
        spec = specs[key]
        assert d["entrypoint"] == spec.entrypoint and _flow_of(d["entrypoint"]) in entrypoints.FLOWS
        assert d["work_pool"]["name"] == WORK_POOL and d["work_pool"]["work_queue_name"] == spec.work_queue, key
        crons = [(s["cron"], s["timezone"]) for s in d.get("schedules") or []]
        assert crons == ([(spec.cron, TIMEZONE)] if spec.cron else []), key
        params = _render(d["parameters"], settings)
        params = {k: v for k, v in params.items() if not (k == "storage_options" and v is None)}
        assert params == spec.parameters, key
        assert set(d["tags"]) == set(spec.tags)
        assert _render(d["work_pool"]["job_variables"]["env"], settings) == job_env(
            "remote-file-system/r", spec.runner
        ), key
        limit = d.get("concurrency_limit")
        assert (limit and (limit["limit"], limit["collision_strategy"])) == (
            spec.concurrency_limit and (spec.concurrency_limit, "ENQUEUE")
        ), key
    # The scheduled deployments: one run at a time each, and one queue between them.
    assert {(s.name, s.concurrency_limit, s.work_queue) for s in specs.values() if s.cron} == {
        ("nightly-tokenize", 1, "scheduled"),
        ("weekly-retrain", 1, "scheduled"),
    }
    # The YAML's pull steps are the ones `tokenmill deploy` writes.
    raw = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())
    assert _render(raw["pull"], settings) == pull_steps("/r", "b", "i")
    assert {"deployments.steps.work_queue": {"pool": WORK_POOL, "name": "scheduled", "concurrency_limit": 1}} in raw[
        "build"
    ]


def test_deployed_lm_budget_trains_the_promised_steps():
    """A deployment that names LM steps trains that many: no time budget re-plans it to fewer
    (LMConfig's default budget of 1 minute planned 62 of the weekly retrain's 600)."""
    from deployments.serve import deployment_specs
    from pipeline_lib.config import validate
    from pipeline_lib.lm.stage_config import LMConfig

    promised = {s.name: s.parameters["lm"] for s in deployment_specs("/s", ["/c.txt"]) if "lm" in s.parameters}
    assert "weekly-retrain" in promised
    for name, lm in promised.items():
        cfg = validate(LMConfig, lm, "lm").train_config()
        assert cfg.max_steps == lm["steps"] and cfg.time_budget_s is None, (name, cfg.max_steps, cfg.time_budget_s)


def _render(value, settings: dict):
    """prefect.yaml's ``{{ settings.X }}`` placeholders replaced (nested dicts too)."""
    if isinstance(value, dict):
        return {k: _render(v, settings) for k, v in value.items()}
    if isinstance(value, list):
        return [_render(v, settings) for v in value]
    if isinstance(value, str) and value.startswith("{{ settings."):
        return settings[value.removeprefix("{{ settings.").removesuffix(" }}")]
    return value


def test_deploy_settings_step(monkeypatch, tmp_path):
    from deployments.automations import heartbeat_env
    from deployments.steps import DEFAULT_INSTALL, settings
    from pipeline_lib.fsio import InputError

    for var in (
        "TOKENMILL_STORE",
        "TOKENMILL_CORPUS",
        "TOKENMILL_STORAGE_OPTIONS",
        "TOKENMILL_REPO",
        "TOKENMILL_BRANCH",
        "TOKENMILL_INSTALL",
        "TOKENMILL_RESULT_STORAGE",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="TOKENMILL_REPO"):  # not a git checkout: nothing for workers to clone
        settings()
    monkeypatch.setenv("TOKENMILL_REPO", "https://git.example.org/tokenmill.git")
    assert settings() == {
        "store": str(tmp_path / "artifacts"),
        "corpus": None,
        "storage_options": None,
        "repo": "https://git.example.org/tokenmill.git",
        "branch": None,
        "install": DEFAULT_INSTALL,
        "env": heartbeat_env(),
        "dask_env": {**heartbeat_env(), "TOKENMILL_RUNNER": "dask"},
    }
    monkeypatch.setenv("TOKENMILL_STORE", "s3://bucket/tm")
    monkeypatch.setenv("TOKENMILL_CORPUS", "a.txt 'https://example.org/b c.txt'")
    monkeypatch.setenv("TOKENMILL_STORAGE_OPTIONS", '{"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}')
    monkeypatch.setenv("TOKENMILL_BRANCH", "release")
    monkeypatch.setenv("TOKENMILL_INSTALL", "python -m pip install --no-deps .")
    monkeypatch.setenv("TOKENMILL_RESULT_STORAGE", "remote-file-system/results")
    out = settings()
    assert out["store"] == "s3://bucket/tm"
    assert out["corpus"] == [str(tmp_path / "a.txt"), "https://example.org/b c.txt"]
    assert out["storage_options"] == {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}
    assert (out["branch"], out["install"]) == ("release", "python -m pip install --no-deps .")
    assert out["env"] == {**heartbeat_env(), "PREFECT_DEFAULT_RESULT_STORAGE_BLOCK": "remote-file-system/results"}
    assert out["dask_env"] == {
        **heartbeat_env(),
        "PREFECT_DEFAULT_RESULT_STORAGE_BLOCK": "remote-file-system/results",
        "TOKENMILL_RUNNER": "dask",
    }
    monkeypatch.setenv("TOKENMILL_RESULT_STORAGE", "results")
    with pytest.raises(InputError, match="BLOCK-TYPE/NAME"):
        settings()


def test_deploy_source_defaults_from_the_checkout(tmp_path):
    """Unset repo/branch come from the deploying checkout: its origin remote (a relative
    path made absolute) and branch; without a remote, the checkout itself."""
    from deployments.steps import DEFAULT_INSTALL, source_settings

    def git(*args, cwd):
        subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)

    origin = tmp_path / "origin"
    origin.mkdir()
    git("init", "-q", "-b", "dev", cwd=origin)
    (origin / "f.txt").write_text("x")
    git("add", "f.txt", cwd=origin)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c", cwd=origin)
    assert source_settings(cwd=str(origin)) == {"repo": str(origin), "branch": "dev", "install": DEFAULT_INSTALL}
    git("clone", "-q", "origin", "checkout", cwd=tmp_path)
    git("remote", "set-url", "origin", "../origin", cwd=tmp_path / "checkout")  # relative to the checkout
    assert source_settings(cwd=str(tmp_path / "checkout"), install="make install")["repo"] == str(origin)
    assert source_settings(cwd=str(tmp_path / "checkout"))["branch"] == "dev"
    assert source_settings(repo="git@host:org/tm.git", cwd=str(tmp_path)) == {
        "repo": "git@host:org/tm.git",
        "branch": None,
        "install": DEFAULT_INSTALL,
    }


def test_preinstalled_workers_get_no_clone_and_no_install():
    from deployments.steps import PREINSTALLED, pull_steps

    assert pull_steps("/r", "b", PREINSTALLED) == [
        {"prefect.deployments.steps.set_working_directory": {"directory": "."}}
    ]
    assert [next(iter(s)) for s in pull_steps("/r", "b", "python -m deployments.wheel_cache")] == [
        "prefect.deployments.steps.git_clone",
        "prefect.deployments.steps.run_shell_script",
        "prefect.deployments.steps.set_working_directory",
    ]


def test_serve_refuses_without_server(monkeypatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from deployments.serve import serve
    from pipeline_lib.fsio import InputError

    with (
        temporary_settings(updates={PREFECT_API_URL: None}),
        pytest.raises(InputError, match="^tokenmill serve needs a Prefect server.*prefect server start"),
    ):
        serve("/tmp/never-used")


def test_deploy_refuses_without_server(tmp_path):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from deployments.deploy import deploy
    from pipeline_lib.fsio import InputError

    with (
        temporary_settings(updates={PREFECT_API_URL: None}),
        pytest.raises(InputError, match="^tokenmill deploy needs a Prefect server.*prefect server start"),
    ):
        deploy(str(tmp_path / "store"), repo=str(tmp_path))


def test_runner_from_env():
    from prefect.task_runners import ThreadPoolTaskRunner
    from prefect_dask import DaskTaskRunner

    from flows.runners import runner_from_env
    from pipeline_lib.fsio import InputError

    assert isinstance(runner_from_env({}), ThreadPoolTaskRunner)
    assert runner_from_env({"TOKENMILL_WORKERS": "3"})._max_workers == 3
    r = runner_from_env({"TOKENMILL_RUNNER": "dask", "TOKENMILL_DASK_ADDRESS": "tcp://10.0.0.5:8786"})
    assert isinstance(r, DaskTaskRunner) and r.address == "tcp://10.0.0.5:8786"
    with pytest.raises(InputError, match="TOKENMILL_RUNNER=dask"):
        runner_from_env({"TOKENMILL_DASK_ADDRESS": "tcp://10.0.0.5:8786"})
    with pytest.raises(InputError, match="expected an integer"):
        runner_from_env({"TOKENMILL_WORKERS": "many"})


def test_zombie_automation_scope_window_and_heartbeat(monkeypatch, capsys):
    """The automation matches only tokenmill's flows, its window spans several of the
    heartbeats tokenmill's runs are given, and a window too short for them is refused."""
    from deployments.automations import (
        FLOW_NAMES,
        HEARTBEAT_ENV,
        HEARTBEAT_S,
        MIN_HEARTBEATS,
        WITHIN_S,
        main,
        zombie_automation,
    )
    from deployments.steps import job_env

    trigger = zombie_automation().trigger
    assert trigger.match_related.root == {"prefect.resource.role": "flow", "prefect.resource.name": FLOW_NAMES}
    assert trigger.within.total_seconds() == WITHIN_S >= MIN_HEARTBEATS * HEARTBEAT_S
    assert job_env()[HEARTBEAT_ENV] == str(HEARTBEAT_S) and job_env(runner="dask")[HEARTBEAT_ENV] == str(HEARTBEAT_S)
    assert main(["--within", str(HEARTBEAT_S * 2)]) == 2  # refused before any server is asked
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--within" in err and HEARTBEAT_ENV in err and "Traceback" not in err


def test_runs_against_a_server_send_tokenmill_heartbeats(monkeypatch):
    """`tokenmill run` against a server (PREFECT_API_URL) sends the automation's heartbeat;
    a heartbeat the user set is kept."""
    from prefect.settings import get_current_settings

    from deployments.automations import HEARTBEAT_ENV, HEARTBEAT_S
    from flows.prefect_api import flow_api

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:1/api")
    monkeypatch.delenv(HEARTBEAT_ENV, raising=False)
    monkeypatch.delenv("PREFECT_RUNNER_HEARTBEAT_FREQUENCY", raising=False)
    with flow_api():
        assert get_current_settings().flows.heartbeat_frequency == HEARTBEAT_S
    monkeypatch.setenv(HEARTBEAT_ENV, "60")
    from prefect.settings import Settings, temporary_settings

    with temporary_settings(updates={"flows.heartbeat_frequency": Settings().flows.heartbeat_frequency}), flow_api():
        assert get_current_settings().flows.heartbeat_frequency == 60


# ----------------------------------------------------------------------------- server
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with PrefectServer(tmp_path_factory.mktemp("prefect-server")) as s:
        with s.settings():
            yield s


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("corpus") / "shakespeare_head.txt"
    path.write_text(SHAKESPEARE.read_text(encoding="utf-8")[:120_000], encoding="utf-8")
    return str(path)


_SERVE: dict[str, subprocess.Popen] = {}


@pytest.fixture(scope="module")
def served(server, small_corpus, tmp_path_factory):
    """`tokenmill serve` running against the server; yields its store path."""
    store = str(tmp_path_factory.mktemp("served-store"))
    proc = server.spawn(
        [sys.executable, "-m", "flows.cli", "serve", "--store", store, "--corpus", small_corpus],
        "serve",
        env=server.client_env(PREFECT_RUNNER_POLL_FREQUENCY="1"),
        cwd=str(ROOT),
    )
    _SERVE["proc"] = proc
    for name in ("tokenmill-pipeline/on-demand", "tokenmill-lm/on-demand"):  # first and last registered
        wait_for_deployment(name, timeout=120, proc=proc, log=lambda: server.log_tail("serve"))
    yield store
    stop_process(proc)


def _trigger(name: str, **parameters):
    from prefect.deployments import run_deployment

    run = run_deployment(name, parameters=parameters, timeout=RUN_TIMEOUT, poll_interval=1, as_subflow=False)
    assert run.state is not None and run.state.is_final(), f"{name}: still {run.state} after {RUN_TIMEOUT} s"
    return run


def test_serve_registers_scheduled_deployments(served):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        nightly = client.read_deployment_by_name("tokenmill-pipeline/nightly-tokenize")
        weekly = client.read_deployment_by_name("tokenmill-pipeline/weekly-retrain")
    assert [(s.schedule.cron, s.schedule.timezone) for s in nightly.schedules] == [("0 2 * * *", "UTC")]
    assert [(s.schedule.cron, s.schedule.timezone) for s in weekly.schedules] == [("0 3 * * 0", "UTC")]
    assert nightly.parameters["store"] == served and nightly.parameters["train_model"] is False
    assert nightly.parameters["tokenizer"]["vocab_size"] == 32768
    assert weekly.parameters["train_model"] is True


def test_server_schedules_the_cron_runs(served, server):
    """The server's scheduler turns the cron schedules into Scheduled flow runs."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType

    scheduled = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=["SCHEDULED"])))
    deadline = time.monotonic() + 90
    while True:
        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(flow_run_filter=scheduled, limit=50)
            names = {client.read_deployment(r.deployment_id).name for r in runs}
        if {"nightly-tokenize", "weekly-retrain"} <= names:
            break
        log = server.log_tail(n=1 << 20)
        assert "Can't evaluate bulk DML statement" not in log, "the server's scheduler service crashed:\n" + log[-3000:]
        assert time.monotonic() < deadline, f"no scheduled runs after 90 s (got {names})"
        time.sleep(2)
    times = sorted(r.expected_start_time.astimezone(dt.UTC) for r in runs)
    assert all((t.hour, t.minute) in ((2, 0), (3, 0)) for t in times), times  # 02:00 daily, 03:00 Sundays, UTC


def test_served_triggered_pipeline_completes(served, server, small_corpus):
    from pipeline_lib import ArtifactStore

    run = _trigger("tokenmill-pipeline/on-demand", **tiny(small_corpus))
    assert run.state.is_completed(), f"{run.state}\n{server.log_tail('serve')}"
    states = task_states(run.id)
    assert states["encode_shard"] == ["Completed"] * 2 and states["count_words"] == ["Completed"] * 2, states
    assert "train_lm" not in states
    store = ArtifactStore(served)
    assert {m["kind"] for m in store.list()} == {"raw", "corpus", "counts", "tokenizer", "tokens"}
    tok = store.latest("tokenizer")
    assert tok["meta"]["vocab_size"] == 300


@pytest.mark.parametrize(
    "parameters, named", [({"tokenizer": {"vocab_sise": 300}}, "vocab_sise"), ({"count": {"pattern": "gpt4"}}, "gpt4")]
)
def test_trigger_with_an_unknown_field_or_choice_is_refused(served, server, parameters, named):
    """A config dict is checked against the config's schema when the run is triggered."""
    from prefect.deployments import run_deployment

    try:
        run = run_deployment(
            "tokenmill-pipeline/on-demand",
            parameters=parameters,
            timeout=RUN_TIMEOUT,
            poll_interval=1,
            as_subflow=False,
        )
    except Exception as e:  # noqa: BLE001 - the server refuses to create the run
        assert named in str(e), e
        return
    assert run.state.is_failed() and named in (run.state.message or ""), run.state  # refused before any task
    assert not task_runs(run.id)


def test_bad_corpus_url_fails_download_after_retries(served, server):
    bad = f"http://127.0.0.1:{free_port()}/missing-corpus.txt"  # nothing listens there
    run = _trigger("tokenmill-pipeline/on-demand", **tiny(bad))
    assert run.state.is_failed(), run.state
    (download,) = [t for t in task_runs(run.id) if t.name.startswith("download_corpus")]
    assert download.state.name == "Failed"
    assert download.run_count == 3  # the first try and retries=2
    assert "missing-corpus.txt" in download.state.message and "connection refused" in download.state.message, (
        download.state.message
    )
    # Each failed try was visible as AwaitingRetry in the task run's history.
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        history = [s.name for s in client.read_task_run_states(download.id)]
    assert history.count("AwaitingRetry") == 2, history
    assert "InputError" in run.state.message or "missing-corpus.txt" in (run.state.message or ""), run.state.message


def _logs(flow_run_id) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        return [
            log.message
            for log in client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200
            )
        ]


_CRASH_SCRIPT = textwrap.dedent("""
    import os, signal, sys, threading
    from prefect.task_runners import ThreadPoolTaskRunner
    from flows.pipeline import tokenmill_pipeline
    from pipeline_lib.stages import spec as engine

    corpus, store, crash_after = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if crash_after >= 0:
        real, done, lock = engine.run_unit, [], threading.Lock()

        def encode_then_crash(stage, *args, **kwargs):
            if stage.kind != "tokens":
                return real(stage, *args, **kwargs)
            with lock:
                if len(done) >= crash_after:
                    os.kill(os.getpid(), signal.SIGKILL)  # a real crash: no cleanup, no final state
            record = real(stage, *args, **kwargs)
            with lock:
                done.append(record["shard"])
            return record

        engine.run_unit = encode_then_crash
    # One thread: the shards are encoded one after the other, so exactly `crash_after` finish.
    flow = tokenmill_pipeline.with_options(task_runner=ThreadPoolTaskRunner(max_workers=1))
    flow(corpus={"sources": [corpus], "n_shards": 4}, store=store, tokenizer={"vocab_size": 300}, train_model=False)
""")


def test_crash_mid_encoding_resumes_from_finished_shards(server, small_corpus, tmp_path):
    store = str(tmp_path / "store")
    env = server.client_env()

    def run(crash_after: int) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", _CRASH_SCRIPT, small_corpus, store, str(crash_after)],
            env=env,
            cwd=str(ROOT),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
        )

    def latest_run():  # this test's runs only (a scheduled run could start meanwhile)
        return next(r for r in flow_runs("tokenmill-pipeline") if r.parameters.get("store") == store)

    first = run(2)
    assert first.returncode == -9, first.stdout[-3000:] + first.stderr[-3000:]
    crashed = latest_run()
    (staging,) = [
        p for p in (Path(store) / "tokens" / ".staging").iterdir() if p.is_dir() and not p.name.startswith(".")
    ]
    done = sorted(os.listdir(staging / "_done"))
    assert done == ["shard_000000.json", "shard_000001.json"], done
    second = run(-1)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    resumed = latest_run()
    assert resumed.id != crashed.id and resumed.state.is_completed()
    states = task_states(resumed.id)
    assert sorted(states["encode_shard"]) == ["Cached", "Cached", "Completed", "Completed"], states
    for name in ("download_corpus", "shard_corpus", "reduce_counts", "learn_merges"):
        assert states[name] == ["Cached"], (name, states)
    assert states["count_words"] == ["Cached"] * 4, states
    # The shards encoded again are the two that had not finished (their log lines say so).
    encoded = sorted(m.split(":")[0] for m in _logs(resumed.id) if m.startswith("shard ") and "tokens for" in m)
    assert encoded == ["shard 2", "shard 3"], encoded
    # Nothing marks the killed run Crashed by itself (no process was left to report it):
    # the UI keeps it Running until a zombie-detection automation runs (docs/operations.md).
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        assert client.read_flow_run(crashed.id).state.name == "Running"


_SLEEP_FLOW = textwrap.dedent("""
    import os, signal, sys, time
    from prefect import flow

    name, seconds, then_kill = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "kill"

    @flow(name=name)
    def sleeper() -> None:
        time.sleep(seconds)
        if then_kill:
            os.kill(os.getpid(), signal.SIGKILL)

    sleeper()
""")


def _final_or_crashed(run_id, deadline: float):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        while True:
            state = client.read_flow_run(run_id).state
            if (state is not None and state.is_final()) or time.monotonic() > deadline:
                return state
            time.sleep(2)


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory) -> str:
    """~300 MB of text: counting its one shard takes seconds, time to cancel mid-task."""
    path = tmp_path_factory.mktemp("big-corpus") / "big.txt"
    text = SHAKESPEARE.read_text(encoding="utf-8")
    with open(path, "w", encoding="utf-8") as f:
        for i in range(270):
            f.write(text.replace("the ", f"the{i % 7} "))
    return str(path)


@pytest.mark.slow
def test_cancel_stops_the_compiled_core_mid_task(served, server, big_corpus, tmp_path):
    """A deployment run (`tokenmill serve`'s runner) cancelled through the API while its
    count_words task is inside the compiled core: the task stops within seconds and is
    recorded Cancelled, the flow run Cancelled, the partial output stays in staging."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.states import Cancelling

    store = tmp_path / "store"
    parameters = {"corpus": {"sources": [big_corpus], "n_shards": 1}, "store": str(store), "train_model": False}
    run = run_deployment("tokenmill-pipeline/on-demand", parameters=parameters, timeout=0, as_subflow=False)
    deadline = time.monotonic() + RUN_TIMEOUT
    counting = None
    with get_client(sync_client=True) as client:
        while counting is None:
            assert time.monotonic() < deadline, "count_words never started"
            from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

            for t in client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id]))):
                if t.name.startswith("count_words") and t.state is not None and t.state.name == "Running":
                    counting = t
            time.sleep(0.2)
        # At once: counting the shard takes a few seconds when the machine is idle. Were the
        # task not yet in the core, its first native call would be refused all the same.
        cancel_at = time.monotonic()
        client.set_flow_run_state(run.id, Cancelling(message="test: cancel mid-count"))
        while not (task_state := client.read_task_run(counting.id).state).is_final():
            assert time.monotonic() - cancel_at < 120, task_state
            time.sleep(0.2)
        stopped_s = time.monotonic() - cancel_at
        while not (flow_state := client.read_flow_run(run.id).state).is_final():
            assert time.monotonic() - cancel_at < 120, flow_state
            time.sleep(0.5)
        cancelled_s = time.monotonic() - cancel_at
    print(
        f"\ncancel -> count_words stopped {stopped_s:.1f} s, flow run {flow_state.name} {cancelled_s:.1f} s (incl. "
        "API polling)"
    )
    assert task_state.name == "Cancelled", task_state
    assert "compiled core" in (task_state.message or ""), task_state.message
    assert flow_state.name == "Cancelled", flow_state
    assert (store / "counts" / ".staging").is_dir(), "the stage's staging area stays, for gc"
    assert not [p for p in (store / "counts").iterdir() if not p.name.startswith(".")], "nothing published"


@pytest.mark.slow
def test_zombie_automation_is_scoped_and_spares_long_healthy_runs(server, small_corpus, tmp_path):
    """With the automation installed at its shortest window (3 heartbeats of 30 s): a
    tokenmill run killed mid-encoding becomes Crashed within the window; a healthy tokenmill
    flow run longer than the window completes without ever being Crashed; another team's
    flow killed without a final state is left alone (out of scope)."""
    from prefect.client.orchestration import get_client

    from deployments.automations import HEARTBEAT_S, MIN_HEARTBEATS, NAME, heartbeat_env, install

    within = MIN_HEARTBEATS * HEARTBEAT_S
    install(within=within)
    env = server.client_env(**heartbeat_env())
    long_s = within + 40
    healthy = server.spawn(
        [sys.executable, "-c", _SLEEP_FLOW, "tokenmill-heartbeat-check", str(long_s), "live"],
        "healthy",
        env=env,
        cwd=str(ROOT),
    )
    other = server.spawn(
        [sys.executable, "-c", _SLEEP_FLOW, "other-team-etl", "5", "kill"], "other", env=env, cwd=str(ROOT)
    )
    crash = subprocess.run(
        [sys.executable, "-c", _CRASH_SCRIPT, small_corpus, str(tmp_path / "store"), "1"],
        env=env,
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    killed_at = time.time()
    assert crash.returncode == -9, crash.stderr[-3000:]
    killed = next(r for r in flow_runs("tokenmill-pipeline") if r.parameters.get("store") == str(tmp_path / "store"))
    state = _final_or_crashed(killed.id, time.monotonic() + within + 120)
    assert state.name == "Crashed" and NAME in (state.message or ""), state
    detected_s = state.timestamp.timestamp() - killed_at
    print(
        f"\nzombie automation: killed tokenmill run Crashed {detected_s:.0f} s after the kill (window {within} s, "
        f"heartbeat {HEARTBEAT_S} s)"
    )
    assert detected_s <= within + 60, detected_s  # the window plus the triggers service's own pace

    assert healthy.wait(timeout=long_s + 240) == 0, server.log_tail("healthy")
    assert other.wait(timeout=60) == -9
    (healthy_run,) = flow_runs("tokenmill-heartbeat-check")
    (other_run,) = flow_runs("other-team-etl")
    with get_client(sync_client=True) as client:
        history = [s.name for s in client.read_flow_run_states(healthy_run.id)]
        assert "Crashed" not in history and history[-1] == "Completed", history
        # killed ~long_s seconds ago, more than the window: still Running, nobody's business here
        assert client.read_flow_run(other_run.id).state.name == "Running"


# ----------------------------------------------------------------------------- prefect deploy
# `prefect deploy` / `tokenmill deploy` and a process worker on a clean clone, with the pull
# steps that clone and install the package: tests/test_deploy_clean_worker.py.
