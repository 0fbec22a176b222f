"""`row_products.use_row_products`: a compiled batch-1 decode step's float weight products as products and
sums (the TTT models and the transformer baseline): the traced graph holds no linear layer at one row and
keeps them at two, quantized layers keep their kernels' ops, and the step gives the eager step's logits
and state (the CPU proxy: dynamo's graph through AOT autograd, as inductor receives it)."""

import pytest
import torch
import torch.nn.functional as F

from conftest import compiled_recording, rel_err


def calls(graphs, targets) -> int:
    return sum(node.target in targets for gm in graphs for node in gm.graph.nodes)


LINEAR = {F.linear, torch._C._nn.linear}


def format_op(weights: str) -> set:
    op = getattr(torch.ops.edgettt, f"{weights}_linear")
    return {op, op.default}


def build(kind: str, weights: str):
    import edgettt
    from edgettt.benchmark.llama import Llama, LlamaConfig
    from edgettt.quant import QuantConfig

    if kind == "llama":
        torch.manual_seed(0)
        return Llama(LlamaConfig(64, 2, 4, 128, 100)).eval()
    model = edgettt.load("ttt-linear-tiny-parallel")
    return model if weights == "none" else edgettt.quantize(model, QuantConfig(weights, 64))


def compiled_steps(model, batch: int, steps: int = 3):
    """(eager logits and state, compiled logits and state, dynamo's graphs) after a prefill of 10 tokens."""
    from edgettt.benchmark import copy_state

    llama = not hasattr(model, "form")
    ids = torch.randint(0, 100, (batch, 10 + steps), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, state = model.prefill(ids[:, :10], model.init_state(batch, 10 + steps) if llama else None)
        other = copy_state(state) if not llama else model.prefill(ids[:, :10], model.init_state(batch, 10 + steps))[1]
        step, graphs = compiled_recording(model.step)
        for t in range(10, 10 + steps):
            want, state = model.step(ids[:, t], state)
            got, other = step(ids[:, t], other)
    torch._dynamo.reset()
    return (want, state), (got, other), graphs


@pytest.mark.parametrize("kind,weights", [("parallel", "none"), ("parallel", "int8"), ("parallel", "int4"),
                                          ("llama", "none")])
def test_one_row_multiplies_as_products_and_sums_and_steps_as_eager(kind, weights):
    from edgettt.fast_paths.row_products import use_row_products

    from edgettt.quant import QuantLinear

    model = build(kind, weights)
    assert use_row_products(model) > 0
    (want, state), (got, other), graphs = compiled_steps(model, batch=1)
    assert graphs and calls(graphs, LINEAR) == 0
    if weights != "none":  # each quantized layer through its kernel's op, once a graph
        layers = sum(isinstance(m, QuantLinear) for m in model.modules())
        assert calls(graphs, format_op(weights)) == layers * len(graphs)
    assert rel_err(got, want) < 1e-5
    if kind != "llama":
        for a, b in zip(state.layers, other.layers):
            for name in a:
                assert rel_err(b[name].float(), a[name].float()) < 1e-5, name


def test_two_rows_keep_their_matmuls():
    from edgettt.fast_paths.row_products import use_row_products

    model = build("parallel", "none")
    use_row_products(model)
    (want, _), (got, _), graphs = compiled_steps(model, batch=2, steps=1)
    assert calls(graphs, LINEAR) > 0 and rel_err(got, want) < 1e-5


def test_eager_and_saved_weights_are_unchanged(tmp_path):
    import edgettt
    from edgettt.fast_paths.row_products import RowProductLinear, use_row_products

    model = build("parallel", "none")
    ids = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        before = model(ids)
        use_row_products(model)
        after = model(ids)
    assert torch.equal(before, after) and isinstance(model.lm_head, RowProductLinear)
    edgettt.save(model, tmp_path / "m")
    assert torch.equal(edgettt.load(str(tmp_path / "m"))(ids), before)


def test_row_products_are_the_default_only_where_they_were_measured_to_pay():
    """`bench --device cuda --compile` leaves the choice to `row_products_pay` unless asked: the 125m preset
    (hidden 768, 1.27x on the H200) takes row products, the 760m (hidden 1536, 0.93x) keeps cuBLAS."""
    from types import SimpleNamespace

    from edgettt.families.ttt.config import PRESETS
    from edgettt.fast_paths.row_products import row_products_pay
    from edgettt.benchmark import CudaOptions

    assert CudaOptions().row_products is None
    pays = {name: row_products_pay(SimpleNamespace(config=SimpleNamespace(**PRESETS[name]))) for name in ("125m", "760m")}
    assert pays == {"125m": True, "760m": False}
