"""How a model is made fast on a CUDA GPU: one call that fixes each layer's compute path.

    model = edgettt.prepare(edgettt.load("ttt-linear-tiny"), FastPaths())   # bf16 on the GPU, compiled decode

The model files compute plain math; `prepare` applies, once, what makes them fast on a device, the way
torchao's `quantize_(model, config)` swaps modules: the layers' Triton kernels (`layers.use_kernels`: the
prefill, decode-step and training kernels), the projections of one input as one product, the quantized
layers' activation type, and for the compiled decode step the tokens written for torch.compile
(`layers.use_compiled_decode`, with each converted TTT-Linear layer's token as one Triton kernel,
`ops.linear_attention.decode_token`), the batch-1 float products as fused reductions (`row_products`), each int4
product with its norm, activation and residual in one GEMV launch (`fused_products`), and the step itself
compiled by torch.compile (`compile_step`). What each gains is measured in docs/performance.md.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from edgettt.families.base import fuse_input_projections
from edgettt.families.base import State
from edgettt.quant import set_activations, stacked_projection
from edgettt.fast_paths.fused_products import use_fused_products
from edgettt.fast_paths.layers import use_compiled_decode, use_kernels  # noqa: F401  (use_kernels: the API)
from edgettt.fast_paths.row_products import row_products_pay, use_row_products


@dataclasses.dataclass(frozen=True)
class FastPaths:
    """What `prepare` applies. `kernels`: the layers' Triton kernels (`layers.use_kernels`; off: the model
    as written, plain torch); `activations`: the int8 / int4 layers' prefill GEMMs weight-only ("float") or
    on the int8 tensor cores ("int8"); `compile`: the decode step compiled by torch.compile (`step_in_place`);
    with it, `row_products` (None: where they pay, hidden size <= 1024), `token_kernel` and `fused_products`."""

    dtype: torch.dtype = torch.bfloat16
    kernels: bool = True
    activations: str = "float"
    compile: bool = True
    row_products: bool | None = None
    token_kernel: bool = True
    fused_products: bool = True


def prepare(model: torch.nn.Module, config: FastPaths | None = None, device: str = "cuda") -> torch.nn.Module:
    """Move `model` (a TTT, converted or LaCT model, or the Llama baseline) to `device` in `config.dtype` and
    fix its layers' compute paths as `config` says, in place. Returns the model, in eval mode."""
    config = config or FastPaths()
    set_activations(model, config.activations)  # (the Llama has no quantized layer and its projections are fused)
    fuse_input_projections(model, stacked_projection)  # q/k/v and gate/up one GEMM each, as the Llama's
    model = model.to(device, config.dtype).eval()
    if config.kernels:
        use_kernels(model)
    if config.compile:
        _prepare_compiled_step(model, config)
    return model


def _prepare_compiled_step(model, config: FastPaths) -> None:
    if config.row_products or (config.row_products is None and row_products_pay(model)):
        use_row_products(model)
    use_compiled_decode(model, config.token_kernel)  # (the transformer has no layer that takes it)
    if config.fused_products:
        use_fused_products(model)
    compile_step(model)


def compile_step(model) -> None:
    """`model.step_in_place` (`step_in_place` on the model) compiled by torch.compile: the whole step is
    inductor's but for quantized weights' matmuls and the layers' token kernels, which run as single
    operations (`weight_formats.int8_linear`, `int4_linear`, `edgettt::decode_token`), and the state's new
    values are written by the kernels that make them, not copied afterwards. A TTT
    model's step compiles once for its first position, then once more for any position with and without
    a commit (positions become symbolic)."""
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    model.step_in_place = torch.compile(functools.partial(step_in_place, model))


def step_in_place(model, token, state, position: int | None):
    """One decode step at `position` whose results land in `state`'s own tensors, as a CUDA graph must
    leave them (the transformer's step writes its cache in place: `position` None). Returns the logits."""
    if position is None:
        return model.step(token, state)[0]
    logits, new = model.step(token, State(position, [dict(layer) for layer in state.layers]))
    for kept, layer in zip(state.layers, new.layers):  # results back into the state's tensors
        for name, t in layer.items():
            if t is not kept[name]:
                kept[name].copy_(t)
    return logits
