"""The parallel form of the W1-only LaCT layer: a linear attention, exact (DESIGN section 4.1).

When only W1 learns, without weight normalisation and without Muon, W0 and W2 are constants and
phi(x) = silu(W0 x) * (W2 x) is a fixed feature map. Chunk n adds U_n = sum_j lr1_j v_j phi(k_j)^T
(plus, with momentum, the previous step: D_n = U_n + m_n D_{n-1}, W <- W + D_n; without, D_n = U_n),
and token t of chunk c reads W1^(c) phi(q_t), the weights before its own chunk's update. Unrolled:

    o_t = W1 phi(q_t) + sum_{j in chunks i < c} a[i, c] lr1_j (phi(k_j) . phi(q_t)) v_j + b[c] D phi(q_t)

a linear attention with keys phi(k), values lr1 v, queries phi(q) and a chunk-exclusive mask
(a token never sees its own chunk). Without momentum a[i, c] = 1 (i < c) and b = 0; with momentum
a[i, c] = sum_{n=i}^{c-1} prod_{l=i+1}^{n} m_l and b[c] = sum_{n=0}^{c-1} prod_{l=0}^{n} m_l, where m_l
is chunk l's mean momentum gate and D the momentum buffer carried in (the state's `m1`).

Two computations, one signature with `fast_weights.exact` (st: the decode state w1, g1, m1, gate,
updated in place; fixed: {"0": W0, "2": W2}):
- `chunk`: every chunk at once: per-chunk sums, the mask coefficients, per-chunk weights (no loop over
  chunks);
- `naive`: the whole-sequence masked matrix, for tests (outputs only, from a fresh state).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .fast_weights import hidden_features


def _pad_chunks(x: torch.Tensor, front: int, back: int, N: int, b: int) -> torch.Tensor:
    """[B, H, T, ...] -> [B, H, N, b, ...], zeros before `front` and after the last token."""
    pad = [0, 0] * (x.dim() - 3) + [front, back]
    x = F.pad(x, pad)
    return x.reshape(*x.shape[:2], N, b, *x.shape[3:])


def momentum_coefficients(m: torch.Tensor, momentum: bool):
    """E [.., i, n] = prod_{l=i+1}^{n} m_l for n >= i (else 0), P [.., n] = prod_{l=0}^{n} m_l.
    m: [.., N] the chunks' mean gates. Without momentum E is the identity and P zero."""
    N = m.shape[-1]
    eye = torch.eye(N, dtype=m.dtype, device=m.device)
    if not momentum:
        return eye.expand(*m.shape[:-1], N, N), torch.zeros_like(m)
    logs = torch.cumsum(torch.log(m), dim=-1)  # Lambda_n = sum_{l<=n} log m_l
    upper = torch.triu(torch.ones(N, N, dtype=torch.bool, device=m.device))  # n >= i
    E = torch.where(upper, torch.exp((logs[..., None, :] - logs[..., :, None]).clamp(max=0)), 0.0)
    return E, torch.exp(logs)


def chunk(st: dict, fixed: dict, config, norms, q, k, v, lr, gates, start: int):
    B, H, T, d = q.shape
    b = config.lact_chunk_size
    front, back = start % b, (-(start + T)) % b
    N = (front + T + back) // b
    phi_q, _, _ = hidden_features(fixed["0"], fixed["2"], q)
    phi_k, _, _ = hidden_features(fixed["0"], fixed["2"], k)
    lr1 = lr[..., 1, :]
    values = _pad_chunks(v, front, back, N, b)  # [B, H, N, b, d]
    keys = _pad_chunks(phi_k * lr1, front, back, N, b)  # [B, H, N, b, dh]
    U = values.transpose(-1, -2) @ keys  # [B, H, N, d, dh]
    U = torch.cat((U[:, :, :1] + st["g1"][:, :, None], U[:, :, 1:]), dim=2)  # the unfinished sums join chunk 0
    momentum = config.use_momentum
    if momentum:
        G = _pad_chunks(gates, front, back, N, b).sum(-1)  # [B, H, N]
        G = torch.cat((G[:, :, :1] + st["gate"][:, :, None], G[:, :, 1:]), dim=2)
        m = G / b
    else:
        m = q.new_ones(B, H, N)
    E, P = momentum_coefficients(m, momentum)  # [B, H, N, N], [B, H, N]
    D_in = st["m1"] if momentum else torch.zeros_like(st["w1"])
    D = torch.einsum("bhin,bhixy->bhnxy", E, U) + P[..., None, None] * D_in[:, :, None]  # D_n, every chunk
    before = torch.cumsum(D, dim=2) - D  # sum_{n<c} D_n: what chunk c's tokens see added to W1
    W = st["w1"][:, :, None] + before  # [B, H, N, d, dh]
    out = _pad_chunks(phi_q, front, back, N, b) @ W.transpose(-1, -2)  # [B, H, N, b, d]
    out = out.reshape(B, H, N * b, d)[:, :, front:front + T]
    # the last chunk complete: every chunk committed; else its sums stay unfinished. Chosen with a
    # tensor, not a Python branch, so that an exported graph keeps both cases
    complete = F.pad(q.new_ones(T), (front, back))[-1] > 0
    D_before = torch.cat((D_in[:, :, None], D), dim=2)[:, :, -2]  # D_(N-2), or D_in when N = 1
    st["w1"] = torch.where(complete, W[:, :, -1] + D[:, :, -1], W[:, :, -1])
    st["g1"] = torch.where(complete, torch.zeros_like(st["g1"]), U[:, :, -1])
    if momentum:
        st["m1"] = torch.where(complete, D[:, :, -1], D_before)
        st["gate"] = torch.where(complete, torch.zeros_like(st["gate"]), G[:, :, -1])
    return out


def naive(st: dict, fixed: dict, config, norms, q, k, v, lr, gates, start: int):
    """Outputs of a fresh sequence (start 0) as one masked matrix product [T, T]: for tests."""
    assert start == 0, "the whole-sequence form starts from a fresh state"
    B, H, T, d = q.shape
    b = config.lact_chunk_size
    phi_q, _, _ = hidden_features(fixed["0"], fixed["2"], q)
    phi_k, _, _ = hidden_features(fixed["0"], fixed["2"], k)
    chunk_of = torch.arange(T, device=q.device) // b
    N = int(chunk_of[-1]) + 1
    if config.use_momentum:
        G = F.pad(gates, (0, N * b - T)).reshape(B, H, N, b).sum(-1)
        E, _ = momentum_coefficients(G / b, True)
    else:
        E, _ = momentum_coefficients(q.new_ones(B, H, N), False)
    before = torch.tril(torch.ones(N, N, device=q.device, dtype=q.dtype), diagonal=-1).T  # [n, c]: n < c
    a = E @ before  # a[i, c] = sum_{n=i}^{c-1} E[i, n]
    mask = a[:, :, chunk_of][:, :, :, chunk_of].transpose(-1, -2)  # [B, H, t, j] = a[c(j), c(t)]
    scores = (phi_q @ (phi_k * lr[..., 1, :]).transpose(-1, -2)) * mask
    return phi_q @ st["w1"].transpose(-1, -2) + scores @ v
