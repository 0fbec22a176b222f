"""The kernel benchmark (`python benchmarks/kernel_bench.py --help`): the speed of the Triton kernels against
the references, measured in one run on CUDA.

The code is `lab/kernel_bench.py` (run here, imported by other scripts and the lab's tests); `--help` lists the options.
"""

import sys

from lab.kernel_bench import main

if __name__ == "__main__":
    sys.exit(main())
