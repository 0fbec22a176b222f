"""The int4 weight-only matmul kernels (GEMV and GEMM) against dequantize-then-matmul in torch."""

import pytest
import torch

from conftest import rel_err
from test_int8 import assert_codes_match
from edgettt.ops.quantized.int4 import GEMV_MAX_ROWS, a8_rounded, int4_gemv, int4_gemv_ref, int4_matmul, int4_matmul_ref, int4_matmul_a8_ref, int4_to_int8, int4_to_int8_ref
from edgettt.formats.layouts import dequantize_int4
from edgettt.quant.weight_formats import weight_format

DEVICES = ["cuda"] if torch.cuda.is_available() else ["cpu"]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def packed(N, K, group, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = weight_format("int4").quantize(torch.randn(N, K, generator=g), group)
    return [t[name].to(device) for name in ("qweight", "scales", "zero_points")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("M", [1, 3, GEMV_MAX_ROWS + 9])  # GEMV, GEMV of a few rows, GEMM
@pytest.mark.parametrize("N,K,group", [(40, 192, 64), (33, 96, 32), (24, 256, 128)])  # odd blocks; N not a tile
def test_int4_matmul_matches_reference(device, M, N, K, group):
    for dtype in [torch.float32, torch.float16]:
        check_int4(M, N, K, group, dtype, device)


def check_int4(M, N, K, group, dtype, device):
    weight = packed(N, K, group, device)
    x = torch.randn(2, M, K, generator=torch.Generator().manual_seed(1)).to(device=device, dtype=dtype)
    y = int4_matmul(x, *weight)
    assert y.shape == (2, M, N) and y.dtype == dtype and not torch.isnan(y).any()
    assert rel_err(y.float(), int4_matmul_ref(x.float(), *weight)) < TOL[dtype], dtype


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("M", [1, 4, 512])
def test_int4_matmul_bf16_llm_shape_on_gpu(M):
    weight = packed(11008, 4096, 64, "cuda")
    x = torch.randn(M, 4096, device="cuda", dtype=torch.bfloat16)
    assert rel_err(int4_matmul(x, *weight).float(), int4_matmul_ref(x.float(), *weight)) < TOL[torch.bfloat16]


@pytest.mark.parametrize("device", DEVICES)
def test_int4_gemv_error_is_within_fp32_rounding_of_its_terms(device):
    """The GEMV sums v x with v = 1 + c / 16 and subtracts the sum of x (`_one_plus_sixteenths`), which
    cancels most of each chunk's sum when x shares a large offset: its error, against a float64 product,
    must stay within a few fp32 roundings of the terms' magnitude (sum of |scale x| * 16 a row)."""
    N, K, group = 40, 512, 64
    qweight, scales, zero_points = packed(N, K, group, device, seed=5)
    g = torch.Generator().manual_seed(6)
    x = (1000.0 + torch.randn(1, K, generator=g)).to(device)  # a large common offset: the worst cancellation
    w = dequantize_int4({"qweight": qweight, "scales": scales, "zero_points": zero_points}).double()
    exact = x.double() @ w.T
    terms = 16 * (x.double().abs() @ scales.double().abs().repeat_interleave(group, dim=1).T)
    error = (int4_matmul(x, qweight, scales, zero_points).double() - exact).abs() / terms
    assert error.max() < 16 * 2.0 ** -24  # measured 0.54 of one rounding on the CPU interpreter


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("a8", [False, True])
@pytest.mark.parametrize("prologue,rows", [("residual", 1), ("rms", 3), ("layer+residual", 1), ("gated+residual", 3),
                                           ("rms+glu", 2)])
def test_int4_gemv_with_its_prologue_and_residual_matches_reference(device, prologue, rows, a8):
    """`int4_gemv`, a decode step's product in one launch: x through an RMSNorm, a LayerNorm (x with a
    common offset, so that its statistics' E[x^2] - mean^2 cancels) or SwiGLU's silu(x) * up as the kernel
    reads it, the residual added as it stores, against the same in fp32 torch (`int4_gemv_ref`); the
    gated product's x and up are views into one [gate | up] buffer, as a fused gate/up product leaves them;
    "glu": the weight taken as a stacked gate/up product (gate rows, then up rows), silu(gate) * up stored
    (N / 2 outputs). `a8` (W4A8): the prologue's output rounded to int8 in blocks of 32 in the kernel, dp4a
    products, against the reference that rounds the same values (a rounding tie a norm's float order can
    flip moves one code a step: ~3e-4 of the whole; the float product is 4e-3 - 1e-2 away, measured)."""
    N, K, group = 42, 192, 64  # 21 gate/up pairs: a part-filled last program for any even BN
    weight = packed(N, K, group, device)
    g = torch.Generator().manual_seed(8)
    dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if device == "cuda" else [])
    for dtype in dtypes:
        def rand(*shape, offset=0.0):
            return (offset + torch.randn(*shape, generator=g)).to(device=device, dtype=dtype)
        x, kw = rand(rows, K, offset=3.0 if "layer" in prologue else 0.0), {}
        if prologue.startswith("rms"):
            kw["norm"] = ("rms", rand(K), None, 1e-6)
        if prologue.startswith("layer"):
            kw["norm"] = ("layer", rand(K), rand(K), 1e-6)
        if prologue.startswith("gated"):
            both = rand(rows, 2 * K)
            x, kw["up"] = both[:, :K], both[:, K:]
        if "residual" in prologue:
            kw["residual"] = rand(rows, N)
        if "glu" in prologue:
            kw["glu"] = True
        kw32 = {k: _fp32(v) for k, v in kw.items()}
        y = int4_gemv(x, *weight, **kw, a8=a8).float()
        assert rel_err(y, int4_gemv_ref(x.float(), *weight, **kw32, a8=a8)) < (max(TOL[dtype], 1e-3) if a8 else TOL[dtype]), dtype
        if a8:
            assert rel_err(y, int4_gemv_ref(x.float(), *weight, **kw32)) > 2e-3


def _fp32(value):
    """A tensor, or a norm's (kind, weight, bias, eps), in fp32."""
    if isinstance(value, tuple):
        return tuple(v.float() if torch.is_tensor(v) else v for v in value)
    return value.float() if torch.is_tensor(value) else value


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows", [1, 2])
def test_int4_gemv_takes_x_and_codes_not_on_a_32_bit_boundary(device, rows):
    """The GEMV reads 16-bit x two values at a time and the codes four bytes at a time as 32-bit words: a
    view of x that starts one element in (its data 2 bytes off a word) or whose rows are an odd number of
    elements apart, and codes that start 1 byte into a buffer, must still give the reference's product
    (the wrapper copies such tensors first; on a GPU a misaligned 32-bit load faults, while the CPU
    interpreter reads any address, so the test bites on the GPU)."""
    N, K, group = 40, 192, 64
    weight = packed(N, K, group, device)
    wide = torch.randn(rows, K + 1, generator=torch.Generator().manual_seed(4)).to(device=device, dtype=torch.float16)
    x = wide[:, 1:]  # 2 bytes past the allocation's start; rows K + 1 elements apart
    assert (x.data_ptr() % 4, x.stride(0) % 2) == (2, 1)
    assert rel_err(int4_matmul(x, *weight).float(), int4_matmul_ref(x.float(), *weight)) < TOL[torch.float16]
    qweight, scales, zero_points = weight  # the codes read as 32-bit words: from a byte buffer 1 byte in
    codes = torch.empty(qweight.numel() + 1, dtype=torch.uint8, device=device)[1:].view(qweight.shape)
    codes.copy_(qweight)
    assert codes.data_ptr() % 4 == 1
    y = int4_matmul(x, codes, scales, zero_points)
    assert rel_err(y.float(), int4_matmul_ref(x.float(), *weight)) < TOL[torch.float16]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gemm", ["fused", "swapped", "dequantize", "gemv"])
def test_int4_gemm_variants_match_reference(device, gemm):
    """The GEMM's other ways (benchmarked against the fused kernel): y^T = W x^T, dequantize + matmul, and
    the GEMV kernel a row."""
    weight = packed(40, 192, 64, device)
    for dtype in [torch.float32, torch.float16]:
        x = torch.randn(GEMV_MAX_ROWS + 9, 192, generator=torch.Generator().manual_seed(1)).to(device=device, dtype=dtype)
        y = int4_matmul(x, *weight, gemm=gemm)
        assert y.shape == (GEMV_MAX_ROWS + 9, 40) and not torch.isnan(y).any()
        assert rel_err(y.float(), int4_matmul_ref(x.float(), *weight)) < TOL[dtype], dtype


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("group", [32, 64])
def test_int4_gemm_with_int8_activations_matches_its_reference(device, group):
    """W4A8: the kernels equal the integer reference (the weight requantized to int8 a row, exact integer
    sums, then the scales) to float rounding and the requantization's ties, and differ from the float product by the two roundings
    (relative error about 0.7% on Gaussian x, measured)."""
    weight = packed(40, 192, group, device)
    x = torch.randn(GEMV_MAX_ROWS + 9, 192, generator=torch.Generator().manual_seed(2))
    for dtype in [torch.float32, torch.float16]:
        y = int4_matmul(x.to(device=device, dtype=dtype), *weight, gemm="a8")
        assert y.shape == (GEMV_MAX_ROWS + 9, 40) and not torch.isnan(y).any()
        # (5e-3: the GPU rounds a few ties of the requantization the other way, a grid step each)
        assert rel_err(y.float(), int4_matmul_a8_ref(x.to(device=device, dtype=dtype), *weight).float()) < 5e-3
        assert 1e-3 < rel_err(y.float(), int4_matmul_ref(x.to(device), *weight)) < 2e-2


def test_a8_rounding_puts_each_block_of_32_on_its_own_int8_grid():
    """The W4A8 GEMV's x (`a8_rounded`, its reference): each block of 32 values (a shorter last one too) on the
    grid of its absmax / 127, within half a step of x, its largest value exact; an all-zero block stays zero."""
    x = torch.randn(3, 80, generator=torch.Generator().manual_seed(9))  # blocks of 32, 32, 16
    x[1, 32:64] = 0
    y = a8_rounded(x)
    for lo, hi in [(0, 32), (32, 64), (64, 80)]:
        step = x[:, lo:hi].abs().amax(-1, keepdim=True) / 127
        codes = torch.where(step > 0, y[:, lo:hi] / step.clamp_min(1e-30), torch.zeros_like(step))
        assert torch.allclose(codes, codes.round(), atol=1e-4) and codes.abs().max() <= 127 + 1e-4
        assert ((y[:, lo:hi] - x[:, lo:hi]).abs() <= step / 2 * (1 + 1e-5)).all()
    assert torch.equal(y[1, 32:64], torch.zeros(32))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("N,K,group", [(40, 192, 64), (33, 96, 32), (24, 256, 128)])  # N not a tile; 3 blocks of x
def test_int4_gemv_with_int8_activations_matches_its_reference(device, N, K, group):
    """W4A8 at the GEMV's rows (`gemm="a8"`, a decode step's rows): x rounded to int8 in blocks of 32 values in
    the kernel and multiplied by the int4 codes as they are (dp4a), equal to the reference rounding the same x
    to float rounding; the float product differs by the rounding (0.15-0.7% on Gaussian x, measured)."""
    weight = packed(N, K, group, device, seed=3)
    for rows in (1, 3):
        x = torch.randn(rows, K, generator=torch.Generator().manual_seed(rows))
        for dtype in [torch.float32, torch.float16]:
            xd = x.to(device=device, dtype=dtype)
            y = int4_matmul(xd, *weight, gemm="a8")
            assert y.shape == (rows, N) and not torch.isnan(y).any()
            assert rel_err(y.float(), int4_matmul_a8_ref(xd.float(), *weight)) < max(TOL[dtype], 1e-4), dtype
            assert 1e-3 < rel_err(y.float(), int4_matmul_ref(xd.float(), *weight)) < 2e-2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("N,K,group", [(40, 192, 64), (33, 256, 32), (7, 11008, 64)])
def test_int4_to_int8_matches_the_reference_and_its_bound(device, N, K, group):
    """The int8 requantization of an int4 weight: codes and row steps equal the reference's (codes but
    at ties), every
    weight within half a row step of the int4 weight, the row step at most 15/127 of the row's largest
    int4 step (so the added rounding is about a twelfth of the int4 one)."""
    qweight, scales, zero_points = packed(N, K, group, device)
    w8, step = int4_to_int8(qweight, scales, zero_points)
    ref_w8, ref_step = int4_to_int8_ref(qweight.cpu(), scales.cpu(), zero_points.cpu())
    assert_codes_match(w8.cpu(), ref_w8)  # (but at ties: see the activations' test)
    assert torch.allclose(step.cpu(), ref_step, rtol=1e-6, atol=0)
    w4 = dequantize_int4({"qweight": qweight.cpu(), "scales": scales.cpu(), "zero_points": zero_points.cpu()})
    moved = (w8.cpu().float() * step.cpu()[:, None] - w4).abs()
    assert (moved <= step.cpu()[:, None] / 2 * (1 + 1e-5)).all()
    assert (step.cpu() <= scales.cpu().float().amax(-1) * 15 / 127 * (1 + 1e-6)).all()
