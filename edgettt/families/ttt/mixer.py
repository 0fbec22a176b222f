"""What every TTT-family sequence mixer shares: the q/k/v projections, the optional q/k convolutions
(`share_qk`), rotary embedding at position `p mod b`, post-norm, gate and output projection.

The original layer (`original.py`) and the converted linear-attention layer (`converted.py`) differ only
in how they turn (q, k, v, learning rates) into the per-head outputs; both subclass `MixerBase`.
"""

from __future__ import annotations

import torch
from torch import nn

from edgettt.families.base import FusableInputs, depthwise_conv, product
from edgettt.families.ttt.config import ModelConfig
from edgettt.ops import causal_conv, gelu_tanh, rotary


class MixerBase(FusableInputs, nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        C = config.hidden_size
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.q_proj = nn.Linear(C, C, bias=False)
        if not config.share_qk:
            self.k_proj = nn.Linear(C, C, bias=False)
        self.v_proj = nn.Linear(C, C, bias=False)
        self.o_proj = nn.Linear(C, C, bias=False)
        if config.share_qk:
            self.conv_q = depthwise_conv(C, config.conv_kernel)
            self.conv_k = depthwise_conv(C, config.conv_kernel)
        if config.use_gate:
            self.g_proj = nn.Linear(C, C, bias=False)
        self.post_norm = nn.LayerNorm(C, eps=1e-6)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape  # [B, T, C] -> [B, H, T, d]
        return x.reshape(B, T, self.num_heads, self.head_dim).transpose(1, 2)

    def input_projection_names(self) -> tuple[str, ...]:
        return ("q_proj", "v_proj") if self.config.share_qk else ("q_proj", "k_proj", "v_proj")

    def project(self, x: torch.Tensor, state: dict, start: int):
        """Queries, keys and values per head, rotated: three [B, H, T, d]. Updates state['conv_qk']."""
        if self.config.share_qk:
            shared, v = self.project_inputs(x)
            tail = state.get("conv_qk")
            q, _ = causal_conv(shared, self.conv_q.weight, self.conv_q.bias, tail)
            k, state["conv_qk"] = causal_conv(shared, self.conv_k.weight, self.conv_k.bias, tail)
        else:
            q, k, v = self.project_inputs(x)
        q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)
        # `start` is an int, or a 0-d tensor in an exported decode graph
        positions = (torch.arange(x.shape[1], device=x.device) + start) % self.config.mini_batch_size
        theta, period = self.config.rope_theta, self.config.mini_batch_size
        return rotary(q, positions, theta, period), rotary(k, positions, theta, period), v

    def finish(self, x: torch.Tensor, heads_out: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """[B, H, T, d] -> [B, T, C]: merge heads, post-norm, gate, output projection (+ the residual)."""
        B, H, T, d = heads_out.shape
        heads = heads_out.transpose(1, 2).reshape(B, T, H * d)
        if self.config.use_gate:
            return product(self.o_proj, gelu_tanh(self.g_proj(x)) * self.post_norm(heads), residual=residual)
        return product(self.o_proj, heads, self.post_norm, residual=residual)

    def conv_state_shapes(self) -> dict[str, tuple[int, ...]]:
        if self.config.share_qk:
            return {"conv_qk": (self.config.conv_kernel - 1, self.config.hidden_size)}
        return {}

    @staticmethod
    def lr_from_logits(logits: torch.Tensor, scale: float) -> torch.Tensor:
        """[B, T, H] gate logits -> [B, H, T] per-token learning rates."""
        return (scale * torch.sigmoid(logits)).transpose(1, 2)


def zeros_state(shapes: dict[str, tuple[int, ...]], batch_size: int, like: torch.Tensor) -> dict:
    return {name: like.new_zeros((batch_size, *shape)) for name, shape in shapes.items()}

