"""Quantized operators for export: torch custom ops that stand for ONNX Runtime's operators.

During `torch.onnx.export` each quantized linear layer calls one of these ops, and the translation
table turns it into the ONNX node that consumes the model's own quantized bytes unchanged:

    edgettt::matmul_nbits   -> com.microsoft.MatMulNBits   (int4: packed codes, scales, zero points)
    edgettt::matmul_bnb4    -> com.microsoft.MatMulBnb4    (nf4 / fp4: bitsandbytes' bytes and absmax)
    edgettt::matmul_int8    -> DequantizeLinear + MatMul   (int8 per output channel, and LLM.int8's rows)
    edgettt::quantize_state / dequantize_state -> QuantizeLinear / DequantizeLinear
                               (an int8 state S - S0 with one calibrated scale per head and row)

The eager implementations compute the same thing in torch (used when the wrappers run outside
export). com.microsoft ops are unknown to the `onnx` package: their schemas are registered here
so that onnxscript can build the nodes.
"""

from __future__ import annotations

import onnx
import torch
from onnx.defs import OpSchema
from onnxscript import opset18 as op
from onnxscript import values

MSFT = values.Opset("com.microsoft", 1)
STATE_CLIP = 127  # the int8 state uses [-127, 127], like the torch requantizer


def _register_schema(name: str, inputs: list[tuple[str, str]], attrs: list[str]) -> None:
    try:
        onnx.defs.get_schema(name, 1, "com.microsoft")
        return
    except onnx.defs.SchemaError:
        pass
    onnx.defs.register_schema(OpSchema(
        name, "com.microsoft", 1,
        inputs=[OpSchema.FormalParameter(n, t) for n, t in inputs],
        outputs=[OpSchema.FormalParameter("Y", "T1")],
        type_constraints=[("T1", ["tensor(float)", "tensor(float16)"], ""), ("T2", ["tensor(uint8)"], "")],
        attributes=[OpSchema.Attribute(a, OpSchema.AttrType.INT, "") for a in attrs]))


_register_schema("MatMulNBits", [("A", "T1"), ("B", "T2"), ("scales", "T1"), ("zero_points", "T2")],
                 ["K", "N", "bits", "block_size"])
_register_schema("MatMulBnb4", [("A", "T1"), ("B", "T2"), ("absmax", "T1")], ["K", "N", "block_size", "quant_type"])


# ---- int4 (MatMulNBits) -----------------------------------------------------------------------

@torch.library.custom_op("edgettt::matmul_nbits", mutates_args=())
def matmul_nbits(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor,
                 K: int, N: int, block_size: int) -> torch.Tensor:
    from ..quant import dequantize_int4

    blocks = K // block_size
    w = dequantize_int4({"qweight": qweight.reshape(N, blocks, -1), "scales": scales.reshape(N, blocks),
                         "zero_points": zero_points.reshape(N, -1)})
    return x @ w.T.to(x.dtype)


@matmul_nbits.register_fake
def _(x, qweight, scales, zero_points, K, N, block_size):
    return x.new_empty(*x.shape[:-1], N)


def matmul_nbits_onnx(x, qweight, scales, zero_points, K: int, N: int, block_size: int):
    return MSFT.MatMulNBits(x, qweight, scales, zero_points, K=K, N=N, bits=4, block_size=block_size)


# ---- nf4 / fp4 (MatMulBnb4) -------------------------------------------------------------------

BNB4_QUANT_TYPE = {"fp4": 0, "nf4": 1}  # MatMulBnb4's quant_type attribute


@torch.library.custom_op("edgettt::matmul_bnb4", mutates_args=())
def matmul_bnb4(x: torch.Tensor, qweight: torch.Tensor, absmax: torch.Tensor, K: int, N: int, block_size: int,
                quant_type: int) -> torch.Tensor:
    from ..quant import bitsandbytes

    bnbf = bitsandbytes()
    name = {v: k for k, v in BNB4_QUANT_TYPE.items()}[quant_type]
    state = bnbf.QuantState(absmax=absmax, shape=torch.Size((N, K)), code=bnbf.get_4bit_type(name, device=x.device),
                            blocksize=block_size, quant_type=name, dtype=torch.float32)
    return x @ bnbf.dequantize_4bit(qweight.reshape(-1, 1), state).float().T.to(x.dtype)


@matmul_bnb4.register_fake
def _(x, qweight, absmax, K, N, block_size, quant_type):
    return x.new_empty(*x.shape[:-1], N)


def matmul_bnb4_onnx(x, qweight, absmax, K: int, N: int, block_size: int, quant_type: int):
    return MSFT.MatMulBnb4(x, qweight, absmax, K=K, N=N, block_size=block_size, quant_type=quant_type)


# ---- int8 weights (DequantizeLinear + MatMul) ---------------------------------------------------

@torch.library.custom_op("edgettt::matmul_int8", mutates_args=())
def matmul_int8(x: torch.Tensor, qweight_t: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [.., K] @ (qweight_t [K, N] int8 * scales [N])."""
    return x @ (qweight_t.float() * scales).to(x.dtype)


@matmul_int8.register_fake
def _(x, qweight_t, scales):
    return x.new_empty(*x.shape[:-1], qweight_t.shape[1])


def matmul_int8_onnx(x, qweight_t, scales):
    return op.MatMul(x, op.DequantizeLinear(qweight_t, scales, axis=1))


# ---- int8 state (QuantizeLinear / DequantizeLinear) -----------------------------------------------
# S [B, H, Dk, Dv] is stored as q = round((S - S0) / scale) in int8, scale [H, Dk]. ONNX's per-axis
# quantization takes one axis, so the graph views S as [B, H * Dk, Dv] and the scale as [H * Dk].

@torch.library.custom_op("edgettt::quantize_state", mutates_args=())
def quantize_state(S: torch.Tensor, S0: torch.Tensor, scale: torch.Tensor, rows: int) -> torch.Tensor:
    bound = STATE_CLIP * scale[None, :, :, None]
    x = torch.minimum(torch.maximum(S - S0[None], -bound), bound)
    return torch.round(x / scale[None, :, :, None]).to(torch.int8)


@quantize_state.register_fake
def _(S, S0, scale, rows):
    return torch.empty_like(S, dtype=torch.int8)


@torch.library.custom_op("edgettt::dequantize_state", mutates_args=())
def dequantize_state(q: torch.Tensor, S0: torch.Tensor, scale: torch.Tensor, rows: int) -> torch.Tensor:
    return S0[None] + q.float() * scale[None, :, :, None]


@dequantize_state.register_fake
def _(q, S0, scale, rows):
    return torch.empty_like(q, dtype=torch.float32)


def _as_rows(x, rows: int):
    """[B, H, Dk, Dv] -> [B, H * Dk, Dv] (rows = H * Dk)."""
    return op.Reshape(x, op.Constant(value_ints=[0, rows, -1]))


def quantize_state_onnx(S, S0, scale, rows: int):
    bound = op.Unsqueeze(op.Mul(scale, op.Constant(value_float=float(STATE_CLIP))), op.Constant(value_ints=[0, 3]))
    x = op.Min(op.Max(op.Sub(S, S0), op.Neg(bound)), bound)
    zero = op.Constant(value=onnx.helper.make_tensor("zero", onnx.TensorProto.INT8, [rows], [0] * rows))
    q = op.QuantizeLinear(_as_rows(x, rows), op.Reshape(scale, op.Constant(value_ints=[-1])), zero, axis=1)
    return op.Reshape(q, op.Shape(S))


def dequantize_state_onnx(q, S0, scale, rows: int):
    x = op.DequantizeLinear(_as_rows(q, rows), op.Reshape(scale, op.Constant(value_ints=[-1])), axis=1)
    return op.Add(op.Reshape(x, op.Shape(q)), S0)


# ---- sigmoid to full fp32 accuracy ------------------------------------------------------------------
# ONNX Runtime's CPU Sigmoid is a fast approximation with an absolute error of up to 1.6e-7 (measured on
# onnxruntime 1.32 over N(0, 6^2) inputs): exact enough near 0.5, but a relative error of several
# hundred percent where the output is small. The distilled ttt-linear-tiny-parallel has SiLU inputs
# and learning-rate logits there, and its logits came out at relative error 1.25e-4 against torch
# (whose weights rounded to fp32 explain 5e-7). 1 / (1 + exp(-x)) with ORT's Exp (7e-8 relative) and
# Reciprocal keeps the graph within fp32 rounding; exp overflows to inf for x < -88, giving 0, as it should.

def sigmoid_onnx(x):
    return op.Reciprocal(op.Add(op.CastLike(op.Constant(value_float=1.0), x), op.Exp(op.Neg(x))))


def silu_onnx(x):
    return op.Mul(x, sigmoid_onnx(x))


TRANSLATIONS = {
    torch.ops.aten.sigmoid.default: sigmoid_onnx,
    torch.ops.aten.silu.default: silu_onnx,
    torch.ops.edgettt.matmul_nbits.default: matmul_nbits_onnx,
    torch.ops.edgettt.matmul_bnb4.default: matmul_bnb4_onnx,
    torch.ops.edgettt.matmul_int8.default: matmul_int8_onnx,
    torch.ops.edgettt.quantize_state.default: quantize_state_onnx,
    torch.ops.edgettt.dequantize_state.default: dequantize_state_onnx,
}
