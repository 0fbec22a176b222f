"""What int8 activations cost in accuracy: a quantized model's prefill with its int8/int4 GEMMs in integers
(`set_activations(model, "int8")`, the W8A8 / W4A8 way of the CUDA kernels) against the same weights with
float activations, both against the float model, on held-out text (KLD, top-1 agreement, bits per byte).

    python benchmarks/int8_activations_accuracy.py --json benchmarks/results/int8_activations_accuracy.json

Runs on the CPU through the kernels' references (the same arithmetic as the kernels: activations rounded to
int8 a row, integer sums exact; the GPU rounds a few ties the other way, tests/kernels/test_int4.py).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys

import torch

import edgettt
from edgettt.quant import QuantConfig, set_activations


def measure(model, quantized, name: str, weights: str, text: str, ctx: int, max_tokens: int) -> list[dict]:
    """The prefill's drift of `quantized` (`model` quantized to `weights`) against `model`, weight-only and with
    int8 activations."""
    rows = []
    for activations in ("float", "int8"):
        layers = set_activations(quantized, activations)
        e = edgettt.evaluate(quantized, text, ctx=ctx, max_tokens=max_tokens, ref=model)
        d = e.drift
        rows.append({"model": name, "weights": weights, "activations": activations, "layers": layers,
                     "kld_mean": d["kld_mean"], "kld_p99": d["kld_p99"], "top1": d["top1"],
                     "bits_per_byte": e.bits_per_byte})
        r = rows[-1]
        print(f"{name:26s} {weights:5s} {activations:6s} KLD {r['kld_mean']:.2e} p99 {r['kld_p99']:.2e} "
              f"top-1 {r['top1']:.2%} bpb {r['bits_per_byte']:.4f}", flush=True)
    return rows


def step_logits(model, windows: torch.Tensor, prompt: int) -> torch.Tensor:
    """Logits [N, T - 1 - prompt, V] of decode steps: each window's first `prompt` tokens prefilled, then one
    step a token (all windows together: at most 8 rows, the GEMV range of the kernels)."""
    with torch.no_grad():
        _, state = model.prefill(windows[:, :prompt])
        out = []
        for t in range(prompt, windows.shape[1] - 1):
            step, state = model.step(windows[:, t], state)
            out.append(step.float())
    return torch.stack(out, dim=1)


def decode_windows(model, name: str, text: str, ctx: int, windows: int) -> torch.Tensor:
    """The first `windows` windows of `ctx` tokens of `text`."""
    from edgettt.data import read_text, token_windows
    from edgettt.evaluation import encode

    return token_windows(encode(model, read_text(text), name), ctx, ctx * windows)[:windows]


def measure_decode(quantized, ids: torch.Tensor, ref: torch.Tensor, prompt: int, name: str, weights: str) -> list[dict]:
    """The same for decode steps (an int4 layer's W4A8 GEMV: x rounded in blocks of 32; int8 layers stay
    weight-only there): windows `ids` decoded after a prompt, against the float model's steps `ref`."""
    from edgettt.metrics import drift

    rows = []
    for activations in ("float", "int8"):
        set_activations(quantized, activations, decode=True)
        d = drift(ref, step_logits(quantized, ids, prompt), ids[:, prompt + 1:])
        rows.append({"model": name, "weights": weights, "activations": activations, "mode": "decode",
                     "kld_mean": d["kld_mean"], "kld_p99": d["kld_p99"], "top1": d["top1"]})
        r = rows[-1]
        print(f"{name:26s} {weights:5s} {activations:6s} decode KLD {r['kld_mean']:.2e} p99 {r['kld_p99']:.2e} "
              f"top-1 {r['top1']:.2%}", flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="ttt-linear-tiny-parallel,ttt-mlp-tiny-parallel")
    p.add_argument("--weights", default="int8,int4")
    p.add_argument("--text", default="python-docs:test")
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=16384)
    p.add_argument("--decode-windows", type=int, default=8, help="decode: windows of --decode-ctx tokens (0: none)")
    p.add_argument("--decode-ctx", type=int, default=512)
    p.add_argument("--decode-prompt", type=int, default=64, help="decode: tokens prefilled before the steps")
    p.add_argument("--json")
    args = p.parse_args(argv)
    rows = []
    for name in args.models.split(","):
        model = edgettt.load(name)
        if args.decode_windows:  # the float model's steps, once for every weight format
            ids = decode_windows(model, name, args.text, args.decode_ctx, args.decode_windows)
            ref = step_logits(model, ids, args.decode_prompt)
        for weights in args.weights.split(","):
            quantized = edgettt.quantize(model, QuantConfig(weights=weights, group_size=64))
            rows += measure(model, quantized, name, weights, args.text, args.ctx, args.max_tokens)
            if args.decode_windows:
                rows += measure_decode(quantized, ids, ref, args.decode_prompt, name, weights)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "torch": torch.__version__, "python": platform.python_version(),
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
