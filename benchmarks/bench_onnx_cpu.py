"""Benchmark: onnxruntime CPU speed of exported variants of one model, interleaved.

    python benchmarks/bench_onnx_cpu.py --json benchmarks/results/onnx_cpu.json

Exports the float model and its int8 / int4 (GPTQ, group 64) / nf4 variants once, then times
them in alternation, round after round (decode: 256 single-token steps after a 256-token prompt;
prefill: the 256-token prompt; batch 1), so that drifts of a shared machine fall on every
variant alike. Ratios are taken per round against the float export measured in the same round;
the table gives the medians. The runner is `edgettt.runner.Runner`, as `edgettt run` uses it.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

import edgettt
from edgettt.data import read_text
from edgettt.onnx import write_export
from edgettt.onnx_files import graph_bytes
from edgettt.onnx.speed import time_round
from edgettt.calibration import calibrate
from edgettt.quant import QuantConfig, quantize_model
from edgettt.runner import Runner

VARIANTS = {"float": None, "int8": QuantConfig("int8"), "int4-gptq-g64": QuantConfig("int4", 64, "gptq"),
            "nf4-b64": QuantConfig("nf4", 64)}


def export_variants(name: str, root: Path) -> dict[str, Path]:
    base = edgettt.load(name)
    cal = calibrate(base, read_text("python-docs:train"), ctx=512, samples=2)
    out = {}
    for variant, config in VARIANTS.items():
        model = edgettt.load(name)
        if config is not None:
            quantize_model(model, config, cal)  # weights, state format and the recorded config
        out[variant] = root / variant
        out[variant].mkdir()
        write_export(model, out[variant], name)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="ttt-linear-tiny-parallel")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads [default: its own]")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dirs = export_variants(args.model, Path(tmp))
        sizes = {v: graph_bytes(d / "decode.onnx") / 1e6 for v, d in dirs.items()}
        runners = {v: Runner(d, args.threads) for v, d in dirs.items()}
        ids = np.random.default_rng(0).integers(0, 256, (1, args.prompt + args.steps))
        for runner in runners.values():  # warm-up
            time_round(runner, ids[:, :args.prompt + 16], args.prompt)
        rounds = [{v: time_round(r, ids, args.prompt) for v, r in runners.items()} for _ in range(args.rounds)]
    rows = []
    for v in VARIANTS:
        rows.append({
            "variant": v, "decode_onnx_mb": sizes[v], "size_vs_float": sizes[v] / sizes["float"],
            "prefill_tokens_per_s": statistics.median(r[v][0] for r in rounds),
            "decode_tokens_per_s": statistics.median(r[v][1] for r in rounds),
            "prefill_vs_float": statistics.median(r[v][0] / r["float"][0] for r in rounds),
            "decode_vs_float": statistics.median(r[v][1] / r["float"][1] for r in rounds),
            "decode_vs_float_min_max": [min(r[v][1] / r["float"][1] for r in rounds),
                                        max(r[v][1] / r["float"][1] for r in rounds)],
        })
    meta = {"model": args.model, "cpu": platform.processor() or platform.machine(), "threads": args.threads,
            "onnxruntime": ort.__version__, "torch": torch.__version__, "python": platform.python_version(),
            "rounds": args.rounds, "prompt": args.prompt, "steps": args.steps,
            "command": "python benchmarks/bench_onnx_cpu.py --json benchmarks/results/onnx_cpu.json"}
    print(json.dumps(meta))
    print(f"{'variant':>14} {'MB':>6} {'x size':>7} {'prefill/s':>10} {'decode/s':>9} {'x prefill':>10} {'x decode':>9}")
    for r in rows:
        print(f"{r['variant']:>14} {r['decode_onnx_mb']:>6.2f} {r['size_vs_float']:>7.2f} {r['prefill_tokens_per_s']:>10.0f} "
              f"{r['decode_tokens_per_s']:>9.0f} {r['prefill_vs_float']:>10.2f} {r['decode_vs_float']:>9.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
