"""The whole-token decode kernel (`ops.linear_attention.decode_token`) against its plain-torch reference, and the
reference against the converted layer's own decode (CPU: Triton interpreter; GPU: compiled)."""

import copy

import pytest
import torch

from conftest import compiled_recording, rel_err
from edgettt.ops.linear_attention import decode_token as dt
from edgettt.ops.linear_attention.decode_token import (decode_token, decode_token_int12, decode_token_int12_ref,
                                                       decode_token_ref)

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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(2, 3, 16), (1, 1, 24)])
@pytest.mark.parametrize("inner", [1, 3])  # 3 commits (b = 4)
def test_decayed_decode_tokens_match_their_references(device, shape, inner):
    """Both tokens with a decay (gamma a head): at the commit S0 + gamma (S - S0) + eta_b A (float state) and
    the same rounded to the grid (the int8 format); a token inside the mini-batch is unchanged by it."""
    eta = torch.tensor([1.0, 0.5, 0.3, 0.25], device=device)
    q, k, v, lr, S0, gamma, beta, S, A = inputs(*shape, torch.float32, device)
    decay = torch.linspace(0.5, 1.0, shape[1], device=device)
    S_ref, A_ref, S_plain, A_plain = S.clone(), A.clone(), S.clone(), A.clone()
    want = decode_token_ref(q, k, v, lr, S0, gamma, beta, S_ref, A_ref, eta, inner, 10000.0, decay=decay)
    got = decode_token(q, k, v, lr, S0, gamma, beta, S, A, eta, inner, 10000.0, decay=decay)
    decode_token_ref(q, k, v, lr, S0, gamma, beta, S_plain, A_plain, eta, inner, 10000.0)
    assert rel_err(got, want) < 1e-5 and rel_err(S, S_ref) < 1e-5 and rel_err(A, A_ref) < 1e-5 + (inner == 3)
    assert (rel_err(S_ref, S_plain) > 1e-2) == (inner == 3)  # the decay acts at the commit only
    S8, K, V = int8_state(*shape, 4, inner, S0, device)
    S8_ref, K_ref, V_ref = S8.clone(), K.clone(), V.clone()
    want = decode_token_int12_ref(q, k, v, lr, S0, gamma, beta, S8_ref, K_ref, V_ref, eta, inner, 10000.0, decay=decay)
    got = decode_token_int12(q, k, v, lr, S0, gamma, beta, S8, K, V, eta, inner, 10000.0, decay=decay)
    assert rel_err(got, want) < 3e-4
    step = (S8_ref - S0).abs().amax(-1, keepdim=True) / 127
    assert ((S8 - S8_ref).abs() <= step / 14 + 1e-6).all()


def int8_state(B, H, D, b, inner, S0, device, seed=1):
    """An int8-format state in the middle of a mini-batch: S on the grid around S0, slots 0..inner-1 filled
    (float16 keys with their bias 1, values), the rest zero."""
    from edgettt.formats.state_formats import two_level_round

    g = torch.Generator().manual_seed(seed)
    S = two_level_round(S0.float().cpu() + 0.3 * torch.randn(B, H, D + 1, D, generator=g), S0.float().cpu())
    K = torch.zeros(B, H, b, D + 1)
    K[:, :, :inner, :D] = torch.randn(B, H, inner, D, generator=g)
    K[:, :, :inner, D] = 1.0
    V = torch.zeros(B, H, b, D)
    V[:, :, :inner] = 0.1 * torch.randn(B, H, inner, D, generator=g)
    return S.to(device), K.half().to(device), V.half().to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(2, 3, 16), (1, 2, 64), (1, 1, 24)])  # 24: padded blocks
@pytest.mark.parametrize("inner", [0, 1, 3])  # 3 commits (b = 4): S rounded to the grid, the slots emptied
@pytest.mark.parametrize("at_state", [False, True])
def test_decode_token_int12_matches_reference(device, shape, inner, at_state):
    """The int8 state format's token (S on its grid, the open mini-batch's keys and values in float16 slots):
    the output, the slot it writes, and at a commit S rounded to the grid (a rounding may differ by one fine
    step where float noise meets a half-way point; nowhere by more) and the slots emptied."""
    eta = torch.tensor([1.0, 0.5, 0.3, 0.25], device=device)
    q, k, v, lr, S0, gamma, beta, _, _ = inputs(*shape, torch.float32, device)
    S, K, V = int8_state(*shape, 4, inner, S0, device)
    S_ref, K_ref, V_ref = S.clone(), K.clone(), V.clone()
    want = decode_token_int12_ref(q, k, v, lr, S0, gamma, beta, S_ref, K_ref, V_ref, eta, inner, 10000.0, at_state)
    got = decode_token_int12(q, k, v, lr, S0, gamma, beta, S, K, V, eta, inner, 10000.0, at_state)
    # the token's ka and vh are rounded to float16 for its slot: float noise that flips one of those roundings
    # moves the output by ~1e-4 (measured up to 5e-5), so 3e-4; a wrong term moves it by 1e-2 and more
    assert not torch.isnan(got).any() and rel_err(got, want) < 3e-4
    assert rel_err(K.float(), K_ref.float()) < 1e-3 and rel_err(V.float(), V_ref.float()) < 1e-3
    if inner < 3:
        assert torch.equal(S, S_ref)
        return
    assert (K == 0).all() and (V == 0).all()
    step = (S_ref - S0).abs().amax(-1, keepdim=True) / 127
    off = (S - S_ref).abs() > 1e-6 * S_ref.abs().max()
    assert ((S - S_ref).abs() <= step / 14 + 1e-6).all() and off.float().mean() < 1e-3


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(2, 3, 16), (1, 2, 64), (1, 1, 24)])  # 24: three Hadamard blocks of 8
@pytest.mark.parametrize("inner", [1, 3])
def test_decode_token_int12_kv8_rounds_the_tokens_key_and_value_as_the_format_does(device, shape, inner):
    """The int12-kv8 format's token (`rotation` given): the token's key on an int8 grid in the Hadamard-rotated
    basis and its value on one of its own before its slot and its own score, as `int8_rotated_keys` and
    `int8_slots` round them, and at the commit S from those slots. (Measured: within 2e-7 of the reference. A
    rounding flipped by float noise would move a slot by one int8 step of its row, 1/127 of its largest value:
    hence 1e-2 for the slots and 3e-4 for the output. The same key kept in float16 is 3e-3 off its rounded slot.)"""
    from edgettt.formats.state_formats import hadamard

    eta = torch.tensor([1.0, 0.5, 0.3, 0.25], device=device)
    q, k, v, lr, S0, gamma, beta, _, _ = inputs(*shape, torch.float32, device)
    S, K, V = int8_state(*shape, 4, inner, S0, device)
    rotation = hadamard(shape[2]).to(device)
    runs = {}
    for name, fn, rot in (("ref", decode_token_int12_ref, rotation), ("kernel", decode_token_int12, rotation),
                          ("float16 slots", decode_token_int12_ref, None)):
        state = (S.clone(), K.clone(), V.clone())
        runs[name] = (fn(q, k, v, lr, S0, gamma, beta, *state, eta, inner, 10000.0, False, None, rot), state)
    (want, (S_ref, K_ref, V_ref)), (got, (S_got, K_got, V_got)) = runs["ref"], runs["kernel"]
    assert not torch.isnan(got).any() and rel_err(got, want) < 3e-4
    if inner < 3:
        assert rel_err(K_got.float(), K_ref.float()) < 1e-2 and rel_err(V_got.float(), V_ref.float()) < 1e-2
        assert rel_err(runs["float16 slots"][1][1].float(), K_ref.float()) > 2e-3  # (the rounding is there to see)
    else:
        assert (K_got == 0).all() and (V_got == 0).all() and rel_err(S_got, S_ref) < 1e-4


@pytest.mark.parametrize("form,batch,state_format", [("parallel", 2, "fp32"), ("exact", 2, "fp32"),
                                                     ("exact", 1, "fp32"), ("parallel", 2, "int12"), ("exact", 1, "int12"),
                                                     ("decayed", 2, "fp32"), ("decayed", 2, "int12"),
                                                     ("parallel", 2, "int12-kv8")])
def test_a_compiled_step_through_the_token_op_decodes_as_the_layers(tiny_model, form, batch, state_format):
    """A converted TTT-Linear model stepping through `edgettt::decode_token` (the reference on the
    CPU; aot_eager stands in for inductor) gives the torch path's logits and state across a commit, and the
    traced graph holds the op once a layer; with the int8 state format through `edgettt::decode_token_int12`
    (S rounded at the commit: the same grid, up to a rounding flipped by float noise, hence 1e-4)."""
    from edgettt import convert
    from edgettt.quant import apply_state_format
    from edgettt.benchmark import copy_state
    from edgettt.fast_paths.layers import use_compiled_decode

    model = tiny_model("linear", seed=3, mini_batch_size=8, use_gate=batch == 1)
    model = (convert(model, "parallel", decay=0.7) if form == "decayed" else convert(model, form)).eval()
    if state_format != "fp32":
        apply_state_format(model, state_format)
    ids = torch.randint(0, 61, (batch, 24), generator=torch.Generator().manual_seed(1))
    tol = 1e-5 if state_format == "fp32" else 1e-4
    int8 = state_format.startswith("int12")
    with torch.no_grad():
        _, state = model.prefill(ids[:, :13])
        other = copy_state(state)
        plain = copy.deepcopy(model)
        assert use_compiled_decode(model) == model.config.num_hidden_layers
        step, graphs = compiled_recording(model.step)
        for t in range(13, 24):
            want, state = plain.step(ids[:, t], state)  # eager: the layer as written
            got, other = step(ids[:, t], other)
            assert rel_err(got, want) < tol, t
    torch._dynamo.reset()
    op = torch.ops.edgettt.decode_token_int12 if int8 else torch.ops.edgettt.decode_token
    assert len(graphs) >= 8 and all(sum(n.target in (op, op.default) for n in gm.graph.nodes) ==
                                    model.config.num_hidden_layers for gm in graphs)  # every place compiled
    for a, b in zip(state.layers, other.layers):
        for name in a:
            assert rel_err(b[name].float(), a[name].float()) < tol, name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("warps", [2, 4, 8])
def test_token_kernels_match_their_references_at_every_warp_count(device, warps, monkeypatch):
    """`decode_token.token_warps` picks 2, 4 or 8 warps by head size and state format: each count
    (forced: `token_warps` replaced) gives the reference's token (a d = 64 head: a 125m layer's), inside a mini-batch and at
    its commit."""
    eta = torch.tensor([1.0, 0.5, 0.3, 0.25], device=device)
    monkeypatch.setattr(dt, "token_warps", lambda block_d, commit, int8: warps)
    for inner in (1, 3):
        q, k, v, lr, S0, gamma, beta, S, A = inputs(1, 2, 64, torch.float32, device)
        S_ref, A_ref = S.clone(), A.clone()
        want = decode_token_ref(q, k, v, lr, S0, gamma, beta, S_ref, A_ref, eta, inner, 10000.0)
        got = decode_token(q, k, v, lr, S0, gamma, beta, S, A, eta, inner, 10000.0)
        assert rel_err(got, want) < 1e-5 and rel_err(S, S_ref) < 1e-5
        S8, K, V = int8_state(1, 2, 64, 4, inner, S0, device)
        S8_ref, K_ref, V_ref = S8.clone(), K.clone(), V.clone()
        want = decode_token_int12_ref(q, k, v, lr, S0, gamma, beta, S8_ref, K_ref, V_ref, eta, inner, 10000.0)
        got = decode_token_int12(q, k, v, lr, S0, gamma, beta, S8, K, V, eta, inner, 10000.0)
        assert rel_err(got, want) < 3e-4


def test_token_warps_follow_the_head_size_and_state():
    """The measured choice (compiled_decode_h200.md): 2 warps at d <= 64, 8 (float) / 4 (int8) at the
    128-wide tiles of d = 96, 8 at an int8 commit."""
    assert [dt.token_warps(64, False, False), dt.token_warps(64, False, True), dt.token_warps(64, True, True)] == [2, 2, 8]
    assert [dt.token_warps(128, True, False), dt.token_warps(128, False, True), dt.token_warps(128, True, True)] == [8, 4, 8]

