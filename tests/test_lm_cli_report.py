"""CLI (train / sample) and reports (loss plot, metrics)."""

import json
from pathlib import Path

import pytest

from pipeline_lib.lm import TrainResult, metrics, write_loss_plot
from pipeline_lib.lm.__main__ import main
from pipeline_lib.lm.testing import write_byte_token_dir

SHAKESPEARE = Path(__file__).resolve().parents[1] / "pipeline_lib" / "data" / "tinyshakespeare.txt"


pytestmark = pytest.mark.usefixtures("torch_one_thread")


def test_write_loss_plot_and_metrics(tmp_path):
    history = [
        {"step": 0, "train_loss": None, "val_loss": 5.5, "val_bpb": 8.0, "lr": 1e-4, "tokens_per_s": None},
        {"step": 1, "train_loss": 5.4, "val_loss": None, "val_bpb": None, "lr": 1e-3, "tokens_per_s": 10.0},
        {"step": 2, "train_loss": 4.0, "val_loss": 4.2, "val_bpb": 6.0, "lr": 1e-3, "tokens_per_s": 12.0},
    ]
    png = write_loss_plot(history, tmp_path / "sub" / "loss.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = TrainResult(4.0, 4.2, 6.0, 2, 11.0, history, None, n_params=10)
    m = metrics(r)
    assert m["final_val_loss"] == 4.2 and m["best_val_loss"] == 4.2 and m["val_bpb"] == 6.0
    json.dumps(m)


def test_cli_train_and_sample(tmp_path, capsys):
    data = write_byte_token_dir(tmp_path / "tok", SHAKESPEARE.read_bytes()[:200_000])
    out = tmp_path / "run"
    args = [
        "train",
        "--data",
        str(data),
        "--out",
        str(out),
        "--preset",
        "tiny",
        "--steps",
        "4",
        "--device",
        "cpu",
        "--eval-interval",
        "2",
        "--eval-iters",
        "2",
        "--log-interval",
        "1",
    ]
    assert main(args) == 0
    assert (out / "loss.png").read_bytes()[:4] == b"\x89PNG"
    m = json.loads((out / "metrics.json").read_text())
    assert m["steps"] == 4 and m["final_val_loss"] is not None
    assert main(args[:8] + ["6", "--resume", "--device", "cpu"]) == 0
    assert json.loads((out / "metrics.json").read_text())["steps"] == 6
    capsys.readouterr()

    sample_args = ["sample", "--ckpt", str(out), "--prompt-ids", "72,101", "--max-new-tokens", "5", "--seed", "1"]
    assert main(sample_args) == 0
    ids = [int(x) for x in capsys.readouterr().out.strip().split(",")]
    assert ids[:2] == [72, 101] and len(ids) == 7
    assert main(sample_args) == 0
    assert [int(x) for x in capsys.readouterr().out.strip().split(",")] == ids  # seeded
    assert main(["sample", "--ckpt", str(out), "--max-new-tokens", "3", "--top-k", "1"]) == 0
    assert capsys.readouterr().out.startswith("256,")  # empty prompt starts from the separator
