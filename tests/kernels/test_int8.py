"""The int8 weight-only matmul kernels (GEMV and GEMM) against dequantize-then-matmul in torch."""

import pytest
import torch

from conftest import rel_err
from edgettt.ops.quantized.int8 import GEMV_MAX_ROWS, int8_matmul, int8_matmul_ref, int8_matmul_a8_ref
from edgettt.ops.quantized.act8 import quantize_activations, quantize_activations_ref
from edgettt.quant.weight_formats import weight_format

DEVICES = ["cuda"] if torch.cuda.is_available() else ["cpu"]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def assert_codes_match(codes, ref_codes):
    """Equal but at ties, one apart, at most 1% of the codes: the GPU's fp32 division is within 2 ulp,
    not rounded, and x * r + 0.5 may be one fused rounding; an int4 weight's requantization meets
    exact ties by design (a group whose largest |code - zero| is 10 has ratio 12.7: 5 * 12.7 = 63.5;
    measured 0.22% apart on the H200)."""
    apart = (codes.int() - ref_codes.int()).abs()
    assert apart.max() <= 1 and (apart > 0).float().mean() <= 1e-2


def check_int8(M, N, K, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = weight_format("int8").quantize(torch.randn(N, K, generator=g), 64)
    weight = (t["qweight"].to(device), t["scales"].to(device))
    x = torch.randn(2, M, K, generator=g).to(device=device, dtype=dtype)
    y = int8_matmul(x, *weight)
    assert y.shape == (2, M, N) and y.dtype == dtype and not torch.isnan(y).any()
    assert rel_err(y.float(), int8_matmul_ref(x.float(), *weight)) < TOL[dtype], dtype


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("M", [1, 3, GEMV_MAX_ROWS + 9])  # GEMV, GEMV of a few rows, GEMM
@pytest.mark.parametrize("N,K", [(40, 192), (33, 100), (24, 256)])  # N and K not tiles
def test_int8_matmul_matches_reference(device, M, N, K):
    for dtype in [torch.float32, torch.float16]:
        check_int8(M, N, K, dtype, device)


def test_codes_become_exact_floats():
    """Every int8 code, through the kernel with x = 1 at one position, comes back exactly."""
    codes = torch.arange(-127, 128, dtype=torch.int8)[:, None].repeat(1, 16)  # [255, 16]
    device = DEVICES[0]
    x = torch.zeros(1, 16)
    x[0, 3] = 1.0
    y = int8_matmul(x.to(device), codes.to(device), torch.ones(255, device=device))
    assert torch.equal(y[0].cpu(), torch.arange(-127, 128, dtype=torch.float32))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("M", [1, 4, 512])
def test_int8_matmul_bf16_llm_shape_on_gpu(M):
    check_int8(M, 11008, 4096, torch.bfloat16, "cuda")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gemm", ["fused", "swapped", "dequantize", "gemv"])
def test_int8_gemm_variants_match_reference(device, gemm):
    """The GEMM's other ways (benchmarked against the fused kernel): y^T = W x^T, dequantize + matmul, and
    the GEMV kernel a row."""
    g = torch.Generator().manual_seed(0)
    t = weight_format("int8").quantize(torch.randn(40, 200, generator=g), 64)
    weight = [t[name].to(device) for name in ("qweight", "scales")]
    for dtype in [torch.float32, torch.float16]:
        x = torch.randn(GEMV_MAX_ROWS + 9, 200, generator=g).to(device=device, dtype=dtype)
        y = int8_matmul(x, *weight, gemm=gemm)
        assert y.shape == (GEMV_MAX_ROWS + 9, 40) and not torch.isnan(y).any()
        assert rel_err(y.float(), int8_matmul_ref(x.float(), *weight)) < TOL[dtype], dtype


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("N,K", [(40, 200), (24, 256)])
def test_int8_gemm_with_int8_activations_matches_its_reference(device, N, K):
    """W8A8: the kernel equals the integer reference (exact int32 sums, then both scales) to float
    rounding, and differs from the float product by the activations' rounding only."""
    g = torch.Generator().manual_seed(3)
    t = weight_format("int8").quantize(torch.randn(N, K, generator=g), 64)
    weight = [t[name].to(device) for name in ("qweight", "scales")]
    x = torch.randn(GEMV_MAX_ROWS + 9, K, generator=g)
    for dtype in [torch.float32, torch.float16]:
        y = int8_matmul(x.to(device=device, dtype=dtype), *weight, gemm="a8")
        assert y.shape == (GEMV_MAX_ROWS + 9, N) and not torch.isnan(y).any()
        assert rel_err(y.float(), int8_matmul_a8_ref(x.to(device=device, dtype=dtype), *weight).float()) < TOL[dtype]
        assert 1e-3 < rel_err(y.float(), int8_matmul_ref(x.to(device), *weight)) < 2e-2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("M,K,block", [(5, 200, 200), (7, 256, 64), (3, 96, 32), (4, 11008, 11008)])
def test_activation_codes_match_the_reference_and_their_bound(device, M, K, block):
    """int8 activations: the kernel's codes and scales equal the reference's (codes but for a rare tie
    rounded the other way: the GPU may fuse x * inv + 0.5 into one rounding), every value within half
    a step of code * scale, each block's largest value on code +-127, a zero block all zero."""
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(4)) * torch.rand(M, 1) * 10
    x[0, :block] = 0.0
    codes, scales = quantize_activations(x.to(device), block)
    ref_codes, ref_scales = quantize_activations_ref(x, block)
    assert_codes_match(codes.cpu(), ref_codes)
    assert torch.allclose(scales.cpu(), ref_scales, rtol=1e-6, atol=0)
    step = scales.cpu().repeat_interleave(block, dim=1)[:, :K]
    assert ((codes.cpu().float() * step - x).abs() <= step / 2 * (1 + 1e-5)).all()
    assert (codes.cpu().abs().reshape(M, -1).amax(-1) == 127)[1:].all() and scales[0, 0] == 0
