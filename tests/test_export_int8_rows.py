"""The prefill's int8 GEMM (`edgettt::matmul_int8_rows` -> DynamicQuantizeMatMul over int8 rows that
ONNX Runtime derives from MatMulNBits' bytes at session load) against torch, through ONNX Runtime."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from edgettt.onnx import SESSION_CONFIG, onnx_ops
from edgettt.quant.weight_formats import INT8_ROW_MAX, WEIGHT_FORMATS, int8_row_factors, nbits_weight, nbits_zeros


class Int8Rows(nn.Module):
    def __init__(self, t: dict, K: int, N: int, block: int, bits: int):
        super().__init__()
        for name, tensor in t.items():
            self.register_buffer(name, tensor)
        self.shape = (K, N, block, bits)

    def forward(self, x):
        return torch.ops.edgettt.matmul_int8_rows(x, self.qweight, self.scales, self.zero_points, *self.shape)


CASES = {  # format, K, group: int4 with an odd block count (a padded zero-point nibble), int8 with K padded
    "int4-g32-3-blocks": ("int4", 96, 32),
    "int4-g64": ("int4", 128, 64),
    "int8-K40": ("int8", 40, 32),
}


@pytest.mark.parametrize("case", CASES)
def test_int8_rows_match_torch_within_the_activation_rounding_bound(case, tmp_path):
    name, K, group = CASES[case]
    fmt, N = WEIGHT_FORMATS[name], 256  # qweight above the exporter's folding limit (8192 elements), as in a model
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(3)) / 8
    t = fmt.export_tensors(fmt.quantize(w, group))
    block, bits = t["qweight"].shape[2] * (2 if name == "int4" else 1), 4 if name == "int4" else 8
    x = torch.randn(2, 5, K, generator=torch.Generator().manual_seed(4))
    path = tmp_path / "m.onnx"
    module = Int8Rows(t, K, N, block, bits).eval()
    torch.onnx.export(module, (x,), dynamo=True, custom_translation_table=onnx_ops.TRANSLATIONS, opset_version=21,
                      optimize=True).save(str(path))
    graph = onnx.load(str(path)).graph
    node = next(n for n in graph.node if n.op_type == "DynamicQuantizeMatMul")
    assert node.input[1] not in {i.name for i in graph.initializer}  # made from the bytes when loading, not stored

    options = ort.SessionOptions()
    for key, value in SESSION_CONFIG.items():
        options.add_session_config_entry(key, value)
    y = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0]

    factors, row_scale = int8_row_factors(t["scales"], nbits_zeros(t["zero_points"], t["scales"].shape[1], bits), bits)
    codes = torch.round(nbits_weight(t["qweight"], factors, t["zero_points"], K, bits))
    # within +-63: ONNX Runtime's uint8 x int8 kernel without VNNI (AVX2) adds pairs of products in 16 bits
    assert INT8_ROW_MAX == 63 and codes.abs().max() <= INT8_ROW_MAX and 2 * 255 * INT8_ROW_MAX < 2**15
    w8 = codes * row_scale[:, None]
    exact = nbits_weight(t["qweight"], t["scales"], t["zero_points"], K, bits)
    assert ((w8 - exact).abs() <= row_scale[:, None] / 2 + 1e-7).all()  # one more rounding, half a row step
    if name == "int8":  # an int8 weight's own codes, halved onto the +-63 grid
        own = fmt.quantize(w, group)["qweight"].float()
        assert torch.equal(codes, torch.round(own * INT8_ROW_MAX / 127))
    reference = (x @ w8.T).numpy()
    # x rounded to one uint8 grid per tensor: each product is off by at most half its step per input
    step = (max(0.0, x.max().item()) - min(0.0, x.min().item())) / 255
    bound = w8.abs().sum(1).numpy() * step / 2 + 1e-4
    assert np.all(np.abs(y - reference) <= bound)
    assert np.abs(y - reference).max() > 0  # the activations were rounded: the int8 path ran
