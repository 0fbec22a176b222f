"""Weight quantization (DESIGN section 5): `quantize_model(model, QuantConfig, calibration)` quantizes a
converted model completely (weights, decode-state format, the record in its config); `quantize_` is
its weights-only step.

Formats (edgettt's own): int8 per output channel and int4 in ONNX Runtime's MatMulNBits layout, both
described and packed in `formats.py`.
Formats through bitsandbytes: nf4 / fp4 (blockwise 4-bit with absmax per block), and bnb-int8
(LLM.int8: int8 rows with absmax SCB; at run time activation columns above the outlier threshold 6
go through fp16, the rest through an int8 matmul, as `bitsandbytes.matmul` does).

Methods for int4 and int8: `rtn` (round to nearest; int4: min/max per group) and `gptq` (GPTQ error
feedback: columns are quantized in order and each one's rounding error is spread over the columns
not yet quantized, weighted by the inverse Hessian of the layer's inputs, from `edgettt calibrate`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import math

import torch
import torch.nn.functional as F
from torch import nn

from .errors import EdgetttError
from .kernels import kernels_enabled

WEIGHT_FORMATS = ("int8", "int4", "nf4", "fp4", "bnb-int8")
LLM_INT8_THRESHOLD = 6.0
METHODS = ("rtn", "gptq")
STATE_FORMATS = ("fp32", "fp16", "int8", "int8-tensor")
DEFAULT_SKIP = ("lm_head",)  # always kept in float unless asked otherwise; --skip adds to it
GROUP_SIZES = (32, 64, 128)
FALLBACKS = ("int8", "float", "refuse")  # for a layer the asked format cannot take (llama.cpp's fallback types)


@dataclasses.dataclass
class QuantConfig:
    weights: str = "int8"
    group_size: int = 64
    method: str = "rtn"
    state: str = "fp32"  # int8: calibrated per-row scales; int8-tensor: one uncalibrated scale
    skip: tuple[str, ...] = DEFAULT_SKIP  # fnmatch patterns of module names left in float
    fallback: str = "int8"  # the format of a layer `weights` cannot take (int4/nf4/fp4: K not a multiple of the group)
    overrides: dict = dataclasses.field(default_factory=dict)  # layer -> format it got instead (filled by quantize_)

    def __post_init__(self):
        if self.fallback not in FALLBACKS:
            raise EdgetttError(f"--fallback {self.fallback!r}: expected one of {', '.join(FALLBACKS)}")
        if not isinstance(self.overrides, dict) or not all(
                isinstance(k, str) and v in WEIGHT_FORMATS + ("float",) for k, v in self.overrides.items()):
            raise EdgetttError(f"overrides {self.overrides!r}: expected layer names with their formats")
        if isinstance(self.skip, str) or not all(isinstance(p, str) for p in self.skip):
            raise EdgetttError(f"--skip {self.skip!r}: expected name patterns")
        self.skip = tuple(self.skip)
        if self.group_size not in GROUP_SIZES or isinstance(self.group_size, bool):
            raise EdgetttError(f"--group-size {self.group_size!r}: expected one of {', '.join(map(str, GROUP_SIZES))}")
        if self.weights not in WEIGHT_FORMATS + ("none",):
            raise EdgetttError(f"--weights {self.weights!r}: expected one of {', '.join(WEIGHT_FORMATS)}, none")
        if self.method not in METHODS:
            raise EdgetttError(f"--method {self.method!r}: expected one of {', '.join(METHODS)}")
        if self.state not in STATE_FORMATS:
            raise EdgetttError(f"--state {self.state!r}: expected one of {', '.join(STATE_FORMATS)}")
        if self.method == "gptq" and self.weights not in ("int4", "int8"):
            raise EdgetttError("--method gptq applies to --weights int4 and int8 only")

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "skip": list(self.skip), "overrides": dict(self.overrides)}

    def fits(self, in_features: int) -> bool:
        """Whether `weights` can take a layer of this input size (groups and blocks along the input)."""
        return self.weights not in ("int4", "nf4", "fp4") or in_features % self.group_size == 0

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json") -> "QuantConfig":
        """From a config.json's `quantization`: the same checks as the command line, named by file."""
        try:
            return cls(**{f.name: raw[f.name] for f in dataclasses.fields(cls) if f.name in raw})
        except (EdgetttError, TypeError) as exc:
            raise EdgetttError(f"{source}: quantization is malformed ({str(exc).split(':')[0]}: "
                               f"{raw}); quantize the model again") from None


# int8 and int4 layouts live in formats.py (a leaf the kernels import); re-exported here
from .formats import (dequantize_int4, dequantize_int8, int4_codes, int4_group_params,  # noqa: E402, F401
                      pack_int4, pack_nibbles, quantize_int8, unpack_nibbles)


def quantize_int4_rtn(w: torch.Tensor, group: int) -> dict[str, torch.Tensor]:
    scale, zero = int4_group_params(w, group)
    return pack_int4(int4_codes(w, scale, zero), scale, zero)


def gptq(w: torch.Tensor, hessian: torch.Tensor, round_column, damp: float = 0.01, block: int = 128) -> None:
    """GPTQ error feedback: columns are rounded in order, and each one's rounding error is spread
    over the columns not yet rounded, weighted by the inverse Hessian of the layer's inputs.

    `round_column(col, column, ahead)` returns column `col` (its error-updated values `column`, [N])
    rounded and dequantized; `ahead()` gives the error-updated weights from `col` on ([N, K - col]),
    for formats that choose their grid late."""
    w = w.clone().float()
    N, K = w.shape
    H = hessian.clone().double()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    w[:, dead] = 0
    H += damp * torch.diag(H).mean() * torch.eye(K, dtype=H.dtype)
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True).float()
    for b0 in range(0, K, block):
        b1 = min(b0 + block, K)
        W1, Err = w[:, b0:b1].clone(), torch.zeros(N, b1 - b0)
        for i in range(b1 - b0):
            col = b0 + i
            rounded = round_column(col, W1[:, i], lambda: torch.cat((W1[:, i:], w[:, b1:]), dim=1))
            err = (W1[:, i] - rounded) / Hinv[col, col]
            W1[:, i:] -= err[:, None] * Hinv[col, col:b1][None, :]
            Err[:, i] = err
        w[:, b1:] -= Err @ Hinv[b0:b1, b1:]


def quantize_int4_gptq(w: torch.Tensor, group: int, hessian: torch.Tensor) -> dict[str, torch.Tensor]:
    """GPTQ with per-group asymmetric scales chosen from the error-updated weights."""
    N, K = w.shape
    codes, scale, zero = torch.zeros(N, K), torch.zeros(N, K // group), torch.zeros(N, K // group)

    def round_column(col, column, ahead):
        g = col // group
        if col % group == 0:  # choose the group's grid from the weights as updated so far
            scale[:, g:g + 1], zero[:, g:g + 1] = int4_group_params(ahead()[:, :group], group)
        codes[:, col] = torch.clamp(torch.round(column / scale[:, g]) + zero[:, g], 0, 15)
        return (codes[:, col] - zero[:, g]) * scale[:, g]

    gptq(w, hessian, round_column)
    return pack_int4(codes, scale, zero)


def quantize_int8_gptq(w: torch.Tensor, hessian: torch.Tensor) -> dict[str, torch.Tensor]:
    """GPTQ with the per-channel symmetric int8 grid of `quantize_int8` (scales from the weights)."""
    scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127
    codes = torch.zeros(w.shape, dtype=torch.int8)

    def round_column(col, column, ahead):
        q = torch.round(column / scale).clamp(-127, 127)
        codes[:, col] = q.to(torch.int8)
        return q * scale

    gptq(w, hessian, round_column)
    return {"qweight": codes, "scales": scale.float()}


# ---- bitsandbytes ---------------------------------------------------------------------------------

def bitsandbytes():
    """bitsandbytes.functional, imported without its remark on a missing `kernels` package (its CPU
    backend looks for an optional faster kernel at import; edgettt does not use it)."""
    quiet = logging.getLogger("bitsandbytes")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        import bitsandbytes.functional as bnbf
    except ImportError as exc:
        raise EdgetttError(f"bitsandbytes is not installed ({exc}); `pip install bitsandbytes` for nf4, fp4 "
                           "and bnb-int8") from None
    except Exception as exc:  # a broken install raises anything at import
        raise EdgetttError(f"bitsandbytes cannot load a backend ({exc}); reinstall it for this machine") from None
    finally:
        quiet.setLevel(level)
    return bnbf


def quantize_bnb4(w: torch.Tensor, quant_type: str, blocksize: int) -> dict[str, torch.Tensor]:
    packed, state = bitsandbytes().quantize_4bit(w.float().contiguous(), blocksize=blocksize,
                                                  compress_statistics=False, quant_type=quant_type)
    return {"qweight": packed, "absmax": state.absmax.float(), "code": state.code.float()}


def dequantize_bnb4(t: dict[str, torch.Tensor], shape: tuple[int, int], quant_type: str,
                    blocksize: int) -> torch.Tensor:
    bnbf = bitsandbytes()
    state = bnbf.QuantState(absmax=t["absmax"], shape=torch.Size(shape), code=t["code"], blocksize=blocksize,
                            quant_type=quant_type, dtype=torch.float32)
    return bnbf.dequantize_4bit(t["qweight"], state).float()


def quantize_llm_int8(w: torch.Tensor) -> dict[str, torch.Tensor]:
    cb, scb, _ = bitsandbytes().int8_vectorwise_quant(w.half().contiguous())
    return {"qweight": cb, "scb": scb.float()}


def llm_int8_matmul(x: torch.Tensor, t: dict[str, torch.Tensor]) -> torch.Tensor:
    import bitsandbytes as bnb

    state = bnb.MatmulLtState()
    state.CB, state.SCB, state.threshold, state.has_fp16_weights = t["qweight"], t["scb"], LLM_INT8_THRESHOLD, False
    flat = x.reshape(-1, x.shape[-1]).half()
    return bnb.matmul(flat, t["qweight"], state=state).to(x.dtype).reshape(*x.shape[:-1], -1)


# ---- the module and the entry point ---------------------------------------------------------------

class QuantLinear(nn.Module):
    """A bias-free linear layer whose weight is stored quantized; it computes with the dequantized
    weight (exactly what the integer kernels and ONNX Runtime compute, up to float rounding)."""

    def __init__(self, in_features: int, out_features: int, fmt: str, group_size: int,
                 tensors: dict[str, torch.Tensor]):
        super().__init__()
        self.in_features, self.out_features, self.fmt, self.group_size = in_features, out_features, fmt, group_size
        for name, tensor in tensors.items():
            self.register_buffer(name, tensor)
        self._weight = None

    def tensors(self) -> dict[str, torch.Tensor]:
        return dict(self.named_buffers(recurse=False))

    def dequantized(self) -> torch.Tensor:
        t = self.tensors()
        if self.fmt == "int8":
            return dequantize_int8(t)
        if self.fmt == "int4":
            return dequantize_int4(t)
        if self.fmt == "bnb-int8":
            return t["qweight"].float() * t["scb"][:, None] / 127
        return dequantize_bnb4(t, (self.out_features, self.in_features), self.fmt, self.group_size)

    @property
    def weight(self) -> torch.Tensor:
        if self._weight is None or self._weight.device != self.qweight.device:
            self._weight = self.dequantized().to(self.qweight.device)
        return self._weight

    def forward(self, x):
        if self.fmt == "bnb-int8":
            return llm_int8_matmul(x, self.tensors())
        if self.fmt in ("int4", "int8") and kernels_enabled(x) and not x.requires_grad:
            # the kernels read the stored bytes: no dequantized float copy on the GPU
            from .kernels.int4 import int4_matmul, kernel_supports
            from .kernels.int8 import int8_matmul

            if self.fmt == "int8":
                return int8_matmul(x, self.qweight, self.scales)
            if kernel_supports(self.group_size):
                return int4_matmul(x, self.qweight, self.scales, self.zero_points)
        return F.linear(x, self.weight.to(x.dtype))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def extra_repr(self):
        return f"{self.in_features} -> {self.out_features}, {self.fmt}, group {self.group_size}"


def storage_shapes(fmt: str, N: int, K: int, group: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Shapes and dtypes of a QuantLinear's tensors, for building a model before loading it."""
    if fmt == "int8":
        return {"qweight": ((N, K), torch.int8), "scales": ((N,), torch.float32)}
    if fmt == "bnb-int8":
        return {"qweight": ((N, K), torch.int8), "scb": ((N,), torch.float32)}
    if fmt == "int4":
        blocks = K // group
        return {"qweight": ((N, blocks, group // 2), torch.uint8), "scales": ((N, blocks), torch.float32),
                "zero_points": ((N, math.ceil(blocks / 2)), torch.uint8)}
    return {"qweight": ((N * K // 2, 1), torch.uint8), "absmax": ((math.ceil(N * K / group),), torch.float32),
            "code": ((16,), torch.float32)}


def quantizable_linears(model: nn.Module, config: QuantConfig) -> list[tuple[str, nn.Linear]]:
    out = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and module.bias is None:
            if not any(fnmatch.fnmatch(name, pat) or fnmatch.fnmatch(name, f"*{pat}*") for pat in config.skip):
                out.append((name, module))
    return out


def layer_formats(model: nn.Module, config: QuantConfig) -> dict[str, str]:
    """The format each quantizable layer gets: `config.weights` where it fits, else `config.fallback`
    ("float": left as it is). With fallback "refuse", a one-line error listing every layer that does
    not fit. Decided before any layer is quantized."""
    formats, misfits = {}, []
    for name, linear in quantizable_linears(model, config):
        if config.fits(linear.in_features):
            formats[name] = config.weights
        else:
            misfits.append(f"{name} (K={linear.in_features})")
            formats[name] = config.fallback
    if misfits and config.fallback == "refuse":
        raise EdgetttError(f"{config.weights} in groups of {config.group_size} cannot take {len(misfits)} layers, whose "
                           f"input size is not a multiple of {config.group_size}: {', '.join(misfits[:4])}"
                           f"{' and more' if len(misfits) > 4 else ''}; choose another group size, skip them, or "
                           "let them fall back to int8 or float")
    return formats


def quantize_weight(name: str, w: torch.Tensor, fmt: str, config: QuantConfig, hessian: torch.Tensor | None):
    if config.method == "gptq" and hessian is None:
        raise EdgetttError(f"{name}: GPTQ needs input statistics; calibrate the model (`edgettt calibrate`) first")
    if fmt == "int8":
        return quantize_int8_gptq(w, hessian) if config.method == "gptq" else quantize_int8(w)
    if fmt == "bnb-int8":
        return quantize_llm_int8(w)
    if fmt == "int4" and config.method == "gptq":
        return quantize_int4_gptq(w, config.group_size, hessian)
    if fmt == "int4":
        return quantize_int4_rtn(w, config.group_size)
    return quantize_bnb4(w, fmt, config.group_size)


def set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, module)


@torch.no_grad()
def quantize_(model: nn.Module, config: QuantConfig, hessians: dict[str, torch.Tensor] | None = None,
              report=None) -> list[dict]:
    """Replace the model's linear layers by QuantLinear in place. `report(row)` sees one dict per
    layer (name, shape, format, bytes before and after). Returns those rows."""
    rows = []
    if config.weights == "none":
        return rows
    formats = layer_formats(model, config)
    config.overrides = {name: fmt for name, fmt in formats.items() if fmt != config.weights}
    for name, linear in quantizable_linears(model, config):
        w = linear.weight.detach().float().cpu()
        if formats[name] == "float":
            row = {"name": name, "shape": list(w.shape), "format": "float", "fallback": True,
                   "bytes_before": w.numel() * linear.weight.element_size(),
                   "bytes_after": w.numel() * linear.weight.element_size()}
        else:
            tensors = quantize_weight(name, w, formats[name], config, (hessians or {}).get(name))
            q = QuantLinear(w.shape[1], w.shape[0], formats[name], config.group_size, tensors)
            set_module(model, name, q.to(linear.weight.device))
            row = {"name": name, "shape": list(w.shape), "format": formats[name],
                   "fallback": formats[name] != config.weights,
                   "bytes_before": w.numel() * linear.weight.element_size(), "bytes_after": q.nbytes()}
        rows.append(row)
        if report:
            report(row)
    return rows


def prepare_quantized(model: nn.Module, weights: dict[str, torch.Tensor], source: str = "model") -> None:
    """Shape a freshly built model like the quantized one whose `weights` (read from the directory
    `source`) will be loaded into it."""
    config = QuantConfig.from_dict(model.config.quantization, f"{source}/config.json")
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and f"{name}.qweight" in weights:
            fmt = config.overrides.get(name, config.weights)
            if fmt == "float" or (fmt == config.weights and not config.fits(module.in_features)):
                raise EdgetttError(f"{source}/config.json: {name} cannot be {fmt} with groups of {config.group_size}; "
                                   "quantize the model again")
            shapes = storage_shapes(fmt, module.out_features, module.in_features, config.group_size)
            # on the meta device: load_state_dict(assign=True) puts the file's tensors in their place
            tensors = {k: torch.empty(shape, dtype=dtype, device="meta") for k, (shape, dtype) in shapes.items()}
            set_module(model, name, QuantLinear(module.in_features, module.out_features, fmt,
                                                config.group_size, tensors))
    for i, layer in enumerate(model.model.layers):
        prefix = f"model.layers.{i}.seq_modeling_block.state_scale_"
        scales = [weights[k] for k in sorted(weights) if k.startswith(prefix)]
        bucket_tokens = weights.get(f"model.layers.{i}.seq_modeling_block.state_bucket_tokens", torch.tensor(0))
        try:
            layer.seq_modeling_block.set_state_format(config.state, scales, int(bucket_tokens.reshape(-1)[0]) if bucket_tokens.numel() == 1 else -1)
        except EdgetttError as exc:
            raise EdgetttError(f"{source}: layer {i}: {exc}") from None


def skip_patterns(extra=(), quantize_lm_head: bool = False) -> tuple[str, ...]:
    """The layers left in float: lm_head by default, plus `extra` patterns (added, never replacing it)."""
    return (() if quantize_lm_head else DEFAULT_SKIP) + tuple(p for p in extra if p not in DEFAULT_SKIP)


def check_calibration_covers(cal, model: nn.Module, config: QuantConfig, source: str = "calibration") -> None:
    """What `config` will read from the calibration is there and fits `model`, before any work."""
    if cal is None:
        if config.method == "gptq" or config.state == "int8":
            raise EdgetttError(f"method {config.method!r} / state {config.state!r} needs a calibration "
                               "(edgettt.calibrate or `edgettt calibrate`)")
        return
    cal.check_model(model, source)
    cal.check_shapes(model, source)
    if config.state == "int8" and not cal.state_scales:
        raise EdgetttError(f"{source}: has no state scales for the int8 state; make it with `edgettt calibrate`")
    if config.method == "gptq":
        missing = [name for name, _ in quantizable_linears(model, config) if name not in cal.hessians]
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
    check_calibration_covers(calibration, model, config, source)
    rows = quantize_(model, config, calibration.hessians if calibration is not None else None, report=report)
    apply_state_format(model, config.state, calibration)
    model.config.quantization = config.to_dict()
    return rows


def weight_bits(model: nn.Module) -> dict:
    """Size on disk of the weights and bits per weight (a quantized layer counts its N*K weights)."""
    n_bytes = sum(t.numel() * t.element_size() for t in model.weights().values())
    n_weights = sum(t.numel() for name, t in model.weights().items() if not name.endswith(
        (".qweight", ".scales", ".zero_points", ".absmax", ".code", ".scb")) and ".state_" not in name)
    n_weights += sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, QuantLinear))
    return {"size_mb": n_bytes / 1e6, "bits_per_weight": 8 * n_bytes / n_weights, "weights": n_weights}


def apply_state_format(model: nn.Module, fmt: str, calibration=None) -> None:
    """Set every converted layer's state format: int8 takes the calibrated per-row scales of each
    position bucket; int8-tensor one uncalibrated scale per layer and level, max |S0| / 127 (for contrast)."""
    for i, layer in enumerate(model.model.layers):
        mixer = layer.seq_modeling_block
        scales, bucket_tokens = None, 0
        if fmt == "int8":
            scales, bucket_tokens = calibration.layer_scales(i), calibration.bucket_tokens
        elif fmt == "int8-tensor":
            scales = [torch.full(s0.shape[:2], s0.detach().abs().max().item() / 127) for s0 in mixer.initial_states()]
        mixer.set_state_format(fmt, scales, bucket_tokens)
