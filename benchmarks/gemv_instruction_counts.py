"""SASS instructions a weight code in the loop of the int4 GEMV and of two sketches of other ways to do it,
compiled offline for Hopper (sm_90a) with the Triton on PYTHONPATH (`kernel_resources.compiled_for_hopper`):
where the GEMV's time goes is its instructions a code (benchmarks/results/compiled_decode_h200.md), so
this compares ways by that count before any is built out. The tensor-core sketch is compiled, never run: it
uses inline PTX (the Triton interpreter cannot run it) and has no test; it computes what its docstring says
only as far as reading the PTX shows.

The code is `lab/gemv_instruction_counts.py` (run here, imported by other scripts and the lab's tests); `--help` lists the options.
"""

import sys

from lab.gemv_instruction_counts import main

if __name__ == "__main__":
    sys.exit(main())
