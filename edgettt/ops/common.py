"""What the Triton kernels of `edgettt.ops` share (DESIGN section 8).

The model's layers take them where `edgettt.prepare` (`fast_paths.layers.use_kernels`) gives the layers
their kernel subclasses; a quantized layer takes its format's kernel on CUDA. On a CPU, tests run the
kernels under `TRITON_INTERPRET=1` (fp32/fp16 only), set before this package is imported.
`EDGETTT_AUTOTUNE=0` (set by the tests) launches every kernel with the first of its configurations
instead of timing them all on each new shape (which makes a test run far longer); one GPU test runs
every configuration. The measurements behind the kernels' design are in `benchmarks/results/`
(prefill_design.md for the prefill kernels).
"""

import os

import torch

GEMV_MAX_ROWS = 8  # the weight kernels' GEMV range (a decode step's rows); GEMMs above it
# int4 layers asked for int8 activations take them only from here on, where W4A8 was measured to win (1.07x
# and 1.21x bf16 at 2,048 rows of 4096-wide layers); at 16-128 rows of the 125m layers it runs at half the
# speed of weight-only dequantize + cuBLAS: three launches (the activations' rounding, the weight's
# requantization to int8, which every call repeats, the product) against two, in products launches bound
# (benchmarks/results/gemm_h200.md, few-row sections)
INT4_A8_MIN_ROWS = 2048
# whether kernels run under Triton's interpreter (set before this package is imported), which cannot run inline PTX
INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
POISON_OUTPUTS = False  # tests switch it on: every kernel output starts as NaN, so unwritten elements show


def fresh(t: torch.Tensor) -> torch.Tensor:
    """A newly allocated kernel output: as is, or filled with NaN when POISON_OUTPUTS is on."""
    return t.fill_(float("nan")) if POISON_OUTPUTS else t


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for the launch arithmetic on the host: triton.cdiv and triton.next_power_of_2 are
    constexpr functions, slow to call from Python, and the operators' Python runs while the GPU waits."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def autotune_configs(configs: list, interpreter_configs: list) -> list:
    """The configurations a kernel's autotuner tries: one under the interpreter, the first (a good
    default) with EDGETTT_AUTOTUNE=0, else all of them."""
    if INTERPRETER:
        return interpreter_configs
    return configs[:1] if os.environ.get("EDGETTT_AUTOTUNE", "1") == "0" else configs


def mini_batch_supported(b: int) -> bool:
    """Mini-batch sizes the prefill and training kernels take: powers of two up to 64."""
    return b & (b - 1) == 0 and b <= 64
