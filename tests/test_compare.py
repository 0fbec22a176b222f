"""`edgettt compare`: models of different families side by side, through click's runner (small random models; the
shipped models' comparison is docs/compare.md's, with its command)."""

import json

import pytest
from conftest import cli_ok

import edgettt
from edgettt.comparison import MIX_OVER_INT4, threads_beside

SMALL = ("--set", "hidden_size=32", "--set", "intermediate_size=64", "--set", "num_hidden_layers=1")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A TTT-Linear model in its parallel form and a Gated DeltaNet, one layer each (the whole comparison of two
    families: docs/compare.md's, with its command)."""
    root = tmp_path_factory.mktemp("compare")
    cli_ok("create", root / "ttt", *SMALL, "--set", "mini_batch_size=8")
    cli_ok("convert", root / "ttt", root / "ttt-parallel", "--form", "parallel", "--no-report")
    cli_ok("create", root / "gdn", "--family", "gated-deltanet", *SMALL)
    return root


def test_compare_measures_text_weights_states_and_speed(models, tmp_path):
    """A model measured at the defaults, with the decode rows of a bench file (a CPU run here: the file's kind is
    what matters) among the paths."""
    a = models / "ttt-parallel"
    cli_ok("bench", a, "--pp", "8", "--tg", "4", "--depth", "0", "-r", "1", "--json", tmp_path / "bench.json")
    result = cli_ok("compare", a, tmp_path / "bench.json", tmp_path / "c")
    data = json.loads((tmp_path / "c" / "compare.json").read_text())
    [m] = data["models"]
    assert m["model"] == str(a)
    model = edgettt.load(a)
    assert m["parameters"] == sum(p.numel() for p in model.parameters())
    expected = edgettt.evaluate(model, "python-docs:test", ctx=2048, max_tokens=8192).bits_per_byte
    assert set(m["bits_per_byte"]) == {"512", "2048", "8192"}
    assert m["bits_per_byte"]["2048"] == pytest.approx(expected, rel=1e-6)
    rows = {r["variant"].split()[0]: r for r in m["weights"]}
    int4 = rows["w-int4-rtn-g32"]
    mixed = next(r for name, r in rows.items() if name.startswith("w-mix"))
    assert {"float", "w-int8", "w-int4-gptq-g32"} <= set(rows)  # (the float row: "float (converted)")
    assert 0 < int4["kld_mean"] and rows["w-int8"]["kld_mean"] < int4["kld_mean"]
    assert mixed["size_mb"] <= MIX_OVER_INT4 * int4["size_mb"] + 1e-6
    states = {r["state"]: r for r in m["states"]}
    assert set(states) == {"fp16", "int12", "int12-kv8", "int8", "int8-tensor"}
    assert all(r["state_bytes"] < m["float_state_bytes"] for r in states.values())
    decode = data["cpu_decode"]["rows"][str(a)]
    assert set(decode) == {"0", "2048", "8192"} and all(v > 0 for v in decode.values())
    assert data["gpu_decode"]["rows"][str(a)]["0"] > 0  # the bench file's row, matched by the model's folder
    page = (tmp_path / "c" / "compare.html").read_text()
    assert page.count("<table>") == 5 and page.count("data:image/png;base64") == 4
    assert "Held-out bits per byte" in result.output


def test_the_state_formats_compared_are_those_a_family_takes(models):
    """The delta rule's state has no open mini-batch and starts at zero: the formats built on those do not apply."""
    from edgettt.comparison import state_formats

    assert state_formats(edgettt.load(models / "gdn")) == ["fp16", "int12", "int8"]
    assert set(state_formats(edgettt.load(models / "ttt-parallel"))) == {"fp16", "int12", "int12-kv8", "int8",
                                                                          "int8-tensor"}


def test_the_models_are_measured_on_the_cores_the_exporter_leaves():
    """While the exporter process traces, torch takes a thread less (never none), and its own count after."""
    import torch

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        with threads_beside(1):
            assert torch.get_num_threads() == 2
        torch.set_num_threads(1)
        with threads_beside(1):
            assert torch.get_num_threads() == 1
        with pytest.raises(ValueError), threads_beside(0):
            raise ValueError
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
