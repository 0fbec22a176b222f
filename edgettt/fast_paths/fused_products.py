"""An int4 weight product with what surrounds it in a block (`mixer.product`: the norm before it, SwiGLU's
activation before the down projection, the residual add after it) as one GEMV launch, for the compiled
decode step `edgettt.prepare` sets up (`use_fused_products`).

The model computes `residual + layer(prologue(x))` through `mixer.product`, which hands the whole of it to
a layer with `product_with`. A `FusedInt4Linear` takes it at GEMV rows (at most GEMV_MAX_ROWS) without
autograd: `edgettt::int4_linear_fused`, whose kernel reads x, applies the norm (each GEMV program walks all
of K: an RMSNorm's statistics on the way, a LayerNorm's in a pass over the row first) or the activation as
it loads it, and adds the residual as it stores, where inductor would make a kernel of its own for the
norm, the activation and the add around the opaque GEMV (a batch-1 760m int4 token: 10 kernels a layer,
each ~1-2 us, `benchmarks/results/model_speed_h200.md`). The norm's output is then never rounded to
bfloat16 (fp32 in the kernel), the one difference from the written-out form; off CUDA the op runs its
reference.
"""

from __future__ import annotations

import torch
from torch import nn

from edgettt.ops.common import GEMV_MAX_ROWS
from edgettt.quant.linear import QuantLinear


def norm_kind(norm: nn.Module) -> str | None:
    """"rms" (a module with `norm_kind = "rms"`: weight * x / sqrt(mean x^2 + eps)), "layer" (nn.LayerNorm
    with weight and bias), or None for a norm the GEMV cannot apply."""
    if isinstance(norm, nn.LayerNorm):
        return "layer" if norm.weight is not None and norm.bias is not None else None
    return getattr(norm, "norm_kind", None)


class FusedInt4Linear(QuantLinear):
    """An int4 `QuantLinear` that computes its products with their norm, activation and residual in one
    launch where it can (same parameters, same state dict)."""

    def product_with(self, x, norm=None, up=None, residual=None, glu: bool = False) -> torch.Tensor | None:
        """`mixer.product`'s result in one operation, or None where the written-out form must run (more rows
        than a GEMV, autograd, a norm the kernel does not apply, nothing around the product)."""
        kind = "none" if norm is None else norm_kind(norm)
        if (kind is None or x.requires_grad or x.numel() // x.shape[-1] > GEMV_MAX_ROWS
                or not (glu or any(t is not None for t in (norm, up, residual)))):
            return None
        weight, bias, eps = (None, None, 0.0) if norm is None else (norm.weight, getattr(norm, "bias", None),
                                                                     float(norm.eps))
        return torch.ops.edgettt.int4_linear_fused(x, self.qweight, self.scales, self.zero_points, kind, weight,
                                                   bias, eps, up, residual, self.decode_a8, glu)


def use_fused_products(model: nn.Module) -> int:
    """Every int4 layer of `model` (a `QuantLinear` whose format has `fused_decode_products`) a
    `FusedInt4Linear`, in place; a group the kernels do not take runs the op's reference, as its unfused
    product would. Returns the number of layers changed."""
    layers = [m for m in model.modules() if type(m) is QuantLinear and m.format.fused_decode_products]
    for layer in layers:
        layer.__class__ = FusedInt4Linear
    return len(layers)
