"""Benchmark: the int4 GEMV of edgettt/kernels/int4.py alone, then the weight rows of `edgettt bench`
(bf16 cuBLAS, the int4 kernel, bitsandbytes NF4), on CUDA.

    python benchmarks/bench_gemv.py --json benchmarks/results/gemv_h200.json

bf16 activations, M = 1, int4 group 64; weight copies rotate past L2 in a CUDA graph.
Variants timed in the same run: "zero per group" (the kernel in edgettt: code * x * scale summed
into a tile, the zero points applied once a group through the group sums of x) and "zero per code"
(the previous kernel, kept here: (code - zero) * scale * x for every code) and "split-K" (zero per group
with K cut into slices, one program each, added atomically: more loads in flight). An earlier run (commit
d220746) measured a "group-sum" kernel (each group summed across lanes every step) slower than
zero per code on both shapes.
"""

import argparse
import json

import torch
import triton
import triton.language as tl

from edgettt.bench import copies_for, copy_bandwidth, time_rotating_ms, weight_rows, weight_variants
from edgettt.kernels import autotune_configs, int4

SHAPES = ((4096, 4096), (11008, 4096))


@triton.autotune(configs=autotune_configs(int4.GEMV_CONFIGS, [triton.Config({"BN": 16, "BKB": 64}, num_warps=4)]),
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
    j = tl.arange(0, BKB)
    KB = K // 2
    blocks = K // GROUP
    acc = tl.zeros([BN, BKB], dtype=tl.float32)
    x_row = x_ptr + m * stride_xm
    for j0 in range(0, KB, BKB):
        j_ok = j0 + j < KB
        byte = tl.load(qw_ptr + n[:, None] * KB + j0 + j[None, :], mask=n_ok[:, None] & j_ok[None, :], other=0)
        lo, hi = int4._nibbles(byte.to(tl.int32))  # [BN, BKB]
        xe = tl.load(x_row + 2 * (j0 + j), mask=j_ok, other=0.0).to(tl.float32)  # [BKB]
        xo = tl.load(x_row + 2 * (j0 + j) + 1, mask=j_ok, other=0.0).to(tl.float32)
        gi = j0 // GH + tl.arange(0, NGS)
        mask2 = n_ok[:, None] & (gi < blocks)[None, :]
        scale = tl.load(sc_ptr + n[:, None] * blocks + gi[None, :], mask=mask2, other=0.0).to(tl.float32)
        zero = int4._zero_points(zp_ptr, n, gi, ZPW, mask2)
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


SPLIT_CONFIGS = [triton.Config({"BN": bn, "BKB": bkb, "SPLIT": sp}, num_warps=w, num_stages=st)
                 for bn, bkb, sp, w, st in [(8, 256, 2, 4, 3), (8, 256, 4, 4, 3), (16, 256, 4, 8, 3), (4, 512, 2, 4, 2),
                                            (8, 128, 4, 4, 3), (16, 128, 8, 4, 3), (32, 128, 4, 8, 3), (4, 256, 8, 2, 3),
                                            (16, 256, 2, 8, 3), (8, 512, 4, 8, 2), (32, 256, 2, 8, 2), (64, 128, 2, 8, 3)]]


@triton.autotune(configs=autotune_configs(SPLIT_CONFIGS, [triton.Config({"BN": 16, "BKB": 64, "SPLIT": 3}, num_warps=4)]),
                 key=["N", "K", "GROUP"], reset_to_zero=["y_ptr"])
@triton.jit
def split_k_kernel(x_ptr, qw_ptr, sc_ptr, zp_ptr, y_ptr, N, K, ZPW,
                   GROUP: tl.constexpr, BN: tl.constexpr, BKB: tl.constexpr, SPLIT: tl.constexpr):
    """edgettt's kernel (zero points once a group) with K cut into SPLIT slices, one program each: SPLIT
    times the programs, each with fewer bytes, so that more loads are in flight at once (a [4096, 4096]
    int4 weight is 8 MB: at the copy bandwidth 2 us, about 4 MB of it must be on its way at any time);
    the slices' partial sums are added atomically into a float32 y (zeroed before)."""
    pid_n, s = tl.program_id(0), tl.program_id(1)
    GH: tl.constexpr = GROUP // 2
    NGS: tl.constexpr = BKB // GH
    n = pid_n * BN + tl.arange(0, BN)
    n_ok = n < N
    KB = K // 2
    per_slice = tl.cdiv(tl.cdiv(KB, SPLIT), BKB) * BKB  # bytes a slice: whole tiles (whole groups)
    acc = tl.zeros([BN, BKB], dtype=tl.float32)
    zacc = tl.zeros([BN, NGS], dtype=tl.float32)
    for j0 in range(s * per_slice, tl.minimum((s + 1) * per_slice, KB), BKB):
        tile, zeros = int4.gemv_tile(x_ptr, qw_ptr, sc_ptr, zp_ptr, n, n_ok, j0, K, ZPW, GH, NGS, BN, BKB)
        acc += tile
        zacc += zeros
    tl.atomic_add(y_ptr + n, tl.sum(acc, axis=1) - tl.sum(zacc, axis=1), mask=n_ok)


def split_k(x, qweight, scales, zero_points):
    """One row x [1, K]: the split-K kernel into a zeroed float32 y, then x's dtype (2 small kernels more)."""
    N, blocks, GH = qweight.shape
    K = blocks * GH * 2
    y = torch.zeros(N, device=x.device, dtype=torch.float32)
    grid = lambda meta: (triton.cdiv(N, meta["BN"]), meta["SPLIT"])  # noqa: E731
    split_k_kernel[grid](x, qweight, scales, zero_points, y, N, K, zero_points.shape[1], GROUP=GH * 2)
    return y.to(x.dtype)[None]


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
        zero = int4._zero_points(zp_ptr, n, g, ZPW, mask)
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


VARIANTS = {"zero per group": int4.int4_matmul, "zero per code": zero_per_code, "split-K": split_k,
            "words": words, "words split-K": lambda *a: words(*a, split=True)}


def variant_rows(ceiling):
    rows = []
    for N, K in SHAPES:
        variants = weight_variants(N, K, torch.bfloat16)
        copy, _, nbytes, _ = variants["int4 g64 (edgettt kernel)"]
        copies = [copy() for _ in range(copies_for(nbytes))]
        x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        for name, check in VARIANTS.items():
            assert torch.allclose(check(x, *copies[0]), int4.int4_matmul(x, *copies[0]), rtol=2e-2, atol=1e-1)
        for name, fn in VARIANTS.items():
            ms, _ = time_rotating_ms([lambda c=c, fn=fn: fn(x, *c) for c in copies])
            rows.append({"variant": name, "N": N, "K": K, "us": ms * 1e3, "fraction_of_copy": nbytes / (ms * 1e-3) / ceiling})
            print(json.dumps(rows[-1]))
        del copies
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ceiling = copy_bandwidth()
    variants = variant_rows(ceiling)
    rows = [r for N, K in SHAPES for r in weight_rows(N, K, 1, torch.bfloat16, ceiling)]
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
