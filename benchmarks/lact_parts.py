"""Where the LaCT parallel form's time goes at the public 760M layer shape: each part of
`ops.lact.triton.chunk` timed alone on a CUDA GPU (triton's do_bench, L2 flushed, medians).

    python benchmarks/lact_parts.py [--seq-len 32768]

Parts: the feature maps of q and of k (rate folded in), the per-chunk sums (Triton), the scan over
chunks, the output as the Triton pass and as cuBLAS's batched GEMM, the attention as `chunk_attention`
runs it, and the whole `chunk` call; then the launch configurations the autotuners chose.
(benchmarks/results/lact_h200.md has this script's numbers.)
"""

import argparse
import sys

import torch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq-len", type=int, default=32768)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("lact_parts.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    from triton.testing import do_bench

    from lab import kernel_bench as bench
    from edgettt.ops.lact import triton as K

    config = bench.lact_config()
    B, T, dtype, chunk = 1, args.seq_len, torch.bfloat16, config.lact_chunk_size
    H, N, DV, DH = config.num_lact_heads, T // chunk, config.fw_head_dim, config.fw_hidden_dim
    q, k, v, lr, gates, w = bench.lact_inputs(config, B, T, dtype)
    w0, w2, rate = w["0"].to(dtype), w["2"].to(dtype), lr[..., 1, :]
    w1 = w["1"][None].contiguous()
    zero = torch.zeros_like(w1)
    phi_q, keys = K.features(q, w0, w2), K.features(k, w0, w2, rate)
    m, _ = K.chunk_momenta(gates, gates.new_zeros(B, H), chunk)
    U = torch.randn(B * H, N, DV, DH, device="cuda")
    Wc, _ = K._scan(U, w1, zero, zero, m, dtype)

    def state():
        return {"w1": w1.clone(), "g1": zero.clone(), "m1": zero.clone(), "gate": w1.new_zeros(B, H)}

    parts = {
        "features q": lambda: K.features(q, w0, w2),
        "features k": lambda: K.features(k, w0, w2, rate),
        "sums (Triton)": lambda: K._chunk_sums(keys, v, chunk, 0),
        "scan": lambda: K._scan(U, w1, zero, zero, m, dtype),
        "out (Triton)": lambda: K._chunk_output(phi_q, Wc, dtype, chunk, 0),
        "out (cuBLAS bmm)": lambda: torch.bmm(phi_q.view(-1, chunk, DH), Wc.view(-1, DV, DH).transpose(1, 2)),
        "attention (as chunk_attention runs it)": lambda: K.chunk_attention(phi_q, keys, v, w1, zero, zero, m, chunk),
        "whole chunk()": lambda: K.chunk(state(), {"0": w0, "2": w2}, config, None, q, k, v, lr, gates, 0),
    }
    for name, fn in parts.items():
        print(f"{name:40s} {do_bench(fn, warmup=20, rep=200, return_mode='median'):.4f} ms", flush=True)
    for name, tuner in (("features", K._low_rank_features_kernel), ("sums", K._chunk_sums_kernel),
                        ("out", K._chunk_out_kernel)):
        print(f"{name} autotuned:", [str(c) for c in tuner.cache.values()])
    return 0


if __name__ == "__main__":
    sys.exit(main())
