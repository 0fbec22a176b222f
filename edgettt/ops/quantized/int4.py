"""Weight-only int4 matmul on edgettt's packed format (the layout of ONNX Runtime's MatMulNBits).

    y = x @ W^T,   W[n, k] = (code[n, k] - zero[n, k // g]) * scale[n, k // g]
    x: [..., K] fp16/bf16/fp32;  qweight: uint8 [N, K/g, g/2] (two codes a byte, the even k in the low
    nibble);  scales: float [N, K/g];  zero_points: uint8 [N, ceil(K/g / 2)] (packed the same way)
    returns y: [..., N] in x's dtype

`int4_matmul_ref` dequantizes in torch. `int4_matmul` picks a kernel by the number of rows M:
- GEMV (decode, M <= 8): each program owns BN outputs of one row and walks K in 32-bit words of
  codes, a thread a chunk of words of all BN rows (x read once for them); each code becomes a float
  by a shift and one LOP3, one FFMA a code; scales and zero points once a chunk (`_int4_gemv_kernel`).
  1.48x / 1.50x bitsandbytes' gemv_4bit at 4096x4096 / 11008x4096 on the H200; the previous kernel
  and other variants are measured in `benchmarks/bench_gemv.py` (benchmarks/results/gemm_h200.md).
  `int4_gemv` is the same kernel with a prologue (x through an RMSNorm, a LayerNorm or silu(x) * up as
  it is read) and a residual added as it stores, or SwiGLU's activation applied to a stacked gate/up
  product as it stores (`glu`): a compiled decode step's product with what surrounds it in one launch
  (`fused_products`).
  `a8` (W4A8, the same kernel's A8 path; `int4_matmul(..., gemm="a8")` at these rows): x, through the prologue,
  rounded to int8 in blocks of 32 values inside the kernel (`a8_rounded`) and multiplied by the codes as
  they are, four products a dp4a: 1.09-1.31x the weight-only GEMV alone at the 760m shapes, no faster with
  a fused norm, opt-in (`weight_formats.int4_a8`; benchmarks/results/gemm_h200.md, last section).
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
import torch.nn.functional as F
import triton
import triton.language as tl

from edgettt.formats.layouts import dequantize_int4, unpack_nibbles
from edgettt.ops import rms_norm
from edgettt.ops.common import GEMV_MAX_ROWS, INTERPRETER, autotune_configs, cdiv, fresh, next_power_of_2
from edgettt.ops.quantized.int8 import int8_a8_gemm, int8_matmul_a8_ref


def int4_matmul_ref(x, qweight, scales, zero_points):
    w = dequantize_int4({"qweight": qweight, "scales": scales, "zero_points": zero_points})
    return (x.float() @ w.T).to(x.dtype)


@triton.jit
def _zero_points(zp_ptr, row, group, ZPW, mask):
    """Zero points as fp32 of rows `row`, groups `group` (index tensors or scalars that broadcast against
    each other, in whatever orientation the caller's tile has): packed two a byte, the even group in the
    low nibble."""
    byte = tl.load(zp_ptr + row * ZPW + group // 2, mask=mask, other=0).to(tl.int32)
    return ((byte >> ((group % 2) * 4)) & 0xF).to(tl.float32)


@triton.jit
def _x_pair(x_row, w, b: tl.constexpr, ok, X16: tl.constexpr):
    """x[8w + 2b] and x[8w + 2b + 1] as fp32, the partners of codes 2b and 2b + 1 of words w. 16-bit x is
    read as 32-bit words, the pair in one (the low half the earlier element), split in registers."""
    if X16:
        pair = tl.load(x_row.to(tl.pointer_type(tl.int32)) + 4 * w + b, mask=ok, other=0)
        if x_row.dtype.element_ty == tl.bfloat16:  # a bf16's bits are the top half of its fp32's: one op each
            lo = (pair << 16).to(tl.float32, bitcast=True)
            hi = (pair & -65536).to(tl.float32, bitcast=True)
        else:
            lo = pair.to(tl.int16).to(x_row.dtype.element_ty, bitcast=True).to(tl.float32)
            hi = (pair >> 16).to(tl.int16).to(x_row.dtype.element_ty, bitcast=True).to(tl.float32)
    else:
        lo = tl.load(x_row + 8 * w + 2 * b, mask=ok, other=0.0).to(tl.float32)
        hi = tl.load(x_row + 8 * w + 2 * b + 1, mask=ok, other=0.0).to(tl.float32)
    return lo, hi


@triton.jit
def _one_plus_sixteenths(word, SHIFT: tl.constexpr, one_bits):
    """1 + c / 16 as fp32 for the 4-bit code c at bits SHIFT .. SHIFT + 3 of int32 `word`: c moved into
    mantissa bits 19-22 of 1.0 (a shift and one LOP3: no conversion, no subtraction; exact). `one_bits`
    is 1.0's bits (0x3F800000) as a kernel argument, not a literal: with two literals the compiler
    masks and ORs in two instructions."""
    if SHIFT <= 19:
        moved = word << (19 - SHIFT)
    else:
        moved = word >> (SHIFT - 19)
    return ((moved & 0x780000) | one_bits).to(tl.float32, bitcast=True)


# (rows a program, words a thread's chunk, chunks a thread, warps, stages); a step covers 32 * warps * chunks *
# words of a row's K / 8: the one- and two-warp tiles fit the K of 1,536 and 768 (192 and 96 words) of the
# 760m and 125m presets' layers
GEMV_CONFIGS = [triton.Config({"BN": bn, "WPT": wpt, "NQ": 32 * w * r}, num_warps=w, num_stages=s)
                for bn, wpt, r, w, s in [(8, 4, 1, 4, 1), (4, 4, 1, 4, 1), (16, 4, 1, 4, 1), (8, 2, 1, 4, 1),
                                         (8, 4, 1, 2, 1), (4, 4, 1, 8, 1), (8, 4, 1, 8, 1), (16, 2, 1, 4, 1),
                                         (4, 2, 2, 4, 1), (2, 4, 1, 4, 1), (16, 4, 1, 2, 1), (32, 2, 1, 4, 1),
                                         (4, 4, 2, 4, 1), (8, 2, 1, 8, 1), (2, 4, 2, 8, 1), (8, 4, 1, 4, 2),
                                         (4, 4, 1, 2, 2), (32, 4, 1, 4, 1), (4, 2, 1, 1, 1), (8, 2, 1, 1, 1),
                                         (16, 2, 1, 1, 1), (8, 4, 1, 1, 1), (16, 4, 1, 1, 1), (4, 2, 1, 2, 1),
                                         (8, 2, 1, 2, 1), (2, 2, 1, 2, 1)]]


# what the GEMV applies to x on the way in (`int4_gemv`): nothing, an RMSNorm, a LayerNorm, or SwiGLU's silu(x) * up
PROLOGUES = {"none": 0, "rms": 1, "layer": 2, "gated": 3}


@triton.jit
def _x_stats(x_row, KW, K, eps, X16: tl.constexpr, NQ: tl.constexpr, WPT: tl.constexpr):
    """(mean, 1 / sqrt(var + eps)) of a row of x for the LayerNorm prologue, in a pass over the same
    [NQ, WPT] chunks of words the product reads (so in its layout)."""
    q = tl.arange(0, NQ)
    s1 = tl.zeros([NQ, WPT], dtype=tl.float32)
    s2 = tl.zeros([NQ, WPT], dtype=tl.float32)
    for w0 in range(0, KW, NQ * WPT):
        c = w0 + q * WPT
        w = c[:, None] + tl.arange(0, WPT)[None, :]
        for b in tl.static_range(4):
            lo, hi = _x_pair(x_row, w, b, (c < KW)[:, None], X16)
            s1 += lo + hi
            s2 += lo * lo + hi * hi
    mean = tl.sum(tl.sum(s1, axis=1), axis=0) / K
    return mean, tl.rsqrt(tl.maximum(tl.sum(tl.sum(s2, axis=1), axis=0) / K - mean * mean, 0.0) + eps)


@triton.jit
def _x_in(lo, hi, up_row, nw_ptr, nb_ptr, w, b: tl.constexpr, ok, mean, inv, PROLOGUE: tl.constexpr,
          X16: tl.constexpr, W16: tl.constexpr):
    """Pair b of words w of x (`_x_pair`: lo, hi) as the product takes it, through the prologue: x * weight
    (an RMSNorm, whose 1 / rms scales the sums at the end), (x - mean) * inv * weight + bias (a LayerNorm),
    or silu(x) * up."""
    if PROLOGUE == 1 or PROLOGUE == 2:
        g_lo, g_hi = _x_pair(nw_ptr, w, b, ok, W16)
        if PROLOGUE == 2:
            b_lo, b_hi = _x_pair(nb_ptr, w, b, ok, W16)
            lo = (lo - mean) * inv * g_lo + b_lo
            hi = (hi - mean) * inv * g_hi + b_hi
        else:
            lo = lo * g_lo
            hi = hi * g_hi
    elif PROLOGUE == 3:
        u_lo, u_hi = _x_pair(up_row, w, b, ok, X16)
        lo = lo * tl.sigmoid(lo) * u_lo
        hi = hi * tl.sigmoid(hi) * u_hi
    return lo, hi


@triton.jit
def _block_rows(nb, N, BN: tl.constexpr, GLU: tl.constexpr):
    """The weight rows of row block nb (BN of them) and which exist. GLU: the stacked gate/up product's BN / 2
    pairs j, held interleaved (gate row j, then its up row N / 2 + j), so that one program has both rows."""
    if GLU:
        pair = nb * (BN // 2) + tl.arange(0, BN) // 2
        return pair + (tl.arange(0, BN) % 2) * (N // 2), pair < N // 2
    n = nb * BN + tl.arange(0, BN)
    return n, n < N


@triton.jit
def _block_weight(words, sc_ptr, zp_ptr, n, n_ok, c, w, c_ok, KW, ZPW, blocks, WPG: tl.constexpr):
    """Rows n's code words at the chunks starting at words c (w: their [NQ, WPT] word indices; [NQ, BN, WPT])
    with the chunks' scales and zero points ([NQ, BN] fp32; a chunk lies in one group)."""
    ok = c_ok[:, None] & n_ok[None, :]
    word = tl.load(words + n[None, :, None] * KW + w[:, None, :], mask=ok[:, :, None], other=0,
                   eviction_policy="evict_first")
    g = (c // WPG)[:, None]
    scale = tl.load(sc_ptr + n[None, :] * blocks + g, mask=ok, other=0.0).to(tl.float32)
    return word, scale, _zero_points(zp_ptr, n[None, :], g, ZPW, ok)


@triton.jit
def _store_rows(y, y_ptr, r_ptr, m, n, n_ok, nb, N, stride_rm, RESIDUAL: tl.constexpr, GLU: tl.constexpr,
                BN: tl.constexpr):
    """Row block nb's outputs y ([BN] fp32) of row m: plus the residual, or as SwiGLU's silu(gate) * up of its
    pairs (N / 2 outputs a row)."""
    if RESIDUAL:
        y += tl.load(r_ptr + m * stride_rm + n, mask=n_ok, other=0.0).to(tl.float32)
    if GLU:
        gate, up = tl.split(tl.reshape(y, (BN // 2, 2)))
        j = nb * (BN // 2) + tl.arange(0, BN // 2)
        tl.store(y_ptr + m * (N // 2) + j, (gate * tl.sigmoid(gate) * up).to(y_ptr.dtype.element_ty), mask=j < N // 2)
    else:
        tl.store(y_ptr + m * N + n, y.to(y_ptr.dtype.element_ty), mask=n_ok)


# W4A8 decode: x rounded to int8 in blocks of this many values (4 code words; `a8_rounded`), the GEMV's
# chunk: a block's scale is one thread's, from values it holds (finer than any weight group, so a chunk lies
# in one group)
A8_BLOCK = 32


@triton.jit
def _dp4a(a, b, c, DP4A: tl.constexpr):
    """c + the four products of a's unsigned bytes with b's signed bytes (int32 tensors): one dp4a
    instruction a word on the GPU; under the interpreter (which cannot run inline PTX) the same sum byte by
    byte."""
    if DP4A:
        return tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32,
                                         is_pure=True, pack=1)
    for i in tl.static_range(4):
        c += ((a >> (8 * i)) & 0xFF) * (((b >> (8 * i)) << 24) >> 24)  # (the second sign-extended)
    return c


@triton.jit
def _x_in_pair(x_row, up_row, nw_ptr, nb_ptr, w, b: tl.constexpr, ok, mean, inv, PROLOGUE: tl.constexpr,
               X16: tl.constexpr, W16: tl.constexpr):
    """Pair b of words w of x through the prologue (`_x_in`), and the raw pair's squares (an RMSNorm's)."""
    lo, hi = _x_pair(x_row, w, b, ok, X16)
    squares = lo * lo + hi * hi
    lo, hi = _x_in(lo, hi, up_row, nw_ptr, nb_ptr, w, b, ok, mean, inv, PROLOGUE, X16, W16)
    return lo, hi, squares


@triton.jit
def _int8_code(v, to_code):
    """v * to_code rounded to the nearest integer (half to even) in the low byte of an int32, as its two's
    complement: 1.5 * 2^23 added in the same FFMA leaves the rounded value in the float's low mantissa bits
    (exact for |v * to_code| < 2^22), one instruction a value."""
    return (v * to_code + 12582912.0).to(tl.int32, bitcast=True)


@triton.jit
def _low_bytes(a, b, c, d, PTX: tl.constexpr):
    """The low bytes of int32s a, b, c, d packed into one int32 (a's lowest): three PRMT on the GPU."""
    if PTX:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t0, t1; prmt.b32 t0, $1, $2, 0x0040; prmt.b32 t1, $3, $4, 0x0040; "
            "prmt.b32 $0, t0, t1, 0x5410; }", "=r,r,r,r,r", [a, b, c, d], dtype=tl.int32, is_pure=True, pack=1)
    return (a & 0xFF) | ((b & 0xFF) << 8) | ((c & 0xFF) << 16) | (d << 24)


@triton.jit
def _x_block_a8(x_row, up_row, nw_ptr, nb_ptr, w, ok, mean, inv, PROLOGUE: tl.constexpr, X16: tl.constexpr,
                W16: tl.constexpr, PTX: tl.constexpr):
    """x's blocks at words w ([NQ, 4]: a block, 32 values, a row) through the prologue, rounded to int8 with
    one scale a block (absmax / 127; `a8_rounded`): each word's even codes packed as bytes into an int32 (the
    partners of the code word's low nibbles), its odd codes likewise, [NQ, 4] each; each block's sum of codes
    and scale ([NQ]); the raw values' squares ([NQ, 4], for an RMSNorm)."""
    lo0, hi0, sq0 = _x_in_pair(x_row, up_row, nw_ptr, nb_ptr, w, 0, ok, mean, inv, PROLOGUE, X16, W16)
    lo1, hi1, sq1 = _x_in_pair(x_row, up_row, nw_ptr, nb_ptr, w, 1, ok, mean, inv, PROLOGUE, X16, W16)
    lo2, hi2, sq2 = _x_in_pair(x_row, up_row, nw_ptr, nb_ptr, w, 2, ok, mean, inv, PROLOGUE, X16, W16)
    lo3, hi3, sq3 = _x_in_pair(x_row, up_row, nw_ptr, nb_ptr, w, 3, ok, mean, inv, PROLOGUE, X16, W16)
    big = tl.maximum(tl.maximum(tl.maximum(tl.abs(lo0), tl.abs(hi0)), tl.maximum(tl.abs(lo1), tl.abs(hi1))),
                     tl.maximum(tl.maximum(tl.abs(lo2), tl.abs(hi2)), tl.maximum(tl.abs(lo3), tl.abs(hi3))))
    amax = tl.max(big, axis=1)
    to_code = tl.where(amax > 0, 127.0 / tl.maximum(amax, 1e-30), 0.0)[:, None]
    even = _low_bytes(_int8_code(lo0, to_code), _int8_code(lo1, to_code), _int8_code(lo2, to_code),
                      _int8_code(lo3, to_code), PTX)
    odd = _low_bytes(_int8_code(hi0, to_code), _int8_code(hi1, to_code), _int8_code(hi2, to_code),
                     _int8_code(hi3, to_code), PTX)
    ones = tl.full(even.shape, 0x01010101, tl.int32)  # a dp4a against these sums a word's four codes
    sums = tl.sum(_dp4a(ones, odd, _dp4a(ones, even, tl.zeros_like(even), PTX), PTX), axis=1)
    return even, odd, sums, amax / 127.0, sq0 + sq1 + sq2 + sq3


@triton.jit
def _a8_chunk(word, scale, zero, x_row, up_row, nw_ptr, nb_ptr, w, ok, mean, inv, PROLOGUE: tl.constexpr,
              X16: tl.constexpr, W16: tl.constexpr, DP4A: tl.constexpr):
    """One step of the W4A8 GEMV: x's blocks at words w rounded (`_x_block_a8`), each word's even codes (one
    LOP3) and odd codes (a shift and a LOP3) as bytes against x's packed codes, four products a dp4a; the
    chunks' scale * x scale * (sum c q - zero * sum q) ([NQ, BN]) and x's squares (an RMSNorm's)."""
    tl.static_assert(word.shape[2] * 8 == 32, "a chunk is one rounding block of x (A8_BLOCK values)")
    even, odd, x_codes, x_scale, squares = _x_block_a8(x_row, up_row, nw_ptr, nb_ptr, w, ok, mean, inv, PROLOGUE,
                                                       X16, W16, DP4A)
    dots = _dp4a(word & 0x0F0F0F0F, even[:, None, :], tl.zeros(word.shape, dtype=tl.int32), DP4A)
    dots = _dp4a((word >> 4) & 0x0F0F0F0F, odd[:, None, :], dots, DP4A)
    dots = tl.sum(dots, axis=2).to(tl.float32)
    return scale * x_scale[:, None] * (dots - zero * x_codes.to(tl.float32)[:, None]), squares


def _a8_tiles(configs, named_args, **kwargs):
    """The tiles the autotuner tries: with A8 those whose chunk is one rounding block of x (A8_BLOCK values)."""
    return [c for c in configs if c.kwargs["WPT"] * 8 == A8_BLOCK] if kwargs["A8"] else configs


@triton.autotune(configs=autotune_configs(GEMV_CONFIGS, [triton.Config({"BN": 4, "WPT": 4, "NQ": 8}, num_warps=1)]),
                 key=["N", "K", "GROUP", "X16", "PROLOGUE", "RESIDUAL", "GLU", "A8"],
                 prune_configs_by={"early_config_prune": _a8_tiles})
@triton.jit
def _int4_gemv_kernel(x_ptr, qw_ptr, sc_ptr, zp_ptr, y_ptr, up_ptr, nw_ptr, nb_ptr, r_ptr, N, K, KW, ZPW, stride_xm,
                      stride_rm, one_bits, eps, GROUP: tl.constexpr, X16: tl.constexpr, PROLOGUE: tl.constexpr,
                      W16: tl.constexpr, RESIDUAL: tl.constexpr, GLU: tl.constexpr, A8: tl.constexpr,
                      DP4A: tl.constexpr, BN: tl.constexpr, WPT: tl.constexpr, NQ: tl.constexpr):
    """y[n] = sum_g scale[n, g] * (sum_{k in g} code[n, k] x[k] - zero[n, g] * sum_{k in g} x[k]) (+ r[n]).

    The codes are read as 32-bit words (code k = 8w + e is nibble e of word w), a step an [NQ, BN, WPT]
    tile: NQ chunks of WPT words (one chunk a thread, within one group) of each of BN rows, the rows held
    in registers, so that a thread reads and converts its chunk's x once for all BN rows. The chunk axis
    first makes the loads of x (16-bit pairs as 32-bit words, [NQ, WPT] each) take the tile's own layout:
    no shuffle through shared memory. A code c enters as v = 1 + c / 16 (`_one_plus_sixteenths`), one
    FFMA a code, so a chunk's sum of c x is 16 (sum v x - sum x); its scale and zero point enter once a
    chunk. PROLOGUE (`PROLOGUES`) turns x into the product's input as it is read (each program walks all
    of K, so it can take a norm's statistics: an RMSNorm's on the way, a LayerNorm's in a pass before),
    RESIDUAL adds r to y: a decode step's norm, activation and residual add then need no kernels of their
    own. GLU: the weight is SwiGLU's stacked gate/up product (gate row j at j, its up row at N / 2 + j): a
    program takes BN / 2 such pairs (held interleaved, gate then up) and stores silu(gate) * up, N / 2
    outputs: each activation computed once, by the program that has both rows (BN is even).
    A8 (W4A8): x rounded to int8 as it is read (`_a8_chunk`), a thread's chunk one block of A8_BLOCK values;
    DP4A: the dp4a instruction (off under the interpreter, which cannot run PTX)."""
    pid_n, m = tl.program_id(0), tl.program_id(1)
    WPG: tl.constexpr = GROUP // 8
    n, n_ok = _block_rows(pid_n, N, BN, GLU)
    q = tl.arange(0, NQ)
    blocks = K // GROUP
    words = qw_ptr.to(tl.pointer_type(tl.int32))
    x_row = x_ptr + m * stride_xm
    up_row = up_ptr + m * stride_xm
    mean, inv = 0.0, 1.0
    if PROLOGUE == 2:  # a LayerNorm's statistics first (an RMSNorm's sum of squares comes with the product)
        mean, inv = _x_stats(x_row, KW, K, eps, X16, NQ, WPT)
    acc = tl.zeros([NQ, BN], dtype=tl.float32)
    squares = tl.zeros([NQ, WPT], dtype=tl.float32)
    for w0 in range(0, KW, NQ * WPT):
        c = w0 + q * WPT  # [NQ] chunk starts (words)
        c_ok = c < KW  # whole chunks: WPT divides K / 8
        w = c[:, None] + tl.arange(0, WPT)[None, :]  # [NQ, WPT]
        word, scale, zero = _block_weight(words, sc_ptr, zp_ptr, n, n_ok, c, w, c_ok, KW, ZPW, blocks, WPG)
        if A8:
            part, sq = _a8_chunk(word, scale, zero, x_row, up_row, nw_ptr, nb_ptr, w, c_ok[:, None], mean, inv,
                                 PROLOGUE, X16, W16, DP4A)
            acc += part
            squares += sq
        else:
            part = tl.zeros([NQ, BN, WPT], dtype=tl.float32)
            x_sum = tl.zeros([NQ, WPT], dtype=tl.float32)
            for b in tl.static_range(4):  # pair b of each word's x: codes 2b (bits 8b..) and 2b + 1 (8b + 4..)
                x_lo, x_hi, sq = _x_in_pair(x_row, up_row, nw_ptr, nb_ptr, w, b, c_ok[:, None], mean, inv, PROLOGUE,
                                            X16, W16)
                squares += sq  # (an RMSNorm's; dead code, and dropped, for the other prologues)
                part += _one_plus_sixteenths(word, 8 * b, one_bits) * x_lo[:, None, :]
                part += _one_plus_sixteenths(word, 8 * b + 4, one_bits) * x_hi[:, None, :]
                x_sum += x_lo + x_hi
            x_chunk = tl.sum(x_sum, axis=1)  # [NQ]
            acc += scale * (16.0 * tl.sum(part, axis=2) - (16.0 + zero) * x_chunk[:, None])
    y = tl.sum(acc, axis=0)
    if PROLOGUE == 1:
        y *= tl.rsqrt(tl.sum(tl.sum(squares, axis=1), axis=0) / K + eps)
    _store_rows(y, y_ptr, r_ptr, m, n, n_ok, pid_n, N, stride_rm, RESIDUAL, GLU, BN)


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
    zero = _zero_points(zp_ptr, n, g, ZPW, n_ok)  # [BN]
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
    """The W4A8 product `int4_matmul(..., gemm="a8")` computes: up to GEMV_MAX_ROWS rows the GEMV's (x rounded
    in blocks, the int4 codes as they are: `int4_gemv_ref`); above, the weight on its int8 grid
    (`int4_to_int8_ref`), then `int8_matmul_a8_ref` (x rounded a row)."""
    if x.numel() // x.shape[-1] <= GEMV_MAX_ROWS:
        return int4_gemv_ref(x, qweight, scales, zero_points, a8=True)
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
    zero = _zero_points(zp_ptr, n[:, None], gi[None, :], ZPW, ok)
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


def _words(t: torch.Tensor) -> torch.Tensor:
    """t (rows of 16-bit values, or codes) as the GEMV reads it, in 32-bit words: copied if it starts off a
    4-byte boundary or its rows do (a view into a buffer may start anywhere)."""
    if t.element_size() <= 2 and (t.data_ptr() % 4 or (t.dim() > 1 and t.stride(0) * t.element_size() % 4)):
        return t.clone(memory_format=torch.contiguous_format)
    return t


def _launch_gemv(x2, qweight, scales, zero_points, y, prologue: str = "none", up=None, norm_weight=None,
                 norm_bias=None, eps: float = 0.0, residual=None, glu: bool = False, a8: bool = False) -> None:
    """y = prologue(x2) @ W^T (+ residual; or its rows' GLU pairs) by `_int4_gemv_kernel` (`a8`: x rounded to
    int8 as it is read): x2 [M, K] (and up) rows with unit stride."""
    N, blocks, GH = qweight.shape
    K = blocks * GH * 2
    x16 = x2.element_size() == 2
    x2, qweight = _words(x2), _words(qweight)
    if up is not None:
        up = _words(up)
        if up.stride(0) != x2.stride(0):
            x2, up = x2.contiguous(), up.contiguous()
    if norm_weight is not None:
        norm_weight = _words(norm_weight.contiguous())
        norm_bias = None if norm_bias is None else _words(norm_bias.to(norm_weight.dtype).contiguous())
    grid = lambda meta: (cdiv(N, meta["BN"]), x2.shape[0])  # noqa: E731  (with GLU: N / 2 pairs, BN / 2 a program)
    # K / 8 (words a row) passed on its own: Triton specializes it when a multiple of 16, so the word loads
    # are known aligned and vectorized; unused pointers are x's (never read)
    _int4_gemv_kernel[grid](x2, qweight, scales, zero_points, y, x2 if up is None else up,
                            x2 if norm_weight is None else norm_weight, x2 if norm_bias is None else norm_bias,
                            y if residual is None else residual, N, K, K // 8, zero_points.shape[1], x2.stride(0),
                            0 if residual is None else residual.stride(0), 0x3F800000, eps, GROUP=GH * 2, X16=x16,
                            PROLOGUE=PROLOGUES[prologue],
                            W16=norm_weight is not None and norm_weight.element_size() == 2,
                            RESIDUAL=residual is not None, GLU=glu, A8=a8, DP4A=not INTERPRETER)


def int4_gemv(x, qweight, scales, zero_points, norm: tuple | None = None, up=None, residual=None,
              glu: bool = False, a8: bool = False):
    """A decode step's product with what surrounds it, by the GEMV kernel in one launch:
    (residual +) prologue(x) @ W^T, the prologue an RMSNorm or LayerNorm of x (`norm`: ("rms" | "layer",
    weight, bias or None, eps)), SwiGLU's silu(x) * up (`up`), or none. x, up, residual: [..., K] / [..., N]
    with at most GEMV_MAX_ROWS rows in all (the kernel's range: each row re-reads the weight); computed in
    fp32 from x's values, as `int4_gemv_ref`. `glu`: the weight is a stacked gate/up product (gate rows, then
    up rows) and the result is silu(gate) * up, [..., N / 2] (no residual). `a8`: W4A8, the prologue's output
    rounded to int8 in blocks of A8_BLOCK values (`a8_rounded`) and multiplied in integers (dp4a)."""
    K = qweight.shape[1] * qweight.shape[2] * 2
    assert norm is None or up is None, "one prologue: a norm or the gate"
    assert not glu or (residual is None and qweight.shape[0] % 2 == 0), "GLU pairs of rows, without a residual"
    assert x.shape[-1] == K and (up is None or up.shape == x.shape), f"x has {x.shape[-1]} features, the weight {K}"
    x2, up2, r2 = (None if t is None else _rows(t) for t in (x, up, residual))
    assert x2.shape[0] <= GEMV_MAX_ROWS, f"{x2.shape[0]} rows: the GEMV takes at most {GEMV_MAX_ROWS}"
    y = fresh(torch.empty(x2.shape[0], qweight.shape[0] // (2 if glu else 1), device=x.device, dtype=x.dtype))
    kind, weight, bias, eps = norm if norm is not None else ("none", None, None, 0.0)
    _launch_gemv(x2, qweight.contiguous(), scales.contiguous(), zero_points.contiguous(), y,
                 "gated" if up is not None else kind, up2, weight, bias, eps, r2, glu, a8)
    return y.reshape(*x.shape[:-1], -1)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t [..., C] as 2-D rows whose elements are contiguous."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def int4_gemv_ref(x, qweight, scales, zero_points, norm: tuple | None = None, up=None, residual=None,
                  glu: bool = False, a8: bool = False):
    """What `int4_gemv` computes, in fp32 torch, the result in x's dtype."""
    x32 = x.float()
    if norm is not None:
        kind, weight, bias, eps = norm
        if kind == "rms":
            x32 = rms_norm(x32, weight.float(), eps)
        else:
            x32 = torch.nn.functional.layer_norm(x32, x32.shape[-1:], weight.float(),
                                                 None if bias is None else bias.float(), eps)
    if up is not None:
        x32 = torch.nn.functional.silu(x32) * up.float()
    if a8:
        x32 = a8_rounded(x32)
    y = x32 @ dequantize_int4({"qweight": qweight, "scales": scales, "zero_points": zero_points}).float().T
    if glu:
        gate, up_rows = y.chunk(2, dim=-1)
        return (torch.nn.functional.silu(gate) * up_rows).to(x.dtype)
    return (y if residual is None else y + residual.float()).to(x.dtype)


def a8_codes(x: torch.Tensor, block: int = A8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] rounded to int8 in blocks of `block` values, as the W4A8 GEMV rounds it (absmax / 127 a block,
    half to even: `_int8_code`; a last block of fewer values, as zero-padded): codes [blocks, block] (as
    float) and scales [blocks, 1], the blocks of each row in turn."""
    K = x.shape[-1]
    blocks = F.pad(x.float().reshape(-1, K), (0, -K % block)).reshape(-1, block)
    amax = blocks.abs().amax(-1, keepdim=True)
    to_code = torch.where(amax > 0, 127.0 / amax.clamp_min(1e-30), torch.zeros_like(amax))
    return torch.round(blocks * to_code), amax / 127.0


def a8_rounded(x: torch.Tensor) -> torch.Tensor:
    """x (fp32, [..., K]) as the W4A8 GEMV takes it: `a8_codes` in blocks of A8_BLOCK values, scaled back."""
    K = x.shape[-1]
    codes, scales = a8_codes(x)
    return (codes * scales).reshape(-1, K + -K % A8_BLOCK)[:, :K].reshape(x.shape)


def int4_matmul(x, qweight, scales, zero_points, gemm: str | None = None):
    N, blocks, GH = qweight.shape
    K = blocks * GH * 2
    assert x.shape[-1] == K, f"x has {x.shape[-1]} features, the weight {K}"
    assert kernel_supports(GH * 2), f"the kernels take int4 groups of 32, 64 or 128, not {GH * 2}"
    qweight, scales, zero_points = qweight.contiguous(), scales.contiguous(), zero_points.contiguous()
    M = x.numel() // K
    if M > GEMV_MAX_ROWS and gemm in (None, "dequantize"):  # the default above the GEMV range: the fewest calls
        return F.linear(x, int4_dequantize(qweight, scales, zero_points, x.dtype))
    x2 = _rows(x)
    ZPW = zero_points.shape[1]
    y = fresh(torch.empty(M, N, device=x.device, dtype=x.dtype))
    if M <= GEMV_MAX_ROWS or gemm == "gemv":
        _launch_gemv(x2, qweight, scales, zero_points, y, a8=gemm == "a8")
    elif gemm == "a8":
        int8_a8_gemm(x2, *int4_to_int8(qweight, scales, zero_points), y)
    else:
        grid = lambda meta: (cdiv(M, meta["BM"]), cdiv(N, meta["BN"]))  # noqa: E731
        prec = "ieee" if x.dtype == torch.float32 else "tf32"
        _int4_gemm_kernel[grid](x2, qweight, scales, zero_points, y, M, N, K, ZPW, x2.stride(0),
                                next_power_of_2(M), GROUP=GH * 2, SWAP=gemm == "swapped", PREC=prec)
    return y.reshape(*x.shape[:-1], N)
