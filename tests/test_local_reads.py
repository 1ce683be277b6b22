"""`fsio.read_bytes` reads a plain local path without fsspec: the same bytes and the same
errors as through fsspec (a ``file://`` URL), compressed or not."""

from __future__ import annotations

import gzip
import subprocess
import sys

import pytest

from pipeline_lib.errors import InputError
from pipeline_lib.fsio import read_bytes


def _outcome(url: str, max_bytes: int | None = None):
    try:
        return ("ok", read_bytes(url, max_bytes))
    except InputError as e:
        return ("refused", str(e).replace("file://", ""))


@pytest.mark.parametrize("suffix", [".json", ".tiktoken", ".txt", ".bpe", ".gz", ".tiktoken.gz"])
def test_plain_local_reads_equal_fsspecs(tmp_path, suffix):
    data = "ranks ✓\n".encode() * 1000
    good = tmp_path / f"good{suffix}"
    good.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    truncated = tmp_path / f"truncated{suffix}"
    truncated.write_bytes(good.read_bytes()[:-20])
    garbage = tmp_path / f"garbage{suffix}"
    garbage.write_bytes(b"not gzip at all")
    folder = tmp_path / f"folder{suffix}"
    folder.mkdir()
    for path, max_bytes in [
        (good, None),
        (good, len(data)),
        (good, len(data) - 1),  # over the cap: refused
        (truncated, None),
        (garbage, None),
        (folder, None),
        (tmp_path / f"missing{suffix}", None),
    ]:
        expect = _outcome(f"file://{path}", max_bytes)
        assert _outcome(str(path), max_bytes) == expect, (path.name, max_bytes)
    assert read_bytes(str(good)) == data


def test_plain_local_reads_import_no_fsspec(tmp_path):
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "b.tiktoken.gz").write_bytes(gzip.compress(b"YQ== 0\n"))
    script = f"""
import sys
from pipeline_lib.fsio import read_bytes
assert read_bytes({str(tmp_path / "a.json")!r}) == b"{{}}"
assert read_bytes({str(tmp_path / "b.tiktoken.gz")!r}) == b"YQ== 0\\n"
assert "fsspec" not in sys.modules
read_bytes({"file://" + str(tmp_path / "a.json")!r})  # a URL goes through fsspec
assert "fsspec" in sys.modules
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
