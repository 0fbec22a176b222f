"""Mixed precision by budget (`quantize --target`, `calibration.mixed`): the budget's spelling, the knapsack against
brute force, a mix meeting its size or KLD, saved and loaded, bad budgets (a mix's export through ONNX Runtime:
tests/test_export.py, variant mlp-mixed)."""

import itertools
import json

import pytest
import torch
from click.testing import CliRunner

import edgettt
from edgettt.cli import cli
from edgettt.data import read_text
from edgettt.errors import EdgetttError
from edgettt.calibration import Budget, search_mix
from edgettt.quant import QuantConfig
from edgettt.quant.apply import weight_bits
from edgettt.calibration.statistics import Calibration
from edgettt.quant.linear import QuantLinear
from edgettt.calibration.mixed import block_inputs, frontier, logits_from


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.mark.parametrize("text, expected", [
    ("size=2.5", Budget("size", 2.5)), ("kld=0.003", Budget("kld", 0.003)), ("size=1e1", Budget("size", 10.0)),
    ("size=0", None), ("kld=-1", None), ("size=abc", None), ("bits=4", None), ("size", None), ("kld=nan", None),
    ("size=inf", None), ("", None)])
def test_a_budget_is_size_or_kld_with_a_positive_number(text, expected):
    if expected is None:
        with pytest.raises(EdgetttError, match="expected size=MB or kld=X"):
            Budget.parse(text)
    else:
        assert Budget.parse(text) == expected and Budget.parse(str(expected)) == expected


def test_the_frontier_is_the_best_mix_for_every_size():
    """Against every mix of 5 layers with 3 choices each: the least summed KLD within each size, and the
    choices the frontier gives reach it within that size."""
    gen = torch.Generator().manual_seed(0)
    options = [[(int(b), float(k)) for b, k in zip(torch.randint(1, 9, (3,), generator=gen),
                                                    torch.rand(3, generator=gen))] for _ in range(5)]
    least, choices = frontier(options, 1)
    for size in range(len(least)):
        mixes = [m for m in itertools.product(range(3), repeat=5) if sum(options[i][j][0] for i, j in enumerate(m)) <= size]
        best = min((sum(options[i][j][1] for i, j in enumerate(m)) for m in mixes), default=float("inf"))
        assert least[size] == pytest.approx(best)
        if mixes:
            picked = choices(size)
            assert sum(options[i][j][0] for i, j in enumerate(picked)) <= size
            assert sum(options[i][j][1] for i, j in enumerate(picked)) == pytest.approx(best)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A small random model in the parallel form (down_proj reads 160 inputs: int4 only in groups of 32) and
    its calibration on the sample text."""
    root = tmp_path_factory.mktemp("mix")
    assert run("create", root / "ttt", "--set", "hidden_size=64", "--set", "intermediate_size=160",
               "--set", "mini_batch_size=8").exit_code == 0
    assert run("convert", root / "ttt", root / "la", "--form", "parallel", "--no-report").exit_code == 0
    result = run("calibrate", root / "la", "--data", "python-docs-sample", "--ctx", "256", "--samples", "3",
                 root / "cal.st")
    assert result.exit_code == 0, result.output
    return root, edgettt.load(root / "la"), Calibration.load(root / "cal.st")


def uniform_size(model, cal, variant: str) -> float:
    fmt, method, group = edgettt.quant.config.weight_variant(variant)
    config = QuantConfig(fmt, group, method, skip=(), fallback="float", overrides={"lm_head": variant})
    return weight_bits(edgettt.quantize(model, config, cal))["size_mb"]


def test_quantize_target_size_writes_a_mix_within_it_that_loads(setup, tmp_path):
    root, model, cal = setup
    budget = round(1.1 * uniform_size(model, cal, "int4-gptq-g32"), 4)
    result = run("quantize", root / "la", tmp_path / "m", "--calib", root / "cal.st", "--target", f"size={budget}")
    assert result.exit_code == 0, result.output
    assert f"mix for size={budget:g}" in result.output and "predicted KLD" in result.output
    loaded = edgettt.load(tmp_path / "m")
    assert loaded.config.quantization["target"] == f"size={budget:g}"
    assert weight_bits(loaded)["size_mb"] <= budget
    groups = {(m.format.name, m.group_size) for m in loaded.modules() if isinstance(m, QuantLinear)}
    assert len(groups) >= 2  # layers in different formats or groups, each loaded as saved
    ids = torch.tensor([list(read_text("python-docs-sample").data[:257])])
    with torch.no_grad():
        ref, mixed = model(ids[:, :-1]), loaded(ids[:, :-1])
    assert torch.isfinite(mixed).all() and not torch.equal(ref, mixed)
    info = run("info", tmp_path / "m")
    assert info.exit_code == 0 and f"mixed precision for size={budget:g}" in info.output


def test_a_size_budget_gets_at_least_the_prediction_of_any_uniform_variant_within_it(setup):
    """The knapsack's mix is the best predicted for its size: no worse than a uniform variant it can afford."""
    root, model, cal = setup
    budget = Budget("size", uniform_size(model, cal, "int4-gptq-g32") * 1.0001)
    plan = search_mix(model, cal, read_text("python-docs-sample"), budget, log=lambda *_: None)
    g32 = next(u for u in plan.uniform if u["variant"] == "int4-gptq-g32")
    assert plan.size_mb <= budget.value and plan.predicted_kld <= g32["predicted_kld"] + 1e-12
    assert plan.measured_kld > 0


def test_a_kld_budget_gets_a_mix_measured_within_it(setup):
    root, model, cal = setup
    text = read_text("python-docs-sample")
    probe = search_mix(model, cal, text, Budget("size", 1e3), log=lambda *_: None)
    g32 = next(u for u in probe.uniform if u["variant"] == "int4-gptq-g32")
    plan = search_mix(model, cal, text, Budget("kld", g32["predicted_kld"] / 2), log=lambda *_: None)
    assert plan.measured_kld <= g32["predicted_kld"] / 2
    int8 = next(u for u in probe.uniform if u["variant"] == "int8-gptq")
    assert plan.size_mb <= int8["size_mb"]  # (uniform int8 predicts far less drift: the mix is no larger)


@pytest.mark.parametrize("args, message", [
    (("--target", "size=0.0001"), "below the smallest mix"),
    (("--target", "size=0"), "expected size=MB or kld=X"),
    (("--target", "kld=x"), "expected size=MB or kld=X"),
    (("--target", "size=5", "--weights", "int8"), "drop --weights and --lm-head"),
    (("--target", "size=5", "--lm-head", "int8"), "drop --weights and --lm-head"),
    (("--target", "size=5", "--skip", "q_proj"), "drop --skip"),
    (("--target", "size=5", "--no-calib"), "pass --calib"),
])
def test_bad_budgets_are_one_line_and_write_nothing(setup, tmp_path, args, message):
    root, _, _ = setup
    calib = [] if "--no-calib" in args else ["--calib", root / "cal.st"]
    result = run("quantize", root / "la", tmp_path / "o", *calib, *[a for a in args if a != "--no-calib"])
    malformed = message.startswith("expected")  # a budget that does not parse: a malformed command line
    assert result.exit_code == (2 if malformed else 1) and message in result.output, result.output
    assert "Traceback" not in result.output and (malformed or len(result.output.strip().splitlines()) == 1)
    assert not (tmp_path / "o").exists()


def test_a_size_below_every_mix_is_refused_before_the_weights_are_read(setup, tmp_path, monkeypatch):
    """The smallest mix is a matter of shapes: config.json says it, the weights are never loaded."""
    root, _, _ = setup
    import edgettt

    def no_load(*args, **kwargs):
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(edgettt, "load", no_load)
    result = run("quantize", root / "la", tmp_path / "o", "--calib", root / "cal.st", "--target", "size=0.0001")
    assert result.exit_code == 1 and "below the smallest mix" in result.output, result.output


def test_a_sensitivity_run_from_a_block_gives_the_whole_prefill_logits(setup):
    """Starting at block i from the float model's hidden state there equals the whole prefill."""
    _, model, _ = setup
    windows = torch.tensor([list(read_text("python-docs-sample").data[:65])])
    with torch.no_grad():
        whole = model(windows[:, :-1])
        inputs = block_inputs(model, windows)
        for block, h in enumerate(inputs):
            assert torch.allclose(logits_from(model, block, h), whole, atol=1e-5, rtol=1e-5)


def test_the_report_measures_a_mix_beside_the_uniform_variants_and_draws_its_frontier(setup, tmp_path):
    root, model, cal = setup
    budget = round(1.1 * uniform_size(model, cal, "int4-gptq-g32"), 4)
    result = run("report", root / "la", tmp_path / "rep", "--weights", f"int4-gptq-g32,mix:size={budget}",
                 "--state", "fp32", "--data", "python-docs-sample", "--calib-data", "python-docs-sample",
                 "--ctx", "64", "--max-tokens", "1024")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    mixed = next(r for r in report["rows"] if r["weights"] == "mixed")
    assert mixed["variant"] == f"w-mix-size={budget:g} s-fp32" and mixed["size_mb"] <= budget
    sizes = [size for size, _ in mixed["frontier"]]
    klds = [kld for _, kld in mixed["frontier"]]
    assert sizes == sorted(sizes) and klds == sorted(klds, reverse=True)  # the least KLD falls as size grows
    assert (tmp_path / "rep" / "accuracy_vs_size.png").stat().st_size > 0
    result = run("report", root / "la", tmp_path / "rep2", "--weights", "mix:size=0")
    assert result.exit_code == 2 and "expected size=MB or kld=X" in result.output
