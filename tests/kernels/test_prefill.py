"""The parallel- and exact-form prefill kernels against their plain-torch references.

CPU: the Triton interpreter, fp32 and fp16; GPU (marked): compiled, bf16 too, the paper's shape."""

import functools

import pytest
import torch

from conftest import rel_err
from edgettt.ops.linear_attention import prefill

DEVICES = ["cuda"] if torch.cuda.is_available() else ["cpu"]
# named tolerances (relative RMS error of outputs and states against the fp32 reference)
TOL = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}
FORMS = {"parallel": (prefill.parallel, prefill.parallel_ref), "exact": (prefill.exact, prefill.exact_ref)}
TWO_LEVEL = (functools.partial(prefill.exact, two_level=True), functools.partial(prefill.exact_ref, two_level=True))


def layer_inputs(B, H, T, d, b, dtype, device, seed=0, layout="bhtd"):
    """Rotated q, k, v as the model makes them ([B, T, H, d] memory seen as [B, H, T, d])."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    qkv = r(3, B, T, H, d) if layout == "bthd" else r(3, B, H, T, d)
    qkv = qkv.to(device=device, dtype=dtype)
    q, k, v = (x.transpose(1, 2) for x in qkv) if layout == "bthd" else qkv
    lr = (torch.rand(B, H, T, generator=g) * 0.05).to(device)
    S0 = torch.cat((0.2 * r(H, d, d), 0.1 * r(H, 1, d)), dim=1).to(device)
    gamma, beta = (1 + 0.1 * r(H, d)).to(device), (0.1 * r(H, d)).to(device)
    eta = (1.0 / torch.arange(1, b + 1) + 0.05 * r(b)).clamp_min(0).to(device)
    return q, k, v, lr, S0, gamma, beta, eta


def state(B, H, d, device, seed=1):
    g = torch.Generator().manual_seed(seed)
    S = torch.cat((0.2 * torch.randn(B, H, d, d, generator=g), 0.1 * torch.randn(B, H, 1, d, generator=g)), 2)
    return S.to(device), (0.05 * torch.randn(B, H, d + 1, d, generator=g)).to(device)


def check(form, B, H, T, d, b, dtype, device, start=0, with_state=False, layout="bhtd", state_tol=0.0):
    """`state_tol`: a looser bound for S (a rounded state: sums in another order can flip a rounding)."""
    kernel, reference = FORMS[form] if form in FORMS else TWO_LEVEL
    q, k, v, lr, S0, gamma, beta, eta = layer_inputs(B, H, T, d, b, dtype, device, layout=layout)
    S, A = state(B, H, d, device) if with_state else (None, None)
    out_ref, S_ref, A_ref = reference(q, k, v, lr, S0, gamma, beta, eta, start, S, A)
    out, S_new, A_new = kernel(q, k, v, lr, S0, gamma, beta, eta, start, S, A)
    assert out.shape == q.shape and out.dtype == q.dtype and not torch.isnan(out).any()
    tol = TOL[dtype]
    assert rel_err(out.float(), out_ref) < tol, ("out", dtype)
    assert rel_err(S_new, S_ref) < max(tol, state_tol), ("S", dtype)
    if A_ref.abs().max() > 0:
        assert rel_err(A_new, A_ref) < tol, ("A", dtype)
    else:
        assert A_new.abs().max() == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("T,d,b", [(200, 16, 16), (75, 48, 8)])  # T ends inside a mini-batch; d of 48 pads
def test_kernel_matches_reference_from_the_start(device, form, dtype, T, d, b):
    check(form, 2, 3, T, d, b, dtype, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("start,T", [(5, 70), (16, 40), (3, 4)])  # continue mid-mini-batch; aligned; short
def test_kernel_continues_a_state(device, form, start, T):
    check(form, 1, 2, T, 16, 16, torch.float32, device, start=start, with_state=True, layout="bthd")


@pytest.mark.parametrize("device", DEVICES)
def test_parallel_segments_agree(device):
    """Pass 2 starts each segment from the sums of the ones before it: any split gives one answer."""
    q, k, v, lr, S0, gamma, beta, eta = layer_inputs(1, 2, 300, 16, 16, torch.float32, device)
    S = S0.expand(1, -1, -1, -1).contiguous()
    one = prefill._parallel_aligned(q, k, v, lr, S0, gamma, beta, eta, S, segments=1)
    four = prefill._parallel_aligned(q, k, v, lr, S0, gamma, beta, eta, S, segments=4)
    small = prefill._parallel_aligned(q, k, v, lr, S0, gamma, beta, eta, S, segments=3, tile=16)
    for a, b, c in zip(one, four, small):
        assert rel_err(a, b) < 1e-6 and rel_err(a, c) < 1e-6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("start,T,tile,segments", [(0, 200, 64, None), (0, 300, 16, 3), (5, 70, 16, 2),
                                                  (0, 128, 16, 2)])  # 128: the unmasked (EVEN) kernels
def test_decayed_parallel_kernel_matches_its_reference(device, dtype, start, T, tile, segments):
    """A decayed form (gamma a head, one of them 1): the segments' sums decayed to their ends, each
    segment starting from the decayed sums before it, each tile's rows reading S0 + gamma^j (S - S0)."""
    q, k, v, lr, S0, gamma, beta, eta = layer_inputs(2, 3, T, 16, 8, dtype, device)
    decay = torch.tensor([0.9, 0.6, 1.0], device=device)
    S, A = state(2, 3, 16, device)
    A = A if start % 8 else None
    kernel = functools.partial(prefill._parallel_aligned, tile=tile, segments=segments, decay=decay)
    out, S_new, A_new = prefill._with_head(kernel, functools.partial(prefill.parallel_ref, decay=decay), q, k, v, lr,
                                           S0, gamma, beta, eta, start, S, A)
    out_ref, S_ref, A_ref = prefill.parallel_ref(q, k, v, lr, S0, gamma, beta, eta, start, S, A, decay=decay)
    plain = prefill.parallel_ref(q, k, v, lr, S0, gamma, beta, eta, start, S, A)
    assert rel_err(S_ref, plain[1]) > 1e-2  # the decay matters here
    tol = TOL[dtype]
    assert not out.isnan().any() and rel_err(out.float(), out_ref) < tol and rel_err(S_new, S_ref) < tol
    assert rel_err(A_new, A_ref) < tol or A_ref.abs().max() == A_new.abs().max() == 0
    if start == 0 and tile == 64:  # the public entry point takes the decay the same way
        for x, y in zip(prefill.parallel(q, k, v, lr, S0, gamma, beta, eta, 0, S, None, decay=decay), (out, S_new)):
            assert rel_err(x.float(), y.float()) < 1e-6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("start,T", [(0, 75), (5, 70)])  # from a boundary; mid-mini-batch with a state
def test_exact_kernel_with_the_int8_state_matches_its_reference(device, dtype, start, T):
    """`exact(two_level=True)`: every commit rounded to the int8 format's grid, ka and vh read as float16."""
    # (a rounding flip moves a value by a fine step, max |S - S0| of its row / 1905: a few flips, ~2e-5)
    check("exact-int8", 2, 3, T, 16, 8, dtype, device, start, with_state=start > 0, state_tol=1e-4)


def test_exact_int8_reference_is_the_model_exact_form_with_the_int8_state(tiny_model):
    """exact_ref(two_level=True) is what the converted exact model with `--state int8` computes (its
    torch path: commits rounded by `TwoLevelRounding`, K/V buffers in float16)."""
    from edgettt import convert
    from edgettt.quant import apply_state_format

    model = convert(tiny_model("linear", mini_batch_size=8), form="exact")
    apply_state_format(model, "int12")
    layer = model.model.layers[0].seq_modeling_block
    x = torch.randn(1, 24, 32)
    state = layer.init_state(1)
    q, k, v = layer.project(x, {}, 0)
    out, S, _ = prefill.exact_ref(q, k, v, layer.learning_rates(x), layer.state0, layer.value_norm.weight,
                                  layer.value_norm.bias, layer.mask_eta, 0, two_level=True)
    expected = layer(x, state, 0)
    assert rel_err(layer.finish(x, out), expected) < 1e-6 and torch.equal(S, state["S1"])
    plain, S_plain, _ = prefill.exact_ref(q, k, v, layer.learning_rates(x), layer.state0, layer.value_norm.weight,
                                          layer.value_norm.bias, layer.mask_eta, 0)
    assert rel_err(S_plain, S) > 1e-6  # (the rounding is there to see)


def test_exact_reference_is_the_model_exact_form(tiny_model):
    """exact_ref is what the converted model computes in form exact (same layer, same inputs)."""
    from edgettt import convert

    model = convert(tiny_model("linear", mini_batch_size=8), form="exact")
    layer = model.model.layers[0].seq_modeling_block
    x = torch.randn(1, 21, 32)
    state = layer.init_state(1)
    q, k, v = layer.project(x, {}, 0)
    H, d = layer.num_heads, layer.head_dim
    out, S, A = prefill.exact_ref(q, k, v, layer.learning_rates(x), layer.state0, layer.value_norm.weight,
                                  layer.value_norm.bias, layer.mask_eta, 0)
    expected = layer(x, state, 0)
    assert rel_err(layer.finish(x, out), expected) < 1e-5
    assert rel_err(S, state["S1"]) < 1e-5 and rel_err(A, state["A1"]) < 1e-5
    assert (H, d) == tuple(layer.value_norm.weight.shape)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("form", FORMS)
def test_kernel_bf16_benchmark_shape_on_gpu(form):
    """bf16 on the benchmark's head shape (d = 64, b = 16), a few thousand tokens."""
    check(form, 2, 4, 4096 + 5, 64, 16, torch.bfloat16, "cuda", layout="bthd")
    check(form, 1, 2, 1000, 64, 16, torch.bfloat16, "cuda", start=7, with_state=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T,even", [(128, True), (120, False), (112, False)])
def test_parallel_plan_drops_the_masks_only_where_no_tile_needs_them(device, T, even):
    """128 tokens in tiles of 16, 2 segments: whole tiles, segments and mini-batches, d = 16 fills its
    tile, so the unmasked kernels run; 120 (a ragged last tile) and 112 (7 tiles: no whole segments)
    keep the masks. Either way the result is the reference's (A zero where every mini-batch is whole)."""
    q, k, v, lr, S0, gamma, beta, eta = layer_inputs(2, 2, T, 16, 8, torch.float32, device)
    S = S0.expand(2, -1, -1, -1).contiguous()
    assert prefill._parallel_plan(q, eta, tile=16, segments=2).even == even
    got = prefill._parallel_aligned(q, k, v, lr, S0, gamma, beta, eta, S, segments=2, tile=16)
    expected = prefill.parallel_ref(q, k, v, lr, S0, gamma, beta, eta, 0, S)
    for a, c in zip(got, expected):
        assert not a.isnan().any() and rel_err(a, c) < 1e-4


def test_host_launch_arithmetic_matches_triton():
    """The plain-Python cdiv and next_power_of_2 the wrappers use agree with Triton's."""
    import triton

    from edgettt.ops.common import cdiv, next_power_of_2

    for n in range(1, 300):
        assert next_power_of_2(n) == triton.next_power_of_2(n), n
        for b in (1, 3, 16, 64):
            assert cdiv(n, b) == triton.cdiv(n, b)


def test_segments_split_the_tiles_evenly_where_they_can():
    """The automatic segment count rounds to the nearest one that divides the tiles (the unmasked
    kernels need whole segments), unless that is more than half away; an explicit count is kept."""
    per = prefill._tiles_per_segment
    assert per(512, 7, prefer_whole=True) == 64  # 74 tiles would leave 512 % 74 != 0: 8 segments of 64
    assert per(512, 8, prefer_whole=True) == 64 and per(128, 8, prefer_whole=True) == 16  # the H200 bench
    assert per(512, 6, prefer_whole=True) == 64  # 4 and 8 segments both 2 away: the more
    assert per(512, 7) == 74
    assert per(509, 8, prefer_whole=True) == 64  # a prime: only 1 segment would divide, keep 8
