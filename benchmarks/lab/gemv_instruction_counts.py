"""SASS instructions a weight code in the loop of the int4 GEMV and of two sketches of other ways to do it,
compiled offline for Hopper (sm_90a) with the Triton on PYTHONPATH (`kernel_resources.compiled_for_hopper`):
where the GEMV's time goes is its instructions a code (benchmarks/results/compiled_decode_h200.md), so
this compares ways by that count before any is built out. The tensor-core sketch is compiled, never run: it
uses inline PTX (the Triton interpreter cannot run it) and has no test; it computes what its docstring says
only as far as reading the PTX shows.

    PYTHONPATH=/tmp/t36:. python benchmarks/gemv_instruction_counts.py > benchmarks/results/gemv_instruction_counts.txt

- "shipped": `_int4_gemv_kernel` (bf16 x; a shift, a LOP3 and an FFMA a code; a chunk's sums reduced
  across the program's threads at the end).
- "tensor cores": codes made bf16 two at a time (two PRMT and four LOP3 for four code bytes: 128 + c and
  128 + 16 c, exact), centred and scaled in bf16x2 (HADD2, HMUL2: the weight rounded once to bf16, as the
  prefill's dequantize path rounds it), the product y^T = W x^T by tl.dot (wgmma) with x padded to 16
  columns.
- "dp4a (int8 activations)": `bench_gemv.dp4a_kernel` (x rounded to int8 with one scale a group, not part of
  the count: once a row; each word's even and odd codes into bytes by two LOP3 and a shift, four products a
  dp4a; the group's scales and zero point once a chunk).
- "shipped a8": `_int4_gemv_kernel` with A8 (`int4_gemv(..., a8=True)`: the dp4a products with x rounded in the
  kernel, a block of 32 values a thread's chunk: its absmax, one FFMA a value into an integer's byte, three
  PRMT a packed word; counted with the rest of the loop).
"""

import re
import sys
from pathlib import Path

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the package `lab`
from lab import bench_gemv  # noqa: E402
from lab.kernel_resources import NOT_MULTIPLE_OF_16, compiled_for_hopper  # noqa: E402

from edgettt.ops.quantized import int4  # noqa: E402
from edgettt.ops.quantized.int4 import _zero_points  # noqa: E402


@triton.jit
def _nibbles_bf16(byte):
    """Each code byte's nibbles as bf16: 128 + c (low nibble) and 128 + 16 c (high), four bytes a call."""
    return tl.inline_asm_elementwise(
        """{ .reg .b32 t0, t1;
        prmt.b32 t0, $4, 0, 0x4140;
        prmt.b32 t1, $4, 0, 0x4342;
        lop3.b32 $0, t0, 0x000F000F, 0x43004300, 0xEA;
        lop3.b32 $1, t1, 0x000F000F, 0x43004300, 0xEA;
        lop3.b32 $2, t0, 0x00F000F0, 0x43004300, 0xEA;
        lop3.b32 $3, t1, 0x00F000F0, 0x43004300, 0xEA; }""",
        "=r,=r,=r,=r,r", [byte], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)


@triton.jit
def tensor_core_gemv(x_ptr, qw_ptr, sc_ptr, zp_ptr, y_ptr, N, K, ZPW, stride_xm, M, GROUP: tl.constexpr,
                     BN: tl.constexpr, BM: tl.constexpr):
    """y^T = W x^T for M <= BM rows of x: a group a step, the codes' low and high nibbles as two [BN, GROUP / 2]
    bf16 tiles times x's even and odd elements."""
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    n_ok = n < N
    m = tl.arange(0, BM)
    GH: tl.constexpr = GROUP // 2
    j = tl.arange(0, GH)
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    for g in range(0, K // GROUP):
        byte = tl.load(qw_ptr + n[:, None] * (K // 2) + g * GH + j[None, :], mask=n_ok[:, None], other=0)
        zero = _zero_points(zp_ptr, n, g, ZPW, n_ok)
        scale = tl.load(sc_ptr + n * (K // GROUP) + g, mask=n_ok, other=0.0).to(tl.float32)
        lo, hi = _nibbles_bf16(byte)
        lo = (lo - (128.0 + zero).to(tl.bfloat16)[:, None]) * scale.to(tl.bfloat16)[:, None]
        hi = (hi - (128.0 + 16.0 * zero).to(tl.bfloat16)[:, None]) * (scale / 16.0).to(tl.bfloat16)[:, None]
        x_even = tl.load(x_ptr + m[None, :] * stride_xm + g * GROUP + 2 * j[:, None], mask=(m < M)[None, :], other=0.0)
        x_odd = tl.load(x_ptr + m[None, :] * stride_xm + g * GROUP + 2 * j[:, None] + 1, mask=(m < M)[None, :], other=0.0)
        acc = tl.dot(hi, x_odd, tl.dot(lo, x_even, acc))
    tl.store(y_ptr + m[None, :] * N + n[:, None], acc.to(y_ptr.dtype.element_ty), mask=(m < M)[None, :] & n_ok[:, None])


BF16, U8 = "*bf16", "*u8"
GEMV_POINTERS = dict(x_ptr=BF16, qw_ptr=U8, sc_ptr=BF16, zp_ptr=U8, y_ptr=BF16, up_ptr=BF16, nw_ptr=BF16, nb_ptr=BF16,
                     r_ptr=BF16)
# (way, kernel, pointers, integers, constexprs, warps, codes a thread a loop step)
WAYS = [
    *[("shipped", int4._int4_gemv_kernel, GEMV_POINTERS, ["N", "K", "KW", "ZPW", "stride_xm", "stride_rm", "one_bits"],
       dict(GROUP=64, X16=True, PROLOGUE=0, W16=True, RESIDUAL=False, GLU=False, A8=False, DP4A=True, BN=bn, WPT=wpt,
            NQ=32 * w), w,
       bn * wpt * 8) for bn, wpt, w in ((8, 4, 4), (8, 2, 4), (4, 2, 1))],
    *[("tensor cores", tensor_core_gemv, dict(x_ptr=BF16, qw_ptr=U8, sc_ptr=BF16, zp_ptr=U8, y_ptr=BF16),
       ["N", "K", "ZPW", "stride_xm", "M"], dict(GROUP=64, BN=bn, BM=16), w, bn * 64 // (32 * w))
      for bn, w in ((64, 4), (128, 8), (256, 8))],
    *[("dp4a (int8 activations)", bench_gemv.dp4a_kernel, dict(xq_ptr="*i32", xw_ptr="*i32", xs_ptr="*fp32",
                                                                qw_ptr=U8, sc_ptr=BF16, zp_ptr=U8, y_ptr=BF16),
       ["N", "K", "KW", "ZPW"], dict(GROUP=64, DP4A=True, BN=bn, WPT=wpt, NQ=nq), w, bn * wpt * 8 * nq // (32 * w))
      for bn, wpt, nq, w in ((8, 4, 128, 4), (8, 8, 64, 2))],
    *[("shipped a8 (x rounded inside)", int4._int4_gemv_kernel, GEMV_POINTERS,
       ["N", "K", "KW", "ZPW", "stride_xm", "stride_rm", "one_bits"],
       dict(GROUP=64, X16=True, PROLOGUE=0, W16=True, RESIDUAL=False, GLU=False, A8=True, DP4A=True, BN=bn, WPT=4,
            NQ=32 * w), w,
       bn * 4 * 8) for bn, w in ((8, 4), (16, 2), (4, 4))],
]


def main():
    print(f"triton {triton.__version__}, target sm_90a, int4 group 64; SASS instructions in the loop a code a thread")
    for way, kernel, pointers, ints, consts, warps, codes in WAYS:
        out, loop, total, _ = compiled_for_hopper(kernel, pointers, ints, consts, warps, 1, NOT_MULTIPLE_OF_16 | {"M"})
        regs = re.search(r"Used (\d+) registers", out).group(1)
        tile = {k: v for k, v in consts.items() if k in ("BN", "WPT", "NQ", "BM")}
        print(f"{way:24s} {str(tile):40s} warps {warps}: {regs:>3s} registers, loop {loop:4d} instructions for "
              f"{codes:3d} codes a thread: {loop / codes:.2f} a code")


if __name__ == "__main__":
    main()
