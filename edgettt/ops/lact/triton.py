"""Kernels of LaCT's W1-only parallel form (a linear attention with a learned feature map and a
chunk-exclusive mask, DESIGN section 4.1) and of its decode step, each with its plain-torch reference
(`reference.py`) of the same signature.

    features(x, w0, w2, rate)       phi = silu(x W0^T) * (x W2^T) * rate
        x [B, H, T, d] (last dim contiguous); w0, w2 [H, dh, d], or both `LowRank` (W = left right + I / 2,
        LaCT's low-rank initial weights: the product is never formed, x right^T left^T costs 2 r (d + dh)
        a token instead of 2 d dh); rate None, [B, H, T, 1] or [B, H, T, dh]
        returns phi [B, H, T, dh] in x's dtype
    chunk_attention(phi_q, keys, v, w1, u0, d_in, m, chunk, front)
        the padded text is `front` empty slots, then the T tokens, then empty slots up to N whole chunks;
        U_n = sum_{j in chunk n} v_j keys_j^T (+ u0 for n = 0)     D_n = U_n + m_n D_{n-1}  (D_-1 = d_in)
        W_c = w1 + sum_{n<c} D_n                                   out_t = W_{c(t)} phi_q_t
        phi_q, keys [B, H, T, dh]; v [B, H, T, dv]; w1, u0, d_in [B, H, dv, dh] float32; m [B, H, N]
        float32, or None (no momentum: D_n = U_n, and d_in is not read)
        returns out [B, H, T, dv] (v's dtype) and the ends {"w": W_N (every chunk added), "w_open":
        W_{N-1}, "u": U_{N-1}, "d": D_{N-1}, "d_prev": D_{N-2} (d_in when N = 1)}, float32
    chunk_momenta(gates, gate_in, chunk, front)
        m [B, H, N]: each chunk's mean momentum gate (the gate sum carried in, gate_in [B, H], joins chunk
        0), and the last chunk's gate sum [B, H] (what the decode state carries); gates [B, H, T] float32
    decode_step(phi_q, key, v, w1, g1, d, m, commit)
        out = W1 phi_q;  G += v key^T;  if commit: D = G + m D; W1 += D; G = 0  (W1, G, D updated in place)
        phi_q, key [B, H, dh]; v [B, H, dv]; w1, g1 [B, H, dv, dh] float32; d [B, H, dv, dh] and
        m [B, H] float32, or None (no momentum: D = G)

The prefill is six launches (the feature map twice, the chunks' momenta, then three passes of the
chunk-exclusive attention), few small tensor operations around them (the host's time per launch is
comparable to a pass's GPU time at the paper's shape): the per-chunk sums U (every chunk at once: a batched GEMM over the chunk's tokens), the
scan over chunks (each program owns a block of state elements and walks the N chunks: the only
sequential part, N = T / 2048 steps at the paper's shape) and the output (a GEMM of each chunk's
features against its chunk's weights; cuBLAS's batched GEMM where the text is whole chunks from a chunk
boundary in 16-bit inputs, 0.076 against 0.120 ms for the Triton pass at the paper's shape: benchmarks/results/lact_h200.md).
Only the scan keeps float32 state; the per-chunk weights it
hands the output pass are in the inputs' dtype (the tensor cores' input).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edgettt.ops.common import autotune_configs, cdiv, fresh, next_power_of_2
from edgettt.ops.lact import parallel
from edgettt.ops.lact.reference import (LowRank, chunk_attention_ref, chunk_count,  # noqa: F401 (beside their kernels)
                        chunk_momenta_ref, decode_step_ref, features_ref, momentum_coefficients, padded_chunks,
                        project_ref)

# ---- kernels ------------------------------------------------------------------------------------------

def _precision(dtype):
    return "ieee" if dtype == torch.float32 else "tf32"


def _configs(configs, **interpreter):
    return autotune_configs(configs, [triton.Config(interpreter, num_warps=4)])


FEATURE_CONFIGS = [triton.Config({"BT": bt, "BN": bn, "BK": bk}, num_warps=w, num_stages=s)  # the first fits fp32
                   for bt, bn, bk, w, s in [(128, 64, 64, 4, 3), (128, 128, 64, 8, 3), (64, 128, 64, 4, 3),
                                            (128, 128, 128, 8, 2), (64, 64, 64, 4, 3), (128, 256, 64, 8, 2),
                                            (256, 128, 64, 8, 2), (128, 128, 64, 4, 4), (128, 128, 32, 8, 4),
                                            (256, 64, 64, 8, 3), (32, 64, 64, 4, 3)]]


@triton.autotune(configs=_configs(FEATURE_CONFIGS, BT=16, BN=16, BK=16), key=["ROWS", "D", "DH", "RATE"])
@triton.jit
def _features_kernel(x_ptr, w0_ptr, w2_ptr, r_ptr, o_ptr, ROWS, T, H, D, DH, sxb, sxh, sxt, srb, srh, srt,
                     RATE: tl.constexpr, PREC: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr,
                     BK: tl.constexpr):
    """One [BT rows, BN features] tile of one head, a row being one (sequence, token) (so that a decode
    step, one token of B sequences, is one GEMM of B rows a head): two products over d on the tensor
    cores, the SwiGLU and the rate in the epilogue. RATE: 0 none, 1 one a token, 2 one a feature."""
    pid, pn = tl.program_id(0), tl.program_id(1)
    tiles = tl.cdiv(ROWS, BT)
    h, tb = pid // tiles, pid % tiles
    r = tb * BT + tl.arange(0, BT)
    n = pn * BN + tl.arange(0, BN)
    r_ok, n_ok = r < ROWS, n < DH
    b, t = r // T, r % T
    x_row = x_ptr + b * sxb + h * sxh + t * sxt
    w_row = w0_ptr + h * DH * D + n[:, None] * D  # [BN, BK] tiles of W0, W2 (rows contiguous), used transposed
    w2_row = w2_ptr + h * DH * D + n[:, None] * D
    gate = tl.zeros([BT, BN], dtype=tl.float32)
    up = tl.zeros([BT, BN], dtype=tl.float32)
    for k0 in range(0, D, BK):
        k = k0 + tl.arange(0, BK)
        k_ok = k < D
        x = tl.load(x_row[:, None] + k[None, :], mask=r_ok[:, None] & k_ok[None, :], other=0.0)
        w_mask = n_ok[:, None] & k_ok[None, :]
        w0 = tl.load(w_row + k[None, :], mask=w_mask, other=0.0)
        w2 = tl.load(w2_row + k[None, :], mask=w_mask, other=0.0)
        gate = tl.dot(x, tl.trans(w0), gate, input_precision=PREC)
        up = tl.dot(x, tl.trans(w2), up, input_precision=PREC)
    phi = _rated(gate * tl.sigmoid(gate) * up, r_ptr + b * srb + h * srh + t * srt, r_ok, n, n_ok, RATE)
    tl.store(o_ptr + ((b * H + h) * T + t)[:, None] * DH + n[None, :], phi.to(o_ptr.dtype.element_ty),
             mask=r_ok[:, None] & n_ok[None, :])


@triton.jit
def _low_rank_codes(x_row, r_ok, h, D, R, r0_ptr, r2_ptr, PREC: tl.constexpr, BT: tl.constexpr, BR: tl.constexpr,
                    BK: tl.constexpr):
    """y0, y2 [BT, BR] = x right^T of W0's and of W2's factors for BT rows (x_row: each row's first element),
    over d in BK steps; columns past r are 0. In x's dtype (the next product's input)."""
    j = tl.arange(0, BR)
    j_ok = j < R
    y0 = tl.zeros([BT, BR], dtype=tl.float32)
    y2 = tl.zeros([BT, BR], dtype=tl.float32)
    for k0 in range(0, D, BK):
        k = k0 + tl.arange(0, BK)
        k_ok = k < D
        x = tl.load(x_row[:, None] + k[None, :], mask=r_ok[:, None] & k_ok[None, :], other=0.0)
        right = h * R * D + j[None, :] * D + k[:, None]  # [BK, BR]: right^T
        mask = k_ok[:, None] & j_ok[None, :]
        y0 = tl.dot(x, tl.load(r0_ptr + right, mask=mask, other=0.0), y0, input_precision=PREC)
        y2 = tl.dot(x, tl.load(r2_ptr + right, mask=mask, other=0.0), y2, input_precision=PREC)
    return y0.to(x_row.dtype.element_ty), y2.to(x_row.dtype.element_ty)


@triton.jit
def _low_rank_phi(y0, y2, x_row, r_ok, h, n, D, DH, R, l0_ptr, l2_ptr, PREC: tl.constexpr, BR: tl.constexpr):
    """phi [BT, BN] (float32) of features n: silu(y0 left0^T + x / 2) * (y2 left2^T + x / 2), the rows'
    codes y0, y2 from `_low_rank_codes` (x I^T: x's own column n, 0 past d)."""
    j = tl.arange(0, BR)
    n_ok = n < DH
    left = h * DH * R + n[None, :] * R + j[:, None]  # [BR, BN]: left^T
    mask = (j < R)[:, None] & n_ok[None, :]
    own = tl.load(x_row[:, None] + n[None, :], mask=r_ok[:, None] & (n < D)[None, :], other=0.0).to(tl.float32)
    gate = tl.dot(y0, tl.load(l0_ptr + left, mask=mask, other=0.0), own * 0.5, input_precision=PREC)
    up = tl.dot(y2, tl.load(l2_ptr + left, mask=mask, other=0.0), own * 0.5, input_precision=PREC)
    return gate * tl.sigmoid(gate) * up


@triton.jit
def _rated(phi, r_row, r_ok, n, n_ok, RATE: tl.constexpr):
    """phi times the rows' rates: RATE 0 none, 1 one a row (r_row: each row's rate), 2 one a feature."""
    if RATE == 1:
        phi = phi * tl.load(r_row, mask=r_ok, other=0.0).to(tl.float32)[:, None]
    if RATE == 2:
        phi = phi * tl.load(r_row[:, None] + n[None, :], mask=r_ok[:, None] & n_ok[None, :], other=0.0).to(tl.float32)
    return phi


LOW_RANK_CONFIGS = [triton.Config({"BT": bt, "BN": bn, "BK": bk}, num_warps=w, num_stages=s)
                    for bt, bn, bk, w, s in [(64, 64, 64, 4, 3), (64, 128, 128, 4, 3), (64, 64, 64, 8, 3),
                                             (128, 64, 64, 4, 3), (32, 64, 128, 2, 2)]]


@triton.autotune(configs=_configs(LOW_RANK_CONFIGS, BT=16, BN=16, BK=16), key=["ROWS", "D", "DH", "R", "RATE"])
@triton.jit
def _low_rank_features_kernel(x_ptr, l0_ptr, r0_ptr, l2_ptr, r2_ptr, rt_ptr, o_ptr, ROWS, T, H, D, DH, R,
                              sxb, sxh, sxt, srb, srh, srt, RATE: tl.constexpr, PREC: tl.constexpr,
                              BR: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """BT rows of one head, every feature: the rows' codes (r columns, once), then BN features at a time.
    (Splitting a row tile's features over programs, for more programs in flight, was measured: never
    faster at the 760M shape, benchmarks/results/lact_h200.md.)"""
    pid = tl.program_id(0)
    tiles = tl.cdiv(ROWS, BT)
    h, tb = pid // tiles, pid % tiles
    r = tb * BT + tl.arange(0, BT)
    r_ok = r < ROWS
    b, t = r // T, r % T
    x_row = x_ptr + b * sxb + h * sxh + t * sxt
    y0, y2 = _low_rank_codes(x_row, r_ok, h, D, R, r0_ptr, r2_ptr, PREC, BT, BR, BK)
    r_row = rt_ptr + b * srb + h * srh + t * srt
    for n0 in range(0, DH, BN):
        n = n0 + tl.arange(0, BN)
        n_ok = n < DH
        phi = _low_rank_phi(y0, y2, x_row, r_ok, h, n, D, DH, R, l0_ptr, l2_ptr, PREC, BR)
        phi = _rated(phi, r_row, r_ok, n, n_ok, RATE)
        tl.store(o_ptr + ((b * H + h) * T + t)[:, None] * DH + n[None, :], phi.to(o_ptr.dtype.element_ty),
                 mask=r_ok[:, None] & n_ok[None, :])


def features(x, w0, w2, rate=None):
    B, H, T, D = x.shape
    low_rank = isinstance(w0, LowRank)
    assert low_rank == isinstance(w2, LowRank), "features takes W0 and W2 both dense or both LowRank"
    DH = (w0.left if low_rank else w0).shape[1]
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = fresh(torch.empty(B, H, T, DH, device=x.device, dtype=x.dtype))
    kind = 0 if rate is None else (1 if rate.shape[-1] == 1 else 2)
    if rate is not None and rate.stride(-1) != 1:
        rate = rate.contiguous()
    r = rate if rate is not None else x
    rs = rate.stride()[:3] if rate is not None else (0, 0, 0)
    cast = lambda w: w.to(x.dtype).contiguous()  # noqa: E731  (the tensor cores' input dtype)
    common = dict(RATE=kind, PREC=_precision(x.dtype))
    if low_rank:
        assert LowRank.IDENTITY == 0.5, "the low-rank kernel adds x / 2"
        R = w0.left.shape[-1]
        grid = lambda meta: (H * cdiv(B * T, meta["BT"]),)  # noqa: E731
        _low_rank_features_kernel[grid](x, cast(w0.left), cast(w0.right), cast(w2.left), cast(w2.right), r, out,
                                        B * T, T, H, D, DH, R, *x.stride()[:3], *rs, BR=max(16, next_power_of_2(R)),
                                        **common)
        return out
    grid = lambda meta: (H * cdiv(B * T, meta["BT"]), cdiv(DH, meta["BN"]))  # noqa: E731
    _features_kernel[grid](x, cast(w0), cast(w2), r, out, B * T, T, H, D, DH, *x.stride()[:3], *rs, **common)
    return out


@triton.jit
def _token_rows(p, FRONT, T, stride_t):
    """Padded positions p -> (offset of the token's row, whether p holds a token)."""
    t = p - FRONT
    ok = (t >= 0) & (t < T)
    return tl.where(ok, t, 0) * stride_t, ok


SUM_CONFIGS = [triton.Config({"BV": bv, "BK": bk, "BT": bt}, num_warps=w, num_stages=s)
               for bv, bk, bt, w, s in [(128, 128, 64, 8, 3), (64, 128, 64, 4, 3), (128, 64, 64, 4, 3),
                                        (64, 64, 64, 4, 4), (128, 128, 32, 8, 4)]]


@triton.autotune(configs=_configs(SUM_CONFIGS, BV=16, BK=16, BT=32), key=["DV", "DH", "CHUNK"])
@triton.jit
def _chunk_sums_kernel(k_ptr, v_ptr, u_ptr, T, FRONT, N, DV, DH, skb, skt, svb, svh, svt, H,
                       CHUNK: tl.constexpr, PREC: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr,
                       BT: tl.constexpr):
    """U[bh, n][BV, BK] = sum over chunk n's tokens of v^T keys. A chunk's tiles are neighbouring programs,
    so that its tokens come from memory once (then from L2)."""
    tiles_v, tiles_k = tl.cdiv(DV, BV), tl.cdiv(DH, BK)
    pid, tile = tl.program_id(0) // (tiles_v * tiles_k), tl.program_id(0) % (tiles_v * tiles_k)
    pv, pk = tile // tiles_k, tile % tiles_k
    bh, n = pid // N, pid % N
    b, h = bh // H, bh % H
    cv = pv * BV + tl.arange(0, BV)
    ck = pk * BK + tl.arange(0, BK)
    v_ok, k_ok = cv < DV, ck < DH
    acc = tl.zeros([BV, BK], dtype=tl.float32)
    for i in range(0, CHUNK, BT):
        inner = i + tl.arange(0, BT)  # (a tile may be longer than a small chunk: the chunk's own tokens only)
        p = n * CHUNK + inner
        krow, ok = _token_rows(p, FRONT, T, skt)
        ok = ok & (inner < CHUNK)
        vrow, _ = _token_rows(p, FRONT, T, svt)
        kt = tl.load(k_ptr + bh * skb + krow[:, None] + ck[None, :], mask=ok[:, None] & k_ok[None, :], other=0.0)
        vt = tl.load(v_ptr + b * svb + h * svh + vrow[None, :] + cv[:, None], mask=v_ok[:, None] & ok[None, :],
                     other=0.0)  # [BV, BT]: v^T
        acc = tl.dot(vt.to(kt.dtype), kt, acc, input_precision=PREC)
    tl.store(u_ptr + (pid * DV + cv[:, None]) * DH + ck[None, :], acc, mask=v_ok[:, None] & k_ok[None, :])


@triton.jit
def _scan_step(u_ptr, m_ptr, wc_ptr, w, d, u0, bh, n, N, E, e, ok, MOMENTUM: tl.constexpr):
    """Chunk n: its sums U (with the carried sums at n = 0), D = U + m D, its weights W handed on, W + D."""
    u = tl.load(u_ptr + (bh * N + n) * E + e, mask=ok, other=0.0) + tl.where(n == 0, u0, 0.0)
    if MOMENTUM:
        d = u + tl.load(m_ptr + bh * N + n) * d
    else:
        d = u
    tl.store(wc_ptr + (bh * N + n) * E + e, w.to(wc_ptr.dtype.element_ty), mask=ok)
    return w + d, d, u


@triton.jit
def _chunk_scan_kernel(u_ptr, u0_ptr, w_ptr, din_ptr, m_ptr, wc_ptr, w_end_ptr, w_open_ptr, u_end_ptr, d_end_ptr,
                       d_prev_ptr, N, E, MOMENTUM: tl.constexpr, BLOCK: tl.constexpr):
    """Walk the chunks for BLOCK elements of one (sequence, head)'s state: D = U + m D, hand each
    chunk the weights from before it, add D."""
    bh, pe = tl.program_id(0), tl.program_id(1)
    e = pe * BLOCK + tl.arange(0, BLOCK)
    ok = e < E
    state = bh * E + e
    w = tl.load(w_ptr + state, mask=ok, other=0.0)
    d = tl.zeros([BLOCK], dtype=tl.float32)
    if MOMENTUM:
        d = tl.load(din_ptr + state, mask=ok, other=0.0)
    u0 = tl.load(u0_ptr + state, mask=ok, other=0.0)  # the unfinished sums carried in join chunk 0
    for n in range(N - 1):
        w, d, _ = _scan_step(u_ptr, m_ptr, wc_ptr, w, d, u0, bh, n, N, E, e, ok, MOMENTUM)
    # the last chunk outside the loop, so that the ends are plain values (compiled, copies of loop-carried
    # values taken inside the loop, `w_open = w` before `w = w + d`, came out wrong in bfloat16)
    d_prev, w_open = d, w
    w, d, u = _scan_step(u_ptr, m_ptr, wc_ptr, w, d, u0, bh, N - 1, N, E, e, ok, MOMENTUM)
    tl.store(w_end_ptr + state, w, mask=ok)
    tl.store(w_open_ptr + state, w_open, mask=ok)
    tl.store(u_end_ptr + state, u, mask=ok)
    tl.store(d_end_ptr + state, d, mask=ok)
    tl.store(d_prev_ptr + state, d_prev, mask=ok)


OUT_CONFIGS = [triton.Config({"BV": bv, "BK": bk}, num_warps=w, num_stages=s)
               for bv, bk, w, s in [(128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 3), (64, 128, 4, 3),
                                    (128, 32, 4, 4)]]


@triton.autotune(configs=_configs(OUT_CONFIGS, BV=16, BK=16), key=["DV", "DH", "CHUNK", "BT"])
@triton.jit
def _chunk_out_kernel(q_ptr, wc_ptr, o_ptr, T, FRONT, N, DV, DH, CHUNK: tl.constexpr, PREC: tl.constexpr,
                      BT: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr):
    """out[BT tokens, BV] = phi_q tile @ W_c^T, c the tile's chunk (BT divides the chunk); a tile's value
    blocks are neighbouring programs (its features come from memory once)."""
    tiles_v = tl.cdiv(DV, BV)
    pid, pv = tl.program_id(0) // tiles_v, tl.program_id(0) % tiles_v
    tiles = N * (CHUNK // BT)
    bh, tile = pid // tiles, pid % tiles
    n = tile * BT // CHUNK
    p = tile * BT + tl.arange(0, BT)
    row, ok = _token_rows(p, FRONT, T, DH)
    cv = pv * BV + tl.arange(0, BV)
    v_ok = cv < DV
    acc = tl.zeros([BT, BV], dtype=tl.float32)
    for k0 in range(0, DH, BK):
        ck = k0 + tl.arange(0, BK)
        k_ok = ck < DH
        q = tl.load(q_ptr + bh * T * DH + row[:, None] + ck[None, :], mask=ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(wc_ptr + ((bh * N + n) * DV + cv[None, :]) * DH + ck[:, None], mask=k_ok[:, None] & v_ok[None, :],
                    other=0.0)  # [BK, BV] = W_c^T
        acc = tl.dot(q, w, acc, input_precision=PREC)
    t = tl.where(ok, p - FRONT, 0)
    tl.store(o_ptr + (bh * T + t[:, None]) * DV + cv[None, :], acc.to(o_ptr.dtype.element_ty),
             mask=ok[:, None] & v_ok[None, :])


def chunk_supported(chunk: int) -> bool:
    """Chunk sizes the kernels take: multiples of 16 (tl.dot's least tile)."""
    return chunk % 16 == 0


def _token_tile(chunk: int) -> int:
    return 64 if chunk % 64 == 0 else (32 if chunk % 32 == 0 else 16)


def chunk_attention(phi_q, keys, v, w1, u0, d_in, m, chunk: int, front: int = 0):
    T = phi_q.shape[2]
    assert chunk_supported(chunk), "chunk_attention needs a chunk size that is a multiple of 16"
    phi_q, keys = phi_q.contiguous(), keys.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    Wc, ends = _scan(_chunk_sums(keys, v, chunk, front), w1, u0, d_in, m, phi_q.dtype)
    B, H = phi_q.shape[:2]
    N, DV, DH = Wc.shape[1:]
    if front == 0 and T == N * chunk and phi_q.dtype == v.dtype != torch.float32:  # whole chunks: cuBLAS's
        # batched GEMM (in float32 the kernels' ieee dots instead: cuBLAS would follow torch's TF32 switch)
        out = torch.bmm(phi_q.view(B * H * N, chunk, DH), Wc.view(B * H * N, DV, DH).transpose(1, 2))
        return out.view(B, H, T, DV), ends
    return _chunk_output(phi_q, Wc, v.dtype, chunk, front), ends


def _chunk_sums(keys, v, chunk: int, front: int):
    """U [B * H, N, DV, DH] (float32): each chunk's sum of v^T keys (keys contiguous, v's last dim)."""
    B, H, T, DH = keys.shape
    DV, N = v.shape[-1], chunk_count(front, T, chunk)
    U = fresh(torch.empty(B * H, N, DV, DH, device=v.device, dtype=torch.float32))
    grid = lambda meta: (B * H * N * cdiv(DV, meta["BV"]) * cdiv(DH, meta["BK"]),)  # noqa: E731
    _chunk_sums_kernel[grid](keys, v, U, T, front, N, DV, DH, T * DH, DH, *v.stride()[:3], H, CHUNK=chunk,
                             PREC=_precision(keys.dtype))
    return U


def _chunk_output(phi_q, Wc, dtype, chunk: int, front: int):
    """out [B, H, T, DV] in `dtype`: each token's features against its chunk's weights (the Triton pass)."""
    B, H, T, DH = phi_q.shape
    N, DV = Wc.shape[1:3]
    out = fresh(torch.empty(B, H, T, DV, device=phi_q.device, dtype=dtype))
    bt = _token_tile(chunk)
    grid = lambda meta: (B * H * N * (chunk // bt) * cdiv(DV, meta["BV"]),)  # noqa: E731
    _chunk_out_kernel[grid](phi_q, Wc, out, T, front, N, DV, DH, CHUNK=chunk, PREC=_precision(phi_q.dtype), BT=bt)
    return out


def _scan(U, w1, u0, d_in, m, dtype):
    """The chunks' weights W_c [B * H, N, DV, DH] in `dtype` from their sums U (float32), and the ends."""
    BH, N, DV, DH = U.shape
    B, H = w1.shape[:2]
    ends = {name: fresh(U.new_empty(B, H, DV, DH)) for name in ("w", "w_open", "u", "d", "d_prev")}
    Wc = fresh(torch.empty(BH, N, DV, DH, device=U.device, dtype=dtype))
    momentum = m is not None
    m_arg = m.float().contiguous() if momentum else U
    d_arg = d_in.float().contiguous() if momentum else U
    block = 1024
    _chunk_scan_kernel[(BH, cdiv(DV * DH, block))](U, u0.float().contiguous(), w1.float().contiguous(), d_arg,
                                                   m_arg, Wc, *ends.values(), N, DV * DH, MOMENTUM=momentum,
                                                   BLOCK=block)
    return Wc, ends


@triton.jit
def _chunk_momenta_kernel(g_ptr, gin_ptr, m_ptr, last_ptr, T, FRONT, N, CHUNK: tl.constexpr, BT: tl.constexpr):
    """One (sequence, head) and chunk: the mean of its gates (with the carried sum in chunk 0)."""
    bh, n = tl.program_id(0), tl.program_id(1)
    acc = tl.zeros([BT], dtype=tl.float32)
    for i in range(0, CHUNK, BT):
        inner = i + tl.arange(0, BT)
        row, ok = _token_rows(n * CHUNK + inner, FRONT, T, 1)
        acc += tl.load(g_ptr + bh * T + row, mask=ok & (inner < CHUNK), other=0.0)
    total = tl.sum(acc, axis=0) + tl.where(n == 0, tl.load(gin_ptr + bh), 0.0)
    tl.store(m_ptr + bh * N + n, total / CHUNK)
    if n == N - 1:
        tl.store(last_ptr + bh, total)


def chunk_momenta(gates, gate_in, chunk: int, front: int = 0):
    B, H, T = gates.shape
    N = chunk_count(front, T, chunk)
    gates, gate_in = gates.float().contiguous(), gate_in.float().contiguous()
    out = fresh(torch.empty(B * H * (N + 1), device=gates.device))  # (one allocation: the means, the last sum)
    m, last = out[:B * H * N].view(B, H, N), out[B * H * N:].view(B, H)
    _chunk_momenta_kernel[(B * H, N)](gates, gate_in, m, last, T, front, N, CHUNK=chunk,
                                      BT=min(1024, next_power_of_2(chunk)))
    return m, last


@triton.jit
def _decode_step_kernel(q_ptr, k_ptr, v_ptr, w_ptr, g_ptr, d_ptr, m_ptr, o_ptr, DV, DH,
                        COMMIT: tl.constexpr, MOMENTUM: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr):
    """One (sequence, head), BV rows of the state: reads W once, G once, writes G (and at a commit W
    and D)."""
    bh, pv = tl.program_id(0), tl.program_id(1)
    cv = pv * BV + tl.arange(0, BV)
    ck = tl.arange(0, BK)
    v_ok, k_ok = cv < DV, ck < DH
    mask = v_ok[:, None] & k_ok[None, :]
    q = tl.load(q_ptr + bh * DH + ck, mask=k_ok, other=0.0).to(tl.float32)
    key = tl.load(k_ptr + bh * DH + ck, mask=k_ok, other=0.0).to(tl.float32)
    val = tl.load(v_ptr + bh * DV + cv, mask=v_ok, other=0.0).to(tl.float32)
    offs = (bh * DV + cv[:, None]) * DH + ck[None, :]
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0) + val[:, None] * key[None, :]
    tl.store(o_ptr + bh * DV + cv, tl.sum(w * q[None, :], axis=1).to(o_ptr.dtype.element_ty), mask=v_ok)
    if COMMIT:
        d = g
        if MOMENTUM:
            d = g + tl.load(m_ptr + bh) * tl.load(d_ptr + offs, mask=mask, other=0.0)
            tl.store(d_ptr + offs, d, mask=mask)
        tl.store(w_ptr + offs, w + d, mask=mask)
        g = g * 0.0
    tl.store(g_ptr + offs, g, mask=mask)


def decode_step(phi_q, key, v, w1, g1, d, m, commit: bool):
    B, H, DH = phi_q.shape
    DV = v.shape[-1]
    for t in (phi_q, key, v, w1, g1) + ((d, m) if m is not None else ()):
        assert t.is_contiguous(), "decode_step needs contiguous tensors"
    out = fresh(torch.empty(B, H, DV, device=v.device, dtype=v.dtype))
    bk = triton.next_power_of_2(DH)
    bv = max(1, min(triton.next_power_of_2(DV), 4096 // bk))
    momentum = m is not None
    _decode_step_kernel[(B * H, cdiv(DV, bv))](phi_q, key, v, w1, g1, d if momentum else g1, m if momentum else g1,
                                               out, DV, DH, COMMIT=commit, MOMENTUM=momentum, BV=bv, BK=bk)
    return out


def chunk(st: dict, fixed: dict, config, norms, q, k, v, lr, gates, start: int):
    """`parallel.chunk` through the kernels above (the references where autograd needs them, or a chunk size
    the kernels do not take)."""
    if (torch.is_grad_enabled() and any(t.requires_grad for t in (q, fixed["0"], fixed["2"]))
            or not chunk_supported(config.lact_chunk_size)):
        return parallel.chunk(st, fixed, config, norms, q, k, v, lr, gates, start)
    return parallel.chunk_through((features, chunk_attention, chunk_momenta), False, st, fixed, config, q, k, v, lr,
                                  gates, start)
