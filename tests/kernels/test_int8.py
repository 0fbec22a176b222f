"""The int8 weight-only matmul kernels (GEMV and GEMM) against dequantize-then-matmul in torch."""

import pytest
import torch

from conftest import rel_err
from edgettt.kernels.int8 import GEMV_MAX_ROWS, int8_matmul, int8_matmul_ref
from edgettt.quant.weight_formats import weight_format

DEVICES = ["cuda"] if torch.cuda.is_available() else ["cpu"]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


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
@pytest.mark.parametrize("gemm", ["swapped", "dequantize"])
def test_int8_gemm_variants_match_reference(device, gemm):
    """The GEMM's other ways (benchmarked against the fused kernel): y^T = W x^T, and dequantize + matmul."""
    g = torch.Generator().manual_seed(0)
    t = weight_format("int8").quantize(torch.randn(40, 200, generator=g), 64)
    weight = [t[name].to(device) for name in ("qweight", "scales")]
    for dtype in [torch.float32, torch.float16]:
        x = torch.randn(GEMV_MAX_ROWS + 9, 200, generator=g).to(device=device, dtype=dtype)
        y = int8_matmul(x, *weight, gemm=gemm)
        assert y.shape == (GEMV_MAX_ROWS + 9, 40) and not torch.isnan(y).any()
        assert rel_err(y.float(), int8_matmul_ref(x.float(), *weight)) < TOL[dtype], dtype
