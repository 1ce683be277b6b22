"""The compiled core's build: its source hash (a stale build fails here; no version id uses
it: the golden-output tests pin what the core computes) and its warnings."""

from __future__ import annotations

import hashlib
import pathlib
import shutil
import subprocess
import sysconfig

import pytest

from pipeline_lib import _tokcore as tokcore
from pipeline_lib import tokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORE = ROOT / "pipeline_lib" / "_core"


def source_hash() -> str:
    """CMakeLists.txt's CORE_SOURCE_HASH: sha256 of "<path> <sha256>\\n" per file, sorted by path."""
    files = sorted(
        [*CORE.glob("*.cpp"), *CORE.glob("*.h"), ROOT / "CMakeLists.txt"], key=lambda p: p.relative_to(ROOT).as_posix()
    )
    manifest = "".join(
        f"{p.relative_to(ROOT).as_posix()} {hashlib.sha256(p.read_bytes()).hexdigest()}\n" for p in files
    )
    return hashlib.sha256(manifest.encode()).hexdigest()


def test_built_from_these_sources():
    """A stale build (sources edited, core not rebuilt) fails here: rebuild with `pip install -e .`."""
    assert tokcore.CORE_SOURCE_HASH == source_hash()


def test_backend_info():
    assert tokenizer.backend_info() == {"backend": "native", "core_source_hash": tokcore.CORE_SOURCE_HASH}


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")
def test_core_compiles_without_warnings():
    """The build's flags (-O3 -Wall -Wextra) with -Werror, file by file (~10 s)."""
    import nanobind

    assert "-O3 -Wall -Wextra" in (ROOT / "CMakeLists.txt").read_text()
    include = pathlib.Path(nanobind.include_dir())
    flags = [
        "-std=c++17",
        "-O3",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-c",
        "-o",
        "/dev/null",
        '-DTOKCORE_SOURCE_HASH="x"',
        f"-I{sysconfig.get_paths()['include']}",
        f"-isystem{include}",
        f"-isystem{include.parent / 'ext' / 'robin_map' / 'include'}",
    ]
    for src in sorted(CORE.glob("*.cpp")):
        proc = subprocess.run(["c++", *flags, str(src)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{src.name}:\n{proc.stderr[-3000:]}"
