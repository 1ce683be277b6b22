"""Command line: ``python -m pipeline_lib.lm {train,sample,plan} ...``.

    python -m pipeline_lib.lm train --data TOKENS_DIR --out RUN_DIR [--preset small] [--steps N]
        [--device auto|cpu|cuda|mps] [--resume] [--tokenizer TOK_DIR] ...
    torchrun --nproc_per_node 8 -m pipeline_lib.lm train --preset gpt2-124m --data ... --out ...
    python -m pipeline_lib.lm sample --ckpt RUN_DIR --tokenizer TOK_DIR --prompt "ROMEO:" \\
        --temperature 0.8 --top-k 50
    python -m pipeline_lib.lm plan --preset gpt2-124m --device cuda [--world-size 8]

`plan` prints the memory plan of a run (parameters, gradients, optimizer state,
activations per micro-batch, total) and its tokens per step, allocating nothing.

`train` writes checkpoints, ``loss.png`` and ``metrics.json`` into --out. `sample` loads the
latest complete checkpoint of --ckpt (or that checkpoint directory) and prints the prompt
and its continuation; without --tokenizer give --prompt-ids and get ids back.

--ckpt is a local path: a checkpoint directory is checked against its own
``checkpoint.json``; a bare ``model.safetensors`` is loaded unchecked. To sample a model
published in a store (checked against its version manifest) use ``tokenmill lm sample``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

# CLI flag -> config field (TrainConfig, or the model config: GPTConfig or MLPConfig).
_OVERRIDES = {
    "steps": "max_steps",
    "time_budget_s": "time_budget_s",
    "batch_size": "batch_size",
    "grad_accum": "grad_accum_steps",
    "lr": "learning_rate",
    "min_lr": "min_lr",
    "warmup": "warmup_steps",
    "weight_decay": "weight_decay",
    "eval_interval": "eval_interval",
    "eval_iters": "eval_iters",
    "log_interval": "log_interval",
    "ckpt_interval": "ckpt_interval",
    "ckpt_every_s": "ckpt_every_s",
    "keep_last": "keep_last",
    "val_fraction": "val_fraction",
    "seed": "seed",
    "device": "device",
    "dtype": "dtype",
    "block_size": "block_size",
    "n_layer": "n_layer",
    "n_head": "n_head",
    "n_embd": "n_embd",
    "n_hidden": "n_hidden",
    "dropout": "dropout",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pipeline_lib.lm", description="tokenmill language model (a GPT, or the tutorial's MLP)"
    )
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("train", help="train (or resume) a GPT on a token-shard directory")
    t.add_argument("--data", required=True, help="token directory (manifest.json + shard_*.npy)")
    t.add_argument("--out", required=True, help="run directory for checkpoints and reports")
    t.add_argument(
        "--preset",
        default="small",
        help="tiny | small | gpt2-124m | mlp (the first BPE tutorial's MLP) (default small)",
    )
    t.add_argument("--steps", type=int, help="max optimizer steps")
    t.add_argument(
        "--time-budget-s",
        type=float,
        help="seconds for the run: the step count (at most --steps) is planned after a few measured steps",
    )
    t.add_argument("--device", help="auto | cpu | cuda | cuda:N | mps")
    t.add_argument("--dtype", choices=["auto", "float32", "bfloat16"])
    t.add_argument("--resume", action="store_true", help="continue from the latest complete checkpoint")
    t.add_argument("--compile", dest="compile", action="store_true", default=None, help="torch.compile")
    t.add_argument("--no-compile", dest="compile", action="store_false")
    t.add_argument("--batch-size", type=int)
    t.add_argument("--grad-accum", type=int)
    t.add_argument("--lr", type=float)
    t.add_argument("--min-lr", type=float)
    t.add_argument("--warmup", type=int)
    t.add_argument("--weight-decay", type=float)
    t.add_argument("--eval-interval", type=int)
    t.add_argument("--eval-iters", type=int)
    t.add_argument("--log-interval", type=int)
    t.add_argument("--ckpt-interval", type=int, help="checkpoint every N steps (0: a tenth of the run)")
    t.add_argument("--ckpt-every-s", type=float, help="also checkpoint every this many seconds (0: off)")
    t.add_argument("--keep-last", type=int)
    t.add_argument("--val-fraction", type=float)
    t.add_argument("--seed", type=int)
    t.add_argument("--block-size", type=int)
    t.add_argument("--n-layer", type=int)
    t.add_argument("--n-head", type=int)
    t.add_argument("--n-embd", type=int)
    t.add_argument("--n-hidden", type=int, help="tanh units of the mlp preset's hidden layer")
    t.add_argument("--dropout", type=float)
    bpb = t.add_mutually_exclusive_group()
    bpb.add_argument("--tokenizer", help="tokenizer dir/URL: exact bits/byte from its token byte lengths")
    bpb.add_argument("--token-byte-lengths", help=".npy of per-token UTF-8 byte lengths")
    t.add_argument("--no-report", action="store_true", help="skip loss.png / metrics.json")

    pl = sub.add_parser("plan", help="print the memory plan and batch arithmetic of a run, without allocating")
    pl.add_argument("--preset", default="gpt2-124m", help="tiny | small | gpt2-124m (default gpt2-124m)")
    pl.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    pl.add_argument("--vocab-size", type=int, default=50257, help="ids of the token set (default GPT-2's 50257)")
    pl.add_argument("--world-size", type=int, default=1, help="DDP ranks")
    pl.add_argument("--no-bf16", action="store_true", help="a GPU without bfloat16: float16 autocast with a GradScaler")
    pl.add_argument("--batch-size", type=int)
    pl.add_argument("--grad-accum", type=int)
    pl.add_argument("--block-size", type=int)
    pl.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"])

    s = sub.add_parser("sample", help="generate text from a checkpoint")
    s.add_argument("--ckpt", required=True, help="run directory (latest checkpoint) or a ckpt_* directory")
    s.add_argument("--tokenizer", help="tokenizer dir/URL (pipeline_lib.Tokenizer.load)")
    s.add_argument("--prompt", default="", help="prompt text (empty: start from the separator)")
    s.add_argument("--prompt-ids", help="comma-separated prompt ids instead of text (no tokenizer needed)")
    s.add_argument("--max-new-tokens", type=int, default=200)
    s.add_argument("--temperature", type=float, default=0.8)
    s.add_argument("--top-k", type=int, default=200, help="0: no top-k filter")
    s.add_argument("--seed", type=int, default=None)
    s.add_argument("--device", default="auto", help="auto (CUDA, else MPS, else CPU) | cpu | cuda | cuda:N | mps")
    return p


def _load_tokenizer(path: str):  # noqa: ANN202 - imported lazily: only text I/O needs it
    try:
        from pipeline_lib import Tokenizer
    except ImportError:
        from pipeline_lib.tokenizer import Tokenizer
    return Tokenizer.load(path)


def _cmd_train(args: argparse.Namespace) -> int:
    from pipeline_lib.lm.config import preset
    from pipeline_lib.lm.report import write_loss_plot, write_metrics
    from pipeline_lib.lm.trainer import train

    overrides = {field: getattr(args, flag) for flag, field in _OVERRIDES.items() if getattr(args, flag) is not None}
    if args.compile is not None:
        overrides["compile"] = args.compile
    cfg = preset(args.preset, **overrides)
    lengths = None
    if args.token_byte_lengths:
        lengths = np.load(args.token_byte_lengths, allow_pickle=False)
    elif args.tokenizer:
        lengths = _load_tokenizer(args.tokenizer).token_byte_lengths()
    result = train(cfg, args.data, args.out, token_byte_lengths=lengths, resume=args.resume)
    if int(os.environ.get("RANK", "0")) == 0:
        if not args.no_report:
            png = write_loss_plot(
                result.history,
                Path(args.out) / "loss.png",
                title=f"{'MLP' if args.preset == 'mlp' else 'GPT'} ({args.preset})",
            )
            mpath = write_metrics(result, Path(args.out) / "metrics.json")
            print(f"wrote {png} and {mpath}")
        summary = {
            k: getattr(result, k)
            for k in ("final_train_loss", "final_val_loss", "val_bpb", "steps", "tokens_per_s", "checkpoint_dir")
        }
        print(json.dumps(summary))
    return 0


def _cmd_sample(args: argparse.Namespace) -> int:
    from pipeline_lib.lm.checkpoint import latest_checkpoint, load_model, open_checkpoint
    from pipeline_lib.lm.sampling import documents_text, sample
    from pipeline_lib.lm.trainer import resolve_device

    model = load_model(args.ckpt, device=resolve_device(args.device))
    tok = None
    if args.tokenizer:
        tok = _load_tokenizer(args.tokenizer)
    if args.prompt_ids:
        ids = [int(x) for x in args.prompt_ids.split(",") if x.strip()]
    elif args.prompt:
        if tok is None:
            raise SystemExit("--prompt needs --tokenizer (or give --prompt-ids)")
        ids = [int(i) for i in tok.encode(args.prompt, allowed_special="all")]
    sep = None  # the separator recorded with the checkpoint, if it is a checkpoint directory
    ckpt_dir = Path(args.ckpt)
    if ckpt_dir.is_dir() and not (ckpt_dir / "checkpoint.json").exists():
        ckpt_dir = latest_checkpoint(ckpt_dir) or ckpt_dir
    if (ckpt_dir / "checkpoint.json").exists():
        sep = open_checkpoint(ckpt_dir, verify=False).json("trainer_state.json").get("data", {}).get("separator_id")
    fresh = not args.prompt_ids and not args.prompt
    if fresh:  # start a fresh document from the separator
        if sep is None:
            raise SystemExit("empty prompt and the training data had no separator: give --prompt")
        ids = [int(sep)]
    top_k = args.top_k if args.top_k and args.top_k > 0 else None
    new = sample(model, ids, args.max_new_tokens, temperature=args.temperature, top_k=top_k, seed=args.seed)
    if tok is None:
        print(",".join(str(i) for i in ids + new))
    else:  # documents on their own lines: the separator is not printed
        sys.stdout.write(documents_text(tok, (ids + new)[1 if fresh else 0 :], sep) + "\n")
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from pipeline_lib.lm.config import preset
    from pipeline_lib.lm.plan import memory_plan

    flags = {"batch_size": "batch_size", "grad_accum": "grad_accum_steps", "block_size": "block_size", "dtype": "dtype"}
    overrides = {field: getattr(args, flag) for flag, field in flags.items() if getattr(args, flag) is not None}
    cfg = preset(args.preset, **overrides)
    plan = memory_plan(cfg, args.vocab_size, args.device, args.world_size, bf16=not args.no_bf16)
    print(f"preset {args.preset}, vocabulary {args.vocab_size:,}")
    print("\n".join(plan.lines()))
    return 0


def _with_flag(msg: str) -> str:
    """The message of a config error, with the flag that sets the field it names."""
    for flag, field in _OVERRIDES.items():
        if f"Config.{field} " in msg:
            return f"{msg} (set with --{flag.replace('_', '-')})"
    return msg


def main(argv: list[str] | None = None) -> int:
    """The pipeline's error style: a bad input is one ``error:`` line naming it (and the
    flag that fixes it), exit 2; a run that fails (a damaged checkpoint or shard, a disk
    error) one line, exit 1. No traceback either way."""
    from pipeline_lib.errors import InputError, TokenmillError

    args = _parser().parse_args(argv)
    commands = {"train": _cmd_train, "plan": _cmd_plan, "sample": _cmd_sample}
    try:
        return commands[args.cmd](args)
    except (InputError, ValueError) as e:
        print(f"python -m pipeline_lib.lm {args.cmd}: error: {_with_flag(str(e))}", file=sys.stderr)
        return 2
    except (TokenmillError, OSError) as e:
        print(f"python -m pipeline_lib.lm {args.cmd}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
