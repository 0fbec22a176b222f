"""The whole-token decode kernel (`kernels.decode_token`) against its plain-torch reference, and the
reference against the converted layer's own decode (CPU: Triton interpreter; GPU: compiled)."""

import pytest
import torch

from conftest import compiled_recording, rel_err
from edgettt.kernels.decode_token import decode_token, decode_token_ref, use_token_kernel

DEVICES = ["cuda"] if torch.cuda.is_available() else ["cpu"]
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 3e-2}


def inputs(B, H, D, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, scale=1.0: (scale * torch.randn(*s, generator=g)).to(device=device, dtype=dtype)  # noqa: E731
    lr = torch.rand(B, H, generator=g).to(device=device, dtype=dtype)
    return (r(B, H, D), r(B, H, D), r(B, H, D), lr, r(H, D + 1, D, scale=0.3), 1 + r(H, D, scale=0.1),
            r(H, D, scale=0.1), r(B, H, D + 1, D, scale=0.3), r(B, H, D + 1, D, scale=0.1))


def dtypes(device):
    return [torch.float32, torch.float16] + ([torch.bfloat16] if device == "cuda" else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(2, 3, 16), (1, 2, 64), (1, 1, 24)])  # 24: padded blocks
@pytest.mark.parametrize("inner", [0, 1, 3])  # 1: an int argument Triton takes as a constant; 3 commits (b = 4)
@pytest.mark.parametrize("at_state", [False, True])  # values at S0 (parallel form) or at S (exact)
def test_decode_token_matches_reference(device, shape, inner, at_state):
    eta = torch.tensor([1.0, 0.5, 0.3, 0.25], device=device)
    for dtype in dtypes(device):
        q, k, v, lr, S0, gamma, beta, S, A = inputs(*shape, dtype, device)
        S_ref, A_ref = S.float().clone(), A.float().clone()
        want = decode_token_ref(q.float(), k.float(), v.float(), lr.float(), S0.float(), gamma.float(),
                                beta.float(), S_ref, A_ref, eta, inner, 10000.0, at_state)
        got = decode_token(q, k, v, lr, S0, gamma, beta, S, A, eta, inner, 10000.0, at_state)
        assert not torch.isnan(got).any() and got.dtype == dtype
        assert rel_err(got.float(), want) < TOL[dtype], dtype
        assert rel_err(S.float(), S_ref) < TOL[dtype] and rel_err(A.float(), A_ref) < TOL[dtype] + (inner == 3), dtype
        if inner == 3:
            assert (A == 0).all()  # committed


@pytest.mark.parametrize("form", ["parallel", "exact"])
def test_a_compiled_step_through_the_token_op_decodes_as_the_layers(tiny_model, form):
    """A converted TTT-Linear model stepping through `edgettt::decode_token` (the reference on the
    CPU; aot_eager stands in for inductor) gives the torch path's logits and state across a commit, and the
    traced graph holds the op once a layer."""
    from edgettt import convert
    from edgettt.speed import _copy_state

    model = convert(tiny_model("linear", seed=3, mini_batch_size=8), form).eval()
    ids = torch.randint(0, 61, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, state = model.prefill(ids[:, :13])
        other = _copy_state(state)
        assert use_token_kernel(model) == model.config.num_hidden_layers
        step, graphs = compiled_recording(model.step)
        for t in range(13, 24):
            want, state = model.step(ids[:, t], state)  # eager: the layer's torch path
            got, other = step(ids[:, t], other)
            assert rel_err(got, want) < 1e-5, t
    torch._dynamo.reset()
    op = torch.ops.edgettt.decode_token
    assert graphs and all(sum(n.target in (op, op.default) for n in gm.graph.nodes) == model.config.num_hidden_layers
                          for gm in graphs)
    for a, b in zip(state.layers, other.layers):
        for name in a:
            assert rel_err(b[name], a[name]) < 1e-5, name
