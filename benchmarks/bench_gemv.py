"""Benchmark: the int4 GEMV of edgettt/ops/quantized/int4.py alone, then the weight rows of `edgettt bench`
(bf16 cuBLAS, the int4 kernel, bitsandbytes NF4), on CUDA.

The code is `lab/bench_gemv.py` (run here, imported by other scripts and the lab's tests); `--help` lists the options.
"""

import sys

from lab.bench_gemv import main

if __name__ == "__main__":
    sys.exit(main())
