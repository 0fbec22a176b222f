"""LaCT (Large-Chunk Test-Time Training, model type `lact_swiglu`): the paper's own family (DESIGN 4.1).

    config.py              the public config keys and edgettt's (W1-only variant, form)
    window.py              the in-layer sliding-window attention and its ring buffer
    model.py               the model, with the public checkpoints' module names
    conversion.py          `convert`: form exact (LaCT's own computation) or parallel (the W1-only linear attention)
    checkpoint.py          the size check of a public checkpoint against its weights
    kernels.py             the layer with its Triton kernels (`edgettt.prepare`; imported only there)
Its operations (the fast weights' chunk-recurrent form, the W1-only parallel form, their kernels) are in
`edgettt.ops.lact`.
"""

from edgettt.families.family import Family
from edgettt.families.lact.checkpoint import check_lact_sizes
from edgettt.families.lact.config import LACT_MODEL_TYPE, LaCTConfig
from edgettt.families.lact.conversion import convert, own_form
from edgettt.families.lact.model import LaCTForCausalLM


def kernel_layers() -> dict:
    from edgettt.families.lact.kernels import KERNEL_LAYERS  # (Triton: imported where a kernel runs, not to load)

    return KERNEL_LAYERS


def export_refusal(config) -> str | None:
    if config.use_muon:
        return ("Muon orthogonalises in bfloat16, which onnxruntime's CPU matmuls do not take; export a model "
                "without use_muon")
    return None


FAMILY = Family(name="lact", model_types=(LACT_MODEL_TYPE,), config_class=LaCTConfig, model_class=LaCTForCausalLM,
                check_sizes=check_lact_sizes, convert=convert, kernel_layers=kernel_layers,
                exportable_forms=("parallel", "lact"), form_converted_to=own_form, export_refusal=export_refusal)
