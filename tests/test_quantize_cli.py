"""`edgettt calibrate` and `edgettt quantize` through click's runner, and quantized models on disk."""

import json

import pytest
import torch
from click.testing import CliRunner

import edgettt
from edgettt.cli import cli
from edgettt.quantize import QuantLinear


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("q")
    assert run("create", root / "ttt", "--hidden-size", "64", "--intermediate-size", "160",
               "--mini-batch-size", "8", "--share-qk").exit_code == 0
    assert run("convert", root / "ttt", root / "la", "--form", "exact", "--no-report").exit_code == 0
    result = run("calibrate", root / "la", "--data", "python-docs-sample", "--seq-len", "256", "--samples", "3",
                 "-o", root / "cal.st")
    assert result.exit_code == 0, result.output
    assert "max |row| by position bucket" in result.output
    return root


@pytest.mark.parametrize("args", [("--weights", "int8", "--state", "int8"),
                                  ("--weights", "int4", "--method", "gptq", "--group-size", "32"),
                                  ("--weights", "int4", "--group-size", "32", "--state", "fp16"),
                                  ("--weights", "nf4", "--group-size", "32", "--state", "int8-tensor")])
def test_quantize_writes_a_model_that_loads_and_evaluates(setup, tmp_path, args):
    out = tmp_path / "q"
    result = run("quantize", setup / "la", out, *args, "--calib", setup / "cal.st")
    assert result.exit_code == 0, result.output
    assert "model.layers.0.mlp.gate_proj" in result.output and "bits per weight" in result.output
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"]["weights"] == args[1]
    model = edgettt.load(out)
    assert isinstance(model.model.layers[0].mlp.up_proj, QuantLinear)
    assert not isinstance(model.lm_head, QuantLinear)  # skipped by default
    ids = torch.randint(0, 256, (1, 40))
    with torch.no_grad():
        a = model(ids)
        logits, state = model.prefill(ids[:, :-1])
        step, _ = model.step(ids[:, -1], state)
    assert torch.isfinite(a).all() and ((step - a[:, -1]).norm() / a[:, -1].norm()).item() < 1e-3
    ev = run("eval", out, "--ref", setup / "la", "--data", "python-docs-sample", "--max-tokens", "512")
    assert ev.exit_code == 0 and "Mean    KLD" in ev.output


def test_quantize_bad_inputs(setup, tmp_path):
    la = setup / "la"
    result = run("quantize", la, tmp_path / "o", "--weights", "int4", "--method", "gptq")
    assert result.exit_code == 1 and "needs a calibration" in result.output
    result = run("quantize", la, tmp_path / "o", "--state", "int8")
    assert result.exit_code == 1 and "needs a calibration" in result.output
    # a calibration made for another model
    assert run("create", tmp_path / "t2", "--hidden-size", "64", "--seed", "9").exit_code == 0
    assert run("convert", tmp_path / "t2", tmp_path / "la2", "--no-report").exit_code == 0
    result = run("quantize", tmp_path / "la2", tmp_path / "o", "--state", "int8", "--calib", setup / "cal.st")
    assert result.exit_code == 1 and "made for another model" in result.output
    # group size that does not divide the layer (down_proj reads the intermediate 160)
    result = run("quantize", la, tmp_path / "o", "--weights", "int4", "--group-size", "64")
    assert result.exit_code == 1 and "does not divide its input size 160" in result.output
    result = run("quantize", setup / "ttt", tmp_path / "o")
    assert result.exit_code == 1 and "quantize a converted one" in result.output
    (tmp_path / "junk.st").write_bytes(b"x" * 20)
    result = run("quantize", la, tmp_path / "o", "--calib", tmp_path / "junk.st")
    assert result.exit_code == 1 and "not a calibration file" in result.output
    assert not (tmp_path / "o").exists()
    result = run("calibrate", setup / "ttt", "-o", tmp_path / "c.st")
    assert result.exit_code == 1 and "needs a converted model" in result.output
