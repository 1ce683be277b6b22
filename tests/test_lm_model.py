"""GPT model and configs: shapes, causality, weight tying, GPT-2 init, accounting."""

import dataclasses
import math

import pytest
import torch

from pipeline_lib.lm import GPT, PRESETS, GPTConfig, TrainConfig, preset

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def small_model(**kw):
    cfg = GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=32, **kw)
    torch.manual_seed(0)
    return GPT(cfg)


def test_config_validation():
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(n_embd=30, n_head=4)
    with pytest.raises(ValueError, match="dropout"):
        GPTConfig(dropout=1.0)
    with pytest.raises(ValueError, match="block_size"):
        GPTConfig(block_size=0)
    with pytest.raises(ValueError, match="min_lr"):
        TrainConfig(learning_rate=1e-3, min_lr=1e-2)
    with pytest.raises(ValueError, match="device"):
        TrainConfig(device="tpu")
    with pytest.raises(ValueError, match="unknown preset"):
        preset("huge")
    with pytest.raises(dataclasses.FrozenInstanceError):
        GPTConfig().n_layer = 3  # type: ignore[misc]
    cfg = preset("tiny", max_steps=7, dropout=0.2)
    assert cfg.max_steps == 7 and cfg.model.dropout == 0.2
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    assert set(PRESETS) >= {"tiny", "small", "gpt2-124m"}


def test_forward_shapes_and_initial_loss():
    m = small_model()
    idx = torch.randint(0, 50, (3, 16))
    logits, loss = m(idx, torch.randint(0, 50, (3, 16)))
    assert logits.shape == (3, 16, 50)
    assert abs(loss.item() - math.log(50)) < 0.1  # near-uniform at init
    logits, loss = m(idx)
    assert logits.shape == (3, 1, 50) and loss is None
    with pytest.raises(ValueError, match="block_size"):
        m(torch.zeros(1, 17, dtype=torch.long))


def test_causal():
    m = small_model().eval()
    a = torch.randint(0, 50, (1, 16))
    b = a.clone()
    b[0, 10:] = (b[0, 10:] + 1) % 50  # change the future only
    la, _ = m(a, a)
    lb, _ = m(b, b)
    torch.testing.assert_close(la[0, :10], lb[0, :10], rtol=0, atol=1e-6)
    assert not torch.allclose(la[0, 10:], lb[0, 10:])


def test_weight_tying_and_gpt2_init():
    m = small_model()
    assert m.lm_head.weight is m.transformer.wte.weight
    std = 0.02 / math.sqrt(2 * 2)
    for name, p in m.named_parameters():
        if name.endswith("c_proj.weight"):
            assert abs(p.std().item() - std) < std * 0.25
        elif name.endswith("c_fc.weight"):
            assert abs(p.std().item() - 0.02) < 0.005
    mb = small_model(bias=True)
    assert all(torch.all(p == 0) for n, p in mb.named_parameters() if n.endswith("attn.c_attn.bias"))


def test_gpt2_124m_param_count_and_flops():
    cfg = PRESETS["gpt2-124m"].model.with_vocab(50257)
    with torch.device("meta"):
        m = GPT(cfg)
    assert m.num_params(non_embedding=False) == 124_439_808  # GPT-2 small
    assert m.num_params() == 123_653_376  # nanoGPT's "123.65M"
    assert m.flops_per_token() == 6 * 123_653_376 + 12 * 12 * 768 * 1024


def test_weight_decay_groups():
    m = small_model(bias=True)
    opt = m.configure_optimizer(0.1, 1e-3, (0.9, 0.95))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    n = sum(p.numel() for g in opt.param_groups for p in g["params"])
    padding = (m.config.padded_vocab_size - m.config.vocab_size) * m.config.n_embd  # table rows no id uses
    assert n == m.num_params(non_embedding=False) + padding


# -- the chunked linear + cross-entropy -----------------------------------------------


def _loss_and_grads(m, x, y, **kw):
    m.zero_grad(set_to_none=True)
    _, loss = m(x, y, **kw)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}


@pytest.mark.parametrize("chunk", [7, 4096])  # chunks that split the rows unevenly / one chunk
def test_chunked_loss_and_grads_equal_the_full_logits_path(monkeypatch, chunk):
    from pipeline_lib.lm import model as model_mod

    monkeypatch.setattr(model_mod, "LOSS_CHUNK_ROWS", chunk)
    m = GPT(GPTConfig(vocab_size=57, block_size=16, n_layer=2, n_head=2, n_embd=32))  # 57 -> 64 rows: padded ids too
    torch.manual_seed(1)
    x, y = torch.randint(0, 57, (3, 16)), torch.randint(0, 57, (3, 16))
    want_loss, want = _loss_and_grads(m, x, y)
    got_loss, got = _loss_and_grads(m, x, y, return_logits=False)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-6, atol=1e-6)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-7, msg=name)
    assert got["transformer.wte.weight"][57:].abs().max() == 0  # the padded rows take no part
    # under bfloat16 autocast both paths run the output matmul in bfloat16: equal within its precision
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want_loss, want = _loss_and_grads(m, x, y)
        got_loss, got = _loss_and_grads(m, x, y, return_logits=False)
    torch.testing.assert_close(got_loss, want_loss, rtol=2e-2, atol=2e-2)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=5e-2, atol=5e-3, msg=name)


def test_chunked_per_token_losses_and_sum():
    from pipeline_lib.lm.model import linear_cross_entropy

    torch.manual_seed(2)
    h, w, t = torch.randn(10, 8), torch.randn(12, 8), torch.randint(0, 9, (10,))
    full = torch.nn.functional.cross_entropy(h @ w[:9].T, t, reduction="none")
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy(h, w, t, 9, "none", chunk=3), full)
    torch.testing.assert_close(linear_cross_entropy(h, w, t, 9, "sum", chunk=4), full.sum())
    with pytest.raises(ValueError, match="no_grad"):
        linear_cross_entropy(h.requires_grad_(), w, t, 9, "none")
