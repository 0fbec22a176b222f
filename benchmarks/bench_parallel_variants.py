"""Benchmark: design choices of the parallel-form prefill kernel, on CUDA (which variant the code
keeps, and why).

    python benchmarks/bench_parallel_variants.py --json benchmarks/results/variants_h200.json
    python benchmarks/bench_parallel_variants.py --configs --json benchmarks/results/configs_h200.json
    EDGETTT_AUTOTUNE=0 python benchmarks/bench_parallel_variants.py --colsums --json benchmarks/results/colsums_h200.json
    EDGETTT_AUTOTUNE=0 python benchmarks/bench_parallel_variants.py --tiles --json benchmarks/results/tiles2_h200.json

- parallel-form prefill (edgettt/kernels/prefill.py), bf16, B=4, H=16, d=64, T=32768 (the issue's
  target shape): pass 2 recomputes the values from (k, v, lr) or reads the ones pass 1 stored (more
  bytes, less arithmetic); segments per (sequence, head); the tiles of the passes (pass 1 may take
  a wider tile than pass 2: it has no [tile, tile] scores); pass 1 timed alone.
- `--colsums`: how pass 2 gets the values' column sums (the state's bias row): stored per tile by
  pass 1 from a product with ones, such a product in pass 2, or tl.sum in both passes; at T = 8192
  and 32768, with flash-linear-attention's chunk_linear_attn (when installed) timed in the same run.
- `--tiles`: tiles without masks where none is needed (`even_tiles`: whole segments, mini-batches
  and head dims, the default) against masked ones, values stored or recomputed, and the operator
  `prefill.parallel` itself, and at T - 40 tokens (a ragged last tile, an unfinished mini-batch: the
  masked kernels, since only whole tiles and segments take the unmasked ones; tiles3_h200.json
  measured a version where all but the last tile did, with and without); eager and as CUDA graphs;
  at T = 8192 and 32768, with chunk_linear_attn in the same run. The committed results hold
  candidates of earlier versions of this script, removed since: tiles_h200.json (commit 9eb174d) the
  LayerNorm shifts from products with the identity on the tensor cores (slower) and a cap of 168
  registers for 3 programs a multiprocessor (1.3-2x slower); tiles2_h200.json (the working tree
  before 29b28a4: its fused kernel was never committed) the chunk mask built every tile against once
  (`hoist_mask`: within noise at 32768, 1% faster at 8192; once is the code now) and both passes in
  one launch of persistent programs taking segments from a queue, pass 2's waiting on counters
  (`fused`: 2% slower, not kept).
- `--configs`: every launch configuration of PARALLEL_CONFIGS (warps, stages, register cap), both
  passes pinned to it, at T = 8192 and 32768; pass 1 alone and both passes.

The committed results also hold int4 GEMV rows from the same run (commit 99f9c40's script): 3-D
tiles [rows, groups, bytes] against 2-D byte tiles reshaped into groups; the 2-D kernel won (11.1 vs
14.2 us at 4096x4096, 24.1 vs 30.9 us at 11008x4096) and is the one kept.
"""

import argparse
import json

import torch

from edgettt.bench import copy_bandwidth, prefill_inputs, time_ms, warm_up
from edgettt.kernels import prefill

B, H, d = 4, 16, 64  # the target shape (with T), bf16, mini-batch 16


def target_inputs(T):
    """(q, k, v, lr, S0, gamma, beta, eta) at the target shape, the state S to start from, and the
    bytes of one [B, H, T, d] tensor."""
    args = prefill_inputs(B, H, T, d, 16, torch.bfloat16)
    return args, args[4].expand(B, -1, -1, -1).contiguous(), args[0].numel() * args[0].element_size()


def parallel_rows(T, ceiling):
    (q, k, v, lr, S0, gamma, beta, eta), S, tensor = target_inputs(T)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    cases = [(store, per_sm, 64, 64) for store in (False, True) for per_sm in (2, 4, 8)] + \
        [(True, 4, 32, 32), (True, 4, 128, 128), (True, 4, 64, 128), (True, 4, 64, 256)]
    for store, per_sm, tile, values_tile in cases:
        segments = max(1, per_sm * sms // (B * H))
        for first in (True, False):
            ms = time_ms(lambda: prefill._parallel_aligned(q, k, v, lr, S0, gamma, beta, eta, S, tile=tile,
                                                            segments=segments, store_values=store, first_pass_only=first,
                                                            values_tile=values_tile))
            # pass 1 reads k, v (and writes vh); pass 2 reads q, k, v or vh and writes o
            moved = tensor * ((3 if store else 2) if first else (7 if store else 6))
            r = {"kernel": "parallel", "store_values": store, "segments": segments, "tile": tile,
                 "values_tile": values_tile, "passes": "1" if first else "1+2", "ms": ms,
                 "fraction_of_copy": moved / (ms * 1e-3) / ceiling}
            rows.append(r)
            print(json.dumps(r))
    return rows


def config_rows(ceiling):
    rows = []
    for T in (8192, 32768):
        (q, k, v, lr, S0, gamma, beta, eta), S, tensor = target_inputs(T)
        for config in prefill.PARALLEL_CONFIGS:
            for tuner in (prefill._parallel_sums_kernel, prefill._parallel_out_kernel):
                tuner.configs, tuner.cache = [config], {}
            for first in (True, False):
                ms = time_ms(lambda: prefill._parallel_aligned(q, k, v, lr, S0, gamma, beta, eta, S,
                                                                first_pass_only=first))
                r = {"T": T, "warps": config.num_warps, "stages": config.num_stages, "maxnreg": config.maxnreg,
                     "passes": "1" if first else "1+2", "ms": ms,
                     "fraction_of_copy": tensor * (3 if first else 7) / (ms * 1e-3) / ceiling}
                rows.append(r)
                print(json.dumps(r))
    return rows


def fla_run(q, k, v):
    """flash-linear-attention's chunk_linear_attn on the same inputs, or None when not installed."""
    from edgettt.bench import fla_functions

    if (fla := fla_functions()) is None:
        return None
    qf, kf, vf = (x.transpose(1, 2) for x in (q, k, v))
    return lambda: fla[1](qf, kf, vf, normalize=False)


def time_runs(T, runs, tensor, ceiling, graph=False):
    """Time each run of {(name, passes, tensors moved): fn}; rows with ms and fraction of copy."""
    rows = []
    for (name, passes, moved), fn in runs.items():
        with torch.no_grad():
            ms = time_ms(fn, graph=graph)
        r = {"T": T, "name": name, "passes": passes, "ms": ms,
             "fraction_of_copy": tensor * moved / (ms * 1e-3) / ceiling}
        rows.append(r)
        print(json.dumps(r), flush=True)
    return rows


def colsum_rows(ceiling):
    rows = []
    for T in (8192, 32768):
        (q, k, v, lr, S0, gamma, beta, eta), S, tensor = target_inputs(T)
        runs = {(f"colsums={c}", "1" if first else "all", 3 if first else 7): (
            lambda c=c, first=first: prefill._parallel_aligned(q, k, v, lr, S0, gamma, beta, eta, S, colsums=c,
                                                               first_pass_only=first))
            for c in ("pass1", "dot", "sum") for first in (True, False)}
        if (fla := fla_run(q, k, v)) is not None:
            runs[("fla chunk_linear_attn", "all", 4)] = fla
        rows += time_runs(T, runs, tensor, ceiling)
    return rows


TILE_VARIANTS = [dict(even_tiles=False), dict(), dict(store_values=False)]


def tile_rows(ceiling):
    """Unmasked tiles (even_tiles, the default where no tile needs a mask) against masked ones,
    values stored or recomputed, and the operator. Each timed eagerly (do_bench:
    the Python before the first launch counts, as for any caller) and as a CUDA graph's replays
    (device time alone)."""
    rows = []
    for T in (8192, 32768):
        (q, k, v, lr, S0, gamma, beta, eta), S, tensor = target_inputs(T)
        runs = {}
        for options in TILE_VARIANTS:
            store = options.get("store_values", True)
            name = " ".join(f"{k}={v}" for k, v in options.items()) or "default"
            for first in (True, False):
                moved = (3 if store else 2) if first else (7 if store else 6)
                runs[(name, "1" if first else "all", moved)] = (
                    lambda o=options, f=first: prefill._parallel_aligned(q, k, v, lr, S0, gamma, beta, eta, S,
                                                                         first_pass_only=f, **o))
        args = (q, k, v, lr, S0, gamma, beta, eta)
        runs[("prefill.parallel (the operator)", "all", 7)] = lambda: prefill.parallel(*args)
        # 40 tokens fewer: a ragged last tile and an unfinished mini-batch (the masked kernels)
        ragged = tuple(x[..., :T - 40, :] for x in (q, k, v)) + (lr[..., :T - 40], S0, gamma, beta, eta)
        runs[("T-40", "all", 7 * (T - 40) / T)] = lambda: prefill._parallel_aligned(*ragged, S)
        if (fla := fla_run(q, k, v)) is not None:
            runs[("fla chunk_linear_attn", "all", 4)] = fla
        rows += time_runs(T, runs, tensor, ceiling)
        graphed = {(name + " (cuda graph)", passes, moved): fn for (name, passes, moved), fn in runs.items()
                   if passes == "all"}
        rows += time_runs(T, graphed, tensor, ceiling, graph=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-len", type=int, default=32768)
    ap.add_argument("--configs", action="store_true", help="time every launch configuration instead")
    ap.add_argument("--colsums", action="store_true", help="time the column-sums variants instead")
    ap.add_argument("--tiles", action="store_true", help="time the per-tile options (masks, values) instead")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    warm_up()
    ceiling = copy_bandwidth()
    if args.colsums or args.tiles:
        rows = colsum_rows(ceiling) if args.colsums else tile_rows(ceiling)
    else:
        rows = config_rows(ceiling) if args.configs else parallel_rows(args.seq_len, ceiling)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "copy_bandwidth_GBps": ceiling / 1e9, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
