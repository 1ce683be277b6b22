"""The BPE tutorials a learner follows, replayed with tokenmill: each figure they print, computed.

* character-level BPE, 300 ids on tiny Shakespeare, no split: 1.93 characters per token
  (578,590 tokens), the merges at 0, 50, 100, 150, 200 with their counts, the encoding examples;
* word BPE with an end-of-word ``</w>`` over whitespace words, decoded as the tutorials'
  decoders do (words joined by spaces);
* byte-level BPE with ``<|endoftext|>``: the bytes of "This is some text", GPT-2's ids for
  it from GPT-2's own files, and a trained vocabulary of 1,000 ids;
* word frequencies with ``</w>`` on the ``low/lower/newest/widest`` corpus;
* lowercase ``\\w+`` word BPE on the cat/rat corpus, to 50 tokens.

Tie rule: on equal counts tokenmill merges the pair whose (left, right) bytes sort first;
the tutorials' Python takes the first pair met in the text. With ``ties="first-seen"``
(``--ties first-seen``) tokenmill takes the tutorials' rule, and the walkthroughs whose
corpora are all ties (seed 002's "the cat in the hat", seed 004's cat/rat list) replay
merge for merge; under the default rule they are asserted only as far as the ties allow.
"""

from __future__ import annotations

import re
import shlex
from collections import Counter
from pathlib import Path

import pytest

from pipeline_lib import lab
from pipeline_lib.bpe_reference import END_OF_WORD
from pipeline_lib.tokenizer import ENDOFTEXT, Tokenizer, get_encoding


def tokens_of(tok: Tokenizer, text: str) -> list[str]:
    return lab.token_texts(tok, tok.encode(text))


def words_merged(tok: Tokenizer) -> set[bytes]:
    return {b.replace(END_OF_WORD, b"</w>") for b in tok.mergeable_ranks}


# --------------------------------------------------------------------------- character level, tiny Shakespeare
@pytest.fixture(scope="module")
def char300(shakespeare_text) -> Tokenizer:
    # 65 characters + 235 merges are the tutorial's 300 ids; ours also holds the <unk> id.
    return Tokenizer.train([shakespeare_text], 301, unit="char", pattern="none", special_tokens=())


def test_character_level_300_ids_compress_tiny_shakespeare_1_93x(char300, shakespeare_text):
    assert len(shakespeare_text) == 1_115_394
    alphabet = sorted(set(shakespeare_text))
    assert len(alphabet) == 65 and len(char300.merges) == 235 and len(char300.mergeable_ranks) == 300
    n = len(char300.encode_ordinary(shakespeare_text))
    assert abs(n - 578_590) / 578_590 < 0.01
    assert abs(len(shakespeare_text) / n - 1.93) / 1.93 < 0.01
    # The tutorial's log every 50 merges (these have no tie around them).
    logged = {r["merge"]: (r["left"], r["right"], r["token"], r["count"]) for r in lab.merge_log(char300, 50)}
    assert logged[0] == ("e", "␣", "e␣", 27_643)
    assert logged[50] == ("l", "i", "li", 2_358)
    assert logged[100] == ("w", "ith", "with", 1_258)
    assert logged[150] == ("a", "y␣", "ay␣", 849)
    assert logged[200] == ("s", "ha", "sha", 636)
    # Its first merge's count, recounted here: 'e' followed by ' ' in the text.
    assert logged[0][3] == shakespeare_text.count("e ")


def test_character_level_tokens_as_the_tutorial_shows_them(char300):
    report = lab.inspect_tokenizer(char300, 10)
    assert [e["text"] for e in report["shortest"]] == ["↵", "␣", "!", "$", "&", "'", ",", "-", ".", "3"]
    longest = {e["text"] for e in report["longest"]}
    assert {"␣this␣", "␣that␣", "␣the␣", "␣and␣", ",↵And␣"} <= longest
    assert char300.encode("To be or not to be") == [227, 197, 77, 1, 136, 92, 178]
    assert tokens_of(char300, "To be or not to be") == ["To␣", "be␣", "or", "␣", "not␣", "to␣", "be"]
    assert char300.encode("ROMEO: Wherefore art thou") == [30, 27, 25, 17, 27, 10, 1, 169, 72, 43, 109, 65, 81, 67, 185]
    assert tokens_of(char300, "the king") == ["the␣", "k", "ing"]
    assert char300.decode(char300.encode("the king")) == "the king"


def test_character_level_first_seen_reorders_only_ties(char300, shakespeare_text):
    # The tutorial's own tie rule: the same 235 tokens and 578,590 tokens of text; only
    # equal-count neighbours learned in another order (ids shift with them).
    first = Tokenizer.train([shakespeare_text], 301, unit="char", pattern="none", special_tokens=(), ties="first-seen")
    assert set(first.mergeable_ranks) == set(char300.mergeable_ranks)
    reordered = sum(a != b for a, b in zip(first.merges or [], char300.merges or []))
    assert 0 < reordered < 20
    assert len(first.encode_ordinary(shakespeare_text)) == len(char300.encode_ordinary(shakespeare_text))
    logged = {r["merge"]: (r["token"], r["count"]) for r in lab.merge_log(first, 50)}
    assert logged[0] == ("e␣", 27_643) and logged[100] == ("with", 1_258) and logged[200] == ("sha", 636)


# --------------------------------------------------------------------------- word BPE with </w>
def test_word_bpe_with_end_of_word(shakespeare_text):
    tok = Tokenizer.train([shakespeare_text], 500, unit="word", pattern="none", special_tokens=())
    words = Counter(shakespeare_text.split())
    pairs: Counter[tuple[str, str]] = Counter()
    for word, n in words.items():
        symbols = [*word, "</w>"]
        for pair in zip(symbols, symbols[1:]):
            pairs[pair] += n
    ((best, count),) = pairs.most_common(1)
    first = lab.merge_log(tok, 1)[0]
    assert (first["left"], first["right"], first["count"]) == (best[0], best[1], count) == ("e", "</w>", 29_077)
    alphabet = {c for w in words for c in w}
    assert len(tok.mergeable_ranks) == len(alphabet) + 1 + len(tok.merges)  # characters, </w>, merges
    text = "Once upon a time there was a little girl."
    ids = tok.encode(text)
    assert all(t.endswith("</w>") for t in lab.token_texts(tok, ids) if t.endswith("</w>"))
    assert sum(t.endswith("</w>") for t in lab.token_texts(tok, ids)) == len(text.split())  # one end per word
    assert tok.decode(ids) == " ".join(text.split()) + " "  # the tutorials' decoders: words joined by spaces
    assert tok.lossy and tok.decode(tok.encode("a  b\n\tc")) == "a b c "
    sample = shakespeare_text[:10_000]
    assert len(sample) / len(tok.encode(sample)) > 2  # word BPE at 500 ids: over two characters per token


# --------------------------------------------------------------------------- byte level with <|endoftext|>
def test_byte_level_with_endoftext_and_gpt2s_ids(shakespeare_text):
    text = "This is some text"
    bytes_only = Tokenizer.train([shakespeare_text[:1000]], 257, special_tokens=(ENDOFTEXT,))
    assert (
        bytes_only.encode(text)
        == list(text.encode())
        == [84, 104, 105, 115, 32, 105, 115, 32, 115, 111, 109, 101, 32, 116, 101, 120, 116]
    )
    gpt2 = get_encoding("gpt2")  # GPT-2's encoder.json + vocab.bpe
    assert gpt2.encode(text) == [1212, 318, 617, 2420]
    assert [gpt2.decode_single_token_bytes(i) for i in (1212, 318, 617, 2420)] == [b"This", b" is", b" some", b" text"]
    # space + letter, GPT-2's first merges
    assert [gpt2.decode_single_token_bytes(i) for i in (256, 257)] == [b" t", b" a"]
    assert gpt2.encode("the end<|endoftext|>", allowed_special={ENDOFTEXT})[-1] == 50256

    tok = Tokenizer.train([shakespeare_text[:100_000]], 1000, pattern="gpt2", special_tokens=(ENDOFTEXT,))
    assert tok.vocab_size == 1000 and len(tok.merges) == 743 and tok.special_tokens == {ENDOFTEXT: 999}
    sentence = "Jack embraced beauty through art and life."
    ids = tok.encode(sentence)
    assert len(sentence) == 42 and len(ids) < 42
    assert tok.decode(ids) == sentence and "".join(lab.token_texts(tok, ids)).replace("␣", " ") == sentence
    assert tok.encode("the end<|endoftext|>", allowed_special={ENDOFTEXT})[-1] == 999
    assert tok.decode(tok.encode("This is some text.")) == "This is some text."


# --------------------------------------------------------------------------- low / lower / newest / widest
LOW_CORPUS = ["low low low low low", "lower lower", "newest newest newest", "widest widest"]


def test_word_frequencies_and_merges_on_low_lower_newest_widest():
    freq = Counter(" ".join(LOW_CORPUS).split())
    assert freq == {"low": 5, "lower": 2, "newest": 3, "widest": 2}
    # 11 symbols, 10 merges, <unk>
    tok = Tokenizer.train(LOW_CORPUS, 11 + 10 + 1, unit="word", pattern="none", special_tokens=())
    assert len(tok.mergeable_ranks) - len(tok.merges) == 11  # l o w e r n s t i d and </w>
    log = [(r["left"], r["right"], r["count"]) for r in lab.merge_log(tok, 1)]
    # l+o and lo+w occur in low and lower, e+s and es+t in newest and widest.
    lo, es = freq["low"] + freq["lower"], freq["newest"] + freq["widest"]
    assert (
        log[:4]
        == [("l", "o", lo), ("lo", "w", lo), ("e", "s", es), ("es", "t", es)]
        == [("l", "o", 7), ("lo", "w", 7), ("e", "s", 5), ("es", "t", 5)]
    )
    assert tokens_of(tok, "newest") == ["newest</w>"]  # fully merged
    assert tokens_of(tok, "lowest") == ["low", "est</w>"]  # "low" is known, "lowest" is not a learned word
    assert {b"low</w>", b"newest</w>"} <= words_merged(tok)


# --------------------------------------------------------------------------- cat / rat, lowercase \w+ words
CAT_CORPUS = [
    "the cat sat on the mat",
    "the cat saw the rat",
    "the rat ran from the cat",
    "cats and rats are animals",
    "animals run and cats catch rats",
]


def test_cat_rat_corpus_to_50_tokens():
    # 50 tokens: 16 letters and </w>, 33 merges (the tutorial's count), and our <unk> id beside them.
    tok = Tokenizer.train(CAT_CORPUS, 51, unit="word", pattern=r"\w+", lowercase=True, special_tokens=())
    assert len(tok.mergeable_ranks) == 50 and len(tok.mergeable_ranks) - len(tok.merges) == 17 and len(tok.merges) == 33
    log = lab.merge_log(tok, 1)
    words = " ".join(CAT_CORPUS).split()
    assert (
        (log[0]["left"], log[0]["right"], log[0]["count"])
        == ("a", "t", sum(w.count("at") for w in words))
        == ("a", "t", 12)
    )
    counts = [r["count"] for r in log]
    assert counts == sorted(counts, reverse=True)  # the best pair's count never grows
    # The words the tutorial ends with as single tokens (the order between equal counts differs).
    assert {
        b"the</w>",
        b"cat</w>",
        b"cats</w>",
        b"rats</w>",
        b"rat</w>",
        b"and</w>",
        b"animals</w>",
        b"from</w>",
    } <= words_merged(tok)
    assert tokens_of(tok, "the cat catches rats") == ["the</w>", "cat</w>", "c", "atch", "e", "s</w>", "rats</w>"]
    assert tok.encode("The CAT") == tok.encode("the cat")  # lowercased
    assert tok.decode(tok.encode("the cat catches rats")) == "the cat catches rats "


# --------------------------------------------------------------------------- first-seen ties: seeds 002 and 004 merge
# for merge
def test_the_cat_in_the_hat_walkthrough_first_seen():
    # Byte level, the whole text one piece: th (256), the (257), "the " (258), as the walkthrough says.
    text = "the cat in the hat"
    tok = Tokenizer.train([text], 0, pattern="none", special_tokens=(), ties="first-seen", n_merges=3)
    assert tok.merges == [(ord("t"), ord("h"), 256), (256, ord("e"), 257), (257, ord(" "), 258)]
    assert [r["count"] for r in lab.merge_log(tok, 1)] == [2, 2, 2]
    assert tok.encode(text) == [258, *b"cat in ", 258, *b"hat"]  # "<the , 258>cat in <the , 258>hat"
    # Byte order picks "at" (the smallest of the pairs met twice) first instead.
    assert Tokenizer.train([text], 0, pattern="none", special_tokens=(), n_merges=1).merges == [
        (ord("a"), ord("t"), 256)
    ]


# Seed 004's "Merging:" lines, in order: 33 merges from 17 symbols to 50.
CAT_MERGES = (
    "a t|e </w>|at </w>|t h|th e</w>|s </w>|a n|at s</w>|c at</w>|n </w>|r at</w>|c ats</w>|an d|and </w>|r "
    "ats</w>|an i|ani m|anim a|"
    "anima l|animal s</w>|s at</w>|o n</w>|m at</w>|s a|sa w|saw </w>|r an|ran </w>|f r|fr o|fro m|from </w>|a r"
)


def test_cat_rat_merges_first_seen_replay_the_tutorial():
    plans = []
    tok = Tokenizer.train(
        CAT_CORPUS,
        0,
        unit="word",
        pattern=r"\w+",
        lowercase=True,
        special_tokens=(),
        ties="first-seen",
        n_merges=33,
        on_plan=plans.append,
    )
    assert [(r["left"], r["right"]) for r in lab.merge_log(tok, 1)] == [
        tuple(m.split(" ")) for m in CAT_MERGES.split("|")
    ]
    # "Initial vocabulary size: 17": 16 letters and </w>; ours adds <unk> beside the 50.
    assert plans[0].line() == "initial alphabet 17, special 1, merges to learn 33, target 51"
    assert len(tok.mergeable_ranks) == 50


def test_first_seen_through_the_pipeline_stage(tmp_path):
    # The stage trains from the sorted counts file; first-seen takes the corpus's order back.
    from pipeline_lib import ArtifactStore, stages
    from pipeline_lib.corpus import CorpusConfig

    store = ArtifactStore(str(tmp_path / "store"))
    source = tmp_path / "cats.txt"
    source.write_text("\n".join(CAT_CORPUS) + "\n", encoding="utf-8")
    cfg = CorpusConfig(sources=(str(source),), n_shards=1)
    corpus = stages.shard_corpus(store, stages.download_corpus(store, cfg), cfg)
    count = stages.CountConfig(pattern=r"\w+")
    stages.count_shard(store, corpus, 0, count)
    counts = stages.reduce_counts(store, corpus, count)
    config = stages.TokenizerConfig(
        unit="word", lowercase=True, special_tokens=(), min_frequency=1, ties="first-seen", merges=33
    )
    ref = stages.learn_tokenizer(store, counts, config)
    tok = stages.load_tokenizer(store, ref)
    assert [(r["left"], r["right"]) for r in lab.merge_log(tok, 1)] == [
        tuple(m.split(" ")) for m in CAT_MERGES.split("|")
    ]
    meta = store.manifest(ref.kind, ref.version)["meta"]
    assert (
        meta["plan"] == "initial alphabet 17, special 1, merges to learn 33, target 51" and meta["ties"] == "first-seen"
    )
    # The default rule is another version, with other merges.
    default = stages.learn_tokenizer(
        store,
        counts,
        stages.TokenizerConfig(unit="word", lowercase=True, special_tokens=(), min_frequency=1, merges=33),
    )
    assert default.version != ref.version and stages.load_tokenizer(store, default).merges != tok.merges


# --------------------------------------------------------------------------- docs/tutorial.md, as printed
DOC = Path(__file__).resolve().parent.parent / "docs" / "tutorial.md"


def doc_commands() -> list[tuple[str, list[str]]]:
    """Every ``$ command`` of the console blocks of docs/tutorial.md with the lines it prints."""
    out: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                out.append((line[2:], []))
            elif out and line.strip():
                out[-1][1].append(line)
    return out


def matches(printed: list[str], expected: list[str]) -> bool:
    """`printed` equals `expected`, where a ``...`` line of `expected` stands for any lines."""
    if "..." not in expected:
        return printed == expected
    gap = expected.index("...")
    head, tail = expected[:gap], expected[gap + 1 :]
    return (
        printed[: len(head)] == head
        and (not tail or printed[-len(tail) :] == tail)
        and len(printed) >= len(head) + len(tail)
    )


OFFLINE = ("--tokenizer gpt2", "--tokenizer cl100k_base", "compare --text", "lab corpora --copy")


def test_the_docs_offline_commands_print_what_the_docs_show(tmp_path, capsys, monkeypatch):
    from flows.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "100")
    ran = 0
    for command, expected in doc_commands():
        if not command.startswith("tokenmill ") or not any(k in command for k in OFFLINE):
            continue
        assert main(shlex.split(command)[1:]) == 0, command
        printed = capsys.readouterr().out.splitlines()
        assert matches([p for p in printed if p.strip()], expected), (command, printed)
        ran += 1
    assert ran >= 7


def test_the_docs_first_seen_walkthroughs_replay(prefect_harness, tmp_path, capsys, monkeypatch):
    # The training commands of sections 5 and 8, run as the CLI runs them (its parser and
    # configs, the same flow); their plain lines are what the docs show.
    import logging

    from flows.cli import TOKENIZER_CONFIGS, build_parser, configs_from_args, main
    from flows.pipeline import tokenizer_train_flow

    monkeypatch.chdir(tmp_path)
    main(["lab", "corpora", "--copy", "."])
    capsys.readouterr()
    commands = dict(doc_commands())
    trained = [c for c in commands if c.startswith("tokenmill tokenizer train") and "--ties first-seen" in c]
    assert len(trained) == 2
    for command in trained:
        argv = shlex.split(command)[1:]
        args = build_parser(argv).parse_args(argv)
        records: list[logging.LogRecord] = []
        handler = logging.Handler(logging.INFO)
        handler.emit = records.append  # type: ignore[method-assign]
        run_logger = logging.getLogger("prefect")
        level = run_logger.level
        run_logger.addHandler(handler)
        run_logger.setLevel(logging.INFO)
        try:
            tokenizer_train_flow(
                **configs_from_args(args, TOKENIZER_CONFIGS),
                store=args.store,
                log_merges=args.log_merges,
                trace=args.trace,
            )
        finally:
            run_logger.removeHandler(handler)
            run_logger.setLevel(level)
        plain = [r.getMessage() for r in records if getattr(r, "plain", False)]
        assert matches(plain, commands[command]), (command, plain)
    for command in (
        'tokenmill tokenizer encode --store ./cat-first --trace --text "the cat"',
        "tokenmill tokenizer merges --store ./hat-store",
    ):
        assert main(shlex.split(command)[1:]) == 0
        assert capsys.readouterr().out.splitlines() == commands[command], command
