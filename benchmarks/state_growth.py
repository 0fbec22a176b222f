"""How far a TTT-Linear layer's state travels from its initial state S0 along a text: the original (run as
its exact form, equal to it) against parallel forms (why a parallel form distilled at one
length does not hold at another).

    python benchmarks/state_growth.py --models ttt-linear-tiny-parallel --lengths 512,1024,2048,4096,8192 \
        --json benchmarks/results/state_growth.json

For each model and length T: the state S after the first T tokens of the text (a prefill), and per layer the
Frobenius norm of S - S0 relative to S0's, averaged over the heads; and the last mini-batch's update, the
norm of S(T) - S(T - b) relative to S0's; and each layer's commit weight (the mini-batch's last eta: where it
is 0 the layer never commits, its memory is its mini-batch). The original's values are gradients at its current weights, which
shrink as the weights fit the text; a parallel form's are gradients at S0, so its sum has nothing to hold it.
"""

from __future__ import annotations

import argparse
import json
import platform

import torch

import edgettt
from edgettt.data import read_text
from edgettt.evaluation import encode


def state_after(model, ids: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's S1 [H, d+1, d] after a prefill of ids [1, T]."""
    with torch.no_grad():
        _, state = model.prefill(ids, None)
    return [layer["S1"][0].float() for layer in state.layers]


def relative_norms(S: list[torch.Tensor], ref: list[torch.Tensor], S0: list[torch.Tensor]) -> list[float]:
    """Per layer: mean over heads of ||S - ref|| / ||S0||."""
    return [((s - r).flatten(1).norm(dim=1) / s0.flatten(1).norm(dim=1)).mean().item() for s, r, s0 in zip(S, ref, S0)]


def growth(model, tokens: list[int], lengths: list[int]) -> list[dict]:
    b = model.config.mini_batch_size
    S0 = [layer.seq_modeling_block.state0.detach().float() for layer in model.model.layers]
    rows = []
    for T in lengths:
        ids = torch.tensor([tokens[:T]])
        S, before = state_after(model, ids), state_after(model, ids[:, :T - b])
        rows.append({"T": T, "from_S0": relative_norms(S, S0, S0), "last_update": relative_norms(S, before, S0)})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--original", default="ttt-linear-tiny")
    p.add_argument("--models", default="ttt-linear-tiny-parallel", help="parallel forms (comma-separated)")
    p.add_argument("--lengths", default="512,1024,2048,4096,8192")
    p.add_argument("--data", default="python-docs:test")
    p.add_argument("--json")
    args = p.parse_args(argv)
    lengths = [int(n) for n in args.lengths.split(",")]
    text = read_text(args.data)
    exact = edgettt.convert(edgettt.load(args.original), "exact")
    models = {f"{args.original} (exact form)": exact}
    models.update({name: edgettt.load(name) for name in args.models.split(",") if name})
    tokens = encode(exact, text)
    if len(tokens) < max(lengths):
        raise SystemExit(f"state_growth.py: {args.data} has {len(tokens)} tokens, fewer than {max(lengths)}")
    result = {"data": text.name, "python": platform.python_version(), "torch": torch.__version__, "models": {}}
    for name, model in models.items():
        if model.config.ttt_layer_type != "linear":
            raise SystemExit(f"state_growth.py: {name} is not a TTT-Linear model (this measures S1 against state0)")
        rows = growth(model.eval(), tokens, lengths)
        # the weight of a mini-batch's commit (the last token's eta): 0 means the layer never commits
        commit_eta = [layer.seq_modeling_block.mask_eta[-1].item() for layer in model.model.layers]
        result["models"][name] = {"commit_eta": commit_eta, "rows": rows}
        print(f"{name}: commit eta per layer {' '.join(f'{e:.3f}' for e in commit_eta)}")
        for r in rows:
            print(f"{name:40s} T={r['T']:>5}  |S-S0|/|S0| per layer {' '.join(f'{v:6.3f}' for v in r['from_S0'])}"
                  f"   last mini-batch {' '.join(f'{v:7.4f}' for v in r['last_update'])}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
