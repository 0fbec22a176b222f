"""Benchmark: the linear-attention decode step (Triton kernel vs the torch reference) on CUDA.

    python benchmarks/bench_decode.py --json benchmarks/results/decode_h200.json

One decode step of one layer for B sequences, H heads, head dim d (state rows Dk = d + 1): reads
qa, ka, vh and the state (S, A), writes A (and S at a mini-batch's end) and zbar. Speed is given
as time, as bytes per second against the device-to-device copy bandwidth measured in the same
run, and as a ratio against the torch reference. The int8 state rows keep A (and the vectors) in
the dtype named in the A column. State sets rotate so the working set exceeds L2.
"""

from __future__ import annotations

import argparse
import json
import platform

import torch
import triton
from triton.testing import do_bench

from edgettt.kernels.decode import decode_step, decode_step_int8, decode_step_int8_ref, decode_step_ref


def copy_bandwidth(n_bytes: int = 2 << 30) -> float:
    src = torch.empty(n_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=50, rep=300)
    return 2 * n_bytes / (ms * 1e-3)  # read + write


def bench(B: int, H: int, d: int, dtype: torch.dtype, commit: bool, ceiling: float, int8_state: bool = False,
          sets: int = 8) -> dict:
    """One decode step; `dtype` is the float state's (or, with `int8_state`, A's and the vectors')."""
    Dk, Dv = d + 1, d
    g = lambda *s: torch.randn(*s, device="cuda", dtype=dtype)  # noqa: E731
    qa, ka, vh = g(B, H, Dk), g(B, H, Dk), g(B, H, Dv)
    eta = torch.tensor([1.0, 0.5, 0.25, 0.125], device="cuda")
    inner = 3 if commit else 1
    out = torch.empty(B, H, Dv, device="cuda", dtype=dtype)
    if int8_state:
        S0, scale = torch.randn(H, Dk, Dv, device="cuda"), torch.rand(H, Dk, device="cuda") * 0.01 + 1e-3
        states = [(torch.randint(-127, 128, (B, H, Dk, Dv), device="cuda", dtype=torch.int8), g(B, H, Dk, Dv))
                  for _ in range(sets)]
        kernel = lambda S, A: decode_step_int8(qa, ka, vh, S, scale, S0, A, eta, inner, out=out)  # noqa: E731
        ref = lambda S, A: decode_step_int8_ref(qa, ka, vh, S, scale, S0, A, eta, inner, out=out)  # noqa: E731
    else:
        states = [(g(B, H, Dk, Dv), g(B, H, Dk, Dv)) for _ in range(sets)]
        kernel = lambda S, A: decode_step(qa, ka, vh, S, A, eta, inner, out=out)  # noqa: E731
        ref = lambda S, A: decode_step_ref(qa, ka, vh, S, A, eta, inner, out=out)  # noqa: E731
    counter = [0]

    def run(fn):
        def step():
            S, A = states[counter[0] % sets]
            counter[0] += 1
            fn(S, A)
        return step

    kernel_ms = do_bench(run(kernel), warmup=50, rep=300)
    ref_ms = do_bench(run(ref), warmup=20, rep=100)
    elements = B * H * Dk * Dv
    s_size, a_size = (1 if int8_state else dtype.itemsize), dtype.itemsize
    moved = elements * (s_size * (2 if commit else 1) + 2 * a_size) + B * H * (2 * Dk + 2 * Dv) * dtype.itemsize
    if int8_state:
        moved += H * Dk * Dv * 4 + H * Dk * 4  # S0 and the scales, shared by the batch
    bw = moved / (kernel_ms * 1e-3)
    return {"B": B, "H": H, "d": d, "state": "int8" if int8_state else str(dtype).replace("torch.", ""),
            "dtype": str(dtype).replace("torch.", ""), "commit": commit,
            "kernel_us": kernel_ms * 1e3, "torch_ref_us": ref_ms * 1e3, "speedup_vs_torch": ref_ms / kernel_ms,
            "bytes_moved": moved, "bandwidth_GBps": bw / 1e9, "fraction_of_copy": bw / ceiling,
            "tokens_per_s_per_layer": B / (kernel_ms * 1e-3)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ceiling = copy_bandwidth()
    rows = [bench(B, 16, 64, dt, commit, ceiling, int8) for B in args.batch
            for int8, dt in ((False, torch.float32), (False, torch.bfloat16), (True, torch.float32), (True, torch.bfloat16))
            for commit in (False, True)]
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "copy_bandwidth_GBps": ceiling / 1e9,
            "command": "python benchmarks/bench_decode.py --json benchmarks/results/decode_h200.json"}
    print(json.dumps(meta))
    print(f"{'B':>4} {'state':>6} {'A':>8} {'commit':>6} {'kernel us':>10} {'torch us':>9} {'x torch':>8} {'GB/s':>7} {'of copy':>8}")
    for r in rows:
        print(f"{r['B']:>4} {r['state']:>6} {r['dtype']:>8} {str(r['commit']):>6} {r['kernel_us']:>10.2f} {r['torch_ref_us']:>9.2f} "
              f"{r['speedup_vs_torch']:>8.1f} {r['bandwidth_GBps']:>7.0f} {r['fraction_of_copy']:>8.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
