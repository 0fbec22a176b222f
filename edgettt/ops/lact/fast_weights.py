"""LaCT's fast weights in plain torch: the SwiGLU fast weight, its update, and the chunk-recurrent
computation with a state that decode carries across tokens and chunks (the exact form).

Per head, f(x) = W1 (silu(W0 x) * (W2 x)); W0, W2 [dh, d], W1 [d, dh]. The inner loss is
-<f(k), v>, so one chunk of tokens moves the weights by (the public code's `dw`, added):

    dW1 = sum_j lr1_j v_j h_j^T                     h = silu(W0 k) * (W2 k)
    dW0 = sum_j (silu'(W0 k_j) * (W2 k_j) * W1^T v_j) (lr0_j k_j)^T
    dW2 = sum_j (silu(W0 k_j) * W1^T v_j) (lr2_j k_j)^T

all at the weights the chunk started with. A chunk of `lact_chunk_size` tokens is read with the
weights from before its own update ("apply, then update"); then, in order: momentum
(dW += m dW_previous, m the chunk's mean momentum gate), Muon (Newton-Schulz orthogonalisation of
each dW, in bfloat16 as the public code), the update, and weight normalisation (each row rescaled to
its norm in the initial weights; `ttt_prenorm`: the unnormalised sum is kept and the applied weights
are its normalised copy).

Because every token of a chunk uses the same weights, the chunk's dW is a sum the state can hold
while the chunk is unfinished: a prefill may stop anywhere and decode continues exactly. The decode
state of a layer (names in `state_names`): the applied weights `w0 w1 w2` (only `w1` in the W1-only
variant), `p0 p1 p2` (the unnormalised sums, `ttt_prenorm`), the running sums of the unfinished
chunk `g0 g1 g2`, the momentum buffers `m0 m1 m2` and the running sum of momentum gates `gate`.
Tensors are [B, H, ...] per head; q, k, v [B, H, T, d]; lr [B, H, T, 3, lr_dim]; gates [B, H, T].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._higher_order_ops.scan import scan

from edgettt.ops import exporting, segments
from edgettt.ops.lact.reference import chunk_count, padded_chunks

# Newton-Schulz coefficients of the public code (from modded-nanogpt / Moonlight)
NS_STEPS = ((4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
            (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012))
NORM_EPS = 1e-5  # the public code's epsilon of the l2 norms (q, k and weight rows)


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    return x / (x.norm(dim=-1, keepdim=True) + NORM_EPS)


def hidden_features(w0, w2, x):
    """silu(W0 x) * (W2 x) for x [B, H, T, d] -> [B, H, T, dh] (and W0 x, W2 x for the gradients)."""
    gate, up = x @ w0.transpose(-1, -2), x @ w2.transpose(-1, -2)
    return F.silu(gate) * up, gate, up


def apply(w0, w1, w2, x):
    """f(x) = W1 (silu(W0 x) * (W2 x)) for x [B, H, T, d]."""
    return hidden_features(w0, w2, x)[0] @ w1.transpose(-1, -2)


def silu_grad(x):
    s = torch.sigmoid(x)
    return s * (1 + x * (1 - s))


def chunk_sums(w0, w1, w2, k, v, lr, update_w0_w2: bool):
    """(dW0, dW1, dW2) of tokens k, v, lr [B, H, T, 3, lr_dim] at weights w (dW0, dW2 None when only
    W1 learns)."""
    hidden, gate, up = hidden_features(w0, w2, k)
    lr0, lr1, lr2 = lr.unbind(-2)
    d1 = v.transpose(-1, -2) @ (hidden * lr1)
    if not update_w0_w2:
        return None, d1, None
    back = v @ w1  # W1^T v: [B, H, T, dh]
    d0 = (back * up * silu_grad(gate)).transpose(-1, -2) @ (k * lr0)
    d2 = (back * F.silu(gate)).transpose(-1, -2) @ (k * lr2)
    return d0, d1, d2


def newton_schulz(G: torch.Tensor) -> torch.Tensor:
    """Orthogonalise each [.., m, n] matrix (Muon), in bfloat16 as the public code does."""
    X = G.bfloat16()
    tall = G.shape[-2] > G.shape[-1]
    if tall:
        X = X.transpose(-1, -2)
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for a, b, c in NS_STEPS:
        A = X @ X.transpose(-1, -2)
        X = a * X + (b * A + c * A @ A) @ X
    return X.transpose(-1, -2) if tall else X


def learned(config) -> tuple[str, ...]:
    """The fast weights that change: "0", "1", "2" (W0, W1, W2), or "1" alone."""
    return ("0", "1", "2") if config.lact_update_w0_w2 else ("1",)


def state_names(config) -> list[str]:
    names = [f"w{i}" for i in learned(config)] + [f"g{i}" for i in learned(config)]
    if config.ttt_prenorm and config.lact_weight_norm:
        names += [f"p{i}" for i in learned(config)]
    if config.use_momentum:
        names += [f"m{i}" for i in learned(config)] + ["gate"]
    return names


def finish_chunk(st: dict, config, norms: dict, rounding=None) -> None:
    """End of a chunk: momentum, Muon, update, weight norm; clears the running sums (in `st`).
    `rounding(level, weights)` (a quantized state, levels 1.. in `learned` order) rounds the weights
    kept between chunks (the unnormalised sum with `ttt_prenorm`) as they are stored."""
    gate = st["gate"] / config.lact_chunk_size if config.use_momentum else None
    for level, i in enumerate(learned(config), start=1):
        kept = (lambda w: w) if rounding is None else (lambda w, level=level: rounding(level, w))
        d = st[f"g{i}"]
        if gate is not None:
            d = d + st[f"m{i}"] * gate[..., None, None]
            st[f"m{i}"] = d
        if config.use_muon:
            d = newton_schulz(d)
        if not config.lact_weight_norm:
            st[f"w{i}"] = kept(st[f"w{i}"] + d)
        elif config.ttt_prenorm:
            st[f"p{i}"] = kept(st[f"p{i}"] + d)
            st[f"w{i}"] = l2_normalize(st[f"p{i}"]) * norms[i]
        else:
            st[f"w{i}"] = kept(l2_normalize(st[f"w{i}"] + d) * norms[i])
        st[f"g{i}"] = torch.zeros_like(st[f"g{i}"])
    if gate is not None:
        st["gate"] = torch.zeros_like(st["gate"])


def exact(st: dict, fixed: dict, config, norms: dict, q, k, v, lr, gates, start: int, rounding=None,
          observer=None):
    """The chunk-recurrent computation over tokens start.. (cut at chunk boundaries): outputs
    [B, H, T, d]; `st` (the decode state) is updated in place. `fixed`: the weights that never change
    (W0, W2 of the W1-only variant), by index. `rounding(level, weights, position)`: a quantized
    state's rounding at each chunk end (position: tokens seen); `observer(st, count)`: calibration,
    called after each piece of `count` tokens with the state kept after it. Exported (ONNX), the loop
    over chunks is one Scan (`scanned`), for any length."""
    if exporting():
        assert observer is None, "calibration does not run in an exported graph"
        return scanned(st, fixed, config, norms, q, k, v, lr, gates, start, rounding)
    outs = []
    for offset, count, inner in segments(start, q.shape[2], config.lact_chunk_size):
        sl = slice(offset, offset + count)
        outs.append(read_and_add(st, fixed, config, q[:, :, sl], k[:, :, sl], v[:, :, sl], lr[:, :, sl],
                                 None if gates is None else gates[:, :, sl]))
        if inner + count == config.lact_chunk_size:
            position = start + offset + count
            finish_chunk(st, config, norms, None if rounding is None else
                         (lambda level, w, position=position: rounding(level, w, position)))
        if observer is not None:
            observer(st, count)
    return torch.cat(outs, dim=2)


def scanned(st: dict, fixed: dict, config, norms: dict, q, k, v, lr, gates, start: int, rounding=None):
    """`exact` as one scan over whole chunks (torch's scan operator: an ONNX Scan in an exported graph).
    The text is padded to whole chunks with zero tokens (zero keys and rates add nothing to the sums);
    each chunk reads and adds, and commits where it is complete: the last one only if the text fills
    it, chosen with a 0/1 flag, so that one graph holds both cases."""
    b = config.lact_chunk_size
    B, H, T = q.shape[:3]
    front = start % b
    N = chunk_count(front, T, b)
    names = state_names(config)
    gates = q.new_zeros(B, H, T) if gates is None else gates
    xs = [padded_chunks(x, front, N, b) for x in (q, k, v, lr, gates)]
    complete = padded_chunks(q.new_ones(1, 1, T), front, N, b)[..., -1]  # [1, 1, N]: the chunk's last slot holds a token
    ends = (start - front + b * torch.arange(1, N + 1, device=q.device)).reshape(1, 1, N)  # position of each commit

    def one_chunk(carry, x):
        piece = dict(zip(names, carry))
        qc, kc, vc, lrc, gc, done, end = x
        out = read_and_add(piece, fixed, config, qc, kc, vc, lrc, gc if config.use_momentum else None)
        committed = dict(piece)
        finish_chunk(committed, config, norms, None if rounding is None else
                     (lambda level, w: rounding(level, w, end.reshape(()))))
        flag = done.reshape(()) > 0
        return [torch.where(flag, committed[n], piece[n]) for n in names], out

    carry, outs = scan(one_chunk, [st[n] for n in names], [*xs, complete, ends], dim=2)
    st.update(zip(names, carry))
    return outs.reshape(B, H, N * b, -1)[:, :, front:front + T]


def read_and_add(st: dict, fixed: dict, config, q, k, v, lr, gates):
    """Tokens of one unfinished chunk: their outputs at the chunk's weights, and their gradient sums and
    momentum gates added to the running sums in `st`."""
    w = {i: st.get(f"w{i}", fixed.get(i)) for i in ("0", "1", "2")}
    out = apply(w["0"], w["1"], w["2"], q)
    for i, d in zip(("0", "1", "2"), chunk_sums(w["0"], w["1"], w["2"], k, v, lr, config.lact_update_w0_w2)):
        if d is not None:
            st[f"g{i}"] = st[f"g{i}"] + d
    if config.use_momentum:
        st["gate"] = st["gate"] + gates.sum(-1)
    return out


def step(st: dict, fixed: dict, config, norms: dict, q, k, v, lr, gates, position, rounding=None):
    """One token at `position` (a 0-d tensor: an exported decode graph), as `exact` computes it: the
    chunk's end is a 0/1 flag, and the state after a commit is blended in with it, so that one graph
    holds both cases."""
    out = read_and_add(st, fixed, config, q, k, v, lr, gates)
    committed = {name: st[name] for name in state_names(config)}
    finish_chunk(committed, config, norms, None if rounding is None else
                 (lambda level, w: rounding(level, w, position + 1)))
    ends = torch.remainder(position + 1, config.lact_chunk_size) == 0
    for name, value in committed.items():
        st[name] = torch.where(ends, value, st[name])
    return out
