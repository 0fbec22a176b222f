"""`edgettt calibrate` and `edgettt quantize` through click's runner, and quantized models on disk."""

import json

import pytest
import torch
from click.testing import CliRunner

import edgettt
from edgettt.calibration.statistics import BUCKETS
from edgettt.cli import cli
from edgettt.quant import QuantLinear


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("q")
    assert run("create", root / "ttt", "--set", "hidden_size=64", "--set", "intermediate_size=160",
               "--set", "mini_batch_size=8", "--set", "share_qk=true").exit_code == 0
    assert run("convert", root / "ttt", root / "la", "--form", "exact", "--no-report").exit_code == 0
    result = run("calibrate", root / "la", "--data", "python-docs-sample", "--ctx", "256", "--samples", "3",
                 root / "cal.st")
    assert result.exit_code == 0, result.output
    assert "max |row| by position bucket" in result.output
    return root


@pytest.mark.parametrize("args", [("--weights", "int8", "--state", "int8"),
                                  ("--weights", "int4-gptq-g32"),
                                  ("--weights", "int4-rtn-g32", "--state", "fp16"),
                                  ("--weights", "nf4-b32", "--state", "int8-tensor"),
                                  ("--weights", "bnb-int8")])
def test_quantize_writes_a_model_that_loads_and_evaluates(setup, tmp_path, args):
    out = tmp_path / "q"
    result = run("quantize", setup / "la", out, *args, "--calib", setup / "cal.st")
    assert result.exit_code == 0, result.output
    assert "model.layers.0.mlp.gate_proj" in result.output and "bits per weight" in result.output
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"]["variant"] == {"int4": "int4-gptq-g32"}.get(args[1], args[1])  # one spelling
    model = edgettt.load(out)
    assert isinstance(model.model.layers[0].mlp.up_proj, QuantLinear)
    four_bit = args[1].startswith(("int4", "nf4", "fp4"))  # lm_head int8 beside 4-bit weights, else float
    assert isinstance(model.lm_head, QuantLinear) == four_bit
    if four_bit:
        assert model.lm_head.format.name == "int8"
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
    result = run("quantize", la, tmp_path / "o", "--weights", "int4-gptq")
    assert result.exit_code == 1 and "needs a calibration" in result.output
    result = run("quantize", la, tmp_path / "o", "--state", "int8")
    assert result.exit_code == 1 and "needs a calibration" in result.output
    # a calibration made for another model
    assert run("create", tmp_path / "t2", "--set", "hidden_size=64", "--seed", "9").exit_code == 0
    assert run("convert", tmp_path / "t2", tmp_path / "la2", "--no-report").exit_code == 0
    result = run("quantize", tmp_path / "la2", tmp_path / "o", "--state", "int8", "--calib", setup / "cal.st")
    assert result.exit_code == 1 and "made for another model" in result.output
    # group size that does not divide the layer (down_proj reads the intermediate 160): refused up front
    result = run("quantize", la, tmp_path / "o", "--weights", "int4-rtn-g64", "--fallback", "refuse")
    assert result.exit_code == 1 and "down_proj (K=160)" in result.output
    result = run("quantize", setup / "ttt", tmp_path / "o")
    assert result.exit_code == 1 and "quantize a converted one" in result.output
    (tmp_path / "junk.st").write_bytes(b"x" * 20)
    result = run("quantize", la, tmp_path / "o", "--calib", tmp_path / "junk.st")
    assert result.exit_code == 1 and "not a calibration file" in result.output
    assert not (tmp_path / "o").exists()
    result = run("calibrate", setup / "ttt", tmp_path / "c.st")
    assert result.exit_code == 1 and "needs a converted model" in result.output


def test_calibration_is_deterministic_and_records_fingerprints(setup, tmp_path):
    from edgettt.calibration.statistics import Calibration
    from edgettt.checkpoint import model_fingerprint

    args = ("calibrate", setup / "la", "--data", "python-docs-sample", "--ctx", "256", "--samples", "3")
    assert run(*args, tmp_path / "again.st").exit_code == 0
    a, b = Calibration.load(setup / "cal.st"), Calibration.load(tmp_path / "again.st")
    assert a.model_fingerprint == model_fingerprint(edgettt.load(setup / "la")) == b.model_fingerprint
    assert a.text["name"] == "python-docs-sample" and a.text["sha256"] == b.text["sha256"]
    for kind in ("hessians", "state_scales", "state_rowmax"):
        x, y = getattr(a, kind), getattr(b, kind)
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
    assert a.state_rowmax["0.1.S"].shape == (4, 17, BUCKETS)  # heads, rows (d + 1), position buckets
    assert run(*args, tmp_path / "again.st").exit_code == 1  # exists, no --force


def test_report_end_to_end(setup, tmp_path):
    out = tmp_path / "rep"
    result = run("report", setup / "ttt", "--data", "python-docs-sample", "--calib-data", "python-docs:val",
                 "--ctx", "128", "--max-tokens", "1024", "--weights", "int8,int4-rtn-g32,int4-gptq-g32,nf4-b32",
                 "--state", "int8,int8-tensor", out)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    rows = {r["variant"]: r for r in report["rows"]}
    assert len(rows) == 7 and rows["float (converted)"]["kld_mean"] == 0
    for r in report["rows"]:
        for key in ("variant", "weights", "state", "size_mb", "bits_per_weight", "ppl", "kld_mean", "kld_p99",
                    "top1", "kld_by_position"):
            assert key in r
        assert len(r["kld_by_position"]) == 8
    assert rows["w-int8 s-fp32"]["kld_mean"] < rows["w-int4-rtn-g32 s-fp32"]["kld_mean"]
    assert rows["w-int4-rtn-g32 s-fp32"]["bits_per_weight"] < rows["w-int8 s-fp32"]["bits_per_weight"]
    for name in ("report.csv", "report.md", "accuracy_vs_size.png", "kld_by_position.png", "state_vs_kld.png"):
        assert (out / name).stat().st_size > 0
    assert "KLD mean" in result.output
    bad = run("report", setup / "ttt", "--weights", "int3", tmp_path / "r2")
    assert bad.exit_code == 2 and "unknown weight variant 'int3'" in bad.output and not (tmp_path / "r2").exists()


@pytest.mark.parametrize("state", ["int12", "int8"])
def test_info_counts_the_int8_state_as_stored(setup, tmp_path, state):
    assert run("quantize", setup / "la", tmp_path / "q", "--weights", "int8", "--state", state,
               "--calib", setup / "cal.st").exit_code == 0
    plain, quant = (json.loads(run("info", p, "--json", "-").output) for p in (setup / "la", tmp_path / "q"))
    layers, H, d, C, K = 2, 4, 16, 64, 4
    s_elems = H * (d + 1) * d  # per layer: S and A of this shape, plus one conv tail (share_qk)
    assert plain["decode_state_bytes_per_sequence"] == layers * (4 * s_elems * 2 + 4 * (K - 1) * C)
    # int12: 1.5 bytes a value and a float32 step a row of S, the open mini-batch's keys and values (b of
    # them, float16) in place of A; int8: 1 byte (its scales are in the model), A in float32
    b = 8
    if state == "int12":
        per_layer = s_elems * 1.5 + 4 * H * (d + 1) + 2 * H * b * ((d + 1) + d)
    else:
        per_layer = s_elems + 4 * s_elems
    assert quant["decode_state_bytes_per_sequence"] == layers * (per_layer + 4 * (K - 1) * C)
    assert quant["bits_per_weight"] < 16 < plain["bits_per_weight"] and quant["quantization"]["state"] == state


@pytest.mark.parametrize("written, old_name, reads_as", [("int12", "int8", "int12"), ("int8", "int8-calibrated", "int8")])
def test_a_model_saved_under_an_old_state_name_loads_as_it_computed(setup, tmp_path, written, old_name, reads_as):
    """Old names in a model's config.json: "int8" without calibrated scales in the weights was the 12-bit
    format (now int12); "int8-calibrated" is int8. Each loads as today's format and computes as it did."""
    assert run("quantize", setup / "la", tmp_path / "q", "--weights", "none", "--state", written,
               "--calib", setup / "cal.st").exit_code == 0
    today = edgettt.load(tmp_path / "q")
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    assert config["quantization"]["state"] == written
    config["quantization"]["state"] = old_name
    (tmp_path / "q" / "config.json").write_text(json.dumps(config))
    old = edgettt.load(tmp_path / "q")
    assert {layer.state_format.name for _, layer in old.state_layers()} == {reads_as}
    assert old.config.quantization["state"] == reads_as
    ids = torch.randint(0, 256, (1, 40))
    with torch.no_grad():
        assert torch.equal(old(ids), today(ids))


def test_an_old_state_name_on_the_command_line_works_with_a_note(setup, tmp_path):
    result = run("quantize", setup / "la", tmp_path / "q", "--weights", "none", "--state", "int8-calibrated",
                 "--calib", setup / "cal.st")
    assert result.exit_code == 0 and "note: the state format int8-calibrated is now called int8" in result.output
    assert json.loads((tmp_path / "q" / "config.json").read_text())["quantization"]["state"] == "int8"


def test_layers_int4_cannot_take_fall_back_and_skip_adds_to_lm_head(setup, tmp_path):
    """The default model of `edgettt create` (intermediate 160 here, 176 at the default width): int4 at
    group 64 takes every layer but down_proj, which falls back to int8, said per layer; --skip adds."""
    la = setup / "la"
    result = run("quantize", la, tmp_path / "o", "--weights", "int4-rtn-g64", "--skip", "o_proj")
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line for line in result.output.splitlines() if line.startswith("  model.")}
    assert "int8" in lines["model.layers.0.mlp.down_proj"] and "(fallback)" in lines["model.layers.0.mlp.down_proj"]
    assert "int4" in lines["model.layers.0.mlp.up_proj"]
    assert not any("o_proj" in name for name in lines)  # skipped
    head = next(line for line in result.output.splitlines() if line.startswith("  lm_head"))
    assert "int8" in head and "(fallback)" not in head  # asked (the 4-bit default), not a fallback
    config = json.loads((tmp_path / "o" / "config.json").read_text())["quantization"]
    assert config["skip"] == ["o_proj"] and config["overrides"]["model.layers.0.mlp.down_proj"] == "int8"
    assert config["overrides"]["lm_head"] == "int8"
    assert "cannot be int4" in result.output


@pytest.mark.parametrize("args, head", [(("--weights", "int4-rtn-g32"), "int8"),
                                        (("--weights", "int4-rtn-g32", "--lm-head", "float"), None),
                                        (("--weights", "int4-rtn-g32", "--lm-head", "same"), "int4"),
                                        (("--weights", "int8"), None),
                                        (("--weights", "int8", "--lm-head", "int8"), "int8"),
                                        (("--weights", "nf4-b32"), "int8")])
def test_lm_head_is_int8_beside_4_bit_weights_unless_asked(setup, tmp_path, args, head):
    result = run("quantize", setup / "la", tmp_path / "q", *args)
    assert result.exit_code == 0, result.output
    model = edgettt.load(tmp_path / "q")
    assert (model.lm_head.format.name if isinstance(model.lm_head, QuantLinear) else None) == head


def test_an_int8_lm_head_needs_quantized_weights(setup, tmp_path):
    result = run("quantize", setup / "la", tmp_path / "q", "--weights", "float", "--lm-head", "int8")
    assert result.exit_code == 1 and "--lm-head int8" in result.output and not (tmp_path / "q").exists()
