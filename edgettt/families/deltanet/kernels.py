"""The delta-rule layer through flash-linear-attention's Triton kernels where fla is installed (`edgettt.prepare`,
`fast_paths.layers.use_kernels`): its chunked prefill and its decode recurrence on CUDA (`ops.delta_rule.fla_kernels`);
the plain-torch reference elsewhere and in training."""

from __future__ import annotations

from edgettt.families.deltanet.model import DeltaRuleLayer
from edgettt.ops.delta_rule import fla_kernels


class DeltaRuleLayerKernels(DeltaRuleLayer):
    chunk = staticmethod(fla_kernels.chunk)
    recurrent = staticmethod(fla_kernels.recurrent)


KERNEL_LAYERS = {DeltaRuleLayer: DeltaRuleLayerKernels}
