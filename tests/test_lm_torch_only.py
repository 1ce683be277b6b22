"""The model and the trainer need torch, numpy and safetensors only: a stock PyTorch image
(no pydantic, no Prefect, no pyarrow, no compiled tokenizer core) builds, trains, samples
and plans. Each check runs in a subprocess whose imports of those packages fail."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline_lib.lm.testing import write_byte_token_dir

BLOCKED = ("pydantic", "pydantic_core", "prefect", "pyarrow", "pandas", "matplotlib", "pipeline_lib._core")

BLOCKER = f"""
import sys

BLOCKED = {BLOCKED!r}


def _blocked(name):
    return any(name == b or name.startswith(b + ".") for b in BLOCKED)


class _AsIfNotInstalled:
    # Wraps an import finder: the blocked packages are not found (as if not installed), so
    # `import pydantic` raises ModuleNotFoundError and `importlib.util.find_spec` gives None.

    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if _blocked(name):
            return None
        return self.finder.find_spec(name, path, target)

    def __getattr__(self, attr):
        return getattr(self.finder, attr)


sys.meta_path[:] = [_AsIfNotInstalled(f) if hasattr(f, "find_spec") else f for f in sys.meta_path]
"""


@pytest.fixture
def blocked_env(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]))
    return env


def run(args, env):
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300)


def test_the_blocker_blocks(blocked_env):
    r = run(["-c", "import pydantic"], blocked_env)
    assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr


def test_model_builds_and_trains_without_pydantic_prefect_or_pyarrow(blocked_env, tmp_path):
    data = write_byte_token_dir(tmp_path / "tokens", b"To be, or not to be, that is the question.\n" * 400, n_shards=2)
    code = f"""
import sys
from pipeline_lib.lm.config import preset
from pipeline_lib.lm.model import GPT
from pipeline_lib.lm.trainer import train
cfg = preset("tiny", device="cpu", max_steps=3, eval_iters=1, eval_interval=2, log_interval=1)
result = train(cfg, {str(data)!r}, {str(tmp_path / "run")!r}, log=lambda m: None)
GPT(cfg.model.with_vocab(300))
bad = sorted(m for m in sys.modules if m.split(".")[0] in {BLOCKED!r} or m == "pipeline_lib._core")
print(result.steps, result.final_train_loss is not None, bad)
"""
    r = run(["-c", code], blocked_env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["3", "True", "[]"]


def test_the_lm_cli_trains_samples_and_plans_without_them(blocked_env, tmp_path):
    data = write_byte_token_dir(tmp_path / "tokens", b"All the world's a stage.\n" * 400, n_shards=1)
    out = tmp_path / "run"
    r = run(
        [
            "-m",
            "pipeline_lib.lm",
            "train",
            "--data",
            str(data),
            "--out",
            str(out),
            "--preset",
            "tiny",
            "--steps",
            "2",
            "--device",
            "cpu",
            "--no-report",
        ],
        blocked_env,
    )
    assert r.returncode == 0, r.stderr
    assert (Path(out) / "ckpt_000002").is_dir()
    r = run(
        [
            "-m",
            "pipeline_lib.lm",
            "sample",
            "--ckpt",
            str(out),
            "--prompt-ids",
            "65,66",
            "--max-new-tokens",
            "5",
            "--device",
            "cpu",
            "--seed",
            "0",
        ],
        blocked_env,
    )
    assert r.returncode == 0, r.stderr
    r = run(
        ["-m", "pipeline_lib.lm", "plan", "--preset", "tiny", "--device", "cpu", "--vocab-size", "300"], blocked_env
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    json.dumps(r.stdout)  # printable text
