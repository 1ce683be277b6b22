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


@pytest.mark.parametrize("prompt", [[1], [3, 1, 4, 1, 5], list(range(11))])  # 11 > block_size 8
@pytest.mark.parametrize(
    "kw", [dict(temperature=0.0), dict(temperature=1.0, top_k=None, seed=5), dict(temperature=0.8, top_k=7, seed=11)]
)
def test_kv_cache_generates_what_full_recompute_does(model, prompt, kw):
    # 20 new tokens: the cache fills block_size 8, then the context is cropped and recomputed
    cached = sample(model, prompt, 20, kv_cache=True, **kw)
    assert cached == sample(model, prompt, 20, kv_cache=False, **kw)
    if kw["temperature"] == 0:
        assert cached == greedy(model, prompt, 20)


def test_kv_cache_logits_match_the_full_forward(model):
    from pipeline_lib.lm.model import KVCache

    x = torch.tensor([[5, 9, 2, 7, 7, 1, 30, 12]])
    with torch.no_grad():
        full, _ = model(x, x)  # logits at every position
        cache = KVCache(model.config.n_layer)
        parts = [model(x[:, :3], cache=cache)[0], model(x[:, 3:6], cache=cache)[0], model(x[:, 6:7], cache=cache)[0]]
    for logits, pos in zip(parts, (2, 5, 6)):
        assert torch.allclose(logits[0, -1], full[0, pos], atol=1e-5)
    assert len(cache) == 7
    with pytest.raises(ValueError, match="exceeds block_size"):
        model(x[:, :2], cache=cache)


def test_top_k_0_is_no_filter(model):
    for s in range(5):
        assert sample(model, [2], 15, temperature=1.0, top_k=0, seed=s) == sample(
            model, [2], 15, temperature=1.0, top_k=None, seed=s
        )
    with pytest.raises(ValueError, match="top_k"):
        sample(model, [2], 3, top_k=-1)


def test_sample_text_splits_documents_at_the_separator(tmp_path):
    """`tokenmill lm sample`'s text: a model that learnt "ab<|endoftext|>" documents writes
    "ab" lines: the separator is a line break, never the literal token."""
    import json

    import numpy as np

    from pipeline_lib.config import SampleConfig
    from pipeline_lib.lm import preset
    from pipeline_lib.lm.testing import write_token_dir
    from pipeline_lib.model_stage import sample_text
    from pipeline_lib.stages import tokenizer_files
    from pipeline_lib.stages.lm import train_language_model
    from pipeline_lib.store import ArtifactStore
    from pipeline_lib.tokenizer import Tokenizer

    tok = Tokenizer.train(["ab cd ab cd"], vocab_size=258, pattern="gpt2")
    sep = tok.special_tokens["<|endoftext|>"]
    doc = np.asarray(tok.encode_ordinary("ab"), dtype=np.int64)
    store = ArtifactStore(str(tmp_path / "store"))
    staging = store.stage("tokenizer", "tok-test")
    tokenizer = store.publish(
        staging, files={n: staging.put_bytes(n, b) for n, b in tokenizer_files(tok).items()}, meta=tok.metadata()
    )
    d = write_token_dir(tmp_path / "tokens", [[doc] * 300, [doc] * 300], tok.vocab_size, sep)
    staging = store.stage("tokens", "tokens-test")
    files = {p.name: staging.put_file(p.name, str(p)) for p in sorted(d.glob("shard_*"))}
    tokens = store.publish(
        staging,
        files=files,
        parents={"tokenizer": tokenizer},
        meta=json.loads((d / "manifest.json").read_text())["meta"],
    )
    cfg = preset(
        "tiny",
        device="cpu",
        max_steps=40,
        block_size=8,
        n_layer=1,
        n_embd=32,
        eval_iters=1,
        learning_rate=1e-2,
        warmup_steps=2,
        ckpt_every_s=0,
    )
    ref = train_language_model(store, tokens, tokenizer, cfg, log=lambda _m: None, n_samples=1, sample_tokens=8)
    n = len(doc) + 1  # tokens per document with its separator
    published = store.manifest(ref.kind, ref.version)["meta"]["samples"]  # sampled at temperature 0.8
    assert len(published) == 1 and "<|endoftext|>" not in published[0] and published[0].count("\n") >= 1
    greedy = sample_text(store, ref, SampleConfig(max_new_tokens=3 * n, temperature=0.0))
    assert greedy == "ab\nab\nab\n"
    assert (
        sample_text(store, ref.version, SampleConfig(prompt="ab", max_new_tokens=2 * n, temperature=0.0))
        == "ab\nab\nab"
    )
    text = sample_text(store, ref, SampleConfig(max_new_tokens=20, top_k=0, seed=3))  # no top-k filter
    assert "<|endoftext|>" not in text and text.count("\n") >= 2
    # the device is the caller's choice (auto: CUDA when there is one); one missing is bad input, named by its flag
    assert sample_text(store, ref, SampleConfig(max_new_tokens=3 * n, temperature=0.0), device="cpu") == greedy
    if not torch.cuda.is_available():
        from pipeline_lib.errors import InputError

        with pytest.raises(InputError, match="--device cuda: .*choose auto, cpu"):
            sample_text(store, ref, SampleConfig(max_new_tokens=2), device="cuda")


def test_small_model_decodes_on_one_thread_and_gives_the_setting_back(model):
    seen = []
    hook = model.register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        sample(model, [1], 3, seed=0)
        assert seen == [1, 1, 1] and torch.get_num_threads() == 2

        def fail(*_):
            raise RuntimeError("boom")

        failing = model.register_forward_pre_hook(fail)
        try:
            with pytest.raises(RuntimeError, match="boom"):  # an error while decoding gives it back too
                sample(model, [1], 3, seed=0)
        finally:
            failing.remove()
        assert torch.get_num_threads() == 2 and not model.training
    finally:
        hook.remove()
        torch.set_num_threads(before)


def test_documents_text_breaks_lines_at_the_separator():
    from pipeline_lib.lm.sampling import documents_text

    class Letters:  # id i is the letter chr(97 + i); id 9 would decode to a literal "<|endoftext|>"
        def decode(self, ids):
            return "".join("<|endoftext|>" if i == 9 else chr(97 + i) for i in ids)

    assert documents_text(Letters(), [0, 1, 9, 2, 9, 9, 3], 9) == "ab\nc\n\nd"
    assert documents_text(Letters(), [9, 0], 9) == "\na"
    assert documents_text(Letters(), [0, 9], None) == "a<|endoftext|>"
