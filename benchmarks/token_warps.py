"""The decode token kernels (`kernels.decode_token`: float state, int8 state) at the 760m preset's heads (batch 1,
16 heads of d = 96) launched with 8, 16 and 32 warps: each launch's output against the 8-warp one, and
microseconds a call, 24 layers' calls (each its own state) in a CUDA graph (`bench.time_rotating_ms`: the median
of its replays).

    python benchmarks/token_warps.py --json benchmarks/results/token_warps_760m_h200.json

Why: compiled offline for sm_90a (`kernel_resources.py`), the float kernel at d = 96 takes 255 registers and
spills 384 bytes with 8 warps, 128 and 264 with 16, 64 and 192 with 32: more warps, fewer registers a thread.
Inputs are the kernel tests' (`tests/kernels/test_decode_token.py`: `inputs`, `int8_state`). Results:
benchmarks/results/compiled_decode_h200.md, run 16.
"""

import argparse
import json
import math
import sys
from pathlib import Path

import torch

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path[:0] = [str(TESTS / "kernels"), str(TESTS)]  # the kernel tests and their conftest
from test_decode_token import inputs, int8_state  # noqa: E402

from edgettt.bench import time_rotating_ms  # noqa: E402
from edgettt.kernels import decode_token as dt, next_power_of_2  # noqa: E402
from edgettt.quant.state_formats import FINE_STEPS, STATE_CLIP  # noqa: E402

B, H, D, LAYERS, SLOTS = 1, 16, 96, 24, 16


def launch_float(args, eta, inner, warps):
    q, k, v, lr, S0, gamma, beta, S, A = args
    out = torch.empty_like(q)
    dt._decode_token_kernel[(B * H,)](q, k, v, lr, S0, gamma, beta, S, A, out, eta, eta, inner, SLOTS - 1, H, D,
                                      math.log2(10000.0), dt.LN_EPS, COMMIT=inner == SLOTS - 1, AT_STATE=False,
                                      BLOCK_D=next_power_of_2(D), DECAY=False, num_warps=warps)
    return out


def launch_int8(args, eta, inner, warps):
    q, k, v, lr, S0, gamma, beta, S, K, V = args
    out = torch.empty_like(q)
    dt._decode_token_int8_kernel[(B * H,)](q, k, v, lr, S0, gamma, beta, S, K, V, out, eta, eta, inner, SLOTS - 1, H,
                                           D, SLOTS, math.log2(10000.0), dt.LN_EPS, STATE_CLIP=STATE_CLIP,
                                           FINE=FINE_STEPS, COMMIT=inner == SLOTS - 1, AT_STATE=False,
                                           BLOCK_D=next_power_of_2(D), MINI=SLOTS, DECAY=False, num_warps=warps)
    return out


def layers_of(kind, inner):
    if kind == "float":
        return [inputs(B, H, D, torch.bfloat16, "cuda", seed=layer) for layer in range(LAYERS)]
    layers = []
    for layer in range(LAYERS):
        q, k, v, lr, S0, gamma, beta, _, _ = inputs(B, H, D, torch.float32, "cuda", seed=layer)
        S, K, V = int8_state(B, H, D, SLOTS, inner, S0, "cuda")
        layers.append((*(t.bfloat16() for t in (q, k, v, lr)), S0, gamma.bfloat16(), beta.bfloat16(), S, K, V))
    return layers


def us_per_call(launch, layers, eta, inner, warps) -> float:
    """Microseconds a call, the layers' calls back to back in a CUDA graph (`bench.time_rotating_ms`)."""
    return time_rotating_ms([lambda args=args: launch(args, eta, inner, warps) for args in layers])[0] * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    eta = torch.ones(SLOTS, device="cuda") / torch.arange(1, SLOTS + 1, device="cuda")
    rows = {}
    for kind, launch in (("float", launch_float), ("int8", launch_int8)):
        for inner in (3, SLOTS - 1):  # inside a mini-batch, and its last token (the commit)
            first = None
            for warps in (8, 16, 32):
                layers = layers_of(kind, inner)
                out = launch([t.clone() for t in layers[0]], eta, inner, warps).float()
                first = out if first is None else first
                us = us_per_call(launch, layers, eta, inner, warps)
                diff = ((out - first).norm() / first.norm()).item()
                rows[f"{kind} inner {inner} warps {warps}"] = {"us_per_call": us, "rel_diff_vs_8_warps": diff}
                print(f"{kind} state, inner {inner:2d}, {warps:2d} warps: {us:6.2f} us a call, {diff:.1e} from 8 warps",
                      flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
