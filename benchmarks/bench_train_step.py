"""Benchmark: one training step (forward and backward) of the shipped tiny TTT models through the
torch mini-batch loop, and the bytes autograd saves for the backward (what limits the batch).

    python benchmarks/bench_train_step.py [--batch 4] [--ctx 512] [--compile] [--json FILE]

Runs on CUDA when there is one (TTT-Linear on the mini-batch loop; --kernels: through the training
kernel, `edgettt.fast_paths.use_kernels`), else on the CPU. Saved bytes count every tensor autograd keeps for the backward, once per
storage. Medians of --repeats steps after one warm-up step (which compiles, with --compile:
`edgettt.families.ttt.kernels.compile_ttt_steps`).
"""

import argparse
import json
import platform
import statistics
import time

import torch
import torch.nn.functional as F

import edgettt


def saved_bytes(model, ids) -> int:
    """Bytes of the distinct storages autograd saves for the backward of one forward."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(ids).float().sum()
    return sum(storages.values())


def step_seconds(model, ids, device) -> float:
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    logits = model(ids[:, :-1]).float()
    F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)).backward()
    sync()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="ttt-linear-tiny,ttt-mlp-tiny")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--compile", action="store_true", help="torch.compile the mini-batch steps first")
    ap.add_argument("--kernels", action="store_true", help="TTT-Linear through its training kernel")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.compile:
        from edgettt.families.ttt.kernels import compile_ttt_steps

        compile_ttt_steps()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name in args.models.split(","):
        model = edgettt.load(name).to(device).train()
        if args.kernels:
            edgettt.fast_paths.use_kernels(model)
        ids = torch.randint(0, 256, (args.batch, args.ctx + 1), generator=gen).to(device)
        step_seconds(model, ids, device)  # warm-up
        seconds = statistics.median(step_seconds(model, ids, device) for _ in range(args.repeats))
        row = {"model": name, "batch": args.batch, "ctx": args.ctx, "compiled": args.compile, "step_ms": 1e3 * seconds,
               "saved_mb": saved_bytes(model, ids[:, :-1]) / 1e6}
        rows.append(row)
        print(f"{name:16s} batch {args.batch} ctx {args.ctx}: step {row['step_ms']:8.1f} ms, "
              f"saved for backward {row['saved_mb']:8.1f} MB")
    if args.json:
        meta = {"device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or platform.machine(),
                "torch": torch.__version__, "threads": torch.get_num_threads()}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
