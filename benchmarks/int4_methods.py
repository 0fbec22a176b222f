"""Ways to make int4 more accurate at its bytes: on one model, uniform int4 g64 by GPTQ as shipped against three
variants of it. Held-out KLD against the float model.

    python benchmarks/int4_methods.py --model ttt-linear-tiny-parallel --json OUT.json --md OUT.md

Variants (the effective weights measured in a float copy; none is a shipped format):
    gptq                 the shipped int4-gptq-g64 (min/max group grid chosen from the error-updated weights)
    gptq-clip            each group's grid searched over 7 clip ratios (1.0 to 0.7) for the least squared error
    gptq-act-order       columns in descending diag(H) order, the group grids fixed from the weights first
    awq-gptq             input channels scaled by diag(H)^(alpha/2) before GPTQ (alpha in 0, .25, .5, .75 a layer,
                         by GPTQ's output error), scaled back after
"""

from __future__ import annotations

import argparse
import copy
import platform

import torch
from lab import results
from torch import nn

import edgettt
from edgettt import metrics
from edgettt.data import read_text, token_windows
from edgettt.evaluation import collect_logits, encode
from edgettt.formats import layouts
from edgettt.quant import QuantConfig
from edgettt.quant import weight_formats as wf
from edgettt.quant.apply import set_module, weight_bits
from edgettt.calibration.gptq import gptq
from edgettt.quant.linear import QuantLinear

UNIFORM = QuantConfig("int4", 64, "gptq", skip=(), overrides={"lm_head": "int8"})


def int4_gptq(w, group, H):
    """The product's int4 GPTQ, dequantized."""
    return layouts.dequantize_int4(layouts.pack_int4(*wf._grouped_codes(w, group, lambda w, round_column: gptq(w, H, round_column), 15)))


def clipped_grid(w, group, top=15, ratios=torch.linspace(1.0, 0.7, 7)):
    N, K = w.shape
    g = w.reshape(N, K // group, group)
    best = None
    for a in ratios:
        lo, hi = g.amin(-1).clamp_max(0) * a, g.amax(-1).clamp_min(0) * a
        scale = ((hi - lo) / top).clamp_min(1e-12)
        zero = torch.round(-lo / scale).clamp(0, top)
        codes = torch.clamp(torch.round(g / scale[..., None]) + zero[..., None], 0, top)
        q = (codes - zero[..., None]) * scale[..., None]
        err = ((q - g) ** 2).sum(-1)
        if best is None:
            best = [err, scale, zero]
        else:
            better = err < best[0]
            best = [torch.where(better, err, best[0]), torch.where(better, scale, best[1]),
                    torch.where(better, zero, best[2])]
    return best[1], best[2]


def gptq_clip(w, group, H):
    original, layouts.group_grid = layouts.group_grid, clipped_grid
    try:
        return int4_gptq(w, group, H)
    finally:
        layouts.group_grid = original


def gptq_act_order(w, group, H):
    N, K = w.shape
    scale, zero = layouts.group_grid(w, group)
    perm = torch.argsort(torch.diag(H), descending=True)
    codes = torch.zeros(N, K)

    def round_column(col, column, ahead):
        c = int(perm[col])
        g = c // group
        codes[:, c] = torch.clamp(torch.round(column / scale[:, g]) + zero[:, g], 0, 15)
        return (codes[:, c] - zero[:, g]) * scale[:, g]

    gptq(w[:, perm], H[perm][:, perm], round_column)
    return layouts.dequantize_int4(layouts.pack_int4(codes, scale, zero))


def awq_gptq(w, group, H):
    act = torch.diag(H).clamp_min(1e-12).sqrt()
    best = None
    for alpha in (0.0, 0.25, 0.5, 0.75):
        s = act ** alpha
        s = s / s.mean()
        q = int4_gptq(w * s, group, H / s[:, None] / s[None, :]) / s
        e = torch.einsum("nk,kl,nl->", q - w, H, q - w).item()  # GPTQ's output error
        if best is None or e < best[0]:
            best = (e, q)
    return best[1]


def with_weights(model, uniform, cal, method):
    """The uniform model with its int4 layers' weights replaced by `method`'s effective weights."""
    out = copy.deepcopy(uniform)
    for name, module in list(out.named_modules()):
        if isinstance(module, QuantLinear) and module.format.name == "int4":
            w = model.get_submodule(name).weight.detach().float()
            layer = nn.Linear(w.shape[1], w.shape[0], bias=False)
            layer.weight.data = method(w, 64, cal.hessians[name])
            set_module(out, name, layer)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="ttt-linear-tiny-parallel")
    p.add_argument("--ctx", type=int, default=2048)
    p.add_argument("--json")
    p.add_argument("--md")
    args = p.parse_args()
    torch.manual_seed(0)
    model = edgettt.load(args.model)
    cal = edgettt.calibrate(model, "python-docs:train", ctx=args.ctx, samples=8)
    windows = token_windows(encode(model, read_text("python-docs")), args.ctx, 100_000)
    ref = collect_logits(model, windows, desc="float")
    uniform = edgettt.quantize(model, UNIFORM, cal)
    size = weight_bits(uniform)["size_mb"]

    def kld(m):
        return metrics.kld(ref, collect_logits(m, windows, desc="eval")).mean().item()

    rows = [{"variant": "gptq", "kld": kld(uniform), "note": f"{size:.3f} MB"}]
    for name, method in (("gptq-clip", gptq_clip), ("gptq-act-order", gptq_act_order), ("awq-gptq", awq_gptq)):
        rows.append({"variant": name, "kld": kld(with_weights(model, uniform, cal, method)), "note": "same bytes"})
    for r in rows:
        r["of_gptq"] = r["kld"] / rows[0]["kld"]
    result = {"model": args.model, "ctx": args.ctx, "torch": torch.__version__, "python": platform.python_version(),
              "rows": rows}
    md = "\n".join([f"{args.model}, python-docs:test windows of {args.ctx}, KLD against the float model", "",
                    "| variant | KLD mean | of GPTQ | |", "|---|---:|---:|---|"]
                   + [f"| {r['variant']} | {r['kld']:.5f} | {r['of_gptq']:.3f}x | {r['note']} |" for r in rows]) + "\n"
    results.write(result, md, args.json, args.md)
    print(md)


if __name__ == "__main__":
    main()
