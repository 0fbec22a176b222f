"""Batch-1 decode's weight products as element-wise products and sums (`use_row_products`), for the
decode step that `edgettt.prepare` compiles with torch.compile.

At one row (one sequence, one token) a linear layer is a GEMV, and cuBLAS runs each as a kernel of its own
(often split-K, then a reduction kernel and a bias epilogue) between the kernels inductor makes for the
norms and activations around it: a compiled 125m step was ~220 kernels a token, bound by their count and
not by its bytes (`benchmarks/results/compiled_decode_h200.md`). Written as `(x * W).sum(-1)`, the product
is a reduction that inductor generates itself and fuses with what makes its input (a norm's scaling) and
what reads its result (an activation, a residual add). At more than one row the layers multiply as before. Quantized layers keep their GEMV kernels: their dequantization written
into the same reduction measured no faster (125m, int4 g64: 1,761 against 1,744 tokens/s,
`benchmarks/results/compiled_decode_h200.md`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from edgettt.ops import row_product


class RowProductLinear(nn.Linear):
    """nn.Linear whose single row (batch 1, one token) is a `row_product` (same parameters, same state dict)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() == x.shape[-1]:
            return row_product(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


# Widest hidden size at which a batch-1 step's float products pay as reductions: measured on the H200,
# 1.27x at 768 (125m, benchmarks/results/compiled_decode_h200.md), 0.93x at 1536 (760m).
ROW_PRODUCTS_MAX_HIDDEN = 1024


def row_products_pay(model: nn.Module) -> bool:
    """Whether `use_row_products` speeds up `model`'s batch-1 compiled step (by its hidden size, as measured)."""
    return model.config.hidden_size <= ROW_PRODUCTS_MAX_HIDDEN


def use_row_products(model: nn.Module) -> int:
    """Every float nn.Linear of `model` a `RowProductLinear`, in place (its parameters shared and unchanged).
    Returns the number of layers changed."""
    linears = [m for m in model.modules() if type(m) is nn.Linear]
    for module in linears:
        module.__class__ = RowProductLinear
    return len(linears)
