"""The deployments' install step (deployments/wheel_cache.py): a wheel built once per code
version, installed from the cache by later runs and other workers, nothing done where the
version is already installed.

A small stand-in project named tokenmill (pure Python, setuptools, no build isolation) keeps
this fast; each "worker" is a virtual environment of its own whose only tokenmill is the one
the step installs. The real package with its compiled core goes through the same code in
tests/test_deploy_clean_worker.py (slow)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=str(cwd), check=True, capture_output=True
    )


@pytest.fixture
def project(tmp_path) -> Path:
    src = tmp_path / "project"
    (src / "tm_probe").mkdir(parents=True)
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "tokenmill"\nversion = "0.1.0"\n\n[tool.setuptools]\npackages = ["tm_probe"]\n'
    )
    (src / "tm_probe" / "__init__.py").write_text("GENERATION = 1\n")
    _git("init", "-q", "-b", "main", cwd=src)
    _git("add", ".", cwd=src)
    _git("commit", "-qm", "one", cwd=src)
    return src


def _venv(path: Path) -> Path:
    """A virtual environment with this one's packages importable (pip, setuptools) but
    whatever it installs its own (see test_deploy_clean_worker._worker_venv)."""
    subprocess.run(
        [os.path.join(sys.base_prefix, "bin", "python3"), "-m", "venv", "--without-pip", str(path)],
        check=True,
        timeout=120,
    )
    site = subprocess.run(
        [str(path / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return path


def _install(venv: Path, project: Path, cache: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENMILL_WHEEL_CACHE": str(cache)}
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "deployments.wheel_cache", "--no-deps", "--no-build-isolation"],
        cwd=str(project),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def _generation(venv: Path) -> int:
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import tm_probe; print(tm_probe.GENERATION)"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout)


def test_built_once_per_version_then_cached_then_skipped(project, tmp_path):
    cache = tmp_path / "wheels"
    worker_a, worker_b = _venv(tmp_path / "a"), _venv(tmp_path / "b")
    assert "built into the wheel cache" in _install(worker_a, project, cache)
    assert _generation(worker_a) == 1
    (built,) = cache.glob("*/tokenmill-0.1.0-*.whl")
    assert "already installed" in _install(worker_a, project, cache)
    line = _install(worker_b, project, cache)  # another worker, same code version
    assert "from the wheel cache" in line and _generation(worker_b) == 1
    assert list(cache.glob("*/tokenmill-*.whl")) == [built]

    # A new commit is a new version (same version number): built again, and installed over the old one.
    (project / "tm_probe" / "__init__.py").write_text("GENERATION = 2\n")
    _git("commit", "-qam", "two", cwd=project)
    assert "built into the wheel cache" in _install(worker_a, project, cache)
    assert _generation(worker_a) == 2 and len(list(cache.glob("*/tokenmill-*.whl"))) == 2
    assert "from the wheel cache" in _install(worker_b, project, cache) and _generation(worker_b) == 2


def test_uncommitted_changes_are_installed_but_not_cached(project, tmp_path):
    cache = tmp_path / "wheels"
    (project / "tm_probe" / "__init__.py").write_text("GENERATION = 3\n")
    worker = _venv(tmp_path / "w")
    assert "not a clean git checkout" in _install(worker, project, cache)
    assert _generation(worker) == 3 and not list(cache.glob("*/*.whl"))
