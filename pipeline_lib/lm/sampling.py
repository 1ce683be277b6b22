"""Autoregressive sampling with temperature and top-k, deterministic under a seed.

`sample` takes a model object and does no I/O; load a published model through
`pipeline_lib.model_stage.load_published_model`, which checks its weights against the
version manifest. Non-finite logits (damaged or diverged weights) raise a clear error.

Speed: the prompt is run through the model once, then each new token alone, against a
`KVCache` of the earlier positions. Once the sequence outgrows block_size the context
is cropped to the last block_size tokens, as without a cache; their positions then shift
with every token, so from there on each step runs the whole cropped window. Either way
the tokens are those of running the model on the (cropped) context at every step.

Threads: decoding one sequence of a small model (under `ONE_THREAD_BELOW` parameters) on
the CPU runs on one intra-op thread. Its ops are too small to gain from splitting, and on
a busy machine every split op waits for a descheduled worker: 2 threads decoded ~11
tokens/s where 1 thread decoded ~330 on a loaded 2-core machine. torch's thread count is
process-wide, so it is lowered for the call and given back after (shared by concurrent
callers).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager

import torch
from torch.nn import functional as F

from pipeline_lib.lm.model import GPT, KVCache, LanguageModel

ONE_THREAD_BELOW = 20_000_000  # parameters: smaller models decode on one CPU thread

_threads_lock = threading.Lock()
_threads_users = 0
_threads_saved = 0


@contextmanager
def one_thread(enabled: bool) -> Iterator[None]:
    global _threads_users, _threads_saved
    if not enabled:
        yield
        return
    with _threads_lock:
        if _threads_users == 0:
            _threads_saved = torch.get_num_threads()
            torch.set_num_threads(1)
        _threads_users += 1
    try:
        yield
    finally:
        with _threads_lock:
            _threads_users -= 1
            if _threads_users == 0:
                torch.set_num_threads(_threads_saved)


def one_thread_for(model: LanguageModel) -> AbstractContextManager[None]:
    """`one_thread` for a small model on the CPU (under ONE_THREAD_BELOW parameters), else nothing."""
    device = next(model.parameters()).device
    return one_thread(device.type == "cpu" and model.num_params() < ONE_THREAD_BELOW)


@torch.no_grad()
def sample(
    model: LanguageModel,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int | None = None,
    stop_ids: Sequence[int] = (),
    kv_cache: bool = True,
) -> list[int]:
    """Continue `prompt_ids`; returns the NEW token ids only (not the prompt).

    temperature 0 (or top_k=1) is greedy decoding; top_k None or 0 samples from the whole
    vocabulary. The context is cropped to the last block_size tokens. Randomness comes
    from a private generator seeded with `seed` (global RNG untouched); seed None draws a
    fresh seed. Generation stops early after emitting any id in `stop_ids` (that id is
    included). kv_cache=False recomputes the whole context for every token (slower, the
    same tokens up to float rounding).

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
    if top_k is not None and top_k < 0:
        raise ValueError(f"top_k must be None or >= 0 (0: no top-k filter), got {top_k}")
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
    try:
        with one_thread_for(model):
            return _decode(
                model,
                [int(i) for i in prompt_ids],
                max_new_tokens,
                temperature,
                top_k,
                gen,
                {int(s) for s in stop_ids},
                kv_cache,
            )
    finally:
        model.train(was_training)


def _decode(
    model: LanguageModel,
    ids: list[int],
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    gen: torch.Generator,
    stops: set[int],
    kv_cache: bool,
) -> list[int]:
    device, block = gen.device, model.config.block_size
    out: list[int] = []
    cache = KVCache(model.config.n_layer) if kv_cache and isinstance(model, GPT) else None  # the MLP keeps no state
    fed = 0  # tokens of `ids` already in the cache
    for _ in range(max_new_tokens):
        if cache is not None and len(ids) <= block:
            new = ids[fed:]  # the whole prompt first, then one token at a time
            fed = len(ids)
        else:  # no cache, or the context outgrew block_size: run the cropped window
            cache, new = None, ids[-block:]
        x = torch.tensor([new], dtype=torch.long, device=device)
        logits, _ = model(x) if cache is None else model(x, cache=cache)
        logits = logits[:, -1, :].float()
        if not bool(torch.isfinite(logits).all()):
            raise FloatingPointError(
                f"the model produced non-finite logits after {len(out)} new tokens: its weights are damaged "
                "or diverged (load a published model with pipeline_lib.model_stage.load_published_model, "
                "which checks it against the version manifest)"
            )
        if temperature == 0 or top_k == 1:
            nxt = int(torch.argmax(logits, dim=-1).item())
        else:
            logits = logits / temperature
            if top_k:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            probs = F.softmax(logits, dim=-1)
            nxt = int(torch.multinomial(probs, num_samples=1, generator=gen).item())
        ids.append(nxt)
        out.append(nxt)
        if nxt in stops:
            break
    return out


def documents_text(tok, ids: Sequence[int], separator_id: int | None) -> str:
    """Generated ids as text (`tok`: anything with ``decode(ids) -> str``): the separator
    (``<|endoftext|>``) ends a document and shows as a line break, never as the token."""
    if separator_id is None:
        return tok.decode(list(ids))
    docs: list[list[int]] = [[]]
    for i in ids:
        if i == separator_id:
            docs.append([])
        else:
            docs[-1].append(int(i))
    return "\n".join(tok.decode(d) for d in docs)
