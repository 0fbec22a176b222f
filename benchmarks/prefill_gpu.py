"""Prefill tokens/s of a preset-sized TTT-Linear (original, parallel form, parallel form with int8 / int4
weights) and the same-size Llama on a CUDA GPU, all models in memory at once and timed in turns (issue 21:
the 760m prefill targets and int4 prefill against bf16 weights).

    python benchmarks/prefill_gpu.py --preset 760m --length 8192 --repeats 5 --json out.json

Random weights in bfloat16 (`compiled_decode.build`: q/k/v and gate/up one GEMM each, as the Llama's),
batch 1 (--batch), one prefill of --length tokens from a fresh state, timed with CUDA events after one
warm-up each; every repeat runs each variant once, in turn, and the median is reported. Kinds:
    llama          the transformer (SDPA, static KV cache)
    parallel       the parallel form (edgettt's Triton prefill kernel)
    parallel:int4  the same with int4 weights (group 64; --activations float: weight-only GEMM kernels)
    ttt            the original TTT-Linear through edgettt's exact-form kernel
    ttt-plain      the original as ttt-lm-pytorch runs it: plain torch, a mini-batch at a time
    parallel-int8  the parallel form with the int8 state (its commits rounded one mini-batch after another:
                   the chain in one kernel, `kernels.commits`; the rest of the prefill in torch)
    parallel-int8-plain  the same with edgettt's kernels off (the chain a loop in torch, as before the kernel)
    exact          the exact form (edgettt's exact-form kernel)
    exact-int8     the exact form with the int8 state (the exact kernel rounding every commit,
                   `prefill.exact(two_level=True)`); exact-int8-plain: kernels off (a mini-batch at a time in torch)
Also the model FLOP rate (2 x parameters of the linear layers x tokens, attention and the TTT layers'
own state math not counted; `speed.linear_parameters`) as a fraction of the GPU's dense bf16 datasheet rate
(`speed.dense_bf16_flops`: 989 TFLOP/s on an H100 or H200 SXM; runs before 2026-12-03 took 990).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compiled_decode import build  # noqa: E402

from edgettt.speed import dense_bf16_flops, linear_parameters  # noqa: E402

KINDS = ("llama", "parallel", "parallel:int8", "parallel:int4", "ttt", "ttt-plain", "parallel-int8",
         "parallel-int8-plain", "exact", "exact-int8", "exact-int8-plain")


def make(kind: str, preset: str):
    form, _, weights = kind.partition(":")
    return build(form.removesuffix("-plain"), preset, True, weights or "none")


def prefill_seconds(kind: str, model, ids) -> float:
    from edgettt.kernels import kernels_off

    plain = kind.endswith("-plain")
    with torch.no_grad(), (kernels_off() if plain else contextlib.nullcontext()):
        state = model.init_state(ids.shape[0], ids.shape[1]) if kind == "llama" else None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        model.prefill(ids, state)
        end.record()
        torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="760m")
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--kinds", default="llama,parallel,parallel:int4,ttt,ttt-plain")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    kinds = args.kinds.split(",")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not torch.cuda.is_available():
        print(f"prefill_gpu.py: {'unknown kinds ' + ', '.join(unknown) + ' (choose among ' + ', '.join(KINDS) + ')' if unknown else 'needs a CUDA GPU'}",
              file=sys.stderr)
        return 2
    torch.manual_seed(0)
    models = {kind: make(kind, args.preset) for kind in kinds}
    vocab = next(iter(models.values())).config.vocab_size
    ids = torch.randint(0, vocab, (args.batch, args.length), device="cuda")
    times = {kind: [] for kind in kinds}
    for kind in kinds:  # warm-up (kernels autotune)
        prefill_seconds(kind, models[kind], ids)
    for _ in range(args.repeats):
        for kind in kinds:
            times[kind].append(prefill_seconds(kind, models[kind], ids))
    tokens = args.batch * args.length
    rows, peak = [], dense_bf16_flops(torch.cuda.get_device_name()) or float("nan")
    for kind in kinds:
        median = statistics.median(times[kind])
        flops = 2 * linear_parameters(models[kind]) * tokens  # (every token's logits: the head counted)
        rows.append({"kind": kind, "tokens_per_s": tokens / median, "seconds": median, "times_s": times[kind],
                     "fraction_of_dense_bf16": flops / median / peak})
    base = {r["kind"]: r["tokens_per_s"] for r in rows}
    for row in rows:
        for ref in ("llama", "ttt", "ttt-plain", "parallel", "parallel-int8-plain", "exact", "exact-int8-plain"):
            if ref in base and ref != row["kind"]:
                row[f"x_{ref}"] = row["tokens_per_s"] / base[ref]
        print(f"{row['kind']:<19} {row['tokens_per_s']:>10,.0f} tokens/s  "
              + "  ".join(f"{k[2:]} {v:.2f}x" for k, v in row.items() if k.startswith("x_"))
              + f"  {row['fraction_of_dense_bf16']:.1%} of dense bf16", flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "preset": args.preset,
            "length": args.length, "batch": args.batch, "repeats": args.repeats, "command": " ".join(sys.argv)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
