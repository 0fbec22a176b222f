"""Quantization (DESIGN section 5): everything a quantized model is made of, in one place.

    quantize_model(model, QuantConfig("int4", 64, "gptq", state="int8"), calibration)

quantizes a converted model completely, in place: weights, the decode state's format and the record
of both in its config (`edgettt.quantize` does it on a copy). The package:

    layouts.py        int8 and int4 bytes and back (a leaf: the kernels' references read it)
    state_formats.py  fp32 / fp16 / int12 / int8 / int8-tensor state formats and their formulas (a leaf)
    weight_formats.py the weight-format registry: quantize, store, dequantize, kernel, ONNX op
    gptq.py           GPTQ error feedback (int8 and int4 use it)
    config.py         QuantConfig, saved in a quantized model's config.json
    linear.py         QuantLinear, a layer stored in a weight format
    apply.py          quantize_model, quantize_ (weights only), prepare_quantized (before loading)
    calibration.py    the statistics GPTQ and the int8 state read (`edgettt calibrate`)
    mixed.py          mixed precision by budget: each layer's format chosen for a size or KLD target

The names below are imported on first use, so that the leaves (which the model and the kernels
import) come without the rest: `from edgettt.quant import QuantConfig` works as usual.
"""

import importlib

_LAZY = {
    "QuantConfig": "config", "GROUP_SIZES": "config", "FALLBACKS": "config", "DEFAULT_SKIP": "config",
    "WEIGHT_FORMATS": "weight_formats", "METHODS": "weight_formats", "weight_format": "weight_formats",
    "STATE_FORMATS": "state_formats", "state_format": "state_formats",
    "QuantLinear": "linear", "QuantState": "linear", "set_activations": "linear", "stacked_projection": "linear",
    **{name: "apply" for name in ("quantize_model", "quantize_", "prepare_quantized", "apply_state_format",
                                  "layer_formats", "quantizable_linears", "skip_patterns",
                                  "check_calibration_covers", "weight_bits", "set_module")},
    "Calibration": "calibration", "calibrate": "calibration",
    "Budget": "mixed", "MixedPlan": "mixed", "search_mix": "mixed",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'edgettt.quant' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
