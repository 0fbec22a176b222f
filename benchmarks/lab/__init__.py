"""The lab's library: the code of the benchmarks that other scripts and the lab's tests build on (timing
with L2 rotation, the kernel rows and their ratios, the GEMV variants, the state rounding options, the
offline kernel reports). Each module's `main()` is run by the thin script of its name one folder up
(`benchmarks/kernel_bench.py` runs `lab.kernel_bench.main`), which is what `registry.py` names; tests
import these modules, never a script."""
