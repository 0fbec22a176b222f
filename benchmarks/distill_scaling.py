"""Benchmark: distillation (and calibration) past one process. A preset's original TTT model (random weights) is
the teacher, its parallel form the student, as `convert --distill` runs them; for each window length, data
parallel and FSDP2 (`shard=1`): the job's tokens a second over the timed steps and each rank's peak GPU memory,
or "out of memory"; with --calibrate, `calibrate`'s GPTQ statistics over the ranks' shares of the windows.

    torchrun --nproc-per-node N benchmarks/distill_scaling.py --preset 1b --lengths 2048,8192 --json F [--append]

Run once a world size; rank 0 writes the rows (--append adds them to F's). The steps' time is that of `distill`
with WARMUP + STEPS steps less that of WARMUP steps (the same setup, sharding and first-step allocations in both).
A dry run on the CPU: --preset tiny (the shipped-size default config), gloo.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from edgettt import distributed
from edgettt.calibration.statistics import calibrate
from edgettt.conversion import convert
from edgettt.data import Text
from edgettt.distill import distill
from edgettt.families.ttt.config import PRESET_VOCAB, PRESETS
from edgettt.families.ttt.random_init import CREATE_DEFAULTS, new_config, random_model
from lab.results import write


def model(preset: str):
    """The preset's original TTT-Linear (random weights); "tiny": `edgettt create`'s default size (a dry run)."""
    sizes = {**CREATE_DEFAULTS, **(PRESETS[preset] if preset != "tiny" else {}),
             "vocab_size": PRESET_VOCAB if preset != "tiny" else 256}
    return random_model(new_config("linear", sizes), seed=0)


def timed_distill(teacher, student, tokens, steps, length, windows, ranks, shard) -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    distill(teacher, student, tokens, steps=steps, batch=windows, ctx=length, ranks=ranks, shard=shard)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def distill_row(preset, length, windows, mode, warmup, steps, ranks) -> dict:
    teacher = model(preset)
    student = convert(teacher, "parallel")
    tokens = torch.randint(0, teacher.config.vocab_size, (length * windows * 4,),
                           generator=torch.Generator().manual_seed(0)).tolist()
    row = {"preset": preset, "processes": ranks.world, "mode": mode, "length": length, "windows": windows,
           "tokens_a_step": length * windows}
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    try:
        short = timed_distill(teacher, student, tokens, warmup, length, windows, ranks, mode == "fsdp2")
        whole = timed_distill(teacher, student, tokens, warmup + steps, length, windows, ranks, mode == "fsdp2")
    except torch.OutOfMemoryError:
        return {**row, "result": "out of memory"}
    if whole <= short:  # (steps too short for the clock to tell apart from the setup's noise)
        return {**row, "result": "too short to time"}
    seconds = whole - short
    row.update(result="ok", seconds_a_step=seconds / steps, tokens_per_s=steps * length * windows / seconds)
    if torch.cuda.is_available():
        row["peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
    return row


def calibrate_row(preset, length, samples, ranks) -> dict:
    student = convert(model(preset), "parallel").to(ranks.device())
    text = Text("random", bytes(torch.randint(0, 256, (length * samples * 2,),
                                              generator=torch.Generator().manual_seed(1)).tolist()))
    start = time.perf_counter()
    calibrate(student, text, ctx=length, samples=samples)
    return {"preset": preset, "processes": ranks.world, "mode": "calibrate", "length": length, "windows": samples,
            "result": "ok", "seconds": time.perf_counter() - start}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="1b")
    ap.add_argument("--lengths", default="2048,8192")
    ap.add_argument("--windows", type=int, default=1, help="windows a step a process")
    ap.add_argument("--modes", default="ddp,fsdp2")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--calibrate", type=int, default=0, metavar="SAMPLES", help="also time calibrate on SAMPLES")
    ap.add_argument("--json")
    ap.add_argument("--md")
    ap.add_argument("--append", action="store_true")
    args = ap.parse_args()
    ranks = distributed.start()
    rows = []
    for length in map(int, args.lengths.split(",")):
        for mode in args.modes.split(","):
            rows.append(distill_row(args.preset, length, args.windows * ranks.world, mode, args.warmup, args.steps,
                                    ranks))
        if args.calibrate:
            rows.append(calibrate_row(args.preset, length, args.calibrate, ranks))
    if ranks.main:
        earlier = json.load(open(args.json))["rows"] if args.append and args.json and os.path.exists(args.json) else []
        rows = earlier + rows
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        head = "| preset | processes | mode | length | windows | result | tokens/s | s/step | peak GB | calibrate s |"
        lines = [head, "|" + "---|" * 10] + [
            f"| {r['preset']} | {r['processes']} | {r['mode']} | {r['length']} | {r['windows']} | {r['result']} | "
            f"{r.get('tokens_per_s', 0):,.0f} | {r.get('seconds_a_step', 0):.3f} | {r.get('peak_gb', 0):.1f} | "
            f"{r.get('seconds', 0):.1f} |" for r in rows]
        write({"device": device, "rows": rows}, "\n".join(lines) + "\n", args.json, args.md)
        print("\n".join(lines))
    distributed.stop()


if __name__ == "__main__":
    main()
