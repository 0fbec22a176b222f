"""The int4 weight-only matmul kernels (GEMV and GEMM) against dequantize-then-matmul in torch."""

import pytest
import torch

from conftest import rel_err
from edgettt.kernels.int4 import GEMV_MAX_ROWS, int4_matmul, int4_matmul_ref
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
@pytest.mark.parametrize("gemm", ["swapped", "dequantize"])
def test_int4_gemm_variants_match_reference(device, gemm):
    """The GEMM's other ways (benchmarked against the fused kernel): y^T = W x^T, and dequantize + matmul."""
    weight = packed(40, 192, 64, device)
    for dtype in [torch.float32, torch.float16]:
        x = torch.randn(GEMV_MAX_ROWS + 9, 192, generator=torch.Generator().manual_seed(1)).to(device=device, dtype=dtype)
        y = int4_matmul(x, *weight, gemm=gemm)
        assert y.shape == (GEMV_MAX_ROWS + 9, 40) and not torch.isnan(y).any()
        assert rel_err(y.float(), int4_matmul_ref(x.float(), *weight)) < TOL[dtype], dtype
