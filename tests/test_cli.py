"""The `tokenmill` command line, run in-process against a temporary Prefect API."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flows.cli import build_parser, main
from pipeline_lib import ArtifactStore, Tokenizer

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture(scope="module")
def cli_store(tmp_path_factory, shakespeare_text):
    root = tmp_path_factory.mktemp("cli")
    corpus = root / "corpus.txt"
    corpus.write_text(shakespeare_text[:80_000], encoding="utf-8")
    store = str(root / "store")
    rc = main(
        [
            "run",
            "--corpus",
            str(corpus),
            "--store",
            store,
            "--vocab-size",
            "350",
            "--pattern",
            "gpt2",
            "--no-lm",
            "--workers",
            "2",
        ]
    )
    assert rc == 0
    return store, root


def test_help_documents_every_option(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    out = capsys.readouterr().out
    for option in (
        "--corpus",
        "--store",
        "--vocab-size",
        "--pattern",
        "--shards",
        "--workers",
        "--special-token",
        "--seed",
        "--device",
        "--lm-steps",
        "--lm-preset",
        "--runner",
    ):
        assert option in out


def test_versions_show_verify(cli_store, capsys):
    store, _ = cli_store
    capsys.readouterr()
    assert main(["versions", "--store", store]) == 0
    out = capsys.readouterr().out
    for kind in ("raw", "corpus", "counts", "tokenizer", "tokens"):
        assert kind in out
    assert main(["show", "latest:tokenizer", "--store", store]) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert manifest["meta"]["vocab_size"] == 350 and manifest["meta"]["pattern"] == "gpt2"
    assert main(["verify", "latest:tokens", "--store", store]) == 0
    assert "OK" in capsys.readouterr().out


def test_verify_catches_a_corrupted_file(cli_store, capsys):
    store_url, _ = cli_store
    store = ArtifactStore(store_url)
    m = store.latest("counts")
    path = store.file_path("counts", m["version"], "counts.parquet")
    original = open(path, "rb").read()
    try:
        with open(path, "r+b") as f:
            f.seek(len(original) // 2)
            f.write(b"\x00\xff\x00\xff")
        capsys.readouterr()
        assert main(["verify", f"counts/{m['version']}", "--store", store_url]) == 1  # a StoreError: not bad input
        err = capsys.readouterr().err
        assert "counts.parquet" in err and err.count("tokenmill: error:") == 1
    finally:
        with open(path, "wb") as f:
            f.write(original)


def test_tokenizer_encode_and_export(cli_store, capsys, tmp_path):
    store, _ = cli_store
    capsys.readouterr()
    assert main(["tokenizer", "encode", "--store", store, "--text", "To be, or not to be"]) == 0
    ids = [int(x) for x in capsys.readouterr().out.split()]
    tok = Tokenizer.load(
        ArtifactStore(store).local_dir("tokenizer", ArtifactStore(store).latest("tokenizer")["version"])
    )
    assert tok.decode(ids) == "To be, or not to be"
    assert (
        main(["tokenizer", "export", "--store", store, "--format", "hf", "--out", str(tmp_path / "tokenizer.json")])
        == 0
    )
    import tokenizers

    hf = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert hf.encode("To be, or not to be").ids == ids
    assert (
        main(["tokenizer", "export", "--store", store, "--format", "tiktoken", "--out", str(tmp_path / "t.tiktoken")])
        == 0
    )
    assert Tokenizer.from_tiktoken(str(tmp_path / "t.tiktoken"), pattern="gpt2").mergeable_ranks == tok.mergeable_ranks


def test_export_nanogpt(cli_store, tmp_path):
    store_url, _ = cli_store
    assert main(["export-nanogpt", "--store", store_url, "--out", str(tmp_path / "nano")]) == 0
    train = np.memmap(tmp_path / "nano" / "train.bin", dtype=np.uint16, mode="r")
    val = np.memmap(tmp_path / "nano" / "val.bin", dtype=np.uint16, mode="r")
    store = ArtifactStore(store_url)
    meta = store.latest("tokens")["meta"]
    assert len(train) + len(val) == meta["totals"]["n_tokens"]
    assert 0 < len(val) < len(train)
    # nanoGPT's sample.py, when the dataset has a meta.pkl: stoi/itos, character by character
    import pickle

    with open(tmp_path / "nano" / "meta.pkl", "rb") as f:
        nano = pickle.load(f)
    stoi, itos = nano["stoi"], nano["itos"]
    encode = lambda s: [stoi[c] for c in s]  # noqa: E731  (nanoGPT's own lines)
    decode = lambda ids: "".join([itos[i] for i in ids])  # noqa: E731
    assert decode(encode("ROMEO:\n")) == "ROMEO:\n"
    tok = Tokenizer.load(store.local_dir("tokenizer", meta["tokenizer"]["version"].split("/", 1)[1]))
    ids = [int(i) for i in train[:200]]
    assert decode(ids) == tok.decode(ids)  # what sample.py prints is what our decoder gives
    assert nano["unpadded_vocab_size"] == meta["vocab_size"] and len(itos) == tok.n_vocab
    assert nano["vocab_size"] % 64 == 0 and 0 <= nano["vocab_size"] - meta["vocab_size"] < 64


def test_bad_corpus_gives_a_clear_error(tmp_path, capsys):
    missing = str(tmp_path / "missing.txt")
    assert main(["run", "--corpus", missing, "--store", str(tmp_path / "s"), "--no-lm"]) == 2
    err = capsys.readouterr().err
    assert "missing.txt" in err and "no such file" in err


def test_bad_vocab_size_gives_a_clear_error(cli_store, capsys):
    store, root = cli_store
    assert main(["run", "--corpus", str(root / "corpus.txt"), "--store", store, "--vocab-size", "100", "--no-lm"]) == 2
    assert "vocab_size=100 is too small" in capsys.readouterr().err


def test_run_on_s3_through_the_cli(tmp_path, shakespeare_text, capsys):
    """`--storage-option endpoint_url=...` (nested into s3fs's client_kwargs) reaches every task."""
    import s3_server

    bucket = s3_server.make_bucket()
    options = [
        "--storage-option",
        f"endpoint_url={s3_server.endpoint()}",
        "--storage-option",
        "key=testing",
        "--storage-option",
        "secret=testing",
    ]
    corpus = tmp_path / "c.txt"
    corpus.write_text(shakespeare_text[:40_000], encoding="utf-8")
    store = f"s3://{bucket}/artifacts"
    assert main(["run", "--corpus", str(corpus), "--store", store, "--vocab-size", "300", "--no-lm", *options]) == 0
    capsys.readouterr()
    assert main(["verify", "latest:tokens", "--store", store, *options]) == 0
    assert "OK" in capsys.readouterr().out


def test_a_closed_pipe_is_no_error(cli_store, tmp_path):
    """`tokenmill tokenizer encode ... | head -c 10`: the reader leaves early; no error line, status 141 as for
    SIGPIPE."""
    import subprocess
    import sys

    store, _ = cli_store
    text = tmp_path / "long.txt"
    text.write_text("To be, or not to be\n" * 20_000, encoding="utf-8")  # ~1 MB of ids printed: beyond any pipe buffer
    cmd = [sys.executable, "-m", "flows.cli", "tokenizer", "encode", "--store", store, "--input", str(text)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(10)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert "error" not in err and "Traceback" not in err


def test_encode_a_new_corpus_with_a_stored_tokenizer(cli_store, capsys, tmp_path, shakespeare_text):
    store_url, _ = cli_store
    other = tmp_path / "other.txt"
    other.write_text(shakespeare_text[-20_000:], encoding="utf-8")
    store = ArtifactStore(store_url)
    tokenizer = store.latest("tokenizer")
    capsys.readouterr()
    args = [
        "encode",
        "--tokenizer",
        "latest:tokenizer",
        "--corpus",
        str(other),
        "--store",
        store_url,
        "--workers",
        "2",
        "--no-doc-table",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    kind, version = out.split()[1].split("/")
    manifest = store.manifest(kind, version)
    assert kind == "tokens" and manifest["parents"]["tokenizer"] == f"tokenizer/{tokenizer['version']}"
    assert store.manifest(*manifest["parents"]["corpus"].split("/"))["meta"]["sources"][0]["url"].endswith("other.txt")
    tok = Tokenizer.load(store.local_dir("tokenizer", tokenizer["version"]))
    tokens = np.concatenate(
        [
            np.load(store.file_path(kind, version, f"{s['name']}.npy"), allow_pickle=False)
            for s in manifest["meta"]["shards"]
        ]
    )
    assert (
        tok.decode(tokens.tolist()).replace("<|endoftext|>", "\n").split() == other.read_text(encoding="utf-8").split()
    )
