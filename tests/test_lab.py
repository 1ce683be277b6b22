"""The tokenizer lab: drawing tokens, the special-token error, inspecting, comparing (pipeline_lib/lab.py, the CLI)."""

from __future__ import annotations

import json
import re
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.cli import main
from pipeline_lib import lab
from pipeline_lib.errors import InputError
from pipeline_lib.tokenizer import Tokenizer, get_encoding

ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def tok(shakespeare_text) -> Tokenizer:
    return Tokenizer.train([shakespeare_text[:200_000]], 512, pattern="gpt2")


@pytest.fixture(scope="module")
def saved(tok, tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("tok") / "tok")
    tok.save(path)
    return path


def _cells(lines: list[str]) -> list[tuple[str, str]]:
    """(text, id) cells back from the plain drawing: pairs of rows split at ``|``."""
    out = []
    for top, bottom in zip(lines[0::2], lines[1::2]):
        out += list(zip(top.strip("|").split("|"), bottom.strip("|").split("|")))
    return out


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab c\n\tdé—好"), min_size=1, max_size=60), st.integers(12, 100))
def test_drawing_shows_every_token_and_its_id(tok, text, width):
    ids = tok.encode(text)
    lines = lab.show_tokens(tok, text, ids, width=width).splitlines()
    cells = _cells(lines[:-1])
    assert [int(i) for _, i in cells] == ids
    # split characters marked
    shown = lab.mark_split_characters([tok.decode_single_token_bytes(i) for i in ids], lab.token_texts(tok, ids))
    assert [t.rstrip(" ") for t, _ in cells] == [t.rstrip(" ") for t in shown]
    assert all(len(line) <= max(width, max(len(c) for c, _ in cells) + 2) for line in lines[:-1])
    # Whitespace is visible: no raw space, tab or newline inside a token's text.
    assert not any(re.search(r"[\t\n]", t) or t.strip(" ") != t.rstrip(" ").lstrip(" ") for t, _ in cells)


def test_drawing_in_colour_has_no_bars_and_the_same_cells(tok):
    text = "To be, or not to be:\n\tthat is the question."
    ids = tok.encode(text)
    plain = lab.show_tokens(tok, text, ids, width=200)
    coloured = lab.show_tokens(tok, text, ids, width=200, colour=True)
    assert "\x1b[48;5;" in coloured and "|" not in ANSI.sub("", coloured)
    assert ANSI.sub("", coloured).replace(" ", "") == plain.replace("|", "").replace(" ", "")


def test_compression_line(tok):
    text = "the king and the queen"
    shown = lab.show_tokens(tok, text, tok.encode(text)).splitlines()[-1]
    n = len(tok.encode(text))
    assert shown.startswith(
        f"{n} tokens for 22 characters (22 bytes): {22 / n:.2f} bytes/token, {22 / n:.2f} chars/token"
    )
    assert "␣ ' '" in shown


def test_special_tokens_are_refused_with_the_flag_that_allows_them(tok):
    text = "one<|endoftext|>two"
    with pytest.raises(
        InputError,
        match=r"--text holds the special token '<\|endoftext\|>' \(at character "
        r"3\).*--allow-special '<\|endoftext\|>'",
    ):
        lab.check_special_tokens(tok, text, [], "--text")
    with pytest.raises(InputError, match="not a special token of this tokenizer"):
        lab.check_special_tokens(tok, text, ["<|nope|>"], "--text")
    ids = tok.encode(text, allowed_special=lab.check_special_tokens(tok, text, ["<|endoftext|>"], "--text"))
    assert ids == tok.encode("one") + [tok.eot_token] + tok.encode("two")
    assert lab.check_special_tokens(tok, text, ["all"], "--text") == "all"


def test_encode_cli_special_token_error_and_show(tok, saved, capsys):
    assert main(["tokenizer", "encode", "--tokenizer", saved, "--text", "a <|endoftext|> b"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and err[0].startswith("tokenmill: error: --text holds the special token '<|endoftext|>'")
        and "--allow-special" in err[0]
    )
    assert (
        main(
            [
                "tokenizer",
                "encode",
                "--tokenizer",
                saved,
                "--text",
                "a <|endoftext|> b",
                "--allow-special",
                "<|endoftext|>",
                "--show",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert "<|endoftext|>" in out[0] and "511" in out[1]  # the special token and its id (after 256 bytes + 255 merges)
    n = len(tok.encode("a <|endoftext|> b", allowed_special="all"))
    assert out[-1].startswith(f"{n} tokens for 17 characters (17 bytes): {17 / n:.2f} bytes/token")


def test_inspect(tok, shakespeare_text):
    from pipeline_lib.tokenizer import count_documents

    pieces, counts = count_documents([shakespeare_text[:200_000].encode()], "gpt2", workers=1).to_arrays()
    report = lab.inspect_tokenizer(tok, 5, (pieces, counts))
    assert [e["id"] for e in report["shortest"]] == [0, 1, 2, 3, 4]
    assert report["longest"][0]["text"] == lab.visible(max((b for b in tok.mergeable_ranks), key=len).decode())
    assert [e["id"] for e in report["first"]] == [256, 257, 258, 259, 260] and report["last"][-1]["id"] == 510
    assert sum(report["per_length"].values()) == len(tok.mergeable_ranks)
    seen = lab.token_occurrences(tok, pieces, counts)
    assert sum(seen) == len(tok.encode_ordinary(shakespeare_text[:200_000]))  # every token of the training text, once
    assert report["never_used"]["count"] == sum(1 for m in tok.merges if seen[m[2]] == 0)
    text = lab.inspect_text(report)
    assert "never used in training" in text and "tokens per length" in text


def test_inspect_cli_knows_the_training_counts_from_the_store(tmp_path, shakespeare_text, capsys):
    from pipeline_lib import ArtifactStore, stages
    from pipeline_lib.corpus import CorpusConfig

    store = ArtifactStore(str(tmp_path / "store"))
    source = tmp_path / "corpus.txt"
    source.write_text(shakespeare_text[:30_000], encoding="utf-8")
    cfg = CorpusConfig(sources=(str(source),), n_shards=1)
    corpus = stages.shard_corpus(store, stages.download_corpus(store, cfg), cfg)
    stages.count_shard(store, corpus, 0, stages.CountConfig())
    stages.learn_tokenizer(
        store, stages.reduce_counts(store, corpus, stages.CountConfig()), stages.TokenizerConfig(vocab_size=400)
    )
    assert main(["tokenizer", "inspect", "--store", store.url, "--json", "--top", "3"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["vocab_size"] == 400 and len(report["longest"]) == 3
    assert report["never_used"] is not None and report["never_used"]["count"] >= 0
    assert main(["tokenizer", "inspect", "--store", store.url, "--top", "0"]) == 2
    assert capsys.readouterr().err.startswith("tokenmill: error: --top 0")


def test_compare_measures_every_row(shakespeare_text):
    config = lab.CompareConfig(vocab_sizes=(300, 600), production=("gpt2",), hf=True)
    multilingual = (
        "### UDHR [eng] English (x)\nAll human beings are born free.\n### UDHR [fra] French (x)\nTous les "
        "êtres humains naissent libres.\n"
    )
    result = lab.compare(shakespeare_text[:60_000], config, "sample", multilingual)
    rows = {r["name"]: r for r in result["rows"]}
    heldout = shakespeare_text[:60_000][-result["heldout_chars"] :]
    assert rows["character level"]["tokens"] == len(heldout) and rows["character level"]["chars_per_token"] == 1.0
    assert rows["word level"]["tokens"] == len(lab.WORD_PIECES.findall(heldout))
    ours300, ours600 = rows["ours byte cl100k 300"], rows["ours byte cl100k 600"]
    assert 1 < ours300["chars_per_token"] < ours600["chars_per_token"] < rows["gpt2"]["chars_per_token"]
    assert rows["gpt2"]["vocab_size"] == 50257 and rows["gpt2"]["embedding_params"] == 50257 * 768
    # the same algorithm, other ties
    assert abs(rows["HF byte-level BPE 600"]["chars_per_token"] - ours600["chars_per_token"]) < 0.1
    assert all(r["mb_per_s"] > 0 for r in result["rows"] if r["family"] not in ("character level", "word level"))
    assert [f["text"] for f in result["fertility"]] == ["eng English", "fra French"]
    english = "All human beings are born free."
    assert result["fertility"][0]["gpt2"] == len(get_encoding("gpt2").encode(english)) / 6
    md = lab.compare_text(result, markdown=True)
    assert md.count("\n| ours byte cl100k") == 2 and "### Fertility per language" in md


def test_lab_options_come_from_the_config_and_bad_values_are_one_line(capsys):
    from flows import cli
    from pipeline_lib.config import fields_of

    args = cli.build_parser(["compare"]).parse_args(
        ["compare", "--vocab-sizes", "64,128", "--units", "word", "--no-hf", "--production", "none"]
    )
    config = cli.configs_from_args(args, cli.COMPARE_CONFIGS)["compare"]
    assert config == lab.CompareConfig(vocab_sizes=(64, 128), units=("word",), hf=False, production=())
    assert all(f.description and not f.description.endswith(".") for f in fields_of(lab.CompareConfig))
    assert main(["tokenizer", "train", "--log-merges", "-1"]) == 2
    assert main(["tokenizer", "inspect", "--tokenizer", "/no/such/dir"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line]
    assert err == [
        "tokenmill: error: --log-merges -1: give a step of at least 1 (0: no merge log)",
        "tokenmill: error: --tokenizer /no/such/dir: not a saved tokenizer directory (no tokenmill.json there); give "
        "one, or a REF in the store (latest:tokenizer)",
    ]


def test_compare_says_what_it_left_out(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # HF tokenizers not installed
    assert lab.hf_bpe("some text to train on", [300]) == (
        [],
        "HF tokenizers is not installed (pip install tokenizers): its rows are left out",
    )
    found, notes = lab.production(["gpt2", "cl100k_base"], {"cl100k_base": str(tmp_path / "missing.tiktoken")})
    assert [c.name for c in found] == ["gpt2"]
    assert (
        len(notes) == 1
        and notes[0].startswith("cl100k_base left out: ")
        and "--encoding-file cl100k_base=PATH" in notes[0]
    )


def test_compare_cli(tmp_path, shakespeare_text, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text(shakespeare_text[:20_000], encoding="utf-8")
    out = tmp_path / "out"
    assert (
        main(
            [
                "compare",
                "--corpus",
                str(corpus),
                "--vocab-sizes",
                "300",
                "--production",
                "none",
                "--no-hf",
                "--multilingual",
                "none",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "ours byte cl100k 300" in printed and "character level" in printed
    assert (out / "compare.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((out / "compare.json").read_text())["rows"][2]["name"] == "ours byte cl100k 300"
    assert main(["compare", "--corpus", str(corpus), "--units", "bogus"]) == 2
    assert main(["compare", "--corpus", str(tmp_path / "missing.txt")]) == 2
    assert main(["compare", "--encoding-file", "cl100k_base"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in err if line.startswith("tokenmill")] == ["tokenmill"] * 3


# --------------------------------------------------------------------------- as Prefect flows: the artifacts
def _artifacts(flow_run_id) -> dict:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return {a.key: a for a in found if a.key}


def test_compare_flow_publishes_the_table_and_the_plot(prefect_harness, tmp_path, shakespeare_text):
    from flows.lab import compare_flow

    corpus = tmp_path / "c.txt"
    corpus.write_text(shakespeare_text[:20_000], encoding="utf-8")
    config = lab.CompareConfig(vocab_sizes=(300,), units=("byte", "char"), production=(), hf=False)
    state = compare_flow(str(corpus), config, "none", out=str(tmp_path / "out"), return_state=True)
    result = state.result()
    assert [r["name"] for r in result["rows"]] == [
        "character level",
        "word level",
        "ours byte cl100k 300",
        "ours char 300",
    ]
    artifacts = _artifacts(state.state_details.flow_run_id)
    table = json.loads(artifacts["tokenizer-comparison"].data)
    assert [row["name"] for row in table] == [r["name"] for r in result["rows"]]
    assert table[2]["chars_per_token"] == round(result["rows"][2]["chars_per_token"], 3)
    report = artifacts["tokenizer-comparison-report"].data
    assert (
        report.startswith("![compression against vocabulary size](data:image/png;base64,")
        and "| ours char 300 |" in report
    )
    assert (tmp_path / "out" / "compare.md").read_text(encoding="utf-8") == lab.compare_text(result, markdown=True)


def test_tokenizer_flow_logs_every_nth_merge_with_its_count(prefect_harness, tmp_path, shakespeare_text):
    import logging

    from flows.pipeline import tokenizer_train_flow
    from pipeline_lib import ArtifactStore
    from pipeline_lib.corpus import CorpusConfig
    from pipeline_lib.counting import CountConfig
    from pipeline_lib.stages import TokenizerConfig

    source = tmp_path / "c.txt"
    source.write_text(shakespeare_text[:30_000], encoding="utf-8")
    store = str(tmp_path / "store")
    corpus = CorpusConfig(sources=(str(source),), documents="file", n_shards=1)
    config = TokenizerConfig(vocab_size=200, unit="char", special_tokens=(), min_frequency=1)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append  # type: ignore[method-assign]
    run_logger = logging.getLogger("prefect.flow_runs")  # the flow's run logger, set quieter by the suite
    level = run_logger.level
    run_logger.addHandler(handler)
    run_logger.setLevel(logging.INFO)
    try:
        state = tokenizer_train_flow(
            corpus, CountConfig(pattern="none"), config, store=store, log_merges=40, return_state=True
        )
    finally:
        run_logger.removeHandler(handler)
        run_logger.setLevel(level)
    ref = state.result()
    tok = Tokenizer.load(ArtifactStore(store).local_dir(ref.kind, ref.version))
    expected = lab.merge_log(tok, 40)
    assert [r["merge"] for r in expected] == [0, 40, 80, 120, len(tok.merges) - 1]
    # 'e' + ' ', the most frequent pair, counted here
    assert expected[0]["count"] == shakespeare_text[:30_000].count("e ")
    logged = [r.getMessage() for r in records if r.getMessage().startswith("merge ")]
    assert logged == [lab.merge_line(r) for r in expected]
    table = next(
        a for key, a in _artifacts(state.state_details.flow_run_id).items() if key.startswith("tokenizer-merge-log-")
    )
    assert json.loads(table.data) == expected


# --------------------------------------------------------------------------- traces
@settings(max_examples=40, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab c\nthe—é好"), min_size=0, max_size=40))
def test_encode_trace_ends_in_the_ids_encode_gives(tok, text):
    trace = lab.encode_trace(tok, text)
    assert [i for entry in trace for i in entry["ids"]] == tok.encode_ordinary(text)
    for entry in trace:
        # one merge per step
        assert all(len(s["parts"]) == len(entry["start"]) - k - 1 for k, s in enumerate(entry["steps"]))


def test_encode_trace_of_char_and_word_units(shakespeare_text):
    char = Tokenizer.train([shakespeare_text[:20_000]], 120, unit="char", pattern="none", special_tokens=())
    word = Tokenizer.train([shakespeare_text[:20_000]], 120, unit="word", special_tokens=())
    for t in (char, word):
        text = "the king's men — zebra"
        trace = lab.encode_trace(t, text)
        assert [i for e in trace for i in e["ids"]] == t.encode_ordinary(text)
    assert "<unk>" in lab.encode_trace_text(lab.encode_trace(char, "好"))  # unseen at training
    assert lab.encode_trace(word, "the")[0]["start"] == ["t", "h", "e", "</w>"]


def test_encode_cli_takes_a_production_encoding_by_name_and_traces(capsys):
    assert main(["tokenizer", "encode", "--tokenizer", "gpt2", "--text", "This is some text"]) == 0
    assert capsys.readouterr().out == "1212 318 617 2420\n"
    assert main(["tokenizer", "encode", "--tokenizer", "cl100k_base", "--text", "This is some text", "--trace"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "piece 'This': T h i s" and out[-1].startswith("  ids ")
    assert any(re.fullmatch(r"  rank \d+: '␣' \+ 'is' -> '␣is'   ␣is", line) for line in out)


def test_encode_input_shows_the_ratio(saved, tmp_path, capsys, tok):
    source = tmp_path / "in.txt"
    source.write_text("To be, or not to be, that is the question.", encoding="utf-8")
    assert (
        main(
            ["tokenizer", "encode", "--tokenizer", saved, "--input", str(source), "--output", str(tmp_path / "ids.npy")]
        )
        == 0
    )
    n = len(tok.encode("To be, or not to be, that is the question."))
    assert capsys.readouterr().out == (
        f"{n} tokens -> {tmp_path / 'ids.npy'} (42 characters, 42 bytes: {42 / n:.2f} "
        f"chars/token, {42 / n:.2f} bytes/token)\n"
    )


def test_train_trace_replays_the_cat_in_the_hat():
    text = "the cat in the hat"
    t = Tokenizer.train([text], 0, pattern="none", special_tokens=(), ties="first-seen", n_merges=3)
    trace = lab.train_trace(t, [text.encode()], [1])
    assert [s["pieces"][0] for s in trace["steps"]] == [
        "t h e ␣ c a t ␣ i n ␣ t h e ␣ h a t",
        "th e ␣ c a t ␣ i n ␣ th e ␣ h a t",
        "the ␣ c a t ␣ i n ␣ the ␣ h a t",
        "the␣ c a t ␣ i n ␣ the␣ h a t",
    ]
    lines = lab.train_trace_text(trace).splitlines()
    assert lines[1] == "merge 0: 't' + 'h' -> 'th'   th e ␣ c a t ␣ i n ␣ th e ␣ h a t"


def test_tokenizer_flow_traces_training_plainly(prefect_harness, tmp_path):
    import logging

    from flows.console import ConsoleHandler
    from flows.pipeline import tokenizer_train_flow
    from pipeline_lib.corpus import CorpusConfig
    from pipeline_lib.counting import CountConfig
    from pipeline_lib.stages import TokenizerConfig

    source = tmp_path / "hat.txt"
    source.write_text("the cat in the hat", encoding="utf-8")
    corpus = CorpusConfig(sources=(str(source),), documents="file", n_shards=1)
    config = TokenizerConfig(special_tokens=(), min_frequency=1, ties="first-seen", merges=3)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append  # type: ignore[method-assign]
    run_logger = logging.getLogger("prefect.flow_runs")
    level = run_logger.level
    run_logger.addHandler(handler)
    run_logger.setLevel(logging.INFO)
    try:
        state = tokenizer_train_flow(
            corpus,
            CountConfig(pattern="none"),
            config,
            store=str(tmp_path / "store"),
            log_merges=1,
            trace=True,
            return_state=True,
        )
    finally:
        run_logger.removeHandler(handler)
        run_logger.setLevel(level)
    plain = [r.getMessage() for r in records if getattr(r, "plain", False)]
    assert plain[0] == "initial alphabet 256, special 0, merges to learn 3, target 259"
    assert plain[1].startswith(
        "compression on the training text: 18 characters (18 bytes) -> 12 tokens, 1.50 chars/token"
    )
    assert "merge 2: 'the' + '␣' -> 'the␣' (id 258) (count 2)" in plain
    assert "merge 0: 't' + 'h' -> 'th'   th e ␣ c a t ␣ i n ␣ th e ␣ h a t" in plain
    artifact = next(
        a for key, a in _artifacts(state.state_details.flow_run_id).items() if key.startswith("tokenizer-train-trace-")
    )
    assert "the␣ c a t ␣ i n ␣ the␣ h a t" in artifact.data
    # The console prints a plain record as its message alone.
    console = ConsoleHandler()
    lines: list[str] = []
    console.console.print = lambda message, **kw: lines.append(message)  # type: ignore[method-assign]
    console.emit(next(r for r in records if getattr(r, "plain", False)))
    assert lines == ["initial alphabet 256, special 0, merges to learn 3, target 259"]


# --------------------------------------------------------------------------- one text, many tokenizers
def test_compare_show_draws_one_text_under_every_tokenizer(saved, tok, capsys):
    text = "The cat sat."
    assert main(["compare", "--text", text, "--show", "--tokenizer", saved]) == 0
    out = capsys.readouterr().out
    heads = [line.split(":")[0] for line in out.splitlines() if re.match(r"^[\w /.-]+: \d+ tokens, ", line)]
    assert heads == ["character level", "word level", saved, "gpt2", "cl100k_base", "o200k_base"]
    assert f"{saved}: {len(tok.encode(text))} tokens" in out
    assert "|T |h  |e  |␣ |" in out and "|84|104|101|32|" in out  # characters and their code points
    assert "gpt2: 4 tokens, 3.00 chars/token" in out  # The, ␣cat, ␣sat, .
    assert main(["compare", "--show"]) == 2
    assert capsys.readouterr().err.startswith("tokenmill: error: compare --show draws one text")


def test_compare_measures_your_tokenizer_beside_the_others(tok, shakespeare_text):
    config = lab.CompareConfig(vocab_sizes=(300,), units=("byte",), production=(), hf=False)
    result = lab.compare(shakespeare_text[:30_000], config, tokenizers={"mine": tok})
    rows = {r["name"]: r for r in result["rows"]}
    assert rows["mine"]["vocab_size"] == tok.vocab_size and rows["mine"]["family"].startswith(
        "yours (byte-level BPE, gpt2 split)"
    )
    heldout = lab.split_heldout(shakespeare_text[:30_000], config.heldout_fraction)[1]
    assert rows["mine"]["tokens"] == len(tok.encode_ordinary(heldout))


# --------------------------------------------------------------------------- readability
def test_colour_cells_are_a_space_apart(tok):
    text = "To be, or not"
    ids = tok.encode(text)
    coloured = lab.show_tokens(tok, text, ids, width=200, colour=True).splitlines()
    assert ANSI.sub("", coloured[1]).split() == [str(i) for i in ids]  # ids never run together


def test_a_character_split_over_byte_tokens_is_marked():
    gpt2 = get_encoding("gpt2")
    text = "猫 好 é"
    drawn = lab.show_tokens(gpt2, text, gpt2.encode(text))
    assert drawn.splitlines()[0].replace(" ", "") == "|猫[1/3]|猫[2/3]|猫[3/3]|␣好[1/3]|好[2/3]|好[3/3]|␣é|"
    assert "X[i/n]: part i of a character split over n tokens" in drawn
    # an incomplete end stays as bytes
    assert lab.mark_split_characters([b"a", b"\xe5"], ["a", "\\xe5"]) == ["a", "\\xe5"]


def test_merges_vocab_and_decode_commands(saved, tok, capsys):
    assert main(["tokenizer", "merges", "--tokenizer", saved]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"# {saved}: {len(tok.merges or [])} merges, byte-level BPE, pattern gpt2")
    assert lines[2:] == [lab.merge_line(r) for r in lab.merge_log(tok, 1)]
    assert main(["tokenizer", "vocab", "--tokenizer", saved, "--search", " the"]) == 0
    found = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert found and all("␣the" in t for _, t in found) and ["%d" % tok.encode(" the")[0], "␣the"] in found
    assert main(["tokenizer", "vocab", "--tokenizer", saved, "--id", "65"]) == 0
    assert capsys.readouterr().out == "65\tA\n"  # byte 65
    assert main(["tokenizer", "decode", "--tokenizer", "gpt2", "--ids", "1212, 318 617 2420"]) == 0
    assert capsys.readouterr().out == "This is some text\n"
    assert main(["tokenizer", "decode", "--tokenizer", "gpt2", "--ids", "1 x"]) == 2
    assert main(["tokenizer", "merges", "--tokenizer", "gpt2"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("tokenmill: error: --ids: 'x' is not a token id") and err[1].startswith(
        "tokenmill: error: --tokenizer gpt2: keeps no merge list"
    )


def test_report_measures_your_tokenizers_on_its_held_out_shard(tmp_path, saved, tok, shakespeare_text):
    import argparse

    from flows.cli import _yours_in_report
    from pipeline_lib import ArtifactStore, stages
    from pipeline_lib.corpus import CorpusConfig
    from pipeline_lib.report import tokenizer_report

    store = ArtifactStore(str(tmp_path / "store"))
    source = tmp_path / "corpus.txt"
    source.write_text(shakespeare_text[:40_000], encoding="utf-8")
    cfg = CorpusConfig(sources=(str(source),), n_shards=2, documents="paragraph")
    corpus = stages.shard_corpus(store, stages.download_corpus(store, cfg), cfg)
    ref = tokenizer_report(store, corpus, "gpt2", [256, 300])
    args = argparse.Namespace(store=store.url, storage_option=None, tokenizer=[saved, "gpt2"])
    section = _yours_in_report(args, store, ref)
    lines = section.splitlines()
    assert lines[0].startswith("## Your tokenizers (the same held-out ")
    mine = next(line for line in lines if line.startswith(f"| {saved} | {tok.vocab_size} |"))
    assert mine and any(line.startswith("| gpt2 | 50,257 |") for line in lines)
    assert any(line.startswith("| English |") for line in lines) or "Tokens per word:" in section
