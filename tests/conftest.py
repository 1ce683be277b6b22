"""Shared fixtures. Prefect state goes to a per-session temp dir, never ~/.prefect."""

from __future__ import annotations

import os
import pathlib
import signal
import tempfile

_PREFECT_TMP = tempfile.mkdtemp(prefix="tokenmill-tests-prefect-")
os.environ.setdefault("PREFECT_HOME", _PREFECT_TMP)
os.environ["PREFECT_LOCAL_STORAGE_PATH"] = os.path.join(_PREFECT_TMP, "storage")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# CLI subprocesses without PREFECT_API_URL start tokenmill's local server in this PREFECT_HOME;
# it goes away on its own soon after them, and `_stop_local_server` stops it at the end.
os.environ.setdefault("TOKENMILL_SERVER_IDLE_TIMEOUT", "120")
# A test run started in the background by a non-interactive shell (`pytest &`, nohup) inherits
# SIGINT ignored, and so would every process it starts: the Ctrl-C tests' children would never
# see the signal. Caught here, it is reset to the default in each child that execs.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHAKESPEARE = ROOT / "pipeline_lib" / "data" / "tinyshakespeare.txt"
MULTILINGUAL = ROOT / "pipeline_lib" / "data" / "multilingual.txt"


# The test tiers. `integration`: a Prefect server, a moto S3 server, Dask, worker processes or
# a subprocess (a CLI, a worker to kill, a compiler); `pytest -m "not integration"` runs the
# rest, the unit tier. Whole modules by name, single tests by node id, any other test by the
# fixtures it uses.
INTEGRATION_MODULES = {
    "test_browser",
    "test_cli",
    "test_cli_startup",
    "test_cluster",
    "test_core_build",
    "test_crash_safety",
    "test_dask",
    "test_ddp",
    "test_deploy_clean_worker",
    "test_deployments",
    "test_golden",
    "test_lm_gpu_check",
    "test_lm_torch_only",
    "test_interrupt",
    "test_store_gc_foreign",
    "test_store_readonly",
    "test_store_s3",
    "test_store_verify_rm",
    "test_warm",
    "test_wheel_cache",  # virtual environments, pip and git in subprocesses
}
INTEGRATION_TESTS = {
    "test_bad_inputs.py::test_one_100mb_line",
    "test_bad_inputs.py::test_document_cap_names_its_flag_from_the_cli",
    "test_tiktoken_api.py::test_pure_python_backend_gives_the_same_ids",
    "test_tiktoken_api.py::test_a_process_pool_gets_the_same_tokenizer",
    "test_parallel_shards.py::test_a_killed_group_is_the_only_one_redone",
    "test_encode_file.py::test_peak_memory_does_not_grow_with_the_file",  # a fresh interpreter's peak RSS
    "test_tiktoken_suite.py::test_no_download_client_or_tiktoken_is_imported",
    "test_shard_fast.py::test_a_100_mb_line_takes_a_few_times_its_size",
    "test_store_safety.py::test_cli_gc_on_a_folder_that_is_not_a_store",
    "test_failures.py::test_paused_s3_endpoint_fails_in_bounded_time",
    "test_corpus.py::test_reference_mode_reads_s3_sources_in_place",
    "test_corpus.py::test_reference_mode_refuses_a_source_that_changed",
    "test_growth.py::test_cli_tokenizer_train_on_one_repeated_character",
    "test_local_reads.py::test_plain_local_reads_import_no_fsspec",  # a fresh interpreter's imports
}
INTEGRATION_FIXTURES = {"prefect_harness", "api_url", "flows_ready", "s3_options", "s3_bucket"}

# pyproject.toml gives each test 120 s; these wait on longer things by design.
LONGER_TIMEOUTS = {
    # a worker clones the repository and pip-installs it (compiling the core): RUN_TIMEOUT 480 s
    "test_deploy_clean_worker": 900,
    "test_deployments": 600,  # triggered runs on a real server and worker, up to RUN_TIMEOUT 240 s each
    "test_cluster": 600,  # a Dask cluster and the CLI against it, a 600 s subprocess limit
    # starts and stops tokenmill's local Prefect server (~90 s under load), 300 s subprocess limits
    "test_cli_startup": 300,
    "test_bad_inputs.py::test_one_100mb_line": 300,  # a 100 MB line through the CLI, a 300 s subprocess limit
    # two spawned interpreters import torch and train twice over gloo: 10-16 s here, over 120 s once in a loaded CI run
    "test_ddp": 600,
    "test_parallel_shards": 300,  # 40 sharding tasks through a flow, a killed subprocess and its rerun
    "test_store_gc_foreign": 300,  # CLI subprocesses with 300 s limits
    "test_store_verify_rm": 300,  # CLI subprocesses with 300 s limits
    "test_store_readonly": 300,  # a CLI run against a read-only mount, 300 s subprocess limits
}


# Left out of every run whose -m expression does not name them (so `pytest` and
# `pytest -m "not integration"` leave them out, `pytest -m slow` runs the slow ones): an -m
# on the command line replaces one in addopts, so they cannot be left out there.
BY_HAND = ("slow", "benchmark")


def pytest_ignore_collect(collection_path, config):
    """`-m "not integration"` (the unit tier) does not import the integration modules at all:
    their imports (Prefect, Dask, moto) are most of the tier's collection time otherwise."""
    if collection_path.suffix == ".py" and collection_path.stem in INTEGRATION_MODULES and _unit_tier_only(config):
        return True
    return None


def _unit_tier_only(config) -> bool:
    return " ".join((config.getoption("markexpr") or "").split()) == "not integration"


def pytest_collection_modifyitems(config, items):
    named = config.getoption("markexpr") or ""
    by_hand = [m for m in BY_HAND if m not in named]
    left_out = [item for item in items if any(item.get_closest_marker(m) for m in by_hand)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not any(item.get_closest_marker(m) for m in by_hand)]
    for item in items:
        module = item.path.stem
        test = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
        params = getattr(item, "callspec", None)
        # the store tests' moto backend
        on_s3 = params is not None and any(isinstance(v, str) and v == "s3" for v in params.params.values())
        if (
            module in INTEGRATION_MODULES
            or test in INTEGRATION_TESTS
            or on_s3
            or INTEGRATION_FIXTURES & set(item.fixturenames)
        ):
            item.add_marker(pytest.mark.integration)
        longer = LONGER_TIMEOUTS.get(test, LONGER_TIMEOUTS.get(module))
        if longer is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(longer))


@pytest.fixture(scope="session", autouse=True)
def _stop_local_server():
    yield
    from flows.prefect_api import LocalServer, server_dir

    LocalServer(server_dir(pathlib.Path(_PREFECT_TMP))).stop()


@pytest.fixture(scope="session")
def prefect_harness():
    """A temporary Prefect API and database for the whole session (starting one costs ~9 s)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
        _drain_prefect_services(timeout_s=60)


def _drain_prefect_services(timeout_s: float) -> None:
    """Drain Prefect's event and log workers with a bound, before the harness drains them
    without one. Seen here with Prefect 3.9.1, now and then at the end of a session: a
    worker's drain never completes while its thread idles, and the harness's unbounded
    `drain_all()` hung the run for good. A worker still draining after `timeout_s` is
    dropped from its service's registry (the harness then has nothing to wait for) and the
    session says so; the test server stops either way."""
    import warnings

    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (APILogWorker, EventsWorker):
        _done, stuck = service.drain_all(timeout=timeout_s)
        if stuck:
            with service._instance_lock, service._instance_cache_lock:
                for key, instance in list(service._instances.items()):
                    if instance._done_event is not None and not instance._done_event.is_set():
                        del service._instances[key]
            warnings.warn(
                f"Prefect's {service.__name__} did not drain within {timeout_s:g} s at the end of the session",
                stacklevel=1,
            )


@pytest.fixture(scope="session")
def shakespeare_text() -> str:
    return SHAKESPEARE.read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def multilingual_text() -> str:
    return MULTILINGUAL.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def torch_one_thread():
    """Toy models gain nothing from intra-op threads, and on a busy 2-core box spinning
    OpenMP threads make them many times slower; restore the setting afterwards."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def lm_device():
    """The device LM tests run on: TOKENMILL_TEST_DEVICE (cpu unless set; see tests/test_lm_cuda.py)."""
    import torch

    from pipeline_lib.lm.testing import test_device

    return torch.device(test_device())
