"""Prefill of a TTT-Linear layer in its linear-attention form: the parallel and the exact form.

Both take the rotated per-head queries, keys, values and learning rates and return the layer's head
outputs `q + LN(Zbar)` with the state left behind (DESIGN section 4). One signature, four functions:

    fn(q, k, v, lr, S0, gamma, beta, eta_tok, start=0, S=None, A=None) -> (out, S, A)
    q, k, v: [B, H, T, d] (one layout, the last dim contiguous; else copied)   lr: [B, H, T]
    S0: [H, d+1, d] the initial fast weights [W1; b1]   gamma, beta: [H, d] (the inner LayerNorm)
    eta_tok: [b] the mini-batch mask weights   start: position of the first token
    S, A: [B, H, d+1, d] the state to continue from (None: S0 and zeros; pass A=None whenever it is
          known to be zero, e.g. at a mini-batch boundary of a model's state: it saves a reference step)
    out: like q;  S, A: float32 [B, H, d+1, d]

- `parallel_ref` / `parallel`: every value at S0, `Zbar = Qa S + ((Qa Ka^T) * M) Vh`.
- `exact_ref` / `exact`: the values of each mini-batch at its own boundary state (recurrent across
  mini-batches; equals the original TTT-Linear layer).

The kernels work on aligned, whole mini-batches from a fresh A. The wrapper runs the few tokens up
to the first mini-batch boundary (when `start` is not one) through the reference, then the kernel.

`parallel` is two passes over the sequence, split into segments for parallelism: pass 1 computes
the values, stores them, and sums each segment's `Ka^T Vh` (state increments, [d+1, d] per
segment); pass 2 starts each segment from S plus the sums of the segments before it and writes the
outputs tile by tile, reading the stored values. Both take the column sums of the values (the bias
row of a state increment) from a product with a block of ones on the tensor cores: summing the rows
of a tile in the accumulator layout costs shuffles and a trip through shared memory. Where T is a
whole number of tiles and of segments, every mini-batch is complete and d fills the tile, no tile
needs a mask and both passes run without (`EVEN`); other lengths run the masked kernels.
`exact` has one program per (sequence, head) walking the mini-batches in order.

`parallel(decay=gamma [H])` is the decayed parallel form (`linear_attention.Decay`): pass 1 weighs
each token's term by gamma^(mini-batches to its segment's last), pass 2 carries the state from
segment to segment and tile to tile as S0 + gamma^n (S - S0) + eta_b (decayed sums), its chunk mask
weighs an earlier mini-batch of the tile by gamma^(lag - 1), and a tile's row in its j-th mini-batch
reads S0 + gamma^j (S - S0) (one more product a tile, with S0).

Why these choices and not others (pass 2 recomputing the values, other tiles, column sums by
tl.sum or stored by pass 1, masks everywhere, other launch configurations): each was measured
slower on an H200 and removed; the measurements are in `benchmarks/results/prefill_design.md`.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from edgettt.formats.state_formats import two_level_round
from edgettt.ops import layer_norm, segments
from edgettt.ops.common import autotune_configs, cdiv, fresh, next_power_of_2
from edgettt.ops.linear_attention import reference as la
from edgettt.ops.linear_attention.commits import _two_level_rows

# ---- references -----------------------------------------------------------------------------------

def _gamma_beta(gamma, beta):
    H, d = gamma.shape
    return gamma.reshape(H, 1, d).float(), beta.reshape(H, 1, d).float()


def _start_state(q, S0, S):
    """S in float32, or S0 for every sequence (a broadcast view: no copy)."""
    return S0.float().expand(q.shape[0], -1, -1, -1) if S is None else S.float()


def _fresh_state(q, S0, S, A):
    S = _start_state(q, S0, S)
    return S, torch.zeros_like(S) if A is None else A.float()


def parallel_ref(q, k, v, lr, S0, gamma, beta, eta_tok, start=0, S=None, A=None, decay=None):
    g, bt = _gamma_beta(gamma, beta)
    q, k, v, lr = q.float(), k.float(), v.float(), lr.float()
    S, A = _fresh_state(q, S0, S, A)
    qa, ka = la.augment(q), la.augment(k)
    vh = la.linear_values(ka, k, v, lr, S0.float(), g, bt)
    decay = None if decay is None else la.Decay(decay.float(), S0.float())
    zbar, S, A = la.chunk(qa, ka, vh, S, A, eta_tok.float(), start, decay=decay)
    return q + layer_norm(zbar, g, bt), S, A


def exact_ref(q, k, v, lr, S0, gamma, beta, eta_tok, start=0, S=None, A=None, two_level=False):
    g, bt = _gamma_beta(gamma, beta)
    q, k, v, lr = q.float(), k.float(), v.float(), lr.float()
    S, A = _fresh_state(q, S0, S, A)
    outs = []
    for offset, count, _ in segments(start, q.shape[2], eta_tok.shape[0]):
        sl = slice(offset, offset + count)
        qa, ka = la.augment(q[:, :, sl]), la.augment(k[:, :, sl])
        vh = la.linear_values(ka, k[:, :, sl], v[:, :, sl], lr[:, :, sl], S, g, bt)
        if two_level:  # the int12 format reads every token's ka and vh as its float16 buffers keep them
            ka, vh = ka.half().float(), vh.half().float()
        zbar, S_new, A = la.chunk(qa, ka, vh, S, A, eta_tok.float(), start + offset)
        committed = (start + offset + count) % eta_tok.shape[0] == 0
        S = two_level_round(S_new, S0.float()) if two_level and committed else S_new
        outs.append(q[:, :, sl] + layer_norm(zbar, g, bt))
    return torch.cat(outs, dim=2), S, A


# ---- shared pieces of the kernels --------------------------------------------------------------------

# 4 warps; the first (3 stages) is the measured best on an H200 (benchmarks/results/prefill_design.md)
PARALLEL_CONFIGS = [triton.Config({}, num_warps=4, num_stages=s) for s in (3, 1, 2)]
EXACT_CONFIGS = [triton.Config({}, num_warps=w, num_stages=s) for w in (2, 4, 8) for s in (1, 2)]


def _configs(configs):
    """What the autotuner tries: `configs` on a GPU, one under the interpreter."""
    return autotune_configs(configs, [triton.Config({}, num_warps=4)])


@triton.jit
def _zero_pad(x, d_ok, D: tl.constexpr):
    """x with its padding columns (>= D) zeroed; nothing to do (no instructions) when D fills the tile."""
    if x.shape[1] != D:
        x = tl.where(d_ok[None, :], x, 0.0)
    return x


@triton.jit
def _ln_l2_values(z, k, v, lr, gamma, beta, d_ok, D: tl.constexpr):
    """vh = -lr * d/dz 0.5|LN(z) - (v - k)|^2, the closed form of DESIGN 3.4 (all fp32; eps 1e-6 as
    ops.LN_EPS).
    z, k, v: [BT, BD], zero in the padding columns >= D; lr: [BT]; gamma, beta: [BD], gamma zero in
    the padding (so e is too). vh comes out zero in the padding.
    Written as multiply-adds with the per-row and per-column factors taken out first (fewer
    instructions in the tile loop):
    e = gamma^2 xh + gamma (k - v) + gamma beta, vh = e rs - xh (mean(e xh) rs) - mean(e) rs with
    rs = -lr rstd."""
    mu = tl.sum(z, axis=1) / D
    zc = _zero_pad(z - mu[:, None], d_ok, D)
    rstd = 1.0 / tl.sqrt(tl.sum(zc * zc, axis=1) / D + 1e-6)
    xh = zc * rstd[:, None]
    e = tl.fma((gamma * gamma)[None, :], xh, tl.fma(gamma[None, :], k - v, (gamma * beta)[None, :]))
    rs = -lr * rstd  # [BT]
    mean_e_rs = tl.sum(e, axis=1) * (rs / D)
    mean_exh_rs = tl.sum(e * xh, axis=1) * (rs / D)
    g = tl.fma(e, rs[:, None], tl.fma(xh, -mean_exh_rs[:, None], -mean_e_rs[:, None]))
    return _zero_pad(g, d_ok, D)


@triton.jit
def _ln_out(q, zbar, gamma, beta, d_ok, D: tl.constexpr):
    """q + LN(zbar) over the D real columns (fp32); zbar is zero in the padding columns."""
    mu = tl.sum(zbar, axis=1) / D
    zc = _zero_pad(zbar - mu[:, None], d_ok, D)
    rstd = 1.0 / tl.sqrt(tl.sum(zc * zc, axis=1) / D + 1e-6)
    return q + zc * rstd[:, None] * gamma[None, :] + beta[None, :]


@triton.jit
def _chunk_mask(N: tl.constexpr, eta_ptr, MB: tl.constexpr):
    """M[t, j] for the positions of a tile that starts at a mini-batch boundary: eta_tok[t % MB]
    inside t's mini-batch, eta_tok[MB-1] for an earlier one, 0 after t. [N, N] fp32."""
    rows = tl.arange(0, N)
    eta_row = tl.load(eta_ptr + rows % MB).to(tl.float32)
    eta_last = tl.load(eta_ptr + MB - 1).to(tl.float32)
    same = (rows[:, None] // MB) == (rows[None, :] // MB)
    m = tl.where(same, eta_row[:, None], eta_last)
    return tl.where(rows[:, None] >= rows[None, :], m, 0.0)


@triton.jit
def _decayed_chunk_mask(N: tl.constexpr, eta_ptr, MB: tl.constexpr, lg):
    """`_chunk_mask` of a decayed form: a token of an earlier mini-batch, j mini-batches before t's,
    weighs eta_tok[MB-1] gamma^(j-1) (lg = log2 gamma)."""
    rows = tl.arange(0, N)
    eta_row = tl.load(eta_ptr + rows % MB).to(tl.float32)
    eta_last = tl.load(eta_ptr + MB - 1).to(tl.float32)
    lag = (rows[:, None] // MB - rows[None, :] // MB - 1).to(tl.float32)
    m = tl.where(lag < 0, eta_row[:, None], eta_last * tl.exp2(lg * tl.maximum(lag, 0.0)))
    return tl.where(rows[:, None] >= rows[None, :], m, 0.0)


# ---- parallel form --------------------------------------------------------------------------------

@triton.jit
def _load_tile(ptr, rows, stride_t, cols, ok, EVEN: tl.constexpr = False):
    """A [rows, cols] tile; with EVEN (every row and column in range) without a mask."""
    if EVEN:
        return tl.load(ptr + rows[:, None] * stride_t + cols[None, :])
    return tl.load(ptr + rows[:, None] * stride_t + cols[None, :], mask=ok, other=0.0)


@triton.jit
def _load_lr(lr_ptr, rows, stride_lr, limit):
    return tl.load(lr_ptr + rows * stride_lr, mask=rows < limit, other=0.0).to(tl.float32)  # [BT]


@triton.jit
def _parallel_tile_values(k_ptr, v_ptr, lr, rows, cols, stride_t, row_ok, d_ok, w0, b0, gamma, beta,
                          D: tl.constexpr, PREC: tl.constexpr, EVEN: tl.constexpr = False):
    """Load one tile's keys and compute its values at S0 = [w0; b0] (lr: the tile's learning rates,
    loaded by the caller a tile ahead: the pipeliner leaves such small loads in place). Returns k
    (input dtype), vh (fp32)."""
    ok = row_ok[:, None] & d_ok[None, :]
    k = _load_tile(k_ptr, rows, stride_t, cols, ok, EVEN)  # [BT, BD]
    v = _load_tile(v_ptr, rows, stride_t, cols, ok, EVEN).to(tl.float32)
    z = tl.dot(k, w0, input_precision=PREC) + b0[None, :]  # [BT, BD]
    return k, _ln_l2_values(z, k.to(tl.float32), v, lr, gamma, beta, d_ok, D)


@triton.autotune(configs=_configs(PARALLEL_CONFIGS), key=["D", "BT"])
@triton.jit
def _parallel_sums_kernel(k_ptr, v_ptr, lr_ptr, s0_ptr, gamma_ptr, beta_ptr, lg_ptr, u_ptr, vh_ptr,
                          T, T_DONE, H, TILES_PER_SEG, NSEG,
                          stride_b, stride_h, stride_t, stride_lb, stride_lh, stride_lt,
                          D: tl.constexpr, BD: tl.constexpr, BT: tl.constexpr, MB: tl.constexpr,
                          PREC: tl.constexpr, EVEN: tl.constexpr = False, DECAY: tl.constexpr = False):
    """Pass 1: the values vh of every token (written to vh [B*H, T, D] for pass 2) and U[bh, seg] =
    sum over the segment's committed tokens of [k, 1]^T vh ([D+1, D] fp32); the bias row (the
    values' column sums) from one product with a block of ones whose row 0 is all ones. EVEN: T is
    a whole number of segments and mini-batches and D fills the tile, so no tile needs a mask (see
    _parallel_plan). DECAY (a decayed form, lg_ptr [H] = log2 gamma): each token's term weighed by
    gamma^(mini-batches after its own to the segment's last committed one)."""
    bh, seg = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    cols = tl.arange(0, BD)
    d_ok = cols < D
    w_ok = d_ok[:, None] & d_ok[None, :]
    w0 = tl.load(s0_ptr + h * (D + 1) * D + cols[:, None] * D + cols[None, :], mask=w_ok, other=0.0)
    b0 = tl.load(s0_ptr + h * (D + 1) * D + D * D + cols, mask=d_ok, other=0.0).to(tl.float32)
    gamma = tl.load(gamma_ptr + h * D + cols, mask=d_ok, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + h * D + cols, mask=d_ok, other=0.0).to(tl.float32)
    base = b.to(tl.int64) * stride_b + h * stride_h
    lbase = b.to(tl.int64) * stride_lb + h * stride_lh
    w0 = w0.to(k_ptr.dtype.element_ty)
    uw = tl.zeros([BD, BD], dtype=tl.float32)
    dt = k_ptr.dtype.element_ty
    row0 = ((tl.arange(0, 16)[:, None] == 0) & (tl.arange(0, BT)[None, :] >= 0)).to(dt)  # [16, BT]: ones in row 0
    ub16 = tl.zeros([16, BD], dtype=tl.float32)
    lr_next = _load_lr(lr_ptr + lbase, seg * TILES_PER_SEG * BT + tl.arange(0, BT), stride_lt, T)
    if DECAY:
        lg = tl.load(lg_ptr + h).to(tl.float32)
        seg_start = seg * TILES_PER_SEG * BT
        last_mb = (tl.minimum((seg + 1) * TILES_PER_SEG * BT, T_DONE) - seg_start) // MB - 1
    for i in range(TILES_PER_SEG):
        rows = (seg * TILES_PER_SEG + i) * BT + tl.arange(0, BT)
        row_ok = rows < T
        lr = lr_next
        lr_next = _load_lr(lr_ptr + lbase, rows + BT, stride_lt, T)  # (the segment's end: read, unused)
        k, vh = _parallel_tile_values(k_ptr + base, v_ptr + base, lr, rows, cols, stride_t,
                                      row_ok, d_ok, w0, b0, gamma, beta, D, PREC, EVEN)
        vh_out = vh_ptr + bh.to(tl.int64) * T * D + rows[:, None] * D + cols[None, :]
        if EVEN:
            tl.store(vh_out, vh.to(dt))
        else:
            tl.store(vh_out, vh.to(dt), mask=row_ok[:, None] & d_ok[None, :])
            vh = tl.where((rows < T_DONE)[:, None], vh, 0.0)  # an unfinished mini-batch is not committed
        if DECAY:
            vh = vh * tl.exp2(lg * (last_mb - (rows - seg_start) // MB).to(tl.float32))[:, None]
        vh_dt = vh.to(dt)
        uw += tl.dot(tl.trans(k), vh_dt, input_precision=PREC)  # [BD, BD]
        ub16 += tl.dot(row0, vh_dt, input_precision=PREC)  # [16, BD]: row 0 holds the column sums
    ub = tl.sum(ub16, axis=0)  # once a segment (rows 1..15 are zero: exact)
    out = u_ptr + (bh * NSEG + seg).to(tl.int64) * (D + 1) * D
    tl.store(out + cols[:, None] * D + cols[None, :], uw, mask=w_ok)
    tl.store(out + D * D + cols, ub, mask=d_ok)


@triton.autotune(configs=_configs(PARALLEL_CONFIGS), key=["D", "BT", "MB"])
@triton.jit
def _parallel_out_kernel(q_ptr, k_ptr, gamma_ptr, beta_ptr, eta_ptr, u_ptr, vh_ptr, s_in_ptr, o_ptr, s_out_ptr,
                         a_out_ptr, s0_ptr, lg_ptr, T, T_DONE, H, TILES_PER_SEG, NSEG, LAST_SEG, stride_sb,
                         stride_b, stride_h, stride_t, stride_ob, stride_oh, stride_ot,
                         D: tl.constexpr, BD: tl.constexpr, BT: tl.constexpr, MB: tl.constexpr,
                         PREC: tl.constexpr, EVEN: tl.constexpr = False, DECAY: tl.constexpr = False):
    """Pass 2: outputs q + LN(Zbar) of one segment, starting from S + eta_b * (sums before it),
    with the values pass 1 stored. Each tile's bias increment (its committed values' column sums)
    from a product with a block of ones. The chunk mask is built once: every tile starts at a
    mini-batch boundary, so all have the same one; it is applied with one multiply-add. EVEN: no
    tile needs a mask (see _parallel_plan). DECAY: the decayed form (the module docstring says how)."""
    bh, seg = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    cols = tl.arange(0, BD)
    d_ok = cols < D
    w_ok = d_ok[:, None] & d_ok[None, :]
    dt = q_ptr.dtype.element_ty
    sq = cols[:, None] * D + cols[None, :]  # [BD, BD] offsets of W inside a [D+1, D] state
    gamma = tl.load(gamma_ptr + h * D + cols, mask=d_ok, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + h * D + cols, mask=d_ok, other=0.0).to(tl.float32)
    eta_last = tl.load(eta_ptr + MB - 1).to(tl.float32)
    # the running state: S, plus every earlier segment's committed increments
    s_in = s_in_ptr + b.to(tl.int64) * stride_sb + h * (D + 1) * D
    rw = tl.load(s_in + sq, mask=w_ok, other=0.0).to(tl.float32)  # [BD, BD]
    rb = tl.load(s_in + D * D + cols, mask=d_ok, other=0.0).to(tl.float32)  # [BD]
    if DECAY:  # S0 (what the state decays towards) and gamma's powers
        lg = tl.load(lg_ptr + h).to(tl.float32)
        w0 = tl.load(s0_ptr + h * (D + 1) * D + sq, mask=w_ok, other=0.0).to(tl.float32)
        b0 = tl.load(s0_ptr + h * (D + 1) * D + D * D + cols, mask=d_ok, other=0.0).to(tl.float32)
        seg_carry = tl.exp2(lg * (TILES_PER_SEG * (BT // MB)))  # a whole segment's mini-batches
    for s in range(seg):
        u = u_ptr + (bh * NSEG + s).to(tl.int64) * (D + 1) * D
        if DECAY:
            rw = w0 + seg_carry * (rw - w0)
            rb = b0 + seg_carry * (rb - b0)
        rw += eta_last * tl.load(u + sq, mask=w_ok, other=0.0)
        rb += eta_last * tl.load(u + D * D + cols, mask=d_ok, other=0.0)
    base = b.to(tl.int64) * stride_b + h * stride_h
    obase = b.to(tl.int64) * stride_ob + h * stride_oh
    st = bh.to(tl.int64) * (D + 1) * D  # this (sequence, head)'s S and A
    row0 = ((tl.arange(0, 16)[:, None] == 0) & (tl.arange(0, BT)[None, :] >= 0)).to(dt)  # [16, BT]: ones in row 0
    if DECAY:
        mask = _decayed_chunk_mask(BT, eta_ptr, MB, lg)
        mb = (tl.arange(0, BT) // MB).to(tl.float32)  # each row's mini-batch in its tile
    else:
        mask = _chunk_mask(BT, eta_ptr, MB)  # [BT, BT], the same every tile
    for i in range(TILES_PER_SEG):
        tile = seg * TILES_PER_SEG + i
        rows = tile * BT + tl.arange(0, BT)
        row_ok = rows < T
        ok = row_ok[:, None] & d_ok[None, :]
        # (kept in the input dtype: EVEN uses them as loaded, with no copy through registers)
        k = _load_tile(k_ptr + base, rows, stride_t, cols, ok, EVEN)
        vh = _load_tile(vh_ptr + bh.to(tl.int64) * T * D, rows, D, cols, ok, EVEN)
        q = _load_tile(q_ptr + base, rows, stride_t, cols, ok, EVEN)
        p = tl.fma(tl.dot(q, tl.trans(k), input_precision=PREC), mask, mask)  # [BT, BT] = (qa . ka) * M
        if DECAY:  # row r reads S0 + gamma^(its mini-batch in the tile) (S - S0)
            learned = tl.dot(q, (rw - w0).to(dt), input_precision=PREC) + (rb - b0)[None, :]
            zbar = tl.dot(q, w0.to(dt), input_precision=PREC) + b0[None, :] + tl.exp2(lg * mb)[:, None] * learned
        else:
            zbar = tl.dot(q, rw.to(dt), input_precision=PREC) + rb[None, :]
        zbar += tl.dot(p.to(dt), vh.to(dt), input_precision=PREC)  # [BT, BD]
        out = _ln_out(q.to(tl.float32), zbar, gamma, beta, d_ok, D)
        o_tile = o_ptr + obase + rows[:, None] * stride_ot + cols[None, :]
        if EVEN:
            tl.store(o_tile, out.to(dt))
            vh_done = vh  # every token's mini-batch is complete
        else:
            tl.store(o_tile, out.to(dt), mask=ok)
            vh_done = tl.where((rows < T_DONE)[:, None], vh.to(tl.float32), 0.0)
        if DECAY:  # the tile's c committed mini-batches: S -> S0 + gamma^c (S - S0) + eta_b sum gamma^(c-1-j) U_j
            c = (tl.minimum(tl.maximum(T_DONE - tile * BT, 0), BT) // MB).to(tl.float32)
            vh_done = vh_done.to(tl.float32) * tl.exp2(lg * (c - 1.0 - mb))[:, None]
            rw = w0 + tl.exp2(lg * c) * (rw - w0)
            rb = b0 + tl.exp2(lg * c) * (rb - b0)
        vh_done_dt = vh_done.to(dt)
        rw += eta_last * tl.dot(tl.trans(k), vh_done_dt, input_precision=PREC)
        # row 0 of the product: a sum over 16 rows of which 15 are zero (exact)
        rb += eta_last * tl.sum(tl.dot(row0, vh_done_dt, input_precision=PREC), axis=0)
        if not EVEN:  # (EVEN: no unfinished mini-batch, A is zero)
            if (tile * BT < T) & ((tile + 1) * BT >= T):  # the last tile: its unfinished mini-batch is A
                vh_open = tl.where((row_ok & (rows >= T_DONE))[:, None], vh.to(tl.float32), 0.0)  # (written
                tl.store(a_out_ptr + st + sq, tl.dot(tl.trans(k), vh_open.to(dt), input_precision=PREC),
                         mask=w_ok)  # here, not accumulated in the loop: fewer live registers)
                tl.store(a_out_ptr + st + D * D + cols, tl.sum(vh_open, axis=0), mask=d_ok)
    if seg == LAST_SEG:
        tl.store(s_out_ptr + st + sq, rw, mask=w_ok)
        tl.store(s_out_ptr + st + D * D + cols, rb, mask=d_ok)
        if EVEN:
            tl.store(a_out_ptr + st + sq, tl.zeros([BD, BD], dtype=tl.float32), mask=w_ok)
            tl.store(a_out_ptr + st + D * D + cols, tl.zeros([BD], dtype=tl.float32), mask=d_ok)


def _same_layout(q, k, v):
    """q, k, v with one set of strides and a contiguous last dim (the kernels share their strides)."""
    if q.stride(-1) == 1 and q.stride() == k.stride() == v.stride():
        return q, k, v
    return q.contiguous(), k.contiguous(), v.contiguous()


def _precision(dtype):
    return "ieee" if dtype == torch.float32 else "tf32"


def _head_start(fn_ref, q, k, v, lr, S0, gamma, beta, eta_tok, start, S, A):
    """Run the tokens before the first mini-batch boundary through the reference.
    Returns (head output or None, number of tokens done, S, A) with S, A ready for the kernel."""
    b, T = eta_tok.shape[0], q.shape[2]
    lead = (-start) % b
    if lead == 0 and A is not None:  # A at a boundary counts as part of the next mini-batch
        lead = b  # (callers that know A is zero there pass None: no reference step, no sync)
    lead = min(lead, T)
    if lead == 0:  # (no zeros for A, no copy of a broadcast S0: a launch each, measured in the operator's time)
        return None, 0, _start_state(q, S0, S), None
    S, A = _fresh_state(q, S0, S, A)
    out, S, A = fn_ref(q[:, :, :lead], k[:, :, :lead], v[:, :, :lead], lr[:, :, :lead], S0, gamma, beta,
                       eta_tok, start, S, A)
    return out.to(q.dtype), lead, S, A


def _with_head(kernel, fn_ref, q, k, v, lr, S0, gamma, beta, eta_tok, start, S, A):
    head, lead, S, A = _head_start(fn_ref, q, k, v, lr, S0, gamma, beta, eta_tok, start, S, A)
    if lead == q.shape[2]:
        return head, S, A
    S = S if S[0].is_contiguous() else S.contiguous()  # the kernels step through sequences by S.stride(0)
    if head is None:  # (no views to make: the Python before the first launch counts in the operator's time)
        return kernel(q, k, v, lr, S0, gamma, beta, eta_tok, S)
    sl = slice(lead, None)
    out, S, A = kernel(q[:, :, sl], k[:, :, sl], v[:, :, sl], lr[:, :, sl], S0, gamma, beta, eta_tok, S)
    return torch.cat((head, out), dim=2), S, A


@functools.lru_cache  # (on the operator's path: a scan of the divisors each call would cost tens of us)
def _tiles_per_segment(tiles, segments, prefer_whole=False):
    """Tiles a segment for about `segments` segments. prefer_whole: the count nearest to that which
    divides `tiles` (the fewest segments away; on a tie the more), if one is within half: the
    unmasked kernels need whole segments, and the segment count that fills a GPU rarely divides."""
    per = cdiv(tiles, segments)
    if prefer_whole:
        whole = [n for n in range(1, tiles + 1) if tiles % n == 0]
        nearest = min(whole, key=lambda n: (abs(tiles // n - segments), -(tiles // n)), default=per)
        if abs(tiles // nearest - segments) * 2 <= segments:
            return nearest
    return per


@functools.lru_cache
def _multiprocessors(index):
    return torch.cuda.get_device_properties(index).multi_processor_count


@dataclasses.dataclass(frozen=True)
class ParallelPlan:
    """How the parallel kernels cut a sequence: tiles of BT tokens (BD columns), `per_seg` tiles a
    segment, `segments` segments; t_done tokens in whole mini-batches; `even`: no tile needs a mask."""

    BT: int
    BD: int
    per_seg: int
    segments: int
    t_done: int
    even: bool


def _parallel_plan(q, eta_tok, tile=64, segments=None) -> ParallelPlan:
    """`tile`: tokens a tile (at least the mini-batch); `segments`: None for enough programs to fill
    the GPU (about 4 per multiprocessor, measured best), preferring a count that divides the tiles."""
    B, H, T, D = q.shape
    MB = eta_tok.shape[0]
    BT = max(tile, MB)
    assert BT % MB == 0 and MB & (MB - 1) == 0, "the mini-batch size must be a power of two dividing the tile"
    BD = max(16, next_power_of_2(D))
    tiles = cdiv(T, BT)
    if segments is None:
        sms = _multiprocessors(q.device.index) if q.is_cuda else 4
        per_seg = _tiles_per_segment(tiles, max(1, min(tiles, 4 * sms // (B * H))), prefer_whole=True)
    else:
        per_seg = _tiles_per_segment(tiles, segments)
    t_done = T - T % MB
    # no tile of either pass needs a mask: whole segments, mini-batches and head dims
    even = T % BT == 0 and tiles % per_seg == 0 and t_done == T and BD == D
    return ParallelPlan(BT, BD, per_seg, cdiv(tiles, per_seg), t_done, even)


def _parallel_pass1(q, k, v, lr, S0, gamma, beta, plan: ParallelPlan, MB: int = 16, lg=None):
    """The values of every token ([B*H, T, D], q's dtype) and each segment's committed sums U
    ([B*H, segments, D+1, D] fp32; decayed to the segment's end with `lg`, log2 gamma [H]).
    (Benchmarks time it alone.)"""
    B, H, T, D = q.shape
    U = fresh(torch.empty(B * H, plan.segments, D + 1, D, device=q.device, dtype=torch.float32))
    vh = fresh(torch.empty(B * H, T, D, device=q.device, dtype=q.dtype))
    sb, sh, st, _ = q.stride()
    _parallel_sums_kernel[(B * H, plan.segments)](k, v, lr, S0, gamma, beta, gamma if lg is None else lg, U, vh, T,
                                                  plan.t_done, H, plan.per_seg, plan.segments, sb, sh, st,
                                                  *lr.stride(), D=D, BD=plan.BD, BT=plan.BT, MB=MB,
                                                  PREC=_precision(q.dtype), EVEN=plan.even, DECAY=lg is not None)
    return U, vh


def _parallel_pass2(q, k, gamma, beta, eta_tok, S, U, vh, plan: ParallelPlan, S0=None, lg=None):
    B, H, T, D = q.shape
    f32 = dict(device=q.device, dtype=torch.float32)
    S_out, A_out = fresh(torch.empty(B, H, D + 1, D, **f32)), fresh(torch.empty(B, H, D + 1, D, **f32))
    o = fresh(torch.empty_like(q))
    decay = (S0, lg) if lg is not None else (gamma, gamma)  # (unread without DECAY)
    _parallel_out_kernel[(B * H, plan.segments)](q, k, gamma, beta, eta_tok.float().contiguous(), U, vh, S, o, S_out,
                                                 A_out, *decay, T, plan.t_done, H, plan.per_seg, plan.segments,
                                                 plan.segments - 1, S.stride(0), *q.stride()[:3], *o.stride()[:3],
                                                 D=D, BD=plan.BD, BT=plan.BT, MB=eta_tok.shape[0],
                                                 PREC=_precision(q.dtype), EVEN=plan.even, DECAY=lg is not None)
    return o, S_out, A_out


def _parallel_aligned(q, k, v, lr, S0, gamma, beta, eta_tok, S, tile=64, segments=None, decay=None):
    """Both passes from a mini-batch boundary (`tile`, `segments`: see _parallel_plan; the tests
    choose them to run several segments on small inputs; `decay`: gamma [H] of a decayed form)."""
    plan = _parallel_plan(q, eta_tok, tile, segments)
    # (pass 1 launches first, pass 2's outputs are made while it runs: the GPU idles until then)
    gamma, beta, S0 = gamma.float().contiguous(), beta.float().contiguous(), S0.float().contiguous()
    lg = None if decay is None else torch.log2(decay.float().clamp_min(1e-30)).contiguous()
    U, vh = _parallel_pass1(q, k, v, lr, S0, gamma, beta, plan, eta_tok.shape[0], lg)
    return _parallel_pass2(q, k, gamma, beta, eta_tok, S, U, vh, plan, S0, lg)


def parallel(q, k, v, lr, S0, gamma, beta, eta_tok, start=0, S=None, A=None, decay=None):
    """`decay`: gamma [H] of a decayed parallel form (`la.Decay` towards S0), or None."""
    q, k, v = _same_layout(q, k, v)
    return _with_head(functools.partial(_parallel_aligned, decay=decay), functools.partial(parallel_ref, decay=decay),
                      q, k, v, lr, S0, gamma, beta, eta_tok, start, S, A)


# ---- exact form -------------------------------------------------------------------------------------

@triton.autotune(configs=_configs(EXACT_CONFIGS), key=["D", "MB"])
@triton.jit
def _exact_kernel(q_ptr, k_ptr, v_ptr, lr_ptr, gamma_ptr, beta_ptr, eta_ptr, s_in_ptr, o_ptr,
                  s_out_ptr, a_out_ptr, states_ptr, s0_ptr, T, H, stride_sb,
                  stride_b, stride_h, stride_t, stride_lb, stride_lh, stride_lt,
                  stride_ob, stride_oh, stride_ot,
                  D: tl.constexpr, BD: tl.constexpr, MB: tl.constexpr, BM: tl.constexpr, PREC: tl.constexpr,
                  STORE_STATES: tl.constexpr = False, TWO_LEVEL: tl.constexpr = False):
    """One (sequence, head): mini-batch after mini-batch, values at the boundary state (W, wb).
    A mini-batch is a tile of BM >= 16 rows (tl.dot's least), of which the first MB are real.
    With STORE_STATES every boundary state is written to states [B*H, T/MB, D+1, D] (for the
    backward of ops/linear_attention/train.py). With TWO_LEVEL the int12 state format: the keys and values that
    attend and commit rounded to float16 (its open mini-batch's buffers), and every commit's state
    rounded to the format's grid around S0 (s0_ptr [H, D+1, D]), a step a row."""
    bh = tl.program_id(0)
    b, h = bh // H, bh % H
    cols = tl.arange(0, BD)
    d_ok = cols < D
    w_ok = d_ok[:, None] & d_ok[None, :]
    dt = q_ptr.dtype.element_ty
    sq = cols[:, None] * D + cols[None, :]
    gamma = tl.load(gamma_ptr + h * D + cols, mask=d_ok, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + h * D + cols, mask=d_ok, other=0.0).to(tl.float32)
    eta_last = tl.load(eta_ptr + MB - 1).to(tl.float32)
    s_in = s_in_ptr + b.to(tl.int64) * stride_sb + h * (D + 1) * D
    w = tl.load(s_in + sq, mask=w_ok, other=0.0).to(tl.float32)  # [BD, BD] the boundary state
    wb = tl.load(s_in + D * D + cols, mask=d_ok, other=0.0).to(tl.float32)  # [BD]
    base = b.to(tl.int64) * stride_b + h * stride_h
    lbase = b.to(tl.int64) * stride_lb + h * stride_lh
    obase = b.to(tl.int64) * stride_ob + h * stride_oh
    inner = tl.arange(0, BM)
    mask = _chunk_mask(BM, eta_ptr, MB)  # [BM, BM]: one mini-batch's M (rows >= MB unused)
    aw = tl.zeros([BD, BD], dtype=tl.float32)
    ab = tl.zeros([BD], dtype=tl.float32)
    if TWO_LEVEL:
        w0 = tl.load(s0_ptr + h * (D + 1) * D + sq, mask=w_ok, other=0.0).to(tl.float32)
        b0 = tl.load(s0_ptr + h * (D + 1) * D + D * D + cols, mask=d_ok, other=0.0).to(tl.float32)
    for start in range(0, T, MB):
        if STORE_STATES:
            at = states_ptr + (bh.to(tl.int64) * tl.cdiv(T, MB) + start // MB) * (D + 1) * D
            tl.store(at + sq, w, mask=w_ok)
            tl.store(at + D * D + cols, wb, mask=d_ok)
        rows = start + inner
        row_ok = (rows < T) & (inner < MB)
        ok = row_ok[:, None] & d_ok[None, :]
        q = _load_tile(q_ptr + base, rows, stride_t, cols, ok)  # [BM, BD]
        k = _load_tile(k_ptr + base, rows, stride_t, cols, ok)
        v = _load_tile(v_ptr + base, rows, stride_t, cols, ok).to(tl.float32)
        lr = tl.load(lr_ptr + lbase + rows * stride_lt, mask=row_ok, other=0.0).to(tl.float32)
        w_dt = w.to(dt)
        z = tl.dot(k, w_dt, input_precision=PREC) + wb[None, :]
        vh = _ln_l2_values(z, k.to(tl.float32), v, lr, gamma, beta, d_ok, D)
        vh = tl.where(row_ok[:, None], vh, 0.0)
        if TWO_LEVEL:
            k = k.to(tl.float16).to(dt)
            vh = vh.to(tl.float16).to(tl.float32)
        p = (tl.dot(q, tl.trans(k), input_precision=PREC) + 1.0) * mask
        zbar = tl.dot(q, w_dt, input_precision=PREC) + wb[None, :] + tl.dot(p.to(dt), vh.to(dt), input_precision=PREC)
        out = _ln_out(q.to(tl.float32), zbar, gamma, beta, d_ok, D)
        tl.store(o_ptr + obase + rows[:, None] * stride_ot + cols[None, :], out.to(dt), mask=ok)
        uw = tl.dot(tl.trans(k), vh.to(dt), input_precision=PREC)
        ub = tl.sum(vh, axis=0)
        if start + MB <= T:  # a whole mini-batch: commit
            w += eta_last * uw
            wb += eta_last * ub
            if TWO_LEVEL:
                w = w0 + _two_level_rows(w - w0)
                wb = b0 + tl.sum(_two_level_rows((wb - b0)[None, :]), axis=0)  # (one row: its own step)
        else:  # the unfinished last one stays in A
            aw, ab = uw, ub
    st = bh.to(tl.int64) * (D + 1) * D
    tl.store(s_out_ptr + st + sq, w, mask=w_ok)
    tl.store(s_out_ptr + st + D * D + cols, wb, mask=d_ok)
    tl.store(a_out_ptr + st + sq, aw, mask=w_ok)
    tl.store(a_out_ptr + st + D * D + cols, ab, mask=d_ok)


def _exact_aligned(q, k, v, lr, S0, gamma, beta, eta_tok, S, states=None, precision=None, two_level=False):
    """The exact kernel from a mini-batch boundary; `states` ([B*H, T/MB, D+1, D] fp32), when given,
    receives every boundary state; `precision` of the dots (default: `_precision(q.dtype)`);
    `two_level`: the int12 state format (see `exact`)."""
    B, H, T, D = q.shape
    MB = eta_tok.shape[0]
    assert MB & (MB - 1) == 0, "the exact kernel needs a power-of-two mini-batch size"
    BD = max(16, next_power_of_2(D))
    f32 = dict(device=q.device, dtype=torch.float32)
    S_out, A_out = fresh(torch.empty(B, H, D + 1, D, **f32)), fresh(torch.empty(B, H, D + 1, D, **f32))
    o = fresh(torch.empty_like(q))
    gamma, beta, eta = gamma.float().contiguous(), beta.float().contiguous(), eta_tok.float().contiguous()
    _exact_kernel[(B * H,)](q, k, v, lr, gamma, beta, eta, S, o, S_out, A_out, S_out if states is None else states,
                            S0.float().contiguous() if two_level else S_out, T, H, S.stride(0), *q.stride()[:3],
                            *lr.stride(), *o.stride()[:3], D=D, BD=BD, MB=MB, BM=max(16, MB),
                            PREC=precision or _precision(q.dtype), STORE_STATES=states is not None,
                            TWO_LEVEL=two_level)
    return o, S_out, A_out


def exact(q, k, v, lr, S0, gamma, beta, eta_tok, start=0, S=None, A=None, two_level=False):
    """`two_level`: the int12 state format (`formats.state_formats`): each commit's S rounded to its grid
    around S0, every token's ka and vh read as float16 (A, the unfinished mini-batch's sum, stays float)."""
    q, k, v = _same_layout(q, k, v)
    return _with_head(functools.partial(_exact_aligned, two_level=two_level),
                      functools.partial(exact_ref, two_level=two_level), q, k, v, lr, S0, gamma, beta, eta_tok,
                      start, S, A)
