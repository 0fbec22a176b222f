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
- `chunk`: every chunk at once (the feature map, then the chunk-exclusive attention; plain torch that
  loops over nothing: an exported graph keeps it); `triton.chunk` the same through the Triton kernels
  (what `edgettt.prepare` gives a LaCT layer);
- `naive`: the whole-sequence masked matrix, for tests (outputs only, from a fresh state).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edgettt.ops.lact import reference as ref


def chunk(st: dict, fixed: dict, config, norms, q, k, v, lr, gates, start: int):
    return chunk_through((ref.features_ref, ref.chunk_attention_ref, ref.chunk_momenta_ref), True,
                         st, fixed, config, q, k, v, lr, gates, start)


def chunk_through(parts, traced: bool, st: dict, fixed: dict, config, q, k, v, lr, gates, start: int):
    """`chunk` through `parts` (feature map, chunk attention, chunk momenta: the references or the kernels);
    `traced`: whether the last chunk's completeness is chosen in the graph (an export keeps both cases) or
    on the host."""
    T, b = q.shape[2], config.lact_chunk_size
    front = start % b
    feature_map, attention, momenta = parts
    phi_q = feature_map(q, fixed["0"], fixed["2"])
    keys = feature_map(k, fixed["0"], fixed["2"], lr[..., 1, :])
    momentum = config.use_momentum
    m, last_gate = momenta(gates, st["gate"], b, front) if momentum else (None, None)
    out, ends = attention(phi_q, keys, v, st["w1"], st["g1"], st["m1"] if momentum else None, m, b, front)
    if not traced:  # the host knows whether the last chunk is complete
        complete = (front + T) % b == 0
    else:  # a tensor, not a Python branch, so that an exported graph keeps both cases
        complete = F.pad(q.new_ones(T), (front, (-(front + T)) % b))[-1] > 0
    _carry(st, ends, last_gate, complete, momentum)
    return out.to(q.dtype)


def _carry(st: dict, ends: dict, last_gate, complete, momentum: bool):
    """The state after the text: the last chunk complete, every chunk committed; else its sums stay
    unfinished. `complete` a bool, or a 0-d bool tensor (chosen in the graph)."""
    if isinstance(complete, bool):
        pick = lambda done, open_: done() if complete else open_  # noqa: E731
    else:
        pick = lambda done, open_: torch.where(complete, done(), open_)  # noqa: E731
    st["w1"] = pick(lambda: ends["w"], ends["w_open"])
    st["g1"] = pick(lambda: torch.zeros_like(st["g1"]), ends["u"])
    if momentum:
        st["m1"] = pick(lambda: ends["d"], ends["d_prev"])
        st["gate"] = pick(lambda: torch.zeros_like(st["gate"]), last_gate)


def naive(st: dict, fixed: dict, config, norms, q, k, v, lr, gates, start: int):
    """Outputs of a fresh sequence (start 0) as one masked matrix product [T, T]: for tests."""
    assert start == 0, "the whole-sequence form starts from a fresh state"
    B, H, T, d = q.shape
    b = config.lact_chunk_size
    phi_q = ref.features_ref(q, fixed["0"], fixed["2"])
    phi_k = ref.features_ref(k, fixed["0"], fixed["2"])
    chunk_of = torch.arange(T, device=q.device) // b
    N = int(chunk_of[-1]) + 1
    if config.use_momentum:
        E, _ = ref.momentum_coefficients(ref.chunk_momenta_ref(gates, gates.new_zeros(B, H), b)[0])
    else:
        E = torch.eye(N, dtype=q.dtype, device=q.device).expand(B, H, N, N)
    before = torch.tril(torch.ones(N, N, device=q.device, dtype=q.dtype), diagonal=-1).T  # [n, c]: n < c
    a = E @ before  # a[i, c] = sum_{n=i}^{c-1} E[i, n]
    mask = a[:, :, chunk_of][:, :, :, chunk_of].transpose(-1, -2)  # [B, H, t, j] = a[c(j), c(t)]
    scores = (phi_q @ (phi_k * lr[..., 1, :]).transpose(-1, -2)) * mask
    return phi_q @ st["w1"].transpose(-1, -2) + scores @ v
