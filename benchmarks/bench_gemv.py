"""Benchmark: the int4 GEMV of edgettt/kernels/int4.py alone, then the weight rows of `edgettt bench`
(bf16 cuBLAS, the int4 kernel, bitsandbytes NF4), on CUDA.

    python benchmarks/bench_gemv.py --json benchmarks/results/gemv_h200.json

bf16 activations, M = 1, int4 group 64; weight copies rotate past L2 in a CUDA graph.
The committed results come from the commit "int4 GEMV: nibbles to float ..." (d220746), which timed
two kernels: "group-sum" (each group's codes summed against x across lanes every step, then scaled)
and "accumulate" (every code scaled in place into a tile, one reduction at the end). Accumulate won
on both shapes and is the one kept.
"""

import argparse
import json

import torch

from edgettt.bench import copies_for, copy_bandwidth, time_rotating_ms, weight_rows, weight_variants
from edgettt.kernels import int4

SHAPES = ((4096, 4096), (11008, 4096))


def variant_rows(ceiling):
    rows = []
    for N, K in SHAPES:
        variants = weight_variants(N, K, torch.bfloat16)
        copy, _, nbytes, _ = variants["int4 g64 (edgettt kernel)"]
        copies = [copy() for _ in range(copies_for(nbytes))]
        x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        for name in ("accumulate",):
            ms, _ = time_rotating_ms([lambda c=c: int4.int4_matmul(x, *c) for c in copies])
            rows.append({"variant": name, "N": N, "K": K, "us": ms * 1e3, "fraction_of_copy": nbytes / (ms * 1e-3) / ceiling})
            print(json.dumps(rows[-1]))
        del copies
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ceiling = copy_bandwidth()
    variants = variant_rows(ceiling)
    rows = [r for N, K in SHAPES for r in weight_rows(N, K, 1, torch.bfloat16, ceiling)]
    for r in rows:
        print(f"{r['N']}x{r['K']} {r['name']:32s} {r['ms'] * 1e3:7.2f} us  {r['fraction_of_copy']:6.1%} of copy  "
              + "  ".join(f"{k} {v:.2f}" for k, v in r.items() if k.startswith("x ")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "copy_bandwidth_GBps": ceiling / 1e9, "variants": variants,
                       "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
