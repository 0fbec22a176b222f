"""A prefill's chain of mini-batch commits with the int12 state format, in one kernel.

    for n in 0 .. N-1:  S <- round2(S + eta_last U_n);  S_after[n] = S

round2 is the int12 format's two-level rounding around S0 (`formats.state_formats.two_level_round`: a step
per row, max |S - S0| / 127, recomputed at every commit). The rounding makes the chain sequential, so
with the int12 state the parallel form's prefill (`linear_attention.committed_states`) looped over the
mini-batches in torch, a few small operations each: 512 commits a layer at 8192 tokens, 58x slower
than the float state's prefill on the H200 (benchmarks/results/model_speed_h200.md). Rows are
independent (each has its own step), so one program keeps ROWS rows of one sequence and head in
registers and walks the whole chain, reading each U_n and writing each S_after[n] once.

`two_level_commits_ref` is the plain-torch reference, `two_level_commits` the Triton kernel; same
signature:
    S [B, H, Dk, Dv] (the state before the first commit), S0 [H, Dk, Dv], U [B, H, N, Dk, Dv],
    eta_last: a 0-d tensor; decay: gamma [H] of a decayed form (S <- round2(S0 + gamma (S - S0) + eta_last
    U_n), `linear_attention.Decay` towards the same S0) or None; returns S_after [B, H, N, Dk, Dv] in S's
    dtype (the kernel computes in float32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgettt.formats.state_formats import two_level_round
from edgettt.ops.common import cdiv, fresh, next_power_of_2
from edgettt.ops.linear_attention.decode import _round_half_even


def two_level_commits_ref(S, S0, U, eta_last, decay=None):
    out = []
    g = None if decay is None else decay[:, None, None]
    for n in range(U.shape[2]):
        S = S if g is None else S0 + g * (S - S0)
        S = two_level_round(S + eta_last * U[:, :, n], S0)
        out.append(S)
    return torch.stack(out, dim=2)


@triton.jit
def _two_level_rows(d):
    """d [R, C] = S - S0 on the int12 format's grid, a step a row (`state_formats.two_level_round`, less S0)."""
    step = tl.maximum(tl.max(tl.abs(d), axis=1) / 127.0, 1e-30)[:, None]
    coarse = _round_half_even(d / step)
    fine = tl.minimum(tl.maximum(_round_half_even((d - coarse * step) * (15.0 / step)), -7.0), 7.0)
    return (coarse + fine / 15.0) * step


@triton.jit
def _two_level_commits_kernel(s_ptr, s0_ptr, u_ptr, out_ptr, eta_ptr, decay_ptr, H, N, DK, DV,
                              ROWS: tl.constexpr, BLOCK_V: tl.constexpr, DECAY: tl.constexpr):
    bh, block = tl.program_id(0), tl.program_id(1)
    r = block * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK_V)
    mask = (r[:, None] < DK) & (c[None, :] < DV)
    at = r[:, None] * DV + c[None, :]
    size = DK * DV
    s = tl.load(s_ptr + bh * size + at, mask=mask, other=0.0).to(tl.float32)
    s0 = tl.load(s0_ptr + (bh % H) * size + at, mask=mask, other=0.0).to(tl.float32)
    eta = tl.load(eta_ptr).to(tl.float32)
    g = tl.load(decay_ptr + bh % H).to(tl.float32) if DECAY else 1.0
    for n in range(N):
        at_n = (bh * N + n).to(tl.int64) * size + at
        u = tl.load(u_ptr + at_n, mask=mask, other=0.0).to(tl.float32)
        if DECAY:
            s = s0 + g * (s - s0)
        # the reference's order, (S + eta U) - S0: another order rounds differently, and a rounding that
        # crosses a grid point moves the value a whole fine step (masked elements stay 0: no maximum moves)
        s = s0 + _two_level_rows(s + eta * u - s0)
        tl.store(out_ptr + at_n, s.to(out_ptr.dtype.element_ty), mask=mask)


def two_level_commits(S, S0, U, eta_last, decay=None):
    B, H, N, DK, DV = U.shape
    S, S0, U = S.contiguous(), S0.contiguous(), U.contiguous()
    eta = eta_last.detach().reshape(1).to(torch.float32).contiguous()
    gamma = eta if decay is None else decay.detach().to(torch.float32).contiguous()  # (unread without a decay)
    out = fresh(torch.empty(B, H, N, DK, DV, dtype=S.dtype, device=S.device))
    rows = 8
    grid = (B * H, cdiv(DK, rows))
    _two_level_commits_kernel[grid](S, S0, U, out, eta, gamma, H, N, DK, DV, ROWS=rows, BLOCK_V=next_power_of_2(DV),
                                    DECAY=decay is not None)
    return out
