"""The delta rule through flash-linear-attention's Triton kernels, where fla is installed and the tensors are on
CUDA; elsewhere the plain-torch reference (`reference.py`). The same signature as the reference: q, k [B, H, T, K],
v [B, H, T, V], beta, g [B, H, T], state [B, H, K, V] or None -> (o [B, H, T, V] in v's dtype, the final state in
float32). fla takes [B, T, H, ...]; its chunk kernel serves a prefill, its fused recurrence decode. Where gradients
are asked for (training), the reference: fla 0.6 refuses the gated chunk kernel's backward with Triton < 3.7.1 on
Hopper GPUs (fla issue 640: wrong gradients), which is what torch 2.11 ships.
"""

from __future__ import annotations

import functools

import torch

from edgettt.ops.delta_rule import reference


@functools.cache
def fla_ops():
    """fla's (chunk, fused recurrent) gated delta rule, or None where fla is not installed."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except ImportError:
        return None
    return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


def fla_runs_on(*inputs: torch.Tensor | None) -> bool:
    q = inputs[0]
    training = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs)
    return q.is_cuda and q.dtype != torch.float64 and not training and fla_ops() is not None


def _fla_call(op, q, k, v, beta, g, state, scale):
    tokens_first = lambda t: t.transpose(1, 2).contiguous()  # noqa: E731  [B, H, T, ...] -> [B, T, H, ...]
    if g is None:
        g = torch.zeros_like(beta)
    state = None if state is None else state.float().contiguous()
    o, final = op(tokens_first(q), tokens_first(k), tokens_first(v), g=tokens_first(g.float()),
                  beta=tokens_first(beta.to(v.dtype)), scale=scale, initial_state=state, output_final_state=True)
    return o.transpose(1, 2).to(v.dtype), final.float()


def chunk(q, k, v, beta, g=None, state=None, scale=None, chunk_size: int = 64):
    if not fla_runs_on(q, k, v, beta, g, state) or chunk_size != 64:  # (fla's kernels chunk by 64)
        return reference.chunk(q, k, v, beta, g, state, scale, chunk_size)
    return _fla_call(fla_ops()[0], q, k, v, beta, g, state, scale)


def recurrent(q, k, v, beta, g=None, state=None, scale=None, stored=None):
    if stored is not None or not fla_runs_on(q, k, v, beta, g, state):  # a stored state's rounding is sequential: the reference's loop
        return reference.recurrent(q, k, v, beta, g, state, scale, stored)
    return _fla_call(fla_ops()[1], q, k, v, beta, g, state, scale)
