"""Continue a shipped parallel form's distillation at mixed window lengths, and measure bits per byte at
each length before and after (`edgettt convert --distill ctx=512/2048/8192` does the same from a fresh
conversion).

    python benchmarks/mixed_distill.py --teacher ttt-mlp-tiny --student ttt-mlp-tiny-parallel \
        --lengths 512,2048,8192 --steps 36 --lr 1e-4 --json benchmarks/results/mixed_distill_cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

import edgettt
from edgettt.data import read_text
from edgettt.distill import distill
from edgettt.evaluation import encode


def bits_per_byte(model, lengths, text, max_tokens):
    runs = edgettt.evaluate(model, text, ctx=lengths, max_tokens=max_tokens)
    return {n: e.bits_per_byte for n, e in zip(lengths, runs)}


def fmt(by_length: dict) -> str:
    return ", ".join(f"{n}: {v:.4f}" for n, v in by_length.items())


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--teacher", default="ttt-mlp-tiny")
    p.add_argument("--student", default="ttt-mlp-tiny-parallel")
    p.add_argument("--lengths", default="512,2048,8192")
    p.add_argument("--steps", type=int, default=36)
    p.add_argument("--batch", type=int, default=1, help="windows of the longest length a step")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--data", default="python-docs:train")
    p.add_argument("--eval-data", default="python-docs:test")
    p.add_argument("--max-tokens", type=int, default=16384)
    p.add_argument("--minutes", type=float, default=None, help="also end on the clock (the schedule follows it)")
    p.add_argument("--pool", type=int, default=0, help="teacher logits of this many batches a length, computed "
                   "first and reused in turn (`distill(pool=)`: for a slow teacher; not counted in --minutes)")
    p.add_argument("--hard-weight", type=float, default=0.0, help="share of the next-token loss on the text")
    p.add_argument("--value-eps", type=float, default=None, help="experiment: the parallel form's values with this "
                   "epsilon in their LN-L2 gradient (a floor on its division by the spread of ka S0: "
                   "benchmarks/results/state_growth.md), in this run only (not saved: refused with --save)")
    p.add_argument("--decay", type=float, default=None, help="make the student a decayed parallel form starting at "
                   "this gamma a mini-batch (`edgettt convert --decay`: each head's state decays towards its initial "
                   "state at every commit; the distillation tunes each head's gamma); leave it out to continue an "
                   "already decayed student with its own gammas")
    p.add_argument("--save", help="write the distilled student here (a model directory)")
    p.add_argument("--store", choices=["float32", "bfloat16"], default="float32",
                   help="precision of the saved student's matrices (bfloat16: half the bytes, as the larger "
                        "embedded models; measured after the rounding)")
    p.add_argument("--json")
    args = p.parse_args()
    if args.value_eps is not None and args.save:
        raise SystemExit("mixed_distill.py: --value-eps is an experiment of this run (a model does not keep it); "
                         "leave out --save")
    if args.value_eps is not None:
        floor_parallel_values(args.value_eps)
    lengths = [int(n) for n in args.lengths.split(",")]
    teacher, student = edgettt.load(args.teacher), edgettt.load(args.student)
    if args.decay is not None:
        student = edgettt.convert(student, "parallel", decay=args.decay)
    if teacher.form == "ttt":  # the exact form equals the original to float rounding, and has GPU kernels
        teacher = edgettt.convert(teacher, "exact")
    # the built-in python-docs text is the running CPython's documentation: another Python version, another
    # text (the shipped models' held-out numbers are on sha256 bc2e70a91ddd1419, Python 3.11's)
    eval_text = read_text(args.eval_data)
    result = {"args": vars(args), "torch": torch.__version__, "python": platform.python_version(),
              "eval_text": eval_text.fingerprint(),
              "teacher": bits_per_byte(teacher, lengths, eval_text, args.max_tokens),
              "before": bits_per_byte(student, lengths, eval_text, args.max_tokens)}
    print(f"teacher {fmt(result['teacher'])}; student before {fmt(result['before'])} (bits per byte)", flush=True)
    write(result, args.json)
    t0 = time.time()
    result["losses"] = distill(teacher, student, encode(teacher, read_text(args.data)), steps=args.steps,
                               batch=args.batch, ctx=lengths, lr=args.lr, minutes=args.minutes, pool=args.pool,
                               hard_weight=args.hard_weight)
    result["steps_run"] = len(result["losses"])
    result["minutes"] = (time.time() - t0) / 60
    if args.save:  # before the last measurement: a run cut short keeps its weights
        student.config.extra["distilled_ctx"] = max(lengths)
        edgettt.save(student, args.save, store=getattr(torch, args.store))  # (its tensors copied to the CPU)
    write(result, args.json)
    if args.store != "float32":  # measure what was saved
        student = edgettt.load(args.save).to(next(teacher.parameters()).device)
    result["after"] = bits_per_byte(student, lengths, eval_text, args.max_tokens)
    for when in ("before", "after"):
        ratios = " / ".join(f"{result[when][n] / result['teacher'][n]:.3f}" for n in lengths)
        print(f"{when:6s} bits per byte ratio to the teacher at {args.lengths}: {ratios}")
    write(result, args.json)


def floor_parallel_values(eps: float) -> None:
    """Every parallel-form layer's values (those taken at the initial state S0 [H, d+1, d], where the exact
    form's are at its per-sequence states) with `eps` in the LN-L2 gradient, for the rest of the process."""
    from edgettt.ops.linear_attention import reference as la
    from edgettt.ops import ln_l2_grad

    values = la.linear_values

    def floored(ka, k, v, lr, S, gamma, beta):
        if S.dim() == 4:  # the exact form (the teacher): unchanged
            return values(ka, k, v, lr, S, gamma, beta)
        return -lr[..., None] * ln_l2_grad(ka @ S, v - k, gamma, beta, eps=eps)
    la.linear_values = floored


def write(result: dict, path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
