"""The decode-step kernel against its plain-torch reference (CPU: Triton interpreter; GPU: marked)."""

import pytest
import torch

from conftest import rel_err
from edgettt.ops.linear_attention.decode import decode_step, decode_step_ref

# on a CPU the kernels run in the Triton interpreter; with a GPU they run compiled (not on CPU tensors)
DEVICES = ["cuda"] if torch.cuda.is_available() else ["cpu"]
# named tolerances (relative RMS error)
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def inputs(B, H, DK, DV, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(device=device, dtype=dtype)  # noqa: E731
    return r(B, H, DK), r(B, H, DK), r(B, H, DV), r(B, H, DK, DV), r(B, H, DK, DV)


def dtypes(device):
    return [torch.float32, torch.float16] + ([torch.bfloat16] if device == "cuda" else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(2, 3, 17, 16), (1, 2, 49, 48), (3, 1, 65, 200)])
@pytest.mark.parametrize("inner", [0, 2, 3])  # 3 = the last of a mini-batch of 4: commit
def test_decode_step_matches_reference(device, shape, inner):
    commit = inner == 3
    for dtype in dtypes(device):
        qa, ka, vh, S, A = inputs(*shape, dtype, device)
        eta = torch.tensor([1.0, 0.4, 0.3, 0.0625], device=device)
        S_ref, A_ref = S.float().clone(), A.float().clone()
        z_ref = decode_step_ref(qa.float(), ka.float(), vh.float(), S_ref, A_ref, eta, inner)
        z = torch.full(z_ref.shape, float("nan"), dtype=dtype, device=device)  # poisoned output
        decode_step(qa, ka, vh, S, A, eta, inner, out=z)
        assert not torch.isnan(z).any()
        assert rel_err(z.float(), z_ref) < TOL[dtype], dtype
        assert rel_err(S.float(), S_ref) < TOL[dtype], dtype
        if commit:
            assert A.abs().max() == 0
        else:
            assert rel_err(A.float(), A_ref) < TOL[dtype], dtype


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(2, 3, 17, 16), (1, 2, 65, 200)])
def test_a_decayed_commit_pulls_the_state_towards_s0_as_the_recurrence_does(device, shape):
    """With a decay (gamma a head, one of them 1) the commit is S0 + gamma (S - S0) + eta_b A, as
    `linear_attention.recurrent` commits; a token inside the mini-batch is unchanged by it."""
    from edgettt.ops.linear_attention import reference as la

    B, H, DK, DV = shape
    qa, ka, vh, S, A = inputs(*shape, torch.float32, device)
    g = torch.Generator().manual_seed(5)
    S0 = torch.randn(H, DK, DV, generator=g).to(device)
    gamma = torch.linspace(0.5, 1.0, H, device=device)
    eta = torch.tensor([1.0, 0.4, 0.3, 0.0625], device=device)
    for inner in (1, 3):
        S_k, A_k = S.clone(), A.clone()
        z = decode_step(qa, ka, vh, S_k, A_k, eta, inner, decay=(gamma, S0))
        z_rec, S_rec, A_rec = la.recurrent(qa[:, :, None], ka[:, :, None], vh[:, :, None], S, A, eta, inner,
                                           decay=la.Decay(gamma, S0))
        assert rel_err(z, z_rec[:, :, 0]) < 1e-5 and rel_err(S_k, S_rec) < 1e-5 and rel_err(A_k, A_rec) < 1e-5 + (inner == 3)
        S_ref, A_ref = S.clone(), A.clone()
        decode_step_ref(qa, ka, vh, S_ref, A_ref, eta, inner, decay=(gamma, S0))
        assert rel_err(S_ref, S_rec) < 1e-5
    assert rel_err(S_k, S + eta[-1] * (A + ka[..., :, None] * vh[..., None, :])) > 1e-2  # the decay matters


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_decode_step_writes_every_state_element_on_gpu():
    qa, ka, vh, S, A = inputs(64, 16, 65, 64, torch.float32, "cuda")
    S_ref, A_ref = S.clone(), A.clone()
    eta = torch.tensor([1.0, 0.5, 0.1], device="cuda")
    decode_step_ref(qa, ka, vh, S_ref, A_ref, eta, 2)
    z = torch.full((64, 16, 64), float("nan"), device="cuda")
    decode_step(qa, ka, vh, S, A, eta, 2, out=z)
    assert not torch.isnan(z).any()
    assert torch.allclose(S, S_ref, atol=1e-4) and torch.equal(A, A_ref)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("family", ["linear", "mlp"])
def test_model_decode_with_the_kernel_equals_prefill_on_gpu(tiny_model, family):
    from edgettt import convert

    model = convert(tiny_model(family, seed=2, mini_batch_size=8, share_qk=True), "parallel").cuda()
    ids = torch.randint(0, model.config.vocab_size, (3, 29), device="cuda")
    with torch.no_grad():
        full = model(ids)
        logits, state = model.prefill(ids[:, :5])
        outs = [logits]
        for t in range(5, 29):
            step, state = model.step(ids[:, t], state)
            outs.append(step[:, None])
    assert rel_err(torch.cat(outs, 1), full) < 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(2, 3, 17, 16), (1, 2, 49, 48)])
@pytest.mark.parametrize("inner", [1, 3])
def test_int8_state_decode_step_matches_reference(device, shape, inner):
    from edgettt.ops.linear_attention.decode import decode_step_int8, decode_step_int8_ref

    B, H, DK, DV = shape
    g = torch.Generator().manual_seed(1)
    r = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
    qa, ka, vh, A = r(B, H, DK), r(B, H, DK), r(B, H, DV), r(B, H, DK, DV) * 0.1
    S0, scale = r(H, DK, DV), (torch.rand(H, DK, generator=g) * 0.02 + 0.005).to(device)
    Sq = torch.randint(-100, 100, (B, H, DK, DV), generator=g, dtype=torch.int8).to(device)
    eta = torch.tensor([1.0, 0.4, 0.3, 0.0625], device=device)
    Sq_ref, A_ref = Sq.clone(), A.clone()
    z_ref = decode_step_int8_ref(qa, ka, vh, Sq_ref, scale, S0, A_ref, eta, inner)
    z = torch.full((B, H, DV), float("nan"), device=device)
    decode_step_int8(qa, ka, vh, Sq, scale, S0, A, eta, inner, out=z)
    assert rel_err(z, z_ref) < 1e-5
    assert rel_err(A, A_ref) < 1e-5 or (inner == 3 and A.abs().max() == 0)
    # rounding may differ by one step where float noise meets a half-way point; nowhere by more
    diff = (Sq.int() - Sq_ref.int()).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() < 1e-3


def test_round_half_even_in_the_kernel_matches_torch():
    from edgettt.ops.linear_attention.decode import decode_step_int8, decode_step_int8_ref

    # ka = 0 keeps A as given, S0 = 0 and scale 1: the commit rounds eta_b * A, which holds exact ties
    device = DEVICES[0]
    B, H, DK, DV = 1, 1, 1, 8
    Sq = torch.zeros(B, H, DK, DV, dtype=torch.int8, device=device)
    A = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, 0.49, 0.51, -2.5], device=device).reshape(B, H, DK, DV)
    args = (torch.zeros(B, H, DK, device=device), torch.zeros(B, H, DK, device=device),
            torch.zeros(B, H, DV, device=device))
    scale, S0 = torch.ones(H, DK, device=device), torch.zeros(H, DK, DV, device=device)
    eta = torch.tensor([1.0, 1.0], device=device)
    Sq_ref, A_ref = Sq.clone(), A.clone()
    decode_step_int8_ref(*args, Sq_ref, scale, S0, A_ref, eta, 1)
    decode_step_int8(*args, Sq, scale, S0, A, eta, 1)
    assert torch.equal(Sq, Sq_ref) and Sq_ref.flatten().tolist() == [0, 2, 2, 0, -2, 0, 1, -2]


def int8kv_state(B, H, DK, DV, b, device, seed=2):
    """A two-level int8 state as a commit leaves it, and open-mini-batch buffers of random keys and values."""
    from edgettt.formats.state_formats import pack_fine, two_level_codes

    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    S0 = r(H, DK, DV)
    coarse, fine, step = two_level_codes(S0 + 0.3 * r(B, H, DK, DV), S0)
    K, V = r(B, H, b, DK).half(), r(B, H, b, DV).half()
    state = [coarse.to(torch.int8), pack_fine(fine), step[..., 0], S0, K, V]
    return [t.to(device) for t in state]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(2, 3, 17, 16), (1, 2, 65, 64), (2, 1, 33, 6)])
@pytest.mark.parametrize("inner", [0, 2, 3])  # 3 = the last of a mini-batch of 4: commit
def test_int8kv_state_decode_step_matches_reference(device, shape, inner):
    from edgettt.ops.linear_attention.decode import decode_step_int12, decode_step_int12_ref
    from edgettt.formats.state_formats import two_level_values, unpack_fine

    B, H, DK, DV = shape
    g = torch.Generator().manual_seed(3)
    qa, ka, vh = (torch.randn(*s, generator=g).to(device) for s in ((B, H, DK), (B, H, DK), (B, H, DV)))
    eta = torch.tensor([1.0, 0.4, 0.3, 0.0625], device=device)
    state = int8kv_state(B, H, DK, DV, 4, device)
    state_ref = [t.clone() for t in state]
    z_ref = decode_step_int12_ref(qa, ka, vh, *state_ref, eta, inner)
    z = torch.full((B, H, DV), float("nan"), device=device)
    decode_step_int12(qa, ka, vh, *state, eta, inner, out=z, rows=16)
    assert rel_err(z, z_ref) < 1e-5
    C8, C4, step, S0, K, V = state
    assert torch.equal(K[:, :, inner], state_ref[4][:, :, inner]) and torch.equal(V, state_ref[5])
    assert torch.equal(K, state_ref[4])
    if inner < 3:  # no commit: the codes stay as they were
        assert all(torch.equal(a, b) for a, b in zip(state[:3], state_ref[:3]))
        return
    assert rel_err(step, state_ref[2]) < 1e-6
    # a rounding may differ by one fine step where float noise meets a half-way point; nowhere by more
    S = two_level_values(C8.float(), unpack_fine(C4), step[..., None], S0)
    S_ref = two_level_values(state_ref[0].float(), unpack_fine(state_ref[1]), state_ref[2][..., None], S0)
    off = (S - S_ref).abs() > 1e-5 * S_ref.abs().max()
    assert ((S - S_ref).abs() <= step[..., None] / 14).all() and off.float().mean() < 1e-3


@pytest.mark.parametrize("device", DEVICES)
def test_int8kv_state_steps_through_a_mini_batch_as_the_model_rounds(device):
    """b steps from a fresh state through the kernel equal the model's own arithmetic: values at the
    float16 keys and values, and at the commit S rounded with `two_level_round`."""
    from edgettt.ops.linear_attention.decode import decode_step_int12
    from edgettt.formats.state_formats import two_level_round, two_level_values, unpack_fine

    B, H, DK, DV, b = 2, 2, 9, 8, 4
    g = torch.Generator().manual_seed(4)
    S0 = torch.randn(H, DK, DV, generator=g)
    eta = torch.tensor([0.5, 0.4, 0.3, 0.2])
    state = [torch.zeros(B, H, DK, DV, dtype=torch.int8), torch.full((B, H, DK, DV // 2), 0x88, dtype=torch.uint8),
             torch.zeros(B, H, DK), S0, torch.zeros(B, H, b, DK, dtype=torch.float16),
             torch.zeros(B, H, b, DV, dtype=torch.float16)]
    state = [t.to(device) for t in state]
    S, A = S0.expand(B, H, DK, DV).clone(), torch.zeros(B, H, DK, DV)
    for i in range(b):
        qa, ka, vh = (torch.randn(*s, generator=g) for s in ((B, H, DK), (B, H, DK), (B, H, DV)))
        ka16, vh16 = ka.half().float(), vh.half().float()
        A = A + ka16[..., :, None] * vh16[..., None, :]
        z_model = (qa[..., None, :] @ (S + eta[i] * A))[..., 0, :]
        z = decode_step_int12(*(t.to(device) for t in (qa, ka, vh)), *state, eta.to(device), i)
        assert rel_err(z.cpu(), z_model) < 1e-5
    S = two_level_round(S + eta[-1] * A, S0)
    C8, C4, step = (t.cpu() for t in state[:3])
    assert rel_err(two_level_values(C8.float(), unpack_fine(C4), step[..., None], S0), S) < 1e-5
