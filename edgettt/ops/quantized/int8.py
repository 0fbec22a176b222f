"""Weight-only int8 matmul on edgettt's per-channel int8 format (`quantize.quantize_int8`).

    y = x @ W^T,   W[n, k] = qweight[n, k] * scales[n]
    x: [..., K] fp16/bf16/fp32;  qweight: int8 [N, K];  scales: float [N]
    returns y: [..., N] in x's dtype

`int8_matmul_ref` dequantizes in torch. `int8_matmul` picks a kernel by the number of rows M; both
apply the per-row scale once, at the end (it factors out of the sum over k):
- GEMV (decode, M <= 8): each program owns BN outputs of one row and walks K in [BN, BK] tiles of
  codes, accumulating code * x in place; one reduction and one scale at the end. Codes become
  floats through the mantissa of 2^23 (`_codes`), not an int-to-float conversion.
- GEMM (prefill): x tiles times code tiles converted to x's dtype (exact: |code| <= 127) on the
  tensor cores; the scale multiplies the finished tile. `gemm` picks the way: "swapped" (the
  default: y^T = W x^T, the converted codes the dot's register operand; 0.70-0.72x bf16 cuBLAS at
  M = 2048), "fused" (y = x W^T; 0.59-0.64x), "dequantize" (the weight in x's dtype, then cuBLAS;
  0.57-0.59x), or "a8" (W8A8: the activations rounded to int8, one scale a row (`act8`), and the
  integer product on int8 tensor cores, exact in int32; both scales in the epilogue; it changes the
  result by the activations' rounding, so it is asked for, never picked): benchmarks/results/gemm_h200.md.
  "gemv" runs the GEMV kernel at any M (a program column a row: each row re-reads the weight, mostly
  from L2); at 16 rows (a batch-16 decode step's products) 0.28-0.58x bf16 against the GEMM ways'
  0.43-0.69x, so the GEMV range stays at 8 rows (benchmarks/results/gemm_h200.md).
The layer keeps only the int8 bytes on the GPU (no dequantized float copy).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgettt.formats.layouts import dequantize_int8
from edgettt.ops.common import GEMV_MAX_ROWS, autotune_configs, cdiv, fresh, next_power_of_2
from edgettt.ops.quantized.act8 import quantize_activations, quantize_activations_ref


def int8_matmul_ref(x, qweight, scales):
    w = dequantize_int8({"qweight": qweight, "scales": scales})
    return (x.float() @ w.T).to(x.dtype)


@triton.jit
def _codes(q):
    """int8 codes (loaded as int32, sign-extended) as fp32: the byte, offset to 0..255, goes into
    the mantissa of 2^23; subtracting 2^23 + 128 is exact."""
    return (((q & 0xFF) ^ 0x80) | 0x4B000000).to(tl.float32, bitcast=True) - 8388736.0


GEMV_CONFIGS = [triton.Config({"BN": bn, "BK": bk}, num_warps=w, num_stages=s)
                for bn, bk, w, s in [(8, 256, 4, 3), (4, 512, 4, 3), (16, 256, 8, 3), (8, 512, 8, 2),
                                     (2, 1024, 4, 2), (4, 1024, 8, 2), (16, 128, 4, 4), (32, 128, 8, 3)]]


@triton.autotune(configs=autotune_configs(GEMV_CONFIGS, [triton.Config({"BN": 16, "BK": 64}, num_warps=4)]),
                 key=["N", "K"])
@triton.jit
def _int8_gemv_kernel(x_ptr, qw_ptr, sc_ptr, y_ptr, N, K, stride_xm, BN: tl.constexpr, BK: tl.constexpr):
    pid_n, m = tl.program_id(0), tl.program_id(1)
    n = pid_n * BN + tl.arange(0, BN)
    n_ok = n < N
    k = tl.arange(0, BK)
    acc = tl.zeros([BN, BK], dtype=tl.float32)
    for k0 in range(0, K, BK):
        k_ok = k0 + k < K
        q = tl.load(qw_ptr + n[:, None] * K + k0 + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0)
        x = tl.load(x_ptr + m * stride_xm + k0 + k, mask=k_ok, other=0.0).to(tl.float32)  # [BK]
        acc += _codes(q.to(tl.int32)) * x[None, :]  # [BN, BK]
    scale = tl.load(sc_ptr + n, mask=n_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + m * N + n, (tl.sum(acc, axis=1) * scale).to(y_ptr.dtype.element_ty), mask=n_ok)


GEMM_CONFIGS = [triton.Config({"BM": bm, "BN": bn, "BK": bk}, num_warps=w, num_stages=s)
                for bm, bn, bk, w, s in [(64, 64, 64, 4, 4), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4),
                                         (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3),
                                         (128, 128, 128, 8, 3), (32, 64, 64, 4, 4)]]


@triton.autotune(configs=autotune_configs(GEMM_CONFIGS, [triton.Config({"BM": 16, "BN": 16, "BK": 32}, num_warps=4)]),
                 key=["M_BUCKET", "N", "K", "SWAP"])
@triton.jit
def _int8_gemm_kernel(x_ptr, qw_ptr, sc_ptr, y_ptr, M, N, K, stride_xm, M_BUCKET, SWAP: tl.constexpr,
                      PREC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """x tiles times code tiles in x's dtype; the scale at the end. SWAP computes y^T = W x^T: the
    converted code tile is then the dot's left operand, which Hopper's wgmma reads from registers."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    m = pid_m * BM + tl.arange(0, BM)
    n = pid_n * BN + tl.arange(0, BN)
    m_ok, n_ok = m < M, n < N
    k = tl.arange(0, BK)
    dt = x_ptr.dtype.element_ty
    if SWAP:
        acc = tl.zeros([BN, BM], dtype=tl.float32)
    else:
        acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        k_ok = k0 + k < K
        q = tl.load(qw_ptr + n[:, None] * K + k0 + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0).to(dt)
        if SWAP:
            xt = tl.load(x_ptr + m[None, :] * stride_xm + k0 + k[:, None], mask=k_ok[:, None] & m_ok[None, :], other=0.0)
            acc = tl.dot(q, xt, acc, input_precision=PREC)  # [BN, BM]
        else:
            x = tl.load(x_ptr + m[:, None] * stride_xm + k0 + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            acc = tl.dot(x, tl.trans(q), acc, input_precision=PREC)  # [BM, BN]
    scale = tl.load(sc_ptr + n, mask=n_ok, other=0.0).to(tl.float32)
    if SWAP:
        tl.store(y_ptr + m[None, :] * N + n[:, None], (acc * scale[:, None]).to(y_ptr.dtype.element_ty),
                 mask=m_ok[None, :] & n_ok[:, None])
    else:
        tl.store(y_ptr + m[:, None] * N + n[None, :], (acc * scale[None, :]).to(y_ptr.dtype.element_ty),
                 mask=m_ok[:, None] & n_ok[None, :])


def int8_matmul_a8_ref(x, qweight, scales):
    """The W8A8 product: x rounded per row (`quantize_activations_ref`), integer sums in float64 (exact)."""
    K = qweight.shape[1]
    codes, xs = quantize_activations_ref(x.reshape(-1, K), K)
    y = (codes.double() @ qweight.double().T) * xs.double() * scales.double()[None, :]
    return y.to(x.dtype).reshape(*x.shape[:-1], -1)


A8_CONFIGS = [triton.Config({"BM": bm, "BN": bn, "BK": bk, "GM": 8}, num_warps=w, num_stages=s)
              for bm, bn, bk, w, s in [(128, 256, 128, 8, 3), (128, 128, 128, 8, 4), (256, 128, 128, 8, 3),
                                       (128, 128, 64, 4, 4), (64, 128, 128, 4, 4), (128, 256, 64, 8, 4),
                                       (64, 64, 128, 4, 4)]]


@triton.jit
def _tile_ids(M, N, BM: tl.constexpr, BN: tl.constexpr, GM: tl.constexpr):
    """(pid_m, pid_n) of this program, launched along one axis in groups of GM row tiles (the tiles
    that share a weight column tile run together, so it is read from L2)."""
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    group = pid // (GM * tiles_n)
    first = group * GM
    rows = min(tiles_m - first, GM)
    return first + (pid % (GM * tiles_n)) % rows, (pid % (GM * tiles_n)) // rows


@triton.autotune(configs=autotune_configs(A8_CONFIGS, [triton.Config({"BM": 16, "BN": 16, "BK": 32, "GM": 2}, num_warps=4)]),
                 key=["M_BUCKET", "N", "K"])
@triton.jit
def _int8_a8_gemm_kernel(xq_ptr, xs_ptr, qw_ptr, sc_ptr, y_ptr, M, N, K, M_BUCKET, BM: tl.constexpr,
                         BN: tl.constexpr, BK: tl.constexpr, GM: tl.constexpr):
    """int8 x codes times int8 weight codes, summed in int32 (|sum| < 127^2 K: exact to K = 133,000),
    then times the row's and the channel's scales."""
    pid_m, pid_n = _tile_ids(M, N, BM, BN, GM)
    m = pid_m * BM + tl.arange(0, BM)
    n = pid_n * BN + tl.arange(0, BN)
    m_ok, n_ok = m < M, n < N
    k = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], dtype=tl.int32)
    for k0 in range(0, K, BK):
        k_ok = k0 + k < K
        a = tl.load(xq_ptr + m[:, None] * K + k0 + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0)
        b = tl.load(qw_ptr + n[:, None] * K + k0 + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0)
        acc = tl.dot(a, tl.trans(b), acc, out_dtype=tl.int32)
    xs = tl.load(xs_ptr + m, mask=m_ok, other=0.0)
    sc = tl.load(sc_ptr + n, mask=n_ok, other=0.0).to(tl.float32)
    y = acc.to(tl.float32) * xs[:, None] * sc[None, :]
    tl.store(y_ptr + m[:, None] * N + n[None, :], y.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def int8_a8_gemm(x2, qweight, scales, y):
    """y [M, N] = x2 [M, K] times the int8 weight, x2 rounded to int8 a row (`quantize_activations`)."""
    M, K = x2.shape
    N = qweight.shape[0]
    codes, xs = quantize_activations(x2, K)
    grid = lambda meta: (cdiv(M, meta["BM"]) * cdiv(N, meta["BN"]),)  # noqa: E731
    _int8_a8_gemm_kernel[grid](codes, xs, qweight, scales, y, M, N, K, next_power_of_2(M))


def int8_matmul(x, qweight, scales, gemm: str = "swapped"):
    N, K = qweight.shape
    assert x.shape[-1] == K, f"x has {x.shape[-1]} features, the weight {K}"
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    qweight, scales = qweight.contiguous(), scales.contiguous()
    y = fresh(torch.empty(M, N, device=x.device, dtype=x.dtype))
    if M <= GEMV_MAX_ROWS or gemm == "gemv":
        grid = lambda meta: (cdiv(N, meta["BN"]), M)  # noqa: E731
        _int8_gemv_kernel[grid](x2, qweight, scales, y, N, K, x2.stride(0))
    elif gemm == "dequantize":  # the weight in x's dtype, then the float GEMM
        torch.matmul(x2, (qweight.to(x.dtype) * scales.to(x.dtype)[:, None]).T, out=y)
    elif gemm == "a8":
        int8_a8_gemm(x2, qweight, scales, y)
    else:
        grid = lambda meta: (cdiv(M, meta["BM"]), cdiv(N, meta["BN"]))  # noqa: E731
        prec = "ieee" if x.dtype == torch.float32 else "tf32"
        _int8_gemm_kernel[grid](x2, qweight, scales, y, M, N, K, x2.stride(0), next_power_of_2(M),
                                SWAP=gemm == "swapped", PREC=prec)
    return y.reshape(*x.shape[:-1], N)
