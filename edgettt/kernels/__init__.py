"""Triton kernels, each beside a plain-torch reference with the same signature (DESIGN section 8).

Kernels are used on CUDA by default; `EDGETTT_KERNELS=0` forces the references. On a CPU, tests
run the kernels under `TRITON_INTERPRET=1` (fp32/fp16 only), set before this package is imported.
"""

import os

import torch


POISON_OUTPUTS = False  # tests switch it on: every kernel output starts as NaN, so unwritten elements show


def fresh(t: torch.Tensor) -> torch.Tensor:
    """A newly allocated kernel output: as is, or filled with NaN when POISON_OUTPUTS is on."""
    return t.fill_(float("nan")) if POISON_OUTPUTS else t


def kernels_enabled(x: torch.Tensor) -> bool:
    """Whether a kernel should handle a computation on tensor `x`."""
    return x.is_cuda and os.environ.get("EDGETTT_KERNELS", "1") != "0"
