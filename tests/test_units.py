"""Tokenizer units (byte, char, word) and split patterns (named, none, custom regex).

The BPE tutorials' walkthroughs replayed with our own code (their printed figures are what a
learner expects to see), the compiled core held equal to the pure-Python reference for every
unit, round-trips, files and the refusals.
"""

from __future__ import annotations

import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline_lib import bpe_reference as ref
from pipeline_lib.errors import InputError
from pipeline_lib.tokenizer import Tokenizer
from pipeline_lib.tokenizer import native as compiled

PROP = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
CAT_RAT = [
    "the cat sat on the mat",
    "the cat saw the rat",
    "the rat ran from the cat",
    "cats and rats are animals",
    "animals run and cats catch rats",
]
LOW_LOWER = ["low low low low low", "lower lower", "newest newest newest", "widest widest"]


def merge_log(tok: Tokenizer) -> list[tuple[str, str, int]]:
    assert tok.merges is not None and tok.merge_counts is not None
    return [(tok.token_str(a), tok.token_str(b), n) for (a, b, _), n in zip(tok.merges, tok.merge_counts)]


def train_both(monkeypatch, *args, **kwargs) -> tuple[Tokenizer, Tokenizer]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        native = Tokenizer.train(*args, **kwargs)
        with monkeypatch.context() as m:
            m.setattr(compiled, "_CORE", None)
            python = Tokenizer.train(*args, **kwargs)
    assert native._encoder is not None and python._encoder is None
    return native, python


# ---------------------------------------------------------------- the tutorials, replayed
def test_char_level_tiny_shakespeare_as_the_first_tutorial(shakespeare_text):
    """300 ids = 65 characters + 235 merges (+ <unk>, our id for unseen characters): 1.93x,
    578,590 tokens for 1,115,394 characters, and the merge log every 50 merges."""
    tok = Tokenizer.train([shakespeare_text], 301, pattern="none", unit="char", special_tokens=())
    alphabet = [t for t, i in tok.mergeable_ranks.items() if i < 65]
    assert len(alphabet) == 65 and len(tok.merges) == 235 and tok.special_tokens == {"<unk>": 300}
    assert [tok.token_str(i) for i in range(10)] == ["\n", " ", "!", "$", "&", "'", ",", "-", ".", "3"]
    log = merge_log(tok)
    assert [log[k] for k in range(0, 235, 50)] == [
        ("e", " ", 27643),
        ("l", "i", 2358),
        ("w", "ith", 1258),
        ("a", "y ", 849),
        ("s", "ha", 636),
    ]
    ids = tok.encode_ordinary(shakespeare_text)
    assert len(shakespeare_text) == 1_115_394
    assert abs(len(ids) - 578_590) <= 5_786 and f"{len(shakespeare_text) / len(ids):.2f}" == "1.93"
    assert tok.decode(ids) == shakespeare_text
    assert tok.encode("To be or not to be") == [227, 197, 77, 1, 136, 92, 178]
    assert [tok.token_str(i) for i in tok.encode("the king")] == ["the ", "k", "ing"]
    assert tok.encode("Zebra½") == tok.encode("Zebra") + [300]  # ½ never occurs: <unk>


def test_word_bpe_cat_rat_corpus_to_50_ids():
    """The lowercase \\w+ word BPE of the cat/rat tutorial: 17 initial symbols (16 letters +
    </w>) and 33 merges make 50. Our ties go to the smaller pair bytes, the tutorial's to the
    first pair met, so equal-count merges may come in another order (h+e</w> before t+h)."""
    tok = Tokenizer.train(CAT_RAT, 51, pattern=r"\w+", unit="word", lowercase=True, special_tokens=())
    assert len(tok.mergeable_ranks) == 50 and len(tok.merges) == 33 and len(tok.mergeable_ranks) - 33 == 17
    log = merge_log(tok)
    assert log[:9] == [
        ("a", "t", 12),
        ("at", "</w>", 7),
        ("e", "</w>", 7),
        ("h", "e</w>", 6),
        ("s", "</w>", 6),
        ("t", "he</w>", 6),
        ("a", "n", 5),
        ("at", "s</w>", 4),
        ("c", "at</w>", 3),
    ]
    tokens = {a + b for a, b, _ in log}
    tutorial_tokens = {
        "at",
        "e</w>",
        "at</w>",
        "the</w>",
        "s</w>",
        "an",
        "ats</w>",
        "cat</w>",
        "n</w>",
        "rats</w>",
        "and</w>",
        "from</w>",
    }
    assert tutorial_tokens <= tokens
    ids = tok.encode("The cat catches rats")
    assert [tok.token_str(i) for i in ids] == ["the</w>", "cat</w>", "c", "atch", "e", "s</w>", "rats</w>"]
    assert tok.decode(ids) == "the cat catches rats "  # the tutorials' decoders: </w> -> a space


def test_word_bpe_low_lower_newest_widest():
    """The word-frequency tutorial's corpus. Its printed log starts with e+s (5) although
    l+o occurs 7 times in its corpus: computed here, l+o comes first."""
    tok = Tokenizer.train(LOW_LOWER, 10 + 11 + 1, unit="word", special_tokens=())
    assert merge_log(tok)[:7] == [
        ("l", "o", 7),
        ("lo", "w", 7),
        ("e", "s", 5),
        ("es", "t", 5),
        ("est", "</w>", 5),
        ("low", "</w>", 5),
        ("e", "w", 3),
    ]
    assert [tok.token_str(i) for i in tok.encode("lowest newest")] == ["low", "est</w>", "newest</w>"]


# ---------------------------------------------------------------- reference == native
@pytest.mark.parametrize(
    "unit, pattern, unknown",
    [
        ("byte", "none", "unk"),
        ("byte", r"\p{L}+|\p{N}", "unk"),
        ("char", "none", "unk"),
        ("char", "cl100k", "bytes"),
        ("char", r" ?\w+", "unk"),
        ("word", "gpt2", "unk"),
        ("word", "none", "bytes"),
    ],
)
def test_native_equals_reference(monkeypatch, shakespeare_text, multilingual_text, unit, pattern, unknown):
    train = shakespeare_text[:6_000] + multilingual_text[:1_500]
    vocab = 300 if unit == "byte" else 200 if unknown == "unk" else 420
    native, python = train_both(
        monkeypatch, [train], vocab, pattern=pattern, unit=unit, unknown=unknown, special_tokens=()
    )
    assert native.merges == python.merges and native.merge_counts == python.merge_counts
    assert native.mergeable_ranks == python.mergeable_ranks and native.special_tokens == python.special_tokens
    sample = shakespeare_text[-1_500:] + multilingual_text[-1_000:] + "\x00 ☃ 👨‍👩‍👧"
    assert native.encode_ordinary(sample) == python.encode_ordinary(sample)
    docs = [sample[:700], "", sample[700:2000], "x" * 300]
    assert native.encode_ordinary_batch(docs, num_threads=2) == [python.encode_ordinary(d) for d in docs]


@pytest.fixture(scope="module")
def char_and_word() -> list[Tokenizer]:
    train = ["The quick brown fox, naïve café — 3 λόγοι! Über 42 Äpfel. " * 3]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # small corpora: fewer merges than asked for
        return [
            Tokenizer.train(train, 90, pattern="none", unit="char", special_tokens=()),
            Tokenizer.train(train, 320, pattern="gpt2", unit="char", unknown="bytes", special_tokens=()),
            Tokenizer.train(train, 80, pattern=r"\w+", unit="word", lowercase=True, special_tokens=()),
            Tokenizer.train(train, 330, unit="word", unknown="bytes", special_tokens=()),
        ]


@PROP
@given(text=st.text(alphabet=st.characters(codec="utf-8", categories=("L", "N", "P", "Zs", "Cc")), max_size=120))
def test_char_and_word_ids_equal_the_reference_on_any_text(char_and_word, text):
    """Native encoding (characters first, <unk> / byte fallback) == bpe_reference, id for id."""
    for tok in char_and_word:
        expected = ref.encode_ordinary(
            ref.utf8(text), tok.mergeable_ranks, tok.pattern, tok.unit, tok._unknown_id, tok.lowercase
        )
        assert tok.encode_ordinary(text) == expected, tok


def test_reference_unit_learner_equals_the_tokenizer(shakespeare_text):
    """bpe_reference.learn_unit_merges (the spec, its own alphabet) == what training runs."""
    text = shakespeare_text[:4_000]
    for unit, pattern in (("char", "gpt2"), ("word", "none")):
        tok = Tokenizer.train([text], 150, pattern=pattern, unit=unit, special_tokens=())
        counts = ref.count_pieces([text], pattern)
        alphabet, merges, merge_counts = ref.learn_unit_merges(
            ref.word_counts(counts, pattern) if unit == "word" else counts, unit, len(tok.merges)
        )
        assert (merges, merge_counts) == (tok.merges, tok.merge_counts)
        assert ref.ranks_from_merges(merges, alphabet) == tok.mergeable_ranks


# ---------------------------------------------------------------- round-trips
@pytest.fixture(scope="module")
def lossless(shakespeare_text, multilingual_text):
    train = [shakespeare_text[:30_000], multilingual_text[:2_000]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [
            Tokenizer.train(train, 600, pattern="none"),
            Tokenizer.train(train, 600, pattern=r"\p{L}+|\s+"),
            Tokenizer.train(train, 1200, pattern="cl100k", unit="char", unknown="bytes"),
            Tokenizer.train(train, 1000, pattern="none", unit="char", unknown="bytes"),
        ]


@PROP
@given(text=st.text(max_size=300))
def test_lossless_units_roundtrip_any_str(lossless, text):
    for tok in lossless:
        ids = tok.encode_ordinary(text)
        assert tok.decode(ids) == ref.utf8(text).decode("utf-8"), tok
        assert tok.encode_ordinary_batch([text, text[:7]], num_threads=2) == [ids, tok.encode_ordinary(text[:7])]


@PROP
@given(data=st.binary(max_size=200))
def test_char_unit_with_byte_fallback_roundtrips_any_bytes(lossless, data):
    tok = lossless[2]
    assert tok.decode_bytes(tok.encode_bytes(data)) == data


@PROP
@given(text=st.text(alphabet="abcdefghij \n.,!A", max_size=200))
@pytest.mark.filterwarnings("ignore:the corpus gave only")
def test_char_unit_with_unk_roundtrips_its_alphabet_and_word_unit_keeps_the_words(text):
    train = ["abcdefghij \n.,!A" * 3, "a bad cafe faced a dead bee. hi!"]
    char = Tokenizer.train(train, 40, pattern="none", unit="char", special_tokens=())
    assert char.decode(char.encode(text)) == text
    word = Tokenizer.train(train, 40, unit="word", lowercase=True, special_tokens=())
    assert word.decode(word.encode(text)) == "".join(w.lower() + " " for w in text.split())


# ---------------------------------------------------------------- policies, files, refusals
@pytest.mark.filterwarnings("ignore:the corpus gave only")
def test_unseen_characters_unk_or_byte_fallback():
    unk = Tokenizer.train(["abc abc"], 10, unit="char", pattern="none", special_tokens=())
    assert unk.encode("abé") == [unk.encode_single_token("ab"), unk.special_tokens["<unk>"]]
    assert unk.decode(unk.encode("abé")) == "ab<unk>"
    fallback = Tokenizer.train(["abc abc"], 300, unit="char", pattern="none", unknown="bytes", special_tokens=())
    # " abc", merges, the other bytes
    assert len(fallback.mergeable_ranks) == 4 + len(fallback.merges) + 252 and not fallback.special_tokens
    assert [fallback.decode_single_token_bytes(i) for i in fallback.encode("abé")] == [b"ab", b"\xc3", b"\xa9"]


@pytest.mark.parametrize("unit", ["char", "word"])
def test_save_load_restores_the_unit(tmp_path, shakespeare_text, unit):
    tok = Tokenizer.train([shakespeare_text[:20_000]], 200, unit=unit, pattern=r"\w+|\W", lowercase=unit == "word")
    tok.save(str(tmp_path / unit))
    back = Tokenizer.load(str(tmp_path / unit))
    assert (back.unit, back.unknown, back.lowercase, back.pattern) == (unit, "unk", unit == "word", r"\w+|\W")
    assert back.merges == tok.merges and back.merge_counts == tok.merge_counts
    text = shakespeare_text[-2_000:] + " Zürich"
    assert back.encode(text) == tok.encode(text) and back.decode(back.encode(text)) == tok.decode(tok.encode(text))
    meta = back.metadata()
    assert meta["unit"] == unit and meta["lossy"] is (unit == "word") and meta["pattern_str"] == r"\w+|\W"


@pytest.mark.filterwarnings("ignore:the corpus gave only")
def test_refusals_name_the_input(tmp_path):
    with pytest.raises(InputError, match=r"pattern '\(' is not a valid regular expression"):
        Tokenizer.train(["x"], 300, pattern="(")
    with pytest.raises(InputError, match=r"'gpt2', 'cl100k' or 'o200k', got 'gpt4'"):
        Tokenizer.train(["x"], 300, pattern="gpt4")
    with pytest.raises(InputError, match=r"unknown unit 'bpe'"):
        Tokenizer.train(["x"], 300, unit="bpe")
    with pytest.raises(InputError, match=r"needs its 3 characters \+ 1 special token\(s\), so at least 4"):
        Tokenizer.train(["abc"], 3, unit="char", special_tokens=())
    with pytest.raises(InputError, match="lowercase"):
        Tokenizer.train(["abc"], 30, unit="char", lowercase=True)
    tok = Tokenizer.train(["abc abd"], 12, unit="char")
    # HF's tokenizer.json carries a char-level BPE (tests/test_unit_exports.py); byte-level formats refuse it
    for export in (lambda: tok.to_gpt2(str(tmp_path / "g")), tok.to_tiktoken):
        with pytest.raises(InputError, match=r"cannot carry a char-level tokenizer"):
            export()
    with pytest.raises(InputError, match=r"pattern='none'"):
        Tokenizer.train(["abc abd"], 260, pattern="none").to_tiktoken()


def test_byte_level_ids_unchanged_by_the_unit_machinery(shakespeare_text):
    """Byte-level training still gives minbpe's and the reference's merges (the native symbol
    learner is not used for bytes; its result on the 256-byte alphabet is the same)."""
    text = shakespeare_text[:10_000]
    tok = Tokenizer.train([text], 300, pattern="gpt2", special_tokens=())
    counts = ref.count_pieces([text], "gpt2")
    symbols = {tuple(p): c for p, c in counts.items()}
    assert (tok.merges, tok.merge_counts) == ref.learn_symbol_merges(ref.BYTES, symbols, 44)
    assert tok.merges == ref.learn_merges(counts, 44)


def test_cli_offers_the_units_and_refuses_a_bad_pattern(tmp_path, capsys):
    from flows.cli import main

    with pytest.raises(SystemExit):
        main(["tokenizer", "train", "--help"])
    out = capsys.readouterr().out
    for flag in ("--unit {byte,char,word}", "--unknown {unk,bytes}", "--lowercase", "--pattern PATTERN"):
        assert flag in out
    assert "lossy" in out
    assert main(["tokenizer", "train", "--pattern", "(", "--unit", "char", "--store", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and err[0].startswith("tokenmill: error: --pattern (:")
        and "not a valid regular expression" in err[0]
    ), err


def test_stages_train_each_unit_and_version_ids_name_it(tmp_path, shakespeare_text):
    """The counting and tokenizer stages: the pattern (here a regex) and the unit reach the
    tokenizer and its manifest; unit fields enter version ids only when not byte-level's."""
    from pipeline_lib import ArtifactStore, stages
    from pipeline_lib.corpus import CorpusConfig

    store = ArtifactStore(str(tmp_path / "store"))
    source = tmp_path / "corpus.txt"
    source.write_text(shakespeare_text[:30_000], encoding="utf-8")
    cfg = CorpusConfig(sources=(str(source),), n_shards=1)
    corpus = stages.shard_corpus(store, stages.download_corpus(store, cfg), cfg)
    count = stages.CountConfig(pattern=r"\w+|\W")
    stages.count_shard(store, corpus, 0, count)
    counts = stages.reduce_counts(store, corpus, count)
    byte, char, word = (
        stages.TokenizerConfig(vocab_size=300),
        stages.TokenizerConfig(vocab_size=300, unit="char"),
        stages.TokenizerConfig(300, unit="word", lowercase=True),
    )
    assert "unit" not in byte.params() and char.params()["unit"] == "char" and word.params()["lowercase"] is True
    assert len({stages.tokenizer_version(counts, c) for c in (byte, char, word)}) == 3
    for config in (char, word):
        ref_ = stages.learn_tokenizer(store, counts, config)
        meta = store.manifest(ref_.kind, ref_.version)["meta"]
        assert (meta["unit"], meta["pattern"], meta["lossy"], meta["vocab_size"]) == (
            config.unit,
            r"\w+|\W",
            config.unit == "word",
            300,
        )
        tok = stages.load_tokenizer(store, ref_)
        assert (
            tok.unit == config.unit and tok.lowercase == config.lowercase and len(tok.merge_counts) == len(tok.merges)
        )
    with pytest.raises(InputError, match="vocab_size=100 is too small"):
        stages.TokenizerConfig(vocab_size=100)
    assert stages.TokenizerConfig(vocab_size=100, unit="char").vocab_size == 100


def test_char_training_without_split_grows_linearly(shakespeare_text):
    """One huge piece (no split): 4x the text costs at most 5x the CPU time to train (the
    alphabet, the symbol arrays and the learner's block chains). Encoding it runs the same
    bucket queue as byte-level BPE, whose growth tests/test_growth.py checks."""
    import statistics
    import time

    def train(t: str) -> Tokenizer:
        return Tokenizer.train([t], 400, pattern="none", unit="char", workers=1)

    small, big = shakespeare_text[: 1 << 17], shakespeare_text[: 1 << 19]
    train(small), train(big)
    times: dict[str, list[float]] = {small: [], big: []}
    for _ in range(3):
        for text in (small, big):
            t0 = time.thread_time()
            train(text)
            times[text].append(time.thread_time() - t0)
    assert statistics.median(times[big]) / statistics.median(times[small]) <= 5.0
