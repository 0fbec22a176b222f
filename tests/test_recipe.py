"""The training recipe (recipes/train_tiny.py) runs end to end on the CPU: a few steps, the files it writes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import edgettt

RECIPE = Path(__file__).parent.parent / "recipes" / "train_tiny.py"


def write_parts(directory: Path) -> None:
    text = (b"def f(x):\n    return x + 1\n" * 200)
    for part in ("train", "docs_train", "val", "test"):
        (directory / f"{part}.bin").write_bytes(text)


@pytest.mark.parametrize("arch,weights", [("transformer", "transformer.safetensors"), ("ttt-linear", "model.safetensors")])
def test_recipe_trains_and_writes_its_log_and_weights(tmp_path, arch, weights):
    write_parts(tmp_path)
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(RECIPE), "--arch", arch, "--out", str(out), "--minutes", "0.02",
                    "--layers", "1", "--batch", "2", "--ctx", "64", "--data-dir", str(tmp_path)],
                   check=True, capture_output=True, timeout=300)
    log = json.loads((out / "train_log.json").read_text())
    assert log["arch"] == arch and log["steps"] >= 1 and log["test_bits_per_byte"] > 0
    assert (out / weights).stat().st_size > 0
    if arch != "transformer":
        assert edgettt.load(out).config.num_hidden_layers == 1
