"""The kernel benchmark (`python benchmarks/kernel_bench.py --help`): the speed of the Triton kernels against
the references, measured in one run on CUDA.

Three groups of rows, each figure as time, tokens/s, bytes moved per second against the copy
bandwidth measured in the same run, and a ratio against named references of the same run:
- prefill of one TTT-Linear layer operator (q, k, v, lr -> q + LN(Zbar)): the original mini-batch
  scan (`ttt.py`, fp32), the exact and parallel forms in torch and as kernels, and, when
  flash-linear-attention is installed, its `chunk_ttt_linear` and `chunk_linear_attn`;
- the decode step of the state for a batch of sequences: float32 and bfloat16 S and A, int8
  S, and the int8 format (two-level codes with the open mini-batch's keys and values), per token, per
  commit and over a whole mini-batch;
- one decode token through a weight matrix (GEMV, M = 1): fp16 against int8 and int4 (edgettt's
  kernels), bitsandbytes NF4 and LLM.int8 when installed; and the same GEMMs for a prefill block
  (each way of edgettt's GEMM);
- LaCT at the public 760M layer shape: the W1-only parallel form (kernels, torch), the exact form in
  torch, the public code's compiled torch layer (given its file) and fla's chunk_linear_attn /
  chunk_simple_gla at the same head dims; its decode state step.
"""

from __future__ import annotations

import functools
import json
import math
import platform
import statistics
import sys
import time

import click
import torch

from edgettt.cli import POSITIVE, int_list
from edgettt.gpu_timing import copy_bandwidth, time_ms
from edgettt.ops.linear_attention import decode, prefill
from edgettt.ops.quantized import int4, int8

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# ---- timing ---------------------------------------------------------------------------------------

def with_tf32(fn):
    """fn() with torch's float32 matmuls in TF32 (the switch restored after)."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        return fn()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def time_rotating_ms(calls: list, graph: bool = True) -> tuple[float, str]:
    """Time per call of a list of calls over different buffers (together larger than L2), run back to
    back in a CUDA graph, or with events around the eager list (calls that cannot be captured)."""
    def run_all():
        for call in calls:
            call()
    return time_ms(run_all, graph=graph) / len(calls), "cuda graph" if graph else "events"


L2_ROTATION_BYTES = 512 << 20  # rotate inputs over at least this much memory: several times the L2


def copies_for(nbytes: int) -> int:
    return max(2, math.ceil(L2_ROTATION_BYTES / max(nbytes, 1)))


def warm_up(seconds: float = 2.0) -> None:
    """Keep the GPU busy before the first measurement: a GPU that has sat idle runs its first
    milliseconds at lower clocks (the first prefill case of one run took twice as long as in another)."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def same_bytes_copy_ms(moved: int) -> float:
    """Time of a device copy that moves `moved` bytes (half read, half written), its buffers rotating past
    L2 in a CUDA graph as the rows' inputs do: how near the ceiling a kernel that moves this few bytes can
    come at all (a small kernel's launch and ramp are part of its time)."""
    half = max(moved // 2, 1)
    pairs = [(torch.empty(half, dtype=torch.uint8, device="cuda"), torch.empty(half, dtype=torch.uint8, device="cuda"))
             for _ in range(copies_for(moved))]
    return time_rotating_ms([lambda d=d, s=s: d.copy_(s) for s, d in pairs])[0]


def row(group: str, name: str, ms: float, moved: int, ceiling: float, tokens: int, **extra) -> dict:
    return {"group": group, "name": name, "ms": ms, "tokens_per_s": tokens / (ms * 1e-3), "bytes": moved,
            "GBps": moved / (ms * 1e-3) / 1e9, "fraction_of_copy": moved / (ms * 1e-3) / ceiling, **extra}


def add_ratios(rows: list[dict], references: list[str], key: str = "ms", prefix: str = "x ") -> None:
    """rows[i]['x <ref>'] = reference time / row time (> 1: faster than the reference), times under `key`."""
    by_name = {r["name"]: r for r in rows}
    for r in rows:
        for ref in references:
            if key in r and key in by_name.get(ref, {}):
                r[f"{prefix}{ref}"] = by_name[ref][key] / r[key]


# ---- prefill --------------------------------------------------------------------------------------

def prefill_inputs(B, H, T, d, b, dtype, device="cuda"):
    """The layer operator's inputs in the projections' layout ([B, T, H, d] seen as [B, H, T, d])."""
    g = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    q, k, v = (x.to(dtype).transpose(1, 2) for x in g(3, B, T, H, d) / math.sqrt(d) * 2)
    lr = torch.rand(B, H, T, device=device) * (1.0 / d)
    S0 = torch.cat((0.02 * g(H, d, d), torch.zeros(H, 1, d, device=device)), dim=1)
    gamma, beta = torch.ones(H, d, device=device), torch.zeros(H, d, device=device)
    eta = 1.0 / torch.arange(1, b + 1, device=device, dtype=torch.float32)
    return q, k, v, lr, S0, gamma, beta, eta


@functools.lru_cache(maxsize=None)
def _scan_layer(H: int, d: int, b: int, device: str):
    from edgettt.families.ttt.config import ModelConfig
    from edgettt.families.ttt.original import TTTLayer

    return TTTLayer(ModelConfig(hidden_size=H * d, num_attention_heads=H, mini_batch_size=b)).to(device)


def ttt_scan(q, k, v, lr, S0, gamma, beta, eta, b):
    """The original layer's mini-batch scan (`TTTLayer._linear_step`) on the operator's inputs, fp32;
    returns the output and the state. (Its LN parameters are the layer's own: ones and zeros, as
    `prefill_inputs` makes gamma and beta.)"""
    from edgettt.ops import segments

    B, H, T, d = q.shape
    layer = _scan_layer(H, d, b, str(q.device))
    st = {"GW1": torch.zeros(B, H, d, d, device=q.device), "Gb1": torch.zeros(B, H, 1, d, device=q.device)}
    st["W1"], st["b1"] = S0[None, :, :d].expand(B, -1, -1, -1), S0[None, :, d:].expand(B, -1, -1, -1)
    q, k, v, lr = q.float(), k.float(), v.float(), lr.float()
    outs = []
    for offset, count, inner in segments(0, T, b):
        sl = slice(offset, offset + count)
        outs.append(layer._linear_step(st, q[:, :, sl], k[:, :, sl], v[:, :, sl], lr[:, :, sl], eta, inner))
    return torch.cat(outs, dim=2), st


def fla_functions():
    try:
        from fla.ops.linear_attn import chunk_linear_attn
        from fla.ops.ttt import chunk_ttt_linear
    except Exception:  # not installed, or built for another torch/triton
        return None
    return chunk_ttt_linear, chunk_linear_attn


def prefill_rows(B, H, d, T, dtype, ceiling, b=16, references=True) -> list[dict]:
    q, k, v, lr, S0, gamma, beta, eta = prefill_inputs(B, H, T, d, b, dtype)
    args = (q, k, v, lr, S0, gamma, beta, eta)
    io = 4 * q.numel() * q.element_size() + lr.numel() * 4  # q, k, v read, o written, lr read
    shape = dict(B=B, H=H, d=d, T=T, dtype=dtype_name(dtype))
    runs = {"parallel kernel": lambda: prefill.parallel(*args),
            "exact kernel": lambda: prefill.exact(*args)}
    if references:
        runs["parallel torch"] = lambda: prefill.parallel_ref(*args)
        runs["exact torch"] = lambda: prefill.exact_ref(*args)
        runs["ttt mini-batch scan (fp32)"] = lambda: ttt_scan(*args, b)
    if (fla := fla_functions()) is not None:
        chunk_ttt_linear, chunk_linear_attn = fla
        qf, kf, vf = (x.transpose(1, 2) for x in (q, k, v))  # fla's [B, T, H, d], the same memory
        eta_fla = lr.transpose(1, 2)[..., None].to(dtype).contiguous()
        runs["fla chunk_ttt_linear"] = lambda: chunk_ttt_linear(qf, kf, vf, gamma.to(dtype), beta.to(dtype), eta_fla,
                                                                 chunk_size=b)
        runs["fla chunk_linear_attn"] = lambda: chunk_linear_attn(qf, kf, vf, normalize=False)
    rows = []
    for name, fn in runs.items():
        with torch.no_grad():
            rows.append(row("prefill", name, time_ms(fn), io, ceiling, B * T, **shape))
    add_ratios(rows, ["fla chunk_ttt_linear", "fla chunk_linear_attn", "ttt mini-batch scan (fp32)"])
    return rows


# ---- training: the layer operator forward and backward -----------------------------------------------

def train_runs(B, H, T, d, b=16, device="cuda") -> dict:
    """name -> a function running one forward and backward (see train_rows)."""
    from edgettt.ops.linear_attention.train import exact_train

    inputs = prefill_inputs(B, H, T, d, b, torch.float32, device)
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    dout = torch.randn(B, H, T, d, device=device)

    def forward_backward(fn):
        def run():
            for x in leaves:
                x.grad = None
            fn(*leaves)[0].backward(dout)
            return [x.grad for x in leaves]
        return run

    return {"exact kernel (forward + backward)": forward_backward(exact_train),
            "ttt mini-batch scan (autograd)": forward_backward(lambda *x: ttt_scan(*x, b)),
            "exact torch (autograd)": forward_backward(prefill.exact_ref)}


def train_rows(B, H, T, d, ceiling, b=16) -> list[dict]:
    """One TTT-Linear layer operator, forward and backward, fp32 with tf32 dots (as
    recipes/train_tiny.py trains): the exact-form kernel with its backward (ops/linear_attention/train.py) against
    autograd through the original mini-batch scan and through the exact form in torch. Bytes: q, k, v
    read twice, lr and dout read, o, dq, dk, dv written (the least either way). All timed eagerly:
    the recipe captures its whole step in a CUDA graph, which takes the scan's launch gaps away, so
    the recipe's steps per second are the fairer comparison for the scan."""
    runs = train_runs(B, H, T, d, b)
    io = 10 * B * H * T * d * 4 + 2 * B * H * T * 4
    rows = with_tf32(lambda: [row("train", name, time_ms(fn), io, ceiling, B * T, B=B, H=H, d=d, T=T)
                              for name, fn in runs.items()])
    add_ratios(rows, ["ttt mini-batch scan (autograd)"])
    return rows


# ---- decode: the state step --------------------------------------------------------------------------

STATE_KINDS = ("float32", "bfloat16", "int8", "int8")
MINI_BATCH = 16  # the presets' mini-batch size: a commit every 16 tokens


def _state_case(kind, B, H, Dk, Dv, vectors, eta):
    """(make one state set, step(set, inner), bytes a step at `inner` moves) for a state kind: S and A
    in float32 or bfloat16 (`decode_step`); S in int8 at calibrated scales with A in float32
    (`decode_step_int8`, the int8 format); the two-level int8 S with the open mini-batch's
    keys and values in float16 in place of A (`decode_step_int12`, the int8 format)."""
    qa, ka, vh, out = vectors
    elements, heads = B * H * Dk * Dv, B * H
    shared = H * Dk * Dv * 4  # S0, read once by the whole batch
    if kind == "int8":
        S0 = torch.randn(H, Dk, Dv, device="cuda")

        def make():
            kv = [torch.randn(B, H, MINI_BATCH, D, device="cuda").half() for D in (Dk, Dv)]
            return (torch.randint(-127, 128, (B, H, Dk, Dv), device="cuda", dtype=torch.int8),
                    torch.randint(0, 256, (B, H, Dk, Dv // 2), device="cuda", dtype=torch.uint8),
                    torch.rand(B, H, Dk, device="cuda") * 0.01, S0, *kv)

        def moved(inner):
            codes = elements * 3 // 2 + heads * Dk * 4  # c8, c4 and the row steps
            slots = heads * (Dk + Dv) * 2
            return codes * (2 if inner == MINI_BATCH - 1 else 1) + slots * (inner + 1) + shared
        return make, lambda st, i: decode.decode_step_int12(qa, ka, vh, *st, eta, i, out=out), moved
    if kind == "int8":
        S0, scale = torch.randn(H, Dk, Dv, device="cuda"), torch.rand(H, Dk, device="cuda") * 0.01 + 1e-3

        def make():
            return (torch.randint(-127, 128, (B, H, Dk, Dv), device="cuda", dtype=torch.int8),
                    torch.randn(B, H, Dk, Dv, device="cuda"))

        def moved(inner):
            return elements * ((2 if inner == MINI_BATCH - 1 else 1) + 2 * 4) + shared + H * Dk * 4
        return make, lambda st, i: decode.decode_step_int8(qa, ka, vh, st[0], scale, S0, st[1], eta, i, out=out), moved
    dt = getattr(torch, kind)

    def make():
        return tuple(torch.randn(B, H, Dk, Dv, device="cuda", dtype=dt) for _ in range(2))

    def moved(inner):
        return elements * dt.itemsize * ((2 if inner == MINI_BATCH - 1 else 1) + 2)
    return make, lambda st, i: decode.decode_step(qa, ka, vh, *st, eta, i, out=out), moved


def state_step_rows(B, H, d, dtype, ceiling) -> list[dict]:
    """One decode token of one layer's state for B sequences (vectors qa, ka, vh in `dtype`), for each
    of `STATE_KINDS`: a token inside a mini-batch, the token that ends it (commit), and the mean over a
    whole mini-batch of 16 tokens (commit included: what decoding costs). State sets rotate past L2."""
    Dk, Dv = d + 1, d
    g = lambda *s: torch.randn(*s, device="cuda", dtype=dtype)  # noqa: E731
    vectors = (g(B, H, Dk), g(B, H, Dk), g(B, H, Dv), torch.empty(B, H, Dv, device="cuda"))
    eta = 1.0 / torch.arange(1, MINI_BATCH + 1, device="cuda", dtype=torch.float32)
    vector_bytes = B * H * (2 * Dk + Dv) * dtype.itemsize + B * H * Dv * 4
    rows = []
    for kind in STATE_KINDS:
        make, step, moved = _state_case(kind, B, H, Dk, Dv, vectors, eta)
        sets = [make() for _ in range(copies_for(moved(MINI_BATCH - 1) * 2))]
        cases = [("", [3]), (" commit", [MINI_BATCH - 1]), (" mini-batch", list(range(MINI_BATCH)))]
        for suffix, inners in cases:
            calls = [lambda st=st, i=i: step(st, i) for i in inners for st in sets]  # each set once a sweep
            ms, timing = time_rotating_ms(calls)
            bytes_moved = statistics.mean(moved(i) for i in inners) + vector_bytes
            rows.append(row("decode state", f"state {kind}{suffix}", ms, bytes_moved, ceiling, B, B=B, H=H, d=d,
                            state=kind, case=suffix.strip() or "token", bytes_per_token=bytes_moved / B, timing=timing))
        del sets
    float_ms = {r["case"]: r["ms"] for r in rows if r["state"] == "float32"}
    for r in rows:  # each case against the float32 state's same case
        r["x float32"] = float_ms[r["case"]] / r["ms"]
    int8 = next(r for r in rows if r["name"] == "state int8 mini-batch")
    rows.append(row("decode state", "copy (int8 mini-batch bytes)", same_bytes_copy_ms(int8["bytes"]), int8["bytes"],
                    ceiling, B, B=B, H=H, d=d, state="copy", case="mini-batch", timing="cuda graph"))
    return rows


# ---- LaCT: the W1-only parallel form at the paper's layer shape --------------------------------------------

LACT_760M = dict(hidden_size=1536, num_attn_heads=24, num_lact_heads=4, inter_multi=1, lact_chunk_size=2048,
                 window_size=2048, use_momentum=True, lr_dim=1, use_muon=False, w0_w2_low_rank=32,
                 fw_init_gain=0.5)  # the public 760M config's layer


def lact_config(**changes):
    from edgettt.families.lact.config import LaCTConfig

    return LaCTConfig(**{**LACT_760M, "lact_update_w0_w2": False, "lact_weight_norm": False, "form": "parallel",
                         **changes})


def lact_inputs(config, B: int, T: int, dtype, device="cuda"):
    """The fast-weight operator's inputs as the layer hands them over: q, k through silu and the l2 norm,
    heads of [B, T, C] tensors; three learning rates a token; momentum gates; the initial weights (W0, W2
    as `LowRank` factors when the config's are low-rank)."""
    H, d, dh = config.num_lact_heads, config.fw_head_dim, config.fw_hidden_dim
    heads = lambda x: x.reshape(B, T, H, d).transpose(1, 2)  # noqa: E731
    q, k = (heads(torch.nn.functional.normalize(torch.nn.functional.silu(torch.randn(B, T, H, d, device=device)), dim=-1)
                  .reshape(B, T, H * d)).to(dtype) for _ in range(2))
    v = heads(torch.randn(B, T, H * d, device=device).to(dtype))
    lr = torch.rand(B, H, T, 3, 1, device=device) * 2e-3
    gates = torch.sigmoid(torch.randn(B, H, T, device=device))
    w0, w2 = (initial_w0_w2(config, device) for _ in range(2))
    w1 = torch.randn(H, d, dh, device=device) / math.sqrt(dh)
    return q, k, v, lr, gates, {"0": w0, "1": w1, "2": w2}


def initial_w0_w2(config, device):
    """A random initial W0 or W2 as the model draws it: dense, or low-rank factors (`LowRank`)."""
    from edgettt.families.lact.model import LowRankFastWeight

    H, d, dh, r = config.num_lact_heads, config.fw_head_dim, config.fw_hidden_dim, config.w0_w2_low_rank
    if r <= 0:
        return torch.randn(H, dh, d, device=device) / math.sqrt(d)
    drawn = LowRankFastWeight(H, dh, d, r, config.fw_init_gain).to(device).factors()
    return type(drawn)(drawn.left.detach(), drawn.right.detach())


def dense(w):
    """A fast weight as a matrix (`LowRank` factors multiplied out)."""
    return w.dense() if hasattr(w, "dense") else w


def load_public_lact(path):
    """The public LaCT code's `ttt_operation.py` (a file of the LaCT repository, given by the user)."""
    import importlib.util
    from pathlib import Path

    file = Path(path)
    file = file / "ttt_operation.py" if file.is_dir() else file
    spec = importlib.util.spec_from_file_location("lact_public_ttt_operation", file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (torch.compile looks its functions' module up by name)
    spec.loader.exec_module(module)
    return module


def lact_runs(B: int, T: int, dtype, lact_code=None, references=True, device="cuda", **shape) -> dict:
    """name -> a function computing the fast-weight operator of one 760M-shaped LaCT layer (or one
    of another `shape`: LaCTConfig keys, for tests)."""
    from edgettt.ops.lact import triton as lact_kernels
    from edgettt.ops.lact import fast_weights, parallel as linear_attention

    config = lact_config(**shape)
    q, k, v, lr, gates, weights = lact_inputs(config, B, T, dtype, device)
    H = config.num_lact_heads
    fixed = {i: weights[i].to(dtype) for i in "02"}  # (W0, W2 as a model in `dtype` holds them)
    fixed_dense = {i: dense(w) for i, w in fixed.items()}  # (the product formed: what a full-rank config runs)

    def state():
        w1 = weights["1"][None].expand(B, -1, -1, -1).contiguous()
        return {"w1": w1, "g1": torch.zeros_like(w1), "m1": torch.zeros_like(w1), "gate": w1.new_zeros(B, H)}

    def parallel():
        return lact_kernels.chunk(state(), fixed, config, None, q, k, v, lr, gates, 0)

    phi_q, keys = lact_kernels.features(q, fixed["0"], fixed["2"]), lact_kernels.features(k, fixed["0"], fixed["2"], lr[..., 1, :])
    m = torch.rand(B, H, lact_kernels.chunk_count(0, T, config.lact_chunk_size), device=device) * 0.9 + 0.05
    st = state()
    runs = {"parallel kernels (W1-only)": parallel}  # (low-rank W0, W2 as their factors: the config's)
    if config.w0_w2_low_rank > 0:  # the same with the product formed: what a full-rank config costs
        runs["parallel kernels (W1-only), dense W0/W2"] = \
            lambda: lact_kernels.chunk(state(), fixed_dense, config, None, q, k, v, lr, gates, 0)
    runs["parallel kernels, attention alone (features given)"] = \
        lambda: lact_kernels.chunk_attention(phi_q, keys, v, st["w1"], st["g1"], st["m1"], m, config.lact_chunk_size)
    if references:
        def parallel_torch():
            return linear_attention.chunk(state(), fixed, config, None, q.float(), k.float(), v.float(), lr, gates, 0)

        def exact_torch():
            fixed32 = {i: w.float() for i, w in fixed_dense.items()}
            return fast_weights.exact(state(), fixed32, config, None, q.float(), k.float(), v.float(), lr, gates, 0)
        runs["parallel torch (fp32)"] = parallel_torch
        runs["exact torch, W1-only (fp32)"] = exact_torch
    if lact_code is not None:
        public = load_public_lact(lact_code)
        pq, pk, pv = (x.contiguous().reshape(B * H, T, -1) for x in (q, k, v))  # its [B * heads, T, d]
        lrs = [lr[..., i, :].reshape(B * H, T, 1).contiguous() for i in range(3)]
        mom = gates.reshape(B * H, T, 1).contiguous()
        w = {i: dense(weights[i]) for i in "012"}
        w = {i: w[i][None].expand(B, -1, -1, -1).reshape(B * H, *w[i].shape[1:]).contiguous() for i in "012"}
        call = lambda: public.block_causal_lact_swiglu(  # noqa: E731
            w["0"], w["1"], w["2"], pq, pk, pv, *lrs, chunk_size=config.lact_chunk_size, use_muon=False, momentum=mom)
        runs[PUBLIC_LACT] = call  # float32 fast weights, q, k, v in `dtype`: as the public layer hands them over
        if device == "cuda":  # its matmuls' precision is the caller's: the modes a training script would set
            runs[f"{PUBLIC_LACT}, TF32 matmuls"] = lambda: with_tf32(call)
            runs[f"{PUBLIC_LACT}, bf16 autocast"] = lambda: with_autocast(call)
    if device == "cuda" and (fla := fla_lact_functions()) is not None:
        chunk_linear_attn, chunk_simple_gla = fla
        fq, fk, fv = (x.transpose(1, 2).contiguous() for x in (phi_q, keys, v))  # [B, T, H, d]
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device=device) + 4)
        runs["fla chunk_linear_attn (same dims)"] = lambda: chunk_linear_attn(fq, fk, fv, normalize=False)
        runs["fla chunk_simple_gla (same dims)"] = lambda: chunk_simple_gla(fq, fk, fv, g=g)
    return runs


PUBLIC_LACT = "public LaCT torch layer (full update, compiled)"
PUBLIC_LACT_BEST = "public LaCT torch layer (its fastest mode)"


def with_autocast(fn):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return fn()


def fla_lact_functions():
    try:
        from fla.ops.linear_attn import chunk_linear_attn
        from fla.ops.simple_gla import chunk_simple_gla
    except Exception:  # not installed, or built for another torch/triton
        return None
    return chunk_linear_attn, chunk_simple_gla


def lact_rows(B: int, T: int, dtype, ceiling, lact_code=None, references=True) -> list[dict]:
    """The fast-weight operator of one LaCT layer at the public 760M shape (4 heads of 384, chunks of
    2048, momentum): q, k, v, lr, gates -> output. Bytes: q, k, v read, output written, rates and
    gates read."""
    config = lact_config()
    H, d = config.num_lact_heads, config.fw_head_dim
    io = 4 * B * T * H * d * dtype.itemsize + B * H * T * 4 * 4
    rows = []
    for name, fn in lact_runs(B, T, dtype, lact_code, references).items():
        with torch.no_grad():
            try:
                ms = time_ms(fn)
            except Exception as err:  # a reference that cannot run this shape: say so in the table
                rows.append({"group": "LaCT layer", "name": name, "error": str(err).splitlines()[0][:200], "B": B, "T": T})
                continue
            rows.append(row("LaCT layer", name, ms, io, ceiling, B * T, B=B, T=T, H=H, d=d, dtype=dtype_name(dtype)))
            if "(fp32)" not in name:  # the GPU's time alone: replays of a captured CUDA graph (no launch gaps)
                rows[-1]["graph_ms"] = time_ms(fn, graph=True)
    add_fastest(rows, PUBLIC_LACT, PUBLIC_LACT_BEST)
    references = [PUBLIC_LACT_BEST, "fla chunk_linear_attn (same dims)", "parallel torch (fp32)"]
    add_ratios(rows, references)
    add_ratios(rows, references[:2], key="graph_ms", prefix="graph x ")
    return rows


def add_fastest(rows: list[dict], prefix: str, name: str) -> None:
    """A row `name`: the fastest (as called) of the rows whose names start with `prefix`, with the least
    graph time among them: the reference a ratio should take (a baseline at its best)."""
    timed = [r for r in rows if r["name"].startswith(prefix) and "ms" in r]
    if timed:
        best = {**min(timed, key=lambda r: r["ms"]), "name": name, "of": [r["name"] for r in timed]}
        graphs = [r["graph_ms"] for r in timed if "graph_ms" in r]
        if graphs:
            best["graph_ms"] = min(graphs)
        rows.append(best)


def lact_decode_rows(B: int, dtype, ceiling) -> list[dict]:
    """One decode token of a 760M-shaped LaCT layer's fast-weight state for B sequences: the feature
    map of q and k, then the state step (W1 read, the chunk's running sums read and written; at the
    chunk's last token also the momentum buffer and W1 written). States rotate past L2."""
    from edgettt.ops.lact import triton as lact_kernels

    config = lact_config()
    H, d, dh = config.num_lact_heads, config.fw_head_dim, config.fw_hidden_dim
    q, k, v, lr, gates, weights = lact_inputs(config, B, 1, dtype)
    weights = {i: weights[i].to(dtype) for i in "02"}  # (as a model in `dtype` holds them)
    phi_q, key = (lact_kernels.features(x, weights["0"], weights["2"])[:, :, 0].contiguous() for x in (q, k))
    v1 = v[:, :, 0].contiguous()
    m = torch.rand(B, H, device="cuda")
    elements = B * H * d * dh
    sets = [[torch.randn(B, H, d, dh, device="cuda") for _ in range(3)] for _ in range(copies_for(elements * 12))]
    rows = []
    for commit in (False, True):
        calls = [lambda s=s: lact_kernels.decode_step(phi_q, key, v1, s[0], s[1], s[2], m, commit) for s in sets]
        ms, timing = time_rotating_ms(calls)
        moved = elements * 4 * (6 if commit else 3) + B * H * (2 * dh + 2 * d) * dtype.itemsize
        rows.append(row("LaCT decode state", "state step" + (" commit" if commit else ""), ms, moved, ceiling, B,
                        B=B, H=H, d=d, bytes_per_token=moved / B, timing=timing))
    def whole_step(s, commit):
        phi_q = lact_kernels.features(q, weights["0"], weights["2"])[:, :, 0]
        key = lact_kernels.features(k, weights["0"], weights["2"], lr[..., 1, :])[:, :, 0]
        return lact_kernels.decode_step(phi_q, key, v1, s[0], s[1], s[2], m, commit)
    for commit in (False, True):
        ms, timing = time_rotating_ms([lambda s=s: whole_step(s, commit) for s in sets])
        moved = (elements * 4 * (6 if commit else 3) + weights["0"].nbytes + weights["2"].nbytes
                 + B * H * (4 * dh + 3 * d) * dtype.itemsize)
        rows.append(row("LaCT decode state", "feature maps + state step" + (" commit" if commit else ""), ms, moved,
                        ceiling, B, B=B, H=H, d=d, bytes_per_token=moved / B, timing=timing))
    del sets
    return rows


# ---- weights: GEMV and GEMM ---------------------------------------------------------------------------

GEMV_WAY_MAX_ROWS = 64  # up to here a GEMM row also times the GEMV kernel a row (`gemm="gemv"`)


def weight_variants(N, K, dtype, group=64, gemm_variants=False, gemv_way=False) -> dict:
    """name -> (make a copy of the stored weight, matmul(x, copy), bytes of one copy, capturable in a
    CUDA graph)."""
    from edgettt.quant.weight_formats import weight_format

    w = torch.randn(N, K, device="cuda") * 0.02
    dt_name = dtype_name(dtype)
    t = weight_format("int4").quantize(w, group)
    packed = (t["qweight"], t["scales"], t["zero_points"])
    t8 = weight_format("int8").quantize(w, group)
    per_channel = (t8["qweight"], t8["scales"])
    variants = {f"{dt_name} (torch.matmul)": (lambda: w.to(dtype), lambda x, c: x @ c.T, N * K * dtype.itemsize, True)}
    # a GEMV runs one kernel; a GEMM each of the ways `gemm` picks (the kernels' docstrings name the default)
    ways = [("fused", "edgettt fused"), ("swapped", "edgettt W x^T"), ("dequantize", "dequantize + cuBLAS"),
            ("a8", "edgettt, int8 activations")] + ([("gemv", "edgettt GEMV a row")] if gemv_way else [])
    for gemm, how in (ways if gemm_variants else [(None, "edgettt kernel")]):
        picked = {} if gemm is None else {"gemm": gemm}
        variants[f"int8 per-channel ({how})"] = (lambda: tuple(p.clone() for p in per_channel),
                                                 lambda x, c, picked=picked: int8.int8_matmul(x, *c, **picked),
                                                 sum(p.nbytes for p in per_channel), True)
        variants[f"int4 g{group} ({how})"] = (lambda: tuple(p.clone() for p in packed),
                                              lambda x, c, picked=picked: int4.int4_matmul(x, *c, **picked),
                                              sum(p.nbytes for p in packed), True)
    try:
        import bitsandbytes as bnb
        import bitsandbytes.functional as bnbf

        qw, qs = bnbf.quantize_4bit(w.to(dtype), blocksize=64, quant_type="nf4", compress_statistics=False)
        variants["nf4 b64 (bitsandbytes)"] = (lambda: (qw.clone(), qs), lambda x, c: bnb.matmul_4bit(x, c[0].t(), quant_state=c[1]),
                                              qw.nbytes + qs.absmax.nbytes, True)
        if dtype == torch.float16:
            cb, scb, _ = bnbf.int8_vectorwise_quant(w.half())

            def llm_int8(x, c):
                state = bnb.MatmulLtState()
                state.CB, state.SCB, state.threshold, state.has_fp16_weights = c[0], c[1], 6.0, False
                return bnb.matmul(x, c[0], state=state)
            # its outlier search synchronises: timed eagerly
            variants["int8 LLM.int8 (bitsandbytes)"] = (lambda: (cb.clone(), scb), llm_int8, cb.nbytes + scb.nbytes, False)
    except Exception:  # not installed, or no CUDA backend
        pass
    return variants


def weight_rows(N, K, M, dtype, ceiling) -> list[dict]:
    """x [M, K] through one weight matrix [N, K] stored in each format; weight copies rotate past L2."""
    x = torch.randn(M, K, device="cuda", dtype=dtype)
    act = M * (K + N) * dtype.itemsize
    few = M <= GEMV_WAY_MAX_ROWS  # a decode step's rows: its weights stream from memory as a GEMV's do
    group_name = "decode GEMV (M=1)" if M == 1 else f"{'few-row' if few else 'prefill'} GEMM (M={M})"
    rows = []
    gemm = M > int4.GEMV_MAX_ROWS
    variants = weight_variants(N, K, dtype, gemm_variants=gemm, gemv_way=gemm and few)
    for name, (copy, matmul, nbytes, capturable) in variants.items():
        copies = [copy() for _ in range(copies_for(nbytes) if few else 2)]
        ms, timing = time_rotating_ms([lambda c=c: matmul(x, c) for c in copies], capturable)
        rows.append(row(group_name, name, ms, nbytes + act, ceiling, M, N=N, K=K, M=M, weight_bytes=nbytes,
                        bits_per_weight=8 * nbytes / (N * K), timing=timing))
        del copies
    dt_name = dtype_name(dtype)
    add_ratios(rows, [f"{dt_name} (torch.matmul)", "nf4 b64 (bitsandbytes)"])
    return rows


# ---- the whole run -------------------------------------------------------------------------------------

def run(seq_lens, batch, heads, head_dim, dtype, decode_batch, gemv_shapes, references=True, progress=None,
        train_shapes=(), lact_seq_lens=(), lact_batch=1, lact_code=None, gemm_rows=(2048,)) -> dict:
    """Every row of the benchmark, with the run's device, versions and copy ceiling."""
    import triton

    # the copy first, then the warm-up right before the first case: measured the other way round, the
    # T=8192 prefill rows (autotuned kernels, ours and fla's) came out 1.4-2.7x slower than alone,
    # differently each run (benchmarks/results/bench_h200.md)
    ceiling = copy_bandwidth()
    warm_up()
    jobs = [("prefill", T) for T in seq_lens] + [("state", B) for B in decode_batch] + \
           [("weights", s) for s in gemv_shapes] + [("train", s) for s in train_shapes] + \
           [("lact", T) for T in lact_seq_lens] + [("lact decode", B) for B in (decode_batch if lact_seq_lens else ())]
    rows = []
    for kind, arg in (progress(jobs) if progress else jobs):
        if kind == "prefill":
            rows += prefill_rows(batch, heads, head_dim, arg, dtype, ceiling, references=references and arg <= 8192)
        elif kind == "state":
            rows += state_step_rows(arg, heads, head_dim, dtype, ceiling)
        elif kind == "train":
            rows += train_rows(*arg, ceiling)
        elif kind == "lact":
            rows += lact_rows(lact_batch, arg, dtype, ceiling, lact_code, references)
        elif kind == "lact decode":
            rows += lact_decode_rows(arg, dtype, ceiling)
        else:
            N, K = arg
            rows += weight_rows(N, K, 1, dtype, ceiling)
            for M in gemm_rows:
                rows += weight_rows(N, K, M, dtype, ceiling)
        torch.cuda.empty_cache()
    try:
        import fla
        fla_version = getattr(fla, "__version__", "installed")
    except Exception:
        fla_version = None
    try:
        import bitsandbytes
        bnb_version = bitsandbytes.__version__
    except Exception:
        bnb_version = None
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "flash-linear-attention": fla_version, "bitsandbytes": bnb_version,
            "copy_bandwidth_GBps": ceiling / 1e9}
    return {"meta": meta, "rows": rows}


def table(result: dict) -> str:
    """Markdown tables, one per group, with the ratio columns each group has."""
    lines = []
    groups = list(dict.fromkeys(r["group"] for r in result["rows"]))
    for group in groups:
        rows = [r for r in result["rows"] if r["group"] == group]
        ratio_cols = list(dict.fromkeys(c for r in rows for c in r if c.startswith(("x ", "graph x "))))
        shape_cols = [c for c in ("T", "B", "N", "K") if c in rows[0]]
        graph_col = ["graph ms"] if any("graph_ms" in r for r in rows) else []
        head = shape_cols + ["name", "ms"] + graph_col + ["tokens/s", "GB/s", "of copy"] + ratio_cols
        lines += [f"\n### {group}\n", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in rows:
            if "error" in r:
                lines.append("| " + " | ".join([str(r.get(c, "")) for c in shape_cols] + [r["name"], "failed: " + r["error"]]) + " |")
                continue
            graph = [f"{r['graph_ms']:.4g}" if "graph_ms" in r else ""] if graph_col else []
            cells = [str(r[c]) for c in shape_cols] + [r["name"], f"{r['ms']:.4g}"] + graph + [
                f"{r['tokens_per_s']:.3g}", f"{r['GBps']:.0f}", f"{r['fraction_of_copy']:.1%}"]
            cells += [f"{r[c]:.2f}x" if c in r else "" for c in ratio_cols]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def shape_list(ctx, param, value):
    """Comma-separated shapes AxB... with as many dimensions as the option's default has."""
    dims = len(param.default.split(",")[0].split("x"))
    example = param.default
    try:
        shapes = [tuple(int(n) for n in v.split("x")) for v in value.split(",") if v]
    except ValueError:
        shapes = None
    if shapes is None or any(len(s) != dims or min(s) < 1 for s in shapes):
        names = "NxK" if dims == 2 else "x".join("BHTd"[:dims])
        raise click.BadParameter(f"{value!r}: expected {names} shapes, e.g. {example}")
    return shapes


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--seq-lens", default="8192,32768", show_default=True, callback=int_list,
              help="Prefill lengths T (comma-separated).")
@click.option("--batch", default=4, show_default=True, type=POSITIVE, help="Prefill batch B.")
@click.option("--heads", default=16, show_default=True, type=POSITIVE)
@click.option("--head-dim", default=64, show_default=True, type=POSITIVE)
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True)
@click.option("--decode-batch", default="64,256", show_default=True, callback=int_list,
              help="Sequences per decode step (comma-separated).")
@click.option("--gemv", default="4096x4096,11008x4096", show_default=True, callback=shape_list,
              help="Weight shapes NxK for the GEMV (M=1) and GEMM rows.")
@click.option("--gemm-rows", default="2048", show_default=True, callback=int_list,
              help="Rows M of the GEMM rows (comma-separated; e.g. 16,2048: a batch-16 decode step's products "
                   "and a prefill block's). Up to 64 rows the GEMV kernel a row is timed too.")
@click.option("--train", "train_shapes", default="256x4x512x48", show_default=True, callback=shape_list,
              help="BxHxTxd shapes for the training rows (the tiny models' training step by default; '' skips).")
@click.option("--lact-seq-lens", default="32768", show_default=True, callback=int_list,
              help="LaCT rows (the public 760M layer shape): prefill lengths ('' skips LaCT).")
@click.option("--lact-batch", default=1, show_default=True, type=POSITIVE, help="Batch of the LaCT prefill rows.")
@click.option("--lact-code", default=None, type=click.Path(exists=True, dir_okay=True),
              help="The public LaCT code's ttt_operation.py (or its folder): adds its compiled torch layer as rows, "
                   "one for each matmul precision its caller may set (float32 weights as handed over, TF32, "
                   "bf16 autocast), and takes ratios against the fastest.")
@click.option("--no-references", is_flag=True, help="Skip the slow torch references (the kernels and fla only).")
@click.option("--json", "json_path", default=None, type=click.Path(), help="Write every row here.")
@click.option("--markdown", "md_path", default=None, type=click.Path(), help="Write the tables here.")
@click.option("--force", is_flag=True, help="Overwrite the output files.")
def main(seq_lens, batch, heads, head_dim, dtype, decode_batch, gemv, gemm_rows, train_shapes, lact_seq_lens,
          lact_batch, lact_code, no_references, json_path, md_path, force):
    """Speed of the Triton kernels on a CUDA GPU against the references measured in the same run.

    \b
    prefill  one TTT-Linear layer operator (q, k, v, lr -> q + LN(Zbar)): the original mini-batch
             scan (fp32, T <= 8192), the exact and parallel forms in torch and as kernels, and
             flash-linear-attention's chunk_ttt_linear / chunk_linear_attn when installed
    decode   the state step for a batch of sequences: S and A in float32 and bfloat16, int8
             S, and the int8 format (two-level codes, the open mini-batch's keys and values): a
             token, a commit, and the mean over a mini-batch of 16
    weights  one token through a weight matrix (GEMV) and blocks of --gemm-rows tokens (GEMM): float
             against edgettt's int8 and int4 kernels (each way of the GEMM: fused, W x^T, dequantize +
             cuBLAS, int8 activations; up to 64 rows the GEMV kernel a row too), bitsandbytes NF4 and
             LLM.int8 when installed
    train    one TTT-Linear layer operator, forward and backward (fp32, tf32 dots): the exact-form
             kernel with its backward against autograd through the mini-batch scan
    lact     LaCT's fast-weight operator at the public 760M layer shape (4 heads of 384, chunks of
             2048, momentum): the W1-only parallel form as kernels and in torch, the exact form in
             torch, the public code's compiled layer (--lact-code; its fastest matmul mode is the
             reference), fla at the same head dims; and its decode state step at each --decode-batch

    Every row: time, tokens/s, bytes moved per second and its fraction of the device-to-device copy
    bandwidth measured in the same run, and ratios against the references (x > 1: faster).
    """
    import torch

    from edgettt.outputs import plan_outputs

    json_out, md_out = plan_outputs((json_path, "json", force, "--json"), (md_path, "markdown", force, "--markdown"))
    if not torch.cuda.is_available():
        raise click.ClickException("benchmarks/kernel_bench.py needs a CUDA GPU (torch.cuda.is_available() is False); run it on a machine with one")
    from edgettt.progress import bar

    result = run(seq_lens, batch, heads, head_dim, DTYPES[dtype], decode_batch, gemv,
                           references=not no_references, progress=lambda jobs: bar(jobs, desc="bench", unit="case"),
                           train_shapes=train_shapes, lact_seq_lens=lact_seq_lens, lact_batch=lact_batch,
                           lact_code=lact_code, gemm_rows=gemm_rows)
    meta = result["meta"]
    header = (f"{meta['device']}, torch {meta['torch']}, triton {meta['triton']}, copy ceiling "
              f"{meta['copy_bandwidth_GBps']:.0f} GB/s; fla {meta['flash-linear-attention']}, "
              f"bitsandbytes {meta['bitsandbytes']}")
    tables = table(result)
    click.echo(header + "\n" + tables)
    if json_out:
        with json_out.write() as tmp:
            tmp.write_text(json.dumps(result, indent=2) + "\n")
    if md_out:
        with md_out.write() as tmp:
            tmp.write_text(header + "\n" + tables + "\n")


if __name__ == "__main__":
    main()
