"""Benchmark: design choices of the parallel-form prefill kernel (edgettt/kernels/prefill.py), on CUDA.

    python benchmarks/bench_parallel_variants.py --json benchmarks/results/parallel_variants_h200.json

Pass 2 either recomputes the values from (k, v, lr) or reads the ones pass 1 stored (more bytes,
less arithmetic); the sequence is split into segments (programs per (sequence, head)) for
parallelism. bf16, B=4, H=16, d=64, T=32768: the issue's target shape.
"""

import argparse
import json

import torch

from edgettt.bench import copy_bandwidth, prefill_inputs, time_ms
from edgettt.kernels import prefill


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-len", type=int, default=32768)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ceiling = copy_bandwidth()
    B, H, d, T = 4, 16, 64, args.seq_len
    q, k, v, lr, S0, gamma, beta, eta = prefill_inputs(B, H, T, d, 16, torch.bfloat16)
    S = S0.expand(B, -1, -1, -1).contiguous()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for store in (False, True):
        for per_sm in (1, 2, 4, 8, 16):
            segments = max(1, per_sm * sms // (B * H))
            ms = time_ms(lambda: prefill._parallel_aligned(q, k, v, lr, S0, gamma, beta, eta, S, segments=segments,
                                                            store_values=store))
            moved = (6 + (2 if store else 0)) * q.numel() * q.element_size()
            rows.append({"store_values": store, "segments": segments, "ms": ms,
                         "GBps": moved / ms / 1e6, "fraction_of_copy": moved / (ms * 1e-3) / ceiling})
            print(f"store_values={store!s:5} segments={segments:4d}  {ms:.3f} ms  {rows[-1]['GBps']:.0f} GB/s "
                  f"({rows[-1]['fraction_of_copy']:.1%} of copy)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "copy_bandwidth_GBps": ceiling / 1e9, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
