"""Benchmark: the parallel-form prefill kernel's cuts and launch configurations, on CUDA.

    python benchmarks/bench_parallel_variants.py --json benchmarks/results/variants_h200.json
    python benchmarks/bench_parallel_variants.py --configs --json benchmarks/results/configs_h200.json

- default: edgettt/ops/linear_attention/prefill.py's parallel form, bf16, B=4, H=16, d=64, T=32768 (the kernel
  issue's target shape): segments per (sequence, head) and tile sizes, pass 1 alone and both
  passes; the operator `prefill.parallel` eagerly and as a CUDA graph; a ragged length (T - 40: a
  ragged last tile and an unfinished mini-batch, the masked kernels); flash-linear-attention's
  chunk_linear_attn in the same run when installed.
- `--configs`: every launch configuration of PARALLEL_CONFIGS, both passes pinned to it, at
  T = 8192 and 32768; pass 1 alone and both passes.

The design choices the kernel no longer offers (pass 2 recomputing the values, a wider tile for
pass 1, column sums stored by pass 1 or summed with tl.sum, masks on tiles that need none, a fused
persistent kernel, register caps) were measured with earlier versions of this script and removed:
`benchmarks/results/prefill_design.md` lists them with their results files and commits.
"""

import argparse
import json

import torch

from lab.kernel_bench import copy_bandwidth, prefill_inputs, time_ms, warm_up
from edgettt.ops.linear_attention import prefill

B, H, d = 4, 16, 64  # the target shape (with T), bf16, mini-batch 16


def target_inputs(T):
    """(q, k, v, lr, S0, gamma, beta, eta) at the target shape, the state S to start from, and the
    bytes of one [B, H, T, d] tensor."""
    args = prefill_inputs(B, H, T, d, 16, torch.bfloat16)
    return args, args[4].expand(B, -1, -1, -1).contiguous(), args[0].numel() * args[0].element_size()


def passes(q, k, v, lr, S0, gamma, beta, eta, S, first_only=False, **cut):
    """Pass 1 alone, or both passes, with the plan `cut` (tile, segments) gives."""
    plan = prefill._parallel_plan(q, eta, **cut)
    if first_only:
        return prefill._parallel_pass1(q, k, v, lr, S0, gamma, beta, plan)
    U, vh = prefill._parallel_pass1(q, k, v, lr, S0, gamma, beta, plan)
    return prefill._parallel_pass2(q, k, gamma, beta, eta, S, U, vh, plan)


def row(fields, ms, moved_bytes, ceiling):
    r = {**fields, "ms": ms, "fraction_of_copy": moved_bytes / (ms * 1e-3) / ceiling}
    print(json.dumps(r), flush=True)
    return r


def fla_run(q, k, v):
    """flash-linear-attention's chunk_linear_attn on the same inputs, or None when not installed."""
    from lab.kernel_bench import fla_functions

    if (fla := fla_functions()) is None:
        return None
    qf, kf, vf = (x.transpose(1, 2) for x in (q, k, v))
    return lambda: fla[1](qf, kf, vf, normalize=False)


def parallel_rows(T, ceiling):
    (q, k, v, lr, S0, gamma, beta, eta), S, tensor = target_inputs(T)
    S0, gamma, beta = S0.float().contiguous(), gamma.float().contiguous(), beta.float().contiguous()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for per_sm, tile in [(2, 64), (4, 64), (8, 64), (4, 32), (4, 128), (None, 64)]:
        segments = None if per_sm is None else max(1, per_sm * sms // (B * H))
        for first in (True, False):
            ms = time_ms(lambda: passes(q, k, v, lr, S0, gamma, beta, eta, S, first, tile=tile, segments=segments))
            # pass 1 reads k, v and writes vh; pass 2 reads q, k, vh and writes o
            rows.append(row({"T": T, "segments": segments or "auto", "tile": tile, "passes": "1" if first else "1+2"},
                            ms, tensor * (3 if first else 7), ceiling))
    args = (q, k, v, lr, S0, gamma, beta, eta)
    ragged = tuple(x[..., :T - 40, :] for x in (q, k, v)) + (lr[..., :T - 40], S0, gamma, beta, eta)
    runs = {"prefill.parallel (the operator)": (lambda: prefill.parallel(*args), 7),
            "T-40 (masked tiles)": (lambda: prefill.parallel(*ragged), 7 * (T - 40) / T)}
    if (fla := fla_run(q, k, v)) is not None:
        runs["fla chunk_linear_attn"] = (fla, 4)
    for graph in (False, True):
        for name, (fn, moved) in runs.items():
            with torch.no_grad():
                ms = time_ms(fn, graph=graph)
            rows.append(row({"T": T, "name": name + (" (cuda graph)" if graph else ""), "passes": "all"}, ms,
                            tensor * moved, ceiling))
    return rows


def config_rows(ceiling):
    rows = []
    for T in (8192, 32768):
        (q, k, v, lr, S0, gamma, beta, eta), S, tensor = target_inputs(T)
        for config in prefill.PARALLEL_CONFIGS:
            for tuner in (prefill._parallel_sums_kernel, prefill._parallel_out_kernel):
                tuner.configs, tuner.cache = [config], {}
            for first in (True, False):
                ms = time_ms(lambda: passes(q, k, v, lr, S0, gamma, beta, eta, S, first))
                rows.append(row({"T": T, "warps": config.num_warps, "stages": config.num_stages,
                                 "maxnreg": config.maxnreg, "passes": "1" if first else "1+2"},
                                ms, tensor * (3 if first else 7), ceiling))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-len", type=int, default=32768)
    ap.add_argument("--configs", action="store_true", help="time every launch configuration instead")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    warm_up()
    ceiling = copy_bandwidth()
    rows = config_rows(ceiling) if args.configs else parallel_rows(args.seq_len, ceiling)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "copy_bandwidth_GBps": ceiling / 1e9, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
