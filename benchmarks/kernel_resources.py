"""Registers, spills, shared memory and the SASS instruction counts (the tile loop's, and the whole kernel's)
of the prefill kernels, and of the decode kernels (a converted layer's token, float and int8 state, at the
125m / 760m presets' head sizes; the int4 GEMV with each prologue at its 760m configuration), compiled for
Hopper (sm_90a), on any machine: Triton compiles for a named target without a GPU, its bundled ptxas reports
resources and its cuobjdump disassembles.

The code is `lab/kernel_resources.py` (run here, imported by other scripts and the lab's tests); `--help` lists the options.
"""

import sys

from lab.kernel_resources import main

if __name__ == "__main__":
    sys.exit(main())
