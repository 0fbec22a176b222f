"""Operators for export: torch custom ops that stand for ONNX operators, and translations that
keep the graphs at fp32 accuracy in ONNX Runtime.

During `torch.onnx.export` the model calls these ops, and the translation table turns each into the
ONNX nodes that compute it:

    edgettt::quantize_state / dequantize_state -> QuantizeLinear / DequantizeLinear
        (an int8 state S - S0 with one calibrated scale per head and row: the formula of
        `formats/state_formats.py`, as ONNX's per-axis quantization writes it)
    aten::sigmoid, aten::silu -> 1 / (1 + exp(-x)) (see below)
    edgettt::rms_norm -> SimplifiedLayerNormalization (ONNX Runtime's RMS norm, fp32 inside)
    edgettt::tokens_from -> Slice (the prefill graph's logits from a given token on)
    edgettt::rotary -> com.microsoft.RotaryEmbedding (interleaved pairs, a cos / sin table of the
        mini-batch's positions)
    the weight formats' matmuls -> their ONNX Runtime operators (`quant/weight_formats.py`)

The eager implementations compute the same thing in torch (used when the graphs run outside export).
"""

from __future__ import annotations

import onnx
import torch
from onnxscript import opset18 as op

from edgettt import ort_schemas
from edgettt.ops.delta_rule import reference as _delta_rule  # noqa: F401  (defines edgettt::delta_rule_token)
from edgettt.formats.state_formats import STATE_CLIP, int8_state_codes, int8_state_values
from edgettt.quant.weight_formats import onnx_translations


# ---- int8 state (QuantizeLinear / DequantizeLinear) -----------------------------------------------
# S [B, H, Dk, Dv] is stored as q = round((S - S0) / scale) in int8, scale [H, Dk]. ONNX's per-axis
# quantization takes one axis, so the graph views S as [B, H * Dk, Dv] and the scale as [H * Dk].

@torch.library.custom_op("edgettt::quantize_state", mutates_args=())
def quantize_state(S: torch.Tensor, S0: torch.Tensor, scale: torch.Tensor, rows: int) -> torch.Tensor:
    return int8_state_codes(S, S0, scale).to(torch.int8)


@quantize_state.register_fake
def _(S, S0, scale, rows):
    return torch.empty_like(S, dtype=torch.int8)


@torch.library.custom_op("edgettt::dequantize_state", mutates_args=())
def dequantize_state(q: torch.Tensor, S0: torch.Tensor, scale: torch.Tensor, rows: int) -> torch.Tensor:
    return int8_state_values(q, S0, scale)


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


# ---- fused norm and rotary embedding (`ops.py` calls these ops while exporting) ---------------------

def rms_norm_onnx(x, weight, eps: float):
    return ort_schemas.default_domain().SimplifiedLayerNormalization(x, weight, axis=-1, epsilon=eps, stash_type=1)


def rotary_onnx(x, positions, theta: float, period: int, head_dim: int):
    """x [B, H, T, d] viewed as [1, B * H, T, d], so that one row of positions serves every sequence."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    angles = torch.arange(period).float()[:, None] * inv_freq[None, :]  # as `ops._rotary` computes them
    cos, sin = (op.Constant(value=onnx.numpy_helper.from_array(t.numpy(), name)) for t, name in
                ((angles.cos(), "rotary_cos"), (angles.sin(), "rotary_sin")))
    flat = op.Reshape(x, op.Constant(value_ints=[1, -1, 0, 0]))
    rotated = ort_schemas.msft().RotaryEmbedding(flat, op.Unsqueeze(positions, op.Constant(value_ints=[0])), cos, sin,
                                      interleaved=1)
    return op.Reshape(rotated, op.Shape(x))


def causal_conv_onnx(x, weight, bias, tail, silu: bool):
    """x [B, T, C], weight [C, 1, K], tail [B, K - 1, C] as ONNX Runtime's CausalConvWithState (channels last), its
    SiLU fused."""
    return ort_schemas.msft().CausalConvWithState(x, weight, bias, tail, ndim=1, channels_last=1,
                                                  activation="silu" if silu else "none")


def delta_rule_token_onnx(q, k, v, beta, g, S):
    """q, k [B, H, 1, K], v [B, H, 1, V], beta, g [B, H, 1], S [B, H, K, V] (one token) as ONNX Runtime's
    LinearAttention (gated_delta: S <- exp(g) S + beta k (v - exp(g) S^T k), o = q^T S), on [B, 1, H * D] (q already
    scaled): with one token [B, H, 1, D] and [B, 1, H * D] are the same memory, a Reshape apart."""
    heads = S.shape[1]
    packed = [op.Reshape(t, op.Constant(value_ints=[0, 1, -1])) for t in (q, k, v, g, beta)]
    o, state = ort_schemas.msft().LinearAttention(*packed[:3], S, *packed[3:], q_num_heads=heads, kv_num_heads=heads,
                                                  scale=1.0, update_rule="gated_delta")
    return op.Reshape(o, op.Shape(v)), state


def tokens_from_onnx(h, start):
    begin = op.Reshape(start, op.Constant(value_ints=[1]))
    return op.Slice(h, begin, op.Constant(value_ints=[2**62]), op.Constant(value_ints=[1]))


TRANSLATIONS = {
    torch.ops.edgettt.tokens_from.default: tokens_from_onnx,
    torch.ops.edgettt.rms_norm.default: rms_norm_onnx,
    torch.ops.edgettt.rotary.default: rotary_onnx,
    torch.ops.edgettt.delta_rule_token.default: delta_rule_token_onnx,
    torch.ops.edgettt.causal_conv.default: causal_conv_onnx,
    torch.ops.aten.sigmoid.default: sigmoid_onnx,
    torch.ops.aten.silu.default: silu_onnx,
    torch.ops.edgettt.quantize_state.default: quantize_state_onnx,
    torch.ops.edgettt.dequantize_state.default: dequantize_state_onnx,
    **onnx_translations(),
}
