"""The floor of a decode step in ONNX Runtime on this CPU: what the weight bytes and the node count alone cost.

    python benchmarks/decode_floor_cpu.py EXPORT [EXPORT ...] --threads 1 --json out.json --markdown out.md

Measured here, in one run:
- ONNX Runtime's cost per node: a chain of N Add nodes on a [1, 768] float tensor (the 125m width), timed at
  N = 1 and N = 1024; the difference over 1023 is what a small node costs beyond its arithmetic;
- the copy bandwidth: numpy copying 256 MiB (read and write counted), the rate a decode step streams weights at;
- each export's decode step: its nodes (Scan / If / function bodies counted), the weight bytes its graph reads
  (`onnx_files.graph_bytes`), and tokens/s through `edgettt run`'s runner (median of rounds of 32 tokens).

The floor of a step is bytes / bandwidth + nodes x cost per node; the same with 11 nodes a layer (onnxruntime-
genai's Llama: packed QKV MatMulNBits, GroupQueryAttention, SkipSimplifiedLayerNormalization) says what fewer,
larger nodes could win. The step's time beyond the floor is the arithmetic and what the floor leaves out.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from edgettt.benchmark import count_nodes, cpu_name
from edgettt.onnx_files import graph_bytes
from edgettt.runner import Runner, load_manifest

GENAI_LLAMA_NODES_A_LAYER = 11


def add_chain(nodes: int, width: int = 768) -> bytes:
    """An ONNX model: x [1, width] through `nodes` Add nodes, each adding a constant."""
    c = helper.make_tensor("c", TensorProto.FLOAT, [width], np.full(width, 1e-3, np.float32))
    chain = [helper.make_node("Add", ["x" if i == 0 else f"h{i}", "c"], [f"h{i + 1}" if i < nodes - 1 else "y"])
             for i in range(nodes)]
    graph = helper.make_graph(chain, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], [c])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def seconds_per_run(model: bytes, threads: int, runs: int) -> float:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep every node
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    feed = {"x": np.zeros((1, 768), np.float32)}
    for _ in range(10):
        session.run(None, feed)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def node_overhead_us(threads: int, rounds: int) -> float:
    """Median over rounds of (t(1024 nodes) - t(1 node)) / 1023, the two timed in turns."""
    small, large = add_chain(1), add_chain(1024)
    estimates = [(seconds_per_run(large, threads, 50) - seconds_per_run(small, threads, 200)) / 1023
                 for _ in range(rounds)]
    return 1e6 * statistics.median(estimates)


def copy_bandwidth_gbs(rounds: int) -> float:
    """Bytes moved (read + written) a second copying 256 MiB with numpy, median over rounds."""
    src = np.ones(64 << 20, np.float32)
    dst = np.empty_like(src)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return 2 * src.nbytes / statistics.median(times) / 1e9


def decode_ms(directory: Path, threads: int, rounds: int, tokens: int = 32) -> float:
    runner = Runner(directory, threads)
    vocab = runner.manifest["vocab_size"]
    ids = np.random.default_rng(0).integers(0, vocab, (1, tokens + 1))
    _, states = runner.run_prefill(ids[:, :1])
    runner.decode_tokens(ids[:, 1:9], 1, states)  # untimed: the first steps plan and allocate
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        runner.decode_tokens(ids[:, 1:], 1, states)
        times.append((time.perf_counter() - t0) / tokens)
    return 1e3 * statistics.median(times)


def floor_of(directory: Path, threads: int, rounds: int, per_node_us: float, bandwidth: float) -> dict:
    manifest = load_manifest(directory)
    model = onnx.load(str(directory / "decode.onnx"), load_external_data=False)
    nodes = count_nodes(model.graph, {(f.domain, f.name): f for f in model.functions})
    layers = 1 + max(s["layer"] for s in manifest["state"])
    weight_bytes = graph_bytes(directory / "decode.onnx")
    bytes_ms = 1e3 * weight_bytes / (bandwidth * 1e9 / 2)  # a weight byte is read once a step (half the copy)
    nodes_ms = nodes * per_node_us / 1e3
    measured = decode_ms(directory, threads, rounds)
    lean_ms = bytes_ms + GENAI_LLAMA_NODES_A_LAYER * layers * per_node_us / 1e3
    return {"export": str(directory), "model": manifest.get("source", {}).get("model"), "layers": layers,
            "decode_nodes": nodes, "nodes_per_layer": nodes / layers, "weight_bytes": weight_bytes,
            "bytes_ms": bytes_ms, "nodes_ms": nodes_ms, "floor_ms": bytes_ms + nodes_ms, "measured_ms": measured,
            "floor_share": (bytes_ms + nodes_ms) / measured, "nodes_share": nodes_ms / measured,
            "floor_at_11_nodes_a_layer_ms": lean_ms}


def table(meta: dict, rows: list[dict]) -> str:
    lines = [f"# decode_floor_cpu\n\n{meta['cpu']}, {meta['threads']} thread(s), onnxruntime {meta['onnxruntime']}: "
             f"a node costs {meta['node_us']:.2f} us beyond its arithmetic; copy bandwidth {meta['copy_gbs']:.1f} "
             "GB/s (read + write)\n",
             "| export | layers | nodes | nodes/layer | weight MB | bytes ms | nodes ms | floor ms | measured ms | "
             "nodes share | floor at 11 nodes/layer ms |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['layers']} | {r['decode_nodes']} | {r['nodes_per_layer']:.0f} | "
                     f"{r['weight_bytes'] / 1e6:.2f} | {r['bytes_ms']:.3f} | {r['nodes_ms']:.3f} | {r['floor_ms']:.3f} | "
                     f"{r['measured_ms']:.3f} | {100 * r['nodes_share']:.0f}% | {r['floor_at_11_nodes_a_layer_ms']:.3f} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("exports", nargs="+", type=Path)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", default=None)
    args = ap.parse_args()
    per_node = node_overhead_us(args.threads, args.rounds)
    bandwidth = copy_bandwidth_gbs(args.rounds)
    rows = [floor_of(d, args.threads, args.rounds, per_node, bandwidth) for d in args.exports]
    meta = {"cpu": cpu_name(), "threads": args.threads, "rounds": args.rounds, "onnxruntime": ort.__version__,
            "python": platform.python_version(), "node_us": per_node, "copy_gbs": bandwidth}
    text = table(meta, rows)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": rows}, indent=2) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(text)


if __name__ == "__main__":
    main()
