"""Prefill tokens/s of a preset-sized TTT-Linear (original, parallel form, parallel form with int8 / int4
weights) and the same-size Llama on a CUDA GPU, all models in memory at once and timed in turns (
the 760m prefill targets and int4 prefill against bf16 weights).

    python benchmarks/prefill_gpu.py --preset 760m --length 8192 --repeats 5 --json out.json

Random weights in bfloat16 (`compiled_decode.build`: q/k/v and gate/up one GEMM each, as the Llama's),
batch 1 (--batch), one prefill of --length tokens from a fresh state, timed with CUDA events after one
warm-up each; every repeat runs each variant once, in turn, and the median is reported. Kinds:
    llama          the transformer (SDPA, static KV cache)
    parallel       the parallel form (edgettt's Triton prefill kernel)
    decayed        the decayed parallel form (`convert --decay 0.97`: the same kernel with the decay's terms)
    parallel:int4  the same with int4 weights (group 64; --activations float: weight-only GEMM kernels)
    parallel:int4:a8  the same with int8 activations (W4A8 on the int8 tensor cores, as
                   `edgettt.prepare` runs it with activations="int8"; also parallel:int8:a8)
    ttt            the original TTT-Linear through edgettt's exact-form kernel
    ttt-plain      the original as ttt-lm-pytorch runs it: plain torch, a mini-batch at a time
    parallel-int8  the parallel form with the int8 state (its commits rounded one mini-batch after another:
                   the chain in one kernel, `ops.linear_attention.commits`; the rest of the prefill in torch)
    parallel-int8-plain  the same with the layers without their kernels (the chain a loop in torch, as before the kernel)
    exact          the exact form (edgettt's exact-form kernel)
    exact-int8     the exact form with the int8 state (the exact kernel rounding every commit,
                   `prefill.exact(two_level=True)`); exact-int8-plain: without the kernels (a mini-batch at a time in torch)
With --graph, each prefill is captured once as a CUDA graph and its replays timed, in turns with the eager
prefill (the host's launches out of the time: an eager 760m prefill launches ~2,200 kernels, and one H200 host took 77 ms for 51 ms of kernels).
With --profile, also each kind's GPU kernels of one more prefill (torch.profiler): count, microseconds,
the largest by time. Also the model FLOP rate (2 x parameters of the linear layers x tokens, attention and the TTT layers'
own state math not counted; `benchmark.cuda.linear_parameters`) as a fraction of the GPU's dense bf16 datasheet rate
(`benchmark.plan.dense_bf16_flops`: 989 TFLOP/s on an H100 or H200 SXM).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compiled_decode import build, profile_kernels  # noqa: E402

from edgettt.benchmark import dense_bf16_flops, linear_parameters  # noqa: E402

KINDS = ("llama", "parallel", "decayed", "parallel:int8", "parallel:int4", "parallel:int8:a8", "parallel:int4:a8", "ttt", "ttt-plain", "parallel-int8",
         "parallel-int8-plain", "exact", "exact-int8", "exact-int8-plain")


def make(kind: str, preset: str):
    form, _, weights = kind.partition(":")
    weights, _, activations = weights.partition(":")
    model = build(form.removesuffix("-plain"), preset, True, weights or "none")
    if not form.endswith("-plain"):  # the layers' kernels (`-plain`: the model as written, plain torch)
        from edgettt.fast_paths import use_kernels

        use_kernels(model)
    if activations == "a8":
        from edgettt.quant import set_activations

        set_activations(model, "int8")
    return model


def prefill_seconds(kind: str, model, ids, graph=None) -> float:
    """One prefill of `ids` timed with CUDA events: eager, or the replay of its captured `graph`."""
    with torch.no_grad():
        state = model.init_state(ids.shape[0], ids.shape[1]) if kind == "llama" and graph is None else None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay() if graph is not None else model.prefill(ids, state)
        end.record()
        torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3


def capture(kind: str, model, ids):
    """The prefill of `ids` as a CUDA graph (`benchmark.cuda.capture_prefill`, after the warm-up's eager prefill: kernels
    autotune first), so that a replay launches every kernel from the graph, without the host's Python; None,
    with a line on stderr, where the prefill cannot be captured (it then runs eagerly)."""
    from edgettt.benchmark import capture_prefill

    try:
        return capture_prefill(model, ids)
    except Exception as exc:  # (a host sync inside the prefill, say)
        print(f"{kind}: not captured ({type(exc).__name__}: {str(exc)[:200]}); timed eagerly", file=sys.stderr)
        torch.cuda.synchronize()
        return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="760m")
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--kinds", default="llama,parallel,parallel:int4,ttt,ttt-plain")
    parser.add_argument("--json", default=None)
    parser.add_argument("--graph", action="store_true", help="time each prefill as the replay of a CUDA graph "
                        "captured once (the host's launches out of the time, as in decode)")
    parser.add_argument("--profile", action="store_true", help="also each kind's kernels of one prefill (torch.profiler)")
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
    graphs = {kind: capture(kind, models[kind], ids) if args.graph else None for kind in kinds}
    eager = {kind: [] for kind in kinds}  # with --graph, the eager prefill too, in turns with the replays
    for _ in range(args.repeats):
        for kind in kinds:
            times[kind].append(prefill_seconds(kind, models[kind], ids, graphs[kind]))
            if graphs[kind] is not None:
                eager[kind].append(prefill_seconds(kind, models[kind], ids))
    tokens = args.batch * args.length
    rows, peak = [], dense_bf16_flops(torch.cuda.get_device_name()) or float("nan")
    for kind in kinds:
        median = statistics.median(times[kind])
        flops = 2 * linear_parameters(models[kind]) * tokens  # (every token's logits: the head counted)
        rows.append({"kind": kind, "graph": graphs[kind] is not None, "tokens_per_s": tokens / median,
                     "seconds": median, "times_s": times[kind],
                     **({"eager_tokens_per_s": tokens / statistics.median(eager[kind]), "eager_times_s": eager[kind]}
                        if eager[kind] else {}),
                     "fraction_of_dense_bf16": flops / median / peak})
    if args.profile:
        for row in rows:
            kind = row["kind"]
            row["kernels"] = profile_kernels(lambda: prefill_seconds(kind, models[kind], ids, graphs[kind]), 1, top=15)
            top = ", ".join(f"{k['kernel'][:40]} {k['per_token']:.0f}x {k['us_per_token'] / 1e3:.2f} ms"
                            for k in row["kernels"]["top"][:6])
            print(f"{row['kind']}: {row['kernels']['kernels_per_token']:.0f} kernels, "
                  f"{row['kernels']['us_per_token'] / 1e3:.1f} ms; {top}", flush=True)
    base = {r["kind"]: r["tokens_per_s"] for r in rows}
    for row in rows:
        for ref in ("llama", "ttt", "ttt-plain", "parallel", "parallel-int8-plain", "exact", "exact-int8-plain"):
            if ref in base and ref != row["kind"]:
                row[f"x_{ref}"] = row["tokens_per_s"] / base[ref]
        print(f"{row['kind']:<19} {row['tokens_per_s']:>10,.0f} tokens/s  "
              + "  ".join(f"{k[2:]} {v:.2f}x" for k, v in row.items() if k.startswith("x_"))
              + f"  {row['fraction_of_dense_bf16']:.1%} of dense bf16"
              + (f"  (eager {row['eager_tokens_per_s']:,.0f})" if "eager_tokens_per_s" in row else ""), flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "preset": args.preset, "graph": args.graph,
            "length": args.length, "batch": args.batch, "repeats": args.repeats, "command": " ".join(sys.argv)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
