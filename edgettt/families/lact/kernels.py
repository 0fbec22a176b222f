"""LaCT's layer with its Triton kernels (`edgettt.prepare`, `fast_paths.layers.use_kernels`): the parallel form's
prefill through `ops.lact.triton`."""

from __future__ import annotations

from edgettt.families.lact.model import LaCTLayer
from edgettt.ops.lact import triton as lact_triton


class LaCTLayerKernels(LaCTLayer):
    chunk = staticmethod(lact_triton.chunk)


KERNEL_LAYERS = {LaCTLayer: LaCTLayerKernels}
