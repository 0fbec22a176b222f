"""Host time of one int4 product above the GEMV range (a prefill's), the way int4_matmul launched it before
its launch was trimmed and the way it does since, against bf16 F.linear; and of the dequantizing kernel's launch alone,
through Triton's launch and by calling the compiled kernel Triton returns (what a launch cache would save). On CUDA.

    python benchmarks/launch_overhead.py --json benchmarks/results/launch_overhead_h200.json

16 rows of bf16 x, int4 group 64, at the 760m preset's output and q/k/v shapes: the GPU's work a call is a few
microseconds, so a loop of calls is bound by the host, and its time a call (the median of 5 loops of 2,000
calls, the GPU synchronized after each loop) is the host's cost. Results: benchmarks/results/prefill_gpu_h200.md.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path[:0] = [str(TESTS / "kernels"), str(TESTS)]  # the kernel tests and their conftest
from test_int4 import packed  # noqa: E402

from edgettt.ops.common import cdiv  # noqa: E402

from edgettt.ops.quantized import int4  # noqa: E402


def host_us(fn, calls=2000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def before(x, qweight, scales, zero_points):
    """int4_matmul's earlier dequantize way: rows, an output, Triton's launch, matmul into it, a reshape."""
    N, blocks, GH = qweight.shape
    x2 = x.reshape(-1, x.shape[-1])
    y = torch.empty(x2.shape[0], N, device=x.device, dtype=x.dtype)
    w = torch.empty(N, blocks * GH * 2, device=x.device, dtype=x.dtype)
    int4._int4_dequantize_kernel[(cdiv(N, 64), blocks)](qweight, scales, zero_points, w, N, blocks * GH * 2,
                                                        zero_points.shape[1], GROUP=GH * 2, BN=64)
    torch.matmul(x2, w.T, out=y)
    return y.reshape(*x.shape[:-1], N)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = {}
    for N, K in ((1536, 1536), (4608, 1536)):
        t = packed(N, K, 64, "cuda")
        qweight, scales, zero_points = t
        blocks, GH = qweight.shape[1], qweight.shape[2]
        w = int4.int4_dequantize(*t, torch.bfloat16)
        x = torch.randn(16, K, device="cuda", dtype=torch.bfloat16)
        assert torch.equal(before(x, *t), int4.int4_matmul(x, *t))
        out = torch.empty_like(w)
        kernel_args = (qweight, scales, zero_points, out, N, K, zero_points.shape[1], GH * 2, 64)
        compiled = int4._int4_dequantize_kernel[(cdiv(N, 64), blocks)](*kernel_args)  # what Triton's launch finds
        ways = {"bf16 F.linear": lambda: F.linear(x, w),
                "int4 product, before": lambda: before(x, *t),
                "int4 product (int4_matmul)": lambda: int4.int4_matmul(x, *t),
                "dequantize kernel alone": lambda: int4._int4_dequantize_kernel[(cdiv(N, 64), blocks)](*kernel_args),
                "the same, the compiled kernel called": lambda: compiled[(cdiv(N, 64), blocks, 1)](*kernel_args)}
        for name, fn in ways.items():
            rows[f"{N}x{K}: {name}"] = host_us(fn)
            print(f"{N}x{K}, 16 rows: {name:30s} {rows[f'{N}x{K}: {name}']:6.1f} us a call", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "us_a_call": rows}, f, indent=1)


if __name__ == "__main__":
    main()
