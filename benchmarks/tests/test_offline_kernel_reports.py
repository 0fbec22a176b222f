"""The offline kernel reports (`benchmarks/kernel_resources.py`, `benchmarks/gemv_instruction_counts.py`) type
every argument of every kernel they compile for Hopper: a kernel that gains an argument makes them fail (as
kernel_resources.py did for a session after the int4 GEMV gained its A8 path), so this test names it first.
Compiling needs no GPU, but takes minutes: the scripts themselves are run by hand (their output is committed)."""

import sys
from pathlib import Path

LAB = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(LAB), str(LAB.parent / "tests")]  # the lab's library (`lab`); the core tests' helpers (conftest)

import conftest  # noqa: E402,F401  (first: it sets up torch and Triton for the tests)

import pytest  # noqa: E402

from lab import gemv_instruction_counts  # noqa: E402
from lab import kernel_resources  # noqa: E402

ENTRIES = [(name, kernel, pointers, ints, consts) for name, (kernel, pointers, ints, consts) in
           kernel_resources.KERNELS.items()]
ENTRIES += [(name, kernel, pointers, ints, consts) for name, kernel, pointers, ints, consts, _ in
            kernel_resources.DECODE_KERNELS]
ENTRIES += [(way, kernel, pointers, ints, consts) for way, kernel, pointers, ints, consts, _, _ in
            gemv_instruction_counts.WAYS]


@pytest.mark.parametrize("entry", ENTRIES, ids=[f"{i}-{e[0]}" for i, e in enumerate(ENTRIES)])
def test_every_argument_of_every_reported_kernel_is_typed(entry):
    name, kernel, pointers, ints, consts = entry
    signature = kernel_resources.typed_signature(kernel, pointers, ints, consts)
    assert set(signature.values()) <= {*pointers.values(), "i32", "fp32", "constexpr"}, name


def test_a_kernel_with_an_untyped_argument_is_named():
    name, kernel, pointers, ints, consts = ENTRIES[-1]
    consts = {k: v for k, v in consts.items() if k != "A8"}
    with pytest.raises(ValueError, match="A8"):
        kernel_resources.typed_signature(kernel, pointers, ints, consts)
