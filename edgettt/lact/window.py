"""The sliding-window softmax attention inside a LaCT layer, with its keys and values in a ring buffer.

Each query at position t attends to the keys at positions t - window + 1 .. t (flash-attn's
`window_size=(window - 1, 0)`, causal), through torch's scaled_dot_product_attention with a mask.
The decode state keeps the last `window` keys (rotated) and values in a ring buffer of `window`
slots: the token at position p lives in slot p % window. Attention does not depend on the order of
its keys, so a buffer is never shifted, only written.

    cache_k, cache_v: [B, H, window, d]; a slot's position is worked out from `start` (the tokens seen).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rotate_half(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding that rotates the two halves of the head dim against each other (GPT-NeoX /
    flash-attn's non-interleaved layout, as LaCT uses). x: [B, H, T, d]; positions: [T]."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    angles = positions.float()[:, None] * inv_freq[None, :]  # [T, d/2]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def slot_positions(start, window: int, device) -> torch.Tensor:
    """[window]: the position held by each ring slot after `start` tokens (negative: never written)."""
    slots = torch.arange(window, device=device)
    return start - 1 - torch.remainder(start - 1 - slots, window)


def window_attention(q, k, v, cache_k, cache_v, start: int, window: int):
    """Outputs [B, H, T, d] of queries at positions start..start+T-1, and the ring buffers after them.

    q, k, v: [B, H, T, d] (q and k rotated); cache_k, cache_v: [B, H, window, d] or None (a fresh
    sequence)."""
    T, device = q.shape[2], q.device
    positions = torch.arange(start, start + T, device=device)
    if cache_k is None or start == 0:
        keys, values, key_pos = k, v, positions
    else:
        keys, values = torch.cat((cache_k, k), dim=2), torch.cat((cache_v, v), dim=2)
        key_pos = torch.cat((slot_positions(start, window, device), positions))
    allowed = (key_pos[None, :] <= positions[:, None]) & (key_pos[None, :] > positions[:, None] - window)
    allowed &= key_pos[None, :] >= 0
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)
    return out, write_ring(cache_k, cache_v, k, v, start, window)


def write_ring(cache_k, cache_v, k, v, start: int, window: int):
    """The ring buffers with the keys and values of positions start.. written into their slots."""
    B, H, T, d = k.shape
    if cache_k is None:
        cache_k, cache_v = k.new_zeros(B, H, window, d), v.new_zeros(B, H, window, d)
    keep = min(T, window)  # only the last `window` new tokens survive
    slots = torch.remainder(torch.arange(start + T - keep, start + T, device=k.device), window)
    cache_k, cache_v = cache_k.clone(), cache_v.clone()
    cache_k[:, :, slots] = k[:, :, T - keep:]
    cache_v[:, :, slots] = v[:, :, T - keep:]
    return cache_k, cache_v
