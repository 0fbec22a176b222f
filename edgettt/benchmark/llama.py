"""A Llama-architecture transformer in plain torch with a static KV cache: the same-size baseline that
`edgettt bench --device cuda` times the TTT models against (random weights: for speed, not text).

    block: h += Attention(RMSNorm(h)) (RoPE, torch SDPA: flash attention in prefill, the cache in
           decode); h += SwiGLU(RMSNorm(h));   model: embed -> blocks -> RMSNorm -> lm_head (tied)

API as the TTT models': `init_state(batch, capacity)`, `prefill(ids, state, logits_from)`, `step(ids,
state)`. q/k/v are one GEMM, gate/up another (as serving stacks run a Llama). The cache holds `capacity` positions; `state.pos` is a device tensor that `step` advances in
place, so one CUDA graph of `step` serves every position (no host value changes between tokens).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from edgettt.families.ttt.config import PRESET_VOCAB, PRESETS
from edgettt.ops import rms_norm


@dataclasses.dataclass
class LlamaConfig:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def of_preset(cls, preset: str) -> "LlamaConfig":
        """The transformer of a TTT preset's size (`config.PRESETS`): hidden size, layers, heads, MLP, vocabulary."""
        return cls(**PRESETS[preset], vocab_size=PRESET_VOCAB)


@dataclasses.dataclass
class KVCache:
    keys: list[torch.Tensor]  # per layer [B, H, capacity, d]
    values: list[torch.Tensor]
    pos: torch.Tensor  # [1] int64: the next position
    cos: torch.Tensor  # [capacity, d / 2]: the rotary tables of every position
    sin: torch.Tensor


def rope_tables(config: LlamaConfig, length: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [length, d / 2] of the rotary embedding."""
    d = config.head_dim
    freq = config.rope_theta ** (-torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
    angles = torch.arange(length, device=device, dtype=torch.float32)[:, None] * freq[None, :]
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, d] rotated by the angles of its positions (cos, sin [T, d / 2]): halves convention."""
    a, b = x.float().chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        C = config.hidden_size
        self.heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.qkv_proj = nn.Linear(C, 3 * C, bias=False)
        self.o_proj = nn.Linear(C, C, bias=False)

    def forward(self, x, keys, values, pos, cos, sin):
        """x [B, T, C]; T > 1: a prefill from position 0 (causal flash attention over its own tokens);
        T = 1: one token at device position `pos`, attending over the cache up to it."""
        B, T, C = x.shape
        q, k, v = self.qkv_proj(x).view(B, T, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if T > 1:
            keys[:, :, :T], values[:, :, :T] = k, v
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            keys.index_copy_(2, pos, k)
            values.index_copy_(2, pos, v)
            seen = torch.arange(keys.shape[2], device=x.device) <= pos
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=seen[None, None, None, :])
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        C = config.hidden_size
        self.attn_norm = nn.Parameter(torch.ones(C))
        self.attn = Attention(config)
        self.mlp_norm = nn.Parameter(torch.ones(C))
        self.gate_up_proj = nn.Linear(C, 2 * config.intermediate_size, bias=False)  # one GEMM, as serving stacks run it
        self.down_proj = nn.Linear(config.intermediate_size, C, bias=False)
        self.eps = config.rms_norm_eps

    def forward(self, h, keys, values, pos, cos, sin):
        h = h + self.attn(rms_norm(h, self.attn_norm, self.eps), keys, values, pos, cos, sin)
        x = rms_norm(h, self.mlp_norm, self.eps)
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return h + self.down_proj(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig):
        """Weights as torch initialises its modules (build it under `torch.device("cuda")` to draw them
        there)."""
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_hidden_layers))
        self.norm = nn.Parameter(torch.ones(config.hidden_size))
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.lm_head.weight = self.embed_tokens.weight  # tied

    def init_state(self, batch: int, capacity: int) -> KVCache:
        c, p = self.config, self.embed_tokens.weight
        shape = (batch, c.num_attention_heads, capacity, c.head_dim)
        return KVCache([p.new_zeros(shape) for _ in self.layers], [p.new_zeros(shape) for _ in self.layers],
                       torch.zeros(1, dtype=torch.long, device=p.device), *rope_tables(c, capacity, p.device))

    def _run(self, ids, state: KVCache, cos, sin):
        h = self.embed_tokens(ids)
        for layer, keys, values in zip(self.layers, state.keys, state.values):
            h = layer(h, keys, values, state.pos, cos, sin)
        return rms_norm(h, self.norm, self.config.rms_norm_eps)

    def prefill(self, ids: torch.Tensor, state: KVCache, logits_from: int | None = None):
        """Logits of ids [B, T] from a fresh cache (position 0), and the cache after them."""
        T = ids.shape[1]
        h = self._run(ids, state, state.cos[:T], state.sin[:T])
        state.pos.fill_(T)
        if logits_from is not None:
            h = h[:, logits_from:]
        return self.lm_head(h).float(), state

    def step(self, ids: torch.Tensor, state: KVCache):
        """One token a sequence, ids [B], at the cache's position; logits [B, V]. Advances state.pos."""
        h = self._run(ids[:, None], state, state.cos.index_select(0, state.pos), state.sin.index_select(0, state.pos))
        state.pos.add_(1)
        return self.lm_head(h[:, 0]).float(), state
