"""HF ``tokenizer.json`` files of byte-level BPE load with HF's ids; other models are refused.

The files are made by HF `tokenizers` itself (a ByteLevel BPE trained by its trainer, GPT-2
style) or in the layout of Llama 3 and Qwen 2 (a Split regex, ByteLevel without its regex,
added special tokens far above the ordinary ids), and every id is compared with what HF's
own `Tokenizer.from_file` gives on the same text.
"""

from __future__ import annotations

import json

import pytest
import tokenizers

from flows.cli import main
from pipeline_lib import Tokenizer, get_encoding
from pipeline_lib.errors import InputError

# The split regexes of Llama 3's and Qwen 2's tokenizer.json files (cl100k's before tiktoken
# made it possessive; Qwen 2 splits digits one by one).
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| "
    r"?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| "
    r"?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPECIALS = {"<|begin_of_text|>": 128000, "<|end_of_text|>": 128001, "<|eot_id|>": 128009}


@pytest.fixture(scope="module")
def hf_json_of(tmp_path_factory):
    """The HF tokenizer.json text of an encoding, exported once per module (the export of
    cl100k takes seconds and is not what these tests check: tests/test_exports.py does)."""
    texts: dict[str, str] = {}

    def hf_json(name: str) -> str:
        if name not in texts:
            path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
            get_encoding(name).to_hf_json(str(path))
            texts[name] = path.read_text(encoding="utf-8")
        return texts[name]

    return hf_json


def _lines(text: str, n: int = 400) -> list[str]:
    return [line for line in text.splitlines() if line.strip()][:n]


def _assert_same_ids(path: str, lines: list[str], specials_text: str | None = None) -> Tokenizer:
    ours = Tokenizer.from_hf_json(path)
    hf = tokenizers.Tokenizer.from_file(path)
    for line in lines:
        assert ours.encode_ordinary(line) == hf.encode(line, add_special_tokens=False).ids, line
    if specials_text is not None:
        assert (
            ours.encode(specials_text, allowed_special="all") == hf.encode(specials_text, add_special_tokens=False).ids
        )
    return ours


def test_a_bpe_trained_by_hf_tokenizers_gpt2_style(tmp_path, multilingual_text, shakespeare_text):
    from tokenizers import decoders, models, pre_tokenizers, trainers

    hf = tokenizers.Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator([shakespeare_text[:200_000], multilingual_text[:100_000]], trainer)
    path = str(tmp_path / "tokenizer.json")
    hf.save(path)
    ours = _assert_same_ids(path, _lines(multilingual_text) + _lines(shakespeare_text[-50_000:]), "a <|endoftext|> b")
    assert ours.pattern == "gpt2" and ours.special_tokens == {"<|endoftext|>": 0}


@pytest.mark.parametrize(
    ("regex", "expected_pattern"), [(LLAMA3_REGEX, LLAMA3_REGEX), (QWEN2_REGEX, QWEN2_REGEX), (None, "cl100k")]
)
@pytest.mark.parametrize("in_vocab", [True, False])
def test_llama3_and_qwen2_layouts(tmp_path, hf_json_of, multilingual_text, regex, expected_pattern, in_vocab):
    """Added tokens in model.vocab keep their ids; others get HF's next free id, whatever
    the file's "id" says (cl100k's vocabulary has gaps, so they differ here)."""
    path = tmp_path / "tokenizer.json"
    doc = json.loads(hf_json_of("cl100k_base"))
    if regex is not None:
        doc["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": regex}
    doc["model"]["ignore_merges"] = True  # as Llama 3's file has it
    doc["added_tokens"] = [
        {
            "id": i,
            "content": t,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for t, i in LLAMA3_SPECIALS.items()
    ]
    if in_vocab:
        doc["model"]["vocab"].update(LLAMA3_SPECIALS)
    doc["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {
            "<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [128000], "tokens": ["<|begin_of_text|>"]}
        },
    }
    path.write_text(json.dumps(doc), encoding="utf-8")
    text = "<|begin_of_text|>user: 12345 apples, naïve café<|eot_id|>"
    ours = _assert_same_ids(str(path), _lines(multilingual_text) + ["1234567 89", "x  \n\n  y"], text)
    assert ours.pattern == expected_pattern
    expected = LLAMA3_SPECIALS if in_vocab else dict(zip(LLAMA3_SPECIALS, [100261, 100262, 100263]))
    assert {t: ours.special_tokens[t] for t in LLAMA3_SPECIALS} == expected


def test_the_cli_encodes_with_a_tokenizer_json(tmp_path, hf_json_of, capsys):
    path = tmp_path / "tokenizer.json"
    path.write_text(hf_json_of("gpt2"), encoding="utf-8")
    assert main(["tokenizer", "encode", "--tokenizer", str(path), "--text", "hello world"]) == 0
    assert capsys.readouterr().out.split() == ["31373", "995"]
    assert main(["tokenizer", "decode", "--tokenizer", str(path), "--ids", "31373 995"]) == 0
    assert capsys.readouterr().out == "hello world\n"
    assert main(["tokenizer", "inspect", "--tokenizer", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)


def _edited(tmp_path, gpt2_hf_json: str, edit) -> str:
    path = tmp_path / "tokenizer.json"
    doc = json.loads(gpt2_hf_json)
    edit(doc)
    path.write_text(json.dumps(doc), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["model"].update(type="WordPiece"), 'model.type "WordPiece" is not supported'),
        (lambda d: d["model"].update(type="Unigram"), 'model.type "Unigram" is not supported'),
        (lambda d: d.update(normalizer={"type": "NFC"}), "normalizer .* is not supported"),
        (
            lambda d: d.update(pre_tokenizer={"type": "Metaspace", "replacement": "▁"}),
            "pre_tokenizer .* is not supported",
        ),
        (lambda d: d["model"].update(byte_fallback=True), "model.byte_fallback true is not supported"),
        (lambda d: d["model"].update(dropout=0.1), "model.dropout 0.1 is not supported"),
        (
            lambda d: d["pre_tokenizer"]["pretokenizers"][0].update(behavior="Removed"),
            "only Split with a Regex pattern",
        ),
        (lambda d: d["pre_tokenizer"]["pretokenizers"][1].update(add_prefix_space=True), "add_prefix_space"),
        (lambda d: d["model"]["merges"].reverse(), "merges must be in id order"),
    ],
)
def test_what_is_not_byte_level_bpe_is_refused_in_one_line(tmp_path, hf_json_of, capsys, edit, message):
    path = _edited(tmp_path, hf_json_of("gpt2"), edit)
    with pytest.raises(InputError, match=message):
        Tokenizer.from_hf_json(path)
    assert main(["tokenizer", "encode", "--tokenizer", path, "--text", "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and path in err[0] and "Traceback" not in err[0], err


def test_a_real_wordpiece_file_is_refused(tmp_path):
    from tokenizers import models

    bert = tokenizers.Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    bert.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(InputError, match="only BPE models load"):
        Tokenizer.from_hf_json(str(tmp_path / "tokenizer.json"))
