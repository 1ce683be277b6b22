"""One command for a GPU machine: the LM's CUDA test tier, then GPT-2 124M at two
micro-batch sizes, each in a fresh process, printing tokens/s, MFU (against the card's
datasheet peak and against the matmul rate measured at start), peak memory, process
start -> first step, and the last checkpoint's time (the training thread's copy and the
background write).

    python benchmarks/gpu_check.py                       # on the GPU machine (~5 min)
    python benchmarks/gpu_check.py --wheels wheels/      # first install what is missing from there
    python benchmarks/gpu_check.py --device cpu --tiny   # the dry path: the same steps on the CPU, tiny model

Needs torch (with CUDA), numpy, safetensors and, for the test tier, pytest; nothing else of
the project's dependencies (no pydantic, Prefect or pyarrow; the tier runs with
``--noconftest``). A bare image without numpy, safetensors or pytest gets them from a
directory of wheels (``pip download numpy safetensors pytest -d wheels/`` on a machine with
a network): ``--wheels DIR`` installs them with ``pip --no-index``.

The tokens are random (GPT-2's 50,257 ids, uniform): throughput and memory do not depend
on what the ids are.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NEEDED = ("numpy", "safetensors")


def _missing(names: tuple[str, ...]) -> list[str]:
    return [n for n in names if importlib.util.find_spec(n) is None]


def _install(wheels: str | None, names: list[str]) -> None:
    if not names:
        return
    if wheels is None:
        sys.exit(
            f"gpu_check: error: missing {', '.join(names)}: bring them as wheels (pip download {' '.join(names)} "
            "-d wheels/) and pass --wheels wheels/"
        )
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links", wheels, *names], check=True)


def _token_dir(path: Path, n_tokens: int, vocab: int) -> Path:
    import numpy as np

    sys.path.insert(0, str(ROOT))
    from pipeline_lib.lm.testing import write_token_dir

    rng = np.random.default_rng(0)
    doc = 4096
    docs = [rng.integers(0, vocab - 1, size=doc).astype(np.uint16) for _ in range(n_tokens // doc)]
    half = len(docs) // 2
    return write_token_dir(
        path, [docs[:half], docs[half:]], vocab_size=vocab, separator_id=vocab - 1, val_fraction=0.05
    )


def one_run(args: argparse.Namespace) -> None:
    """In a fresh process: train, then print one JSON line of figures."""
    t_process = float(args.t_launch)
    sys.path.insert(0, str(ROOT))
    import torch

    from pipeline_lib.lm.config import preset
    from pipeline_lib.lm.trainer import train

    first_step: list[float] = []
    overrides = dict(
        device=args.device,
        max_steps=args.steps,
        eval_interval=10**9,
        eval_iters=1,
        log_interval=5,
        ckpt_interval=args.steps,
        ckpt_every_s=0,
    )
    if args.tiny:
        cfg = preset("tiny", batch_size=args.micro_batch, grad_accum_steps=max(1, 16 // args.micro_batch), **overrides)
    else:
        cfg = preset(
            "gpt2-124m",
            batch_size=args.micro_batch,
            total_batch_tokens=args.micro_batch * 1024 * max(1, 64 // args.micro_batch),
            **overrides,
        )
        cfg = cfg.replace(
            fit_micro_batch=False, compile_mode=args.compile_mode, warmup_steps=min(cfg.warmup_steps, args.steps // 2)
        )
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    r = train(
        cfg,
        args.data,
        tempfile.mkdtemp(prefix="gpu-check-"),
        log=lambda m: None,
        on_step=lambda e: first_step.append(time.time()) if not first_step else None,
    )
    print(
        json.dumps(
            {
                "micro_batch": args.micro_batch,
                "tokens_per_step": cfg.tokens_per_step,
                "tokens_per_s": r.tokens_per_s,
                "mfu_datasheet": r.mfu,
                "mfu_measured": r.mfu_measured,
                "peak_memory_gib": torch.cuda.max_memory_allocated() / (1 << 30)
                if args.device.startswith("cuda")
                else None,
                "start_to_first_step_s": first_step[0] - t_process if first_step else None,
                "ckpt_copy_s": r.ckpt_copy_s,
                "ckpt_write_s": r.ckpt_write_s,
                "device": r.device,
                "card": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
                "steps": r.steps,
            }
        )
    )


def _fmt(v: object, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="the tiny preset instead of GPT-2 124M (the CPU dry path)")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps per run (default 30)")
    p.add_argument(
        "--micro-batches", type=int, nargs=2, default=None, help="the two micro-batch sizes (default 16 32; tiny: 4 8)"
    )
    p.add_argument("--compile-mode", default="default", help="TrainConfig.compile_mode for the GPT-2 runs")
    p.add_argument("--wheels", help="a directory of wheels for what the image lacks (numpy, safetensors, pytest)")
    p.add_argument("--skip-tests", action="store_true", help="skip the CUDA test tier")
    p.add_argument("--one-run", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--micro-batch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--t-launch", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one_run:
        one_run(args)
        return 0

    _install(args.wheels, _missing(NEEDED) + ([] if args.skip_tests else _missing(("pytest",))))
    import torch

    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        sys.exit(
            f"gpu_check: error: --device {args.device} but torch {torch.__version__} sees no CUDA device; use "
            "--device cpu --tiny for the dry path"
        )
    print(
        f"gpu_check {time.strftime('%Y-%m-%d %H:%M:%S %Z')} | torch {torch.__version__} | "
        f"{torch.cuda.get_device_name() if cuda else 'cpu'}",
        flush=True,
    )
    env = dict(
        os.environ,
        TOKENMILL_TEST_DEVICE=args.device,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    rc = 0
    if not args.skip_tests:
        t0 = time.monotonic()
        tier = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "--noconftest",
                "-p",
                "no:cacheprovider",
                "-q",
                "-rs",
                "-m",
                "cuda",
                str(ROOT / "tests" / "test_lm_cuda.py"),
            ],
            env=env,
            cwd=ROOT,
        )
        print(f"CUDA tier: exit {tier.returncode} in {time.monotonic() - t0:.0f} s", flush=True)
        rc = tier.returncode if tier.returncode not in (0, 5) else 0
    small = (4, 8) if args.tiny else (16, 32)
    sizes = args.micro_batches or list(small)
    with tempfile.TemporaryDirectory(prefix="gpu-check-tokens-") as tmp:
        vocab = 512 if args.tiny else 50257
        data = _token_dir(Path(tmp) / "tokens", 200_000 if args.tiny else 20_000_000, vocab)
        rows = []
        for mb in sizes:
            cmd = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--one-run",
                "--device",
                args.device,
                "--data",
                str(data),
                "--micro-batch",
                str(mb),
            ]
            cmd += [
                "--steps",
                str(args.steps),
                "--compile-mode",
                args.compile_mode,
                "--t-launch",
                repr(time.time()),
            ] + (["--tiny"] if args.tiny else [])
            out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
            if out.returncode != 0:
                print(out.stderr[-4000:], file=sys.stderr)
                return out.returncode
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    name = "tiny" if args.tiny else "GPT-2 124M, seq 1024"
    print(f"\n{name} on {rows[0]['card']}, {args.steps} steps per run, compile mode {args.compile_mode}")
    print(
        f"{'micro-batch':>11} {'tokens/step':>11} {'tokens/s':>11} {'MFU sheet':>9} {'MFU meas.':>9} {'peak GiB':>8} "
        f"{'start->1st':>10} {'ckpt copy':>9} {'ckpt write':>10}"
    )
    for r in rows:
        print(
            f"{r['micro_batch']:>11} {r['tokens_per_step']:>11,} {_fmt(r['tokens_per_s'], ',.0f'):>11} "
            f"{_fmt(r['mfu_datasheet'], '.1%'):>9} "
            f"{_fmt(r['mfu_measured'], '.1%'):>9} {_fmt(r['peak_memory_gib'], '.2f'):>8} "
            f"{_fmt(r['start_to_first_step_s'], '.1f'):>9}s "
            f"{_fmt(r['ckpt_copy_s'], '.2f'):>8}s {_fmt(r['ckpt_write_s'], '.2f'):>9}s"
        )
    return rc


if __name__ == "__main__":
    sys.exit(main())
