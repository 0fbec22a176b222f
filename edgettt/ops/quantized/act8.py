"""int8 activations for the integer GEMMs (the W8A8 and W4A8 ways of `int8_matmul` / `int4_matmul`).

    codes, scales = quantize_activations(x, block)
    x: [M, K] fp16/bf16/fp32;  codes: int8 [M, K];  scales: float32 [M, ceil(K / block)]
    x[m, k] ~= codes[m, k] * scales[m, k // block]

Symmetric, absmax / 127 a block of `block` columns of a row, rounded half up (floor(v + 0.5): the
same in the kernel and the reference). `block = K` is one scale a row (int8 weights: the scale then
factors out of the integer sum); the int4 GEMM takes blocks of its weight groups (one float scale a
group step, as ONNX Runtime's MatMulNBits does with int8 activations). An all-zero block has scale 0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgettt.ops.common import cdiv, fresh, next_power_of_2


def quantize_activations_ref(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    M, K = x.shape
    blocks = cdiv(K, block)
    xf = torch.nn.functional.pad(x.float(), (0, blocks * block - K)).reshape(M, blocks, block)
    amax = xf.abs().amax(-1)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    codes = torch.floor(xf * inv[..., None] + 0.5).clamp(-127, 127).to(torch.int8)
    return codes.reshape(M, -1)[:, :K].contiguous(), amax / 127.0


@triton.jit
def _quantize_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, BLOCKS, BLOCK: tl.constexpr, WIDTH: tl.constexpr,
                     NB: tl.constexpr):
    """Row m, blocks c * NB .. c * NB + NB - 1 (each BLOCK columns, WIDTH its power-of-two tile)."""
    m, c = tl.program_id(0), tl.program_id(1)
    blk = c * NB + tl.arange(0, NB)
    j = tl.arange(0, WIDTH)
    col = blk[:, None] * BLOCK + j[None, :]
    ok = (j[None, :] < BLOCK) & (col < K) & (blk[:, None] < BLOCKS)
    x = tl.load(x_ptr + m * stride_xm + col, mask=ok, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)  # [NB]
    inv = tl.where(amax > 0, 127.0 / amax, 0.0)
    codes = tl.minimum(tl.maximum(tl.floor(x * inv[:, None] + 0.5), -127.0), 127.0)
    tl.store(q_ptr + m * K + col, codes.to(tl.int8), mask=ok)
    tl.store(s_ptr + m * BLOCKS + blk, amax / 127.0, mask=blk < BLOCKS)


def quantize_activations(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    M, K = x.shape
    blocks = cdiv(K, block)
    width = next_power_of_2(block)
    nb = max(1, min(next_power_of_2(blocks), 2048 // width))  # about 2048 values a program
    codes = torch.empty(M, K, device=x.device, dtype=torch.int8)  # every code written (NaN poison is float-only)
    scales = fresh(torch.empty(M, blocks, device=x.device, dtype=torch.float32))
    _quantize_kernel[(M, cdiv(blocks, nb))](x, codes, scales, K, x.stride(0), blocks, BLOCK=block, WIDTH=width,
                                             NB=nb, num_warps=8 if width * nb >= 4096 else 4)
    return codes, scales
