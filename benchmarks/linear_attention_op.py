"""Can the export use ONNX's standard LinearAttention (opset 27; ONNX Runtime >= 1.32 runs it on the CPU)?

A parallel-form TTT-Linear layer (DESIGN section 4) reads, for a token at index i of its mini-batch,
    zbar = q S + eta_i q A,   A = the sum of k^T v over the mini-batch's tokens up to this one,
and at the mini-batch's last token commits S <- decay(S) + eta_b A, A <- 0. LinearAttention's "linear"
rule is one running sum, S_t = S_{t-1} + k_t v_t^T, o_t = scale q_t^T S_t; its "gated" rule decays that
sum by exp(g_t) first. So the op can carry A (not S, whose value map and commit it has no place for):
- decode (T = 1): A' = A + k^T v and eta_i q A' as LinearAttention("linear", q eta_i, k, v, past_state=A);
  q S, the commit and the decay stay as they are;
- prefill: the mini-batches' causal sums eta_i q A_t as LinearAttention("gated", q eta_i, k, v, A_open,
  decay = a large negative log-gate at each mini-batch's first token, 0 elsewhere: exp(g) = 0 resets the
  sum, 1 keeps it); q S_n of each mini-batch's boundary state stays a MatMul.

This script times both parts, each against the subgraph the export writes today, at a model's shapes
(heads, key and value widths with the bias feature, mini-batch 16), one ONNX Runtime session each, in
alternation, and checks that they agree (fp32 rounding). Writes JSON and prints a table.

    python benchmarks/linear_attention_op.py --heads 12 --head-dim 64 --tokens 512 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

NEG = -1e30  # the log-gate that resets the running sum (exp underflows to exactly 0; no inf - inf)


def _model(nodes, inputs, outputs, initializers=(), opset=27):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 11
    return model


def _info(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def decode_models(H, dk, dv, eta_i):
    """(today's ops, LinearAttention): inputs q, k [B, H, 1, dk], v [B, H, 1, dv], A [B, H, dk, dv];
    outputs eta_i q A' and A'."""
    eta = numpy_helper.from_array(np.array(eta_i, np.float32), "eta")
    io = [_info("q", [1, H, 1, dk]), _info("k", [1, H, 1, dk]), _info("v", [1, H, 1, dv]), _info("A", [1, H, dk, dv])]
    out = [_info("o", None), _info("A2", None)]
    today = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["kt", "v"], ["kv"]),
             helper.make_node("Add", ["A", "kv"], ["A2"]),
             helper.make_node("MatMul", ["q", "A2"], ["qa"]),
             helper.make_node("Mul", ["qa", "eta"], ["o"])]
    flat = numpy_helper.from_array(np.array([1, 1, -1], np.int64), "flat")
    op = [helper.make_node("Mul", ["q", "eta"], ["qe"]),
          *[helper.make_node("Transpose", [x], [x + "t"], perm=[0, 2, 1, 3]) for x in ("qe", "k", "v")],
          *[helper.make_node("Reshape", [x + "t", "flat"], [x + "p"]) for x in ("qe", "k", "v")],
          helper.make_node("LinearAttention", ["qep", "kp", "vp", "A"], ["op", "A2"], q_num_heads=H, kv_num_heads=H,
                           update_rule="linear", scale=1.0),
          helper.make_node("Reshape", ["op", "shape"], ["o4"]),
          helper.make_node("Transpose", ["o4"], ["o"], perm=[0, 2, 1, 3])]
    shape = numpy_helper.from_array(np.array([1, 1, H, dv], np.int64), "shape")
    return _model(today, io, out, [eta]), _model(op, io, out, [eta, flat, shape])


def prefill_models(H, dk, dv, T, b, eta_tok):
    """(today's ops, LinearAttention): inputs q, k [1, H, T, dk], v [1, H, T, dv] (T a multiple of b, from a
    mini-batch boundary); output the causal mini-batch sums eta_i q_t A_t [1, H, T, dv]."""
    N = T // b
    eta = numpy_helper.from_array(np.tile(eta_tok, N).astype(np.float32).reshape(1, 1, T, 1), "eta")
    io = [_info("q", [1, H, T, dk]), _info("k", [1, H, T, dk]), _info("v", [1, H, T, dv])]
    out = [_info("o", None)]
    chunks = lambda d: numpy_helper.from_array(np.array([1, H, N, b, d], np.int64), f"c{d}")  # noqa: E731
    mask = numpy_helper.from_array(np.tril(np.ones((b, b), np.float32)), "mask")
    back = numpy_helper.from_array(np.array([1, H, T, dv], np.int64), "back")
    today = [helper.make_node("Reshape", ["q", f"c{dk}"], ["qc"]), helper.make_node("Reshape", ["k", f"c{dk}"], ["kc"]),
             helper.make_node("Reshape", ["v", f"c{dv}"], ["vc"]),
             helper.make_node("Transpose", ["kc"], ["kct"], perm=[0, 1, 2, 4, 3]),
             helper.make_node("MatMul", ["qc", "kct"], ["scores"]), helper.make_node("Mul", ["scores", "mask"], ["causal"]),
             helper.make_node("MatMul", ["causal", "vc"], ["sums"]), helper.make_node("Reshape", ["sums", "back"], ["s4"]),
             helper.make_node("Mul", ["s4", "eta"], ["o"])]
    gate = np.zeros((1, T, H), np.float32)
    gate[:, ::b] = NEG  # a new mini-batch: the running sum starts again
    gates = numpy_helper.from_array(gate, "gate")
    flat = numpy_helper.from_array(np.array([1, T, -1], np.int64), "flat")
    shape = numpy_helper.from_array(np.array([1, T, H, dv], np.int64), "shape")
    op = [helper.make_node("Mul", ["q", "eta"], ["qe"]),
          *[helper.make_node("Transpose", [x], [x + "t"], perm=[0, 2, 1, 3]) for x in ("qe", "k", "v")],
          *[helper.make_node("Reshape", [x + "t", "flat"], [x + "p"]) for x in ("qe", "k", "v")],
          helper.make_node("LinearAttention", ["qep", "kp", "vp", "", "gate"], ["op", "last"], q_num_heads=H, kv_num_heads=H,
                           update_rule="gated", scale=1.0),
          helper.make_node("Reshape", ["op", "shape"], ["o4"]),
          helper.make_node("Transpose", ["o4"], ["o"], perm=[0, 2, 1, 3])]
    return (_model(today, io, out, [eta, mask, back, *[chunks(d) for d in {dk, dv}]]),
            _model(op, io, out, [eta, gates, flat, shape]))


def op_alone(H, dk, dv, T, rule):
    """LinearAttention with its inputs already in its packed layout [1, T, H*D] (the fairest case: no layout
    change around it)."""
    io = [_info("q", [1, T, H * dk]), _info("k", [1, T, H * dk]), _info("v", [1, T, H * dv])]
    extra, inits = ["", ""], []
    if rule == "linear":
        io.append(_info("A", [1, H, dk, dv]))
        extra = ["A"]
    else:
        gate = np.zeros((1, T, H), np.float32)
        inits.append(numpy_helper.from_array(gate, "gate"))
        extra = ["", "gate"]
    node = helper.make_node("LinearAttention", ["q", "k", "v", *extra], ["o", "last"], q_num_heads=H, kv_num_heads=H,
                            update_rule=rule, scale=1.0)
    return _model([node], io, [_info("o", None), _info("last", None)], inits)


def timed(sessions, feeds, repeats, runs):
    """Median seconds a run of each session, the sessions in turns, `repeats` rounds of `runs` runs."""
    times = [[] for _ in sessions]
    for s in sessions:
        s.run(None, feeds)
    for _ in range(repeats):
        for i, s in enumerate(sessions):
            t = time.perf_counter()
            for _ in range(runs):
                s.run(None, feeds)
            times[i].append((time.perf_counter() - t) / runs)
    return [statistics.median(t) for t in times]


def session(model):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def compare(models, feeds, alone, alone_feeds, repeats, runs):
    sessions = [session(m) for m in models]
    outs = [s.run(None, feeds)[0] for s in sessions]
    t_today, t_op = timed(sessions, feeds, repeats, runs)
    t_alone = timed([session(alone)], alone_feeds, repeats, runs)[0]
    rel = float(np.linalg.norm(outs[1] - outs[0]) / np.linalg.norm(outs[0]))
    return {"today_us": t_today * 1e6, "linear_attention_us": t_op * 1e6, "op_over_today": t_op / t_today,
            "op_alone_us": t_alone * 1e6, "op_alone_over_today": t_alone / t_today, "rel_error": rel}


def packed(x):
    """[1, H, T, D] -> LinearAttention's [1, T, H*D]."""
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3).reshape(1, x.shape[2], -1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--mini-batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    H, d, b, T = a.heads, a.head_dim, a.mini_batch, a.tokens
    dk, dv = d + 1, d  # the bias feature
    rng = np.random.default_rng(0)
    eta_tok = rng.uniform(0.5, 1.5, b).astype(np.float32)
    x = lambda *s: (rng.standard_normal(s) / np.sqrt(dk)).astype(np.float32)  # noqa: E731
    q, k, v, A = x(1, H, 1, dk), x(1, H, 1, dk), x(1, H, 1, dv), x(1, H, dk, dv)
    rows = [dict(part="decode step (T=1): A + k^T v, eta q A", **compare(
        decode_models(H, dk, dv, eta_tok[5]), {"q": q, "k": k, "v": v, "A": A}, op_alone(H, dk, dv, 1, "linear"),
        {"q": packed(q), "k": packed(k), "v": packed(v), "A": A}, a.repeats, 2000))]
    q, k, v = x(1, H, T, dk), x(1, H, T, dk), x(1, H, T, dv)
    rows.append(dict(part=f"prefill ({T} tokens): the mini-batches' causal sums", **compare(
        prefill_models(H, dk, dv, T, b, eta_tok), {"q": q, "k": k, "v": v}, op_alone(H, dk, dv, T, "gated"),
        {"q": packed(q), "k": packed(k), "v": packed(v)}, a.repeats, 50)))
    print(f"onnxruntime {ort.__version__}, {H} heads, dk {dk}, dv {dv}, mini-batch {b}")
    print("| part | today us | LinearAttention us (x today) | the op alone, packed inputs us (x today) | rel error |\n"
          "|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['part']} | {r['today_us']:.1f} | {r['linear_attention_us']:.1f} ({r['op_over_today']:.2f}x) | "
              f"{r['op_alone_us']:.1f} ({r['op_alone_over_today']:.2f}x) | {r['rel_error']:.1e} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"heads": H, "dk": dk, "dv": dv, "mini_batch": b, "tokens": T, "onnxruntime": ort.__version__,
                       "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
