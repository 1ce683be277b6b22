"""The first BPE tutorial's MLP language model (``--lm-preset mlp``): its parameter count is
the tutorial's formula, it reads exactly the last block_size tokens in the tutorial's
order, the GPT's trainer trains it (the loss falls, bits/byte, checkpoints, sampling), and
its model versions are its own while the GPT's ids stay as they were."""

from __future__ import annotations

import contextlib
import io
import math
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from pipeline_lib.errors import ConfigError
from pipeline_lib.lm import MLPConfig, MLPLanguageModel, build_model, load_model, preset, sample, train
from pipeline_lib.lm.config import TrainConfig
from pipeline_lib.lm.stage_config import LMConfig
from pipeline_lib.lm.testing import byte_token_lengths, write_byte_token_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

SHAKESPEARE = Path(__file__).resolve().parents[1] / "pipeline_lib" / "data" / "tinyshakespeare.txt"

# The tutorial's sizes: 300 ids, 32 tokens of context, 64-wide embeddings, 512 hidden units.
V, C, E, H = 300, 32, 64, 512


def tutorial_count(v: int, c: int, e: int, h: int) -> int:
    """The tutorial's model, nn.Embedding(v, e) -> nn.Linear(c * e, h) -> nn.Linear(h, v), counted."""
    return v * e + (c * e * h + h) + (h * v + v)


def test_the_preset_has_the_tutorials_sizes_and_parameter_count():
    cfg = preset("mlp", vocab_size=V)
    assert cfg.model == MLPConfig(vocab_size=V, block_size=C, n_embd=E, n_hidden=H)
    assert cfg.tokens_per_step == 2048  # the tutorial's batch of 2,048 predictions
    assert (cfg.learning_rate, cfg.min_lr, cfg.warmup_steps, cfg.weight_decay, cfg.beta2, cfg.grad_clip) == (
        1e-3,
        1e-3,
        0,
        0.01,
        0.999,
        0.0,
    )
    with torch.device("meta"):
        model = build_model(cfg.model)
    assert isinstance(model, MLPLanguageModel)
    assert model.num_params() == tutorial_count(V, C, E, H) == 1_222_188  # what the tutorial prints
    # each size is the preset's default only: the flags override it
    lm = LMConfig(preset="mlp", block_size=8, n_embd=16, n_hidden=24).train_config()
    assert lm.model == MLPConfig(block_size=8, n_embd=16, n_hidden=24)
    with torch.device("meta"):
        assert build_model(lm.model.with_vocab(302)).num_params() == tutorial_count(302, 8, 16, 24)


def test_a_gpt_setting_on_the_mlp_is_one_clear_error():
    with pytest.raises(
        ConfigError,
        match=r"n_layer: not a setting of the mlp model \(its settings: block_size, "
        r"n_embd, n_hidden, vocab_size\)",
    ):
        LMConfig(preset="mlp", n_layer=2)
    with pytest.raises(ConfigError, match=r"n_hidden: not a setting of the gpt model"):
        LMConfig(preset="small", n_hidden=64)


def test_the_last_position_is_the_tutorials_forward_pass():
    """A full window: the same weights in the tutorial's module give the same logits."""
    torch.manual_seed(0)
    cfg = MLPConfig(vocab_size=50, block_size=6, n_embd=5, n_hidden=7)
    ours = MLPLanguageModel(cfg)
    emb, hidden, output = nn.Embedding(50, 5), nn.Linear(6 * 5, 7), nn.Linear(7, 50)
    emb.load_state_dict(ours.wte.state_dict())
    hidden.load_state_dict(ours.hidden.state_dict())
    output.load_state_dict(ours.output.state_dict())
    x = torch.randint(0, 50, (3, 6))
    theirs = output(torch.tanh(hidden(emb(x).view(3, -1))))
    logits, loss = ours(x)
    assert loss is None and logits is not None and logits.shape == (3, 1, 50)
    torch.testing.assert_close(logits[:, 0], theirs)
    # every position of a longer window is that forward pass over the 6 tokens ending there
    long = torch.randint(0, 50, (2, 15))
    all_logits, _ = ours(long, torch.zeros_like(long))
    assert all_logits is not None
    for t in range(5, 15):
        torch.testing.assert_close(
            all_logits[:, t], output(torch.tanh(hidden(emb(long[:, t - 5 : t + 1]).view(2, -1))))
        )


def test_a_position_reads_only_the_block_size_tokens_up_to_it():
    torch.manual_seed(0)
    model = MLPLanguageModel(MLPConfig(vocab_size=20, block_size=4, n_embd=3, n_hidden=5))
    x = torch.randint(0, 20, (1, 12))
    y = x.clone()
    y[0, 6] = (x[0, 6] + 1) % 20
    a, _ = model(x, x)
    b, _ = model(y, y)
    assert a is not None and b is not None
    changed = [t for t in range(12) if not torch.equal(a[0, t], b[0, t])]
    assert changed == [6, 7, 8, 9]  # the positions whose last 4 tokens hold position 6
    # a position before the window's 4th sees zeros for the missing tokens: a shorter prompt's logits
    short, _ = model(x[:, :2])
    assert short is not None
    torch.testing.assert_close(short[0, 0], a[0, 1])


@pytest.fixture(scope="module")
def byte_dir(tmp_path_factory):
    """Tiny Shakespeare as raw-byte tokens (vocab 256 + separator), with a val split."""
    return write_byte_token_dir(tmp_path_factory.mktemp("tokens"), SHAKESPEARE.read_bytes(), n_shards=2)


def test_the_trainer_trains_it_and_it_loads_back_and_samples(byte_dir, tmp_path):
    """A short run at the tutorial's sizes, 8 windows a step: the loss falls from about
    ln(257), bits/byte is measured, the checkpoint loads back as the MLP and samples."""
    cfg = preset(
        "mlp",
        device="cpu",
        max_steps=20,
        batch_size=8,
        eval_interval=10,
        eval_iters=2,
        log_interval=1,
        ckpt_interval=20,
    )
    evals: list[dict] = []
    lines: list[str] = []
    r = train(
        cfg, byte_dir, tmp_path / "run", token_byte_lengths=byte_token_lengths(), log=lines.append, on_eval=evals.append
    )
    n = tutorial_count(257, C, E, H)
    assert r.n_params == n and any(f"{n:,} params" in line for line in lines)  # printed at the start, as the GPT's
    losses = [h["train_loss"] for h in r.history if h["train_loss"] is not None]
    assert len(losses) == 20 and abs(losses[0] - math.log(257)) < 0.3
    assert max(losses[-3:]) < losses[0] - 1.5, losses
    assert [e["step"] for e in evals] == [0, 10, 20]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 1.5
    assert r.val_bpb is not None and 0 < r.val_bpb < evals[0]["val_loss"] / math.log(2)
    model = load_model(tmp_path / "run")
    assert isinstance(model, MLPLanguageModel) and model.config == cfg.model.with_vocab(257)
    ids = sample(model, [ord("T")], 40, temperature=0.8, top_k=50, seed=0)
    assert len(ids) == 40 and all(0 <= i < 257 for i in ids)
    assert ids == sample(model, [ord("T")], 40, temperature=0.8, top_k=50, seed=0, kv_cache=False)


def test_its_versions_are_its_own_and_the_gpts_ids_stay():
    from pipeline_lib.stages.lm import model_version
    from pipeline_lib.store import VersionRef

    tokens = VersionRef("tokens", "t" * 20, "file:///t", "0" * 64)
    tokenizer = VersionRef("tokenizer", "k" * 20, "file:///k", "0" * 64)
    gpt, mlp = LMConfig().train_config(), LMConfig(preset="mlp").train_config()
    assert "arch" not in gpt.versioned_dict()["model"]  # a GPT's params are what they were
    assert mlp.versioned_dict()["model"] == {
        "arch": "mlp",
        "vocab_size": None,
        "block_size": 32,
        "n_embd": 64,
        "n_hidden": 512,
    }
    assert TrainConfig.from_dict(mlp.to_dict()) == mlp and TrainConfig.from_dict(gpt.to_dict()) == gpt
    ids = {model_version(tokens, tokenizer, c) for c in (gpt, mlp, LMConfig(preset="mlp", n_hidden=256).train_config())}
    assert len(ids) == 3


def test_the_tutorial_page_prints_the_count_its_command_computes():
    """docs/tutorial.md section 11: the command's output under it is what the command prints."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "tutorial.md").read_text(encoding="utf-8")
    found = re.search(r"^\$ python -c '(from pipeline_lib\.lm import build_model[^']*)'\n(.+)$", doc, re.M)
    assert found is not None
    code, shown = found.groups()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})
    assert out.getvalue().strip() == shown == f"{tutorial_count(V, C, E, H):,}"
