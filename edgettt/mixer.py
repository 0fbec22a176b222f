"""What every TTT-family sequence mixer shares: the q/k/v projections, the optional q/k convolutions
(`share_qk`), rotary embedding at position `p mod b`, post-norm, gate and output projection.

The original layer (`ttt.py`) and the converted linear-attention layer (`converted.py`) differ only
in how they turn (q, k, v, learning rates) into the per-head outputs; both subclass `MixerBase`.
"""

from __future__ import annotations

import torch
from torch import nn

from .config import ModelConfig
import torch.nn.functional as F

from .ops import causal_conv, gelu_tanh, rotary


def product(layer: nn.Module, x: torch.Tensor, norm: nn.Module | None = None, up: torch.Tensor | None = None,
            residual: torch.Tensor | None = None, glu: bool = False) -> torch.Tensor:
    """residual + layer(x'), x' = norm(x) with a norm, silu(x) * up with `up`, else x (residual optional);
    `glu`: layer is a stacked gate/up product, and the result silu(gate) * up of its two halves instead.
    A layer that can compute all of it in one piece (`product_with`: what `edgettt.prepare` gives the int4
    layers of a compiled decode step, `fast_paths.fused_products`) is handed it whole."""
    whole = getattr(layer, "product_with", None)
    if whole is not None and (y := whole(x, norm, up, residual, glu)) is not None:
        return y
    if norm is not None:
        x = norm(x)
    if up is not None:
        x = F.silu(x) * up
    y = layer(x)
    if glu:
        gate, up_half = y.chunk(2, dim=-1)
        return F.silu(gate) * up_half
    return y if residual is None else residual + y


def depthwise_conv(channels: int, kernel: int) -> nn.Conv1d:
    """Parameter holder with the ttt-lm-pytorch shapes: weight [C, 1, K], bias [C]."""
    return nn.Conv1d(channels, channels, kernel, groups=channels, bias=True)


class FusableInputs:
    """A module with several projections of the same input, a block's normalized hidden state (the
    mixer's q/k/v, the MLP's gate/up). `fuse_input_projections` may replace them with one product of
    their concatenated weights (it sets `fused_inputs`, a module returning the same tuple): fewer,
    larger matmuls. The ONNX export does it (int8 activations then quantized once, and per tensor in a
    prefill: the normalized input's narrow range allows it), and `edgettt.prepare` (serving stacks
    fuse q/k/v and gate/up; the Llama baseline's are fused too)."""

    def input_projection_names(self) -> tuple[str, ...]:
        raise NotImplementedError

    def project_inputs(self, x: torch.Tensor, norm: nn.Module | None = None) -> tuple[torch.Tensor, ...]:
        """The projections of norm(x) (of x without a norm)."""
        fused = getattr(self, "fused_inputs", None)
        if fused is not None:
            return fused(x, norm)
        if norm is not None:
            x = norm(x)
        return tuple(getattr(self, name)(x) for name in self.input_projection_names())


class SplitOutputs(nn.Module):
    """One product of several layers' stacked rows, split back into each layer's output."""

    def __init__(self, linear: nn.Module, sizes: list[int]):
        super().__init__()
        self.linear, self.sizes = linear, sizes

    def forward(self, x, norm: nn.Module | None = None):
        return tuple(product(self.linear, x, norm).split(self.sizes, dim=-1))


def fuse_input_projections(model: nn.Module, stack) -> int:
    """Replace each `FusableInputs` module's projections of one input with `stack(layers)`, one layer
    computing all of them (None: left as they are). Returns the number of modules fused."""
    fused = 0
    for module in list(model.modules()):
        if not isinstance(module, FusableInputs) or getattr(module, "fused_inputs", None) is not None:
            continue
        names = module.input_projection_names()
        layers = [getattr(module, name) for name in names]
        stacked = stack(layers)
        if stacked is not None:
            module.fused_inputs = SplitOutputs(stacked, [m.out_features for m in layers])
            for name in names:
                delattr(module, name)
            fused += 1
    return fused


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

