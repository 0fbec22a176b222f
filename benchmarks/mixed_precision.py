"""Mixed precision by budget against uniform int4 GPTQ g64 (issue 60, item 1): for each model, the mix that
`edgettt quantize --target size=MB` chooses at several multiples of the uniform model's bytes, measured on
held-out text against the float model, with the search's own time and its prediction.

    python benchmarks/mixed_precision.py --models ttt-linear-tiny-parallel ttt-mlp-tiny-parallel \
        --factors 1.0 1.1 1.2 1.3 --json OUT.json --md OUT.md

The uniform baseline is what `edgettt quantize --weights int4-gptq-g64` writes (lm_head in int8 beside 4-bit
weights). Calibration: python-docs:train, 8 windows of --ctx; evaluation: python-docs (its test part), windows
of --ctx; the search measures on 2048 tokens of the calibration text.
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import time

import torch
from lab import results

import edgettt
from edgettt import metrics
from edgettt.data import read_text, token_windows
from edgettt.evaluation import collect_logits, encode
from edgettt.calibration import Budget, search_mix
from edgettt.quant import QuantConfig
from edgettt.quant.apply import weight_bits

UNIFORM = QuantConfig("int4", 64, "gptq", skip=(), overrides={"lm_head": "int8"})


def kld_of(model, windows, ref) -> float:
    return metrics.kld(ref, collect_logits(model, windows, desc="eval")).mean().item()


def measure(name: str, factors: list[float], ctx: int) -> list[dict]:
    model = edgettt.load(name)
    cal = edgettt.calibrate(model, "python-docs:train", ctx=ctx, samples=8)
    windows = token_windows(encode(model, read_text("python-docs")), ctx, 100_000)
    ref = collect_logits(model, windows, desc="float")
    uniform = edgettt.quantize(model, UNIFORM, cal)
    base = {"size_mb": weight_bits(uniform)["size_mb"], "kld": kld_of(uniform, windows, ref)}
    rows = [{"model": name, "variant": "uniform int4-gptq-g64", "factor": 1.0, **base, "kld_ratio": 1.0}]
    calib_text = read_text("python-docs:train")
    for factor in factors:
        t0 = time.perf_counter()
        plan = search_mix(model, cal, calib_text, Budget("size", round(factor * base["size_mb"], 6)))
        seconds = time.perf_counter() - t0
        mixed = edgettt.quantize(model, plan.config(), cal)
        size, kld = weight_bits(mixed)["size_mb"], kld_of(mixed, windows, ref)
        rows.append({"model": name, "variant": f"mix size={factor:g}x", "factor": factor, "size_mb": size,
                     "kld": kld, "kld_ratio": kld / base["kld"], "size_ratio": size / base["size_mb"],
                     "predicted_kld": plan.predicted_kld, "search_kld": plan.measured_kld,
                     "search_seconds": seconds, "layers": dict(collections.Counter(plan.choices.values()))})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def markdown(result: dict) -> str:
    m = result["meta"]
    lines = [f"Mixed precision against uniform int4-gptq-g64 (lm_head int8), {m['windows']}; {m['machine']}, "
             f"torch {m['torch']}", "",
             "| model | variant | MB | of uniform | KLD mean | of uniform | predicted (calib) | search s | layers |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in result["rows"]:
        layers = ", ".join(f"{n} {v}" for v, n in sorted(r.get("layers", {}).items()))
        lines.append(f"| {r['model']} | {r['variant']} | {r['size_mb']:.3f} | {r['size_mb'] / result['base'][r['model']]:.3f}x"
                     f" | {r['kld']:.5f} | {r['kld_ratio']:.2f}x | {r.get('predicted_kld', float('nan')):.5f} | "
                     f"{r.get('search_seconds', float('nan')):.0f} | {layers} |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["ttt-linear-tiny-parallel", "ttt-mlp-tiny-parallel"])
    p.add_argument("--factors", nargs="+", type=float, default=[1.0, 1.1, 1.2, 1.3])
    p.add_argument("--ctx", type=int, default=2048)
    p.add_argument("--json")
    p.add_argument("--md")
    args = p.parse_args()
    torch.manual_seed(0)
    rows = [r for name in args.models for r in measure(name, args.factors, args.ctx)]
    result = {"meta": {"windows": f"python-docs:test windows of {args.ctx}", "torch": torch.__version__,
                       "machine": platform.processor() or platform.machine(), "python": platform.python_version()},
              "base": {r["model"]: r["size_mb"] for r in rows if r["factor"] == 1.0 and "uniform" in r["variant"]},
              "rows": rows}
    results.write(result, markdown(result), args.json, args.md)
    print(markdown(result))


if __name__ == "__main__":
    main()
