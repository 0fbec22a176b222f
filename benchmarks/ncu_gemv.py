"""One launch of each int4 GEMV at 4096x4096 (the shipped kernel, bench_gemv.py's repacked variant), for ncu:

    EDGETTT_AUTOTUNE=0 ncu --clock-control none --section SpeedOfLight --section WarpStateStats \\
        --section SchedulerStats --section Occupancy --section LaunchStats -k regex:"int4_gemv|repacked" -c 2 \\
        python benchmarks/ncu_gemv.py > benchmarks/results/ncu_gemv_h200.txt

(EDGETTT_AUTOTUNE=0: each kernel's first configuration, so that the profiled launch is not an autotuning one.)
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_gemv  # noqa: E402

from edgettt.bench import weight_variants  # noqa: E402
from edgettt.kernels import int4  # noqa: E402


def main():
    copy = weight_variants(4096, 4096, torch.bfloat16)["int4 g64 (edgettt kernel)"][0]
    weight = copy()
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    repacked = bench_gemv.in_layout("repacked", weight)
    for _ in range(2):
        int4.int4_matmul(x, *weight)
        bench_gemv.repacked(x, *repacked)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
