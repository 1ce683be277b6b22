"""The MLP language model of Bengio et al. (2003), as the first BPE tutorial builds it.

    the last block_size tokens -> wte -> concatenated -> hidden -> tanh -> output -> logits

* Every position of a training window is predicted, as the GPT's are, from the tokens
  before it in the window, at most block_size of them. Where fewer exist (the window's
  first positions, a short prompt) zero vectors stand in for the missing embeddings, so
  they add nothing to the hidden layer. So the trainer's windows, targets, loss and
  bits/byte are the GPT's; the tutorial instead scores only full contexts.
* No weight tying and no padded table: the parameters are the tutorial's,
  V*E (embeddings) + C*E*H + H (hidden) + H*V + V (output).
* The output layer is `output`, not `lm_head`: checkpoints leave a GPT's `lm_head.weight`
  out (it is the token table, stored once), and this model's output layer is its own.
* Initialisation is torch's default for Embedding and Linear, as in the tutorial.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.nn import functional as F

from pipeline_lib.lm.config import MLPConfig


class MLPLanguageModel(nn.Module):
    def __init__(self, config: MLPConfig) -> None:
        super().__init__()
        if config.vocab_size is None:
            raise ValueError("MLPConfig.vocab_size is None: set it (train() takes it from the manifest)")
        self.config = config
        self.vocab_size = config.vocab_size
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.hidden = nn.Linear(config.block_size * config.n_embd, config.n_hidden)
        self.output = nn.Linear(config.n_hidden, config.vocab_size)

    def contexts(self, idx: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T, block_size * n_embd): for each position the embeddings of
        itself and the block_size - 1 tokens before it, oldest first (zeros before the start)."""
        B, T = idx.shape
        C, E = self.config.block_size, self.config.n_embd
        x = self.wte(idx)  # (B, T, E)
        x = F.pad(x, (0, 0, C - 1, 0))  # (B, C - 1 + T, E): zero embeddings before the first token
        x = x.unfold(1, C, 1)  # (B, T, E, C): position t sees padded positions t .. t + C - 1
        return x.transpose(2, 3).reshape(B, T, C * E)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        reduction: str = "mean",
        return_logits: bool = True,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """idx, targets: (B, T) int64. Returns (logits, loss), as `GPT.forward` does.

        With targets: logits (B, T, vocab) (None with `return_logits` False) and the cross
        entropy in fp32 with `reduction` ("mean", "sum" or "none"). Without targets: the
        logits of the last position only, (B, 1, vocab), and loss None.
        """
        if targets is None:
            idx = idx[:, -self.config.block_size :]  # the last position reads no further back
        h = torch.tanh(self.hidden(self.contexts(idx)))
        if targets is None:
            return self.output(h[:, [-1], :]), None
        logits = self.output(h)
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), reduction=reduction)
        return (logits if return_logits else None), loss

    # -- accounting ----------------------------------------------------------------------

    def num_params(self, non_embedding: bool = True) -> int:
        """Every parameter, as the tutorial counts them. `non_embedding` is for the GPT's
        signature: it drops the GPT's position table, and this model has none."""
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token (forward + backward): 6 per weight of the two matmuls."""
        return 6.0 * (self.hidden.weight.numel() + self.output.weight.numel())

    def configure_optimizer(
        self, weight_decay: float, learning_rate: float, betas: tuple[float, float], fused: bool = False
    ) -> torch.optim.AdamW:
        """AdamW with weight decay on every parameter, as `AdamW(model.parameters())` in the tutorial."""
        kwargs = {"fused": True} if fused else {}
        return torch.optim.AdamW(self.parameters(), lr=learning_rate, betas=betas, weight_decay=weight_decay, **kwargs)
