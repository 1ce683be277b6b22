"""The memory plan of a training run, computed without allocating anything.

    python -m pipeline_lib.lm plan --preset gpt2-124m --device cuda [--world-size 8]

prints, per rank: the parameters, their gradients and AdamW's two moments (all float32,
as the trainer keeps them under autocast), the activations one micro-batch keeps for
its backward pass, their total, and the batch arithmetic (tokens per optimizer step,
micro-steps per rank, FLOPs per step). The model is built on torch's meta device, so the
parameter count is the model's own code, not a formula.

Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", eq. 2): a block keeps about ``34 * T * B * C`` bytes at 2 bytes per
value (LayerNorm inputs, q/k/v, the attention output, the 4C-wide MLP input and GELU
input, residuals), without the ``5 * n_head * T^2 * B`` attention-score term when the
attention kernel is a fused (flash / memory-efficient) one, which `scaled_dot_product_attention`
is on CUDA; at float32 the same values take twice the bytes. The output layer adds the
logits in the autocast dtype and the float32 log-softmax the loss keeps (``B * T * V * (a +
4)``). Not counted: the CUDA context and allocator slack (~0.5-1 GiB), `torch.compile`'s
workspace, and the transient peaks inside a kernel. `tests/test_lm_plan.py` checks the
activation figure against what autograd actually saves for a small model on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline_lib.lm.config import GPTConfig, TrainConfig
from pipeline_lib.lm.model import GPT, LOSS_CHUNK_ROWS

# How each autocast dtype is named in the logs and the plan.
PRECISION_NAMES = {None: "fp32", torch.bfloat16: "bf16 autocast", torch.float16: "fp16 autocast + GradScaler"}


def autocast_dtype(dtype: str, device_type: str, bf16_supported: bool) -> torch.dtype | None:
    """The autocast dtype of `TrainConfig.dtype` on a device (None: float32, no autocast).

    auto: bfloat16 on CUDA when the GPU supports it, else float16 (with a GradScaler);
    float32 on the CPU and MPS."""
    if dtype == "auto":
        if device_type != "cuda":
            return None
        return torch.bfloat16 if bf16_supported else torch.float16
    return {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


GIB = 1 << 30


@dataclass(frozen=True)
class MemoryPlan:
    device: str
    precision: str  # "fp32", "bf16 autocast", "fp16 autocast + GradScaler"
    world_size: int
    n_params: int  # the model's (`GPT.num_params(non_embedding=False)`)
    n_tensor_values: int  # every parameter value held, the padded table rows included
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int  # per micro-batch, kept for its backward pass
    loss_chunk_bytes: int  # the loss's logits, one chunk of rows at a time (transient)
    micro_batch: int  # windows per micro-step
    micro_steps_per_rank: int
    tokens_per_step: int  # all ranks together
    flops_per_step: float  # all ranks together

    @property
    def total_bytes(self) -> int:
        return (
            self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes + self.loss_chunk_bytes
        )

    def lines(self) -> list[str]:
        def gib(n: int) -> str:
            return f"{n / GIB:8.2f} GiB"

        return [
            f"device {self.device}, {self.precision}, {self.world_size} rank(s); per rank:",
            f"  parameters   {gib(self.params_bytes)}  ({self.n_params / 1e6:.2f}M, {self.n_tensor_values:,} float32 "
            "values with the padded table)",
            f"  gradients    {gib(self.grads_bytes)}",
            f"  AdamW state  {gib(self.optimizer_bytes)}  (two float32 moments)",
            f"  activations  {gib(self.activations_bytes)}  (one micro-batch of {self.micro_batch} windows, kept for "
            "backward)",
            f"  loss chunk   {gib(self.loss_chunk_bytes)}  (logits of at most {LOSS_CHUNK_ROWS} tokens at a time)",
            f"  total        {gib(self.total_bytes)}  (+ CUDA context and allocator slack)"
            if self.device == "cuda"
            else f"  total        {gib(self.total_bytes)}",
            f"tokens per optimizer step {self.tokens_per_step:,} = {self.micro_batch} windows x "
            f"{self.micro_steps_per_rank} micro-steps x "
            f"{self.world_size} rank(s) x context; {self.flops_per_step:.3g} FLOPs per step",
        ]


def activation_bytes(cfg: TrainConfig, act_bytes: int, fused_attention: bool) -> int:
    """Bytes one micro-batch keeps for backward (see the module doc for the formula)."""
    m = cfg.model
    assert isinstance(m, GPTConfig) and m.vocab_size is not None  # memory_plan refuses another arch
    b, t, c = cfg.batch_size, m.block_size, m.n_embd
    per_value = act_bytes / 2  # the formula counts 2-byte values
    block = 34 * t * b * c * per_value
    if not fused_attention:
        block += 5 * m.n_head * t * t * b * per_value
    embed = 2 * t * b * c * 4  # token + position embeddings and their sum (float32)
    # The loss (`linear_cross_entropy`) keeps the gradients of the hidden states and of the
    # output table for backward, not the logits (their chunk is `loss_chunk_bytes`).
    head = b * t * c * 4 + m.padded_vocab_size * c * 4
    return int(m.n_layer * block + embed + head)


def loss_chunk_bytes(cfg: TrainConfig, act_bytes: int) -> int:
    """The loss's transient peak: one chunk of LOSS_CHUNK_ROWS rows of logits in the matmul
    dtype, in float32, and their softmax (turned gradient) in float32."""
    m = cfg.model
    assert m.vocab_size is not None
    return min(cfg.batch_size * m.block_size, LOSS_CHUNK_ROWS) * m.vocab_size * (act_bytes + 8)


def memory_plan(
    cfg: TrainConfig, vocab_size: int | None = None, device: str = "cuda", world_size: int = 1, bf16: bool = True
) -> MemoryPlan:
    """The per-rank memory of training `cfg` on `device` ("cuda" or "cpu"), without allocating.

    `vocab_size` fills a config that leaves it to the data; `bf16`: the GPU supports
    bfloat16 (else "auto" means float16 with a GradScaler).
    """
    if not isinstance(cfg.model, GPTConfig):
        raise ValueError("the memory plan is a GPT's; the mlp preset's model is small enough to need none")
    if cfg.model.vocab_size is None:
        if vocab_size is None:
            raise ValueError("the config leaves vocab_size to the data: give one (GPT-2's is 50257)")
        cfg = cfg.replace(vocab_size=vocab_size)
    assert isinstance(cfg.model, GPTConfig)  # checked above; replace() keeps the arch
    with torch.device("meta"):
        gpt = GPT(cfg.model)
    values = sum(p.numel() for p in gpt.parameters())
    amp = autocast_dtype(cfg.dtype, device, bf16)
    act = 4 if amp is None else 2
    micro = cfg.micro_steps_per_rank(world_size)
    return MemoryPlan(
        device=device,
        precision=PRECISION_NAMES[amp],
        world_size=world_size,
        n_params=gpt.num_params(non_embedding=False),
        n_tensor_values=values,
        params_bytes=4 * values,
        grads_bytes=4 * values,
        optimizer_bytes=8 * values,
        activations_bytes=activation_bytes(cfg, act, fused_attention=device == "cuda"),
        loss_chunk_bytes=loss_chunk_bytes(cfg, act),
        micro_batch=cfg.batch_size,
        micro_steps_per_rank=micro,
        tokens_per_step=cfg.tokens_per_step,
        flops_per_step=gpt.flops_per_token() * cfg.tokens_per_step,
    )


def fit_micro_batch(
    cfg: TrainConfig, memory_bytes: int, world_size: int = 1, bf16: bool = True, use: float = 0.75
) -> int:
    """The largest micro-batch (windows per forward pass) whose memory plan fits in `use` of
    `memory_bytes`, among those that divide a rank's windows per optimizer step (so the
    tokens per step stay the same); cfg.batch_size when none larger fits.

    >>> fit_micro_batch(preset("gpt2-124m", vocab_size=50257), 80 << 30)  # doctest: +SKIP
    64
    """
    rows = cfg.micro_steps_per_rank(world_size) * cfg.batch_size
    best = cfg.batch_size
    for b in range(cfg.batch_size + 1, rows + 1):
        if rows % b:
            continue
        trial = cfg.replace(batch_size=b, grad_accum_steps=rows * world_size // b)
        if memory_plan(trial, device="cuda", world_size=world_size, bf16=bf16).total_bytes <= use * memory_bytes:
            best = b
    return best
