"""Benchmark: the peak memory of `edgettt convert` on a full-size ttt-lm-jax checkpoint, against its bytes.

    python benchmarks/jax_convert_memory.py CKPT [--forms exact,parallel] [--json FILE]

CKPT is a checkpoint the JAX code saved (`tests/jax_fixtures/make_jax_fixtures.py --full-size 1b-TTT`
writes one of the 1.3b shape with random weights). Each form's conversion (unmeasured: `--no-report`)
runs in its own process; its peak resident memory comes from the kernel (`wait4`'s rusage), and is
set against the checkpoint file's bytes.
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
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    checkpoint = Path(args.checkpoint)
    files = [checkpoint] if checkpoint.is_file() else sorted(checkpoint.glob("streaming_*"))
    size = sum(f.stat().st_size for f in files)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for form in args.forms.split(","):
            out = Path(tmp) / form
            peak, seconds = peak_of([sys.executable, "-m", "edgettt", "convert", str(checkpoint), str(out),
                                     "--form", form, "--no-report"])
            written = sum(f.stat().st_size for f in out.iterdir())
            rows.append({"form": form, "checkpoint_bytes": size, "written_bytes": written, "peak_rss_bytes": peak,
                         "peak_over_checkpoint": round(peak / size, 3), "seconds": round(seconds, 1)})
            print(f"{form}: peak {peak / 2**30:.2f} GiB = {peak / size:.2f} x the checkpoint's "
                  f"{size / 2**30:.2f} GiB, {seconds:.1f} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
