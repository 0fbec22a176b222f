"""Each layer its Triton kernels, in place (`edgettt.prepare`), the way torchao's `quantize_` swaps modules: a
family's kernel subclasses (`families/<name>/kernels.py`, through `Family.kernel_layers`) compute what the plain
layers compute (the same parameters and state dict), through a kernel where one takes the inputs and through the
plain layer's code elsewhere (autograd where a kernel has no backward, a calibration observer, a shape or format
no kernel covers).
"""

from __future__ import annotations

from torch import nn

from edgettt.families.registry import family_of


def use_kernels(model: nn.Module) -> int:
    """Every layer of `model` that its family has a kernel subclass for that subclass, in place. Returns the
    number of layers changed."""
    family = family_of(model.config, missing_ok=True)
    if family is None:  # (a model of no family: the benchmark's Llama runs on torch's own kernels)
        return 0
    kernel_layers = family.kernel_layers()
    layers = [m for m in model.modules() if type(m) in kernel_layers]
    for layer in layers:
        layer.__class__ = kernel_layers[type(layer)]
    return len(layers)


def use_compiled_decode(model: nn.Module, token_kernel: bool = True) -> int:
    """The layers of `model` as a decode step that torch.compile traces takes them (after `use_kernels`, or in
    its place; each token in one operation where `token_kernel` and the layer takes it), where its family has
    such a step (`Family.compiled_decode`). Returns the number of layers that decode a token in one operation."""
    family = family_of(model.config, missing_ok=True)
    compiled = family.compiled_decode if family is not None else None
    return 0 if compiled is None else compiled(model, token_kernel)
