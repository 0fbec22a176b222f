"""`QuantLinear`: a bias-free linear layer whose weight is stored in a weight format."""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from edgettt.errors import EdgetttError
from edgettt.quant.weight_formats import WEIGHT_FORMATS, weight_format


@dataclasses.dataclass(frozen=True)
class QuantState:
    """What a quantized weight is beside its tensors, as bitsandbytes' QuantState: its format (by name),
    group size and shape. It saves itself as a dict (`as_dict`) and loads back from one (`from_dict`,
    checked), and makes the empty layer that a saved model's tensors load into (`empty_layer`)."""

    format: str
    group_size: int
    in_features: int
    out_features: int

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json") -> "QuantState":
        if not isinstance(raw, dict) or set(raw) != {f.name for f in dataclasses.fields(cls)}:
            raise EdgetttError(f"{source}: a quantized weight's state {raw!r}: expected format, group_size, "
                               "in_features and out_features; quantize the model again")
        if raw["format"] not in WEIGHT_FORMATS or not all(
                isinstance(raw[k], int) and not isinstance(raw[k], bool) and raw[k] > 0
                for k in ("group_size", "in_features", "out_features")):
            raise EdgetttError(f"{source}: a quantized weight's state {raw!r}: expected a weight format and "
                               "positive sizes; quantize the model again")
        return cls(**raw)

    def storage(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Shapes and dtypes of the tensors the format stores for this weight."""
        return weight_format(self.format).storage(self.out_features, self.in_features, self.group_size)

    def nbytes(self) -> int:
        """Bytes of the tensors the format stores for this weight (what `QuantLinear.nbytes` counts once made)."""
        return sum(math.prod(shape) * dtype.itemsize for shape, dtype in self.storage().values())

    def empty_layer(self) -> "QuantLinear":
        """The layer with its tensors on the meta device: `load_state_dict(assign=True)` puts a saved
        model's in their place."""
        tensors = {k: torch.empty(shape, dtype=dtype, device="meta") for k, (shape, dtype) in self.storage().items()}
        return QuantLinear(self.in_features, self.out_features, self.format, self.group_size, tensors)


class QuantLinear(nn.Module):
    """Holds the format's tensors as buffers (saved as they are) and computes as the format says:
    through its kernel where one serves it, else with the dequantized weight (what the integer
    kernels and ONNX Runtime compute, up to float rounding). `quant_state` says what it is."""

    def __init__(self, in_features: int, out_features: int, fmt: str, group_size: int,
                 tensors: dict[str, torch.Tensor]):
        super().__init__()
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.format = weight_format(fmt)
        self.quant_state = QuantState(self.format.name, group_size, in_features, out_features)
        for name, tensor in tensors.items():
            self.register_buffer(name, tensor)
        self._weight = None
        self.activations = "float"  # "int8": prefill GEMMs in integers (`weight_formats.int8_activations`)
        self.decode_a8 = False  # int4 with "int8" activations: decode GEMVs in W4A8 too (`weight_formats.int4_a8`)

    def tensors(self) -> dict[str, torch.Tensor]:
        return dict(self.named_buffers(recurse=False))

    def dequantized(self) -> torch.Tensor:
        return self.format.dequantize(self.tensors(), self.out_features, self.in_features, self.group_size)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight, made once per device (for the paths no kernel serves)."""
        if self._weight is None or self._weight.device != self.qweight.device:
            self._weight = self.dequantized().to(self.qweight.device)
        return self._weight

    def forward(self, x):
        return self.format.matmul(x, self)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of the dequantized weight (the embedding of a tied model whose head this is)."""
        return self.format.rows(self.tensors(), ids, self.out_features, self.in_features, self.group_size)

    @staticmethod
    def stackable(layers: list[nn.Module]) -> bool:
        """Whether `layers` (of one input) can be one layer with their rows stacked: all quantized in one
        format whose tensors have one row per output (`rows_first`), with one group size."""
        first = layers[0]
        return all(isinstance(m, QuantLinear) and (m.format, m.group_size, m.in_features) ==
                   (first.format, first.group_size, first.in_features) for m in layers) and first.format.rows_first

    @classmethod
    def stacked(cls, layers: list[QuantLinear]) -> QuantLinear | None:
        """One layer with the rows of `layers` (of one input) stacked: the same numbers, one matmul; None
        unless they are `stackable`."""
        if not cls.stackable(layers):
            return None
        first = layers[0]
        tensors = {name: torch.cat([m.tensors()[name] for m in layers]) for name in first.tensors()}
        stacked = cls(first.in_features, sum(m.out_features for m in layers), first.format.name, first.group_size,
                      tensors)
        stacked.activations, stacked.decode_a8 = first.activations, first.decode_a8
        return stacked

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def extra_repr(self):
        return f"{self.in_features} -> {self.out_features}, {self.format.name}, group {self.group_size}, {self.activations} activations"


class TiedEmbedding(nn.Module):
    """The input embedding of a tied model whose lm_head is quantized: the head's rows, dequantized.
    Holds no tensors (the head's are saved once, under lm_head); `head` is not a submodule."""

    def __init__(self, head: nn.Module):
        super().__init__()
        self._head = [head]  # in a list: not registered, so not saved or counted twice

    @property
    def head(self) -> nn.Module:
        return self._head[0]

    def tie(self, head: nn.Module) -> None:
        self._head = [head]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head.rows(ids)


ACTIVATIONS = ("float", "int8")


def set_activations(model: nn.Module, activations: str, decode: bool = False) -> int:
    """How the model's int8 and int4 layers multiply in a prefill: "float" (weight-only) or "int8" (W8A8 /
    W4A8 on the int8 tensor cores, the activations rounded a row); other formats ignore it. `decode` (with
    "int8"): int4 layers' decode GEMVs in W4A8 too (x rounded in blocks of 32 inside the kernel, dp4a:
    `weight_formats.int4_a8`), faster alone but not in a compiled 760m step with the fused norms
    (benchmarks/results/compiled_decode_h200.md), so asked for, not implied. Returns the number of
    layers that take it."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations {activations!r}: expected one of {', '.join(ACTIVATIONS)}")
    taking = [m for m in model.modules() if isinstance(m, QuantLinear) and m.format.int8_activation_kernels]
    for m in taking:
        m.activations = activations
        m.decode_a8 = decode and activations == "int8" and m.format.int8_decode_kernel
    return len(taking)


def stacked_float_linear(layers: list[nn.Module]) -> nn.Linear | None:
    """One bias-free float linear layer with the rows of `layers` stacked, or None if any is not one."""
    if not all(type(m) is nn.Linear and m.bias is None for m in layers):
        return None
    stacked = nn.Linear(layers[0].in_features, sum(m.out_features for m in layers), bias=False, device="meta")
    stacked.weight = nn.Parameter(torch.cat([m.weight for m in layers]), requires_grad=False)
    return stacked


def stacked_projection(layers: list[nn.Module]) -> nn.Module | None:
    """`mixer.fuse_input_projections`' stack for torch: float layers, or quantized ones of one format."""
    stacked = stacked_float_linear(layers)
    return stacked if stacked is not None else QuantLinear.stacked(layers)
