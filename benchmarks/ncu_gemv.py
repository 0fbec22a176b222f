"""One launch of the shipped int4 GEMV at each of bench_gemv.py's shapes (4096x4096, 11008x4096), for ncu:

    EDGETTT_AUTOTUNE=0 ncu --clock-control none --section SpeedOfLight --section WarpStateStats \\
        --section SchedulerStats --section Occupancy --section LaunchStats -k regex:int4_gemv -c 2 \\
        python benchmarks/ncu_gemv.py > benchmarks/results/ncu_gemv_h200.txt

(EDGETTT_AUTOTUNE=0: the kernel's first configuration, so that the profiled launch is not an autotuning one;
it is the autotuner's pick at 11008x4096 on the H200, measured by `bench_gemv.py --shapes`.)
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lab import bench_gemv  # noqa: E402

from lab.kernel_bench import weight_variants  # noqa: E402
from edgettt.ops.quantized import int4  # noqa: E402


def main():
    for N, K in bench_gemv.SHAPES:
        weight = weight_variants(N, K, torch.bfloat16)["int4 g64 (edgettt kernel)"][0]()
        x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
        int4.int4_matmul(x, *weight)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
