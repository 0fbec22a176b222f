"""benchmarks/bench_gemv.py's GEMV variants against the shipped kernel's reference."""

import sys
from pathlib import Path

LAB = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(LAB), str(LAB.parent / "tests")]  # the lab's library (`lab`); the core tests' helpers (conftest)

from conftest import rel_err  # noqa: E402  (first: it sets up torch and Triton for the tests)

import pytest  # noqa: E402
import torch  # noqa: E402

from lab import bench_gemv  # noqa: E402
from edgettt.ops.quantized.int4 import int4_matmul_ref  # noqa: E402
from edgettt.quant.weight_formats import weight_format  # noqa: E402

DEVICES = ["cuda"] if torch.cuda.is_available() else ["cpu"]


def packed(N, K, group, device, seed=0):
    """An int4 weight's codes, scales and zero points, as the kernel takes them."""
    t = weight_format("int4").quantize(torch.randn(N, K, generator=torch.Generator().manual_seed(seed)), group)
    return [t[name].to(device) for name in ("qweight", "scales", "zero_points")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("N,K,group", [(40, 256, 64), (33, 192, 32), (24, 512, 128)])  # N not a tile; slices
def test_the_gemv_benchmarks_variants_match_the_reference(device, N, K, group):
    """benchmarks/bench_gemv.py's GEMV variants (timed against the shipped kernel there) compute the same
    product (the dp4a variant: with x rounded to int8 a group, as its reference rounds it; under the
    interpreter its dp4a is summed byte by byte, on a GPU it is the instruction): a wrong nibble order, group
    or zero-point term fails them."""
    weight = packed(N, K, group, device, seed=2)
    x = torch.randn(1, K, generator=torch.Generator().manual_seed(3)).to(device)
    for name, variant in bench_gemv.VARIANTS.items():
        y = variant(x, *bench_gemv.in_layout(name, weight))
        want = bench_gemv.REFERENCES.get(name, int4_matmul_ref)(x, *weight)  # (dp4a: x rounded to int8 first)
        assert y.shape == (1, N) and rel_err(y.float(), want.float()) < 1e-5, name
