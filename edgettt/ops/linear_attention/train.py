"""The exact-form TTT-Linear layer with a backward: training on CUDA without the mini-batch loop.

    out, S = exact_train(q, k, v, lr, S0, gamma, beta, eta_tok)
    q, k, v: [B, H, T, d] (T a multiple of the mini-batch size b);  lr: [B, H, T];  S0: [H, d+1, d]
    (W1 stacked over b1);  gamma, beta: [H, d];  eta_tok: [b]
    out = q + LN(Zbar) as `prefill.exact` from the start, differentiable in every input;
    S: the final state [B, H, d+1, d] (no gradient flows back through it)

Forward: `prefill._exact_kernel`, which also writes every mini-batch's boundary state. Backward: one
program per (sequence, head) walks the mini-batches in reverse from those states, recomputes the
mini-batch's forward in registers and carries dL/dS (the gradient of the state after the
mini-batch) to the one before. The reference is torch autograd through `prefill.exact_ref`.

Per mini-batch (rows t; state W, wb; r, xh the LN of z; r2, xh2 the LN of zbar):
    z = k W + wb;  e = gamma (gamma xh + beta - v + k);  g = r (e - mean e - xh mean(e xh));  vh = -lr g
    zbar = q W + wb + ((q k^T + 1) * M) vh;  out = q + gamma xh2 + beta
    W' = W + eta_b k^T vh;  wb' = wb + eta_b sum_t vh
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgettt.ops.common import fresh, mini_batch_supported, next_power_of_2
from edgettt.ops.linear_attention.prefill import (EXACT_CONFIGS, _chunk_mask, _configs, _exact_aligned, _load_tile, _precision, _same_layout,
                      _start_state, _zero_pad)


@triton.jit
def _row_ln(x, d_ok, D: tl.constexpr):
    """LN without affine over the D real columns: (xh, rstd). x: [BM, BD], zero in the padding."""
    xc = _zero_pad(x - (tl.sum(x, axis=1) / D)[:, None], d_ok, D)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / D + 1e-6)
    return xc * rstd[:, None], rstd


@triton.jit
def _ln_grad(dxh, xh, rstd, d_ok, D: tl.constexpr):
    """dL/dx of xh = LN(x) given dL/dxh."""
    g = (dxh - (tl.sum(dxh, axis=1) / D)[:, None] - xh * (tl.sum(dxh * xh, axis=1) / D)[:, None]) * rstd[:, None]
    return _zero_pad(g, d_ok, D)


@triton.autotune(configs=_configs(EXACT_CONFIGS), key=["D", "MB"])
@triton.jit
def _exact_backward_kernel(q_ptr, k_ptr, v_ptr, lr_ptr, gamma_ptr, beta_ptr, eta_ptr, states_ptr, do_ptr,
                           dq_ptr, dk_ptr, dv_ptr, dlr_ptr, ds_ptr, dgamma_ptr, dbeta_ptr, deta_ptr,
                           T, H, stride_b, stride_h, stride_t, stride_lb, stride_lh, stride_lt,
                           stride_db, stride_dh, stride_dt,
                           D: tl.constexpr, BD: tl.constexpr, MB: tl.constexpr, BM: tl.constexpr,
                           PREC: tl.constexpr):
    bh = tl.program_id(0)
    b, h = bh // H, bh % H
    cols = tl.arange(0, BD)
    d_ok = cols < D
    w_ok = d_ok[:, None] & d_ok[None, :]
    sq = cols[:, None] * D + cols[None, :]
    gamma = tl.load(gamma_ptr + h * D + cols, mask=d_ok, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + h * D + cols, mask=d_ok, other=0.0).to(tl.float32)
    eta_last = tl.load(eta_ptr + MB - 1).to(tl.float32)
    inner = tl.arange(0, BM)
    row_ok = inner < MB
    ok = row_ok[:, None] & d_ok[None, :]
    mask = _chunk_mask(BM, eta_ptr, MB)  # [BM, BM]
    lower = (inner[:, None] >= inner[None, :]) & row_ok[:, None] & row_ok[None, :]
    base = b.to(tl.int64) * stride_b + h * stride_h
    lbase = b.to(tl.int64) * stride_lb + h * stride_lh
    dbase = b.to(tl.int64) * stride_db + h * stride_dh
    dw = tl.zeros([BD, BD], dtype=tl.float32)  # dL/d(state after the current mini-batch)
    dwb = tl.zeros([BD], dtype=tl.float32)
    dgamma = tl.zeros([BD], dtype=tl.float32)
    dbeta = tl.zeros([BD], dtype=tl.float32)
    deta = tl.zeros([BM], dtype=tl.float32)
    deta_last = tl.zeros([BD], dtype=tl.float32)  # summed at the end
    n_mb = T // MB
    for i in range(n_mb):
        mb = n_mb - 1 - i
        rows = mb * MB + inner
        at = states_ptr + (bh.to(tl.int64) * n_mb + mb) * (D + 1) * D
        w = tl.load(at + sq, mask=w_ok, other=0.0)  # [BD, BD] the boundary state
        wb = tl.load(at + D * D + cols, mask=d_ok, other=0.0)
        q = _load_tile(q_ptr + base, rows, stride_t, cols, ok).to(tl.float32)  # [BM, BD]
        k = _load_tile(k_ptr + base, rows, stride_t, cols, ok).to(tl.float32)
        v = _load_tile(v_ptr + base, rows, stride_t, cols, ok).to(tl.float32)
        do = _load_tile(do_ptr + dbase, rows, stride_dt, cols, ok).to(tl.float32)
        lr = tl.load(lr_ptr + lbase + rows * stride_lt, mask=row_ok, other=0.0).to(tl.float32)  # [BM]
        # the forward of this mini-batch, again
        xh, rstd = _row_ln(tl.dot(k, w, input_precision=PREC) + wb[None, :], d_ok, D)
        u = gamma[None, :] * xh + beta[None, :] - v + k
        e = u * gamma[None, :]
        s2 = tl.sum(e * xh, axis=1) / D
        g = _zero_pad((e - (tl.sum(e, axis=1) / D)[:, None] - xh * s2[:, None]) * rstd[:, None], d_ok, D)
        vh = -lr[:, None] * g
        p0 = tl.dot(q, tl.trans(k), input_precision=PREC) + 1.0  # [BM, BM]
        p = p0 * mask
        zbar = tl.dot(q, w, input_precision=PREC) + wb[None, :] + tl.dot(p, vh, input_precision=PREC)
        xh2, rstd2 = _row_ln(zbar, d_ok, D)
        # out = q + gamma xh2 + beta
        dgamma += tl.sum(do * xh2, axis=0)
        dbeta += tl.sum(do, axis=0)
        dzbar = _ln_grad(do * gamma[None, :], xh2, rstd2, d_ok, D)
        dq = do + tl.dot(dzbar, tl.trans(w), input_precision=PREC)
        dw_here = tl.dot(tl.trans(q), dzbar, input_precision=PREC)
        dwb_here = tl.sum(dzbar, axis=0)
        dp = tl.dot(dzbar, tl.trans(vh), input_precision=PREC)  # [BM, BM]
        dvh = tl.dot(tl.trans(p), dzbar, input_precision=PREC)
        deta += tl.sum(tl.where(lower, dp * p0, 0.0), axis=1)
        dp0 = dp * mask
        dq += tl.dot(dp0, k, input_precision=PREC)
        dk = tl.dot(tl.trans(dp0), q, input_precision=PREC)
        # W' = W + eta_b k^T vh, wb' = wb + eta_b sum vh
        dvh += eta_last * (tl.dot(k, dw, input_precision=PREC) + dwb[None, :])
        dk += eta_last * tl.dot(vh, tl.trans(dw), input_precision=PREC)
        deta_last += tl.sum(dw * tl.dot(tl.trans(k), vh, input_precision=PREC), axis=0) + dwb * tl.sum(vh, axis=0)
        # vh = -lr g
        dlr = -tl.sum(g * dvh, axis=1)
        a = -lr[:, None] * dvh  # dL/dg
        m_ax = tl.sum(a * xh, axis=1) / D
        de = (a - (tl.sum(a, axis=1) / D)[:, None] - xh * m_ax[:, None]) * rstd[:, None]
        dxh = -rstd[:, None] * (a * s2[:, None] + e * m_ax[:, None]) + de * gamma[None, :] * gamma[None, :]
        drstd = tl.sum(a * g, axis=1) / rstd  # through the explicit rstd factor of g
        dgamma += tl.sum(de * (u + gamma[None, :] * xh), axis=0)
        dbeta += tl.sum(de * gamma[None, :], axis=0)
        dv = -de * gamma[None, :]
        dk += de * gamma[None, :]
        # z = k W + wb (xh = LN(z); drstd/dz = -rstd^2 xh / D)
        dz = _ln_grad(dxh, xh, rstd, d_ok, D) - _zero_pad((drstd * rstd * rstd / D)[:, None] * xh, d_ok, D)
        dk += tl.dot(dz, tl.trans(w), input_precision=PREC)
        dw += dw_here + tl.dot(tl.trans(k), dz, input_precision=PREC)
        dwb += dwb_here + tl.sum(dz, axis=0)
        out = rows[:, None] * stride_t + cols[None, :]
        tl.store(dq_ptr + base + out, dq.to(dq_ptr.dtype.element_ty), mask=ok)
        tl.store(dk_ptr + base + out, dk.to(dk_ptr.dtype.element_ty), mask=ok)
        tl.store(dv_ptr + base + out, dv.to(dv_ptr.dtype.element_ty), mask=ok)
        tl.store(dlr_ptr + lbase + rows * stride_lt, dlr.to(dlr_ptr.dtype.element_ty), mask=row_ok)
    st = bh.to(tl.int64) * (D + 1) * D
    tl.store(ds_ptr + st + sq, dw, mask=w_ok)
    tl.store(ds_ptr + st + D * D + cols, dwb, mask=d_ok)
    tl.store(dgamma_ptr + bh * D + cols, dgamma, mask=d_ok)
    tl.store(dbeta_ptr + bh * D + cols, dbeta, mask=d_ok)
    deta = tl.where(inner == MB - 1, deta + tl.sum(deta_last, axis=0), deta)
    tl.store(deta_ptr + bh * MB + inner, deta, mask=row_ok)


def _dot_precision(dtype) -> str:
    """fp32 inputs take tf32 dots when torch's matmuls do (training sets allow_tf32), else ieee."""
    if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return _precision(dtype)


def _exact_forward(q, k, v, lr, S0, gamma, beta, eta_tok, states=None):
    """The exact kernel from S0 (every sequence's fresh state); `states`, when given, receives the
    boundary states. Returns (out, S)."""
    S = _start_state(q, S0.contiguous(), None)
    out, S_out, _ = _exact_aligned(q, k, v, lr, S0, gamma, beta, eta_tok, S, states=states,
                                   precision=_dot_precision(q.dtype))
    return out, S_out


class _ExactTTTLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, lr, S0, gamma, beta, eta_tok):
        B, H, T, D = q.shape
        MB = eta_tok.shape[0]
        states = torch.empty(B * H, T // MB, D + 1, D, device=q.device, dtype=torch.float32)
        out, S_out = _exact_forward(q, k, v, lr, S0, gamma, beta, eta_tok, states)
        ctx.save_for_backward(q, k, v, lr, gamma, beta, eta_tok, states)
        ctx.mark_non_differentiable(S_out)
        ctx.dtypes = (S0.dtype, gamma.dtype, eta_tok.dtype)
        return out, S_out

    @staticmethod
    def backward(ctx, dout, _):
        q, k, v, lr, gamma, beta, eta_tok, states = ctx.saved_tensors
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        B, H, T, D = q.shape
        MB = eta_tok.shape[0]
        f32 = dict(device=q.device, dtype=torch.float32)
        dq, dk, dv = (fresh(torch.empty_like(q)) for _ in range(3))
        dlr = fresh(torch.empty_like(lr))
        dS = fresh(torch.empty(B, H, D + 1, D, **f32))
        dgamma, dbeta = fresh(torch.empty(B, H, D, **f32)), fresh(torch.empty(B, H, D, **f32))
        deta = fresh(torch.empty(B, H, MB, **f32))
        gamma_c, beta_c, eta_c = gamma.float().contiguous(), beta.float().contiguous(), eta_tok.float().contiguous()
        _exact_backward_kernel[(B * H,)](q, k, v, lr, gamma_c, beta_c, eta_c, states, dout, dq, dk, dv, dlr, dS,
                                         dgamma, dbeta, deta, T, H, *q.stride()[:3], *lr.stride(), *dout.stride()[:3],
                                         D=D, BD=max(16, next_power_of_2(D)), MB=MB, BM=max(16, MB),
                                         PREC=_dot_precision(q.dtype))
        s0_dtype, gamma_dtype, eta_dtype = ctx.dtypes
        return (dq, dk, dv, dlr, dS.sum(0).to(s0_dtype), dgamma.sum(0).to(gamma_dtype), dbeta.sum(0).to(gamma_dtype),
                deta.sum((0, 1)).to(eta_dtype))


def exact_train(q, k, v, lr, S0, gamma, beta, eta_tok):
    """The exact form from S0 over whole mini-batches, with gradients for every input (see the header).
    When no gradient is wanted (inference, e.g. a distillation's teacher), the forward alone, without
    the boundary states the backward would read ([B*H, T/b, d+1, d] fp32: at d = 64 and b = 16 about
    4x the bytes of q in fp32)."""
    MB = eta_tok.shape[0]
    assert q.shape[2] % MB == 0, "exact_train runs whole mini-batches"
    assert mini_batch_supported(MB), "the kernels take mini-batches of a power of two up to 64"
    q, k, v = _same_layout(q, k, v)
    inputs = (q, k, v, lr, S0, gamma, beta, eta_tok)
    if not (torch.is_grad_enabled() and any(x.requires_grad for x in inputs)):
        return _exact_forward(*inputs)
    return _ExactTTTLinear.apply(*inputs)
