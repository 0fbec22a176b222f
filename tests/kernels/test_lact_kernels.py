"""LaCT's parallel-form kernels (feature map, chunk-exclusive attention) and decode step against their
plain-torch references (CPU: Triton interpreter; GPU: marked), and the parallel form through them."""

import pytest
import torch

from conftest import rel_err
from edgettt.ops.lact import triton as lact

DEVICES = ["cuda"] if torch.cuda.is_available() else ["cpu"]
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def dtypes(device):
    return [torch.float32, torch.float16] + ([torch.bfloat16] if device == "cuda" else [])


def randn(*shape, device, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rate", [None, "token", "feature"])
@pytest.mark.parametrize("shape", [(1, 2, 37, 16, 24), (2, 1, 20, 48, 40)])  # B, H, T, d, dh
@pytest.mark.parametrize("rank", [None, 4, 20])  # dense W0, W2, or low-rank ones (LaCT's w0_w2_low_rank)
def test_features_match_reference(device, rate, shape, rank):
    for dtype in dtypes(device):
        check_features(device, rate, shape, dtype, rank)


def fast_weight(H, dh, d, rank, device, seed):
    if rank is None:
        return randn(H, dh, d, device=device, seed=seed, scale=d ** -0.5)
    return lact.LowRank(randn(H, dh, rank, device=device, seed=seed, scale=rank ** -0.5),
                        randn(H, rank, d, device=device, seed=seed + 10, scale=d ** -0.5))


def as_dtype(w, dtype):
    """The weights as the kernel reads them (rounded to the inputs' dtype), in float32."""
    if isinstance(w, lact.LowRank):
        return lact.LowRank(as_dtype(w.left, dtype), as_dtype(w.right, dtype))
    return w.to(dtype).float()


def check_features(device, rate, shape, dtype, rank=None):
    B, H, T, d, dh = shape
    w0, w2 = fast_weight(H, dh, d, rank, device, 1), fast_weight(H, dh, d, rank, device, 2)
    r = None if rate is None else randn(B, H, T, 1 if rate == "token" else dh, device=device, seed=3).abs()
    # x as the model hands it over: heads of a [B, T, H * d] tensor (not contiguous)
    x = randn(B, T, H * d, device=device, dtype=dtype).reshape(B, T, H, d).transpose(1, 2)
    want = lact.features_ref(x.float(), as_dtype(w0, dtype), as_dtype(w2, dtype), r)
    if rank is not None:  # the factors' reference is the product's
        dense = lact.features_ref(x.float(), w0.dense(), w2.dense(), r)
        assert rel_err(lact.features_ref(x.float(), w0, w2, r), dense) < 1e-5
    got = lact.features(x, w0, w2, r)
    assert got.dtype == dtype and got.shape == (B, H, T, dh)
    assert rel_err(got.float(), want) < TOL[dtype], dtype


def attention_inputs(B, H, T, dv, dh, device, dtype, momentum, chunk, front):
    N = lact.chunk_count(front, T, chunk)
    phi_q, keys = randn(B, H, T, dh, device=device, dtype=dtype, seed=4), randn(B, H, T, dh, device=device, dtype=dtype, seed=5, scale=0.1)
    v = randn(B, T, H * dv, device=device, dtype=dtype, seed=6).reshape(B, T, H, dv).transpose(1, 2)
    w1, u0 = randn(B, H, dv, dh, device=device, seed=7), randn(B, H, dv, dh, device=device, seed=8, scale=0.1)
    d_in = randn(B, H, dv, dh, device=device, seed=9, scale=0.1) if momentum else None
    m = (torch.rand(B, H, N, generator=torch.Generator().manual_seed(10)) * 0.9 + 0.05).to(device) if momentum else None
    return phi_q, keys, v, w1, u0, d_in, m


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("momentum", [False, True])
@pytest.mark.parametrize("case", [(1, 2, 64, 16, 16, 16, 0), (2, 1, 45, 24, 40, 16, 5),  # B, H, T, dv, dh, chunk, front
                                  (1, 1, 13, 16, 16, 32, 7), (1, 2, 96, 32, 16, 32, 0)])
def test_chunk_attention_matches_reference(device, momentum, case):
    for dtype in dtypes(device):
        check_chunk_attention(device, momentum, case, dtype)


def check_chunk_attention(device, momentum, case, dtype):
    B, H, T, dv, dh, chunk, front = case
    args = attention_inputs(B, H, T, dv, dh, device, dtype, momentum, chunk, front)
    want, want_ends = lact.chunk_attention_ref(*(a.float() if a is not None and a.dtype != torch.float32 else a
                                                 for a in args), chunk, front)
    got, ends = lact.chunk_attention(*args, chunk, front)
    assert not torch.isnan(got).any() and got.dtype == dtype
    assert rel_err(got.float(), want) < TOL[dtype], dtype
    for name, value in want_ends.items():
        assert rel_err(ends[name], value) < TOL[dtype], (dtype, name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [(1, 2, 64, 16, 0), (2, 1, 45, 16, 5), (1, 1, 13, 32, 7), (2, 3, 300, 128, 100)])
def test_chunk_momenta_match_reference(device, case):
    B, H, T, chunk, front = case
    gates = torch.rand(B, H, T, generator=torch.Generator().manual_seed(0)).to(device)
    gate_in = torch.rand(B, H, generator=torch.Generator().manual_seed(1)).to(device) * front
    want = lact.chunk_momenta_ref(gates, gate_in, chunk, front)
    got = lact.chunk_momenta(gates, gate_in, chunk, front)
    assert got[0].shape == want[0].shape == (B, H, lact.chunk_count(front, T, chunk))
    for a, b in zip(got, want):
        assert rel_err(a, b) < 1e-6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("momentum", [False, True])
@pytest.mark.parametrize("commit", [False, True])
@pytest.mark.parametrize("dims", [(16, 16), (24, 40)])
def test_decode_step_matches_reference(device, momentum, commit, dims):
    dv, dh = dims
    B, H = 3, 2
    for dtype in dtypes(device):
        phi_q, key = randn(B, H, dh, device=device, dtype=dtype, seed=1), randn(B, H, dh, device=device, dtype=dtype, seed=2)
        v = randn(B, H, dv, device=device, dtype=dtype, seed=3)
        state = [randn(B, H, dv, dh, device=device, seed=s) for s in (4, 5, 6)]
        m = torch.rand(B, H).to(device) if momentum else None
        ref = [s.clone() for s in state]
        want = lact.decode_step_ref(phi_q.float(), key.float(), v.float(), ref[0], ref[1], ref[2] if momentum else None,
                                    m, commit)
        got = lact.decode_step(phi_q, key, v, state[0], state[1], state[2] if momentum else None, m, commit)
        assert rel_err(got.float(), want.float()) < TOL[dtype], dtype
        for a, b in zip(state, ref):
            assert rel_err(a, b) < TOL[torch.float32] or (a == b).all(), dtype
        if commit:
            assert state[1].abs().max() == 0


def test_exported_chunk_count_is_a_ceiling():
    assert [lact.chunk_count(f, T, 8) for f, T in [(0, 29), (0, 8), (3, 5), (3, 6), (7, 1)]] == [4, 1, 1, 2, 1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("momentum", [False, True])
@pytest.mark.parametrize("low_rank", [-1, 8])
def test_the_parallel_form_through_the_kernels_equals_the_references_on_gpu(momentum, low_rank, monkeypatch):
    """A W1-only LaCT model's prefill in pieces (chunk boundaries inside pieces), kernels against
    the model as written, fp32: outputs and the carried state."""
    from edgettt.fast_paths import use_kernels

    import sys
    sys.path.insert(0, __file__.rsplit("/kernels/", 1)[0])
    from test_lact import W1_ONLY, random_model

    model = random_model(**W1_ONLY, use_momentum=momentum, w0_w2_low_rank=low_rank, form="parallel",
                         vocab_size=256).cuda()
    ids = torch.randint(0, 256, (2, 77), device="cuda")

    def run():
        state = model.init_state(2)
        with torch.no_grad():
            a, state = model.prefill(ids[:, :30], state)
            b, state = model.prefill(ids[:, 30:], state)
        return torch.cat((a, b), dim=1), state

    slow, st_slow = run()
    use_kernels(model)
    fast, st_fast = run()
    assert rel_err(fast, slow) < 1e-5
    for la, lb in zip(st_fast.layers, st_slow.layers):
        for name in la:
            assert rel_err(la[name], lb[name]) < 1e-5 or (la[name] == lb[name]).all(), name
