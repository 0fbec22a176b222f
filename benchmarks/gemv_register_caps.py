"""The 760m preset's fused decode products whose prologue takes the int4 GEMV to 168 registers a thread (offline
for sm_90a: 3 programs of 4 warps a multiprocessor instead of 4): the output product with its LayerNorm and
residual, the gate/up product with its RMSNorm and SwiGLU epilogue, each autotuned over GEMV_CONFIGS, then over
GEMV_CONFIGS plus every 4-warp configuration capped at 128 registers (`maxnreg`; offline: 64-104 bytes spilled).

    python benchmarks/gemv_register_caps.py --json benchmarks/results/gemv_register_caps_760m_h200.json

Microseconds a call in a CUDA graph, weight copies rotating past L2, bf16, one row; each result's error against
`int4_gemv_ref`. Results: benchmarks/results/gemm_h200.md (the register caps).
"""

import argparse
import json

import torch
import triton

from lab.kernel_bench import copies_for, time_rotating_ms, weight_variants
from edgettt.ops.quantized import int4


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    base = list(int4.GEMV_CONFIGS)
    capped = [triton.Config(dict(c.kwargs), num_warps=c.num_warps, num_stages=c.num_stages, maxnreg=128)
              for c in base if c.num_warps == 4]
    tuner, rows = int4._int4_gemv_kernel, {}
    for name, N, K, fused in [("o, LayerNorm + residual", 1536, 1536, "layer"),
                              ("gate/up, RMSNorm + GLU", 8192, 1536, "rms")]:
        copy, _, nbytes, _ = weight_variants(N, K, torch.bfloat16)["int4 g64 (edgettt kernel)"]
        copies = [copy() for _ in range(copies_for(nbytes))]
        rand = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16)  # noqa: E731
        x, weight, bias, residual = rand(1, K), rand(K), rand(K), rand(1, N)
        kw = (dict(norm=("layer", weight, bias, 1e-6), residual=residual) if fused == "layer"
              else dict(norm=("rms", weight, None, 1e-6), glu=True))
        want = int4.int4_gemv_ref(x, *copies[0], **kw).float()
        for label, configs in (("GEMV_CONFIGS", base), ("with 128-register caps", base + capped)):
            tuner.configs, tuner.cache = configs, {}
            got = int4.int4_gemv(x, *copies[0], **kw).float()
            ms, _ = time_rotating_ms([lambda c=c: int4.int4_gemv(x, *c, **kw) for c in copies])
            rows[f"{name}: {label}"] = {"us": ms * 1e3, "config": str(tuner.best_config),
                                        "rel_err": ((got - want).norm() / want.norm()).item()}
            print(f"{name:24s} {label:24s} {ms * 1e3:6.2f} us  {tuner.best_config}", flush=True)
    tuner.configs, tuner.cache = base, {}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
