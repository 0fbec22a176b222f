"""Ways to keep TTT's accumulated state S in 8 bits, measured against each other on one model.

Each option is a rounding applied at every mini-batch commit in place of the int8 state's (the
layers' `requantizer`), on the exact form of a shipped model calibrated as `edgettt calibrate` does,
against the float state's logits on held-out text: KLD mean, KLD in the last eighth of the window, and
the decode state's bytes a sequence (everything kept between tokens) against the float state's. Some
options keep memory across commits (a rounding residual): it lives in the option's closure, reset for
each window (windows run one at a time from a fresh state).

    python benchmarks/state_options.py --model ttt-linear-tiny --ctx 8192 --max-tokens 32768 \
        --json benchmarks/results/state_options.json --markdown benchmarks/results/state_options.md

Options (S0 the learned initial state; `step` the calibrated int8 row step of the position's bucket):
    int8              round((S - S0) / step), the current `--state int8`
    int8-stochastic   the same with stochastic rounding (unbiased; fixed seed)
    int8-dynamic      the row step recomputed at each commit from the state itself (max |S - S0| / 127)
    int8-every-4      rounded at every 4th commit only, float between (the float S is then kept too)
    int8-ef-float     error feedback: the rounding residual added back before the next rounding, the
                      residual kept in float32 (an upper bound on what feedback gives)
    int8-ef-int4      error feedback with the residual itself in 4 bits (steps of step / 16)
    int8-dynamic-2level  the dynamic row step, the residual in 4 bits kept and read: S = S0 + step (c8 + c4 / 16),
                      a 12-bit grid in two codes (no memory beside S: the rounding of S itself)
    fp8-e4m3          (S - S0) / (row max / 448) as float8 e4m3, per-row calibrated scales
    fp16              S in half precision (2 bytes)
Composed options (row steps recomputed at every commit, max |x| over the row): `q<bits>` rounds S - S0 to
[-(2^(bits-1) - 1), 2^(bits-1) - 1]; `-had` first rotates each row by a normalised Hadamard matrix (and back after
rounding: the row's outliers spread over its columns); `-ef<bits>` feeds back a residual kept in that many bits;
`-2level` keeps and reads a 4-bit remainder (the int12 format's second code). `+kv-int8` keeps the open
mini-batch's keys and values in int8, a float32 scale a slot's key and value; `+kv-int8x` the same without
the keys' constant feature (the 1 of `augment`, exact: rounded with the rest it drifts every commit the same way);
`+kv-int8h` the same with the keys rotated by a Hadamard matrix
before rounding (and back); `+kv-fp8` float8 e4m3 rows; `+k-int8` / `+v-int8` one of the two (diagnostic: their bytes column is not meaningful).
A suffix `+kv-bf16` keeps the open mini-batch's keys and values (b x (Dk + Dv) a head) in bfloat16 in
place of the float32 running sum A (the int12 format's layout), simulated by rounding ka and vh to bfloat16
where the layer's linear attention reads them: the sum inside the mini-batch and the commit then see
exactly what such a buffer holds. `int8-dynamic-ef-int4` combines the dynamic row step with the 4-bit
feedback; `int8-ef-int2` feeds back a 2-bit residual.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

import edgettt
from edgettt import metrics
from edgettt.data import read_text, token_windows
from edgettt.evaluation import collect_logits, encode
from edgettt.quant.apply import apply_state_format
from edgettt.formats.state_formats import STATE_CLIP, hadamard, int8_rotated_keys, int8_slots

from . import results


def rows_steps(step_rows, S0):
    return step_rows[..., None].expand(S0.shape)


def int8_round(x, step, rounding=torch.round):
    return torch.clamp(rounding(x / step), -STATE_CLIP, STATE_CLIP) * step


def option(name: str, S0, scale_of, memory: dict, key):
    """(S, position) -> S as the option keeps it; `memory[key]`: what the option carries across commits."""
    gen = torch.Generator().manual_seed(0)

    def stochastic(x):
        return torch.floor(x + torch.rand(x.shape, generator=gen))

    def fn(S, position):
        step = rows_steps(scale_of(position), S0)
        d = S - S0
        if name == "int8-dynamic-2level":  # two levels, both read: S0 + step (c8 + c4 / 16), step = row max / 127
            dyn = (d.abs().amax(-1, keepdim=True) / STATE_CLIP).clamp_min(1e-12).expand_as(d)
            coarse = int8_round(d, dyn)
            return S0 + coarse + torch.clamp(torch.round((d - coarse) / (dyn / 16)), -8, 7) * (dyn / 16)
        if name.startswith("int8-dynamic-ef"):
            d = d + memory.get(key, torch.zeros_like(d))
            dyn = (d.abs().amax(-1, keepdim=True) / STATE_CLIP).clamp_min(1e-12).expand_as(d)
            kept = int8_round(d, dyn)
            memory[key] = torch.clamp(torch.round((d - kept) / (dyn / 16)), -8, 7) * (dyn / 16)
            return S0 + kept
        if name.startswith("int4"):  # 4 bits: [-7, 7], the calibrated int8 step scaled to that range
            step4 = step * (STATE_CLIP / 7)
            if "dynamic" in name:
                step4 = (d.abs().amax(-1, keepdim=True) / 7).clamp_min(1e-12).expand_as(d)
            if "ef" in name:
                d = d + memory.get(key, torch.zeros_like(d))
            kept = torch.clamp(torch.round(d / step4), -7, 7) * step4
            if "ef" in name:  # a 1-bit residual: its sign at a quarter step
                memory[key] = torch.sign(d - kept) * (step4 / 4) * ((d - kept).abs() > step4 / 8)
            return S0 + kept
        if name.startswith("q"):  # composed: q<bits>[-had][-ef<bits>|-2level], row steps recomputed at each commit
            parts = name.split("-")
            levels = 2 ** (int(parts[0][1:]) - 1) - 1
            H = hadamard(d.shape[-1], d.dtype) if "had" in parts else None
            x = d @ H if H is not None else d
            ef = next((int(p[2:]) for p in parts if p.startswith("ef")), 0)
            if ef:
                x = x + memory.get(key, torch.zeros_like(x))
            step = (x.abs().amax(-1, keepdim=True) / levels).clamp_min(1e-12)
            kept = torch.clamp(torch.round(x / step), -levels, levels) * step
            if "2level" in parts:  # a 4-bit remainder kept and read (the int12 format's second code)
                kept = kept + torch.clamp(torch.round((x - kept) / (step / 15)), -7, 7) * (step / 15)
            if ef:
                half = 2 ** (ef - 1)
                memory[key] = torch.clamp(torch.round((x - kept) / (step / (2 * half))), -half, half - 1) * (step / (2 * half))
            return S0 + (kept @ H.T if H is not None else kept)
        if name == "int8-hadamard-dynamic":  # rows rotated by a normalised Hadamard matrix before rounding
            H = hadamard(d.shape[-1], d.dtype)
            r = d @ H
            dyn = (r.abs().amax(-1, keepdim=True) / STATE_CLIP).clamp_min(1e-12)
            return S0 + int8_round(r, dyn.expand_as(r)) @ H.T
        if name == "fp32":
            return S
        if name == "int8":
            return S0 + int8_round(d, step)
        if name == "int8-stochastic":
            return S0 + int8_round(d, step, stochastic)
        if name == "int8-dynamic":
            dyn = (d.abs().amax(-1, keepdim=True) / STATE_CLIP).clamp_min(1e-12)
            return S0 + int8_round(d, dyn.expand_as(d))
        if name == "int8-every-4":
            memory[key] = memory.get(key, 0) + 1
            return S0 + int8_round(d, step) if memory[key] % 4 == 0 else S
        if name.startswith("int8-ef"):
            d = d + memory.get(key, torch.zeros_like(d))
            kept = int8_round(d, step)
            residual = d - kept
            if name == "int8-ef-int4":
                residual = torch.clamp(torch.round(residual / (step / 16)), -8, 7) * (step / 16)
            if name == "int8-ef-int2":
                residual = torch.clamp(torch.round(residual / (step / 4)), -2, 1) * (step / 4)
            memory[key] = residual
            return S0 + kept
        if name == "fp8-e4m3":
            row = step * STATE_CLIP / 448.0  # the calibrated row maximum over fp8's largest value
            return S0 + (d / row).to(torch.float8_e4m3fn).float() * row
        if name == "fp16":
            return S.half().float()
        raise ValueError(name)
    return fn


# bytes of S a state element kept between tokens, and the extra an option keeps (per element of S)
S_BYTES = {"fp32": 4, "int8": 1, "int8-stochastic": 1, "int8-dynamic": 1, "int8-every-4": 4,
           "int8-ef-float": 1 + 4, "int8-ef-int4": 1.5, "int8-ef-int2": 1.25, "int8-dynamic-ef-int4": 1.5,
           "int8-dynamic-2level": 1.5,
           "fp8-e4m3": 1, "fp16": 2, "int4": 0.5, "int4-dynamic": 0.5, "int4-dynamic-ef": 0.625,
           "int8-hadamard-dynamic": 1}


def composed_bytes(name: str) -> float:
    """Bytes a value of S of a composed option (q<bits>[-had][-ef<bits>|-2level]) keeps."""
    parts = name.split("-")
    bits = int(parts[0][1:]) + next((int(p[2:]) for p in parts if p.startswith("ef")), 0) + 4 * ("2level" in parts)
    return bits / 8


def state_bytes(model, name: str) -> dict:
    """A sequence's decode state: S at the option's bytes, the rest (A, conv tails) in float32; and with
    the mini-batch's keys and values kept in place of A (b x (Dk + Dv) floats, the int12 format's layout)."""
    layers = model.init_state(1).layers
    s_elems = sum(t.numel() for layer in layers for k, t in layer.items() if k.startswith("S"))
    a_elems = sum(t.numel() for layer in layers for k, t in layer.items() if k.startswith("A"))
    other = sum(t.numel() for layer in layers for k, t in layer.items() if not k.startswith(("S", "A")))
    b = model.config.mini_batch_size
    kv = sum(b * (t.shape[-2] + t.shape[-1]) * t.shape[1] for layer in layers for k, t in layer.items()
             if k.startswith("A"))
    base, _, kv_kind = name.partition("+")
    extra = sum(4 * t.shape[1] * t.shape[2] for layer in layers for k, t in layer.items() if k.startswith("S")) \
        if "dynamic" in base or base.startswith("q") else 0  # its row scales (a [H, Dk] table a level)
    fp32 = 4 * (s_elems + a_elems + other)
    kv_bytes = {"kv-bf16": 2, "kv-int8": 1, "kv-fp8": 1, "kv-int8x": 1, "kv-int8h": 1}.get(kv_kind, 4)
    if kv_kind in ("kv-int8x", "kv-int8h"):  # (the keys' constant feature is not stored)
        kv -= sum(b * t.shape[1] for layer in layers for k, t in layer.items() if k.startswith("A"))
    kv_scales = sum(8 * b * t.shape[1] for layer in layers for k, t in layer.items() if k.startswith("A")) \
        if kv_kind in ("kv-int8", "kv-fp8", "kv-int8x", "kv-int8h") else 0  # a float32 scale for each slot's key and value
    per_value = composed_bytes(base) if base.startswith("q") else S_BYTES[base]
    with_a = per_value * s_elems + 4 * (a_elems + other) + extra
    with_kv = per_value * s_elems + kv_bytes * kv + kv_scales + 4 * other + extra
    return {"bytes": with_a, "of_fp32": with_a / fp32, "bytes_kv": with_kv, "of_fp32_kv": with_kv / fp32,
            "fp32_bytes": fp32}


def fp8_rows(x):
    """Each row scaled to float8 e4m3's range (448 at the row's max) and rounded to it."""
    scale = (x.abs().amax(-1, keepdim=True) / 448).clamp_min(1e-12)
    return (x / scale).to(torch.float8_e4m3fn).float() * scale


def rounded_keys_and_values(key_rounding, value_rounding):
    """A K/V buffer kept in a smaller type: the layer's linear attention reads ka and vh rounded so."""
    def wrap(layer):
        attend = type(layer)._attend

        def rounded(self, fn, level, st, qa, ka, vh, start):
            return attend(self, fn, level, st, qa, key_rounding(ka), value_rounding(vh), start)
        return rounded.__get__(layer)
    return wrap


def keep(x):
    return x


def int8_slots_but_the_constant(x):
    """Keys rounded to int8 a row but their last feature, the constant 1 of `augment` (kept exact: not stored)."""
    return torch.cat((int8_slots(x[..., :-1]), x[..., -1:]), dim=-1)


def int8_keys_and_values(layer):
    """The layer's linear attention reading ka and vh rounded to int8 a token row (an int8 K/V buffer)."""
    return rounded_keys_and_values(int8_slots, int8_slots)(layer)


def bf16_keys_and_values(layer):
    """The layer's linear attention reading ka and vh rounded to bfloat16 (a bf16 K/V buffer)."""
    attend = type(layer)._attend

    def rounded(self, fn, level, st, qa, ka, vh, start):
        return attend(self, fn, level, st, qa, ka.bfloat16().float(), vh.bfloat16().float(), start)
    return rounded.__get__(layer)


def run(args) -> dict:
    model = edgettt.load(args.model)
    model = edgettt.convert(model, "exact") if model.form == "ttt" else model
    text = read_text(args.data)
    windows = token_windows(encode(model, text), args.ctx, args.max_tokens)
    ref = collect_logits(model, windows, batch_size=1, desc="fp32 state")
    cal = edgettt.calibrate(model, args.calib_data, ctx=args.ctx, samples=args.samples)
    apply_state_format(model, "int8", cal)
    layers = [layer for _, layer in model.state_layers()]
    rows = []
    for name in args.options:
        memory: dict = {}
        base, _, kv_kind = name.partition("+")
        for layer in layers:
            def requantizer(level, layer=layer, base=base):
                S0 = layer.initial_states()[level - 1].detach()
                return option(base, S0, lambda p: layer.state_scale(level, p), memory, (id(layer), level))
            layer.requantizer = requantizer
            layer._attend = {"kv-bf16": bf16_keys_and_values, "kv-int8": int8_keys_and_values,
                             "kv-fp8": rounded_keys_and_values(fp8_rows, fp8_rows),
                             "k-int8": rounded_keys_and_values(int8_slots, keep),
                             "kv-int8x": rounded_keys_and_values(int8_slots_but_the_constant, int8_slots),
                             "kv-int8h": rounded_keys_and_values(int8_rotated_keys, int8_slots),
                             "v-int8": rounded_keys_and_values(keep, int8_slots)}.get(
                kv_kind, lambda layer: type(layer)._attend.__get__(layer))(layer)
        t0 = time.perf_counter()
        logits = []
        for w in windows:  # one window at a time: the options' memory is per sequence
            memory.clear()
            logits.append(collect_logits(model, w[None], batch_size=1, desc=name))
        logits = torch.cat(logits)
        kld = metrics.kld(ref, logits)  # [windows, T]
        eighth = kld.shape[1] // 8
        rows.append({"option": name, "kld_mean": kld.mean().item(), "kld_last_eighth": kld[:, -eighth:].mean().item(),
                     "kld_first_eighth": kld[:, :eighth].mean().item(), **state_bytes(model, name),
                     "seconds": time.perf_counter() - t0})
        print(f"{name:16s} KLD {rows[-1]['kld_mean']:.5f}  last eighth {rows[-1]['kld_last_eighth']:.5f}  "
              f"state {rows[-1]['of_fp32']:.0%} of fp32 ({rows[-1]['of_fp32_kv']:.0%} with K/V in place of A)", flush=True)
    meta = {"model": args.model, "form": model.form, "ctx": args.ctx, "windows": int(windows.shape[0]),
            "text": text.fingerprint(), "calibration": {"text": args.calib_data, "samples": args.samples,
                                                        "seq_len": args.ctx},
            "torch": torch.__version__, "python": platform.python_version(), "machine": platform.processor()}
    return {"meta": meta, "rows": rows}


def markdown(result: dict) -> str:
    m = result["meta"]
    lines = [f"{m['model']} ({m['form']} form), {m['windows']} windows of {m['ctx']} tokens of {m['text']['name']}; "
             f"int8 scales calibrated on {m['calibration']['text']} ({m['calibration']['samples']} x {m['ctx']})", "",
             "| option | KLD mean | KLD first eighth | KLD last eighth | decode state, of fp32 | with K/V in place of A |",
             "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['option']} | {r['kld_mean']:.5f} | {r['kld_first_eighth']:.5f} | {r['kld_last_eighth']:.5f} | "
                     f"{int(r['bytes']):,} B ({r['of_fp32']:.0%}) | {int(r['bytes_kv']):,} B ({r['of_fp32_kv']:.0%}) |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="ttt-linear-tiny")
    p.add_argument("--data", default="python-docs:test")
    p.add_argument("--calib-data", default="python-docs:train")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--ctx", type=int, default=8192)
    p.add_argument("--max-tokens", type=int, default=32768)
    p.add_argument("--options", nargs="+", default=[
        "int8", "int8-stochastic", "int8-dynamic", "int8-every-4", "int8-ef-float", "int8-ef-int4", "int8-ef-int2",
        "int8-dynamic-ef-int4", "fp8-e4m3", "fp16", "fp32+kv-bf16", "int8-ef-int4+kv-bf16",
        "int8-dynamic-ef-int4+kv-bf16", "int8-ef-int2+kv-bf16"])
    p.add_argument("--json")
    p.add_argument("--markdown")
    args = p.parse_args()
    result = run(args)
    results.write(result, markdown(result), args.json, args.markdown)
    print(markdown(result))


if __name__ == "__main__":
    main()
