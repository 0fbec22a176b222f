"""A converted TTT-Linear layer's whole decode token in one kernel, between its projections and its
post-norm (float state): rotary, the value map, the state step and the output norm.

    q, k <- rotary(q, k) at the token's place in its mini-batch;  qa, ka = [q, 1], [k, 1]
    vh = -lr * d/dz 0.5 |LN(ka W) - (v - k)|^2             (`linear_attention.linear_values`; W = S0 in the
                                                             parallel form, the boundary state S in the exact)
    A += ka^T vh;  zbar = qa (S + eta_i A);  at the mini-batch's last token: S += eta_b A, A = 0
    out = q + LN(zbar)                                      (gamma, beta: the layer's value norm)

`decode_token_ref` is the plain-torch reference (the layer's own functions), `decode_token` the Triton
kernel, one program a (sequence, head) holding its whole [d+1, d] tiles of S0, S and A; same signature:
    q, k, v [B, H, d] (not rotated)   lr [B, H]   S0 [H, d+1, d]   gamma, beta [H, d]
    S, A [B, H, d+1, d] (read, and updated in place)   eta_tok [b]   inner: the place in the mini-batch
    theta: the rotary base;  at_state: the values at S (the exact form) instead of S0;  returns out [B, H, d]
A compiled decode step runs it as one operation (`edgettt::decode_token`, on CUDA the kernel, elsewhere the
reference), in place of the ~8 kernels inductor makes of these operations (`use_token_kernel` turns it on).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..linear_attention import augment, linear_values
from ..ops import LN_EPS, layer_norm, rotary
from . import fresh, next_power_of_2
from .decode import decode_step_ref


def decode_token_ref(q, k, v, lr, S0, gamma, beta, S, A, eta_tok, inner: int, theta: float, at_state: bool = False):
    position = torch.tensor([inner], device=q.device)
    q, k = (rotary(x[:, :, None], position, theta)[:, :, 0] for x in (q, k))
    ka = augment(k)
    vh = linear_values(ka[:, :, None], k[:, :, None], v[:, :, None], lr[:, :, None], S if at_state else S0,
                       gamma[:, None], beta[:, None])[:, :, 0]
    zbar = decode_step_ref(augment(q), ka, vh.to(S.dtype), S, A, eta_tok, inner)
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
def _decode_token_kernel(q_ptr, k_ptr, v_ptr, lr_ptr, s0_ptr, g_ptr, b_ptr, s_ptr, a_ptr, o_ptr, eta_ptr,
                         INNER, LAST, H, D, LOG2_THETA, EPS,
                         COMMIT: tl.constexpr, AT_STATE: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    bh = tl.program_id(0)  # one (sequence, head)
    h = bh % H
    rows = tl.arange(0, BLOCK_K)  # the state's rows: d features, then the bias row (index D)
    cols = tl.arange(0, BLOCK_D)  # its columns
    col_ok = cols < D
    pos = INNER + 0.0  # (an int argument of 1 arrives as a constant)
    qa = tl.where(rows == D, 1.0, _rotated(q_ptr + bh * D, rows, D, pos, LOG2_THETA))
    ka = tl.where(rows == D, 1.0, _rotated(k_ptr + bh * D, rows, D, pos, LOG2_THETA))
    q_cols = _rotated(q_ptr + bh * D, cols, D, pos, LOG2_THETA)
    target = tl.load(v_ptr + bh * D + cols, mask=col_ok, other=0.0).to(tl.float32) - \
        _rotated(k_ptr + bh * D, cols, D, pos, LOG2_THETA)
    gamma = tl.load(g_ptr + h * D + cols, mask=col_ok, other=0.0).to(tl.float32)
    beta = tl.load(b_ptr + h * D + cols, mask=col_ok, other=0.0).to(tl.float32)
    tile = rows[:, None] * D + cols[None, :]  # into a [d+1, d] matrix
    mask = (rows <= D)[:, None] & col_ok[None, :]
    state = bh * (D + 1) * D + tile
    s = tl.load(s_ptr + state, mask=mask, other=0.0).to(tl.float32)
    # the value map at W (S0, or S itself): the LN-L2 gradient of z = ka W towards v - k, times -lr
    if AT_STATE:
        w = s
    else:
        w = tl.load(s0_ptr + h * (D + 1) * D + tile, mask=mask, other=0.0).to(tl.float32)
    xh, inv = _normed(tl.sum(ka[:, None] * w, axis=0), col_ok, D, EPS)
    e = tl.where(col_ok, (gamma * xh + beta - target) * gamma, 0.0)
    grad = (e - tl.sum(e, axis=0) / D - xh * (tl.sum(e * xh, axis=0) / D)) * inv
    vh = tl.where(col_ok, -tl.load(lr_ptr + bh).to(tl.float32) * grad, 0.0)
    # the state step (`decode.decode_step`)
    eta_i = tl.load(eta_ptr + INNER).to(tl.float32)
    eta_b = tl.load(eta_ptr + LAST).to(tl.float32)
    a = tl.load(a_ptr + state, mask=mask, other=0.0).to(tl.float32) + ka[:, None] * vh[None, :]
    zbar = tl.sum(qa[:, None] * (s + eta_i * a), axis=0)
    if COMMIT:
        tl.store(s_ptr + state, (s + eta_b * a).to(s_ptr.dtype.element_ty), mask=mask)
        a = a * 0.0
    tl.store(a_ptr + state, a.to(a_ptr.dtype.element_ty), mask=mask)
    zn, _ = _normed(zbar, col_ok, D, EPS)
    tl.store(o_ptr + bh * D + cols, (q_cols + zn * gamma + beta).to(o_ptr.dtype.element_ty), mask=col_ok)


def decode_token(q, k, v, lr, S0, gamma, beta, S, A, eta_tok, inner: int, theta: float, at_state: bool = False):
    B, H, D = q.shape
    q, k, v, lr = q.contiguous(), k.contiguous(), v.contiguous(), lr.contiguous()
    for t in (S0, gamma, beta, S, A):
        assert t.is_contiguous(), "decode_token needs contiguous parameters and state"
    out = fresh(torch.empty_like(q))
    last = eta_tok.shape[0] - 1
    _decode_token_kernel[(B * H,)](q, k, v, lr, S0, gamma, beta, S, A, out, eta_tok, inner, last, H, D,
                                   math.log2(theta), LN_EPS, COMMIT=inner == last, AT_STATE=at_state,
                                   BLOCK_K=next_power_of_2(D + 1), BLOCK_D=next_power_of_2(D),
                                   num_warps=8)  # three [d+1, d] fp32 tiles a program (S0, S, A): 8 warps hold them
    return out


@torch.library.custom_op("edgettt::decode_token", mutates_args=("S", "A"))
def decode_token_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lr: torch.Tensor, S0: torch.Tensor,
                    gamma: torch.Tensor, beta: torch.Tensor, S: torch.Tensor, A: torch.Tensor, eta_tok: torch.Tensor,
                    inner: int, theta: float, at_state: bool) -> torch.Tensor:
    """The token as one operation in a compiled step: the kernel on CUDA, the reference elsewhere."""
    fn = decode_token if q.is_cuda else decode_token_ref
    return fn(q, k, v, lr, S0, gamma, beta, S, A, eta_tok, inner, theta, at_state)


@decode_token_op.register_fake
def _(q, k, v, lr, S0, gamma, beta, S, A, eta_tok, inner, theta, at_state):
    return torch.empty_like(q)


def use_token_kernel(model: torch.nn.Module) -> int:
    """Every converted layer of `model` that can (`LinearAttentionLayer.token_kernel`) to decode a compiled
    token through `edgettt::decode_token`. Returns the number of layers that will."""
    layers = [m for m in model.modules() if hasattr(m, "token_kernel")]
    for layer in layers:
        layer.token_kernel = True
    return sum(layer.token_kernel_applies() for layer in layers)
