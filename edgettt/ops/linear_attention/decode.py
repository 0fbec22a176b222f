"""The decode step of the linear-attention form for a batch of sequences (one token each).

    A += ka^T vh;  zbar = qa (S + eta_i A);  if the token ends its mini-batch: S += eta_b A, A = 0

`decode_step_ref` is the plain-torch reference, `decode_step` the Triton kernel; same signature:
    qa, ka: [B, H, Dk]   vh: [B, H, Dv]   S, A: [B, H, Dk, Dv] (read, and updated in place)
    eta_tok: [b] mask weights; inner: the token's index in its mini-batch (eta_i = eta_tok[inner],
    eta_b = eta_tok[b-1]; the token commits when inner == b-1)
    returns zbar [B, H, Dv] (written into `out` when given)
    decay: a decayed form's (gamma [H], S0 [H, Dk, Dv]) (`linear_attention.Decay`): the commit is then
    S <- S0 + gamma (S - S0) + eta_b A (only `decode_step`; the int8 steps know no decay)
One program handles one (sequence, head, block of Dv columns): it reads its tiles of S and A once
and writes them once, so the step moves the state's bytes twice and little else.

`decode_step_int8` / `decode_step_int8_ref` do the same with S stored as int8 at calibrated scales
(the int8 format), and `decode_step_int12` / `decode_step_int12_ref` with the int12
format's two-level codes and the open mini-batch's keys and values in place of A (see below; the
speed of each in `edgettt bench`'s decode state rows, benchmarks/results/state_step_h200.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgettt.formats.state_formats import (int8_state_codes, int8_state_values, pack_fine, two_level_codes, two_level_values,
                                     unpack_fine)
from edgettt.ops.common import cdiv, fresh, next_power_of_2


def decode_step_ref(qa, ka, vh, S, A, eta_tok, inner: int, out=None, decay=None):
    A += ka[..., :, None] * vh[..., None, :]
    zbar = (qa[..., None, :] @ (S + eta_tok[inner] * A))[..., 0, :]
    if inner == eta_tok.shape[0] - 1:
        if decay is not None:
            gamma, S0 = decay
            S.copy_(S0 + gamma[:, None, None] * (S - S0))
        S += eta_tok[-1] * A
        A.zero_()
    if out is not None:
        out.copy_(zbar)
    return zbar


@triton.jit
def _decode_step_kernel(qa_ptr, ka_ptr, vh_ptr, s_ptr, a_ptr, z_ptr, eta_ptr, decay_ptr, s0_ptr, INNER, LAST, H, DK, DV,
                        COMMIT: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, DECAY: tl.constexpr):
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
        if DECAY:  # S0 + gamma (S - S0): what the state learned fades by gamma a mini-batch
            h = bh % H
            s0 = tl.load(s0_ptr + h * DK * DV + k[:, None] * DV + v[None, :], mask=mask, other=0.0).to(tl.float32)
            s = s0 + tl.load(decay_ptr + h).to(tl.float32) * (s - s0)
        tl.store(s_ptr + offs, (s + eta_b * a).to(s_ptr.dtype.element_ty), mask=mask)
        a = a * 0.0
    tl.store(a_ptr + offs, a.to(a_ptr.dtype.element_ty), mask=mask)


def decode_step(qa, ka, vh, S, A, eta_tok, inner: int, out=None, decay=None):
    B, H, DK = qa.shape
    DV = vh.shape[-1]
    for t in (qa, ka, vh, S, A):
        assert t.is_contiguous(), "decode_step needs contiguous tensors"
    z = fresh(torch.empty(B, H, DV, device=qa.device, dtype=vh.dtype)) if out is None else out
    block_k = next_power_of_2(DK)
    block_v = min(next_power_of_2(DV), max(16, 8192 // block_k))
    grid = (B * H, cdiv(DV, block_v))
    last = eta_tok.shape[0] - 1
    gamma, S0 = (eta_tok, eta_tok) if decay is None else (decay[0].float().contiguous(), decay[1].contiguous())
    _decode_step_kernel[grid](qa, ka, vh, S, A, z, eta_tok, gamma, S0, inner, last, H, DK, DV,
                              COMMIT=inner == last, BLOCK_K=block_k, BLOCK_V=block_v, DECAY=decay is not None)
    return z


# ---- int8 state -------------------------------------------------------------------------------
# The state at rest is S = S0 + Sq * scale (Sq int8 [B, H, Dk, Dv], one scale per head and row
# [H, Dk], S0 the model's initial state [H, Dk, Dv], or zeros for a state quantized as itself): the
# formula of `formats/state_formats.py`. A stays float. At a commit S is updated in float and rounded
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


# ---- int12 state, two-level, with the open mini-batch's keys and values --------------------------------
# The `int12` state format (formats/state_formats.py): S = S0 + (c8 + c4 / 15) step, c8 int8 [B, H, Dk, Dv],
# c4 in [-7, 7] packed two a byte (`pack_fine`: columns j and j + Dv/2) [B, H, Dk, Dv/2], step float32
# [B, H, Dk] (one a sequence, head and row, recomputed at every commit). A is not kept: the buffers
# K [B, H, b, Dk] and V [B, H, b, Dv] (float16) hold the open mini-batch's ka and vh, slot i = its
# i-th token, so that
#     zbar = qa S + eta_i sum_{j <= i} (qa . K_j) V_j,   commit: S <- round(S + eta_b K^T V)
# A token reads S once at 1.5 bytes a value and the slots before it, and writes one slot.

def decode_step_int12_ref(qa, ka, vh, C8, C4, step, S0, K, V, eta_tok, inner: int, out=None):
    K[:, :, inner], V[:, :, inner] = ka.to(K.dtype), vh.to(V.dtype)
    S = two_level_values(C8.float(), unpack_fine(C4), step[..., None], S0)
    A = K[:, :, :inner + 1].float().transpose(-1, -2) @ V[:, :, :inner + 1].float()
    zbar = (qa.float()[..., None, :] @ (S + eta_tok[inner] * A))[..., 0, :]
    if inner == eta_tok.shape[0] - 1:
        coarse, fine, new_step = two_level_codes(S + eta_tok[-1] * A, S0)
        C8.copy_(coarse.to(torch.int8))
        C4.copy_(pack_fine(fine))
        step.copy_(new_step[..., 0])
    if out is not None:
        out.copy_(zbar)
    return zbar


@triton.jit
def _two_level_load(c8_ptr, c4_ptr, s0_ptr, r, c, st, DV, mask):
    """Rows r, columns c and c + Dv/2 of S0 + (c8 + c4 / 15) step, and of S0: four [R, HALF] tiles."""
    DH = DV // 2
    fine = tl.load(c4_ptr + r[:, None] * DH + c[None, :], mask=mask, other=0x88).to(tl.int32)
    at = r[:, None] * DV + c[None, :]
    s0_lo = tl.load(s0_ptr + at, mask=mask, other=0.0).to(tl.float32)
    s0_hi = tl.load(s0_ptr + at + DH, mask=mask, other=0.0).to(tl.float32)
    c8_lo = tl.load(c8_ptr + at, mask=mask, other=0).to(tl.float32)
    c8_hi = tl.load(c8_ptr + at + DH, mask=mask, other=0).to(tl.float32)
    s_lo = s0_lo + (c8_lo + ((fine & 0xF) - 8).to(tl.float32) / 15.0) * st[:, None]
    s_hi = s0_hi + (c8_hi + ((fine >> 4) - 8).to(tl.float32) / 15.0) * st[:, None]
    return s_lo, s_hi, s0_lo, s0_hi


@triton.jit
def _two_level_code(d, st):
    """(coarse, fine) codes of a [R, HALF] tile of d = S - S0 on its rows' steps st [R], as float values
    (`state_formats.two_level_codes`)."""
    coarse = _round_half_even(d / st[:, None])
    fine = tl.minimum(tl.maximum(_round_half_even((d - coarse * st[:, None]) * (15.0 / st[:, None])), -7.0), 7.0)
    return coarse, fine


@triton.jit
def _two_level_store(c8_ptr, c4_ptr, step_ptr, r, c, d_lo, d_hi, DV, mask, r_ok):
    """Round d = S - S0 (two [R, HALF] tiles: the row's halves) to the int12 format and store it."""
    DH = DV // 2
    amax = tl.maximum(tl.max(tl.abs(d_lo), axis=1), tl.max(tl.abs(d_hi), axis=1))
    st = tl.maximum(amax / 127.0, 1e-30)
    coarse_lo, fine_lo = _two_level_code(d_lo, st)
    coarse_hi, fine_hi = _two_level_code(d_hi, st)
    at = r[:, None] * DV + c[None, :]
    tl.store(c8_ptr + at, coarse_lo.to(tl.int8), mask=mask)
    tl.store(c8_ptr + at + DH, coarse_hi.to(tl.int8), mask=mask)
    packed = (fine_lo + 8.0).to(tl.int32) | ((fine_hi + 8.0).to(tl.int32) << 4)
    tl.store(c4_ptr + r[:, None] * DH + c[None, :], packed.to(tl.uint8), mask=mask)
    tl.store(step_ptr + r, st, mask=r_ok)


@triton.jit
def _decode_step_int12_kernel(qa_ptr, ka_ptr, vh_ptr, c8_ptr, c4_ptr, step_ptr, s0_ptr, k_ptr, v_ptr, z_ptr,
                               eta_ptr, INNER, LAST, H, DK, DV, SLOTS,
                               COMMIT: tl.constexpr, MINI: tl.constexpr, BLOCK_K: tl.constexpr,
                               HALF: tl.constexpr, ROWS: tl.constexpr, ROW_END: tl.constexpr):
    bh = tl.program_id(0)  # one (sequence, head): the whole [Dk, Dv] state, ROWS rows at a time
    h = bh % H
    DH = DV // 2
    eta_i = tl.load(eta_ptr + INNER).to(tl.float32)
    k, c, j = tl.arange(0, BLOCK_K), tl.arange(0, HALF), tl.arange(0, MINI)
    k_ok, c_ok = k < DK, c < DH
    qa = tl.load(qa_ptr + bh * DK + k, mask=k_ok, other=0.0).to(tl.float32)
    # this token, rounded as its slot keeps it, into its slot
    ka = tl.load(ka_ptr + bh * DK + k, mask=k_ok, other=0.0).to(k_ptr.dtype.element_ty)
    v_lo = tl.load(vh_ptr + bh * DV + c, mask=c_ok, other=0.0).to(v_ptr.dtype.element_ty)
    v_hi = tl.load(vh_ptr + bh * DV + DH + c, mask=c_ok, other=0.0).to(v_ptr.dtype.element_ty)
    k_slots, v_slots = k_ptr + bh * SLOTS * DK, v_ptr + bh * SLOTS * DV
    tl.store(k_slots + INNER * DK + k, ka, mask=k_ok)
    tl.store(v_slots + INNER * DV + c, v_lo, mask=c_ok)
    tl.store(v_slots + INNER * DV + DH + c, v_hi, mask=c_ok)
    v_lo, v_hi = v_lo.to(tl.float32), v_hi.to(tl.float32)
    # the open slots before it: qa A = sum_j (qa . K_j) V_j
    j_ok = j < INNER
    keys = tl.load(k_slots + j[:, None] * DK + k[None, :], mask=j_ok[:, None] & k_ok[None, :], other=0.0)
    qk = tl.sum(keys.to(tl.float32) * qa[None, :], axis=1)  # [MINI]
    qk_now = tl.sum(ka.to(tl.float32) * qa, axis=0)
    vmask = j_ok[:, None] & c_ok[None, :]
    vals_lo = tl.load(v_slots + j[:, None] * DV + c[None, :], mask=vmask, other=0.0).to(tl.float32)
    vals_hi = tl.load(v_slots + j[:, None] * DV + DH + c[None, :], mask=vmask, other=0.0).to(tl.float32)
    z_lo = eta_i * (tl.sum(qk[:, None] * vals_lo, axis=0) + qk_now * v_lo)
    z_hi = eta_i * (tl.sum(qk[:, None] * vals_hi, axis=0) + qk_now * v_hi)
    # qa S, ROWS rows at a time; at a commit those rows are updated and rounded
    c8_base, c4_base, step_base = c8_ptr + bh * DK * DV, c4_ptr + bh * DK * DH, step_ptr + bh * DK
    s0_base = s0_ptr + h * DK * DV
    for r0 in tl.static_range(0, ROW_END, ROWS):  # unrolled: the loads of every block can be in flight at once
        r = r0 + tl.arange(0, ROWS)
        r_ok = r < DK
        mask = r_ok[:, None] & c_ok[None, :]
        st = tl.load(step_base + r, mask=r_ok, other=0.0)
        s_lo, s_hi, s0_lo, s0_hi = _two_level_load(c8_base, c4_base, s0_base, r, c, st, DV, mask)
        q_r = tl.load(qa_ptr + bh * DK + r, mask=r_ok, other=0.0).to(tl.float32)
        z_lo += tl.sum(q_r[:, None] * s_lo, axis=0)
        z_hi += tl.sum(q_r[:, None] * s_hi, axis=0)
        if COMMIT:  # A's rows r = K[:, r]^T V over the slots before this token, plus this token's
            k_r = tl.load(ka_ptr + bh * DK + r, mask=r_ok, other=0.0).to(k_ptr.dtype.element_ty).to(tl.float32)
            keys_r = tl.load(k_slots + j[:, None] * DK + r[None, :], mask=j_ok[:, None] & r_ok[None, :],
                             other=0.0).to(tl.float32)  # [MINI, ROWS]
            a_lo = tl.sum(keys_r[:, :, None] * vals_lo[:, None, :], axis=0) + k_r[:, None] * v_lo[None, :]
            a_hi = tl.sum(keys_r[:, :, None] * vals_hi[:, None, :], axis=0) + k_r[:, None] * v_hi[None, :]
            eta_b = tl.load(eta_ptr + LAST).to(tl.float32)
            d_lo = tl.where(mask, s_lo + eta_b * a_lo - s0_lo, 0.0)
            d_hi = tl.where(mask, s_hi + eta_b * a_hi - s0_hi, 0.0)
            _two_level_store(c8_base, c4_base, step_base, r, c, d_lo, d_hi, DV, mask, r_ok)
    tl.store(z_ptr + bh * DV + c, z_lo.to(z_ptr.dtype.element_ty), mask=c_ok)
    tl.store(z_ptr + bh * DV + DH + c, z_hi.to(z_ptr.dtype.element_ty), mask=c_ok)


def decode_step_int12(qa, ka, vh, C8, C4, step, S0, K, V, eta_tok, inner: int, out=None, rows: int = 4,
                       warps: int = 1):
    B, H, DK = qa.shape
    DV = vh.shape[-1]
    SLOTS = K.shape[2]
    assert DV % 2 == 0, "the int12 state packs columns j and j + Dv/2: Dv must be even"
    for t in (qa, ka, vh, C8, C4, step, S0, K, V):
        assert t.is_contiguous(), "decode_step_int12 needs contiguous tensors"
    z = fresh(torch.empty(B, H, DV, device=qa.device, dtype=torch.float32)) if out is None else out
    last = eta_tok.shape[0] - 1
    _decode_step_int12_kernel[(B * H,)](qa, ka, vh, C8, C4, step, S0, K, V, z, eta_tok, inner, last, H, DK, DV, SLOTS,
                                         COMMIT=inner == last, MINI=next_power_of_2(SLOTS),
                                         BLOCK_K=next_power_of_2(DK), HALF=next_power_of_2(DV // 2), ROWS=rows,
                                         ROW_END=cdiv(DK, rows) * rows,
                                         num_warps=warps)
    return z
