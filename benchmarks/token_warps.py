"""The decode token kernels (`ops.linear_attention.decode_token`: float state, int8 state) launched with different warps at a
preset's heads: each launch's output against the first variant's, and microseconds a call, 24 layers' calls (each
its own state) in a CUDA graph (`bench.time_rotating_ms`: the median of its replays), the variants in turns, the
median of --rounds; `decode_token.token_warps` picks from these.

    python benchmarks/token_warps.py --json benchmarks/results/token_warps_760m_h200.json
    python benchmarks/token_warps.py --shape 1x12x64 --warps 2,4,8 --rounds 5 --json ...     (125m's heads)

Why warps: compiled offline for sm_90a (`kernel_resources.py`), the float kernel at d = 96 takes 255 registers and
spills 384 bytes with 8 warps, 128 and 264 with 16, 64 and 192 with 32: more warps, fewer registers a thread.
Inputs are the kernel tests' (`tests/kernels/test_decode_token.py`: `inputs`, `int8_state`). Results:
benchmarks/results/compiled_decode_h200.md.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path[:0] = [str(TESTS / "kernels"), str(TESTS)]  # the kernel tests and their conftest
from test_decode_token import inputs, int8_state  # noqa: E402

from lab.kernel_bench import time_rotating_ms  # noqa: E402
from lab.launch import fixed_token_warps  # noqa: E402
from edgettt.ops.linear_attention import decode_token as dt  # noqa: E402
from edgettt.ops.common import next_power_of_2  # noqa: E402

LAYERS, SLOTS = 24, 16


def launch_float(args, eta, inner, warps):
    with fixed_token_warps(warps):
        return dt.decode_token(*args, eta, inner, 10000.0)


def launch_int8(args, eta, inner, warps):
    with fixed_token_warps(warps):
        return dt.decode_token_int12(*args, eta, inner, 10000.0)


def layers_of(kind, inner, shape):
    if kind == "float":
        return [inputs(*shape, torch.bfloat16, "cuda", seed=layer) for layer in range(LAYERS)]
    layers = []
    for layer in range(LAYERS):
        q, k, v, lr, S0, gamma, beta, _, _ = inputs(*shape, torch.float32, "cuda", seed=layer)
        S, K, V = int8_state(*shape, SLOTS, inner, S0, "cuda")
        layers.append((*(t.bfloat16() for t in (q, k, v, lr)), S0, gamma.bfloat16(), beta.bfloat16(), S, K, V))
    return layers


def us_per_call(launch, layers, eta, inner, warps) -> float:
    """Microseconds a call, the layers' calls back to back in a CUDA graph (`bench.time_rotating_ms`)."""
    calls = [lambda args=args: launch(args, eta, inner, warps) for args in layers]
    return time_rotating_ms(calls)[0] * 1e3


def numbers(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="1x16x96", help="BxHxD: batch, heads, head size (760m: 1x16x96)")
    parser.add_argument("--warps", type=numbers, default=[8, 16, 32])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    shape = tuple(int(x) for x in args.shape.split("x"))
    eta = torch.ones(SLOTS, device="cuda") / torch.arange(1, SLOTS + 1, device="cuda")
    rows = {}
    for kind, launch in (("float", launch_float), ("int8", launch_int8)):
        for inner in (3, SLOTS - 1):  # inside a mini-batch, and its last token (the commit)
            layers = {w: layers_of(kind, inner, shape) for w in args.warps}
            first = None
            for w in args.warps:
                out = launch([t.clone() for t in layers[w][0]], eta, inner, w).float()
                first = out if first is None else first
                rows[f"{kind} inner {inner} warps {w}"] = {"rel_diff_vs_first": ((out - first).norm() / first.norm()).item(),
                                                           "us_per_call": []}
            for _ in range(args.rounds):  # the warps in turns
                for w in args.warps:
                    rows[f"{kind} inner {inner} warps {w}"]["us_per_call"].append(
                        us_per_call(launch, layers[w], eta, inner, w))
            chosen = dt.token_warps(next_power_of_2(shape[2]), inner == SLOTS - 1, kind == "int8")
            for w in args.warps:
                row = rows[f"{kind} inner {inner} warps {w}"]
                row["median_us"], row["chosen"] = statistics.median(row["us_per_call"]), w == chosen
                print(f"{kind} state, inner {inner:2d}, {w:2d} warps: {row['median_us']:6.2f} us a call, "
                      f"{row['rel_diff_vs_first']:.1e} from the first{'  (token_warps)' if w == chosen else ''}",
                      flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": shape,
                       "command": " ".join(sys.argv), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
