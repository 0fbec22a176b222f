"""Benchmark: the peak memory of `edgettt convert` at full size, against the checkpoint's bytes.

    python benchmarks/convert_memory.py CKPT [--forms exact,parallel] [--report] [--json FILE]

CKPT is a TTT checkpoint: a model directory (`edgettt create --preset 125m`), or a ttt-lm-jax checkpoint
(`tests/jax_fixtures/make_jax_fixtures.py --full-size 1b-TTT` writes one of the 1.3b shape with random
weights). Each conversion runs in its own process, unmeasured (`--no-report`) and, with --report, with
its drift report; its peak resident memory comes from the kernel (`wait4`'s rusage), set against the
checkpoint's bytes and against the same form's unmeasured conversion; and, less the memory of the process
before it reads the model (Python, torch and edgettt imported: measured the same way), against the
checkpoint's bytes: the conversion's own memory as a multiple of the model's.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def peak_of(command: list[str]) -> tuple[int, float]:
    """(peak resident bytes, seconds) of one process running `command`."""
    start = time.perf_counter()
    process = subprocess.Popen(command)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        sys.exit(f"{' '.join(command)} exited with {process.returncode}")
    return usage.ru_maxrss * 1024, time.perf_counter() - start  # ru_maxrss is in KiB on Linux


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--forms", default="exact,parallel")
    ap.add_argument("--report", action="store_true", help="also convert with the drift report")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    checkpoint = Path(args.checkpoint)
    files = [checkpoint] if checkpoint.is_file() else sorted(
        f for f in checkpoint.iterdir() if f.name.startswith("streaming_") or f.suffix in (".safetensors", ".bin"))
    size = sum(f.stat().st_size for f in files)
    rows = []
    runtime, _ = peak_of([sys.executable, "-c", "import edgettt, torch"])
    print(f"the process before reading the model (imports): {runtime / 2**30:.2f} GiB", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for form in args.forms.split(","):
            unmeasured = None
            for report in (False, True) if args.report else (False,):
                out = Path(tmp) / f"{form}-{report}"
                peak, seconds = peak_of([sys.executable, "-m", "edgettt", "convert", str(checkpoint), str(out),
                                         "--form", form] + ([] if report else ["--no-report"]))
                unmeasured = unmeasured or peak
                rows.append({"form": form, "report": report, "checkpoint_bytes": size, "peak_rss_bytes": peak,
                             "peak_over_checkpoint": round(peak / size, 3),
                             "peak_over_unmeasured": round(peak / unmeasured, 3),
                             "above_imports_over_checkpoint": round((peak - runtime) / size, 3),
                             "seconds": round(seconds, 1)})
                print(f"{form}{' with its report' if report else ''}: peak {peak / 2**30:.2f} GiB = "
                      f"{peak / size:.2f} x the checkpoint's {size / 2**30:.2f} GiB, {seconds:.1f} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"imports_rss_bytes": runtime, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
