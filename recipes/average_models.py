"""Average the weights of two models of one architecture: (1 - t) * FIRST + t * SECOND (checkpoint averaging).

    python recipes/average_models.py FIRST SECOND OUT --t 0.3

The last step of `ttt-linear-tiny-parallel`'s recipe (`train_all.sh`, DECAYED_AVERAGE_OF): its distillation
at 512 and 2048 tokens only (+2.5% / +2.5% / +8.0% of the original at 512 / 2048 / 8192) and the stage after
it (8192 back in the mix: +2.8% / +3.1% / -5.1%) averaged at t = 0.3 hold all three lengths
(+2.5% / +2.6% / +1.8%; benchmarks/results/mixed_distill_gpu.md). Both must share one config
(the form, sizes and options); the average keeps the larger `distilled_ctx` of the two. OUT is written
atomically and replaced only with --force.
"""

import argparse
import copy
import sys
from pathlib import Path

import torch

import edgettt
from edgettt import EdgetttError

IGNORED_KEYS = {"distilled_ctx"}  # config entries the two may differ in


def average(first, second, t: float):
    """A new model: first's config, every floating tensor (1 - t) * first + t * second."""
    a, b = first.config.to_dict(), second.config.to_dict()
    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k) and k not in IGNORED_KEYS)
    if differ:
        raise EdgetttError(f"the two models differ in {', '.join(differ)}: only models of one config can be averaged")
    out = copy.deepcopy(first)
    theirs = {**dict(second.named_parameters()), **dict(second.named_buffers())}
    with torch.no_grad():  # (named_parameters, not state_dict: a tied embedding is one tensor, averaged once)
        for name, tensor in [*out.named_parameters(), *out.named_buffers()]:
            if tensor.is_floating_point():
                tensor.mul_(1 - t).add_(theirs[name], alpha=t)
    contexts = [c for c in (a.get("distilled_ctx"), b.get("distilled_ctx")) if c is not None]
    if contexts:
        out.config.extra["distilled_ctx"] = max(contexts)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("first")
    p.add_argument("second")
    p.add_argument("out")
    p.add_argument("--t", type=float, required=True, help="the second model's weight, 0 to 1")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.add_argument("--store", choices=["float32", "bfloat16"], default="float32",
                   help="precision of OUT's matrices (bfloat16: half the bytes; vectors stay float32)")
    args = p.parse_args(argv)
    if not 0 <= args.t <= 1:
        p.error(f"--t {args.t}: give a weight from 0 to 1")
    if Path(args.out).resolve() in {Path(args.first).resolve(), Path(args.second).resolve()}:
        p.error(f"{args.out}: is one of the inputs; write the average to a new directory")
    try:
        model = average(edgettt.load(args.first), edgettt.load(args.second), args.t)
        edgettt.save(model, args.out, force=args.force, store=getattr(torch, args.store))
    except EdgetttError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}: {1 - args.t:g} x {args.first} + {args.t:g} x {args.second}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
