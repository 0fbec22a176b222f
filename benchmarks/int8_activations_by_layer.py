"""Which layers can take int8 activations quantized per tensor (ONNX Runtime's DynamicQuantizeMatMul:
one uint8 scale and zero point for the whole input) in a prefill: the KLD it costs, per group of
layers, emulated in torch on a quantized model.

    python benchmarks/int8_activations_by_layer.py MODEL [MODEL ...] --markdown benchmarks/results/prefill_int8_cpu.md

For each group (q/k/v, o, gate/up, down, lm_head) alone and for the unions the export could choose,
the quantized layers of that group compute with x rounded to one uint8 grid per tensor (as
DynamicQuantizeLinear) and the weight rounded again to int8 with one scale per row (as the export's
`matmul_int8_rows`); the KLD of the next-token distributions is taken against the same model without
that rounding, on `--windows` windows of `--tokens` tokens of python-docs-sample, all windows in one
tensor (as a batched prefill quantizes them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import edgettt  # noqa: E402
from edgettt.data import read_text  # noqa: E402
from edgettt.evaluation import encode  # noqa: E402
from edgettt.formats import layouts  # noqa: E402
from edgettt.quant.linear import QuantLinear  # noqa: E402

GROUPS = {"q/k/v": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",), "gate/up": ("gate_proj", "up_proj"),
          "down": ("down_proj",), "lm_head": ("lm_head",)}
CHOICES = [*[(g,) for g in GROUPS], ("q/k/v", "gate/up"), ("q/k/v", "o", "gate/up", "down"), tuple(GROUPS)]


def per_tensor_uint8(x: torch.Tensor) -> torch.Tensor:
    """x rounded as DynamicQuantizeLinear rounds it: one asymmetric uint8 grid spanning [min(0, x), max(0, x)]."""
    lo, hi = min(0.0, x.min().item()), max(0.0, x.max().item())
    step = (hi - lo) / 255 or 1.0
    zero = round(-lo / step)
    return (torch.clamp(torch.round(x / step) + zero, 0, 255) - zero) * step


def kld(model, ids, reference, names: tuple[str, ...]) -> float:
    original = QuantLinear.forward

    def rounded(layer, x):
        if layer.name.split(".")[-1] in names:
            w = layouts.dequantize_int8(layouts.quantize_int8(layer.dequantized()))
            return F.linear(per_tensor_uint8(x), w.to(x.dtype))
        return original(layer, x)

    QuantLinear.forward = rounded
    try:
        with torch.no_grad():
            logits, _ = model.prefill(ids)
    finally:
        QuantLinear.forward = original
    p, q = F.log_softmax(reference, -1), F.log_softmax(logits, -1)
    return (p.exp() * (p - q)).sum(-1).mean().item()


def measure(path: str, windows: int, tokens: int) -> dict:
    model = edgettt.load(path).float().eval()
    for name, module in model.named_modules():
        module.name = name
    ids = torch.tensor(encode(model, read_text("python-docs-sample"), "sample")[: windows * tokens]).reshape(windows, tokens)
    with torch.no_grad():
        reference, _ = model.prefill(ids)
    return {" + ".join(choice): kld(model, ids, reference, tuple(n for g in choice for n in GROUPS[g]))
            for choice in CHOICES}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=69)
    ap.add_argument("--markdown", type=Path)
    args = ap.parse_args()
    results = {m: measure(m, args.windows, args.tokens) for m in args.models}
    choices = list(next(iter(results.values())))
    lines = ["| layers with per-tensor int8 activations | " + " | ".join(results) + " |",
             "|---|" + "---:|" * len(results)]
    lines += [f"| {c} | " + " | ".join(f"{results[m][c]:.2e}" for m in results) + " |" for c in choices]
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        command = " ".join(["python", "benchmarks/int8_activations_by_layer.py", *sys.argv[1:]])
        args.markdown.write_text(f"# Per-tensor int8 activations in a prefill: KLD by layer group\n\n`{command}`\n\n"
                                 f"{table}\n\nKLD mean of the next-token distributions against the same model "
                                 f"without the rounding; {args.windows} windows of {args.tokens} tokens of "
                                 "python-docs-sample in one batch.\n")


if __name__ == "__main__":
    main()
