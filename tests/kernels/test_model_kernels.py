"""The models with their kernels (`fast_paths.use_kernels`) against the same models as written.

On a CPU the kernels run in the Triton interpreter (the quantized layers' when the test says so)."""

import copy

import pytest
import torch
from conftest import rel_err

from edgettt import convert
from edgettt.fast_paths import FastPaths, prepare, use_kernels
from edgettt.quant import QuantConfig, quantize_model


def with_kernels(model):
    """A copy of `model` whose layers take their kernels."""
    fast = copy.deepcopy(model)
    assert use_kernels(fast) == model.config.num_hidden_layers
    return fast


def quantized_kernels(monkeypatch, on: bool):
    """The quantized layers' kernels on (on a CPU: in the interpreter) or off."""
    monkeypatch.setattr("edgettt.quant.weight_formats.kernel_device",
                        lambda x, on=on: on and (x.is_cuda or not torch.cuda.is_available()))


def prefill_then_decode(model, ids, split):
    logits, state = model.prefill(ids[:, :split])
    outs = [logits]
    for t in range(split, ids.shape[1]):
        step, state = model.step(ids[:, t], state)
        outs.append(step[:, None])
    return torch.cat(outs, dim=1), state


@pytest.mark.parametrize("form", ["parallel", "exact"])
@torch.no_grad()
def test_converted_model_with_kernels_matches_torch_path(tiny_model, monkeypatch, form):
    model = convert(tiny_model("linear", seed=2, mini_batch_size=8, hidden_size=64), form)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    ids = torch.randint(0, model.config.vocab_size, (2, 45), generator=torch.Generator().manual_seed(0)).to(device)
    expected, state_ref = prefill_then_decode(model, ids, 37)  # prefill ends mid-mini-batch, decode commits
    got, state = prefill_then_decode(with_kernels(model), ids, 37)
    assert rel_err(got, expected) < 1e-5
    for name in state_ref.layers[0]:
        assert rel_err(state.layers[0][name], state_ref.layers[0][name]) < 1e-5, name


@torch.no_grad()
@pytest.mark.parametrize("weights", ["int4", "int8", "int6"])  # int6: two int4 products (its 2-bit part as nibbles)
def test_quantized_model_with_kernel_matches_dequantized_matmul(tiny_model, monkeypatch, weights):
    model = convert(tiny_model("linear", seed=4, hidden_size=64, intermediate_size=96), "parallel")
    quantize_model(model, QuantConfig(weights=weights, group_size=32))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    ids = torch.randint(0, model.config.vocab_size, (1, 20), generator=torch.Generator().manual_seed(1)).to(device)
    quantized_kernels(monkeypatch, False)
    expected = model(ids)
    quantized_kernels(monkeypatch, True)
    kernel = "int8" if weights == "int8" else "int4"
    calls = count_calls(monkeypatch, [(f"edgettt.ops.quantized.{kernel}", f"{kernel}_matmul")])
    assert rel_err(model(ids), expected) < 1e-5
    assert len(calls) > 0, "the kernel was not taken"


@torch.no_grad()
@pytest.mark.parametrize("form,kernel,prefills", [("parallel", ("edgettt.ops.linear_attention.commits", "two_level_commits"), 2),
                                                  ("exact", ("edgettt.ops.linear_attention.prefill", "exact"), 1)])
def test_the_int8_state_prefill_through_its_kernel_as_the_torch_loop_does(tiny_model, monkeypatch, form, kernel,
                                                                          prefills):
    """With the int8 state, the parallel form's prefill takes its chain of commits through
    `ops.linear_attention.commits`, the exact form its whole mini-batches through the exact kernel (one launch a
    layer each), and both leave the logits and the state the torch loop leaves, also when the prefill
    starts and ends inside a mini-batch (a second prefill continues the first)."""
    model = convert(tiny_model("linear", seed=5, mini_batch_size=8, hidden_size=64), form)
    quantize_model(model, QuantConfig(weights="none", state="int12"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    ids = torch.randint(0, model.config.vocab_size, (2, 58), generator=torch.Generator().manual_seed(2)).to(device)

    def run(model):
        _, state = model.prefill(ids[:, :5])
        logits, state = model.prefill(ids[:, 5:45], state)  # from position 5 to 45: 4 commits
        outs = [logits]
        for t in range(45, 58):  # decode across a commit
            step, state = model.step(ids[:, t], state)
            outs.append(step[:, None])
        return torch.cat(outs, dim=1), state

    expected, state_ref = run(model)
    fast = with_kernels(model)
    calls = count_calls(monkeypatch, [kernel])
    got, state = run(fast)
    # a launch a layer for each prefill that commits (the exact form's first, 5 tokens, has no whole
    # mini-batch: the torch path takes it)
    assert len(calls) == prefills * model.config.num_hidden_layers
    assert rel_err(got, expected) < 1e-5
    for layer, layer_ref in zip(state.layers, state_ref.layers):
        # (the kernel's sums in another order can flip a rounding of S, which moves a value by one fine
        # step, max |S - S0| of its row / 1905, and the next layer's float16 keys and values by an ulp)
        for name in layer_ref:
            assert rel_err(layer[name].float(), layer_ref[name].float()) < 5e-4, name


def count_calls(monkeypatch, functions):
    """Wrap module.name for each pair so that every call appends its name to the returned list."""
    import importlib

    calls = []
    for module_name, name in functions:
        module = importlib.import_module(module_name)
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _o=original, _n=name, **k: calls.append(_n) or _o(*a, **k))
    return calls


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@torch.no_grad()
def test_prepare_gives_the_layers_their_kernels(tiny_model, monkeypatch):
    """A model as written runs plain torch on CUDA (its quantized layers their format's kernels); prepared,
    its layers take their kernels."""
    calls = count_calls(monkeypatch, [("edgettt.ops.linear_attention.prefill", "parallel"), ("edgettt.ops.quantized.int4", "int4_matmul")])
    model = convert(tiny_model("linear", seed=4, hidden_size=64, intermediate_size=96), "parallel")
    quantize_model(model, QuantConfig(weights="int4", group_size=32))
    ids = torch.zeros(1, 20, dtype=torch.long, device="cuda")
    model.cuda()(ids)
    assert calls == ["int4_matmul"] * len(calls) and calls
    calls.clear()
    prepare(model, FastPaths(dtype=torch.float32, compile=False))(ids)
    assert "parallel" in calls and "int4_matmul" in calls
