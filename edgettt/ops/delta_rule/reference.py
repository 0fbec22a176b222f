"""The gated delta rule in plain torch: the token-by-token recurrence and the chunked (WY) form that computes the
same in a few matrix products a chunk (DeltaNet: no gate).

Per head, with a state S [K, V], a token's query q, key k (l2-normalised by the layer), value v, step size beta
and log decay g (<= 0; none for DeltaNet):

    S <- exp(g) S                      (the gate forgets)
    S <- S + beta k (v - k^T S)        (the delta rule: one step of online regression of v on k)
    o  = scale q^T S

One signature for both forms: q, k [B, H, T, K]; v [B, H, T, V]; beta, g [B, H, T]; state [B, H, K, V] or None
(zeros). Returns (o [B, H, T, V] in v's dtype, the final state [B, H, K, V] in float32, float64 for float64 inputs).

In an exported graph of any length (T symbolic) the loops over tokens or chunks are one ONNX Scan (torch's scan
operator), and the chunk's triangular solve a product of log2(chunk) factors (ONNX has no triangular solve).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._higher_order_ops.scan import scan

from edgettt.ops import exporting


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _start(q, k, v, beta, g, state, scale):
    dtype = _compute_dtype(v)
    B, H, _, K = k.shape
    q, k, v, beta = (t.to(dtype) for t in (q, k, v, beta))
    g = torch.zeros_like(beta) if g is None else g.to(dtype)
    S = q.new_zeros(B, H, K, v.shape[-1]) if state is None else state.to(dtype)
    return q * (K ** -0.5 if scale is None else scale), k, v, beta, g, S


def token_update(S, q_t, k_t, v_t, beta_t, g_t):
    """One token of every head (q_t scaled): the state after it and the token's output."""
    S = S * g_t[..., None, None].exp()
    delta = beta_t[..., None] * (v_t - torch.einsum("bhk,bhkv->bhv", k_t, S))
    S = S + k_t[..., :, None] * delta[..., None, :]
    return S, torch.einsum("bhk,bhkv->bhv", q_t, S)


@torch.library.custom_op("edgettt::delta_rule_token", mutates_args=())
def delta_rule_token_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: torch.Tensor,
                        S: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_update` of one token given as a length-1 sequence ([B, H, 1, D], [B, H, 1]), the output first: in an
    exported decode graph ONNX Runtime's LinearAttention (`onnx/onnx_ops.py`) in place of a dozen nodes."""
    S, o = token_update(S, q[:, :, 0], k[:, :, 0], v[:, :, 0], beta[:, :, 0], g[:, :, 0])
    return o[:, :, None], S


@delta_rule_token_op.register_fake
def _(q, k, v, beta, g, S):
    return v.new_empty(v.shape), torch.empty_like(S)


def recurrent(q, k, v, beta, g=None, state=None, scale=None, stored=None):
    """The recurrence, a token at a time (decode, and the reference of `chunk`). `stored(S, t)`, where given, is
    the state as kept after token t of the call (a quantized state's rounding, calibration's record of it; t an
    int, or a 0-d tensor in an exported graph)."""
    out_dtype, T = v.dtype, q.shape[2]
    q, k, v, beta, g, S = _start(q, k, v, beta, g, state, scale)

    def one_token(S, xs):
        q_t, k_t, v_t, beta_t, g_t, t = xs
        S, o_t = token_update(S, q_t, k_t, v_t, beta_t, g_t)
        if stored is not None:
            S = stored(S, t)
        return S, o_t

    if exporting() and T == 1 and stored is None and S.dtype == torch.float32:  # a decode graph's token: one node
        o, S = torch.ops.edgettt.delta_rule_token(q, k, v, beta, g, S)
        return o.to(out_dtype), S
    if exporting() and not isinstance(T, int):  # a graph of any length: one Scan over the tokens
        positions = torch.arange(T, device=q.device).reshape(1, 1, -1)
        S, o = scan(one_token, S, (q, k, v, beta, g, positions), dim=2)
        return o.to(out_dtype), S
    outs = []
    for t in range(T):
        S, o_t = one_token(S, (q[:, :, t], k[:, :, t], v[:, :, t], beta[:, :, t], g[:, :, t], t))
        outs.append(o_t)
    return torch.stack(outs, dim=2).to(out_dtype), S


def unit_lower_inverse(A: torch.Tensor) -> torch.Tensor:
    """(I + A)^-1 for A strictly lower triangular [..., C, C]: a triangular solve, or in an exported graph the
    product (I - A)(I + A^2)(I + A^4)... (A is nilpotent: A^C = 0, so the product is the whole series)."""
    if not exporting():
        eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
        return torch.linalg.solve_triangular(A + eye, eye.expand_as(A), upper=False, unitriangular=True)
    # in float64: the powers of A grow before they vanish, and in float32 the product's cancellation moved a
    # prefill's logits 2e-5 from torch's (the verification's bound: 1.7e-6)
    A64 = A.double()
    eye = torch.eye(A.shape[-1], dtype=A64.dtype, device=A.device)
    power, inverse, span = -A64, eye - A64, 2
    while span < A.shape[-1]:
        power = power @ power
        inverse = inverse @ (eye + power)
        span *= 2
    return inverse.to(A.dtype)


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
    V = v.shape[-1]  # (sizes, not -1, in the reshapes: an exported graph infers -1 wrongly past one chunk)
    n, C = Tp // chunk_size, chunk_size
    q, k, v = q.reshape(B, H, n, C, K), k.reshape(B, H, n, C, K), v.reshape(B, H, n, C, V)
    beta, gamma = beta.reshape(B, H, n, C), g.reshape(B, H, n, C).cumsum(-1)  # gamma: log decay since chunk start
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    decay = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~causal, float("-inf")).exp()  # [.., C, C]
    k_beta = k * beta[..., None]
    inverse = unit_lower_inverse((k_beta @ k.transpose(-1, -2) * decay).tril(-1))
    W = inverse @ (k_beta * gamma.exp()[..., None])  # each token's effective key, decayed to the chunk start
    U = inverse @ (v * beta[..., None])  # and value
    scores = q @ k.transpose(-1, -2) * decay
    q_decayed = q * gamma.exp()[..., None]
    k_to_end = k * (gamma[..., -1:] - gamma).exp()[..., None]
    chunk_decay = gamma[..., -1].exp()[..., None, None]  # [B, H, n, 1, 1]

    def one_chunk(S, xs):
        U_i, W_i, scores_i, q_i, k_i, decay_i = xs
        v_new = U_i - W_i @ S
        o_i = q_i @ S + scores_i @ v_new
        return S * decay_i + k_i.transpose(-1, -2) @ v_new, o_i

    xs = (U, W, scores, q_decayed, k_to_end, chunk_decay)
    if exporting() and not isinstance(n, int):  # a graph of any length: one Scan over the chunks
        S, o = scan(one_chunk, S, xs, dim=2)
    else:
        outs = []
        for i in range(n):
            S, o_i = one_chunk(S, tuple(x[:, :, i] for x in xs))
            outs.append(o_i)
        o = torch.stack(outs, dim=2)
    return o.reshape(B, H, Tp, V)[:, :, :T].to(out_dtype), S
