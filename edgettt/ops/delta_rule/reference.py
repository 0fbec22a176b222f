"""The gated delta rule in plain torch: the token-by-token recurrence and the chunked (WY) form that computes the
same in a few matrix products a chunk (DeltaNet: no gate).

Per head, with a state S [K, V], a token's query q, key k (l2-normalised by the layer), value v, step size beta
and log decay g (<= 0; none for DeltaNet):

    S <- exp(g) S                      (the gate forgets)
    S <- S + beta k (v - k^T S)        (the delta rule: one step of online regression of v on k)
    o  = scale q^T S

One signature for both forms: q, k [B, H, T, K]; v [B, H, T, V]; beta, g [B, H, T]; state [B, H, K, V] or None
(zeros). Returns (o [B, H, T, V] in v's dtype, the final state [B, H, K, V] in float32, float64 for float64 inputs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _start(q, k, v, beta, g, state, scale):
    dtype = _compute_dtype(v)
    B, H, _, K = k.shape
    q, k, v, beta = (t.to(dtype) for t in (q, k, v, beta))
    g = torch.zeros_like(beta) if g is None else g.to(dtype)
    S = q.new_zeros(B, H, K, v.shape[-1]) if state is None else state.to(dtype)
    return q * (K ** -0.5 if scale is None else scale), k, v, beta, g, S


def recurrent(q, k, v, beta, g=None, state=None, scale=None, stored=None):
    """The recurrence, a token at a time (decode, and the reference of `chunk`). `stored(S, t)`, where given, is
    the state as kept after token t of the call (a quantized state's rounding, calibration's record of it)."""
    out_dtype = v.dtype
    q, k, v, beta, g, S = _start(q, k, v, beta, g, state, scale)
    outs = []
    for t in range(q.shape[2]):
        S = S * g[:, :, t, None, None].exp()
        k_t = k[:, :, t]
        delta = beta[:, :, t, None] * (v[:, :, t] - torch.einsum("bhk,bhkv->bhv", k_t, S))
        S = S + k_t[..., :, None] * delta[..., None, :]
        if stored is not None:
            S = stored(S, t)
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], S))
    return torch.stack(outs, dim=2).to(out_dtype), S


def chunk(q, k, v, beta, g=None, state=None, scale=None, chunk_size: int = 64):
    """The same in chunks of `chunk_size` tokens: within a chunk the delta rule's corrections form a unit lower
    triangular system (I + A) whose solution gives every token's effective key and value (the WY form); across
    chunks the state is carried as in `recurrent`."""
    out_dtype, T = v.dtype, q.shape[2]
    q, k, v, beta, g, S = _start(q, k, v, beta, g, state, scale)
    pad = (-T) % chunk_size  # padded tokens: k = 0, beta = 0, g = 0 change nothing
    q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    beta, g = F.pad(beta, (0, pad)), F.pad(g, (0, pad))
    B, H, Tp, K = k.shape
    n, C = Tp // chunk_size, chunk_size
    q, k, v = (t.reshape(B, H, n, C, -1) for t in (q, k, v))
    beta, gamma = beta.reshape(B, H, n, C), g.reshape(B, H, n, C).cumsum(-1)  # gamma: log decay since chunk start
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    decay = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~causal, float("-inf")).exp()  # [.., C, C]
    k_beta = k * beta[..., None]
    A = (k_beta @ k.transpose(-1, -2) * decay).tril(-1)
    system = A + torch.eye(C, dtype=A.dtype, device=A.device)
    W = torch.linalg.solve_triangular(system, k_beta * gamma.exp()[..., None], upper=False, unitriangular=True)
    U = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False, unitriangular=True)
    scores = q @ k.transpose(-1, -2) * decay
    q_decayed = q * gamma.exp()[..., None]
    k_to_end = k * (gamma[..., -1:] - gamma).exp()[..., None]
    outs = []
    for i in range(n):
        v_new = U[:, :, i] - W[:, :, i] @ S
        outs.append(q_decayed[:, :, i] @ S + scores[:, :, i] @ v_new)
        S = S * gamma[:, :, i, -1, None, None].exp() + k_to_end[:, :, i].transpose(-1, -2) @ v_new
    o = torch.stack(outs, dim=2).reshape(B, H, Tp, -1)[:, :, :T]
    return o.to(out_dtype), S
