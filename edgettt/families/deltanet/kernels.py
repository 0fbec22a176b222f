"""The delta-rule layer through flash-linear-attention's Triton kernels where fla is installed (`edgettt.prepare`,
`fast_paths.layers.use_kernels`): its chunked prefill and its decode recurrence on CUDA (`ops.delta_rule.fla_kernels`);
the plain-torch reference elsewhere and in training."""

from __future__ import annotations

import torch

from edgettt.families.deltanet.model import DeltaRuleLayer
from edgettt.ops.delta_rule import fla_kernels, reference


class DeltaRuleLayerKernels(DeltaRuleLayer):
    chunk = staticmethod(fla_kernels.chunk)
    recurrent = staticmethod(fla_kernels.recurrent)


KERNEL_LAYERS = {DeltaRuleLayer: DeltaRuleLayerKernels}


def compile_training_chunk() -> None:
    """The chunked form compiled by torch.compile for every delta-rule layer from now on: training, where fla's
    backward is refused, takes the plain-torch form, and inductor fuses its chains of small operations. The
    first call of each shape compiles."""
    compiled = staticmethod(torch.compile(reference.chunk, dynamic=False))
    DeltaRuleLayer.chunk = DeltaRuleLayerKernels.chunk = compiled
