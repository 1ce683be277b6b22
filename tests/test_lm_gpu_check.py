"""benchmarks/gpu_check.py's dry path on the CPU: the same steps as on a GPU (the CUDA tier,
which skips here, then two runs in fresh processes at two micro-batch sizes), tiny model."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_dry_path_on_the_cpu():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--tiny", "--steps", "3"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "skipped" in text and "CUDA tier: exit 0" in text  # the tier ran: every test skipped, with its reason
    table = text[text.index("micro-batch") :].splitlines()[1:]
    assert [line.split()[0] for line in table] == ["4", "8"]
    assert len({line.split()[1] for line in table}) == 1  # the same tokens per step at both sizes
    for line in table:
        cols = line.split()
        assert float(cols[2].replace(",", "")) > 0  # tokens/s
        assert cols[-3].endswith("s") and cols[-1].endswith("s")  # start -> first step, checkpoint write
