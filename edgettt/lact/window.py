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
    if start == 0 or cache_k is None:  # a fresh sequence: attention within the text alone
        return fresh_window_attention(q, k, v, window), write_ring(None, None, k, v, 0, window)
    positions = torch.arange(start, start + T, device=device)
    keys, values = torch.cat((cache_k, k), dim=2), torch.cat((cache_v, v), dim=2)
    key_pos = torch.cat((slot_positions(start, window, device), positions))
    allowed = (key_pos[None, :] <= positions[:, None]) & (key_pos[None, :] > positions[:, None] - window)
    allowed &= key_pos[None, :] >= 0
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)
    return out, write_ring(cache_k, cache_v, k, v, start, window)


def fresh_window_attention(q, k, v, window: int) -> torch.Tensor:
    """Window attention of a text from its start, in blocks of `window` queries that each read their
    own block and the one before (2 x window keys instead of T): the same softmax over the same keys."""
    B, H, T, d = q.shape
    if T <= window:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    n = -(-T // window)
    pad = n * window - T
    qb = F.pad(q, (0, 0, 0, pad)).reshape(B, H, n, window, d)
    kb, vb = (F.pad(x, (0, 0, window, pad)).unfold(2, 2 * window, window).transpose(-1, -2) for x in (k, v))
    r = torch.arange(window, device=q.device)[:, None]  # query offset in its block
    s = torch.arange(2 * window, device=q.device)[None, :]  # key offset from the block before
    allowed = (s > r) & (s <= r + window)  # key position in (query - window, query]
    first = allowed & (s >= window)  # block 0: the block before is padding
    mask = torch.cat((first[None], allowed[None].expand(n - 1, -1, -1)))  # [n, window, 2 window]
    out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask)
    return out.reshape(B, H, n * window, d)[:, :, :T]


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
