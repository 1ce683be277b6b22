"""Autoregressive sampling with temperature and top-k, deterministic under a seed.

`sample` takes a model object and does no I/O; load a published model through
`pipeline_lib.model_stage.load_published_model`, which checks its weights against the
version manifest. Non-finite logits (damaged or diverged weights) raise a clear error.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from torch.nn import functional as F

from pipeline_lib.lm.model import GPT


@torch.no_grad()
def sample(
    model: GPT,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int | None = None,
    stop_ids: Sequence[int] = (),
) -> list[int]:
    """Continue `prompt_ids`; returns the NEW token ids only (not the prompt).

    temperature 0 (or top_k=1) is greedy decoding. The context is cropped to the last
    block_size tokens. Randomness comes from a private generator seeded with `seed`
    (global RNG untouched); seed None draws a fresh seed. Generation stops early after
    emitting any id in `stop_ids` (that id is included).

    Raises:
        ValueError: empty or out-of-vocabulary prompt, bad temperature / top_k.
        FloatingPointError: the model produced inf/nan logits (its weights are damaged or
            diverged; a checked load names a damaged file before this point).
    """
    if len(prompt_ids) == 0:
        raise ValueError("prompt_ids is empty: give at least one token (e.g. the separator id)")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be None or >= 1, got {top_k}")
    vocab = model.config.vocab_size
    assert vocab is not None
    bad = [i for i in prompt_ids if not 0 <= int(i) < vocab]
    if bad:
        raise ValueError(f"prompt ids {bad[:5]} are outside the vocabulary [0, {vocab})")

    device = next(model.parameters()).device
    gen = torch.Generator(device=device)
    gen.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)
    was_training = model.training
    model.eval()
    idx = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
    stops = {int(s) for s in stop_ids}
    out: list[int] = []
    for _ in range(max_new_tokens):
        ctx = idx[:, -model.config.block_size :]
        logits, _ = model(ctx)
        logits = logits[:, -1, :].float()
        if not bool(torch.isfinite(logits).all()):
            raise FloatingPointError(
                f"the model produced non-finite logits after {len(out)} new tokens: its weights are damaged or "
                "diverged (load a published model with pipeline_lib.model_stage.load_published_model, "
                "which checks it against the version manifest)"
            )
        if temperature == 0 or top_k == 1:
            nxt = torch.argmax(logits, dim=-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            probs = F.softmax(logits, dim=-1)
            nxt = torch.multinomial(probs, num_samples=1, generator=gen)
        idx = torch.cat((idx, nxt), dim=1)
        tok = int(nxt.item())
        out.append(tok)
        if tok in stops:
            break
    model.train(was_training)
    return out
