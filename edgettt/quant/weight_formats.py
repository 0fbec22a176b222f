"""Weight formats: each is one object that quantizes a weight matrix, says how it is stored, loads
and dequantizes it, and names the kernel and the ONNX Runtime operator that compute with its bytes
(DESIGN section 5). `WEIGHT_FORMATS` is the registry; `weight_format(name)` finds one.

    int8      symmetric per output channel (layout in `layouts.py`); Triton kernel `kernels/int8.py`;
              ONNX: DequantizeLinear + MatMul
    int4      asymmetric groups of g along K in ONNX Runtime's MatMulNBits layout (`layouts.py`);
              Triton kernel `kernels/int4.py`; ONNX: com.microsoft.MatMulNBits
    nf4, fp4  bitsandbytes' blockwise 4-bit (absmax per block of g); ONNX: com.microsoft.MatMulBnb4
    bnb-int8  bitsandbytes' LLM.int8 (int8 rows, absmax SCB; at run time activation columns above the
              outlier threshold 6 go through fp16, the rest through an int8 matmul); ONNX: as int8

Methods: `rtn` (round to nearest) everywhere; `gptq` (error feedback, `gptq.py`) for int8 and int4.

Each format's ONNX operator is a torch custom op defined here: during `torch.onnx.export` a quantized
layer calls it (its eager body computes the same in torch), and `onnx_translations()` turns it into
the ONNX node that reads the layer's bytes unchanged. onnxscript is imported only when exporting.

Adding a format: a `WeightFormat` subclass in this file and its instance in `WEIGHT_FORMATS`, with
tests (`tests/test_quantize.py` runs every registered format through the same checks). The command
line, the report, loading, the ONNX export and the byte counts all read the registry.
"""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F

from ..errors import EdgetttError
from ..kernels import kernels_enabled
from . import layouts
from .. import ort_schemas
from .gptq import gptq

LLM_INT8_THRESHOLD = 6.0


class WeightFormat:
    """The interface; a quantized layer's tensors are a dict of named buffers (saved as they are)."""

    name: str
    methods: tuple[str, ...] = ("rtn",)
    grouped = False  # groups (or blocks) of `group_size` along the input dim K: K must be a multiple
    rounds_at_run_time = False  # quantizes activations as it computes (then one ulp can flip a rounding)

    def fits(self, in_features: int, group: int) -> bool:
        return not self.grouped or in_features % group == 0

    def quantize(self, w: torch.Tensor, group: int, method: str = "rtn",
                 hessian: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def storage(self, N: int, K: int, group: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Shapes and dtypes of the stored tensors, to shape a model before loading it."""
        raise NotImplementedError

    def dequantize(self, t: dict[str, torch.Tensor], N: int, K: int, group: int) -> torch.Tensor:
        raise NotImplementedError

    def matmul(self, x: torch.Tensor, layer) -> torch.Tensor:
        """x @ W^T for a QuantLinear `layer`: through the dequantized weight unless a kernel serves it."""
        return F.linear(x, layer.weight.to(x.dtype))

    def label(self, method: str, group: int) -> str:
        """The variant's name in reports (w-LABEL)."""
        return self.name

    def export_tensors(self, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The stored tensors as the ONNX operator reads them (no copy where it reads them as they are)."""
        raise NotImplementedError

    def export_matmul(self, x: torch.Tensor, t: dict[str, torch.Tensor], K: int, N: int, group: int) -> torch.Tensor:
        """The custom op the export turns into this format's ONNX node."""
        raise NotImplementedError


# ---- int8 -----------------------------------------------------------------------------------------

class Int8(WeightFormat):
    name, methods = "int8", ("rtn", "gptq")

    def quantize(self, w, group, method="rtn", hessian=None):
        return layouts.quantize_int8(w) if method == "rtn" else _int8_gptq(w, hessian)

    def storage(self, N, K, group):
        return {"qweight": ((N, K), torch.int8), "scales": ((N,), torch.float32)}

    def dequantize(self, t, N, K, group):
        return layouts.dequantize_int8(t)

    def matmul(self, x, layer):
        if kernels_enabled(x) and not x.requires_grad:  # the kernel reads the stored bytes: no float copy
            from ..kernels.int8 import int8_matmul

            return int8_matmul(x, layer.qweight, layer.scales)
        return super().matmul(x, layer)

    def label(self, method, group):
        return self.name if method == "rtn" else f"{self.name}-{method}"

    def export_tensors(self, t):
        return {"qweight_t": t["qweight"].T.contiguous(), "scales": t["scales"]}  # [K, N] for MatMul

    def export_matmul(self, x, t, K, N, group):
        return torch.ops.edgettt.matmul_int8(x, t["qweight_t"], t["scales"])


def _int8_gptq(w: torch.Tensor, hessian: torch.Tensor) -> dict[str, torch.Tensor]:
    """GPTQ on the per-channel symmetric int8 grid of `quantize_int8` (scales from the weights)."""
    scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127
    codes = torch.zeros(w.shape, dtype=torch.int8)

    def round_column(col, column, ahead):
        q = torch.round(column / scale).clamp(-127, 127)
        codes[:, col] = q.to(torch.int8)
        return q * scale

    gptq(w, hessian, round_column)
    return {"qweight": codes, "scales": scale.float()}


@torch.library.custom_op("edgettt::matmul_int8", mutates_args=())
def matmul_int8(x: torch.Tensor, qweight_t: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [.., K] @ (qweight_t [K, N] int8 * scales [N])."""
    return x @ (qweight_t.float() * scales).to(x.dtype)


@matmul_int8.register_fake
def _(x, qweight_t, scales):
    return x.new_empty(*x.shape[:-1], qweight_t.shape[1])


def matmul_int8_onnx(x, qweight_t, scales):
    from onnxscript import opset18 as op

    return op.MatMul(x, op.DequantizeLinear(qweight_t, scales, axis=1))


# ---- int4, MatMulNBits layout -------------------------------------------------------------------------

class Int4(WeightFormat):
    name, methods, grouped = "int4", ("rtn", "gptq"), True

    def quantize(self, w, group, method="rtn", hessian=None):
        if method == "gptq":
            return _int4_gptq(w, group, hessian)
        scale, zero = layouts.int4_group_params(w, group)
        return layouts.pack_int4(layouts.int4_codes(w, scale, zero), scale, zero)

    def storage(self, N, K, group):
        blocks = K // group
        return {"qweight": ((N, blocks, group // 2), torch.uint8), "scales": ((N, blocks), torch.float32),
                "zero_points": ((N, math.ceil(blocks / 2)), torch.uint8)}

    def dequantize(self, t, N, K, group):
        return layouts.dequantize_int4(t)

    def matmul(self, x, layer):
        if kernels_enabled(x) and not x.requires_grad:
            from ..kernels.int4 import int4_matmul, kernel_supports

            if kernel_supports(layer.group_size):
                return int4_matmul(x, layer.qweight, layer.scales, layer.zero_points)
        return super().matmul(x, layer)

    def label(self, method, group):
        return f"{self.name}-{method}-g{group}"

    def export_tensors(self, t):  # qweight [N, K/g, g/2]: MatMulNBits' B as it is
        return {"qweight": t["qweight"], "scales": t["scales"].reshape(-1), "zero_points": t["zero_points"].reshape(-1)}

    def export_matmul(self, x, t, K, N, group):
        return torch.ops.edgettt.matmul_nbits(x, t["qweight"], t["scales"], t["zero_points"], K, N, group)


def _int4_gptq(w: torch.Tensor, group: int, hessian: torch.Tensor) -> dict[str, torch.Tensor]:
    """GPTQ with per-group asymmetric scales chosen from the error-updated weights."""
    N, K = w.shape
    codes, scale, zero = torch.zeros(N, K), torch.zeros(N, K // group), torch.zeros(N, K // group)

    def round_column(col, column, ahead):
        g = col // group
        if col % group == 0:  # choose the group's grid from the weights as updated so far
            scale[:, g:g + 1], zero[:, g:g + 1] = layouts.int4_group_params(ahead()[:, :group], group)
        codes[:, col] = torch.clamp(torch.round(column / scale[:, g]) + zero[:, g], 0, 15)
        return (codes[:, col] - zero[:, g]) * scale[:, g]

    gptq(w, hessian, round_column)
    return layouts.pack_int4(codes, scale, zero)


@torch.library.custom_op("edgettt::matmul_nbits", mutates_args=())
def matmul_nbits(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor,
                 K: int, N: int, block_size: int) -> torch.Tensor:
    blocks = K // block_size
    w = layouts.dequantize_int4({"qweight": qweight.reshape(N, blocks, -1), "scales": scales.reshape(N, blocks),
                                 "zero_points": zero_points.reshape(N, -1)})
    return x @ w.T.to(x.dtype)


@matmul_nbits.register_fake
def _(x, qweight, scales, zero_points, K, N, block_size):
    return x.new_empty(*x.shape[:-1], N)


def matmul_nbits_onnx(x, qweight, scales, zero_points, K: int, N: int, block_size: int):
    return ort_schemas.msft().MatMulNBits(x, qweight, scales, zero_points, K=K, N=N, bits=4, block_size=block_size)


# ---- bitsandbytes: nf4 / fp4 and LLM.int8 ------------------------------------------------------------

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


BNB4_QUANT_TYPE = {"fp4": 0, "nf4": 1}  # MatMulBnb4's quant_type attribute


class Bnb4(WeightFormat):
    """bitsandbytes' 4-bit codebooks (nf4: normal-float levels, fp4: a 4-bit float), absmax per block."""

    grouped = True

    def __init__(self, name: str):
        self.name = name

    def quantize(self, w, group, method="rtn", hessian=None):
        packed, state = bitsandbytes().quantize_4bit(w.float().contiguous(), blocksize=group,
                                                      compress_statistics=False, quant_type=self.name)
        return {"qweight": packed, "absmax": state.absmax.float(), "code": state.code.float()}

    def storage(self, N, K, group):
        return {"qweight": ((N * K // 2, 1), torch.uint8), "absmax": ((math.ceil(N * K / group),), torch.float32),
                "code": ((16,), torch.float32)}

    def dequantize(self, t, N, K, group):
        bnbf = bitsandbytes()
        state = bnbf.QuantState(absmax=t["absmax"], shape=torch.Size((N, K)), code=t["code"], blocksize=group,
                                quant_type=self.name, dtype=torch.float32)
        return bnbf.dequantize_4bit(t["qweight"], state).float()

    def label(self, method, group):
        return f"{self.name}-b{group}"

    def export_tensors(self, t):
        return {"qweight": t["qweight"].reshape(-1), "absmax": t["absmax"]}

    def export_matmul(self, x, t, K, N, group):
        return torch.ops.edgettt.matmul_bnb4(x, t["qweight"], t["absmax"], K, N, group, BNB4_QUANT_TYPE[self.name])


@torch.library.custom_op("edgettt::matmul_bnb4", mutates_args=())
def matmul_bnb4(x: torch.Tensor, qweight: torch.Tensor, absmax: torch.Tensor, K: int, N: int, block_size: int,
                quant_type: int) -> torch.Tensor:
    bnbf = bitsandbytes()
    name = {v: k for k, v in BNB4_QUANT_TYPE.items()}[quant_type]
    state = bnbf.QuantState(absmax=absmax, shape=torch.Size((N, K)), code=bnbf.get_4bit_type(name, device=x.device),
                            blocksize=block_size, quant_type=name, dtype=torch.float32)
    return x @ bnbf.dequantize_4bit(qweight.reshape(-1, 1), state).float().T.to(x.dtype)


@matmul_bnb4.register_fake
def _(x, qweight, absmax, K, N, block_size, quant_type):
    return x.new_empty(*x.shape[:-1], N)


def matmul_bnb4_onnx(x, qweight, absmax, K: int, N: int, block_size: int, quant_type: int):
    return ort_schemas.msft().MatMulBnb4(x, qweight, absmax, K=K, N=N, block_size=block_size, quant_type=quant_type)


class LlmInt8(WeightFormat):
    """LLM.int8: int8 rows with absmax SCB; bitsandbytes' matmul sends outlier columns through fp16.
    Exported as plain int8 (ONNX Runtime has no outlier split)."""

    name, rounds_at_run_time = "bnb-int8", True

    def quantize(self, w, group, method="rtn", hessian=None):
        cb, scb, _ = bitsandbytes().int8_vectorwise_quant(w.half().contiguous())
        return {"qweight": cb, "scb": scb.float()}

    def storage(self, N, K, group):
        return {"qweight": ((N, K), torch.int8), "scb": ((N,), torch.float32)}

    def dequantize(self, t, N, K, group):
        return t["qweight"].float() * t["scb"][:, None] / 127

    def matmul(self, x, layer):
        bitsandbytes()  # the one-line error when it is missing
        import bitsandbytes as bnb

        state = bnb.MatmulLtState()
        state.CB, state.SCB, state.threshold, state.has_fp16_weights = (layer.qweight, layer.scb, LLM_INT8_THRESHOLD,
                                                                        False)
        flat = x.reshape(-1, x.shape[-1]).half()
        return bnb.matmul(flat, layer.qweight, state=state).to(x.dtype).reshape(*x.shape[:-1], -1)

    def export_tensors(self, t):
        return {"qweight_t": t["qweight"].T.contiguous(), "scales": t["scb"] / 127}

    export_matmul = Int8.export_matmul


# ---- the registry ---------------------------------------------------------------------------------------

WEIGHT_FORMATS: dict[str, WeightFormat] = {f.name: f for f in (Int8(), Int4(), Bnb4("nf4"), Bnb4("fp4"), LlmInt8())}
METHODS = ("rtn", "gptq")


def weight_format(name: str) -> WeightFormat:
    return WEIGHT_FORMATS[name]


def stored_tensor_names() -> set[str]:
    """Every name a format stores a layer's tensors under (`layer.qweight`, `layer.scales`, ...)."""
    return {name for f in WEIGHT_FORMATS.values() for name in f.storage(2, 64, 32)}


# ---- ONNX: the custom ops' translations --------------------------------------------------------------------

def onnx_translations() -> dict:
    """torch custom op -> the onnxscript function that builds its ONNX node."""
    return {torch.ops.edgettt.matmul_int8.default: matmul_int8_onnx,
            torch.ops.edgettt.matmul_nbits.default: matmul_nbits_onnx,
            torch.ops.edgettt.matmul_bnb4.default: matmul_bnb4_onnx}
