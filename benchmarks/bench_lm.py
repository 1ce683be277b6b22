"""Training throughput of the GPT (tokens/s through `pipeline_lib.lm.trainer`, all of it:
sampling windows from memory-mapped shards, forward, backward, AdamW).

    python benchmarks/bench_lm.py                 # CPU: the "small" preset on tiny Shakespeare bytes,
                                                  # 1 thread and torch's default thread count
    python benchmarks/bench_lm.py --steps 50 --threads 1 2
    python benchmarks/bench_lm.py --cuda-only     # with a GPU: GPT-2 124M, bf16, tokens/s and MFU

The first optimizer step (allocation, compilation) is not timed. On CUDA the 124M model
runs on random token ids (vocab 50257) with batch 16 x 1024, and its row gives the peak
GPU memory beside the memory plan's figure for the same run (`pipeline_lib.lm.plan`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline_lib.lm import preset, train  # noqa: E402
from pipeline_lib.lm.plan import GIB, memory_plan  # noqa: E402

lm_sample = importlib.import_module("pipeline_lib.lm.sampling")  # the module, not the package's `sample` function
from pipeline_lib.lm.testing import write_byte_token_dir, write_token_dir  # noqa: E402


def bench(cfg, data_dir: Path, label: str) -> dict:
    cuda = torch.cuda.is_available() and cfg.device != "cpu"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        r = train(cfg, data_dir, out, log=lambda _m: None)
        wall = time.perf_counter() - t0
    row = {
        "config": label,
        "device": r.device,
        "threads": torch.get_num_threads(),
        "params_M": round(r.n_params / 1e6, 2),
        "tokens_per_step": cfg.tokens_per_step,
        "steps": cfg.max_steps,
        "tokens_per_s": round(r.tokens_per_s or 0.0, 1),
        "mfu": None if r.mfu is None else round(r.mfu, 4),
        "final_train_loss": round(r.final_train_loss, 4),
        "wall_s": round(wall, 2),
    }
    if cuda:
        row["peak_mem_GiB"] = round(torch.cuda.max_memory_allocated() / GIB, 2)
        row["plan_GiB"] = round(
            memory_plan(cfg, 50257, "cuda", bf16=torch.cuda.is_bf16_supported()).total_bytes / GIB, 2
        )
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, nargs="*", default=[], help="CPU thread counts to try")
    ap.add_argument("--cuda-only", action="store_true")
    ap.add_argument("--compile", action="store_true", help="torch.compile on CUDA")
    ap.add_argument("--cuda-steps", type=int, default=20)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if not args.cuda_only:
            data = write_byte_token_dir(tmp / "bytes", (ROOT / "pipeline_lib/data/tinyshakespeare.txt").read_bytes())
            # fixed small config: the "small" preset (4 x 128, block 128, batch 16), no eval
            cfg = preset(
                "small", max_steps=args.steps, device="cpu", val_fraction=0.0, ckpt_interval=10**6, log_interval=10**6
            )
            default = torch.get_num_threads()
            # Training puts a small CPU model on one thread (lm.sampling.one_thread_for); lift that
            # rule here so each row runs on the thread count it names.
            lm_sample.ONE_THREAD_BELOW = 0
            for n in args.threads or sorted({1, default}):
                torch.set_num_threads(n)
                rows.append(bench(cfg, data, "small (cpu)"))
        if torch.cuda.is_available():
            rng = np.random.default_rng(0)
            docs = [[rng.integers(0, 50256, size=1_000_000)] for _ in range(2)]
            data = write_token_dir(tmp / "gpt2", docs, vocab_size=50257, separator_id=50256)
            cfg = preset(
                "gpt2-124m",
                max_steps=args.cuda_steps,
                grad_accum_steps=1,
                val_fraction=0.0,
                ckpt_interval=10**6,
                log_interval=10**6,
                compile=args.compile,
                warmup_steps=5,
            )
            rows.append(bench(cfg, data, f"gpt2-124m (cuda{', compiled' if args.compile else ''})"))
        elif args.cuda_only:
            print("no CUDA device", file=sys.stderr)
    print("\nconfig                      device   threads  tokens/s      MFU  peak GiB (plan)")
    for r in rows:
        mfu = "-" if r["mfu"] is None else f"{r['mfu']:.1%}"
        mem = f"{r['peak_mem_GiB']:.2f} ({r['plan_GiB']:.2f})" if "peak_mem_GiB" in r else "-"
        print(f"{r['config']:<27} {r['device']:<8} {r['threads']:>7}  {r['tokens_per_s']:>10,.0f}  {mfu:>7}  {mem}")


if __name__ == "__main__":
    main()
