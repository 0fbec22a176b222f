"""`fused_products`: a compiled decode step's int4 products with their norm, activation and residual add in one
op (`edgettt::int4_linear_fused`, the GEMV kernel on CUDA, its reference here): which products fuse, that the
step gives the eager step's logits and state, and that nothing changes outside a compiled step."""

import copy

import pytest
import torch
from torch import nn

from conftest import compiled_recording, rel_err


def int4_model():
    import edgettt
    from edgettt.quant import QuantConfig

    return edgettt.quantize(edgettt.load("ttt-linear-tiny-parallel"), QuantConfig("int4", 64))


def op_calls(graphs, name: str, last_arg=None) -> int:
    """Calls of op `name` in the graphs (with `last_arg`: those whose last argument is that)."""
    op = getattr(torch.ops.edgettt, name)
    return sum(node.target in (op, op.default) and (last_arg is None or node.args[-1] == last_arg)
               for gm in graphs for node in gm.graph.nodes)


@pytest.mark.parametrize("batch,fused_per_layer,activations", [(3, 3, "float"), (9, 0, "float"), (3, 3, "int8")])
def test_a_compiled_step_fuses_the_o_gate_up_and_down_products_and_steps_as_eager(batch, fused_per_layer, activations):
    """Each layer's output projection (with the mixer's LayerNorm and the residual), gate/up (with the MLP's
    RMSNorm, SwiGLU's activation applied to its halves as it stores) and down projection (with the residual)
    are one fused op each within the GEMV's rows (batch <= 8), none above; q/k/v stay `int4_linear` (the mixer's normed input also feeds
    its learning rates). The compiled step (AOT autograd: the CPU's stand-in for inductor) gives the unfused
    eager step's logits and state; with int8 activations too (the fused products' W4A8 GEMV rounding the norm's
    output as the eager int4 layer rounds it)."""
    from edgettt.fast_paths.fused_products import use_fused_products
    from edgettt.families.base import fuse_input_projections
    from edgettt.quant import set_activations, stacked_projection
    from edgettt.benchmark import copy_state

    model = int4_model().eval()
    fuse_input_projections(model, stacked_projection)  # gate/up one product, as `bench --device cuda` runs
    set_activations(model, activations, decode=True)  # (int8: the decode GEMVs in W4A8 too)
    plain = copy.deepcopy(model)
    assert use_fused_products(model) > 0
    ids = torch.randint(0, 256, (batch, 22), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, state = model.prefill(ids[:, :20])
        compiled_state = copy_state(state)
        step, graphs = compiled_recording(model.step)
        for t in range(20, 22):
            want, state = plain.step(ids[:, t], state)
            got, compiled_state = step(ids[:, t], compiled_state)
            assert rel_err(got, want) < 1e-5
    torch._dynamo.reset()
    layers = model.config.num_hidden_layers
    assert graphs and op_calls(graphs, "int4_linear_fused") == fused_per_layer * layers * len(graphs)
    assert op_calls(graphs, "int4_linear_fused", last_arg=True) == (fused_per_layer > 0) * layers * len(graphs)  # glu
    a8 = sum(node.args[-2] for gm in graphs for node in gm.graph.nodes if "int4_linear_fused" in str(node.target))
    assert a8 == (activations == "int8") * fused_per_layer * layers * len(graphs)
    assert op_calls(graphs, "int4_linear") >= (4 - fused_per_layer) * layers * len(graphs)
    for a, b in zip(state.layers, compiled_state.layers):
        for name in a:
            assert rel_err(b[name].float(), a[name].float()) < 1e-5, name


def test_fused_layers_compute_as_before_above_the_gemv_rows():
    """A prefill (more rows than a GEMV) is the modules' composition: fusing changes no bit."""
    from edgettt.fast_paths.fused_products import use_fused_products

    model = int4_model().eval()
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids)
        use_fused_products(model)
        assert torch.equal(model(ids), before)


@pytest.mark.parametrize("norm,kind", [("rms", "rms"), (nn.LayerNorm(8), "layer"),
                                       (nn.LayerNorm(8, bias=False), None),
                                       (nn.LayerNorm(8, elementwise_affine=False), None), (nn.Identity(), None)])
def test_the_norms_a_fused_product_applies(norm, kind):
    from edgettt.fast_paths.fused_products import norm_kind
    from edgettt.families.base import RMSNorm

    assert norm_kind(RMSNorm(8, 1e-6) if norm == "rms" else norm) == kind


@pytest.mark.parametrize("weights,marked", [("int4", 5 * 7), ("int8", 0), ("none", 0)])
def test_only_int4_layers_are_marked(weights, marked):
    """Every int4 layer (q, k, v, o, gate, up, down of the 5 layers; the tied head stays float), nothing of
    another format."""
    import edgettt
    from edgettt.fast_paths.fused_products import use_fused_products
    from edgettt.quant import QuantConfig

    model = edgettt.load("ttt-linear-tiny-parallel")
    if weights != "none":
        model = edgettt.quantize(model, QuantConfig(weights, 64))
    assert use_fused_products(model) == marked
