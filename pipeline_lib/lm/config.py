"""Configuration of the language model (a GPT, or the MLP of Bengio et al.) and of its
training run.

All are frozen dataclasses, validated on creation, and round-trip through plain
dicts (`to_dict` / `from_dict`) so they can live in JSON next to a checkpoint.

`preset(name, **overrides)` gives a complete `TrainConfig`:

* ``tiny``      — a toy model for tests and smoke runs (trains in seconds on a CPU).
* ``small``     — the CPU default: trains on tiny Shakespeare in a couple of minutes
  on 2 cores.
* ``gpt2-124m`` — the GPT-2 small architecture with an llm.c-style schedule for one GPU.
* ``mlp``       — not a GPT: the MLP language model of the first BPE tutorial (32 tokens of
  context, 64-wide embeddings, 512 tanh units), with its optimizer and batch.

`vocab_size` is normally left as None: `train` takes it from the token manifest.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int | None = None  # None: taken from the token manifest when training
    block_size: int = 256  # context length in tokens
    n_layer: int = 6  # transformer blocks
    n_head: int = 6  # attention heads per block; must divide n_embd
    n_embd: int = 384  # residual stream width
    dropout: float = 0.0  # on embeddings, attention probabilities and residual branches
    bias: bool = False  # biases in Linear and LayerNorm (GPT-2 had them; a bit faster without)
    # The embedding / output table has vocab_size rounded up to a multiple of this (nanoGPT's
    # 50257 -> 50304, llm.c's Vp): the output matmul's width suits the GPU's tiles. The padded
    # ids are never inputs, their logits are cut off before the loss and sampling.
    pad_vocab_to: int = 64

    def __post_init__(self) -> None:
        _check(
            self.vocab_size is None or (_is_int(self.vocab_size) and self.vocab_size >= 2),
            f"GPTConfig.vocab_size must be None or an int >= 2, got {self.vocab_size!r}",
        )
        for name in ("block_size", "n_layer", "n_head", "n_embd", "pad_vocab_to"):
            v = getattr(self, name)
            _check(_is_int(v) and v >= 1, f"GPTConfig.{name} must be a positive int, got {v!r}")
        _check(
            self.n_embd % self.n_head == 0,
            f"GPTConfig.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})",
        )
        _check(
            isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0,
            f"GPTConfig.dropout must be in [0, 1), got {self.dropout!r}",
        )
        _check(isinstance(self.bias, bool), f"GPTConfig.bias must be a bool, got {self.bias!r}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the embedding / output table: vocab_size rounded up to pad_vocab_to."""
        if self.vocab_size is None:
            raise ValueError("GPTConfig.vocab_size is None: set it (train() takes it from the manifest)")
        return -(-self.vocab_size // self.pad_vocab_to) * self.pad_vocab_to

    def with_vocab(self, vocab_size: int) -> GPTConfig:
        return dataclasses.replace(self, vocab_size=vocab_size)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GPTConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        _check(not unknown, f"unknown GPTConfig fields: {sorted(unknown)}")
        # Weights written before the table was padded hold exactly vocab_size rows.
        return cls(**{"pad_vocab_to": 1, **d})


@dataclass(frozen=True)
class MLPConfig:
    """Bengio et al. (2003)'s language model: the embeddings of the last block_size tokens,
    concatenated, through one tanh hidden layer to the logits (`pipeline_lib.lm.mlp`)."""

    vocab_size: int | None = None  # None: taken from the token manifest when training
    block_size: int = 32  # context: the tokens each prediction reads
    n_embd: int = 64  # embedding width of one token
    n_hidden: int = 512  # tanh units

    # A model config's dict names its architecture; a GPT's has no "arch" key (its dicts,
    # and the version ids hashed from them, predate this one).
    ARCH: ClassVar[str] = "mlp"

    def __post_init__(self) -> None:
        _check(
            self.vocab_size is None or (_is_int(self.vocab_size) and self.vocab_size >= 2),
            f"MLPConfig.vocab_size must be None or an int >= 2, got {self.vocab_size!r}",
        )
        for name in ("block_size", "n_embd", "n_hidden"):
            v = getattr(self, name)
            _check(_is_int(v) and v >= 1, f"MLPConfig.{name} must be a positive int, got {v!r}")

    def with_vocab(self, vocab_size: int) -> MLPConfig:
        return dataclasses.replace(self, vocab_size=vocab_size)

    def to_dict(self) -> dict[str, Any]:
        return {"arch": self.ARCH, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MLPConfig:
        d = {k: v for k, v in d.items() if k != "arch"}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        _check(not unknown, f"unknown MLPConfig fields: {sorted(unknown)}")
        return cls(**d)


ModelConfig = GPTConfig | MLPConfig
MODEL_CONFIGS: dict[str, type[GPTConfig] | type[MLPConfig]] = {"gpt": GPTConfig, MLPConfig.ARCH: MLPConfig}


def model_config_from_dict(d: dict[str, Any]) -> ModelConfig:
    """A model config from its `to_dict`: an MLP's carries ``"arch": "mlp"``, a GPT's no arch."""
    arch = d.get("arch", "gpt")
    _check(arch in MODEL_CONFIGS, f"unknown model arch {arch!r}; choose one of {sorted(MODEL_CONFIGS)}")
    return MODEL_CONFIGS[arch].from_dict(d)


def arch_of(config: ModelConfig) -> str:
    return "gpt" if isinstance(config, GPTConfig) else config.ARCH


DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "bfloat16", "float16")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig = field(default_factory=GPTConfig)  # architecture
    # -- batch: tokens per optimizer step = batch_size * block_size * grad_accum_steps, whatever
    # the world size: under DDP each of the N ranks runs grad_accum_steps / N micro-steps.
    batch_size: int = 12  # micro-batch of windows per rank
    grad_accum_steps: int = 1  # micro-steps per optimizer step, all ranks together (loss is divided by it)
    # None, or the tokens of one optimizer step (nanoGPT's / llm.c's total batch size):
    # grad_accum_steps is then derived, total_batch_tokens / (batch_size * block_size).
    total_batch_tokens: int | None = None
    # -- schedule: linear warmup to learning_rate, cosine decay to min_lr at lr_decay_steps
    max_steps: int = 2000  # optimizer steps in the whole run
    learning_rate: float = 1e-3  # peak learning rate
    min_lr: float = 1e-4  # floor of the cosine decay
    warmup_steps: int = 100  # linear warmup steps
    lr_decay_steps: int | None = None  # None: decay over max_steps
    # -- time budget: None, or seconds for the whole `train` call. After a few calibration
    # steps the run is re-planned to the step count that fits (at most max_steps) and the
    # schedule is stretched over it, so it completes; see `plan_steps` in train.py.
    time_budget_s: float | None = None
    # -- AdamW
    weight_decay: float = 0.1  # applied to >= 2-D parameters only
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    # -- data
    # None: the split the token manifest records (decided at encoding, the one every export
    # uses; 0.1 by the same rule for a manifest that records none). A number must equal it.
    val_fraction: float | None = None
    seed: int = 1337  # model init, dropout and data sampling (offset per DDP rank)
    # -- evaluation, logging, checkpoints (intervals in optimizer steps)
    eval_interval: int = 250  # also evaluated at step 0 and at the last step
    eval_iters: int = 20  # val micro-batches per evaluation (all ranks together)
    log_interval: int = 10  # history/log entry every this many steps
    # Checkpoints protect the work whatever the run length: on a step cadence, on a time
    # cadence, and at the last step. Saving consumes no randomness, so the cadence never
    # changes what is computed (which is why these three are not part of a model version).
    ckpt_interval: int = 0  # every this many steps; 0: every max(1, max_steps // 10) steps
    ckpt_every_s: float = 60.0  # also when this many seconds passed since the last one; 0: off
    keep_last: int = 2  # complete checkpoints kept in out_dir (oldest removed first)
    resume: bool = False  # continue from the latest valid checkpoint in out_dir
    # -- hardware
    device: str = "auto"  # auto: cuda, else mps, else cpu; or "cuda:1" etc.
    dtype: str = "auto"  # autocast dtype; auto: bfloat16 on cuda (float16 + GradScaler without bf16), float32 elsewhere
    compile: bool = False  # torch.compile the model (training only: evaluation runs it uncompiled)
    # torch.compile's mode: default, reduce-overhead (CUDA graphs), max-autotune, max-autotune-no-cudagraphs
    compile_mode: str = "default"
    # On a GPU: the micro-batch (windows per forward pass) is the largest that the memory plan
    # fits in the free memory, the tokens per optimizer step unchanged (batch_size elsewhere).
    fit_micro_batch: bool = False
    peak_flops: float | None = None  # per-device peak FLOP/s for MFU; None: look up the GPU
    verify_shards: bool = True  # sha256 every shard file against its manifest at start (False: sizes only)

    # Fields that change how a run goes (speed, checkpoints, checks) but not what it
    # computes: left out of a model version's id and of its published files.
    RUN_ONLY_FIELDS: ClassVar[tuple[str, ...]] = (
        "device",
        "resume",
        "verify_shards",
        "compile",
        "compile_mode",
        "fit_micro_batch",
        "peak_flops",
        "ckpt_interval",
        "ckpt_every_s",
        "keep_last",
    )

    def __post_init__(self) -> None:
        if isinstance(self.model, dict):  # convenience: accept a plain dict
            object.__setattr__(self, "model", model_config_from_dict(self.model))
        _check(isinstance(self.model, (GPTConfig, MLPConfig)), "TrainConfig.model must be a GPTConfig or an MLPConfig")
        for name in ("batch_size", "grad_accum_steps", "max_steps", "eval_iters", "keep_last"):
            v = getattr(self, name)
            _check(_is_int(v) and v >= 1, f"TrainConfig.{name} must be a positive int, got {v!r}")
        for name in ("eval_interval", "log_interval"):
            v = getattr(self, name)
            _check(_is_int(v) and v >= 1, f"TrainConfig.{name} must be a positive int, got {v!r}")
        _check(
            self.total_batch_tokens is None or (_is_int(self.total_batch_tokens) and self.total_batch_tokens >= 1),
            f"TrainConfig.total_batch_tokens must be None or a positive int, got {self.total_batch_tokens!r}",
        )
        if self.total_batch_tokens is not None:
            _check(
                self.grad_accum_steps == 1,
                f"TrainConfig: give total_batch_tokens ({self.total_batch_tokens}) or grad_accum_steps "
                f"({self.grad_accum_steps}), not both",
            )
            per_micro = self.batch_size * self.model.block_size
            _check(
                self.total_batch_tokens % per_micro == 0,
                f"TrainConfig.total_batch_tokens {self.total_batch_tokens} is not a multiple of batch_size * "
                f"block_size = {per_micro}",
            )
        _check(
            _is_int(self.ckpt_interval) and self.ckpt_interval >= 0,
            f"TrainConfig.ckpt_interval must be an int >= 0 (0: derived from max_steps), got {self.ckpt_interval!r}",
        )
        _check(
            isinstance(self.ckpt_every_s, (int, float))
            and not isinstance(self.ckpt_every_s, bool)
            and self.ckpt_every_s >= 0,
            f"TrainConfig.ckpt_every_s must be a number of seconds >= 0 (0: off), got {self.ckpt_every_s!r}",
        )
        _check(
            self.time_budget_s is None
            or (
                isinstance(self.time_budget_s, (int, float))
                and not isinstance(self.time_budget_s, bool)
                and self.time_budget_s > 0
            ),
            f"TrainConfig.time_budget_s must be None or a number of seconds > 0, got {self.time_budget_s!r}",
        )
        _check(
            _is_int(self.warmup_steps) and self.warmup_steps >= 0,
            f"TrainConfig.warmup_steps must be an int >= 0, got {self.warmup_steps!r}",
        )
        _check(
            self.lr_decay_steps is None or (_is_int(self.lr_decay_steps) and self.lr_decay_steps > self.warmup_steps),
            f"TrainConfig.lr_decay_steps must be None or an int > warmup_steps, got {self.lr_decay_steps!r}",
        )
        _check(self.learning_rate > 0, f"TrainConfig.learning_rate must be > 0, got {self.learning_rate!r}")
        _check(
            0 <= self.min_lr <= self.learning_rate,
            f"TrainConfig.min_lr must be in [0, learning_rate], got {self.min_lr!r}",
        )
        _check(self.weight_decay >= 0, f"TrainConfig.weight_decay must be >= 0, got {self.weight_decay!r}")
        _check(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "TrainConfig.beta1/beta2 must be in [0, 1)")
        _check(self.grad_clip >= 0, f"TrainConfig.grad_clip must be >= 0, got {self.grad_clip!r}")
        _check(
            self.val_fraction is None or 0 <= self.val_fraction < 1,
            f"TrainConfig.val_fraction must be None (the manifest's split) or in [0, 1), got {self.val_fraction!r}",
        )
        _check(_is_int(self.seed) and self.seed >= 0, f"TrainConfig.seed must be an int >= 0, got {self.seed!r}")
        dev = self.device.split(":")[0] if isinstance(self.device, str) else None
        _check(
            dev in DEVICES, f"TrainConfig.device must be one of {DEVICES} (optionally 'cuda:N'), got {self.device!r}"
        )
        _check(self.dtype in DTYPES, f"TrainConfig.dtype must be one of {DTYPES}, got {self.dtype!r}")
        _check(isinstance(self.compile, bool), "TrainConfig.compile must be a bool")
        _check(
            self.compile_mode in COMPILE_MODES,
            f"TrainConfig.compile_mode must be one of {COMPILE_MODES}, got {self.compile_mode!r}",
        )
        _check(isinstance(self.fit_micro_batch, bool), "TrainConfig.fit_micro_batch must be a bool")
        _check(
            not (self.fit_micro_batch and isinstance(self.model, MLPConfig)),
            "TrainConfig.fit_micro_batch plans a GPT's memory; the MLP model takes its batch_size as given",
        )
        _check(isinstance(self.resume, bool), "TrainConfig.resume must be a bool")
        _check(
            self.peak_flops is None or self.peak_flops > 0,
            f"TrainConfig.peak_flops must be None or > 0, got {self.peak_flops!r}",
        )

    @property
    def accum_steps(self) -> int:
        """Micro-steps per optimizer step, all ranks together."""
        if self.total_batch_tokens is not None:
            return self.total_batch_tokens // (self.batch_size * self.model.block_size)
        return self.grad_accum_steps

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step (the same under any world size)."""
        return self.batch_size * self.model.block_size * self.accum_steps

    def micro_steps_per_rank(self, world_size: int) -> int:
        """Each rank's share of `accum_steps` under DDP; raises ValueError when it does not divide."""
        _check(
            self.accum_steps % world_size == 0,
            f"{self.accum_steps} micro-steps per optimizer step do not divide among {world_size} ranks: "
            "set grad_accum_steps (or total_batch_tokens) to a multiple of the world size",
        )
        return self.accum_steps // world_size

    @property
    def decay_steps(self) -> int:
        return self.lr_decay_steps if self.lr_decay_steps is not None else self.max_steps

    @property
    def ckpt_steps(self) -> int:
        """The step cadence of checkpoints: ckpt_interval, or a tenth of the run when 0."""
        return self.ckpt_interval or max(1, self.max_steps // 10)

    def versioned_dict(self) -> dict[str, Any]:
        """`to_dict` without RUN_ONLY_FIELDS: what decides the trained weights (a model
        version's params and the train config stored with it)."""
        return {k: v for k, v in self.to_dict().items() if k not in self.RUN_ONLY_FIELDS}

    def replace(self, **overrides: Any) -> TrainConfig:
        """Copy with overrides; the model config's field names (n_layer, dropout, ...) go to `model`."""
        model = overrides.pop("model", self.model)
        model_fields = {f.name for f in dataclasses.fields(model)}
        model_kw = {k: overrides.pop(k) for k in list(overrides) if k in model_fields}
        train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
        other_models = {f.name for c in MODEL_CONFIGS.values() for f in dataclasses.fields(c)} - model_fields
        elsewhere = sorted(set(overrides) & other_models)
        _check(
            not elsewhere,
            f"{', '.join(elsewhere)}: not a setting of the {arch_of(model)} model (its settings: "
            f"{', '.join(sorted(model_fields))})",
        )
        unknown = set(overrides) - train_fields
        _check(not unknown, f"unknown config fields: {sorted(unknown)}")
        model = dataclasses.replace(model, **model_kw)
        if "grad_accum_steps" in overrides:  # an explicit count replaces the preset's total batch
            overrides.setdefault("total_batch_tokens", None)
        return dataclasses.replace(self, model=model, **overrides)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "model": self.model.to_dict()}  # an MLP's names its arch

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        d = dict(d)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        _check(not unknown, f"unknown TrainConfig fields: {sorted(unknown)}")
        if "model" in d:
            d["model"] = model_config_from_dict(d["model"])
        return cls(**d)


PRESETS: dict[str, TrainConfig] = {
    # Toy: 2 layers x 64 wide, 64-token context. ~0.1M params + embeddings. For tests.
    "tiny": TrainConfig(
        model=GPTConfig(block_size=64, n_layer=2, n_head=2, n_embd=64, dropout=0.0),
        batch_size=8,
        max_steps=200,
        learning_rate=3e-3,
        min_lr=3e-4,
        warmup_steps=10,
        weight_decay=0.0,
        eval_interval=50,
        eval_iters=4,
        log_interval=10,
    ),
    # CPU default (nanoGPT's "shakespeare on a laptop" recipe, sized for 2 cores):
    # 4 layers x 128 wide, 128-token context, ~0.8M params + embeddings.
    "small": TrainConfig(
        model=GPTConfig(block_size=128, n_layer=4, n_head=4, n_embd=128, dropout=0.0),
        batch_size=16,
        max_steps=600,  # 1.2M tokens: ~1 epoch of tiny Shakespeare as bytes, ~2 min at 10k tok/s
        learning_rate=2e-3,
        min_lr=2e-4,
        warmup_steps=30,
        weight_decay=0.1,
        eval_interval=100,
        eval_iters=20,
        log_interval=25,
    ),
    # GPT-2 small (124M with the 50257 GPT-2 vocab), llm.c-style: 2**19 tokens per step
    # (16 x 1024 x 32 micro-steps on one GPU, 4 on each of 8), 10B tokens = 19073 steps,
    # bf16 autocast, compiled.
    "gpt2-124m": TrainConfig(
        model=GPTConfig(block_size=1024, n_layer=12, n_head=12, n_embd=768, dropout=0.0, bias=True),
        batch_size=16,
        total_batch_tokens=524288,
        max_steps=19073,
        learning_rate=6e-4,
        min_lr=6e-5,
        warmup_steps=700,
        weight_decay=0.1,
        eval_interval=250,
        eval_iters=20,
        log_interval=1,
        ckpt_interval=1000,
        ckpt_every_s=600.0,  # a checkpoint is ~1.5 GB here: every 10 min, not every minute
        compile=True,
        fit_micro_batch=True,
    ),
    # The first BPE tutorial's MLP on its 300-token vocabulary: 32 tokens of context, 64-wide
    # embeddings, 512 tanh units (1,222,188 parameters at 300 ids), AdamW at a constant 1e-3
    # with torch's default weight decay and betas, no clipping, 2,048 predictions a step
    # (64 windows x 32 positions; the tutorial's batch of 2,048 examples). Its 500 epochs of
    # 578,558 examples are 283 steps each: 141,500 steps, one epoch between evaluations.
    "mlp": TrainConfig(
        model=MLPConfig(block_size=32, n_embd=64, n_hidden=512),
        batch_size=64,
        max_steps=141_500,
        learning_rate=1e-3,
        min_lr=1e-3,
        warmup_steps=0,
        weight_decay=0.01,
        beta1=0.9,
        beta2=0.999,
        grad_clip=0.0,
        eval_interval=283,
        eval_iters=20,
        log_interval=25,
    ),
}


def preset(name: str, **overrides: Any) -> TrainConfig:
    """A named preset with overrides (TrainConfig or model config field names)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides)


# The pipeline's LM stage parameters (`LMConfig`) live in `pipeline_lib.lm.stage_config`: they
# are pydantic-checked, and this module must import where only torch, numpy and safetensors are.
