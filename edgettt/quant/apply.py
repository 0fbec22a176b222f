"""Quantizing a model: `quantize_model(model, QuantConfig, calibration)` does it completely, in place
(weights, the decode state's format, the record of both in `model.config.quantization`);
`prepare_quantized` shapes a freshly built model like a saved quantized one before loading it.
"""

from __future__ import annotations

import fnmatch

import torch
from torch import nn

from edgettt.errors import EdgetttError
from edgettt.weights_io import stored_dtype_of
from edgettt.quant.config import DEFAULT_SKIP, QuantConfig
from edgettt.quant.linear import QuantLinear, QuantState, TiedEmbedding
from edgettt.formats.state_formats import saved_state_format, state_format
from edgettt.quant.weight_formats import stored_tensor_names, weight_format


def quantizable_linears(model: nn.Module, config: QuantConfig) -> list[tuple[str, nn.Linear]]:
    out = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and module.bias is None:
            if not any(fnmatch.fnmatch(name, pat) or fnmatch.fnmatch(name, f"*{pat}*") for pat in config.skip):
                out.append((name, module))
    return out


def layer_formats(model: nn.Module, config: QuantConfig) -> dict[str, str]:
    """The format each quantizable layer gets: the one `config.overrides` asks for it, else `config.weights`
    where it fits, else `config.fallback` ("float": left as it is). With fallback "refuse", a one-line error
    listing every layer that does not fit. Decided before any layer is quantized; empty for weights "none"."""
    return {name: fmt for name, (fmt, _) in layer_plan(model, config).items()}


def layer_plan(model: nn.Module, config: QuantConfig) -> dict[str, tuple[str, int]]:
    """`layer_formats` with each layer's group size: (format, group) a layer (a mix names a group per layer)."""
    if config.weights == "none":
        return {}
    plan, misfits = {}, []
    for name, linear in quantizable_linears(model, config):
        asked = config.override(name)
        if asked is not None and (asked[0] == "float" or weight_format(asked[0]).fits(linear.in_features, asked[2])):
            plan[name] = asked[0], asked[2]
        elif config.fits(linear.in_features):
            plan[name] = config.weights, config.group_size
        else:
            misfits.append(f"{name} (K={linear.in_features})")
            plan[name] = config.fallback, config.group_size
    if misfits and config.fallback == "refuse":
        raise EdgetttError(f"{config.weights} in groups of {config.group_size} cannot take {len(misfits)} layers, whose "
                           f"input size is not a multiple of {config.group_size}: {', '.join(misfits[:4])}"
                           f"{' and more' if len(misfits) > 4 else ''}; choose another group size, skip them, or "
                           "let them fall back to int8 or float")
    return plan


def set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, module)


def quantize_layer(name: str, linear: nn.Linear, fmt: str, group: int, config: QuantConfig, feedback) -> QuantLinear:
    """`linear` in format `fmt`; `feedback` is a calibration's error feedback for this layer (GPTQ: its input
    statistics), None where it has none."""
    # a fallback's own grid takes the config's method where it can; a format asked for the layer by name rounds
    # to nearest (lm_head's int8) unless the override names its method (a mix's int4-gptq-g32)
    asked = config.override(name)
    method = asked[1] if asked is not None else config.method if config.method in weight_format(fmt).methods else "rtn"
    if method == "gptq" and feedback is None:
        if asked is not None:  # (lm_head has no input statistics: calibration leaves it out)
            method = "rtn"
        else:
            raise EdgetttError(f"{name}: GPTQ needs input statistics; calibrate the model (`edgettt calibrate`) first")
    w = linear.weight.detach().float().cpu()
    tensors = weight_format(fmt).quantize(w, group, feedback if method == "gptq" else None)
    return QuantLinear(w.shape[1], w.shape[0], fmt, group, tensors)


@torch.no_grad()
def quantize_(model: nn.Module, config: QuantConfig, calibration=None, report=None) -> list[dict]:
    """The weights-only step: replace the model's linear layers by QuantLinear in place (GPTQ takes
    `calibration`'s error feedback, `Calibration.feedback`). `report(row)`
    sees one dict per layer (name, shape, format, fallback, bytes before and after). Returns those rows."""
    plan = layer_plan(model, config)
    asked = dict(config.overrides)
    config.overrides = {name: asked.get(name, fmt) for name, (fmt, _) in plan.items()
                        if name in asked or fmt != config.weights}
    rows = []
    for name, linear in quantizable_linears(model, config) if plan else []:
        fmt, group = plan[name]
        before = linear.weight.numel() * linear.weight.element_size()
        after = before
        if fmt != "float":
            feedback = calibration.feedback(name) if calibration is not None else None
            q = quantize_layer(name, linear, fmt, group, config, feedback)
            set_module(model, name, q.to(linear.weight.device))
            after = q.nbytes()
        row = {"name": name, "shape": list(linear.weight.shape), "format": asked.get(name, fmt),
               "fallback": fmt != config.weights and name not in asked, "bytes_before": before,
               "bytes_after": after}
        rows.append(row)
        if report:
            report(row)
    tie_quantized_embedding(model)
    return rows


def tie_quantized_embedding(model: nn.Module) -> None:
    """A tied model with a quantized lm_head reads its input embedding from the head's quantized rows
    (`TiedEmbedding`): the float table is gone from memory, the saved model and the export."""
    if getattr(model.config, "tie_word_embeddings", False) and isinstance(getattr(model, "lm_head", None), QuantLinear):
        set_module(model, model.EMBEDDING_KEY.rsplit(".", 1)[0], TiedEmbedding(model.lm_head))


def apply_state_format(model: nn.Module, name: str, calibration=None) -> None:
    """Set every converted layer's state format, with the scales the format takes (the calibration's
    for int8)."""
    fmt = state_format(name)
    for i, (_, layer) in enumerate(model.state_layers()):
        scales, bucket_tokens = fmt.initial_scales(layer.initial_states(), calibration, i)
        layer.set_state_format(name, scales, bucket_tokens)


def skip_patterns(extra=(), quantize_lm_head: bool = False) -> tuple[str, ...]:
    """The layers left in float: lm_head by default, plus `extra` patterns (added, never replacing it)."""
    return (() if quantize_lm_head else DEFAULT_SKIP) + tuple(p for p in extra if p not in DEFAULT_SKIP)


def check_calibration_covers(cal, model: nn.Module, config: QuantConfig, source: str = "calibration") -> None:
    """What `config` will read from the calibration is there and fits `model`, before any work."""
    if cal is None:
        if config.needs_calibration():
            raise EdgetttError(f"method {config.method!r} / state {config.state!r} needs a calibration "
                               "(edgettt.calibrate or `edgettt calibrate`)")
        return
    cal.check_model(model, source)
    cal.check_shapes(model, source)
    if state_format(config.state).needs_calibration and not cal.state_scales:
        raise EdgetttError(f"{source}: has no state scales for the {config.state} state; make it with `edgettt calibrate`")
    if config.method == "gptq":
        missing = [name for name, _ in quantizable_linears(model, config)
                   if name not in cal.hessians and name not in config.overrides]  # (asked formats round to nearest)
        if missing:
            raise EdgetttError(f"{source}: no input statistics for {', '.join(missing[:3])}; GPTQ needs them, make the "
                               "file with `edgettt calibrate` on this model")


def quantize_model(model: nn.Module, config: QuantConfig, calibration=None, report=None,
                   source: str = "calibration", name: str = "model") -> list[dict]:
    """Quantize a converted model completely, in place: weights (`quantize_`), the decode state's format,
    and the record of both in `model.config.quantization` (saved with the model). Everything is checked
    before any layer changes: the model's form, that it is not quantized yet, that `calibration` holds
    what GPTQ and the int8 state read, and (in `quantize_`, first) that each layer has a format that fits.
    Returns one row per layer (name, shape, format, fallback, bytes before and after)."""
    if model.form == "ttt":
        raise EdgetttError(f"{name}: an original TTT model; quantize a converted one (edgettt.convert / "
                           "`edgettt convert`)")
    if model.config.quantization:
        raise EdgetttError(f"{name}: already quantized; quantize the unquantized converted model")
    refusal = model.state_format_refusal(config.state)
    if refusal:
        raise EdgetttError(f"{name}: {refusal}")
    check_calibration_covers(calibration, model, config, source)
    rows = quantize_(model, config, calibration, report=report)
    apply_state_format(model, config.state, calibration)
    model.config.quantization = config.to_dict()
    return rows


def prepare_quantized(model: nn.Module, weights: dict[str, torch.Tensor], source: str = "model") -> None:
    """Shape a freshly built model like the quantized one whose `weights` (read from the directory
    `source`) will be loaded into it."""
    config = QuantConfig.from_dict(model.config.quantization, f"{source}/config.json")
    config.state = saved_state_format(config.state, weights).name
    model.config.quantization["state"] = config.state  # (an old name read as today's)
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and f"{name}.qweight" in weights:
            fmt, _, group = config.override(name) or (config.weights, config.method, config.group_size)
            if fmt in ("float", "none") or not weight_format(fmt).fits(module.in_features, group):
                raise EdgetttError(f"{source}/config.json: {name} cannot be {fmt} with groups of {group}; "
                                   "quantize the model again")
            state = QuantState(fmt, group, module.in_features, module.out_features)
            set_module(model, name, state.empty_layer())
    tie_quantized_embedding(model)
    fmt = state_format(config.state)
    for i, (layer_name, layer) in enumerate(model.state_layers()):
        try:
            fmt.load(layer, weights, f"{layer_name}.")
        except EdgetttError as exc:
            raise EdgetttError(f"{source}: layer {i}: {exc}") from None


def weight_bits(model: nn.Module, store: torch.dtype | None = None) -> dict:
    """Size of the weights and bits per weight (a quantized layer counts its N*K weights), each tensor in the
    dtype a file written with `store` holds it in (`weights_io.stored_dtype_of`; `weights_io.saved_float_dtype`
    gives what a model directory keeps); None counts them as held (float32 after loading)."""
    stored = tuple(f".{name}" for name in stored_tensor_names())
    n_bytes = sum(t.numel() * stored_dtype_of(t, store).itemsize for t in model.weights().values())
    n_weights = sum(t.numel() for name, t in model.weights().items()
                    if not name.endswith(stored) and ".state_" not in name)
    n_weights += sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, QuantLinear))
    return {"size_mb": n_bytes / 1e6, "bits_per_weight": 8 * n_bytes / n_weights, "weights": n_weights}
