"""Sampling: seeded determinism, greedy top_k=1 / temperature 0, context cropping."""

import pytest
import torch

from pipeline_lib.lm import GPT, GPTConfig, sample

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=40, block_size=8, n_layer=2, n_head=2, n_embd=32)).eval()


def greedy(model, prompt, n):
    ids = list(prompt)
    for _ in range(n):
        logits, _ = model(torch.tensor([ids[-model.config.block_size :]]))
        ids.append(int(torch.argmax(logits[0, -1])))
    return ids[len(prompt) :]


def test_seeded_sampling_is_deterministic(model):
    a = sample(model, [1, 2, 3], 20, temperature=1.0, top_k=None, seed=123)
    b = sample(model, [1, 2, 3], 20, temperature=1.0, top_k=None, seed=123)
    c = sample(model, [1, 2, 3], 20, temperature=1.0, top_k=None, seed=124)
    assert a == b and len(a) == 20 and all(0 <= t < 40 for t in a)
    assert a != c
    state = torch.get_rng_state()
    sample(model, [1], 5, seed=None)
    assert torch.equal(state, torch.get_rng_state())  # the global RNG is untouched


def test_top_k_1_and_temperature_0_are_greedy(model):
    want = greedy(model, [5, 6], 20)  # 22 tokens: also exercises cropping to block_size 8
    assert sample(model, [5, 6], 20, temperature=1.0, top_k=1, seed=0) == want
    assert sample(model, [5, 6], 20, temperature=1.0, top_k=1, seed=99) == want
    assert sample(model, [5, 6], 20, temperature=0.0, seed=7) == want


def test_top_k_restricts_choices(model):
    logits, _ = model(torch.tensor([[4]]))
    top3 = set(torch.topk(logits[0, -1], 3).indices.tolist())
    firsts = {sample(model, [4], 1, temperature=2.0, top_k=3, seed=s)[0] for s in range(40)}
    assert firsts <= top3 and len(firsts) > 1


def test_stop_and_errors(model):
    first = greedy(model, [9], 1)[0]
    assert sample(model, [9], 10, top_k=1, stop_ids=[first]) == [first]
    with pytest.raises(ValueError, match="empty"):
        sample(model, [], 5)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        sample(model, [40], 5)
