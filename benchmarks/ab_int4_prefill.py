"""An eager batch-1 760m prefill (8,192 tokens) with bf16 weights and with int4 weights, the int4 products by
the shipped `int4_matmul` and by an earlier version of it, in turns in one process (11 rounds, the order
reversed every other round; CUDA events; medians): what a change to int4_matmul's host path is worth where the
host bounds the prefill.

    git show 55b7d15:edgettt/kernels/int4.py > edgettt/ops/quantized/int4_before.py   # the version to compare
    python benchmarks/ab_int4_prefill.py --json out.json; rm edgettt/kernels/int4_before.py

Random weights (`prefill_gpu.make`); the earlier module is loaded beside the shipped one and its int4_matmul
swapped in for the "before" rounds (the int4 format looks int4_matmul up at each call). Results:
benchmarks/results/prefill_gpu_h200.md.
"""

import argparse
import importlib.util
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prefill_gpu import make, prefill_seconds  # noqa: E402

import edgettt.ops.quantized.int4 as shipped  # noqa: E402


def earlier_int4_matmul():
    spec = importlib.util.spec_from_file_location("edgettt.ops.quantized.int4_before", "edgettt/ops/quantized/int4_before.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.int4_matmul


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    ways = {"new": shipped.int4_matmul, "before": earlier_int4_matmul()}
    models = {kind: make(kind, "760m") for kind in ("parallel", "parallel:int4")}
    ids = torch.randint(0, 32000, (1, 8192), device="cuda")
    variants = [("bf16", "parallel", "new"), ("int4 before", "parallel:int4", "before"),
                ("int4 new", "parallel:int4", "new")]
    times = {name: [] for name, _, _ in variants}
    for round_ in range(-1, 11):  # round -1: warm-up (compiles, autotunes), not kept
        for name, kind, way in variants if round_ % 2 == 0 else variants[::-1]:
            shipped.int4_matmul = ways[way]
            ms = prefill_seconds(kind, models[kind], ids) * 1e3
            if round_ >= 0:
                times[name].append(ms)
    shipped.int4_matmul = ways["new"]
    bf16 = statistics.median(times["bf16"])
    for name, ms in times.items():
        print(f"{name:12s} median {statistics.median(ms):6.1f} ms, {bf16 / statistics.median(ms):.3f}x bf16; "
              f"all {[round(t, 1) for t in ms]}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "ms": times}, f, indent=1)


if __name__ == "__main__":
    main()
