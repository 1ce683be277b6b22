"""Deployments that run anywhere: pull steps, `tokenmill deploy`, concurrency, failure
notifications and `tokenmill serve`'s manners, against a real local Prefect server.

The repository the workers clone is a commit-free snapshot of this working tree (tracked
and untracked files, one commit in a fresh repository in tmp), so uncommitted work is what
is tested. Deploying happens in a `git clone` of that snapshot (its `origin` is the
snapshot: the default repository), the worker in a third directory with its own virtual
environment, whose only tokenmill is what the deployment's pull steps install.

The full clean-worker run (clone + `pip install` with the C++ core compiled + a tiny
pipeline) takes 2-4 minutes on a loaded 2-core machine and fetches the build requirements
(scikit-build-core, nanobind) through pip: it is marked slow.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from prefect_server import PrefectServer, stop_process, task_states  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SHAKESPEARE = ROOT / "pipeline_lib" / "data" / "tinyshakespeare.txt"
BRANCH = "deploy-test"
POOL = "tokenmill"  # prefect.yaml's (its work_queue build step names it)
DEPLOY_TIMEOUT = 240
RUN_TIMEOUT = 480  # clone, pip install (compiles the core), tiny pipeline; loaded 2-core machine


def _git(*args: str, cwd) -> str:
    done = subprocess.run(["git", *args], cwd=str(cwd), capture_output=True, text=True, check=True)
    return done.stdout


def snapshot_repository(dest: Path) -> Path:
    """A one-commit repository on branch BRANCH with this working tree's files (tracked
    and untracked, not ignored, that exist now)."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=str(ROOT),
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    dest.mkdir(parents=True)
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(src.read_bytes())
            os.chmod(dest / rel, src.stat().st_mode & 0o777)
    _git("init", "-q", "-b", BRANCH, cwd=dest)
    _git("add", "-A", cwd=dest)
    _git(
        "-c", "user.name=tokenmill-test", "-c", "user.email=test@example.invalid", "commit", "-qm", "snapshot", cwd=dest
    )
    return dest


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with PrefectServer(tmp_path_factory.mktemp("prefect-server")) as s:
        with s.settings():
            yield s


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """The deploying checkout: a clone of the snapshot (origin = the snapshot)."""
    base = tmp_path_factory.mktemp("repos")
    snapshot_repository(base / "origin")
    _git("clone", "-q", str(base / "origin"), str(base / "checkout"), cwd=base)
    return base / "checkout"


@pytest.fixture(scope="module")
def pool(server):
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "prefect"),
            "--no-prompt",
            "work-pool",
            "create",
            POOL,
            "--type",
            "process",
            "--overwrite",
        ],
        env=server.client_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return POOL


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("corpus") / "shakespeare_head.txt"
    path.write_text(SHAKESPEARE.read_text(encoding="utf-8")[:120_000], encoding="utf-8")
    return str(path)


def _read_all(names) -> dict[str, dict]:
    """What the server holds for each deployment, in comparable form."""
    from prefect.client.orchestration import get_client

    out = {}
    with get_client(sync_client=True) as client:
        for name in names:
            d = client.read_deployment_by_name(name)
            limit = d.global_concurrency_limit
            out[name] = {
                "entrypoint": d.entrypoint,
                "pool": d.work_pool_name,
                "queue": d.work_queue_name,
                "pull_steps": d.pull_steps,
                # prefect.yaml spells out storage_options: None (the default) where deploy.py leaves it out
                "parameters": {k: v for k, v in d.parameters.items() if not (k == "storage_options" and v is None)},
                "tags": sorted(d.tags),
                "job_variables": d.job_variables,
                "paused": d.paused,
                "schedules": [(s.schedule.cron, s.schedule.timezone) for s in d.schedules],
                "concurrency": limit
                and (limit.limit, d.concurrency_options and d.concurrency_options.collision_strategy.value),
            }
    return out


def _prefect_deploy(
    server, checkout: Path, pool: str, store: str, corpus: str, install: str, result_storage: str | None = None
):
    env = server.client_env(TOKENMILL_STORE=store, TOKENMILL_CORPUS=corpus, TOKENMILL_INSTALL=install)
    if result_storage:
        env["TOKENMILL_RESULT_STORAGE"] = result_storage
    argv = [
        str(Path(sys.executable).parent / "prefect"),
        "--no-prompt",
        "deploy",
        "--all",
        "--prefect-file",
        "deployments/prefect.yaml",
    ]
    done = subprocess.run(argv, env=env, cwd=str(checkout), capture_output=True, text=True, timeout=DEPLOY_TIMEOUT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done


def _delete(names) -> None:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        for name in names:
            try:
                client.delete_deployment(client.read_deployment_by_name(name).id)
            except ObjectNotFound:
                pass


NAMES = [f"tokenmill-{f}/on-demand" for f in ("pipeline", "corpus", "tokenizer", "encode", "lm")] + [
    "tokenmill-pipeline/nightly-tokenize",
    "tokenmill-pipeline/weekly-retrain",
    "tokenmill-pipeline/on-demand-dask",
]


def test_tokenmill_deploy_matches_prefect_yaml(server, checkout, pool, small_corpus, tmp_path):
    """`prefect deploy` of prefect.yaml and `tokenmill deploy` create the same deployments:
    pull steps that clone the deploying checkout's origin and branch and install it, module
    entrypoints, schedules, parameters, one run at a time for the scheduled ones."""
    from prefect.client.orchestration import get_client

    from deployments.deploy import main as deploy_main

    store = str(tmp_path / "store")
    install = "python -m pip install --no-deps ."
    _prefect_deploy(server, checkout, pool, store, small_corpus, install)
    from_yaml = _read_all(NAMES)
    origin = str(checkout.parent / "origin")
    expected_pull = [
        {"prefect.deployments.steps.git_clone": {"id": "clone", "repository": origin, "branch": BRANCH}},
        {"prefect.deployments.steps.run_shell_script": {"directory": "{{ clone.directory }}", "script": install}},
        {"prefect.deployments.steps.set_working_directory": {"directory": "."}},
    ]
    nightly = from_yaml["tokenmill-pipeline/nightly-tokenize"]
    assert nightly["pull_steps"] == expected_pull
    assert nightly["entrypoint"] == "deployments.entrypoints.tokenmill_pipeline"
    assert (nightly["pool"], nightly["queue"], nightly["concurrency"]) == (pool, "scheduled", (1, "ENQUEUE"))
    assert from_yaml["tokenmill-pipeline/weekly-retrain"]["concurrency"] == (1, "ENQUEUE")
    assert from_yaml["tokenmill-pipeline/on-demand"]["concurrency"] is None
    assert nightly["schedules"] == [("0 2 * * *", "UTC")]
    from deployments.automations import heartbeat_env

    assert from_yaml["tokenmill-pipeline/on-demand-dask"]["job_variables"] == {
        "env": {**heartbeat_env(), "TOKENMILL_RUNNER": "dask"}
    }
    # the zombie automation's heartbeat
    assert from_yaml["tokenmill-pipeline/on-demand"]["job_variables"] == {"env": heartbeat_env()}
    with get_client(sync_client=True) as client:
        assert client.read_work_queue_by_name("scheduled", work_pool_name=pool).concurrency_limit == 1
    _delete(NAMES)  # start from nothing: `tokenmill deploy` must create, not inherit

    cwd = os.getcwd()
    os.chdir(checkout)
    try:
        rc = deploy_main(["--store", store, "--corpus", small_corpus, "--pool", pool, "--install-command", install])
    finally:
        os.chdir(cwd)
    assert rc == 0
    from_cli = _read_all(NAMES)
    diff = [
        (n, k, from_yaml[n][k], from_cli[n][k])
        for n in NAMES
        for k in from_yaml[n]
        if from_yaml[n][k] != from_cli[n][k]
    ]
    assert not diff, diff

    # Other schedules from the command line; a bad one is one clear error.
    os.chdir(checkout)
    try:
        assert (
            deploy_main(
                [
                    "--store",
                    store,
                    "--pool",
                    pool,
                    "--nightly-cron",
                    "30 1 * * *",
                    "--weekly-cron",
                    "0 5 * * 6",
                    "--install-command",
                    install,
                ]
            )
            == 0
        )
        assert deploy_main(["--store", store, "--pool", pool, "--nightly-cron", "every night"]) == 2
    finally:
        os.chdir(cwd)
    again = _read_all(NAMES)
    assert again["tokenmill-pipeline/nightly-tokenize"]["schedules"] == [("30 1 * * *", "UTC")]
    assert again["tokenmill-pipeline/weekly-retrain"]["schedules"] == [("0 5 * * 6", "UTC")]


class _Hook(http.server.BaseHTTPRequestHandler):
    received: list[dict] = []

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).received.append(json.loads(body or b"{}"))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_failure_notification_automation_fires(server, tmp_path):
    """A failed tokenmill flow run sends the notification through the named block: a
    webhook to a listener on 127.0.0.1."""
    from prefect import flow
    from prefect.automations import Automation
    from prefect.blocks.notifications import CustomWebhookNotificationBlock
    from prefect.blocks.system import Secret

    from deployments.automations import FAILURE_NAME, install_failure_notification
    from pipeline_lib.errors import InputError

    httpd = http.server.HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/hook"
        CustomWebhookNotificationBlock(
            name="tokenmill-test", url=url, json_data={"subject": "{{subject}}", "body": "{{body}}"}
        ).save("ops", overwrite=True)
        Secret(value="x").save("not-a-notifier", overwrite=True)
        with pytest.raises(InputError, match="not a notification block"):
            install_failure_notification("secret/not-a-notifier")
        with pytest.raises(InputError, match="no such block"):
            install_failure_notification("custom-webhook/missing")
        install_failure_notification("custom-webhook/ops")
        install_failure_notification("custom-webhook/ops")  # idempotent: replaced, not doubled
        automation = Automation.read(name=FAILURE_NAME)
        assert automation.enabled and automation.trigger.expect == {
            "prefect.flow-run.Failed",
            "prefect.flow-run.Crashed",
        }

        @flow(name="tokenmill-notify-probe")
        def probe(store: str):
            raise ValueError("corpus source 'nowhere.txt': no such file")

        state = probe(str(tmp_path / "store"), return_state=True)
        assert state.is_failed()
        deadline = time.monotonic() + 120
        while not _Hook.received and time.monotonic() < deadline:
            time.sleep(1)
        assert _Hook.received, f"no notification after 120 s\n{server.log_tail()}"
        time.sleep(3)  # a second (duplicate) notification would arrive by now
        assert len(_Hook.received) == 1, _Hook.received
        note = _Hook.received[0]
        assert "tokenmill-notify-probe" in note["subject"] and "Failed" in note["subject"], note
        assert "nowhere.txt" in note["body"] and str(tmp_path / "store") in note["body"], note

        @flow(name="other-flow")
        def other():
            raise ValueError("not ours")

        assert other(return_state=True).is_failed()
        time.sleep(8)
        assert len(_Hook.received) == 1, _Hook.received  # only tokenmill-* flows notify
    finally:
        httpd.shutdown()


def test_serve_refuses_pool_deployments_and_stops_on_one_sigterm(server, checkout, pool, small_corpus, tmp_path):
    """`tokenmill serve` does not take over deployments that run on a work pool, and with
    none in the way it stops on the first SIGTERM sent to it alone, a run in flight
    included (Cancelled), pausing only what it registered."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    from deployments.deploy import deploy
    from deployments.serve import serve
    from pipeline_lib.errors import InputError

    store = str(tmp_path / "store")
    cwd = os.getcwd()
    os.chdir(checkout)
    try:
        deploy(store, [small_corpus], pool=pool, install_command="true")
    finally:
        os.chdir(cwd)
    before = _read_all(NAMES)
    with pytest.raises(InputError, match=r"take over .*tokenmill-pipeline/nightly-tokenize \(work pool"):
        serve(store, [small_corpus])
    assert _read_all(NAMES) == before  # untouched: same pool, pull steps, parameters, not paused

    _delete(NAMES)
    proc = server.spawn(
        [sys.executable, "-m", "flows.cli", "serve", "--store", store, "--corpus", small_corpus],
        "serve-sigterm",
        env=server.client_env(PREFECT_RUNNER_POLL_FREQUENCY="1"),
        cwd=str(ROOT),
    )
    try:
        from prefect_server import wait_for_deployment

        for name in ("tokenmill-pipeline/nightly-tokenize", "tokenmill-lm/on-demand"):
            wait_for_deployment(name, timeout=150, proc=proc, log=lambda: server.log_tail("serve-sigterm"))
        # A run long enough to be in flight (it trains the LM) when the signal comes.
        run = run_deployment(
            "tokenmill-pipeline/on-demand",
            timeout=0,
            as_subflow=False,
            parameters={
                "corpus": {"sources": [small_corpus], "n_shards": 2},
                "tokenizer": {"vocab_size": 300},
                "train_model": True,
                "lm": {"steps": 100_000},
            },
        )
        deadline = time.monotonic() + 180
        with get_client(sync_client=True) as client:
            while not client.read_flow_run(run.id).state.is_running():
                assert time.monotonic() < deadline and proc.poll() is None, server.log_tail("serve-sigterm")
                time.sleep(0.5)
        time.sleep(3)
        proc.send_signal(signal.SIGTERM)  # once, to the serve process alone (as `kill` or a service manager does)
        rc = proc.wait(60)
    finally:
        stop_process(proc)
    log = server.log_tail("serve-sigterm")
    assert rc == 0, log
    assert "stopped; paused the schedules of 8 deployment(s)" in log, log
    assert "never awaited" not in log, log
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(run.id).state.name == "Cancelled", log
    served = _read_all(NAMES)
    assert all(d["paused"] and d["pool"] is None for d in served.values()), served
    assert served["tokenmill-pipeline/nightly-tokenize"]["concurrency"] == (1, "ENQUEUE")


def _worker_venv(path: Path) -> Path:
    """A virtual environment with the test environment's packages importable (a .pth
    line to its site-packages) but no tokenmill of its own: .pth files there (the editable
    install's finder) are not processed, so only what the pull step installs is found."""
    import sysconfig

    base = sys.base_prefix
    subprocess.run(
        [os.path.join(base, "bin", "python3"), "-m", "venv", "--without-pip", str(path)], check=True, timeout=120
    )
    site = Path(
        subprocess.run(
            [str(path / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return path


@pytest.mark.slow
def test_clean_worker_runs_a_deployment(server, checkout, pool, small_corpus, tmp_path):
    """Deploy from a clone, run a process worker in a third directory with its own venv: the
    run clones the repository, installs it (the core compiled), and completes; task results
    go to the result storage block named at deploy time."""
    from prefect.client.orchestration import get_client

    _delete(NAMES)  # what other tests left (paused by serve) is not this test's business
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.deployments import run_deployment
    from prefect.filesystems import LocalFileSystem

    from pipeline_lib import ArtifactStore

    results = tmp_path / "results"
    # a shared mount, for the test
    LocalFileSystem(basepath=str(results)).save("tokenmill-test-results", overwrite=True)
    store = str(tmp_path / "store")
    venv = _worker_venv(tmp_path / "worker-venv")
    _prefect_deploy(
        server,
        checkout,
        pool,
        store,
        small_corpus,
        "python -m pip install --no-deps .",
        result_storage="local-file-system/tokenmill-test-results",
    )
    workdir = tmp_path / "worker"
    workdir.mkdir()
    env = server.client_env(PREFECT_WORKER_QUERY_SECONDS="1")
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"  # the worker's `python` is its venv's
    env.pop("PYTHONPATH", None)
    t0 = time.monotonic()
    worker = server.spawn(
        [str(venv / "bin" / "python"), "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process"],
        "clean-worker",
        env=env,
        cwd=str(workdir),
    )
    try:
        run = run_deployment(
            "tokenmill-pipeline/nightly-tokenize",
            timeout=RUN_TIMEOUT,
            poll_interval=2,
            as_subflow=False,
            parameters={"corpus": {"sources": [small_corpus], "n_shards": 2}, "tokenizer": {"vocab_size": 300}},
        )
        elapsed = time.monotonic() - t0
        assert run.state is not None and run.state.is_completed(), (
            f"{run.state}\n{server.log_tail('clean-worker', 12000)}"
        )
        print(f"worker start -> clean-worker run Completed: {elapsed:.1f} s")
    finally:
        stop_process(worker)
    with get_client(sync_client=True) as client:
        logs = [
            log.message
            for log in client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])), limit=200)
        ]
    for step in ("git_clone", "run_shell_script", "set_working_directory"):
        assert any(f"Executing deployment step: {step}" in m for m in logs), logs
    states = task_states(run.id)
    assert states["encode_shard"] == ["Completed"] * 2, states
    tok = ArtifactStore(store).latest("tokenizer")
    assert tok["meta"]["vocab_size"] == 300
    assert tok["backend"]["backend"] == "native", tok["backend"]  # the core the pull step compiled
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert list((site / "pipeline_lib").glob("_tokcore*.so")), (
        "the pull step did not install the compiled core into the worker's venv"
    )
    assert not (workdir / "deployments").exists()  # the clone lives in the run's own temporary directory
    assert any(p.is_file() for p in results.rglob("*")), "no task result written to the result storage block"


def _first_task_latency(run_id) -> float:
    """Seconds from the flow run's creation (the trigger) to its first task run's start."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        created = client.read_flow_run(run_id).created
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
    starts = [t.start_time for t in tasks if t.start_time is not None]
    assert created is not None and starts, tasks
    return (min(starts) - created).total_seconds()


@pytest.mark.slow
def test_start_latency_of_the_worker_setups(server, checkout, pool, small_corpus, tmp_path):
    """Trigger -> first task for the process-pool setups (docs/operations.md, "Worker
    setups"): the wheel cache's first run of a version (builds the wheel), a later run
    (already installed), another worker on the same cache (installs the cached wheel), and
    a preinstalled environment (no pull steps). Prints the figures."""
    from prefect.deployments import run_deployment

    from deployments.deploy import main as deploy_main

    _delete(NAMES)
    store = str(tmp_path / "store")
    cache = tmp_path / "wheels"
    params = {
        "corpus": {"sources": [small_corpus], "n_shards": 2},
        "tokenizer": {"vocab_size": 300},
        "train_model": False,
    }
    figures: dict[str, float] = {}

    def deploy(install: str) -> None:
        cwd = os.getcwd()
        os.chdir(checkout)
        try:
            assert (
                deploy_main(["--store", store, "--corpus", small_corpus, "--pool", pool, "--install-command", install])
                == 0
            )
        finally:
            os.chdir(cwd)

    def run_with_worker(venv: Path, key: str, label: str) -> None:
        workdir = tmp_path / f"work-{key}"
        workdir.mkdir()
        env = server.client_env(PREFECT_WORKER_QUERY_SECONDS="1", TOKENMILL_WHEEL_CACHE=str(cache))
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
        env.pop("PYTHONPATH", None)
        worker = server.spawn(
            [str(venv / "bin" / "python"), "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process"],
            f"w-{key}",
            env=env,
            cwd=str(workdir),
        )
        try:
            run = run_deployment(
                "tokenmill-pipeline/on-demand",
                timeout=RUN_TIMEOUT,
                poll_interval=1,
                as_subflow=False,
                parameters=params,
            )
            assert run.state is not None and run.state.is_completed(), (
                f"{label}: {run.state}\n{server.log_tail(f'w-{key}', 12000)}"
            )
        finally:
            stop_process(worker)
        figures[label] = _first_task_latency(run.id)

    first = _worker_venv(tmp_path / "venv-a")
    deploy("python -m deployments.wheel_cache --no-deps")
    run_with_worker(first, "build", "wheel cache, first run of the version (build)")
    run_with_worker(first, "installed", "wheel cache, later run (already installed)")
    run_with_worker(_worker_venv(tmp_path / "venv-b"), "cached", "wheel cache, another worker (cached wheel)")
    deploy("none")
    run_with_worker(first, "preinstalled", "preinstalled environment (no pull steps)")
    print()
    for label, seconds in figures.items():
        print(f"trigger -> first task: {seconds:6.1f} s  {label}")
    assert len(list(cache.glob("*/tokenmill-*.whl"))) == 1  # built once
    build, *later = figures.values()
    assert max(later) < build
