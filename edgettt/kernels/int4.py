"""Weight-only int4 matmul on edgettt's packed format (the layout of ONNX Runtime's MatMulNBits).

    y = x @ W^T,   W[n, k] = (code[n, k] - zero[n, k // g]) * scale[n, k // g]
    x: [..., K] fp16/bf16/fp32;  qweight: uint8 [N, K/g, g/2] (two codes a byte, the even k in the low
    nibble);  scales: float [N, K/g];  zero_points: uint8 [N, ceil(K/g / 2)] (packed the same way)
    returns y: [..., N] in x's dtype

`int4_matmul_ref` dequantizes in torch. `int4_matmul` picks a kernel by the number of rows M:
- GEMV (decode, M <= 8): each program owns BN outputs of one row and walks K; a step reads a byte
  tile [BN, BKB] (wide loads along K, whole groups), turns the codes into `code * x * scale` in
  place and accumulates the tile; one reduction at the end. The zero points are applied once a
  group, through the group sums of x. (Variants measured in `benchmarks/bench_gemv.py`.)
- GEMM (prefill): tiles of x times dequantized tiles of W (one group of K per step) on the tensor
  cores; the low and high nibbles are interleaved back into k order in registers. `gemm` picks one
  of three ways, measured against each other by `edgettt bench` (benchmarks/results/gemm_h200.md):
  "fused" (that kernel), "swapped" (the same computing y^T = W x^T), "dequantize" (W into x's dtype
  by a kernel, then cuBLAS: the fastest weight-only way at M = 2048, 0.88-0.90x bf16 against 0.46x
  fused, and at M = 16, 1.3-2.3x fused: the default above the GEMV range), or "a8" (W4A8: the weight
  requantized to int8 with one scale a row by a kernel (`int4_to_int8`), the activations to int8 with
  one scale a row, then int8's W8A8 GEMM on the int8 tensor cores; it changes the result by both
  roundings, so it is asked for, never picked), or "gemv" (the GEMV kernel at any M, a program column
  a row, each row re-reading the weight mostly from L2: at 16 rows 0.19-0.29x bf16, against
  dequantize's 0.65-0.69x). A W4A8 kernel with a float scale a group step (int8 dots a group,
  rescaled into a float sum) ran at 0.31x bf16 cuBLAS and was dropped: benchmarks/results/gemm_h200.md.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..quant.layouts import dequantize_int4, unpack_nibbles
from . import GEMV_MAX_ROWS, autotune_configs, cdiv, fresh, next_power_of_2
from .int8 import int8_a8_gemm, int8_matmul_a8_ref



def int4_matmul_ref(x, qweight, scales, zero_points):
    w = dequantize_int4({"qweight": qweight, "scales": scales, "zero_points": zero_points})
    return (x.float() @ w.T).to(x.dtype)


@triton.jit
def _zero_points(zp_ptr, n, gi, ZPW, mask):
    """Zero points of groups gi of rows n: packed two a byte, the even group in the low nibble."""
    byte = tl.load(zp_ptr + n[:, None] * ZPW + gi[None, :] // 2, mask=mask, other=0).to(tl.int32)
    return ((byte >> ((gi[None, :] % 2) * 4)) & 0xF).to(tl.float32)


@triton.jit
def _nibbles(byte):
    """The low and high 4-bit codes of int32 `byte` as fp32, without int-to-float conversions (a
    quarter-rate instruction on the GPU): the bits go into the mantissa of 2^23, which is then
    subtracted; exact."""
    lo = ((byte & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    hi = (((byte >> 4) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    return lo, hi


@triton.jit
def gemv_tile(x_row, qw_ptr, sc_ptr, zp_ptr, n, n_ok, j0, K, ZPW, GH: tl.constexpr, NGS: tl.constexpr,
              BN: tl.constexpr, BKB: tl.constexpr):
    """The GEMV's bytes j0 .. j0 + BKB of rows n (whole groups): (code * x * scale as a [BN, BKB] tile,
    zero * scale * the group sums of x [BN, NGS]), both to be summed over K."""
    j = tl.arange(0, BKB)
    KB = K // 2
    blocks = K // (2 * GH)
    j_ok = j0 + j < KB
    byte = tl.load(qw_ptr + n[:, None] * KB + j0 + j[None, :], mask=n_ok[:, None] & j_ok[None, :], other=0)
    lo, hi = _nibbles(byte.to(tl.int32))  # [BN, BKB]
    xe = tl.load(x_row + 2 * (j0 + j), mask=j_ok, other=0.0).to(tl.float32)  # [BKB]
    xo = tl.load(x_row + 2 * (j0 + j) + 1, mask=j_ok, other=0.0).to(tl.float32)
    gi = j0 // GH + tl.arange(0, NGS)
    mask2 = n_ok[:, None] & (gi < blocks)[None, :]
    scale = tl.load(sc_ptr + n[:, None] * blocks + gi[None, :], mask=mask2, other=0.0).to(tl.float32)
    zero = _zero_points(zp_ptr, n, gi, ZPW, mask2)  # [BN, NGS]
    x_group = tl.sum(tl.reshape(xe + xo, [NGS, GH]), axis=1)  # [NGS]
    zeros = zero * scale * x_group[None, :]
    scale = tl.reshape(tl.broadcast_to(scale[:, :, None], [BN, NGS, GH]), [BN, BKB])
    return (lo * xe[None, :] + hi * xo[None, :]) * scale, zeros


GEMV_CONFIGS = [triton.Config({"BN": bn, "BKB": bkb}, num_warps=w, num_stages=s)
                for bn, bkb, w, s in [(8, 128, 4, 3), (16, 128, 4, 3), (4, 256, 4, 3), (8, 256, 4, 3), (16, 256, 8, 3),
                                      (32, 128, 8, 3), (4, 512, 4, 2), (8, 512, 8, 2), (2, 512, 4, 3), (16, 64, 4, 4),
                                      (2, 1024, 4, 2), (4, 1024, 8, 2), (8, 1024, 8, 2), (4, 256, 2, 4),
                                      (2, 256, 1, 4), (4, 128, 2, 4), (16, 512, 8, 2), (32, 256, 8, 2)]]


@triton.autotune(configs=autotune_configs(GEMV_CONFIGS, [triton.Config({"BN": 16, "BKB": 64}, num_warps=4)]),
                 key=["N", "K", "GROUP"])
@triton.jit
def _int4_gemv_kernel(x_ptr, qw_ptr, sc_ptr, zp_ptr, y_ptr, N, K, ZPW, stride_xm,
                      GROUP: tl.constexpr, BN: tl.constexpr, BKB: tl.constexpr):
    """y[n] = sum_g scale[n, g] * (sum_{k in g} code[n, k] x[k] - zero[n, g] * sum_{k in g} x[k]).
    code * x is scaled in place into a [BN, BKB] tile, reduced once at the end; the zero points
    enter once a group through the group sums of x (two fewer operations a byte than subtracting
    them from every code)."""
    pid_n, m = tl.program_id(0), tl.program_id(1)
    GH: tl.constexpr = GROUP // 2
    NGS: tl.constexpr = BKB // GH
    n = pid_n * BN + tl.arange(0, BN)
    n_ok = n < N
    KB = K // 2
    acc = tl.zeros([BN, BKB], dtype=tl.float32)
    zacc = tl.zeros([BN, NGS], dtype=tl.float32)
    for j0 in range(0, KB, BKB):
        tile, zeros = gemv_tile(x_ptr + m * stride_xm, qw_ptr, sc_ptr, zp_ptr, n, n_ok, j0, K, ZPW, GH, NGS, BN, BKB)
        acc += tile
        zacc += zeros
    y = tl.sum(acc, axis=1) - tl.sum(zacc, axis=1)
    tl.store(y_ptr + m * N + n, y.to(y_ptr.dtype.element_ty), mask=n_ok)


GEMM_CONFIGS = [triton.Config({"BM": bm, "BN": bn}, num_warps=w, num_stages=s)
                for bm, bn, w, s in [(64, 64, 4, 4), (128, 64, 4, 4), (64, 128, 4, 4), (128, 128, 8, 3),
                                     (128, 128, 4, 4), (128, 256, 8, 3), (256, 128, 8, 3), (32, 64, 4, 4)]]


@triton.jit
def _centered_codes(qw_ptr, zp_ptr, n, n_ok, g, K, ZPW, GROUP: tl.constexpr):
    """W[n, group g] / its scale as float32 [BN, GROUP]: the low and high nibbles interleaved back into
    k order, minus the group's zero point."""
    GH: tl.constexpr = GROUP // 2
    c = tl.arange(0, GH)
    byte = tl.load(qw_ptr + n[:, None] * (K // 2) + g * GH + c[None, :], mask=n_ok[:, None], other=0).to(tl.int32)
    zero = tl.load(zp_ptr + n * ZPW + g // 2, mask=n_ok, other=0).to(tl.int32)
    zero = ((zero >> ((g % 2) * 4)) & 0xF).to(tl.float32)  # [BN]
    codes = tl.interleave((byte & 0xF).to(tl.float32), (byte >> 4).to(tl.float32))  # [BN, GROUP], k order
    return codes - zero[:, None]


@triton.jit
def _dequantized_tile(qw_ptr, sc_ptr, zp_ptr, n, n_ok, g, K, ZPW, GROUP: tl.constexpr):
    """W[n, group g] as float32 [BN, GROUP]: the centered codes times the group's scale."""
    scale = tl.load(sc_ptr + n * (K // GROUP) + g, mask=n_ok, other=0.0).to(tl.float32)  # [BN]
    return _centered_codes(qw_ptr, zp_ptr, n, n_ok, g, K, ZPW, GROUP) * scale[:, None]


@triton.autotune(configs=autotune_configs(GEMM_CONFIGS, [triton.Config({"BM": 16, "BN": 16}, num_warps=4)]),
                 key=["M_BUCKET", "N", "K", "GROUP", "SWAP"])
@triton.jit
def _int4_gemm_kernel(x_ptr, qw_ptr, sc_ptr, zp_ptr, y_ptr, M, N, K, ZPW, stride_xm, M_BUCKET,
                      GROUP: tl.constexpr, SWAP: tl.constexpr, PREC: tl.constexpr, BM: tl.constexpr,
                      BN: tl.constexpr):
    """Tiles of x times dequantized tiles of W, one group of K a step. SWAP computes y^T = W x^T: the
    dequantized tile is then the dot's left operand, which Hopper's wgmma reads from registers (the
    right one must come from shared memory)."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    m = pid_m * BM + tl.arange(0, BM)
    n = pid_n * BN + tl.arange(0, BN)
    m_ok, n_ok = m < M, n < N
    kk = tl.arange(0, GROUP)
    dt = x_ptr.dtype.element_ty
    if SWAP:
        acc = tl.zeros([BN, BM], dtype=tl.float32)
    else:
        acc = tl.zeros([BM, BN], dtype=tl.float32)
    for g in range(0, K // GROUP):
        w = _dequantized_tile(qw_ptr, sc_ptr, zp_ptr, n, n_ok, g, K, ZPW, GROUP).to(dt)  # [BN, GROUP]
        if SWAP:
            xt = tl.load(x_ptr + m[None, :] * stride_xm + g * GROUP + kk[:, None], mask=m_ok[None, :], other=0.0)
            acc = tl.dot(w, xt, acc, input_precision=PREC)  # [BN, BM]
        else:
            x = tl.load(x_ptr + m[:, None] * stride_xm + g * GROUP + kk[None, :], mask=m_ok[:, None], other=0.0)
            acc = tl.dot(x, tl.trans(w), acc, input_precision=PREC)  # [BM, BN]
    if SWAP:
        tl.store(y_ptr + m[None, :] * N + n[:, None], acc.to(y_ptr.dtype.element_ty), mask=m_ok[None, :] & n_ok[:, None])
    else:
        tl.store(y_ptr + m[:, None] * N + n[None, :], acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _int4_dequantize_kernel(qw_ptr, sc_ptr, zp_ptr, w_ptr, N, K, ZPW, GROUP: tl.constexpr, BN: tl.constexpr):
    """W [N, K] in w's dtype from the packed codes, one group of K a program column."""
    pid_n, g = tl.program_id(0), tl.program_id(1)
    n = pid_n * BN + tl.arange(0, BN)
    n_ok = n < N
    w = _dequantized_tile(qw_ptr, sc_ptr, zp_ptr, n, n_ok, g, K, ZPW, GROUP)
    kk = tl.arange(0, GROUP)
    tl.store(w_ptr + n[:, None] * K + g * GROUP + kk[None, :], w.to(w_ptr.dtype.element_ty), mask=n_ok[:, None])


def int4_dequantize(qweight, scales, zero_points, dtype) -> torch.Tensor:
    """The weight [N, K] in `dtype` (the kernel of `dequantize_int4`)."""
    N, blocks, GH = qweight.shape
    w = fresh(torch.empty(N, blocks * GH * 2, device=qweight.device, dtype=dtype))
    _int4_dequantize_kernel[(cdiv(N, 64), blocks)](qweight, scales, zero_points, w, N, blocks * GH * 2,
                                                   zero_points.shape[1], GROUP=GH * 2, BN=64)
    return w


def int4_to_int8_ref(qweight, scales, zero_points):
    """The weight on an int8 grid, one scale a row (`int8_matmul`'s format): the row's step is the
    largest |code - zero| * scale its groups allow, / 127 (so no code leaves -127..127); codes
    rounded half up. Adds at most half that step to each weight (about a twelfth of an int4 step)."""
    N, blocks, GH = qweight.shape
    codes = unpack_nibbles(qweight).float()  # [N, blocks, g]
    zero = unpack_nibbles(zero_points)[:, :blocks].float()
    row_step = (scales.float() * torch.maximum(zero, 15 - zero)).amax(-1) / 127.0  # [N]
    ratio = scales.float() / row_step[:, None]
    w8 = torch.floor((codes - zero[..., None]) * ratio[..., None] + 0.5).clamp(-127, 127)
    return w8.to(torch.int8).reshape(N, blocks * GH * 2), row_step


def int4_matmul_a8_ref(x, qweight, scales, zero_points):
    """The W4A8 product: the weight on its int8 grid (`int4_to_int8_ref`), then `int8_matmul_a8_ref`."""
    return int8_matmul_a8_ref(x, *int4_to_int8_ref(qweight, scales, zero_points))


@triton.jit
def _int4_to_int8_kernel(qw_ptr, sc_ptr, zp_ptr, w8_ptr, step_ptr, N, K, ZPW, BLOCKS_P2: tl.constexpr,
                         GROUP: tl.constexpr, BN: tl.constexpr, GPP: tl.constexpr):
    """Rows n: their int8 step from all their group scales and zero points, then the codes of GPP
    groups (program column c: groups c * GPP ..)."""
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    c0 = tl.program_id(1) * GPP
    n_ok = n < N
    blocks = K // GROUP
    gi = tl.arange(0, BLOCKS_P2)
    ok = n_ok[:, None] & (gi < blocks)[None, :]
    scale = tl.load(sc_ptr + n[:, None] * blocks + gi[None, :], mask=ok, other=0.0).to(tl.float32)
    zero = _zero_points(zp_ptr, n, gi, ZPW, ok)
    step = tl.max(scale * tl.maximum(zero, 15.0 - zero), axis=1) / 127.0  # [BN]
    if c0 == 0:
        tl.store(step_ptr + n, step, mask=n_ok)
    kk = tl.arange(0, GROUP)
    for g in range(c0, tl.minimum(c0 + GPP, blocks)):
        ratio = tl.load(sc_ptr + n * blocks + g, mask=n_ok, other=0.0).to(tl.float32) / step
        w8 = tl.floor(_centered_codes(qw_ptr, zp_ptr, n, n_ok, g, K, ZPW, GROUP) * ratio[:, None] + 0.5)
        w8 = tl.minimum(tl.maximum(w8, -127.0), 127.0)
        tl.store(w8_ptr + n[:, None] * K + g * GROUP + kk[None, :], w8.to(tl.int8), mask=n_ok[:, None])


def int4_to_int8(qweight, scales, zero_points) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes [N, K], float32 row steps [N]): the kernel of `int4_to_int8_ref`."""
    N, blocks, GH = qweight.shape
    K = blocks * GH * 2
    w8 = torch.empty(N, K, device=qweight.device, dtype=torch.int8)  # every code written
    step = fresh(torch.empty(N, device=qweight.device, dtype=torch.float32))
    _int4_to_int8_kernel[(cdiv(N, 32), cdiv(blocks, 8))](qweight, scales, zero_points, w8, step, N, K,
                                                          zero_points.shape[1], BLOCKS_P2=next_power_of_2(blocks),
                                                          GROUP=GH * 2, BN=32, GPP=8)
    return w8, step


def kernel_supports(group: int) -> bool:
    """Groups the kernels take: powers of two (tl.arange) from 32 (tl.dot's least K tile) to 128
    (two groups fit the GEMV's narrowest byte tile)."""
    return group in (32, 64, 128)


def int4_matmul(x, qweight, scales, zero_points, gemm: str | None = None):
    N, blocks, GH = qweight.shape
    K = blocks * GH * 2
    assert x.shape[-1] == K, f"x has {x.shape[-1]} features, the weight {K}"
    assert kernel_supports(GH * 2), f"the kernels take int4 groups of 32, 64 or 128, not {GH * 2}"
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    qweight, scales, zero_points = qweight.contiguous(), scales.contiguous(), zero_points.contiguous()
    ZPW = zero_points.shape[1]
    y = fresh(torch.empty(M, N, device=x.device, dtype=x.dtype))
    if M <= GEMV_MAX_ROWS or gemm == "gemv":
        grid = lambda meta: (cdiv(N, meta["BN"]), M)  # noqa: E731
        _int4_gemv_kernel[grid](x2, qweight, scales, zero_points, y, N, K, ZPW, x2.stride(0), GROUP=GH * 2)
    elif gemm == "a8":
        int8_a8_gemm(x2, *int4_to_int8(qweight, scales, zero_points), y)
    elif (gemm or "dequantize") == "dequantize":
        torch.matmul(x2, int4_dequantize(qweight, scales, zero_points, x.dtype).T, out=y)
    else:
        grid = lambda meta: (cdiv(M, meta["BM"]), cdiv(N, meta["BN"]))  # noqa: E731
        prec = "ieee" if x.dtype == torch.float32 else "tf32"
        _int4_gemm_kernel[grid](x2, qweight, scales, zero_points, y, M, N, K, ZPW, x2.stride(0),
                                next_power_of_2(M), GROUP=GH * 2, SWAP=gemm == "swapped", PREC=prec)
    return y.reshape(*x.shape[:-1], N)
