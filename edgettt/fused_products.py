"""A weight product with what surrounds it in a block (`product`): the norm before it, SwiGLU's activation
before the down projection, the residual add after it; and `use_fused_products`, which lets a compiled
decode step run each of those as one int4 GEMV launch.

The model always computes `residual + layer(prologue(x))` through `product`. Written out (eager, the ONNX
export, autograd, more than GEMV_MAX_ROWS rows, any layer but an int4 one marked by `use_fused_products`)
it is exactly the modules' composition. Inside a decode step that torch.compile traces, a marked int4
layer's product becomes `edgettt::int4_linear_fused`: the GEMV kernel reads x, applies the norm (each GEMV
program walks all of K: an RMSNorm's statistics on the way, a LayerNorm's in a pass over the row first) or
the activation as it loads it, and
adds the residual as it stores, where inductor would make a kernel of its own for the norm, the activation
and the add around the opaque GEMV (a batch-1 760m int4 token: 10 kernels a layer, each ~1-2 us,
`benchmarks/results/model_speed_h200.md`). The norm's output is then never rounded to bfloat16 (fp32 in
the kernel), the one difference from the written-out form.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .kernels import GEMV_MAX_ROWS
from .ops import fused_decode


def norm_kind(norm: nn.Module) -> str | None:
    """"rms" (a module with `norm_kind = "rms"`: weight * x / sqrt(mean x^2 + eps)), "layer" (nn.LayerNorm
    with weight and bias), or None for a norm the GEMV cannot apply."""
    if isinstance(norm, nn.LayerNorm):
        return "layer" if norm.weight is not None and norm.bias is not None else None
    return getattr(norm, "norm_kind", None)


def product(layer: nn.Module, x: torch.Tensor, norm: nn.Module | None = None, up: torch.Tensor | None = None,
            residual: torch.Tensor | None = None, glu: bool = False) -> torch.Tensor:
    """residual + layer(x'), x' = norm(x) with a norm, silu(x) * up with `up`, else x (residual optional);
    `glu`: layer is a stacked gate/up product, and the result silu(gate) * up of its two halves instead."""
    kind = "none" if norm is None else norm_kind(norm)
    if getattr(layer, "fuse_prologues", False) and (glu or any(t is not None for t in (norm, up, residual))) \
            and _fuses(x, kind):
        weight, bias, eps = (None, None, 0.0) if norm is None else (norm.weight, getattr(norm, "bias", None), float(norm.eps))
        return torch.ops.edgettt.int4_linear_fused(x, layer.qweight, layer.scales, layer.zero_points, kind, weight,
                                                   bias, eps, up, residual, layer.decode_a8, glu)
    if norm is not None:
        x = norm(x)
    if up is not None:
        x = F.silu(x) * up
    y = layer(x)
    if glu:
        gate, up_half = y.chunk(2, dim=-1)
        return F.silu(gate) * up_half
    return y if residual is None else residual + y


def _fuses(x: torch.Tensor, kind: str | None) -> bool:
    """Whether a marked layer's product of x runs fused: a compiled decode step's GEMV rows, without autograd,
    with no norm or one the kernel applies (`kind` not None; off CUDA the op runs its reference: what the CPU
    tests trace)."""
    return (fused_decode() and not x.requires_grad and x.numel() // x.shape[-1] <= GEMV_MAX_ROWS
            and kind is not None)


def use_fused_products(model: nn.Module) -> int:
    """Mark every int4 layer of `model` (a `QuantLinear` of format "int4") to run its compiled decode products
    fused with their norm, activation and residual (`product`); a group the kernels do not take runs the op's
    reference, as its unfused product would. Nothing changes outside a compiled decode step. Returns the
    number of layers marked."""
    layers = [m for m in model.modules() if getattr(getattr(m, "format", None), "fused_decode_products", False)]
    for layer in layers:
        layer.fuse_prologues = True
    return len(layers)
