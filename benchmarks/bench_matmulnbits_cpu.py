"""One quantized matmul in ONNX Runtime on this CPU, per weight format and activation precision: the
measurement behind the export's choice of int8 activations per graph
(`WeightFormat.int8_activation_graphs`).

    python benchmarks/bench_matmulnbits_cpu.py --json benchmarks/results/matmulnbits_cpu.json \\
        --markdown benchmarks/results/matmulnbits_cpu.md

Shapes: the 125m preset's linears (768x768 attention, 768x2048 / 2048x768 MLP, 768x32000 lm_head)
and the export's stacked q/k/v (768x2304) and gate/up (768x4096), at M = 1 (a decode step) and
M = 512 (a prefill). Variants: fp32 MatMul (the float export), MatMulNBits 4 bits and 8 bits, block
32, with float activations (accuracy level 0) and int8 activations (level 4), and
DynamicQuantizeMatMul over int8 columns (x quantized per tensor: the export's prefill for the layers
that read a normalized input, `weight_formats.matmul_int8_rows`). Weights random (speed does not
depend on them). Each variant is its own session; the variants of a shape are timed in turns
(`--rounds` rounds of `--calls` calls), the median per call reported, and the ratio to fp32 taken per
round, then the median. At M = 1 a chain of `--layers` distinct weights is timed (so that the weights
stream from memory as in a model, not from cache).

With `--decode-step PRESET`, instead: the weight matmuls of one whole decode step of a preset (per
layer the export's stacked q/k/v, o_proj, stacked gate/up and down_proj, then the lm_head; M = 1),
as one graph per weight format: fp32 MatMul (the float export), MatMulNBits int4 g32 / g64 / g128
with zero points and int8 b32 (as the export writes them, int8 activations: level 4). The graphs
are timed in turns; the ratio to fp32 per round, then the median, min and max. This is the ceiling
of a quantized export's decode speedup on this CPU: the rest of a step (norms, the state) costs
the same in every format, so a whole step's ratio lies below the weight matmuls' ratio.

    python benchmarks/bench_matmulnbits_cpu.py --decode-step 125m --rounds 15 \
        --json benchmarks/results/decode_weights_cpu.json --markdown benchmarks/results/decode_weights_cpu.md
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from edgettt.families.ttt.config import PRESET_VOCAB, PRESETS  # noqa: E402
from edgettt.benchmark import cpu_name  # noqa: E402

SHAPES = [(768, 768), (768, 2048), (2048, 768), (768, 32000), (768, 2304), (768, 4096)]  # + stacked q/k/v, gate/up
VARIANTS = {"fp32": (None, 0), "nbits4-float": (4, 0), "nbits4-int8": (4, 4), "nbits8-float": (8, 0),
            "nbits8-int8": (8, 4), "dqmm-int8": ("rows", 0)}


def graph(M: int, K: int, N: int, bits, level: int, copies: int) -> bytes:
    """`copies` independent matmuls of x [M, K] (distinct weights), summed."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    for c in range(copies):
        if bits is None:
            inits.append(numpy_helper.from_array(rng.standard_normal((K, N)).astype(np.float32), f"w{c}"))
            nodes.append(helper.make_node("MatMul", ["x", f"w{c}"], [f"y{c}"]))
        elif bits == "rows":  # the prefill's int8 rows (as the export derives them at load), x per tensor
            inits.append(numpy_helper.from_array(rng.integers(-127, 128, (K, N), dtype=np.int8), f"w{c}"))
            inits.append(numpy_helper.from_array(rng.random(N).astype(np.float32) / 100, f"s{c}"))
            nodes.append(helper.make_node("DynamicQuantizeMatMul", ["x", f"w{c}", f"s{c}"], [f"y{c}"],
                                          domain="com.microsoft"))
        else:
            blocks = K // 32
            inits.append(numpy_helper.from_array(rng.integers(0, 255, (N, blocks, 32 * bits // 8), dtype=np.uint8), f"b{c}"))
            inits.append(numpy_helper.from_array(rng.random((N, blocks)).astype(np.float32) / 100, f"s{c}"))
            nodes.append(helper.make_node("MatMulNBits", ["x", f"b{c}", f"s{c}"], [f"y{c}"], domain="com.microsoft",
                                          K=K, N=N, bits=bits, block_size=32, accuracy_level=level))
    nodes.append(helper.make_node("Sum", [f"y{c}" for c in range(copies)], ["out"]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                                helper.make_opsetid("com.microsoft", 1)]).SerializeToString()


def measure(M, K, N, rounds, calls, layers) -> dict:
    copies = 1 if M > 1 or N > 4096 else layers
    sessions = {v: ort.InferenceSession(graph(M, K, N, bits, level, copies), providers=["CPUExecutionProvider"])
                for v, (bits, level) in VARIANTS.items()}
    x = np.random.default_rng(1).standard_normal((M, K)).astype(np.float32)
    times = {v: [] for v in VARIANTS}
    for s in sessions.values():
        s.run(None, {"x": x})
    for _ in range(rounds):
        for v, s in sessions.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                s.run(None, {"x": x})
            times[v].append((time.perf_counter() - t0) / calls / copies * 1e6)
    return {v: {"us": statistics.median(t), "vs_fp32": statistics.median(f / m for f, m in zip(times["fp32"], t))}
            for v, t in times.items()}


STEP_FORMATS = {"fp32": (None, 0), "int8 b32": (8, 32), "int4 g32": (4, 32), "int4 g64": (4, 64), "int4 g128": (4, 128)}


def step_shapes(preset: str) -> list[tuple[int, int]]:
    """(K, N) of every weight matmul of a decode step, in order, as the export stacks them."""
    p = PRESETS[preset]
    C, F = p["hidden_size"], p["intermediate_size"]
    return [(C, 3 * C), (C, C), (C, 2 * F), (F, C)] * p["num_hidden_layers"] + [(C, PRESET_VOCAB)]


def step_graph(shapes, bits, block) -> bytes:
    """The matmuls of `shapes`, each reading an input of its K (x768 or the MLP's x2048), outputs kept."""
    rng = np.random.default_rng(0)
    nodes, inits, inputs = [], [], {}
    for i, (K, N) in enumerate(shapes):
        x = inputs.setdefault(K, f"x{K}")
        if bits is None:
            inits.append(numpy_helper.from_array(rng.standard_normal((K, N)).astype(np.float32), f"w{i}"))
            nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"y{i}"]))
            continue
        blocks = -(-K // block)
        inits += [numpy_helper.from_array(rng.integers(0, 256, (N, blocks, block * bits // 8), dtype=np.uint8), f"b{i}"),
                  numpy_helper.from_array(rng.random((N, blocks)).astype(np.float32) / 100, f"s{i}")]
        operands = [x, f"b{i}", f"s{i}"]
        if bits == 4:  # the export's int4 is asymmetric: packed zero points
            inits.append(numpy_helper.from_array(rng.integers(0, 256, (N, -(-blocks // 2)), dtype=np.uint8), f"z{i}"))
            operands.append(f"z{i}")
        nodes.append(helper.make_node("MatMulNBits", operands, [f"y{i}"], domain="com.microsoft", K=K, N=N,
                                      bits=bits, block_size=block, accuracy_level=4))
    g = helper.make_graph(nodes, "step", [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, K])
                                          for K, x in inputs.items()],
                          [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(len(shapes))],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                                helper.make_opsetid("com.microsoft", 1)]).SerializeToString()


def step_bytes(shapes, bits, block) -> int:
    if bits is None:
        return sum(4 * K * N for K, N in shapes)
    return sum(N * (-(-K // block)) * (block * bits // 8 + 4 + (0.5 if bits == 4 else 0)) for K, N in shapes)


def measure_step(preset: str, rounds: int, calls: int) -> list[dict]:
    shapes = step_shapes(preset)
    sessions = {f: ort.InferenceSession(step_graph(shapes, *spec), providers=["CPUExecutionProvider"])
                for f, spec in STEP_FORMATS.items()}
    rng = np.random.default_rng(1)
    feed = {f"x{K}": rng.standard_normal((1, K)).astype(np.float32) for K in {K for K, _ in shapes}}
    times = {f: [] for f in sessions}
    for s in sessions.values():
        s.run(None, feed)
    for _ in range(rounds):
        for f, s in sessions.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                s.run(None, feed)
            times[f].append((time.perf_counter() - t0) / calls * 1e3)
    rows = []
    for f, t in times.items():
        ratios = [a / b for a, b in zip(times["fp32"], t)]
        mb = step_bytes(shapes, *STEP_FORMATS[f]) / 1e6
        rows.append({"format": f, "weight_mb": mb, "ms": statistics.median(t), "ms_min": min(t), "ms_max": max(t),
                     "gb_s": mb / statistics.median(t), "vs_fp32": statistics.median(ratios),
                     "vs_fp32_min": min(ratios), "vs_fp32_max": max(ratios)})
        print(f"{f:10s} {mb:7.1f} MB  {rows[-1]['ms']:6.2f} ms ({min(t):.2f}-{max(t):.2f})  "
              f"{rows[-1]['gb_s']:5.1f} GB/s  x fp32 {rows[-1]['vs_fp32']:.2f} ({min(ratios):.2f}-{max(ratios):.2f})",
              flush=True)
    return rows


def step_markdown(preset: str, rows: list[dict], meta: dict, rounds: int) -> str:
    lines = ["| weights | MB a step | ms a step (min-max) | GB/s | x fp32 (min-max over rounds) |", "|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['format']} | {r['weight_mb']:.1f} | {r['ms']:.2f} ({r['ms_min']:.2f}-{r['ms_max']:.2f}) | "
                     f"{r['gb_s']:.1f} | {r['vs_fp32']:.2f} ({r['vs_fp32_min']:.2f}-{r['vs_fp32_max']:.2f}) |")
    return (f"# The weight matmuls of one {preset} decode step on the CPU, per weight format\n\n`{meta['command']}`\n\n"
            + "\n".join(lines) + f"\n\nCPU {meta['cpu']}, onnxruntime {meta['onnxruntime']}, default threads, M = 1, "
            f"{rounds} rounds in turns, weights random. The ratio of a whole decode step lies below these: the "
            "rest of a step costs the same in every format.\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES),
                    help="K x N list, e.g. 768x2304,768x4096 (fused q/k/v, gate/up)")
    ap.add_argument("--decode-step", metavar="PRESET", choices=sorted(PRESETS),
                    help="time the weight matmuls of a whole decode step of this preset instead (the ceiling)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path)
    args = ap.parse_args()
    meta = {"cpu": cpu_name(), "onnxruntime": ort.__version__, "python": platform.python_version(),
            "command": " ".join(["python", *sys.argv])}
    if args.decode_step:
        rows = measure_step(args.decode_step, args.rounds, args.calls)
        if args.json:
            args.json.write_text(json.dumps({"meta": meta, "preset": args.decode_step, "rows": rows}, indent=2) + "\n")
        if args.markdown:
            args.markdown.write_text(step_markdown(args.decode_step, rows, meta, args.rounds))
        return
    shapes = [tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")]
    rows = []
    for M in (1, 512):
        for K, N in shapes:
            result = measure(M, K, N, args.rounds, args.calls if M == 1 else 1, args.layers)
            rows.append({"M": M, "K": K, "N": N, **result})
            print(f"M={M:<4d} {K}x{N}: " + "  ".join(f"{v} {r['us']:.0f} us ({r['vs_fp32']:.2f}x)"
                                                   for v, r in result.items()), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    if args.markdown:
        head = "| M | K x N | " + " | ".join(f"{v} us (x fp32)" for v in VARIANTS) + " |"
        lines = [head, "|" + "---|" * (2 + len(VARIANTS))]
        for r in rows:
            lines.append(f"| {r['M']} | {r['K']}x{r['N']} | " +
                         " | ".join(f"{r[v]['us']:.0f} ({r[v]['vs_fp32']:.2f})" for v in VARIANTS) + " |")
        args.markdown.write_text(f"# MatMulNBits on the CPU: time per matmul, ratio to fp32 MatMul\n\n`{meta['command']}`\n\n"
                                 + "\n".join(lines) + f"\n\nCPU {meta['cpu']}, onnxruntime {meta['onnxruntime']}, "
                                 "default threads; block 32; weights random. x fp32 above 1 is faster.\n")


if __name__ == "__main__":
    main()
