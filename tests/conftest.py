"""Shared fixtures. Prefect state goes to a per-session temp dir, never ~/.prefect."""

from __future__ import annotations

import os
import pathlib
import tempfile

_PREFECT_TMP = tempfile.mkdtemp(prefix="tokenmill-tests-prefect-")
os.environ.setdefault("PREFECT_HOME", _PREFECT_TMP)
os.environ["PREFECT_LOCAL_STORAGE_PATH"] = os.path.join(_PREFECT_TMP, "storage")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# CLI subprocesses without PREFECT_API_URL start tokenmill's local server in this PREFECT_HOME;
# it goes away on its own soon after them, and `_stop_local_server` stops it at the end.
os.environ.setdefault("TOKENMILL_SERVER_IDLE_TIMEOUT", "120")

import pytest  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHAKESPEARE = ROOT / "pipeline_lib" / "data" / "tinyshakespeare.txt"
MULTILINGUAL = ROOT / "tests" / "data" / "multilingual.txt"


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
