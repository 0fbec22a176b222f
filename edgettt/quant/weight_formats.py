"""Weight formats: each is one object that quantizes a weight matrix, says how it is stored, loads
and dequantizes it, and names the kernel and the ONNX Runtime operator that compute with its bytes
(DESIGN section 5). `WEIGHT_FORMATS` is the registry; `weight_format(name)` finds one.

    int8      symmetric per output channel (layout in `layouts.py`); Triton kernel `ops/quantized/int8.py`;
              ONNX: com.microsoft.MatMulNBits with 8 bits (the row's scale repeated per block)
    int4      asymmetric groups of g along K in ONNX Runtime's MatMulNBits layout (`layouts.py`);
              Triton kernel `ops/quantized/int4.py`; ONNX: com.microsoft.MatMulNBits
    int6      as int4 with 64 levels, each code a 4-bit and a 2-bit part (`layouts.py`): a step between int4
              and int8 for mixed precision (ONNX Runtime's MatMulNBits takes 2, 4 and 8 bits, not 5 or 6);
              int4's Triton kernels, twice (the 2-bit part as nibbles); ONNX: two MatMulNBits, 4 and 2 bits, added
    nf4, fp4  bitsandbytes' blockwise 4-bit (absmax per block of g); ONNX: com.microsoft.MatMulBnb4
    bnb-int8  bitsandbytes' LLM.int8 (int8 rows, absmax SCB; at run time activation columns above the
              outlier threshold 6 go through fp16, the rest through an int8 matmul); ONNX: as int8

A tied embedding whose lm_head is quantized reads the head's rows (`rows`; in ONNX the formats with
`export_rows` gather them from the same bytes: com.microsoft.GatherBlockQuantized).

Methods: `rtn` (round to nearest) everywhere; `gptq` for int8, int4 and int6: the format rounds column by column
and a calibration's error feedback (`Calibration.feedback`, `edgettt.calibration.gptq`) spreads each column's
error over the columns not yet rounded (`quantize(w, group, feedback)`).

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
from typing import Optional

import torch
import torch.nn.functional as F

from edgettt import ort_schemas
from edgettt.errors import EdgetttError
from edgettt.ops.common import GEMV_MAX_ROWS, INT4_A8_MIN_ROWS
from edgettt.formats import layouts

LLM_INT8_THRESHOLD = 6.0


class WeightFormat:
    """The interface; a quantized layer's tensors are a dict of named buffers (saved as they are)."""

    name: str
    methods: tuple[str, ...] = ("rtn",)
    summary = ""  # one line: what its bits are (the command line's --weights help lists them)
    grouped = False  # groups (or blocks) of `group_size` along the input dim K: K must be a multiple
    rounds_at_run_time = False  # quantizes activations as it computes (then one ulp can flip a rounding)
    int8_activation_kernels = False  # CUDA kernels that can take the activations in int8 (`set_activations`)
    int8_decode_kernel = False  # ... in the one-token GEMV too (W4A8, dp4a)
    fused_decode_products = False  # `fused_products`: its GEMV with the norm, activation and residual in one kernel

    def fits(self, in_features: int, group: int) -> bool:
        return not self.grouped or in_features % group == 0

    def quantize(self, w: torch.Tensor, group: int, feedback=None) -> dict[str, torch.Tensor]:
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

    # every stored and every exported tensor has one row per output: rows can be picked before
    # dequantizing, and layers of one input stacked into one export node (`onnx.stacked_linear`)
    rows_first = False

    def rows(self, t: dict[str, torch.Tensor], ids: torch.Tensor, N: int, K: int, group: int) -> torch.Tensor:
        """Rows `ids` of the dequantized weight, [*ids.shape, K]: a tied embedding read from a quantized
        lm_head (`apply.tie_quantized_embedding`)."""
        if not self.rows_first:
            return self.dequantize(t, N, K, group)[ids]
        picked = {name: tensor[ids.reshape(-1)] for name, tensor in t.items()}
        return self.dequantize(picked, ids.numel(), K, group).reshape(*ids.shape, K)

    def export_tensors(self, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The stored tensors as the ONNX operator reads them (no copy where it reads them as they are)."""
        raise NotImplementedError

    def export_matmul(self, x: torch.Tensor, t: dict[str, torch.Tensor], K: int, N: int, group: int,
                      activations: str = "float") -> torch.Tensor:
        """The custom op the export turns into this format's ONNX node(s). `activations`: "float", or
        "int8" (x quantized to int8 in blocks along K, integer products: MatMulNBits' accuracy level 4),
        or "int8-tensor" (x quantized per tensor, int8 rows: `export_nbits_matmul`)."""
        raise NotImplementedError

    # the export graphs whose matmuls take int8 activations in blocks when asked: where ONNX Runtime's
    # MatMulNBits integer kernel is the faster one on CPUs (benchmarks/results/matmulnbits_cpu.md):
    # at one token (decode) for 4 and 8 bits; at 512 tokens (prefill) only for 8 bits
    int8_activation_graphs: tuple[str, ...] = ()
    # whether the export can take "int8-tensor" activations (int8 rows made when a session loads)
    exports_int8_rows = False
    exports_rows = False  # whether `export_rows` has an operator; if not, the export keeps a float table

    def export_rows(self, ids: torch.Tensor, t: dict[str, torch.Tensor], K: int, N: int, group: int):
        """The custom op that gathers rows `ids` of the weight from the exported tensors."""
        raise NotImplementedError


def int8_activations(x: torch.Tensor, layer, min_rows: int = GEMV_MAX_ROWS + 1) -> bool:
    """Whether `layer` multiplies x in integers (`QuantLinear.activations` = "int8"): in products of at
    least `min_rows` rows (above the kernels' GEMV_MAX_ROWS by default: an int8 layer's decode GEMV stays
    float; int4 has its own rule, `int4_a8`), where the int8 tensor cores win
    (benchmarks/results/gemm_h200.md); not under autograd.
    Off CUDA the same arithmetic runs as the kernels' references (to measure what it costs)."""
    return (layer.activations == "int8" and not x.requires_grad
            and x.numel() // x.shape[-1] >= min_rows)


def int4_a8(x: torch.Tensor, layer) -> bool:
    """Whether an int4 `layer` asked for int8 activations takes them for x: from INT4_A8_MIN_ROWS rows on (W4A8
    on the int8 tensor cores; between the GEMV range and there weight-only is faster), and in a decode step's
    GEMV rows where also asked for that (`layer.decode_a8`, `set_activations(..., decode=True)`: the W4A8 GEMV,
    x rounded in blocks of 32 inside it, dp4a products)."""
    rows = x.numel() // x.shape[-1]
    return int8_activations(x, layer, 1) and (rows >= INT4_A8_MIN_ROWS or (rows <= GEMV_MAX_ROWS and layer.decode_a8))


# ---- int8 -----------------------------------------------------------------------------------------

class Int8(WeightFormat):
    name, methods = "int8", ("rtn", "gptq")
    summary = "8 bits, one scale a row"
    int8_activation_kernels = True

    def quantize(self, w, group, feedback=None):
        return layouts.quantize_int8(w) if feedback is None else _int8_with_feedback(w, feedback)

    def storage(self, N, K, group):
        return {"qweight": ((N, K), torch.int8), "scales": ((N,), torch.float32)}

    def dequantize(self, t, N, K, group):
        return layouts.dequantize_int8(t)

    def matmul(self, x, layer):
        a8 = int8_activations(x, layer)
        if compiling(x):
            return torch.ops.edgettt.int8_linear(x, layer.qweight, layer.scales, a8)
        # the kernel reads the stored bytes (no float copy); autograd takes the dequantized weight
        kernel = kernel_device(x) and (a8 or not x.requires_grad)
        return int8_product(x, layer.qweight, layer.scales, a8, kernel, lambda: layer.weight)

    def label(self, method, group):
        return self.name if method == "rtn" else f"{self.name}-{method}"

    int8_activation_graphs, exports_rows, rows_first, exports_int8_rows = ("prefill", "decode"), True, True, True

    def export_tensors(self, t):
        return int8_rows_as_nbits(t["qweight"], t["scales"])

    def export_matmul(self, x, t, K, N, group, activations="float"):
        return export_nbits_matmul(x, t, K, N, INT8_BLOCK, 8, activations)

    def export_rows(self, ids, t, K, N, group):
        return torch.ops.edgettt.gather_nbits(ids, t["qweight"], t["scales"], t["zero_points"], K, N, INT8_BLOCK, 8)


ACCURACY_LEVEL = {"float": 0, "int8": 4}  # MatMulNBits' accuracy_level: 0 computes in float, 4 in int8


# MatMulNBits' block for a per-row int8 weight (the row's scale repeated per block). With int8
# activations ONNX Runtime quantizes x in blocks of the same size: 32 keeps that error where int4 g32
# has it (ttt-linear-tiny-parallel int8: KLD 5e-4 against torch at 32, 1e-3 at 64)
INT8_BLOCK = 32


def int8_rows_as_nbits(codes: torch.Tensor, row_scales: torch.Tensor) -> dict[str, torch.Tensor]:
    """Symmetric int8 rows [N, K] with one scale a row, in MatMulNBits' 8-bit layout: uint8 codes + 128
    in blocks [N, K/b, b] (K padded with codes 128, zeros), the row scale repeated for each block, zero
    point 128. The same numbers: (q + 128 - 128) * scale."""
    N, K = codes.shape
    block = INT8_BLOCK
    blocks = -(-K // block)
    shifted = F.pad(codes.to(torch.int16) + 128, (0, blocks * block - K), value=128).to(torch.uint8)
    return {"qweight": shifted.reshape(N, blocks, block), "scales": row_scales.float()[:, None].expand(N, blocks).contiguous(),
            "zero_points": torch.full((N, blocks), 128, dtype=torch.uint8)}


def _int8_with_feedback(w: torch.Tensor, feedback) -> dict[str, torch.Tensor]:
    """Error feedback (GPTQ) on the per-channel symmetric int8 grid of `quantize_int8` (scales from the weights)."""
    scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127
    codes = torch.zeros(w.shape, dtype=torch.int8)

    def round_column(col, column, ahead):
        q = torch.round(column / scale).clamp(-127, 127)
        codes[:, col] = q.to(torch.int8)
        return q * scale

    feedback(w, round_column)
    return {"qweight": codes, "scales": scale.float()}


# ---- int4, MatMulNBits layout -------------------------------------------------------------------------

class Int4(WeightFormat):
    name, methods, grouped = "int4", ("rtn", "gptq"), True
    summary = "4 bits, a scale and zero point a group (MatMulNBits)"
    int8_activation_kernels = int8_decode_kernel = fused_decode_products = True

    def quantize(self, w, group, feedback=None):
        return layouts.pack_int4(*_grouped_codes(w, group, feedback, 15))

    def storage(self, N, K, group):
        blocks = K // group
        return {"qweight": ((N, blocks, group // 2), torch.uint8), "scales": ((N, blocks), torch.float32),
                "zero_points": ((N, math.ceil(blocks / 2)), torch.uint8)}

    def dequantize(self, t, N, K, group):
        return layouts.dequantize_int4(t)

    def matmul(self, x, layer):
        t = (layer.qweight, layer.scales, layer.zero_points)
        a8 = int4_a8(x, layer)
        if compiling(x):
            return torch.ops.edgettt.int4_linear(x, *t, a8)
        kernel = kernel_device(x) and (a8 or not x.requires_grad)
        if kernel:  # (Triton imported only where a kernel can run)
            from edgettt.ops.quantized.int4 import kernel_supports

            kernel = kernel_supports(layer.group_size)
        return int4_product(x, *t, a8, kernel, lambda: layer.weight)

    def label(self, method, group):
        return f"{self.name}-{method}-g{group}"

    int8_activation_graphs, exports_rows, rows_first, exports_int8_rows = ("decode",), True, True, True

    def export_tensors(self, t):  # MatMulNBits' B, scales and zero points as they are stored
        return dict(t)

    def export_matmul(self, x, t, K, N, group, activations="float"):
        return export_nbits_matmul(x, t, K, N, group, 4, activations)

    def export_rows(self, ids, t, K, N, group):
        return torch.ops.edgettt.gather_nbits(ids, t["qweight"], t["scales"], t["zero_points"], K, N, group, 4)


def _grouped_codes(w: torch.Tensor, group: int, feedback, top: int):
    """(codes 0..top [N, K], scale, zero [N, K/g]) of w on asymmetric per-group grids: round to nearest, or with
    error feedback (GPTQ), each group's grid chosen from the error-updated weights when its first column comes."""
    if feedback is None:
        scale, zero = layouts.group_grid(w, group, top)
        return layouts.group_codes(w, scale, zero, top), scale, zero
    N, K = w.shape
    codes, scale, zero = torch.zeros(N, K), torch.zeros(N, K // group), torch.zeros(N, K // group)

    def round_column(col, column, ahead):
        g = col // group
        if col % group == 0:  # choose the group's grid from the weights as updated so far
            scale[:, g:g + 1], zero[:, g:g + 1] = layouts.group_grid(ahead()[:, :group], group, top)
        codes[:, col] = torch.clamp(torch.round(column / scale[:, g]) + zero[:, g], 0, top)
        return (codes[:, col] - zero[:, g]) * scale[:, g]

    feedback(w, round_column)
    return codes, scale, zero


# ---- int6: int4's 4-bit MatMulNBits and a 2-bit one -----------------------------------------------------

class Int6(WeightFormat):
    """64 levels a group (4x int4's resolution: ~1/16 of its squared error) at 6 bits a weight plus the group's
    scale and zero, for the layers a mix gives more than int4 and less than int8. A code c = 4 hi + lo is
    computed as two MatMulNBits products, the 4-bit part on 4x the step, the 2-bit part on the step."""

    name, methods, grouped = "int6", ("rtn", "gptq"), True
    summary = "64 levels a group, a 4-bit and a 2-bit part: between int4 and int8"
    exports_rows, rows_first = True, True

    def quantize(self, w, group, feedback=None):
        return layouts.pack_int6(*_grouped_codes(w, group, feedback, layouts.INT6_TOP))

    def storage(self, N, K, group):
        blocks = K // group
        return {**Int4().storage(N, K, group), "qweight_low": ((N, blocks, group // 4), torch.uint8),
                "zero_points_low": ((N, math.ceil(blocks / 4)), torch.uint8)}

    def dequantize(self, t, N, K, group):
        return layouts.dequantize_int6(t)

    def matmul(self, x, layer):
        """Two launches of the int4 kernels where they run (the 2-bit part's codes 0..3 as int4 nibbles, made once
        a layer: 8 bits a weight on the GPU, the same numbers): 4 x (hi - zh) s + (lo - zl) s; else the
        dequantized weight."""
        kernel = kernel_device(x) and not x.requires_grad and not compiling(x)
        if kernel:  # (Triton imported only where a kernel can run)
            from edgettt.ops.quantized.int4 import kernel_supports

            kernel = kernel_supports(layer.group_size)
        if not kernel:
            return F.linear(x, layer.weight.to(x.dtype))
        low = layer.__dict__.get("_int6_low_as_int4")
        if low is None or low[0].device != layer.qweight_low.device:
            low = layer.__dict__["_int6_low_as_int4"] = self.low_as_int4(layer.tensors())
        return (4 * int4_product(x, layer.qweight, layer.scales, layer.zero_points, False, True, None)
                + int4_product(x, low[0], layer.scales, low[1], False, True, None))

    @staticmethod
    def low_as_int4(t):
        """The 2-bit part in int4's layout: (qweight [N, K/g, g/2], zero_points [N, ceil(K/g / 2)])."""
        blocks = t["scales"].shape[1]
        zeros = layouts.unpack_crumbs(t["zero_points_low"])[:, :blocks]
        return (layouts.pack_nibbles(layouts.unpack_crumbs(t["qweight_low"])),
                layouts.pack_nibbles(F.pad(zeros, (0, blocks % 2))))

    def label(self, method, group):
        return f"{self.name}-{method}-g{group}"

    def export_tensors(self, t):
        return dict(t)

    @staticmethod
    def _parts(t):
        """The two MatMulNBits weights: (4-bit part on 4x the step, 2-bit part on the step)."""
        return ({"qweight": t["qweight"], "scales": t["scales"] * 4, "zero_points": t["zero_points"]},
                {"qweight": t["qweight_low"], "scales": t["scales"], "zero_points": t["zero_points_low"]})

    def export_matmul(self, x, t, K, N, group, activations="float"):
        high, low = self._parts(t)
        return (export_nbits_matmul(x, high, K, N, group, 4, "float")
                + export_nbits_matmul(x, low, K, N, group, 2, "float"))

    def export_rows(self, ids, t, K, N, group):
        return sum(torch.ops.edgettt.gather_nbits(ids, p["qweight"], p["scales"], p["zero_points"], K, N, group, bits)
                   for p, bits in zip(self._parts(t), (4, 2)))


UNPACK = {2: layouts.unpack_crumbs, 4: layouts.unpack_nibbles, 8: lambda codes: codes}  # MatMulNBits' bits


def nbits_zeros(zero_points: torch.Tensor, blocks: int, bits: int) -> torch.Tensor:
    """MatMulNBits' zero points one a block, [N, blocks] (unpacked from 8 / bits a byte)."""
    return UNPACK[bits](zero_points)[:, :blocks]


def nbits_weight(qweight: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor, K: int, bits: int):
    """The dequantized [N, K] weight of MatMulNBits' layout (codes [N, blocks, block * bits / 8] bytes)."""
    N, blocks = scales.shape
    codes = UNPACK[bits](qweight).float()
    values = (codes - nbits_zeros(zero_points, blocks, bits).float()[..., None]) * scales[..., None]
    return values.reshape(N, -1)[:, :K]


# ---- the kernels as single operations in a torch.compile graph -----------------------------------------
# Under torch.compile a QuantLinear multiplies through these opaque operations: inductor does not trace
# into a Triton launch's host code (autotuning, shape choices), and without them a compiled step would run
# the dequantized float weight. On CUDA they launch the format's kernel (which a captured CUDA graph then
# replays); elsewhere they compute the format's reference.

def kernel_device(x: torch.Tensor) -> bool:
    """Whether a format's kernels run on `x`'s device (CUDA; the CPU tests switch them on under Triton's
    interpreter)."""
    return x.is_cuda


def compiling(x: torch.Tensor) -> bool:
    """Whether torch.compile is tracing a product without autograd (the ops have no backward; edgettt's
    ONNX export swaps QuantLinear out before it traces)."""
    return torch.compiler.is_compiling() and not x.requires_grad


def int8_product(x, qweight, scales, a8: bool, kernel: bool, dequantized) -> torch.Tensor:
    """x @ W^T of an int8 weight, eager and compiled alike: with int8 activations (`a8`) the W8A8 kernel
    on the int8 tensor cores or its reference, else the weight-only kernel or the weight `dequantized()`."""
    from edgettt.ops.quantized.int8 import int8_matmul, int8_matmul_a8_ref

    if a8:
        return int8_matmul(x, qweight, scales, gemm="a8") if kernel else int8_matmul_a8_ref(x, qweight, scales)
    return int8_matmul(x, qweight, scales) if kernel else F.linear(x, dequantized().to(x.dtype))


def int4_product(x, qweight, scales, zero_points, a8: bool, kernel: bool, dequantized) -> torch.Tensor:
    """x @ W^T of an int4 weight, as `int8_product` (W4A8: the weight rounded to int8 rows first)."""
    from edgettt.ops.quantized.int4 import int4_matmul, int4_matmul_a8_ref

    t = (qweight, scales, zero_points)
    if a8:
        return int4_matmul(x, *t, gemm="a8") if kernel else int4_matmul_a8_ref(x, *t)
    return int4_matmul(x, *t) if kernel else F.linear(x, dequantized().to(x.dtype))


@torch.library.custom_op("edgettt::int8_linear", mutates_args=())
def int8_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, a8: bool) -> torch.Tensor:
    return int8_product(x, qweight, scales, a8, x.is_cuda,
                        lambda: layouts.dequantize_int8({"qweight": qweight, "scales": scales}))


@int8_linear.register_fake
def _(x, qweight, scales, a8):
    return x.new_empty(*x.shape[:-1], qweight.shape[0])


@torch.library.custom_op("edgettt::int4_linear", mutates_args=())
def int4_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor,
                a8: bool) -> torch.Tensor:
    from edgettt.ops.quantized.int4 import kernel_supports

    t = {"qweight": qweight, "scales": scales, "zero_points": zero_points}
    return int4_product(x, qweight, scales, zero_points, a8, x.is_cuda and kernel_supports(qweight.shape[2] * 2),
                        lambda: layouts.dequantize_int4(t))


@int4_linear.register_fake
def _(x, qweight, scales, zero_points, a8):
    return x.new_empty(*x.shape[:-1], qweight.shape[0])


@torch.library.custom_op("edgettt::int4_linear_fused", mutates_args=())
def int4_linear_fused(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor,
                      norm: str, norm_weight: Optional[torch.Tensor], norm_bias: Optional[torch.Tensor], eps: float,
                      up: Optional[torch.Tensor], residual: Optional[torch.Tensor], a8: bool, glu: bool) -> torch.Tensor:
    """(residual +) prologue(x) @ W^T of an int4 weight in one GEMV launch (`ops.quantized.int4.int4_gemv`; its
    reference off CUDA): `norm` "none", "rms" or "layer" (with its weight, bias, eps), or `up` for SwiGLU's
    silu(x) * up; `a8`: the prologue's output rounded to int8 (W4A8); `glu`: the weight a stacked gate/up
    product, silu(gate) * up returned. A compiled decode step's product with its norm, activation and
    residual (`fused_products.product`)."""
    from edgettt.ops.quantized.int4 import int4_gemv, int4_gemv_ref, kernel_supports

    spec = None if norm == "none" else (norm, norm_weight, norm_bias, eps)
    gemv = int4_gemv if x.is_cuda and kernel_supports(qweight.shape[2] * 2) else int4_gemv_ref
    return gemv(x, qweight, scales, zero_points, spec, up, residual, glu, a8)


@int4_linear_fused.register_fake
def _(x, qweight, scales, zero_points, norm, norm_weight, norm_bias, eps, up, residual, a8, glu):
    return x.new_empty(*x.shape[:-1], qweight.shape[0] // (2 if glu else 1))


def export_nbits_matmul(x: torch.Tensor, t: dict[str, torch.Tensor], K: int, N: int, block: int, bits: int,
                        activations: str) -> torch.Tensor:
    """x times a weight in MatMulNBits' layout, as the export writes it: MatMulNBits (activations
    "float": fp32; "int8": accuracy level 4), or for "int8-tensor" DynamicQuantizeMatMul over int8
    rows that ONNX Runtime derives from the same bytes when the session loads (`matmul_int8_rows`):
    its int8 GEMM runs on the CPU's int8 matrix units (AMX, VNNI), 4-5x fp32 MatMul at 512 tokens on
    this project's CPU, where MatMulNBits computes in fp32 or in a slower int8 path
    (benchmarks/results/matmulnbits_cpu.md)."""
    if activations == "int8-tensor":
        return torch.ops.edgettt.matmul_int8_rows(x, t["qweight"], t["scales"], t["zero_points"], K, N, block, bits)
    return torch.ops.edgettt.matmul_nbits(x, t["qweight"], t["scales"], t["zero_points"], K, N, block, bits,
                                          ACCURACY_LEVEL[activations])


@torch.library.custom_op("edgettt::matmul_nbits", mutates_args=())
def matmul_nbits(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor,
                 K: int, N: int, block_size: int, bits: int, accuracy_level: int) -> torch.Tensor:
    return x @ nbits_weight(qweight, scales, zero_points, K, bits).T.to(x.dtype)


@matmul_nbits.register_fake
def _(x, qweight, scales, zero_points, K, N, block_size, bits, accuracy_level):
    return x.new_empty(*x.shape[:-1], N)


def matmul_nbits_onnx(x, qweight, scales, zero_points, K: int, N: int, block_size: int, bits: int,
                      accuracy_level: int):
    return ort_schemas.msft().MatMulNBits(x, qweight, scales, zero_points, K=K, N=N, bits=bits,
                                          block_size=block_size, accuracy_level=accuracy_level)


# The prefill's int8 rows span +-63, not +-127: ONNX Runtime's uint8 x int8 GEMM on x86 CPUs without VNNI (AVX2)
# adds pairs of uint8 x int8 products in 16 bits and saturates past 32767; 2 x 255 x 63 stays below it, so the
# same fast kernel (AMX, VNNI, AVX2) is exact on every CPU (its own "reduce range"). Full +-127 rows were off by
# up to 7.5x the activation rounding bound on an AVX2 CPU (measured).
INT8_ROW_MAX = 63


def int8_row_factors(scales: torch.Tensor, zeros: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 rows of a MatMulNBits weight [N, K] (scales and unpacked zero points [N, blocks]):
    w = (code - zero) * scale_g = int8 * row_scale, int8 = round((code - zero) * factor_g),
    factor_g = scale_g / row_scale, row_scale = max_g(scale_g * reach_g) / INT8_ROW_MAX where reach_g =
    max(zero, 2^bits - 1 - zero) (at most 127: 8-bit codes are symmetric int8 + 128) bounds
    |code - zero|: the row's largest value when the codes span the grid (as round-to-nearest's min/max
    grid does), so every value fits. From the small per-block tensors only: the export's load-time
    derivation touches each weight in three ops (`matmul_int8_rows_onnx`)."""
    zeros = zeros.float()
    reach = torch.maximum(zeros, (2**bits - 1) - zeros).clamp(max=127)
    row_scale = (scales * reach).amax(dim=1).clamp_min(1e-12) / INT8_ROW_MAX
    return scales / row_scale[:, None], row_scale


@torch.library.custom_op("edgettt::matmul_int8_rows", mutates_args=())
def matmul_int8_rows(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor,
                     K: int, N: int, block_size: int, bits: int) -> torch.Tensor:
    """x times the MatMulNBits weight rounded again to int8 rows (`int8_row_factors`)."""
    factors, row_scale = int8_row_factors(scales, nbits_zeros(zero_points, scales.shape[1], bits), bits)
    rows = torch.round(nbits_weight(qweight, factors, zero_points, K, bits)).clamp(-INT8_ROW_MAX, INT8_ROW_MAX)
    return x @ (rows * row_scale[:, None]).T.to(x.dtype)


@matmul_int8_rows.register_fake
def _(x, qweight, scales, zero_points, K, N, block_size, bits):
    return x.new_empty(*x.shape[:-1], N)


def matmul_int8_rows_onnx(x, qweight, scales, zero_points, K: int, N: int, block_size: int, bits: int):
    """DynamicQuantizeMatMul(x, int8 columns within +-INT8_ROW_MAX, row scales). The columns come from MatMulNBits' bytes
    through constant nodes that ONNX Runtime folds once when the session loads (with the manifest's
    `session.disable_quant_qdq`): unpacked codes, DequantizeLinear by the blocks' factors and zero
    points, QuantizeLinear (round, saturate), Transpose: about 10 bytes a weight while folding, then
    the prefill session holds a byte a weight; the file keeps one copy of the weights. The exporter's
    optimizer folds them into the file instead for a weight of at most 8192 bytes (onnxscript's
    folding limit): a few KB, in the tiny models only."""
    from onnx import TensorProto
    from onnxscript import opset18 as op
    from onnxscript import opset21

    blocks = -(-K // block_size)
    codes, zeros = qweight, zero_points
    if bits == 4:
        codes, zeros = unpack_nibbles_onnx(qweight), unpack_nibbles_onnx(zero_points)
        zeros = op.Slice(zeros, op.Constant(value_ints=[0]), op.Constant(value_ints=[blocks]), op.Constant(value_ints=[1]))
    zero_values = op.Cast(zeros, to=TensorProto.FLOAT)  # `int8_row_factors` on the [N, blocks] tensors
    reach = op.Min(op.Max(zero_values, op.Sub(op.Constant(value_float=float(2**bits - 1)), zero_values)),
                   op.Constant(value_float=127.0))
    row_scale = op.Div(op.Max(op.ReduceMax(op.Mul(scales, reach), op.Constant(value_ints=[1]), keepdims=0),
                              op.Constant(value_float=1e-12)), op.Constant(value_float=float(INT8_ROW_MAX)))
    factors = op.Div(scales, op.Unsqueeze(row_scale, op.Constant(value_ints=[1])))
    codes = op.Reshape(codes, op.Constant(value_ints=[N, blocks * block_size]))
    if blocks * block_size != K:  # 8-bit rows padded to whole blocks
        codes = op.Slice(codes, op.Constant(value_ints=[0]), op.Constant(value_ints=[K]), op.Constant(value_ints=[1]))
    values = opset21.DequantizeLinear(codes, factors, zeros, axis=1, block_size=block_size)  # (code - zero) * factor
    rows = opset21.QuantizeLinear(values, op.Constant(value_float=1.0), op.Constant(value=scalar_proto(0, "int8")))
    return ort_schemas.msft().DynamicQuantizeMatMul(x, op.Transpose(rows, perm=[1, 0]), row_scale)


def unpack_nibbles_onnx(packed):
    """`layouts.unpack_nibbles` as ONNX nodes: [..., m] bytes -> [..., 2m] codes."""
    from onnxscript import opset18 as op

    column = op.Unsqueeze(packed, op.Constant(value_ints=[-1]))
    low = op.BitwiseAnd(column, op.Constant(value=scalar_proto(15, "uint8")))
    high = op.BitShift(column, op.Constant(value=scalar_proto(4, "uint8")), direction="RIGHT")
    shape = op.Concat(op.Slice(op.Shape(packed), op.Constant(value_ints=[0]), op.Constant(value_ints=[-1])),
                      op.Constant(value_ints=[-1]), axis=0)
    return op.Reshape(op.Concat(low, high, axis=-1), shape)


def scalar_proto(value: int, dtype: str):
    """A scalar TensorProto of a numpy dtype ("uint8", "int8"): an ONNX Constant's value."""
    import numpy as np
    from onnx import numpy_helper

    return numpy_helper.from_array(np.array(value, dtype=dtype))


@torch.library.custom_op("edgettt::gather_nbits", mutates_args=())
def gather_nbits(ids: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor,
                 K: int, N: int, block_size: int, bits: int) -> torch.Tensor:
    return nbits_weight(qweight, scales, zero_points, K, bits)[ids]


@gather_nbits.register_fake
def _(ids, qweight, scales, zero_points, K, N, block_size, bits):
    return scales.new_empty(*ids.shape, K)


def gather_nbits_onnx(ids, qweight, scales, zero_points, K: int, N: int, block_size: int, bits: int):
    """GatherBlockQuantized reads MatMulNBits' bytes as rows [N, blocks * block * bits / 8] (the same
    bytes: a Reshape of the one initializer both nodes share)."""
    from onnxscript import opset18 as op

    blocks = -(-K // block_size)
    rows = op.Reshape(qweight, op.Constant(value_ints=[N, blocks * block_size * bits // 8]))
    out = ort_schemas.msft().GatherBlockQuantized(rows, ids, scales, zero_points, gather_axis=0, quantize_axis=1,
                                                   block_size=block_size, bits=bits)
    if blocks * block_size != K:  # padded 8-bit rows
        out = op.Slice(out, op.Constant(value_ints=[0]), op.Constant(value_ints=[K]), op.Constant(value_ints=[-1]))
    return out


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
        self.summary = f"bitsandbytes' {'normal-float' if name == 'nf4' else '4-bit float'} codebook, absmax a block"

    def quantize(self, w, group, feedback=None):
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

    def export_matmul(self, x, t, K, N, group, activations="float"):
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
    summary = "bitsandbytes' LLM.int8: int8 rows, outlier columns in fp16"

    def quantize(self, w, group, feedback=None):
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
        return int8_rows_as_nbits(t["qweight"], t["scb"] / 127)

    export_matmul, export_rows = Int8.export_matmul, Int8.export_rows
    int8_activation_graphs, exports_rows = Int8.int8_activation_graphs, True


# ---- the registry ---------------------------------------------------------------------------------------

WEIGHT_FORMATS: dict[str, WeightFormat] = {f.name: f for f in (Int8(), Int4(), Int6(), Bnb4("nf4"), Bnb4("fp4"),
                                                                 LlmInt8())}
METHODS = ("rtn", "gptq")


def weight_format(name: str) -> WeightFormat:
    return WEIGHT_FORMATS[name]


def stored_tensor_names() -> set[str]:
    """Every name a format stores a layer's tensors under (`layer.qweight`, `layer.scales`, ...)."""
    return {name for f in WEIGHT_FORMATS.values() for name in f.storage(2, 64, 32)}


# ---- ONNX: the custom ops' translations --------------------------------------------------------------------

def onnx_translations() -> dict:
    """torch custom op -> the onnxscript function that builds its ONNX node."""
    return {torch.ops.edgettt.matmul_nbits.default: matmul_nbits_onnx,
            torch.ops.edgettt.gather_nbits.default: gather_nbits_onnx,
            torch.ops.edgettt.matmul_int8_rows.default: matmul_int8_rows_onnx,
            torch.ops.edgettt.matmul_bnb4.default: matmul_bnb4_onnx}
