"""The sliding-window softmax attention inside a LaCT layer, with its keys and values in a ring buffer.

Each query at position t attends to the keys at positions t - window + 1 .. t (flash-attn's
`window_size=(window - 1, 0)`, causal), as a softmax with the mask written out (`masked_attention`:
any number of leading dims, which an ONNX graph takes and a 5-d scaled_dot_product_attention does not).
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


def window_attention(q, k, v, cache_k, cache_v, start, window: int):
    """Outputs [B, H, T, d] of queries at positions start..start+T-1, and the ring buffers after them.

    q, k, v: [B, H, T, d] (q and k rotated); cache_k, cache_v: [B, H, window, d] or None (a fresh
    sequence). `start` is an int, or a 0-d tensor for one token (an exported decode graph)."""
    T = q.shape[2]
    if torch.is_tensor(start) or (T == 1 and cache_k is not None):
        return decode_attention(q, k, v, cache_k, cache_v, start, window)
    if start == 0 or cache_k is None:  # a fresh sequence: attention within the text alone
        return fresh_window_attention(q, k, v, window), fresh_ring(k, v, window)
    positions = torch.arange(start, start + T, device=q.device)
    keys, values = torch.cat((cache_k, k), dim=2), torch.cat((cache_v, v), dim=2)
    key_pos = torch.cat((slot_positions(start, window, q.device), positions))
    allowed = (key_pos[None, :] <= positions[:, None]) & (key_pos[None, :] > positions[:, None] - window)
    allowed &= key_pos[None, :] >= 0
    return masked_attention(q, keys, values, allowed), write_ring(cache_k, cache_v, k, v, start, window)


def masked_attention(q, k, v, allowed) -> torch.Tensor:
    """softmax(q k^T / sqrt(d), masked) v, written out (any number of leading dims, as ONNX takes it)."""
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v


def fresh_window_attention(q, k, v, window: int) -> torch.Tensor:
    """Window attention of a text from its start, in blocks of `window` queries that each read their
    own block and the one before (2 x window keys instead of T): the same softmax over the same keys.
    No branch on the length: an exported prefill graph takes any."""
    B, H, T, d = q.shape
    pad = (-T) % window
    n = (T + pad) // window
    qb = F.pad(q, (0, 0, 0, pad)).reshape(B, H, n, window, d)
    kb, vb = ((lambda p: torch.cat((p[:, :, :-window].reshape(B, H, n, window, d),
                                    p[:, :, window:].reshape(B, H, n, window, d)), dim=3))(F.pad(x, (0, 0, window, pad)))
              for x in (k, v))  # block i's keys: blocks i - 1 and i
    r = torch.arange(window, device=q.device)[:, None]  # query offset in its block
    s = torch.arange(2 * window, device=q.device)[None, :]  # key offset from the block before's start
    block = torch.arange(n, device=q.device)[:, None, None]
    allowed = (s > r) & (s <= r + window) & ((block > 0) | (s >= window))  # [n, window, 2 window]; block 0: no block before
    return masked_attention(qb, kb, vb, allowed).reshape(B, H, n * window, d)[:, :, :T]


def fresh_ring(k, v, window: int):
    """The ring buffers after a fresh text's keys and values [B, H, T, d]: slot s holds the last
    position p < T with p % window == s (zeros where none), gathered with no branch on T."""
    T = k.shape[2]
    index = slot_positions(T, window, k.device) + window  # >= 0: positions from -window on
    return tuple(F.pad(x, (0, 0, window, 0)).index_select(2, index) for x in (k, v))


def decode_attention(q, k, v, cache_k, cache_v, position, window: int):
    """One token at `position` (an int or a 0-d tensor): its key and value written into slot
    position % window, then attention over the slots written so far."""
    slots = torch.arange(window, device=q.device)
    here = (slots == torch.remainder(torch.as_tensor(position, device=q.device), window))[:, None]
    cache_k, cache_v = torch.where(here, k, cache_k), torch.where(here, v, cache_v)
    written = slot_positions(position + 1, window, q.device) >= 0
    return masked_attention(q, cache_k, cache_v, written[None, :]), (cache_k, cache_v)


def write_ring(cache_k, cache_v, k, v, start: int, window: int):
    """The ring buffers with the keys and values of positions start.. written into their slots."""
    T = k.shape[2]
    keep = min(T, window)  # only the last `window` new tokens survive
    slots = torch.remainder(torch.arange(start + T - keep, start + T, device=k.device), window)
    cache_k, cache_v = cache_k.clone(), cache_v.clone()
    cache_k[:, :, slots] = k[:, :, T - keep:]
    cache_v[:, :, slots] = v[:, :, T - keep:]
    return cache_k, cache_v
