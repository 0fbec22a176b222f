"""Every launch configuration the autotuners may pick, each checked against the reference on the GPU.

The other kernel tests run with EDGETTT_AUTOTUNE=0 (the first configuration only, see
tests/conftest.py); here each autotuner is given one configuration at a time, in bf16 on one shape
with ragged edges, so a configuration that computes wrong results cannot be picked unnoticed."""

import pytest
import torch

from edgettt.ops.quantized import int4, int8

from edgettt.ops.lact import triton as lact

from edgettt.ops.linear_attention import prefill
from edgettt.ops.linear_attention.prefill import EXACT_CONFIGS, PARALLEL_CONFIGS
from conftest import rel_err
from edgettt.quant.weight_formats import weight_format
from test_int4 import check_int4
from test_int8 import check_int8
from test_lact_kernels import check_chunk_attention, check_features
from test_prefill import check

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def each_config(monkeypatch, autotuner, configs):
    """Yield once per configuration with the autotuner holding only that one."""
    assert len(configs) > 1, "the full list, not the one EDGETTT_AUTOTUNE=0 leaves"
    for config in configs:
        monkeypatch.setattr(autotuner, "configs", [config])
        monkeypatch.setattr(autotuner, "cache", {})
        yield config


def test_every_parallel_config(monkeypatch):
    for tuner in (prefill._parallel_sums_kernel, prefill._parallel_out_kernel):
        for config in each_config(monkeypatch, tuner, PARALLEL_CONFIGS):
            check("parallel", 2, 3, 1000 + 5, 64, 16, torch.bfloat16, "cuda", start=3, with_state=True)


def test_every_exact_config(monkeypatch):
    for config in each_config(monkeypatch, prefill._exact_kernel, EXACT_CONFIGS):
        check("exact", 2, 3, 500 + 5, 64, 16, torch.bfloat16, "cuda", start=3, with_state=True)


@pytest.mark.parametrize("M", [1, 40])
def test_every_int4_config(monkeypatch, M):
    tuner, configs = ((int4._int4_gemv_kernel, int4.GEMV_CONFIGS) if M == 1
                      else (int4._int4_gemm_kernel, int4.GEMM_CONFIGS))
    for config in each_config(monkeypatch, tuner, configs):
        check_int4(M, 1000, 4096 + 64, 64, torch.bfloat16, "cuda")


@pytest.mark.parametrize("M", [1, 40])
def test_every_int8_config(monkeypatch, M):
    tuner, configs = ((int8._int8_gemv_kernel, int8.GEMV_CONFIGS) if M == 1
                      else (int8._int8_gemm_kernel, int8.GEMM_CONFIGS))
    for config in each_config(monkeypatch, tuner, configs):
        check_int8(M, 1000, 4096 + 40, torch.bfloat16, "cuda")


def test_every_lact_config(monkeypatch):
    for config in each_config(monkeypatch, lact._features_kernel, lact.FEATURE_CONFIGS):
        check_features("cuda", "token", (1, 2, 300, 384, 384), torch.bfloat16)
    for config in each_config(monkeypatch, lact._low_rank_features_kernel, lact.LOW_RANK_CONFIGS):
        check_features("cuda", "feature", (1, 2, 300, 384, 384), torch.bfloat16, rank=32)
    for tuner, configs in ((lact._chunk_sums_kernel, lact.SUM_CONFIGS), (lact._chunk_out_kernel, lact.OUT_CONFIGS)):
        for config in each_config(monkeypatch, tuner, configs):
            check_chunk_attention("cuda", True, (1, 2, 300, 136, 200, 128, 5), torch.bfloat16)


def test_every_int8_activation_gemm_config(monkeypatch):
    """The W8A8 GEMM (gemm="a8"; W4A8 requantizes to it) against the integer references, every configuration."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(1000, 4096 + 64, generator=g)
    x = torch.randn(40, 4096 + 64, generator=g).to("cuda", torch.bfloat16)
    t8 = [t.cuda() for t in weight_format("int8").quantize(w, 64).values()]
    t4 = weight_format("int4").quantize(w, 64)
    t4 = [t4[name].cuda() for name in ("qweight", "scales", "zero_points")]
    for config in each_config(monkeypatch, int8._int8_a8_gemm_kernel, int8.A8_CONFIGS):
        assert rel_err(int8.int8_matmul(x, *t8, gemm="a8").float(), int8.int8_matmul_a8_ref(x, *t8).float()) < 1e-2
        assert rel_err(int4.int4_matmul(x, *t4, gemm="a8").float(), int4.int4_matmul_a8_ref(x, *t4).float()) < 1e-2
