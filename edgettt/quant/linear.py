"""`QuantLinear`: a bias-free linear layer whose weight is stored in a weight format."""

from __future__ import annotations

import torch
from torch import nn

from .weight_formats import weight_format


class QuantLinear(nn.Module):
    """Holds the format's tensors as buffers (saved as they are) and computes as the format says:
    through its kernel where one serves it, else with the dequantized weight (what the integer
    kernels and ONNX Runtime compute, up to float rounding)."""

    def __init__(self, in_features: int, out_features: int, fmt: str, group_size: int,
                 tensors: dict[str, torch.Tensor]):
        super().__init__()
        self.in_features, self.out_features, self.fmt, self.group_size = in_features, out_features, fmt, group_size
        self.format = weight_format(fmt)
        for name, tensor in tensors.items():
            self.register_buffer(name, tensor)
        self._weight = None

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

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def extra_repr(self):
        return f"{self.in_features} -> {self.out_features}, {self.fmt}, group {self.group_size}"


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
