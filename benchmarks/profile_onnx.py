"""Where a decode step's (or a prefill's) time goes in ONNX Runtime: nodes per layer and time per
node, by operator.

    python benchmarks/profile_onnx.py EXPORT [EXPORT ...] --steps 64 --json benchmarks/results/profile_decode.json
    python benchmarks/profile_onnx.py EXPORT [EXPORT ...] --prefill 512 --steps 4

For each export (from `edgettt export`): the decode graph's nodes (Scan / If bodies and local
functions counted, `edgettt.benchmark.count_nodes`) and nodes per layer; then `--steps` decode steps
after a one-token prompt, batch 1, with onnxruntime's profiler on, aggregated by operator type:
calls, total and mean microseconds per call, and the share of the step. With `--prefill N`, the
prefill graph instead: `--steps` prefills of N tokens after one untimed (the next token's logits, as
`edgettt bench`'s pp), per prefill. The rows split the time into the operators that read weight bytes
(MatMul, MatMulNBits, DynamicQuantizeMatMul, MatMulBnb4, Gemm, Gather of the embedding) and everything
else: the "per-token overhead that is not weight bytes". Profiling adds its own cost per node; the
untimed tokens/s of `edgettt bench` are the speed, this is the breakdown.
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from edgettt.runner import Runner, load_manifest
from edgettt.benchmark import count_nodes, cpu_name

WEIGHT_OPS = {"MatMul", "MatMulNBits", "MatMulBnb4", "Gemm", "MatMulInteger", "DynamicQuantizeMatMul"}


def profile(directory: Path, steps: int, threads: int | None, prefill: int = 0) -> dict:
    """Profile `steps` decode steps, or with `prefill` > 0 `steps` prefills of that many tokens."""
    manifest = load_manifest(directory)
    model = onnx.load(str(directory / "decode.onnx"), load_external_data=False)
    nodes = count_nodes(model.graph, {(f.domain, f.name): f for f in model.functions})
    layers = 1 + max(s["layer"] for s in manifest["state"])
    runner = Runner(directory, threads)
    graph = "prefill" if prefill else "decode"
    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        for key, value in manifest.get("session_config", {}).items():
            options.add_session_config_entry(key, value)
        if threads:
            options.intra_op_num_threads = threads
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tmp) / graph)
        session = ort.InferenceSession(str(directory / f"{graph}.onnx"), options, providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        if prefill:
            runner.prefill = session
            ids = rng.integers(0, manifest["vocab_size"], (1, prefill))
            runner.run_prefill(ids, last_only=True)  # untimed: the first run plans and allocates
            t0 = time.perf_counter()
            for _ in range(steps):
                runner.run_prefill(ids, last_only=True)
        else:
            runner.decode = session
            ids = rng.integers(0, manifest["vocab_size"], (1, steps + 1))
            _, states = runner.run_prefill(ids[:, :1])
            t0 = time.perf_counter()
            runner.decode_tokens(ids[:, 1:], 1, states)
        seconds = time.perf_counter() - t0
        events = json.loads(Path(session.end_profiling()).read_text())
    events = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    if prefill:  # every prefill runs the same nodes: drop the untimed first one's
        events = events[len(events) // (steps + 1):]
    by_op = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        op = e["args"].get("op_name", "?")
        by_op[op][0] += 1
        by_op[op][1] += e["dur"]
    node_us = sum(us for _, us in by_op.values())
    rows = sorted(({"op": op, "calls_per_step": n / steps, "us_per_step": us / steps, "us_per_call": us / n,
                    "share": us / node_us} for op, (n, us) in by_op.items()), key=lambda r: -r["us_per_step"])
    weights_us = sum(r["us_per_step"] for r in rows if r["op"] in WEIGHT_OPS)
    return {"export": str(directory), "graph": graph, "prefill_tokens": prefill, "decode_nodes": nodes,
            "layers": layers, "nodes_per_layer": nodes / layers,
            "steps": steps, "profiled_ms_per_step": 1e3 * seconds / steps,
            "node_us_per_step": node_us / steps, "weight_op_us_per_step": weights_us,
            "other_op_us_per_step": node_us / steps - weights_us,
            "nodes_run_per_step": sum(r["calls_per_step"] for r in rows), "ops": rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("exports", nargs="+", type=Path)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--prefill", type=int, default=0, metavar="TOKENS",
                    help="profile prefills of TOKENS tokens (--steps of them) instead of decode steps")
    ap.add_argument("--top", type=int, default=12, help="operators shown per export")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    results = [profile(d, args.steps, args.threads, args.prefill) for d in args.exports]
    for r in results:
        print(f"{r['export']}: {r['decode_nodes']} nodes ({r['nodes_per_layer']:.0f} per layer, {r['layers']} layers), "
              f"{r['nodes_run_per_step']:.0f} run a {r['graph']} step; {r['profiled_ms_per_step']:.2f} ms a step profiled, nodes "
              f"{r['node_us_per_step'] / 1e3:.2f} ms: weight ops {r['weight_op_us_per_step'] / 1e3:.2f} ms, the rest "
              f"{r['other_op_us_per_step'] / 1e3:.2f} ms")
        for op in r["ops"][:args.top]:
            print(f"  {op['op']:24s} {op['calls_per_step']:7.1f} calls {op['us_per_step']:9.1f} us "
                  f"{op['us_per_call']:8.2f} us/call {100 * op['share']:5.1f}%")
    meta = {"cpu": cpu_name(), "threads": args.threads, "onnxruntime": ort.__version__,
            "python": platform.python_version()}
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
