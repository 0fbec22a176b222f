"""The decode step of the linear-attention form for a batch of sequences (one token each).

    A += ka^T vh;  zbar = qa (S + eta_i A);  if the token ends its mini-batch: S += eta_b A, A = 0

`decode_step_ref` is the plain-torch reference, `decode_step` the Triton kernel; same signature:
    qa, ka: [B, H, Dk]   vh: [B, H, Dv]   S, A: [B, H, Dk, Dv] (read, and updated in place)
    eta_tok: [b] mask weights; inner: the token's index in its mini-batch (eta_i = eta_tok[inner],
    eta_b = eta_tok[b-1]; the token commits when inner == b-1)
    returns zbar [B, H, Dv] (written into `out` when given)
One program handles one (sequence, head, block of Dv columns): it reads its tiles of S and A once
and writes them once, so the step moves the state's bytes twice and little else.

`decode_step_int8` / `decode_step_int8_ref` do the same with S stored as int8 (see below).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..quant.state_formats import int8_state_codes, int8_state_values
from . import cdiv, fresh, next_power_of_2


def decode_step_ref(qa, ka, vh, S, A, eta_tok, inner: int, out=None):
    A += ka[..., :, None] * vh[..., None, :]
    zbar = (qa[..., None, :] @ (S + eta_tok[inner] * A))[..., 0, :]
    if inner == eta_tok.shape[0] - 1:
        S += eta_tok[-1] * A
        A.zero_()
    if out is not None:
        out.copy_(zbar)
    return zbar


@triton.jit
def _decode_step_kernel(qa_ptr, ka_ptr, vh_ptr, s_ptr, a_ptr, z_ptr, eta_ptr, INNER, LAST, DK, DV,
                        COMMIT: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    bh = tl.program_id(0)  # one (sequence, head)
    eta_i = tl.load(eta_ptr + INNER).to(tl.float32)
    eta_b = tl.load(eta_ptr + LAST).to(tl.float32)
    vb = tl.program_id(1)  # one block of value columns
    k = tl.arange(0, BLOCK_K)
    v = vb * BLOCK_V + tl.arange(0, BLOCK_V)
    k_ok, v_ok = k < DK, v < DV
    qa = tl.load(qa_ptr + bh * DK + k, mask=k_ok, other=0.0).to(tl.float32)  # [BLOCK_K]
    ka = tl.load(ka_ptr + bh * DK + k, mask=k_ok, other=0.0).to(tl.float32)
    vh = tl.load(vh_ptr + bh * DV + v, mask=v_ok, other=0.0).to(tl.float32)  # [BLOCK_V]
    offs = bh * DK * DV + k[:, None] * DV + v[None, :]  # [BLOCK_K, BLOCK_V] into [B*H, Dk, Dv]
    mask = k_ok[:, None] & v_ok[None, :]
    s = tl.load(s_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32) + ka[:, None] * vh[None, :]
    z = tl.sum(qa[:, None] * (s + eta_i * a), axis=0)  # [BLOCK_V]
    tl.store(z_ptr + bh * DV + v, z.to(z_ptr.dtype.element_ty), mask=v_ok)
    if COMMIT:
        tl.store(s_ptr + offs, (s + eta_b * a).to(s_ptr.dtype.element_ty), mask=mask)
        a = a * 0.0
    tl.store(a_ptr + offs, a.to(a_ptr.dtype.element_ty), mask=mask)


def decode_step(qa, ka, vh, S, A, eta_tok, inner: int, out=None):
    B, H, DK = qa.shape
    DV = vh.shape[-1]
    for t in (qa, ka, vh, S, A):
        assert t.is_contiguous(), "decode_step needs contiguous tensors"
    z = fresh(torch.empty(B, H, DV, device=qa.device, dtype=vh.dtype)) if out is None else out
    block_k = next_power_of_2(DK)
    block_v = min(next_power_of_2(DV), max(16, 8192 // block_k))
    grid = (B * H, cdiv(DV, block_v))
    last = eta_tok.shape[0] - 1
    _decode_step_kernel[grid](qa, ka, vh, S, A, z, eta_tok, inner, last, DK, DV,
                              COMMIT=inner == last, BLOCK_K=block_k, BLOCK_V=block_v)
    return z


# ---- int8 state -------------------------------------------------------------------------------
# The state at rest is S = S0 + Sq * scale (Sq int8 [B, H, Dk, Dv], one scale per head and row
# [H, Dk], S0 the model's initial state [H, Dk, Dv], or zeros for a state quantized as itself): the
# formula of `quant/state_formats.py`. A stays float. At a commit S is updated in float and rounded
# back (half to even, like torch.round; the kernel writes the same formula in Triton).

def decode_step_int8_ref(qa, ka, vh, Sq, scale, S0, A, eta_tok, inner: int, out=None):
    S = int8_state_values(Sq, S0, scale)
    A += ka[..., :, None] * vh[..., None, :]
    zbar = (qa[..., None, :].float() @ (S + eta_tok[inner] * A))[..., 0, :]
    if inner == eta_tok.shape[0] - 1:
        S = S + eta_tok[-1] * A
        Sq.copy_(int8_state_codes(S, S0, scale).to(torch.int8))
        A.zero_()
    if out is not None:
        out.copy_(zbar)
    return zbar


@triton.jit
def _round_half_even(x):
    f = tl.floor(x)
    d = x - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
    return tl.where(d > 0.5, f + 1.0, tl.where(d < 0.5, f, tl.where(odd, f + 1.0, f)))


@triton.jit
def _decode_step_int8_kernel(qa_ptr, ka_ptr, vh_ptr, sq_ptr, scale_ptr, s0_ptr, a_ptr, z_ptr, eta_ptr,
                             INNER, LAST, H, DK, DV,
                             COMMIT: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    bh = tl.program_id(0)  # one (sequence, head)
    vb = tl.program_id(1)  # one block of value columns
    h = bh % H
    eta_i = tl.load(eta_ptr + INNER).to(tl.float32)
    eta_b = tl.load(eta_ptr + LAST).to(tl.float32)
    k = tl.arange(0, BLOCK_K)
    v = vb * BLOCK_V + tl.arange(0, BLOCK_V)
    k_ok, v_ok = k < DK, v < DV
    mask = k_ok[:, None] & v_ok[None, :]
    qa = tl.load(qa_ptr + bh * DK + k, mask=k_ok, other=0.0).to(tl.float32)  # [BLOCK_K]
    ka = tl.load(ka_ptr + bh * DK + k, mask=k_ok, other=0.0).to(tl.float32)
    vh = tl.load(vh_ptr + bh * DV + v, mask=v_ok, other=0.0).to(tl.float32)  # [BLOCK_V]
    scale = tl.load(scale_ptr + h * DK + k, mask=k_ok, other=1.0).to(tl.float32)  # [BLOCK_K]
    row = k[:, None] * DV + v[None, :]  # [BLOCK_K, BLOCK_V] into one head's [Dk, Dv]
    s0 = tl.load(s0_ptr + h * DK * DV + row, mask=mask, other=0.0).to(tl.float32)
    sq = tl.load(sq_ptr + bh * DK * DV + row, mask=mask, other=0).to(tl.float32)
    s = s0 + sq * scale[:, None]
    a = tl.load(a_ptr + bh * DK * DV + row, mask=mask, other=0.0).to(tl.float32) + ka[:, None] * vh[None, :]
    z = tl.sum(qa[:, None] * (s + eta_i * a), axis=0)
    tl.store(z_ptr + bh * DV + v, z.to(z_ptr.dtype.element_ty), mask=v_ok)
    if COMMIT:
        q = _round_half_even((s + eta_b * a - s0) / scale[:, None])
        q = tl.minimum(tl.maximum(q, -127.0), 127.0)
        tl.store(sq_ptr + bh * DK * DV + row, q.to(tl.int8), mask=mask)
        a = a * 0.0
    tl.store(a_ptr + bh * DK * DV + row, a.to(a_ptr.dtype.element_ty), mask=mask)


def decode_step_int8(qa, ka, vh, Sq, scale, S0, A, eta_tok, inner: int, out=None):
    B, H, DK = qa.shape
    DV = vh.shape[-1]
    for t in (qa, ka, vh, Sq, scale, S0, A):
        assert t.is_contiguous(), "decode_step_int8 needs contiguous tensors"
    z = fresh(torch.empty(B, H, DV, device=qa.device, dtype=torch.float32)) if out is None else out
    block_k = next_power_of_2(DK)
    block_v = min(next_power_of_2(DV), max(16, 8192 // block_k))
    last = eta_tok.shape[0] - 1
    grid = (B * H, cdiv(DV, block_v))
    _decode_step_int8_kernel[grid](qa, ka, vh, Sq, scale, S0, A, z, eta_tok, inner, last, H, DK, DV,
                                   COMMIT=inner == last, BLOCK_K=block_k, BLOCK_V=block_v)
    return z
