"""Quantization (DESIGN section 5): what a quantized model is made of.

    quantize_model(model, QuantConfig("int4", 64, "gptq", state="int8"), calibration)

quantizes a model completely, in place: weights, the decode state's format and the record of both in
its config (`edgettt.quantize` does it on a copy). The package:

    weight_formats.py the weight-format registry: quantize, store, dequantize, kernel, ONNX op
    config.py         QuantConfig, saved in a quantized model's config.json
    linear.py         QuantLinear, a layer stored in a weight format
    apply.py          quantize_model, quantize_ (weights only), prepare_quantized (before loading)
    state_scales.py   a layer's state format and scales (what a family's state layers share)

The bit layouts and the state's number formats are below it (`edgettt.formats`); the statistics GPTQ
and the int8 state read, GPTQ itself and the mixed-precision search are above it (`edgettt.calibration`).
"""

from edgettt.quant.apply import (apply_state_format, check_calibration_covers, layer_formats, prepare_quantized,
                                 quantizable_linears, quantize_, quantize_model, set_module, skip_patterns,
                                 weight_bits)
from edgettt.quant.config import DEFAULT_SKIP, FALLBACKS, GROUP_SIZES, QuantConfig
from edgettt.quant.linear import QuantLinear, QuantState, set_activations, stacked_projection
from edgettt.quant.weight_formats import METHODS, WEIGHT_FORMATS, weight_format

__all__ = ["QuantConfig", "GROUP_SIZES", "FALLBACKS", "DEFAULT_SKIP", "WEIGHT_FORMATS", "METHODS", "weight_format",
           "QuantLinear", "QuantState", "set_activations", "stacked_projection", "quantize_model", "quantize_",
           "prepare_quantized", "apply_state_format", "layer_formats", "quantizable_linears", "skip_patterns",
           "check_calibration_covers", "weight_bits", "set_module"]
