"""Benchmark: the int4 GEMV of edgettt/ops/quantized/int4.py alone, then the weight rows of `edgettt bench`
(bf16 cuBLAS, the int4 kernel, bitsandbytes NF4), on CUDA.

    python benchmarks/bench_gemv.py --json benchmarks/results/gemv_h200.json [--variants A,B] [--shapes NxK,...]
    python benchmarks/bench_gemv.py --prologues --json out.json     (the fused decode products, fused_products.py)

bf16 activations, M = 1, int4 group 64; weight copies rotate past L2 in a CUDA graph.
Variants timed in the same run: "shipped" (the kernel in edgettt: 32-bit code words, a thread's chunk of
all its program's rows, codes as 1 + c/16; its autotuned configuration goes into the row), "strided x"
(the kernel shipped before the 32-bit code words: a [BN, BKB] byte tile, x's even and odd elements by two strided
loads moved through shared memory into the tile's layout, ~10 instructions a code), "zero per code"
(the one before it: (code - zero) * scale * x for every code), "words" (32-bit loads, K unrolled; with
or without split-K: K cut into slices, one program each, added atomically), "repacked" (the codes
reordered once a weight so that each nibble position meets contiguous x; loads one step ahead) and "dp4a
(int8 x)" (W4A8: x rounded to int8 with one scale a group of the weight's, once an x and not timed; four
products a dp4a: ~1.6 SASS instructions a code against the shipped ~4.5, gemv_instruction_counts.py; first
run on the H200: 0.55-0.91x the shipped kernel's time) and "shipped a8 (int8 x)" (edgettt's W4A8
GEMV, `int4_matmul(..., gemm="a8")`: the same dp4a products with x rounded in blocks of 32 inside the kernel,
as a decode step with int8 activations runs it). Each
shape also times a plain device copy that moves the same bytes ("copy (same bytes)"): the most a kernel
that small can reach. Results: benchmarks/results/gemm_h200.md (last section) and bench_h200.md. Measured
and dropped earlier: a "group-sum" kernel (commit d220746) and split-K of the strided-x kernel (12.49 us
against its 9.98 at 4096x4096, bench_h200.md).
"""

import argparse
import json

import torch
import triton
import triton.language as tl

from lab.kernel_bench import (copies_for, copy_bandwidth, same_bytes_copy_ms, time_rotating_ms, weight_rows,
                           weight_variants)
from edgettt.ops.common import INTERPRETER, autotune_configs
from edgettt.ops.quantized import int4
from edgettt.formats.layouts import unpack_nibbles

SHAPES = ((4096, 4096), (11008, 4096))


@triton.jit
def nibbles(byte):
    """The low and high 4-bit codes of int32 `byte` as fp32, without int-to-float conversions (a
    quarter-rate instruction on the GPU): the bits go into the mantissa of 2^23, which is then
    subtracted; exact. (The previous kernels' conversion; the shipped one makes 1 + c / 16.)"""
    lo = ((byte & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    hi = (((byte >> 4) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    return lo, hi


@triton.jit
def strided_loads(x_row, qw_ptr, sc_ptr, zp_ptr, n, n_ok, j0, K, ZPW, GH: tl.constexpr, NGS: tl.constexpr,
                  BKB: tl.constexpr):
    """Bytes j0 .. j0 + BKB of rows n (whole groups) as the low and high codes [BN, BKB] in fp32, x's even
    and odd elements [BKB] (two strided loads), the groups' scales and zero points [BN, NGS]."""
    j = tl.arange(0, BKB)
    KB = K // 2
    blocks = K // (2 * GH)
    j_ok = j0 + j < KB
    byte = tl.load(qw_ptr + n[:, None] * KB + j0 + j[None, :], mask=n_ok[:, None] & j_ok[None, :], other=0)
    lo, hi = nibbles(byte.to(tl.int32))
    xe = tl.load(x_row + 2 * (j0 + j), mask=j_ok, other=0.0).to(tl.float32)
    xo = tl.load(x_row + 2 * (j0 + j) + 1, mask=j_ok, other=0.0).to(tl.float32)
    gi = j0 // GH + tl.arange(0, NGS)
    mask2 = n_ok[:, None] & (gi < blocks)[None, :]
    scale = tl.load(sc_ptr + n[:, None] * blocks + gi[None, :], mask=mask2, other=0.0).to(tl.float32)
    return lo, hi, xe, xo, scale, int4._zero_points(zp_ptr, n[:, None], gi[None, :], ZPW, mask2)


@triton.jit
def strided_tile(x_row, qw_ptr, sc_ptr, zp_ptr, n, n_ok, j0, K, ZPW, GH: tl.constexpr, NGS: tl.constexpr,
                 BN: tl.constexpr, BKB: tl.constexpr):
    """(code * x * scale as a [BN, BKB] tile, zero * scale * the group sums of x [BN, NGS]), both to be
    summed over K."""
    lo, hi, xe, xo, scale, zero = strided_loads(x_row, qw_ptr, sc_ptr, zp_ptr, n, n_ok, j0, K, ZPW, GH, NGS, BKB)
    x_group = tl.sum(tl.reshape(xe + xo, [NGS, GH]), axis=1)  # [NGS]
    zeros = zero * scale * x_group[None, :]
    scale = tl.reshape(tl.broadcast_to(scale[:, :, None], [BN, NGS, GH]), [BN, BKB])
    return (lo * xe[None, :] + hi * xo[None, :]) * scale, zeros


STRIDED_CONFIGS = [triton.Config({"BN": bn, "BKB": bkb}, num_warps=w, num_stages=s)
                for bn, bkb, w, s in [(8, 128, 4, 3), (16, 128, 4, 3), (4, 256, 4, 3), (8, 256, 4, 3), (16, 256, 8, 3),
                                      (32, 128, 8, 3), (4, 512, 4, 2), (8, 512, 8, 2), (2, 512, 4, 3), (16, 64, 4, 4),
                                      (2, 1024, 4, 2), (4, 1024, 8, 2), (8, 1024, 8, 2), (4, 256, 2, 4),
                                      (2, 256, 1, 4), (4, 128, 2, 4), (16, 512, 8, 2), (32, 256, 8, 2)]]


@triton.autotune(configs=autotune_configs(STRIDED_CONFIGS, [triton.Config({"BN": 16, "BKB": 64}, num_warps=4)]),
                 key=["N", "K", "GROUP"])
@triton.jit
def strided_x_kernel(x_ptr, qw_ptr, sc_ptr, zp_ptr, y_ptr, N, K, ZPW, stride_xm,
                     GROUP: tl.constexpr, BN: tl.constexpr, BKB: tl.constexpr):
    """The kernel shipped before the 32-bit code words: bytes as a [BN, BKB] tile; x[2j] and x[2j + 1] by two strided
    loads in a layout of their own, moved through shared memory into the tile's (layout conversions and
    barriers every step); about 10 SASS instructions a code (benchmarks/results/gemm_h200.md).
    y[n] = sum_g scale[n, g] * (sum_{k in g} code[n, k] x[k] - zero[n, g] * sum_{k in g} x[k]).
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
        tile, zeros = strided_tile(x_ptr + m * stride_xm, qw_ptr, sc_ptr, zp_ptr, n, n_ok, j0, K, ZPW, GH, NGS, BN, BKB)
        acc += tile
        zacc += zeros
    y = tl.sum(acc, axis=1) - tl.sum(zacc, axis=1)
    tl.store(y_ptr + m * N + n, y.to(y_ptr.dtype.element_ty), mask=n_ok)


GEMM_CONFIGS = [triton.Config({"BM": bm, "BN": bn}, num_warps=w, num_stages=s)
                for bm, bn, w, s in [(64, 64, 4, 4), (128, 64, 4, 4), (64, 128, 4, 4), (128, 128, 8, 3),
                                     (128, 128, 4, 4), (128, 256, 8, 3), (256, 128, 8, 3), (32, 64, 4, 4)]]

def strided_x(x, qweight, scales, zero_points):
    N, blocks, GH = qweight.shape
    K = blocks * GH * 2
    y = torch.empty(1, N, device=x.device, dtype=x.dtype)
    grid = lambda meta: (triton.cdiv(N, meta["BN"]), 1)  # noqa: E731
    strided_x_kernel[grid](x, qweight, scales, zero_points, y, N, K, zero_points.shape[1], x.stride(0), GROUP=GH * 2)
    return y


@triton.autotune(configs=autotune_configs(STRIDED_CONFIGS, [triton.Config({"BN": 16, "BKB": 64}, num_warps=4)]),
                 key=["N", "K", "GROUP"])
@triton.jit
def zero_per_code_kernel(x_ptr, qw_ptr, sc_ptr, zp_ptr, y_ptr, N, K, ZPW, stride_xm,
                         GROUP: tl.constexpr, BN: tl.constexpr, BKB: tl.constexpr):
    """The previous kernel: (code - zero) * scale * x for every code, one reduction at the end."""
    pid_n, m = tl.program_id(0), tl.program_id(1)
    GH: tl.constexpr = GROUP // 2
    NGS: tl.constexpr = BKB // GH
    n = pid_n * BN + tl.arange(0, BN)
    n_ok = n < N
    KB = K // 2
    acc = tl.zeros([BN, BKB], dtype=tl.float32)
    x_row = x_ptr + m * stride_xm
    for j0 in range(0, KB, BKB):
        lo, hi, xe, xo, scale, zero = strided_loads(x_row, qw_ptr, sc_ptr, zp_ptr, n, n_ok, j0, K, ZPW, GH, NGS, BKB)
        scale = tl.reshape(tl.broadcast_to(scale[:, :, None], [BN, NGS, GH]), [BN, BKB])
        zero = tl.reshape(tl.broadcast_to(zero[:, :, None], [BN, NGS, GH]), [BN, BKB])
        acc += ((lo - zero) * xe[None, :] + (hi - zero) * xo[None, :]) * scale
    tl.store(y_ptr + m * N + n, tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty), mask=n_ok)


def zero_per_code(x, qweight, scales, zero_points):
    N, blocks, GH = qweight.shape
    K = blocks * GH * 2
    y = torch.empty(1, N, device=x.device, dtype=x.dtype)
    grid = lambda meta: (triton.cdiv(N, meta["BN"]), 1)  # noqa: E731
    zero_per_code_kernel[grid](x, qweight, scales, zero_points, y, N, K, zero_points.shape[1], x.stride(0), GROUP=GH * 2)
    return y


@triton.jit
def words_kernel(x_ptr, qw_ptr, sc_ptr, zp_ptr, y_ptr, N, ZPW, KW: tl.constexpr, WPG: tl.constexpr,
                 BN: tl.constexpr, BW: tl.constexpr, SPLIT: tl.constexpr):
    """The weight read as 32-bit words (8 codes each: code k = 8w + i is nibble i of word w) in [BN, BW]
    tiles, over a K slice unrolled at compile time (K a constant: every tile's load can be issued before
    the first is used); each word's 8 products summed, then scaled with its group's zero point applied
    through the word's sum of x. SPLIT slices of K a row block, added atomically into a float32 y (SPLIT
    = 1: stored in y's type)."""
    pid_n, s = tl.program_id(0), tl.program_id(1)
    n = pid_n * BN + tl.arange(0, BN)
    n_ok = n < N
    words = qw_ptr.to(tl.pointer_type(tl.int32))
    PER: tl.constexpr = (KW + SPLIT * BW - 1) // (SPLIT * BW) * BW  # words a slice: whole tiles
    acc = tl.zeros([BN, BW], dtype=tl.float32)
    for w0 in tl.static_range(0, PER, BW):
        w = s * PER + w0 + tl.arange(0, BW)
        w_ok = w < KW
        mask = n_ok[:, None] & w_ok[None, :]
        word = tl.load(words + n[:, None] * KW + w[None, :], mask=mask, other=0)
        part = tl.zeros([BN, BW], dtype=tl.float32)
        x_sum = tl.zeros([BW], dtype=tl.float32)
        for i in tl.static_range(8):
            x_i = tl.load(x_ptr + w * 8 + i, mask=w_ok, other=0.0).to(tl.float32)
            code = (((word >> (4 * i)) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
            part += code * x_i[None, :]
            x_sum += x_i
        g = w // WPG
        scale = tl.load(sc_ptr + n[:, None] * (KW // WPG) + g[None, :], mask=mask, other=0.0).to(tl.float32)
        zero = int4._zero_points(zp_ptr, n[:, None], g[None, :], ZPW, mask)
        acc += (part - zero * x_sum[None, :]) * scale
    y = tl.sum(acc, axis=1)
    if SPLIT == 1:
        tl.store(y_ptr + n, y.to(y_ptr.dtype.element_ty), mask=n_ok)
    else:
        tl.atomic_add(y_ptr + n, y, mask=n_ok)


WORD_TILES = [(8, 64, 4), (4, 128, 4), (8, 128, 4), (16, 64, 4), (4, 64, 2), (2, 128, 2), (16, 128, 8), (4, 256, 4),
              (8, 32, 2), (32, 32, 4)]  # (BN, BW, warps)
words_single = triton.autotune(
    configs=autotune_configs([triton.Config({"BN": bn, "BW": bw, "SPLIT": 1}, num_warps=w) for bn, bw, w in WORD_TILES],
                             [triton.Config({"BN": 4, "BW": 16, "SPLIT": 1}, num_warps=1)]),
    key=["N", "KW"])(words_kernel)
words_split = triton.autotune(
    configs=autotune_configs([triton.Config({"BN": bn, "BW": bw, "SPLIT": sp}, num_warps=w)
                              for bn, bw, w in WORD_TILES for sp in (2, 4, 8)],
                             [triton.Config({"BN": 4, "BW": 16, "SPLIT": 3}, num_warps=1)]),
    key=["N", "KW"], reset_to_zero=["y_ptr"])(words_kernel)


def words(x, qweight, scales, zero_points, split=False):
    """One row x [1, K] through the word kernel: straight into x's dtype, or (split) K in slices into a
    zeroed float32 y, then x's dtype (2 small kernels more)."""
    N, blocks, GH = qweight.shape
    K = blocks * GH * 2
    assert K % 8 == 0 and GH % 4 == 0, "whole 32-bit words, whole groups of them"
    y = torch.zeros(N, device=x.device, dtype=torch.float32) if split else torch.empty(N, device=x.device,
                                                                                       dtype=x.dtype)
    grid = lambda meta: (triton.cdiv(N, meta["BN"]), meta["SPLIT"])  # noqa: E731
    (words_split if split else words_single)[grid](x, qweight, scales, zero_points, y, N, zero_points.shape[1],
                                                   KW=K // 8, WPG=GH // 4)
    return (y.to(x.dtype) if split else y)[None]


def repack_words(qweight: torch.Tensor) -> torch.Tensor:
    """edgettt's packed codes [N, K/g, g/2] -> int32 words [N, K/8] in which nibble s of a group's word w
    holds the group's code (g/8) s + w (a kernel-private layout, made once a weight, as GPU int4 kernels
    repack theirs): for each s, the x values a tile of words meets are contiguous (x[g0 + (g/8) s + w]),
    loaded as wide as the words."""
    N, blocks, GH = qweight.shape
    codes = unpack_nibbles(qweight).reshape(N, blocks, 8, GH // 4)  # [N, G, s, w]: code (g/8) s + w ...
    codes = codes.transpose(-1, -2)  # ... [N, G, w, s]: word w's 8 codes, nibble s
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)  # [N, G, w, 4 bytes], little-endian words
    return packed.contiguous().view(torch.int32).reshape(N, blocks * GH // 4)


@triton.jit
def _repacked_tile(qw_ptr, sc_ptr, zp_ptr, n, n_ok, g, blocks, KW, ZPW, WPG: tl.constexpr):
    """Loads of one step of `repacked_kernel`: the words [BN, NG, WPG], scales and zero points [BN, NG] of
    groups g of rows n."""
    mask = n_ok[:, None] & (g < blocks)[None, :]
    wi = tl.arange(0, WPG)
    words = tl.load(qw_ptr + n[:, None, None] * KW + g[None, :, None] * WPG + wi[None, None, :],
                    mask=mask[:, :, None], other=0)
    scale = tl.load(sc_ptr + n[:, None] * blocks + g[None, :], mask=mask, other=0.0).to(tl.float32)
    return words, scale, int4._zero_points(zp_ptr, n[:, None], g[None, :], ZPW, mask)


@triton.jit
def repacked_kernel(x_ptr, qw_ptr, sc_ptr, zp_ptr, y_ptr, N, K, ZPW,
                    GROUP: tl.constexpr, BN: tl.constexpr, NG: tl.constexpr):
    """Words of `repack_words` in [BN, NG, g/8] tiles; each code becomes a float without an int-to-float
    conversion or a subtraction: moved to mantissa bits 19-22 of 1.0, it reads v = 1 + code / 16 (a shift
    and a masked OR), so a group's sum of code * x is 16 (sum v x - sum x), one FFMA a code. The zero
    point and the scale then enter once a group. Each step's words, scales and zero points are loaded one
    step ahead (held in registers), so that a warp has two steps' loads in flight."""
    pid_n = tl.program_id(0)
    WPG: tl.constexpr = GROUP // 8
    n = pid_n * BN + tl.arange(0, BN)
    n_ok = n < N
    gi = tl.arange(0, NG)
    wi = tl.arange(0, WPG)
    KW = K // 8
    blocks = K // GROUP
    acc = tl.zeros([BN, NG], dtype=tl.float32)
    words, scale, zero = _repacked_tile(qw_ptr, sc_ptr, zp_ptr, n, n_ok, gi, blocks, KW, ZPW, WPG)
    for g0 in range(0, blocks, NG):
        g = g0 + gi
        g_ok = g < blocks
        ahead = _repacked_tile(qw_ptr, sc_ptr, zp_ptr, n, n_ok, g + NG, blocks, KW, ZPW, WPG)
        part = tl.zeros([BN, NG, WPG], dtype=tl.float32)
        x_sum = tl.zeros([NG, WPG], dtype=tl.float32)
        for s in tl.static_range(8):
            x_s = tl.load(x_ptr + g[:, None] * GROUP + WPG * s + wi[None, :], mask=g_ok[:, None], other=0.0)
            x_s = x_s.to(tl.float32)
            if 4 * s <= 19:
                bits = words << (19 - 4 * s)
            else:
                bits = words >> (4 * s - 19)
            v = ((bits & 0x780000) | 0x3F800000).to(tl.float32, bitcast=True)
            part += v * x_s[None, :, :]
            x_sum += x_s
        group_x = tl.sum(x_sum, axis=1)  # [NG]
        acc += scale * (16.0 * tl.sum(part, axis=2) - (16.0 + zero) * group_x[None, :])
        words, scale, zero = ahead
    tl.store(y_ptr + n, tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty), mask=n_ok)


REPACKED_TILES = [(8, 8, 1), (8, 4, 1), (4, 8, 1), (16, 8, 2), (16, 4, 2), (32, 4, 2), (32, 8, 4), (8, 8, 2),
                  (16, 8, 4), (4, 16, 1), (8, 16, 2), (64, 4, 4),
                  # few rows, K across the warps: 31-62 warps a multiprocessor at 4096 rows (ncu: the tiles
                  # above leave the GEMV latency-bound, 1-4 warps a scheduler)
                  (4, 16, 4), (2, 32, 4), (4, 32, 8), (8, 32, 8), (4, 64, 8)]  # (BN, NG, warps)
repacked_single = triton.autotune(
    configs=autotune_configs([triton.Config({"BN": bn, "NG": ng}, num_warps=w, num_stages=st)
                              for bn, ng, w in REPACKED_TILES for st in (2, 4)],
                             [triton.Config({"BN": 8, "NG": 2}, num_warps=1)]),
    key=["N", "K", "GROUP"])(repacked_kernel)


def repacked(x, words, scales, zero_points):
    """One row x [1, K] against a weight repacked by `repack_words` (a [N, K/8] int32 tensor)."""
    N, KW = words.shape
    K = KW * 8
    group = K // scales.shape[1]
    assert group % 8 == 0, "whole words a group"
    y = torch.empty(N, device=x.device, dtype=x.dtype)
    grid = lambda meta: (triton.cdiv(N, meta["BN"]),)  # noqa: E731
    repacked_single[grid](x, words, scales, zero_points, y, N, K, zero_points.shape[1], GROUP=group)
    return y[None]


@triton.jit
def dp4a_kernel(xq_ptr, xw_ptr, xs_ptr, qw_ptr, sc_ptr, zp_ptr, y_ptr, N, K, KW, ZPW, GROUP: tl.constexpr,
                DP4A: tl.constexpr, BN: tl.constexpr, WPT: tl.constexpr, NQ: tl.constexpr):
    """W4A8 GEMV, one row: x as int8 codes with one scale a group (`quantize_x_groups`: each code word's even
    elements' bytes at xq[w], its odd ones' at xq[KW + w], the sum of its 8 codes at xw[w], group g's scale
    at xs[g]); a thread a chunk of WPT words (in one group) of each of BN rows; a word's even codes (one
    LOP3) and odd codes (a shift, a LOP3) as bytes, four products a dp4a; y = sum over chunks of
    scale * x scale * (sum c q - zero * sum q)."""
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    n_ok = n < N
    q = tl.arange(0, NQ)
    WPG: tl.constexpr = GROUP // 8
    words = qw_ptr.to(tl.pointer_type(tl.int32))
    acc = tl.zeros([NQ, BN], dtype=tl.float32)
    for w0 in range(0, KW, NQ * WPT):
        c = w0 + q * WPT
        c_ok = c < KW
        w = c[:, None] + tl.arange(0, WPT)[None, :]
        ok = c_ok[:, None] & n_ok[None, :]
        word = tl.load(words + n[None, :, None] * KW + w[:, None, :], mask=ok[:, :, None], other=0)
        x_even = tl.load(xq_ptr + w, mask=c_ok[:, None], other=0)[:, None, :]
        x_odd = tl.load(xq_ptr + KW + w, mask=c_ok[:, None], other=0)[:, None, :]
        dots = int4._dp4a(word & 0x0F0F0F0F, x_even, tl.zeros([NQ, BN, WPT], dtype=tl.int32), DP4A)
        dots = int4._dp4a((word >> 4) & 0x0F0F0F0F, x_odd, dots, DP4A)
        g = c // WPG
        scale = tl.load(sc_ptr + n[None, :] * (K // GROUP) + g[:, None], mask=ok, other=0.0).to(tl.float32)
        zero = int4._zero_points(zp_ptr, n[None, :], g[:, None], ZPW, ok)
        x_scale = tl.load(xs_ptr + g, mask=c_ok, other=0.0)[:, None]
        x_codes = tl.sum(tl.load(xw_ptr + w, mask=c_ok[:, None], other=0), axis=1).to(tl.float32)[:, None]
        acc += scale * x_scale * (tl.sum(dots, axis=2).to(tl.float32) - zero * x_codes)
    tl.store(y_ptr + n, tl.sum(acc, axis=0).to(y_ptr.dtype.element_ty), mask=n_ok)


dp4a_single = triton.autotune(
    configs=autotune_configs([triton.Config({"BN": bn, "WPT": wpt, "NQ": 32 * w}, num_warps=w)
                              for bn, wpt, w in [(8, 4, 4), (8, 8, 2), (16, 4, 4), (4, 4, 4), (8, 2, 4), (4, 8, 1),
                                                 (8, 4, 1), (16, 8, 2), (8, 8, 1), (4, 4, 2)]],
                             [triton.Config({"BN": 4, "WPT": 2, "NQ": 8}, num_warps=1)]),
    key=["N", "K", "GROUP"],  # a chunk within one group: WPT words at most a group's (GROUP / 8)
    prune_configs_by={"early_config_prune": lambda configs, named, **kw: [
        c for c in configs if c.kwargs["WPT"] <= kw["GROUP"] // 8] or configs[-1:]})(dp4a_kernel)


def quantize_x_groups(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One row x [1, K] as the dp4a kernel takes it (rounded a group at a time as the W4A8 GEMV rounds its blocks:
    `int4.a8_codes`): the int8 codes packed a code word at a time (its even elements' 4 bytes, then its odd
    ones'), each word's sum of codes, and the groups' scales."""
    codes, scale = int4.a8_codes(x, group)
    by_word = codes.to(torch.int8).reshape(-1, 8)
    xq = torch.cat([by_word[:, 0::2].contiguous().view(torch.int32).reshape(-1),
                    by_word[:, 1::2].contiguous().view(torch.int32).reshape(-1)])
    return xq, by_word.sum(1, dtype=torch.int32), scale.reshape(-1).contiguous()


_QUANTIZED_X = []  # [(x, its version, group, its quantization)]: made once an x (as a producer fusing it would
# hand it over), not timed; the x itself held, so that its memory is not another x's while it is the key


def dp4a(x, qweight, scales, zero_points):
    """One row x [1, K] through the W4A8 dp4a kernel, x rounded to int8 with one scale a group."""
    N, blocks, GH = qweight.shape
    K = blocks * GH * 2
    if not (_QUANTIZED_X and _QUANTIZED_X[0][0] is x and _QUANTIZED_X[0][1:3] == (x._version, GH * 2)):
        _QUANTIZED_X[:] = [(x, x._version, GH * 2, quantize_x_groups(x, GH * 2))]
    xq, xw, xs = _QUANTIZED_X[0][3]
    y = torch.empty(1, N, device=x.device, dtype=x.dtype)
    grid = lambda meta: (triton.cdiv(N, meta["BN"]),)  # noqa: E731
    dp4a_single[grid](xq, xw, xs, qweight, scales, zero_points, y, N, K, K // 8, zero_points.shape[1], GROUP=GH * 2,
                      DP4A=not INTERPRETER)
    return y


def dp4a_ref(x, qweight, scales, zero_points):
    """What `dp4a` computes, in fp32 torch: x rounded a group at a time (`int4.a8_codes`), times the weight."""
    codes, scale = int4.a8_codes(x, qweight.shape[2] * 2)
    x_hat = (codes * scale).reshape(1, -1)
    return int4.int4_matmul_ref(x_hat, qweight, scales, zero_points)


VARIANTS = {"shipped": int4.int4_matmul, "strided x": strided_x, "zero per code": zero_per_code, "words": words,
            "words split-K": lambda *a: words(*a, split=True)}
PREPARE = {"repacked": repack_words}  # variants that take the weight in their own layout: made once a weight
VARIANTS["repacked"] = repacked
VARIANTS["dp4a (int8 x)"] = dp4a
VARIANTS["shipped a8 (int8 x)"] = lambda x, *weight: int4.int4_matmul(x, *weight, gemm="a8")  # x rounded in the kernel
REFERENCES = {"dp4a (int8 x)": dp4a_ref, "shipped a8 (int8 x)": int4.int4_matmul_a8_ref}  # variants that compute another product than the weight-only one


def in_layout(name, weight):
    """The (qweight, scales, zero_points) of edgettt's format as variant `name` takes them."""
    qweight, scales, zero_points = weight
    return (PREPARE[name](qweight) if name in PREPARE else qweight), scales, zero_points


def variant_rows(ceiling, names, shapes=SHAPES):
    rows = []
    for N, K in shapes:
        variants = weight_variants(N, K, torch.bfloat16)
        copy, _, nbytes, _ = variants["int4 g64 (edgettt kernel)"]
        copies = [copy() for _ in range(copies_for(nbytes))]
        x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        for name in names:
            check = VARIANTS[name](x, *in_layout(name, copies[0]))
            want = REFERENCES[name](x, *copies[0]).to(x.dtype) if name in REFERENCES else int4.int4_matmul(x, *copies[0])
            assert torch.allclose(check, want, rtol=2e-2, atol=1e-1), name
        for name in names:
            laid_out = [in_layout(name, c) for c in copies]
            ms, _ = time_rotating_ms([lambda c=c, fn=VARIANTS[name]: fn(x, *c) for c in laid_out])
            rows.append({"variant": name, "N": N, "K": K, "us": ms * 1e3, "fraction_of_copy": nbytes / (ms * 1e-3) / ceiling})
            if name == "shipped":  # the autotuner's pick at this shape
                rows[-1]["config"] = str(int4._int4_gemv_kernel.best_config)
            print(json.dumps(rows[-1]), flush=True)
            del laid_out
        del copies
        rows.append(same_bytes_copy_row(N, K, nbytes, ceiling))
    return rows


def same_bytes_copy_row(N, K, nbytes, ceiling):
    """A device copy that moves the GEMV's bytes (`same_bytes_copy_ms`)."""
    ms = same_bytes_copy_ms(nbytes)
    row = {"variant": "copy (same bytes)", "N": N, "K": K, "us": ms * 1e3, "fraction_of_copy": nbytes / (ms * 1e-3) / ceiling}
    print(json.dumps(row), flush=True)
    return row


# the int4 products of a decode step around which `fused_products` fuses, at the presets' sizes: (preset,
# product, N, K, what it fuses); gate/up is the stacked product of both
PROLOGUE_SHAPES = [(preset, name, N, K, fused) for preset, C, inner in (("760m", 1536, 4096), ("125m", 768, 2048))
                   for name, N, K, fused in (("o", C, C, "layer"), ("gate/up", 2 * inner, C, "rms"),
                                             ("down", C, inner, "gated"))]


def prologue_rows(ceiling, presets=("760m", "125m"), a8: bool = False) -> list[dict]:
    """Each fused product of a decode step (`int4_gemv` with its prologue and residual) against the plain GEMV
    and against the same work as separate launches, the norm / activation and the residual add each a kernel
    torch.compile makes (as a compiled step runs them unfused): microseconds a call in a CUDA graph, weight
    copies rotating past L2 (x, the norm's parameters and the residual stay in it, as in a step). Also the
    way the model takes SwiGLU's activation since: in the gate/up product's epilogue (`glu`), leaving the down
    product with its residual only. `a8`: every GEMV in W4A8 (x rounded to int8 in the kernel:
    `int4_gemv(..., a8=True)`)."""
    import torch.nn.functional as F

    from edgettt.ops import rms_norm

    rows = []
    for preset, name, N, K, fused in [shape for shape in PROLOGUE_SHAPES if shape[0] in presets]:
        copy, _, nbytes, _ = weight_variants(N, K, torch.bfloat16)["int4 g64 (edgettt kernel)"]
        copies = [copy() for _ in range(copies_for(nbytes))]
        device = copies[0][0].device

        def rand(*shape):
            return torch.randn(*shape, device=device, dtype=torch.bfloat16)
        x, gate_up, weight, bias = rand(1, K), rand(1, 2 * K), rand(K), rand(K)
        residual = rand(1, N) if fused != "rms" else None
        if fused == "gated":
            x, up, norm = gate_up[:, :K], gate_up[:, K:], None
            before = torch.compile(lambda x: F.silu(x) * up)
        else:
            up, norm = None, (fused, weight, bias if fused == "layer" else None, 1e-6)
            before = torch.compile(lambda x: F.layer_norm(x, (K,), weight, bias, 1e-6) if fused == "layer"
                                   else rms_norm(x, weight, 1e-6))
        add = torch.compile(lambda r, y: r + y)
        ways = {"plain GEMV": lambda c: int4.int4_gemv(x, *c, a8=a8),
                f"fused ({fused}{' + residual' if residual is not None else ''})":
                    lambda c: int4.int4_gemv(x, *c, norm=norm, up=up, residual=residual, a8=a8),
                "separate (compiled prologue, GEMV, add)":
                    lambda c: (lambda y: y if residual is None else add(residual, y))(int4.int4_gemv(before(x), *c, a8=a8))}
        if fused == "rms":  # SwiGLU's activation in this product's epilogue (what the model runs since)
            ways["fused (rms, GLU epilogue)"] = lambda c: int4.int4_gemv(x, *c, norm=norm, glu=True, a8=a8)
            ways["separate rms, GEMV with GLU epilogue"] = lambda c: int4.int4_gemv(before(x), *c, glu=True, a8=a8)
        if fused == "gated":  # the down product once the activation is made elsewhere
            ways["residual only"] = lambda c: int4.int4_gemv(x, *c, residual=residual, a8=a8)
        for way, fn in ways.items():
            fn(copies[0])  # compile and autotune outside the capture
            ms, _ = time_rotating_ms([lambda c=c: fn(c) for c in copies])
            rows.append({"preset": preset, "product": name, "N": N, "K": K, "way": way, "a8": a8, "us": ms * 1e3,
                         "fraction_of_copy": nbytes / (ms * 1e-3) / ceiling,
                         "config": str(int4._int4_gemv_kernel.best_config)})  # the autotuner's pick for the last call
            print(json.dumps(rows[-1]), flush=True)
        del copies
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    ap.add_argument("--shapes", default="4096x4096,11008x4096", help="comma-separated NxK weight shapes")
    ap.add_argument("--prologues", action="store_true", help="instead: each fused decode product (`int4_gemv` with "
                    "its norm or activation and residual, fused_products.py) at the 760m and 125m presets' shapes, "
                    "against the plain GEMV and against the same work as separate kernels")
    ap.add_argument("--presets", default="760m,125m", help="with --prologues: the presets whose shapes to time")
    ap.add_argument("--a8", action="store_true", help="with --prologues: the GEMVs in W4A8 (x rounded to int8 inside)")
    args = ap.parse_args()
    if args.prologues:
        rows = prologue_rows(copy_bandwidth(), args.presets.split(","), args.a8)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                           "prologues": rows}, f, indent=2)
        return
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"bench_gemv.py: unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    shapes = [tuple(int(v) for v in shape.split("x")) for shape in args.shapes.split(",") if shape]
    ceiling = copy_bandwidth()
    variants = variant_rows(ceiling, names, shapes)
    rows = [r for N, K in shapes for r in weight_rows(N, K, 1, torch.bfloat16, ceiling)]
    for r in rows:
        print(f"{r['N']}x{r['K']} {r['name']:32s} {r['ms'] * 1e3:7.2f} us  {r['fraction_of_copy']:6.1%} of copy  "
              + "  ".join(f"{k} {v:.2f}" for k, v in r.items() if k.startswith("x ")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "copy_bandwidth_GBps": ceiling / 1e9, "variants": variants,
                       "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
