"""Decode tokens/s of a preset-sized TTT-Linear (original, and its parallel form) and the same-size Llama on
a CUDA GPU, each step replayed as a CUDA graph (`benchmark.cuda.capture_steps`), with the step as written (eager
kernels: edgettt's Triton decode kernel among a dozen torch operations a layer) and under torch.compile
(inductor fuses the step's operations; edgettt's kernels off inside it, so that the whole step is
inductor's). Issue 21 asks whether a converted layer's decode is bound by its number of kernels.

    python benchmarks/compiled_decode.py --preset 125m --depth 8192 --tokens 128 --repeats 3 --json out.json

Random weights in bfloat16, batch 1 (--batch), one prefill of --depth tokens (not timed), then --tokens
replays, timed with CUDA events; the median of --repeats, the variants in turns (all are built, prefilled,
compiled and captured first; each holds its own model on the GPU). Bytes a token: the weights (the embedding's row aside), plus the decode state
(TTT) or the KV cache up to the depth (Llama), against the copy bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time

import torch


def build(kind: str, preset: str, fuse: bool = True, weights: str = "none"):
    from edgettt.families.ttt.config import PRESET_VOCAB, PRESETS, ModelConfig
    from edgettt.conversion import convert
    from edgettt.benchmark.llama import Llama
    from edgettt.families.ttt.random_init import random_model
    from edgettt.benchmark import LLAMA_PREFIX, llama_config

    if kind == "llama":
        with torch.device("cuda"):
            return Llama(llama_config(LLAMA_PREFIX + preset)).to(torch.bfloat16).eval()
    model = random_model(ModelConfig(**PRESETS[preset], vocab_size=PRESET_VOCAB, ttt_layer_type="linear"))
    form, _, state = kind.partition("-")  # "parallel-int8": the parallel form with the int8 state
    if form == "decayed":  # the decayed parallel form (`convert --decay`), every head's gamma 0.97
        model = convert(model, "parallel", decay=0.97)
    elif form != "ttt":
        model = convert(model, form)
    if state:
        from edgettt.quant import apply_state_format

        apply_state_format(model, state)
    if weights != "none":  # their kernels run inside the compiled graph (`weight_formats.int4_linear`)
        from edgettt.quant import QuantConfig, quantize_

        quantize_(model, QuantConfig(weights, 64))
    if fuse:  # q/k/v and gate/up one GEMM each, as the Llama's (and as `edgettt bench --device cuda` runs)
        from edgettt.families.base import fuse_input_projections
        from edgettt.quant import stacked_projection

        fuse_input_projections(model, stacked_projection)
    return model.to("cuda", torch.bfloat16).eval()


def weights_of(kind: str, args) -> str:
    """A kind's weights: its own ("parallel:int4"), else --weights."""
    return kind.partition(":")[2] or args.weights


class Variant:
    """One model and step kind, ready to time: built, prefilled to the depth (not timed), its step compiled
    if asked and captured as CUDA graphs. Variants are all prepared first, then timed in turns."""

    def __init__(self, kind: str, step: str, args):
        from edgettt.benchmark import capture_steps
        from edgettt.fast_paths import compile_step, use_compiled_decode, use_kernels

        self.kind, self.step, self.args, self.llama = kind, step, args, kind == "llama"
        torch.manual_seed(0)
        model = build(kind.partition(":")[0], args.preset, not args.separate_projections,
                      "none" if self.llama else weights_of(kind, args))
        compiled = step != "eager"
        use_kernels(model)
        if compiled:  # the tokens written for torch.compile; "-token": each converted layer's in one kernel
            use_compiled_decode(model, token_kernel="-token" in step)
        if "-rows" in step:  # batch-1 weight products as products and sums inductor fuses
            from edgettt.fast_paths.row_products import use_row_products

            use_row_products(model)
        if "-fused" in step:  # int4 products with their norm, activation and residual, one GEMV launch each
            from edgettt.fast_paths.fused_products import use_fused_products

            use_fused_products(model)
        if "-a8" in step:  # int8 activations, int4 layers' decode GEMVs in W4A8 too (dp4a; `weight_formats.int4_a8`)
            from edgettt.quant import set_activations

            set_activations(model, "int8", decode=True)
        self.ids = torch.randint(0, model.config.vocab_size, (args.batch, args.depth + args.tokens), device="cuda")
        from lab.launch import fixed_token_warps

        warps = fixed_token_warps(8) if "-warps8" in step else contextlib.nullcontext()  # 8 warps at every head size, as before the choice by head size
        with torch.no_grad(), warps:
            state = model.init_state(args.batch, args.depth + args.tokens) if self.llama else None
            _, state = model.prefill(self.ids[:, :args.depth], state)
            if compiled:
                compile_step(model)
            self.token, self.graphs = capture_steps(model, state, args.depth, args.batch)
        self.model, self.state, self.times = model, state, []

    def replay(self) -> None:
        """The tokens from the depth, one graph replay each (each round decodes the same positions: the
        transformer's cache is reset to the depth, the TTT graphs depend on the position mod b only)."""
        if self.llama:
            self.state.pos.fill_(self.args.depth)
        for t in range(self.args.tokens):
            self.token.copy_(self.ids[:, self.args.depth + t])
            self.graphs[(self.args.depth + t) % len(self.graphs)].replay()

    def time_once(self) -> None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self.replay()
        end.record()
        torch.cuda.synchronize()
        self.times.append(start.elapsed_time(end) / 1e3)

    def facts(self) -> dict:
        from edgettt.benchmark import state_bytes, weight_bytes

        facts = {"weights_bytes": weight_bytes(self.model), "state_bytes": state_bytes(self.state), "graphs": len(self.graphs)}
        if self.args.profile:
            facts["kernels"] = kernel_table(self)
        return facts


def kernel_table(variant: Variant, top: int = 30) -> dict:
    """Where a token's time goes: the GPU kernels of one round of the variant's replays (`profile_kernels`)."""
    return profile_kernels(variant.replay, variant.args.tokens, top)


def profile_kernels(run, per: int, top: int = 30) -> dict:
    """The GPU kernels of one `run()` under torch.profiler, as kernels and microseconds a unit (`per` units:
    a round's tokens, a prefill's 1), the largest `top` by time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)
        if us > 0:
            rows.append({"kernel": e.key[:120], "per_token": e.count / per, "us_per_token": us / per})
    rows.sort(key=lambda r: -r["us_per_token"])
    return {"kernels_per_token": sum(r["per_token"] for r in rows), "us_per_token": sum(r["us_per_token"] for r in rows),
            "top": rows[:top]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="125m")
    parser.add_argument("--depth", type=int, default=8192)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kinds", default="llama,parallel,ttt", help="among llama, ttt, exact, parallel, decayed; "
                        "FORM-STATE for a state format, e.g. parallel-int8; KIND:WEIGHTS for a kind's own weights "
                        "(none, int8, int4), e.g. parallel,parallel:int4 to time float and int4 weights in turns")
    parser.add_argument("--steps", default="eager,compile", help="among eager, compile, compile-rows (compiled, a "
                        "batch-1 step's weight products as products and sums: `row_products`), compile-token (each "
                        "converted layer's token in one kernel: `ops.linear_attention.decode_token`; with the int8 state, e.g. kind "
                        "parallel-int8, `decode_token_int12`), compile-rows-token; -fused after any compiled step: int4 products "
                        "with their norm, activation and residual add in one GEMV launch (`fused_products`); -a8 after any step: int8 "
                        "activations, int4 decode GEMVs in W4A8 (`quant.set_activations(..., decode=True)`); -warps8 after a -token "
                        "step: the token kernels with 8 warps each (not `decode_token.token_warps`); for every kind")
    parser.add_argument("--variants", default="", help="KIND/STEP pairs instead of every kind with every step, "
                        "e.g. parallel/compile-token,parallel:int4/compile-token-fused")
    parser.add_argument("--inductor", default="", help="inductor settings for the compiled steps, "
                        "e.g. pattern_matcher=False,shape_padding=False (torch._inductor.config)")
    parser.add_argument("--weights", default="none", choices=["none", "int8", "int4"],
                        help="the TTT models' weights (int4: groups of 64), quantized by round to nearest")
    parser.add_argument("--separate-projections", action="store_true", help="TTT models: q, k, v (and the MLP's "
                        "gate, up) as separate GEMMs, as before 2026-12-03 (by default fused, as the Llama's)")
    parser.add_argument("--profile", action="store_true", help="also the kernels of a token (torch.profiler over the "
                        "replays): how many, and the time of each, in the JSON")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    pairs = [v.split("/") for v in args.variants.split(",")] if args.variants else \
        [(kind, step) for kind in args.kinds.split(",") for step in args.steps.split(",")]
    if any(len(pair) != 2 for pair in pairs):
        parser.error(f"--variants {args.variants}: each pair is KIND/STEP, e.g. parallel:int4/compile-token-fused")
    if not torch.cuda.is_available():
        print("compiled_decode.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    for setting in filter(None, args.inductor.split(",")):
        key, value = setting.split("=")
        setattr(torch._inductor.config, key, {"True": True, "False": False}.get(value, value))
    from lab.kernel_bench import copy_bandwidth

    ceiling = copy_bandwidth()
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "args": vars(args),
            "copy_bandwidth_GBps": ceiling / 1e9}
    rows, variants = [], []
    for kind, step in pairs:
        if kind == "llama" and "-token" in step:  # no converted layers: the same step as without the token
            continue
        if "-fused" in step and weights_of(kind, args) != "int4":  # no int4 layers
            continue
        started = time.perf_counter()
        try:
            variants.append(Variant(kind, step, args))
            print(f"{kind} {step}: prepared in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        except Exception as exc:  # one variant's failure is a row, not the end of the run
            rows.append({"model": kind, "step": step, "error": repr(exc)[:300]})
            print(f"{kind} {step}: failed: {exc!r}"[:400], flush=True)
    for _ in range(args.repeats):  # the variants in turns, repeat after repeat
        for variant in variants:
            variant.time_once()
    for variant in variants:
        seconds = statistics.median(variant.times)
        facts = variant.facts()
        moved = facts["weights_bytes"] + facts["state_bytes"]
        rows.append({"model": variant.kind, "step": variant.step, **facts,
                     "tokens_per_s": args.tokens * args.batch / seconds, "ms_per_token": seconds / args.tokens * 1e3,
                     "fraction_of_copy": moved / (seconds / args.tokens) / ceiling, "times_s": variant.times})
        r = rows[-1]
        print(f"{r['model']:9s} {r['step']:13s} {r['tokens_per_s']:9.0f} tokens/s  {r['ms_per_token']:.3f} ms/token  "
              f"{r['fraction_of_copy']:.1%} of copy", flush=True)
        if "kernels" in r:
            print(f"          {r['kernels']['kernels_per_token']:.0f} kernels a token, "
                  f"{r['kernels']['us_per_token']:.0f} us of kernel time", flush=True)
        if args.json:  # after every row: a run cut short (by a profile) keeps what it measured
            with open(args.json, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
