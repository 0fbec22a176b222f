"""A converted TTT-Linear layer's whole decode token in one kernel, between its projections and its
post-norm (float state; the int12 format's below): rotary, the value map, the state step and the output norm.

    q, k <- rotary(q, k) at the token's place in its mini-batch;  qa, ka = [q, 1], [k, 1]
    vh = -lr * d/dz 0.5 |LN(ka W) - (v - k)|^2             (`linear_attention.linear_values`; W = S0 in the
                                                             parallel form, the boundary state S in the exact)
    A += ka^T vh;  zbar = qa (S + eta_i A);  at the mini-batch's last token: S += eta_b A, A = 0
    out = q + LN(zbar)                                      (gamma, beta: the layer's value norm)

`decode_token_ref` is the plain-torch reference (the layer's own functions), `decode_token` the Triton
kernel, one program a (sequence, head) holding its [d+1, d] matrices S0, S and A (as a [d, d] tile and the
bias row apart); same signature:
    q, k, v [B, H, d] (not rotated)   lr [B, H]   S0 [H, d+1, d]   gamma, beta [H, d]
    S, A [B, H, d+1, d] (read, and updated in place)   eta_tok [b]   inner: the place in the mini-batch
    theta: the rotary base;  at_state: the values at S (the exact form) instead of S0;  returns out [B, H, d]
    decay: gamma [H] of a decayed parallel form (the commit is S <- S0 + gamma (S - S0) + eta_b A), or None
A compiled decode step runs it as one operation (`edgettt::decode_token`, on CUDA the kernel, elsewhere the
reference), in place of the ~8 kernels inductor makes of these operations (`edgettt.prepare` turns it on: `fast_paths.layers`).

`decode_token_int12` (`decode_token_int12_ref`, `edgettt::decode_token_int12`) is the same token with the int12 state
format: A's place taken by the open mini-batch's keys and values in float16 slots K [B, H, b, d+1], V [B, H, b, d],
and S rounded to the format's grid at the commit (`formats.state_formats.two_level_round`). Given `rotation` [d, d]
(the int12-kv8 format's Hadamard matrix) it puts the token's key and value on that format's int8 grids first.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl

from edgettt.formats.state_formats import FINE_STEPS, STATE_CLIP, int8_rotated_keys, int8_slots, two_level_round
from edgettt.ops import LN_EPS, layer_norm, rotary
from edgettt.ops.common import fresh, next_power_of_2
from edgettt.ops.linear_attention.decode import _round_half_even, decode_step_ref
from edgettt.ops.linear_attention.reference import augment, linear_values


def token_values_ref(q, k, v, lr, W, gamma, beta, inner: int, theta: float):
    """q and k rotated at `inner`, augmented (qa, ka), and the value vh at W (S0, or S): the references'
    shared start (`_token_values` in the kernels)."""
    position = torch.tensor([inner], device=q.device)
    q, k = (rotary(x[:, :, None], position, theta)[:, :, 0] for x in (q, k))
    ka = augment(k)
    vh = linear_values(ka[:, :, None], k[:, :, None], v[:, :, None], lr[:, :, None], W, gamma[:, None],
                       beta[:, None])[:, :, 0]
    return q, augment(q), ka, vh


def decode_token_ref(q, k, v, lr, S0, gamma, beta, S, A, eta_tok, inner: int, theta: float, at_state: bool = False,
                     decay=None):
    q, qa, ka, vh = token_values_ref(q, k, v, lr, S if at_state else S0, gamma, beta, inner, theta)
    decay = None if decay is None else (decay.to(S.dtype), S0.to(S.dtype))
    zbar = decode_step_ref(qa, ka, vh.to(S.dtype), S, A, eta_tok, inner, decay=decay)
    return q + layer_norm(zbar.to(q.dtype), gamma, beta)


@triton.jit
def _rotated(ptr, idx, D, POS, LOG2_THETA):
    """x[idx] rotated as `ops.rotary` does (interleaved pairs (2p, 2p+1) by POS * theta^(-2p/D)); 0 past D."""
    x = tl.load(ptr + idx, mask=idx < D, other=0.0).to(tl.float32)
    partner = idx ^ 1
    xp = tl.load(ptr + partner, mask=partner < D, other=0.0).to(tl.float32)
    angle = POS * tl.exp2(-((idx // 2) * 2).to(tl.float32) / D * LOG2_THETA)
    c, s = tl.cos(angle), tl.sin(angle)
    return tl.where(idx % 2 == 0, x * c - xp * s, x * c + xp * s)


@triton.jit
def _normed(x, ok, D, EPS):
    """(x - mean) / std over the first D entries (biased variance, as LayerNorm), 0 past D; and 1 / std."""
    mu = tl.sum(tl.where(ok, x, 0.0), axis=0) / D
    xc = tl.where(ok, x - mu, 0.0)
    inv = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / D + EPS)
    return xc * inv, inv


@triton.jit
def _token_values(q_ptr, k_ptr, v_ptr, lr_ptr, g_ptr, b_ptr, bh, h, i, ok, w, w_bias, pos, D, LOG2_THETA, EPS):
    """One (sequence, head)'s q and k rotated at `pos` and its value vh: the LN-L2 gradient of z = ka W
    towards v - k, times -lr (W: the [d, d] tile `w` and bias row `w_bias` of S0 or S); and the value norm's
    gamma, beta. Each [BLOCK_D], 0 past d."""
    q = _rotated(q_ptr + bh * D, i, D, pos, LOG2_THETA)
    k = _rotated(k_ptr + bh * D, i, D, pos, LOG2_THETA)
    target = tl.load(v_ptr + bh * D + i, mask=ok, other=0.0).to(tl.float32) - k
    gamma = tl.load(g_ptr + h * D + i, mask=ok, other=0.0).to(tl.float32)
    beta = tl.load(b_ptr + h * D + i, mask=ok, other=0.0).to(tl.float32)
    lr = tl.load(lr_ptr + bh).to(tl.float32)
    z = tl.sum(k[:, None] * w.to(tl.float32), axis=0) + w_bias.to(tl.float32)
    xh, inv = _normed(z, ok, D, EPS)
    e = tl.where(ok, (gamma * xh + beta - target) * gamma, 0.0)
    grad = (e - tl.sum(e, axis=0) / D - xh * (tl.sum(e * xh, axis=0) / D)) * inv
    return q, k, tl.where(ok, -lr * grad, 0.0), gamma, beta


@triton.jit
def _decode_token_kernel(q_ptr, k_ptr, v_ptr, lr_ptr, s0_ptr, g_ptr, b_ptr, s_ptr, a_ptr, o_ptr, eta_ptr, decay_ptr,
                         INNER, LAST, H, D, LOG2_THETA, EPS,
                         COMMIT: tl.constexpr, AT_STATE: tl.constexpr, BLOCK_D: tl.constexpr, DECAY: tl.constexpr):
    # one (sequence, head); the [d+1, d] matrices as a [d, d] tile of the feature rows and the bias row
    # (index d) apart, so that a tile of d = 64 is not padded to 128 rows. Every load of the state is issued
    # first: the program's time is its chain of dependent steps, not its bytes.
    bh = tl.program_id(0)
    h = bh % H
    i = tl.arange(0, BLOCK_D)  # rows and columns
    ok = i < D
    mask = ok[:, None] & ok[None, :]
    tile = i[:, None] * D + i[None, :]
    state = bh * (D + 1) * D
    s, s_bias = tl.load(s_ptr + state + tile, mask=mask, other=0.0), tl.load(s_ptr + state + D * D + i, mask=ok, other=0.0)
    a, a_bias = tl.load(a_ptr + state + tile, mask=mask, other=0.0), tl.load(a_ptr + state + D * D + i, mask=ok, other=0.0)
    if AT_STATE:
        w, w_bias = s, s_bias
    else:
        w = tl.load(s0_ptr + h * (D + 1) * D + tile, mask=mask, other=0.0)
        w_bias = tl.load(s0_ptr + h * (D + 1) * D + D * D + i, mask=ok, other=0.0)
    q, k, vh, gamma, beta = _token_values(q_ptr, k_ptr, v_ptr, lr_ptr, g_ptr, b_ptr, bh, h, i, ok, w, w_bias,
                                          INNER + 0.0, D, LOG2_THETA, EPS)  # (INNER of 1 arrives as a constant)
    eta_i = tl.load(eta_ptr + INNER).to(tl.float32)
    eta_b = tl.load(eta_ptr + LAST).to(tl.float32)
    # the state step (`decode.decode_step`): A += ka^T vh, zbar = qa (S + eta_i A)
    a = a.to(tl.float32) + k[:, None] * vh[None, :]
    a_bias = a_bias.to(tl.float32) + vh
    s, s_bias = s.to(tl.float32), s_bias.to(tl.float32)
    zbar = tl.sum(q[:, None] * (s + eta_i * a), axis=0) + s_bias + eta_i * a_bias
    if COMMIT:
        if DECAY:  # (a decayed form is a parallel one: w is S0) S0 + gamma (S - S0)
            fade = tl.load(decay_ptr + h).to(tl.float32)
            s = w.to(tl.float32) + fade * (s - w.to(tl.float32))
            s_bias = w_bias.to(tl.float32) + fade * (s_bias - w_bias.to(tl.float32))
        tl.store(s_ptr + state + tile, (s + eta_b * a).to(s_ptr.dtype.element_ty), mask=mask)
        tl.store(s_ptr + state + D * D + i, (s_bias + eta_b * a_bias).to(s_ptr.dtype.element_ty), mask=ok)
        a, a_bias = a * 0.0, a_bias * 0.0
    tl.store(a_ptr + state + tile, a.to(a_ptr.dtype.element_ty), mask=mask)
    tl.store(a_ptr + state + D * D + i, a_bias.to(a_ptr.dtype.element_ty), mask=ok)
    zn, _ = _normed(zbar, ok, D, EPS)
    tl.store(o_ptr + bh * D + i, (q + zn * gamma + beta).to(o_ptr.dtype.element_ty), mask=ok)


# Warps a token kernel's program runs with, by measurement at batch 1 (benchmarks/token_warps.py, 24 layers' calls
# in a CUDA graph; compiled_decode_h200.md, where the choice also wins at batch 16, 125m): at the 125m heads (d = 64) 2 (float
# state 3.55 us against 4.27 with 8; int12 state 3.45 against 4.97), at the 760m heads (d = 96, tiles of 128) the
# float state's 8 (7.56 against 8.50 with 4; 2 spill: 47) and the int12 state's 4 (5.85 against 10.64 with 8);
# the int12 state's commit 8 at both (9.16 against 10.70 with 4 at d = 64; 32.7 against 126 at d = 96).
# (The lab times the choice against a fixed count by replacing this function: `benchmarks/lab/launch.py`.)
def token_warps(block_d: int, commit: bool, int8: bool) -> int:
    """Warps for a token kernel launch: its tile size (`BLOCK_D`), whether it commits, its state format."""
    if int8 and commit:
        return 8
    if block_d <= 64:
        return 2
    return 4 if int8 else 8


def decode_token(q, k, v, lr, S0, gamma, beta, S, A, eta_tok, inner: int, theta: float, at_state: bool = False,
                 decay=None):
    assert decay is None or not at_state, "a decayed form is a parallel one (values at S0)"
    B, H, D = q.shape
    q, k, v, lr = q.contiguous(), k.contiguous(), v.contiguous(), lr.contiguous()
    for t in (S0, gamma, beta, S, A):
        assert t.is_contiguous(), "decode_token needs contiguous parameters and state"
    out = fresh(torch.empty_like(q))
    last, block = eta_tok.shape[0] - 1, next_power_of_2(D)
    _decode_token_kernel[(B * H,)](q, k, v, lr, S0, gamma, beta, S, A, out, eta_tok, eta_tok if decay is None else decay,
                                   inner, last, H, D, math.log2(theta), LN_EPS, COMMIT=inner == last,
                                   AT_STATE=at_state, BLOCK_D=block, DECAY=decay is not None,
                                   num_warps=token_warps(block, inner == last, int8=False))
    return out


@torch.library.custom_op("edgettt::decode_token", mutates_args=("S", "A"))
def decode_token_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lr: torch.Tensor, S0: torch.Tensor,
                    gamma: torch.Tensor, beta: torch.Tensor, S: torch.Tensor, A: torch.Tensor, eta_tok: torch.Tensor,
                    inner: int, theta: float, at_state: bool, decay: Optional[torch.Tensor]) -> torch.Tensor:
    """The token as one operation in a compiled step: the kernel on CUDA, the reference elsewhere."""
    fn = decode_token if q.is_cuda else decode_token_ref
    return fn(q, k, v, lr, S0, gamma, beta, S, A, eta_tok, inner, theta, at_state, decay)


@decode_token_op.register_fake
def _(q, k, v, lr, S0, gamma, beta, S, A, eta_tok, inner, theta, at_state, decay):
    return torch.empty_like(q)


# ---- the int12 state format (`formats.state_formats.Int12State`), as the torch path holds it -------------
# S [B, H, d+1, d] on the format's grid in the model's float type; the open mini-batch's ka and vh in float16
# slots K [B, H, b, d+1], V [B, H, b, d] in place of A (`converted.LinearAttentionLayer._attend_open_token`):
#     zbar = qa S + eta_i sum_{j <= i} (qa . K_j) V_j;   at the last token: S <- round2(S + eta_b K^T V), K = V = 0
# With `rotation` (the int12-kv8 format: `hadamard(d)`) a token's key and value are put on their int8 grids first
# (`int8_rotated_keys`, `int8_slots`), as that format's slots hold them.

def decode_token_int12_ref(q, k, v, lr, S0, gamma, beta, S, K, V, eta_tok, inner: int, theta: float,
                          at_state: bool = False, decay=None, rotation=None):
    q, qa, ka, vh = token_values_ref(q, k, v, lr, S if at_state else S0, gamma, beta, inner, theta)
    if rotation is not None:
        ka, vh = int8_rotated_keys(ka.float()), int8_slots(vh.float())
    K[:, :, inner], V[:, :, inner] = ka.to(K.dtype), vh.to(V.dtype)
    keys, values = K[:, :, :inner + 1].float(), V[:, :, :inner + 1].float()
    scores = (qa.float()[:, :, None] * keys).sum(-1)  # [B, H, inner + 1]
    zbar = (qa.float()[..., None] * S.float()).sum(-2) + eta_tok[inner] * (scores[..., None] * values).sum(-2)
    if inner == eta_tok.shape[0] - 1:
        kept = S.float() if decay is None else S0.float() + decay.float()[:, None, None] * (S.float() - S0.float())
        S.copy_(two_level_round(kept + eta_tok[-1] * keys.transpose(-1, -2) @ values, S0.float()))
        K.zero_()
        V.zero_()
    return q + layer_norm(zbar.to(q.dtype), gamma, beta)


@triton.jit
def _two_level_rounded(s, s0, ok_cols, STATE_CLIP: tl.constexpr, FINE: tl.constexpr):
    """The rows of tile s on the int12 format's grid around s0 (`state_formats.two_level_round`): step =
    max |s - s0| over the row / STATE_CLIP, coarse = round(d / step), fine = round((d - coarse step) FINE /
    step) in [-(FINE // 2), FINE // 2]; both half to even, as torch.round."""
    d = tl.where(ok_cols[None, :], s - s0, 0.0)
    step = tl.maximum(tl.max(tl.abs(d), axis=1) / STATE_CLIP, 1e-30)[:, None]
    coarse = _round_half_even(d / step)
    half: tl.constexpr = FINE // 2
    fine = tl.minimum(tl.maximum(_round_half_even((d - coarse * step) * (FINE / step)), -half), half)
    return s0 + (coarse + fine / FINE) * step


@triton.jit
def _on_int8_grid(x, STATE_CLIP: tl.constexpr):
    """Vector x on an int8 grid of its own (`state_formats.int8_slots`): step max |x| / STATE_CLIP, half to even."""
    step = tl.maximum(tl.max(tl.abs(x), axis=0) / STATE_CLIP, 1e-30)
    return tl.minimum(tl.maximum(_round_half_even(x / step), -STATE_CLIP), STATE_CLIP) * step


@triton.jit
def _decode_token_int12_kernel(q_ptr, k_ptr, v_ptr, lr_ptr, s0_ptr, g_ptr, b_ptr, s_ptr, kk_ptr, vv_ptr, o_ptr, eta_ptr,
                              decay_ptr, rot_ptr, INNER, LAST, H, D, SLOTS, LOG2_THETA, EPS, STATE_CLIP: tl.constexpr,
                              FINE: tl.constexpr, COMMIT: tl.constexpr, AT_STATE: tl.constexpr, BLOCK_D: tl.constexpr,
                              MINI: tl.constexpr, DECAY: tl.constexpr, OPEN8: tl.constexpr):
    # one (sequence, head): S as a [d, d] tile and its bias row, the open slots as [MINI, d] tiles and the
    # keys' bias column (1 in a filled slot); every state load issued first, as in `_decode_token_kernel`
    bh = tl.program_id(0)
    h = bh % H
    i, j = tl.arange(0, BLOCK_D), tl.arange(0, MINI)
    ok, before = i < D, j < INNER
    mask = ok[:, None] & ok[None, :]
    tile = i[:, None] * D + i[None, :]
    state, s0_at = bh * (D + 1) * D, h * (D + 1) * D
    s, s_bias = tl.load(s_ptr + state + tile, mask=mask, other=0.0), tl.load(s_ptr + state + D * D + i, mask=ok, other=0.0)
    s0 = tl.load(s0_ptr + s0_at + tile, mask=mask, other=0.0)
    s0_bias = tl.load(s0_ptr + s0_at + D * D + i, mask=ok, other=0.0)
    slots_k, slots_v = kk_ptr + bh * SLOTS * (D + 1), vv_ptr + bh * SLOTS * D
    keys = tl.load(slots_k + j[:, None] * (D + 1) + i[None, :], mask=before[:, None] & ok[None, :], other=0.0)
    key_bias = tl.load(slots_k + j * (D + 1) + D, mask=before, other=0.0)
    values = tl.load(slots_v + j[:, None] * D + i[None, :], mask=before[:, None] & ok[None, :], other=0.0)
    if AT_STATE:
        w, w_bias = s, s_bias
    else:
        w, w_bias = s0, s0_bias
    q, k, vh, gamma, beta = _token_values(q_ptr, k_ptr, v_ptr, lr_ptr, g_ptr, b_ptr, bh, h, i, ok, w, w_bias,
                                          INNER + 0.0, D, LOG2_THETA, EPS)
    eta_i = tl.load(eta_ptr + INNER).to(tl.float32)
    if OPEN8:  # int12-kv8: the key on an int8 grid in the rotated basis (k R, rounded, times R^T), the value on its own
        rot = tl.load(rot_ptr + tile, mask=mask, other=0.0)
        k = tl.sum(rot * _on_int8_grid(tl.sum(k[:, None] * rot, axis=0), STATE_CLIP)[None, :], axis=1)
        vh = _on_int8_grid(vh, STATE_CLIP)
    # this token into its slot, and from here on as the slot holds it
    tl.store(slots_k + INNER * (D + 1) + i, k.to(kk_ptr.dtype.element_ty), mask=ok)
    tl.store(slots_k + INNER * (D + 1) + D, tl.full([], 1.0, kk_ptr.dtype.element_ty))
    tl.store(slots_v + INNER * D + i, vh.to(vv_ptr.dtype.element_ty), mask=ok)
    k = k.to(kk_ptr.dtype.element_ty).to(tl.float32)
    vh = vh.to(vv_ptr.dtype.element_ty).to(tl.float32)
    keys, key_bias, values = keys.to(tl.float32), key_bias.to(tl.float32), values.to(tl.float32)
    s, s_bias = s.to(tl.float32), s_bias.to(tl.float32)
    scores = tl.sum(keys * q[None, :], axis=1) + key_bias  # qa . K_j for the slots before this token
    zbar = tl.sum(q[:, None] * s, axis=0) + s_bias + \
        eta_i * (tl.sum(scores[:, None] * values, axis=0) + (tl.sum(q * k, axis=0) + 1.0) * vh)
    if COMMIT:  # every slot filled: S + eta_b K^T V, rounded to the grid; the slots emptied
        eta_b = tl.load(eta_ptr + LAST).to(tl.float32)
        a = k[:, None] * vh[None, :]  # K^T V, a slot at a time (a [MINI, d, d] product would not fit registers)
        for jj in tl.static_range(MINI):
            filled = ok & (tl.full([BLOCK_D], jj, tl.int32) < INNER)
            key_j = tl.load(slots_k + jj * (D + 1) + i, mask=filled, other=0.0).to(tl.float32)
            value_j = tl.load(slots_v + jj * D + i, mask=filled, other=0.0).to(tl.float32)
            a += key_j[:, None] * value_j[None, :]
        a_bias = tl.sum(key_bias[:, None] * values, axis=0) + vh
        if DECAY:  # S0 + gamma (S - S0) before the mini-batch's sum is added
            fade = tl.load(decay_ptr + h).to(tl.float32)
            s = s0.to(tl.float32) + fade * (s - s0.to(tl.float32))
            s_bias = s0_bias.to(tl.float32) + fade * (s_bias - s0_bias.to(tl.float32))
        s = _two_level_rounded(s + eta_b * a, s0.to(tl.float32), ok, STATE_CLIP, FINE)
        s_bias = tl.sum(_two_level_rounded((s_bias + eta_b * a_bias)[None, :], s0_bias.to(tl.float32)[None, :], ok,
                                           STATE_CLIP, FINE), axis=0)  # (a one-row tile)
        tl.store(s_ptr + state + tile, s.to(s_ptr.dtype.element_ty), mask=mask)
        tl.store(s_ptr + state + D * D + i, s_bias.to(s_ptr.dtype.element_ty), mask=ok)
        every = j < SLOTS
        tl.store(slots_k + j[:, None] * (D + 1) + i[None, :], tl.zeros([MINI, BLOCK_D], kk_ptr.dtype.element_ty),
                 mask=every[:, None] & ok[None, :])
        tl.store(slots_k + j * (D + 1) + D, tl.zeros([MINI], kk_ptr.dtype.element_ty), mask=every)
        tl.store(slots_v + j[:, None] * D + i[None, :], tl.zeros([MINI, BLOCK_D], vv_ptr.dtype.element_ty),
                 mask=every[:, None] & ok[None, :])
    zn, _ = _normed(zbar, ok, D, EPS)
    tl.store(o_ptr + bh * D + i, (q + zn * gamma + beta).to(o_ptr.dtype.element_ty), mask=ok)


def decode_token_int12(q, k, v, lr, S0, gamma, beta, S, K, V, eta_tok, inner: int, theta: float,
                      at_state: bool = False, decay=None, rotation=None):
    assert decay is None or not at_state, "a decayed form is a parallel one (values at S0)"
    B, H, D = q.shape
    q, k, v, lr = q.contiguous(), k.contiguous(), v.contiguous(), lr.contiguous()
    for t in (S0, gamma, beta, S, K, V):
        assert t.is_contiguous(), "decode_token_int12 needs contiguous parameters and state"
    assert rotation is None or rotation.shape == (D, D)
    rotation = None if rotation is None else rotation.float().contiguous()  # (no copy where it is already)
    out = fresh(torch.empty_like(q))
    slots = K.shape[2]
    _decode_token_int12_kernel[(B * H,)](q, k, v, lr, S0, gamma, beta, S, K, V, out, eta_tok,
                                        eta_tok if decay is None else decay, eta_tok if rotation is None else rotation,
                                        inner, slots - 1, H, D, slots,
                                        math.log2(theta), LN_EPS, STATE_CLIP=STATE_CLIP, FINE=FINE_STEPS,
                                        COMMIT=inner == slots - 1, AT_STATE=at_state, BLOCK_D=next_power_of_2(D),
                                        MINI=next_power_of_2(slots), DECAY=decay is not None,
                                        OPEN8=rotation is not None,
                                        num_warps=token_warps(next_power_of_2(D), inner == slots - 1, int8=True))
    return out


@torch.library.custom_op("edgettt::decode_token_int12", mutates_args=("S", "K", "V"))
def decode_token_int12_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lr: torch.Tensor, S0: torch.Tensor,
                         gamma: torch.Tensor, beta: torch.Tensor, S: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
                         eta_tok: torch.Tensor, inner: int, theta: float, at_state: bool,
                         decay: Optional[torch.Tensor], rotation: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The int12 state's token as one operation in a compiled step: the kernel on CUDA, the reference elsewhere
    (`rotation`: the int12-kv8 format's, its open keys and values in 8 bits)."""
    fn = decode_token_int12 if q.is_cuda else decode_token_int12_ref
    return fn(q, k, v, lr, S0, gamma, beta, S, K, V, eta_tok, inner, theta, at_state, decay, rotation)


@decode_token_int12_op.register_fake
def _(q, k, v, lr, S0, gamma, beta, S, K, V, eta_tok, inner, theta, at_state, decay, rotation=None):
    return torch.empty_like(q)
