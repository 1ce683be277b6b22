"""A GPT-2 style decoder-only transformer, readable top to bottom (after nanoGPT).

    tokens -> wte + wpe -> dropout -> n_layer x Block -> LayerNorm -> lm_head -> logits
    Block:   x = x + Attention(LN(x));  x = x + MLP(LN(x))          (pre-norm)

* Attention is `F.scaled_dot_product_attention(..., is_causal=True)` (flash / memory
  efficient kernels on GPU, a fused math kernel on CPU).
* The output projection shares its weight with the token embedding (weight tying). The
  table has `GPTConfig.padded_vocab_size` rows (a multiple of 64, for the GPU's matmul
  tiles); the logits of the padded ids are cut off before the loss and before sampling,
  so they take no part in either.
* Generation passes a `KVCache`: the keys and values of the positions seen so far are
  kept per block, so each new token costs one position's forward pass, not the context's.
* The training loss never holds the full logits: `linear_cross_entropy` takes the final
  hidden states and the output table and goes through the rows a chunk at a time,
  computing each chunk's logits, its loss and its gradients in the forward pass (so no
  B*T*V float32 tensor exists, 3.3 GB at GPT-2 124M with 16 x 1024 windows); the
  backward pass only scales them. `forward(..., return_logits=False)` takes that path.
* GPT-2 initialisation: N(0, 0.02) everywhere, zero biases, and the residual output
  projections (`c_proj`) scaled by 1/sqrt(2 * n_layer).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch.nn import functional as F

from pipeline_lib.lm.config import GPTConfig, MLPConfig
from pipeline_lib.lm.mlp import MLPLanguageModel


class _Trunk(nn.ModuleDict):
    """`GPT.transformer`: a ModuleDict whose entries mypy can see (annotations only)."""

    wte: nn.Embedding
    wpe: nn.Embedding
    drop: nn.Dropout
    h: nn.ModuleList
    ln_f: nn.LayerNorm


class LayerCache:
    """One block's keys and values so far, (B, n_head, T, head_dim) each, for generation."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new positions' keys and values; returns all of them."""
        if self.k is not None and self.v is not None:
            k, v = torch.cat((self.k, k), dim=2), torch.cat((self.v, v), dim=2)
        self.k, self.v = k, v
        return k, v


class KVCache:
    """Every block's keys and values of the positions fed so far (positions 0..len-1).

    Pass the same cache to successive `GPT.forward` calls with the new tokens only: they
    are placed after the cached positions, and the result is the same as running the
    model on the whole sequence. It holds at most block_size positions.
    """

    def __init__(self, n_layer: int) -> None:
        self.layers = [LayerCache() for _ in range(n_layer)]

    def __len__(self) -> int:
        k = self.layers[0].k
        return 0 if k is None else k.size(2)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        # (B, T, C) -> (B, n_head, T, head_dim)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if cache is not None:  # attend to the cached positions too
            k, v = cache.extend(k, v)
        S = k.size(2)  # positions attended to: the T new ones last
        mask = None
        if T > 1 and S > T:  # new query i sees every cached position and new ones up to i
            mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(diagonal=S - T)
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=T > 1 and S == T,  # one new query (generation) needs no mask
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble the heads
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's GELU
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cache)
        x = x + self.mlp(self.ln_2(x))
        return x


LOSS_CHUNK_ROWS = 4096  # rows (tokens) of logits alive at once in `linear_cross_entropy`


def _matmul_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype autocast would run `hidden @ weight.T` in (the weight's own without autocast)."""
    dev = weight.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else weight.dtype


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Cross entropy of ``hidden @ weight[:vocab].T`` against `targets`, mean or sum over
    the rows, computed `chunk` rows at a time. The forward pass also computes the
    gradients (softmax - one_hot of each chunk, times the chunk's rows / the table) and
    keeps them, instead of the logits, for the backward pass."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, vocab: int, chunk: int, mean: bool):  # type: ignore[override]
        cdt = _matmul_dtype(weight)
        n = hidden.size(0)
        scale = 1.0 / n if mean else 1.0
        w = weight[:vocab].to(cdt)
        need_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if need_grad else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_grad else None
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            for a in range(0, n, chunk):
                h = hidden[a : a + chunk].to(cdt)
                t = targets[a : a + chunk]
                logits = (h @ w.T).float()
                lse = torch.logsumexp(logits, dim=-1)
                total += (lse - logits.gather(1, t[:, None]).squeeze(1)).sum()
                if need_grad:
                    g = torch.softmax(logits, dim=-1)  # the chunk's logits become its gradient
                    g[torch.arange(g.size(0), device=g.device), t] -= 1.0
                    g = (g * scale).to(cdt)
                    assert grad_hidden is not None and grad_w is not None
                    grad_hidden[a : a + chunk] = (g @ w).to(hidden.dtype)
                    grad_w[:vocab] += (g.T @ h).float()
        ctx.save_for_backward(grad_hidden, grad_w.to(weight.dtype) if grad_w is not None else None)
        return total * scale

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        grad_hidden, grad_w = ctx.saved_tensors
        gh = grad_hidden * grad_out.to(grad_hidden.dtype) if ctx.needs_input_grad[0] else None
        gw = grad_w * grad_out.to(grad_w.dtype) if ctx.needs_input_grad[1] else None
        return gh, gw, None, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    vocab: int,
    reduction: str = "mean",
    chunk: int = LOSS_CHUNK_ROWS,
) -> torch.Tensor:
    """`F.cross_entropy(hidden @ weight[:vocab].T, targets, reduction)` in float32, for
    (N, C) rows, without the (N, vocab) logits: at most `chunk` rows of them at a time.
    reduction "mean" / "sum" are differentiable; "none" (per row) is for evaluation only."""
    if reduction == "none":
        if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
            raise ValueError("linear_cross_entropy: reduction='none' has no gradient; use it under torch.no_grad()")
        w = weight[:vocab]
        out = [
            F.cross_entropy((hidden[a : a + chunk] @ w.T).float(), targets[a : a + chunk], reduction="none")
            for a in range(0, hidden.size(0), chunk)
        ]
        return torch.cat(out) if out else hidden.new_zeros(0, dtype=torch.float32)
    if reduction not in ("mean", "sum"):
        raise ValueError(f"linear_cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    result = _ChunkedLinearCrossEntropy.apply(hidden, weight, targets, vocab, chunk, reduction == "mean")
    return result  # type: ignore[no-any-return]


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.vocab_size is None:
            raise ValueError("GPTConfig.vocab_size is None: set it (train() takes it from the manifest)")
        self.config = config
        self.vocab_size = config.vocab_size
        self.transformer = _Trunk(
            dict(
                wte=nn.Embedding(config.padded_vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying

        # GPT-2 init.
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # residual projections
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        reduction: str = "mean",
        cache: KVCache | None = None,
        return_logits: bool = True,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """idx, targets: (B, T) int64. Returns (logits, loss).

        With targets: logits for every position, (B, T, vocab), and the cross entropy
        (fp32) with `reduction` ("mean", "sum" or "none"); with `return_logits` False the
        logits are None and the loss is computed a chunk of rows at a time
        (`linear_cross_entropy`: what training uses). Without targets: logits for the last
        position only, (B, 1, vocab) — all that sampling needs — and loss None.
        With a `cache`, idx holds the tokens that follow the cached ones (see `KVCache`).
        """
        B, T = idx.shape
        past = len(cache) if cache is not None else 0
        if past + T > self.config.block_size:
            raise ValueError(f"sequence length {past + T} exceeds block_size {self.config.block_size}")
        pos = torch.arange(past, past + T, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for i, block in enumerate(self.transformer.h):
            x = block(x, cache.layers[i] if cache is not None else None)
        x = self.transformer.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, [-1], :])[..., : self.vocab_size], None
        if not return_logits:
            flat = x.reshape(-1, x.size(-1))
            return None, linear_cross_entropy(
                flat, self.lm_head.weight, targets.reshape(-1), self.vocab_size, reduction, LOSS_CHUNK_ROWS
            )
        logits = self.lm_head(x)[..., : self.vocab_size]  # the padded ids' logits: never in the loss
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), reduction=reduction)
        return logits, loss

    # -- accounting ----------------------------------------------------------------------

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count (tied weights once; the padded table rows are not counted: no
        input or loss uses them). non_embedding drops the position table; the token table
        stays since it is also the output layer."""
        n = sum(p.numel() for p in self.parameters())
        n -= (self.config.padded_vocab_size - self.vocab_size) * self.config.n_embd
        if non_embedding:
            n -= self.transformer.wpe.weight.numel()
        return n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token (forward + backward): 6N + 12 * L * d * T (PaLM appendix B)."""
        cfg = self.config
        T = seq_len if seq_len is not None else cfg.block_size
        return 6.0 * self.num_params() + 12.0 * cfg.n_layer * cfg.n_embd * T

    def configure_optimizer(
        self, weight_decay: float, learning_rate: float, betas: tuple[float, float], fused: bool = False
    ) -> torch.optim.AdamW:
        """AdamW with weight decay on >= 2-D parameters (matmuls, embeddings) only."""
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        groups = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        kwargs = {"fused": True} if fused else {}
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **kwargs)


# -- any of the LM stage's models ----------------------------------------------------------

LanguageModel = GPT | MLPLanguageModel


def build_model(config: GPTConfig | MLPConfig) -> LanguageModel:
    """The model a config describes: a GPT, or the MLP language model (`pipeline_lib.lm.mlp`)."""
    return MLPLanguageModel(config) if isinstance(config, MLPConfig) else GPT(config)
