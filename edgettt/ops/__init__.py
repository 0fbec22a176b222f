"""The operations the models compute, one folder an operation, each folder holding the plain-torch
reference beside its fast paths (Triton kernels) with one signature, as flash-linear-attention keeps them:

    linear_attention/   a TTT layer as a learned linear attention (DESIGN section 4)
        reference.py      naive / chunk / recurrent (and the compiled step's recurrent_summed, open_token),
                          the value maps: the plain torch every model computes
        prefill.py        parallel / exact: a whole prefill of TTT-Linear in one kernel a layer
        decode.py         decode_step: one token's update and read of the state (float, int8, int12)
        decode_token.py   decode_token: a converted TTT-Linear token from projections to output, one kernel
        commits.py        two_level_commits: the int12 state's chain of rounded commits
        train.py          exact_train: the original TTT-Linear's exact form with a backward (training)
    lact/               LaCT (DESIGN section 4.1)
        reference.py      the feature map, chunk attention and momenta, decode step: plain torch
        parallel.py       chunk / naive: the W1-only parallel form
        fast_weights.py   exact / step / scanned: the chunk-recurrent form of every variant
        triton.py         the kernels of reference.py, and `chunk` through them
    quantized/          the quantized weights' products: int4.py, int8.py (GEMV and GEMM), act8.py (activations)
    common.py           what the kernels share (launch arithmetic, autotuning, the interpreter)

A model computes the references; `edgettt.prepare` (`fast_paths`) gives its layers the fast paths.
This module holds the pointwise and per-row building blocks of the models (DESIGN 3.3-3.4).

While edgettt's ONNX export traces a model (`exporting()`), the norms, the rotary embedding and the short
causal convolution are written as the ops ONNX Runtime fuses them into (`edgettt::rms_norm`,
`edgettt::rotary`, `edgettt::causal_conv`, custom ops whose ONNX nodes `onnx/onnx_ops.py` makes;
`native_layer_norm`): one node where the plain formula takes five to ten (the rotary one in the decode graph
only). They compute the same function, up to fp32 rounding.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

LN_EPS = 1e-6
_onnx_export = False


def exporting() -> bool:
    """Whether edgettt's ONNX export is tracing the model (`onnx_export`). Not
    `torch.compiler.is_exporting()`: that is true while torch.compile traces too (torch 2.11 on CUDA: a
    compiled bf16 decode step took the export-only ops, whose float32 statistics then met bf16 weights)."""
    return _onnx_export


@contextlib.contextmanager
def onnx_export():
    """Within: `exporting()` is true (the ONNX exporter's trace)."""
    global _onnx_export
    before, _onnx_export = _onnx_export, True
    try:
        yield
    finally:
        _onnx_export = before


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`w * x / sqrt(mean(x^2) + eps)`, the normalisation computed in float32."""
    if exporting():
        return torch.ops.edgettt.rms_norm(x, weight, eps)
    return _rms_norm(x, weight, eps)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def layer_norm(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float = LN_EPS) -> torch.Tensor:
    """LayerNorm over the last dim with biased variance (the TTT inner LN)."""
    if exporting():
        return gamma * torch.native_layer_norm(x, [x.shape[-1]], None, None, eps)[0] + beta
    mu = x.mean(-1, keepdim=True)
    var = x.var(-1, keepdim=True, unbiased=False)
    return gamma * (x - mu) / torch.sqrt(var + eps) + beta


def ln_l2_grad(z: torch.Tensor, target: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor,
               eps: float = LN_EPS) -> torch.Tensor:
    """d/dz of `0.5 * |LN(z) - target|^2`: the closed form of DESIGN 3.4.

    `e = (gamma*xh + beta - y) * gamma`, `g = (e - mean(e) - xh * mean(e * xh)) / s`.
    """
    if exporting():  # xh and 1 / s from one LayerNormalization node
        xh, _, inv_s = torch.native_layer_norm(z, [z.shape[-1]], None, None, eps)
        e = (gamma * xh + beta - target) * gamma
        return (e - e.mean(-1, keepdim=True) - xh * (e * xh).mean(-1, keepdim=True)) * inv_s
    mu = z.mean(-1, keepdim=True)
    s = torch.sqrt(z.var(-1, keepdim=True, unbiased=False) + eps)
    xh = (z - mu) / s
    e = (gamma * xh + beta - target) * gamma
    return (e - e.mean(-1, keepdim=True) - xh * (e * xh).mean(-1, keepdim=True)) / s


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def _gelu_tanh_grad(x: torch.Tensor) -> torch.Tensor:
    t = torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))
    return 0.5 * x * ((1 - t * t) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1 + t)


class _GeluTanhGrad(torch.autograd.Function):
    """gelu_tanh' with a hand-written backward: autograd through the formula keeps about ten
    intermediates of x's size for every mini-batch of TTT-MLP training; this keeps x alone."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _gelu_tanh_grad(x)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        # u = c (x + a x^3), t = tanh(u), f = 0.5 x (1 - t^2) u' + 0.5 (1 + t)
        # f' = (1 - t^2) (u' + 0.5 x (u'' - 2 t u'^2)),  u' = c + 3ac x^2,  u'' = 6ac x
        (x,) = ctx.saved_tensors
        t = torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))
        du = 0.79788456 + 0.1070322243 * x * x
        return grad * (1 - t * t) * (du + 0.5 * x * (0.2140644486 * x - 2 * t * du * du))


def gelu_tanh_grad(x: torch.Tensor) -> torch.Tensor:
    """Derivative of gelu_tanh, with the constants the TTT reference uses."""
    return _GeluTanhGrad.apply(x) if torch.is_grad_enabled() and x.requires_grad else _gelu_tanh_grad(x)


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float, period: int | None = None) -> torch.Tensor:
    """Rotate interleaved pairs (x[2j], x[2j+1]) by `position * theta^(-2j/d)`.

    x: [B, H, T, d]; positions: [T]; `period`: when the positions are reduced mod a period (the
    mini-batch size), the exported decode graph uses a table of that many positions.
    """
    # ONNX Runtime's RotaryEmbedding refuses a sequence longer than its table: fused in the decode graph
    # (one token: the length is a plain int), the formula in the prefill graph (any length)
    if period and exporting() and isinstance(x.shape[2], int) and x.shape[2] <= period:
        return torch.ops.edgettt.rotary(x, positions, theta, period, x.shape[-1])
    return _rotary(x, positions, theta)


def _rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=x.device).float() / d))
    angles = positions.float()[:, None] * inv_freq[None, :]  # [T, d/2]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)


def causal_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                tail: torch.Tensor | None, silu: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv1d over time, continuing from `tail` (the last K-1 inputs, zeros at start), and
    with `silu` the SiLU of its output.

    x: [B, T, C]; weight: [C, 1, K]; tail: [B, K-1, C] or None. Returns (y [B, T, C], new tail).
    """
    kernel = weight.shape[-1]
    if tail is None:
        tail = x.new_zeros(x.shape[0], kernel - 1, x.shape[2])
    if exporting():  # one node: ONNX Runtime's CausalConvWithState (`onnx/onnx_ops.py`)
        return torch.ops.edgettt.causal_conv(x, weight, weight.new_zeros(x.shape[2]) if bias is None else bias, tail,
                                             silu)
    return _causal_conv(x, weight, bias, tail, silu)


def _causal_conv(x, weight, bias, tail, silu):
    kernel = weight.shape[-1]
    full = torch.cat((tail, x), dim=1)  # [B, K-1+T, C]
    y = F.conv1d(full.transpose(1, 2), weight, bias, groups=x.shape[2]).transpose(1, 2)
    return F.silu(y) if silu else y, full[:, full.shape[1] - (kernel - 1):]


def row_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) as a product and a sum over the input dimension ([..., K] x [N, K] -> [..., N])."""
    out = (x.unsqueeze(-2) * weight).sum(-1)
    return out if bias is None else out + bias


def tokens_from(h: torch.Tensor, start) -> torch.Tensor:
    """h[:, start:] for h [B, T, C]; `start` an int, or a 0-d tensor in an exported graph (a Slice
    whose length the graph learns at run time)."""
    if exporting():
        return torch.ops.edgettt.tokens_from(h, start)
    return h[:, int(start):]


def segments(start: int, length: int, block: int) -> list[tuple[int, int, int]]:
    """Cut positions start..start+length-1 at multiples of `block`.

    Returns (offset in the input, count, index of the first token inside its mini-batch).
    """
    out, offset = [], 0
    while offset < length:
        inner = (start + offset) % block
        count = min(block - inner, length - offset)
        out.append((offset, count, inner))
        offset += count
    return out


def mini_batch_etas(learnable_token_idx: torch.Tensor) -> torch.Tensor:
    """`eta_tok[i] = max(0, 1/i + tau[i])`, i = 1..b: the chunk mask coefficients."""
    b = learnable_token_idx.shape[0]
    base = 1.0 / torch.arange(1, b + 1, device=learnable_token_idx.device, dtype=learnable_token_idx.dtype)
    return torch.clamp_min(base + learnable_token_idx, 0.0)


# ---- the fused forms an exported graph uses (eager bodies: the formulas above) ----------------------

@torch.library.custom_op("edgettt::rms_norm", mutates_args=())
def rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _rms_norm(x, weight, eps)


@rms_norm_op.register_fake
def _(x, weight, eps):
    return torch.empty_like(x, dtype=torch.promote_types(x.dtype, weight.dtype))


@torch.library.custom_op("edgettt::rotary", mutates_args=())
def rotary_op(x: torch.Tensor, positions: torch.Tensor, theta: float, period: int, head_dim: int) -> torch.Tensor:
    return _rotary(x, positions, theta)


@rotary_op.register_fake
def _(x, positions, theta, period, head_dim):
    return torch.empty_like(x)


@torch.library.custom_op("edgettt::causal_conv", mutates_args=())
def causal_conv_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, tail: torch.Tensor,
                   silu: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return tuple(t.clone() for t in _causal_conv(x, weight, bias, tail, silu))


@causal_conv_op.register_fake
def _(x, weight, bias, tail, silu):
    return torch.empty_like(x), torch.empty_like(tail)


@torch.library.custom_op("edgettt::tokens_from", mutates_args=())
def tokens_from_op(h: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    return h[:, int(start):].clone()


@tokens_from_op.register_fake
def _(h, start):
    return h.new_empty(h.shape[0], torch.library.get_ctx().new_dynamic_size(), h.shape[2])
