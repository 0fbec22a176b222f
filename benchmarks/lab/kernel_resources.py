"""Registers, spills, shared memory and the SASS instruction counts (the tile loop's, and the whole kernel's)
of the prefill kernels, and of the decode kernels (a converted layer's token, float and int8 state, at the
125m / 760m presets' head sizes; the int4 GEMV with each prologue at its 760m configuration), compiled for
Hopper (sm_90a), on any machine: Triton compiles for a named target without a GPU, its bundled ptxas reports
resources and its cuobjdump disassembles.

    python benchmarks/kernel_resources.py > benchmarks/results/kernel_resources.txt
    # with the GPU machine's Triton (3.6) unpacked into /tmp/t36, as the committed file was made:
    PYTHONPATH=/tmp/t36:. python benchmarks/kernel_resources.py > benchmarks/results/kernel_resources.txt

Occupancy follows from registers: an H100/H200 multiprocessor has 65536 of them, so a program of
W warps using R registers a thread fits floor(65536 / (32 W R)) times. (The local Triton may be
newer than the GPU machine's: the numbers are a guide to the code generated there.) The integer
arguments are declared multiples of 16, as Triton specializes them at the benchmark shape: without
that it cannot prove the tiles' 16-byte alignment, and the tile loads are neither vectorised nor
pipelined (`async` counts the tile loads turned into asynchronous copies; `converts`, the layout
conversions, each a round trip through shared memory).
"""

import glob
import inspect
import os
import re
import subprocess
import tempfile
import warnings

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from edgettt.ops.linear_attention import decode_token, prefill

from edgettt.ops.quantized import int4

warnings.filterwarnings("ignore")
BF16, F32, U8 = "*bf16", "*fp32", "*u8"
NOT_MULTIPLE_OF_16 = {"NSEG", "LAST_SEG", "INNER", "LAST", "SLOTS", "one_bits"}  # at B=4, H=16, T=32768 the others are
FLOATS = {"LOG2_THETA", "EPS", "eps"}
KERNELS = {
    "parallel pass 1 (values, segment sums)": (
        prefill._parallel_sums_kernel,
        dict(k_ptr=BF16, v_ptr=BF16, lr_ptr=F32, s0_ptr=F32, gamma_ptr=F32, beta_ptr=F32, lg_ptr=F32, u_ptr=F32,
             vh_ptr=BF16),
        ["T", "T_DONE", "H", "TILES_PER_SEG", "NSEG", "stride_b", "stride_h", "stride_t", "stride_lb", "stride_lh",
         "stride_lt"],
        dict(D=64, BD=64, BT=64, MB=16, PREC="tf32", EVEN=True, DECAY=False)),
    "parallel pass 2 (outputs)": (
        prefill._parallel_out_kernel,
        dict(q_ptr=BF16, k_ptr=BF16, gamma_ptr=F32, beta_ptr=F32, eta_ptr=F32, u_ptr=F32, vh_ptr=BF16, s_in_ptr=F32,
             o_ptr=BF16, s_out_ptr=F32, a_out_ptr=F32, s0_ptr=F32, lg_ptr=F32),
        ["T", "T_DONE", "H", "TILES_PER_SEG", "NSEG", "LAST_SEG", "stride_sb", "stride_b", "stride_h", "stride_t",
         "stride_ob", "stride_oh", "stride_ot"],
        dict(D=64, BD=64, BT=64, MB=16, PREC="tf32", EVEN=True, DECAY=False)),
    "exact (one program per sequence and head)": (
        prefill._exact_kernel,
        dict(q_ptr=BF16, k_ptr=BF16, v_ptr=BF16, lr_ptr=F32, gamma_ptr=F32, beta_ptr=F32, eta_ptr=F32, s_in_ptr=F32,
             o_ptr=BF16, s_out_ptr=F32, a_out_ptr=F32, states_ptr=F32, s0_ptr=F32),
        ["T", "H", "stride_sb", "stride_b", "stride_h", "stride_t", "stride_lb", "stride_lh", "stride_lt", "stride_ob",
         "stride_oh", "stride_ot"],
        dict(D=64, BD=64, MB=16, BM=16, PREC="tf32", STORE_STATES=False, TWO_LEVEL=False)),
}


TOKEN = dict(q_ptr=BF16, k_ptr=BF16, v_ptr=BF16, lr_ptr=BF16, s0_ptr=F32, g_ptr=BF16, b_ptr=BF16, s_ptr=F32,
             o_ptr=BF16, eta_ptr=F32, decay_ptr=F32)
# (name, kernel, pointers, integers, constexprs, warps): a batch-1 decode token's kernels, each in the warps it runs with
DECODE_KERNELS = [
    *[(f"token, float state, d = {d}", decode_token._decode_token_kernel, {**TOKEN, "a_ptr": F32},
       ["INNER", "LAST", "H", "D"], dict(COMMIT=False, AT_STATE=False, BLOCK_D=d if d == 64 else 128, DECAY=False),
       decode_token.token_warps(d if d == 64 else 128, commit=False, int8=False))
      for d in (64, 96)],
    *[(f"token, int8 state, d = {d}", decode_token._decode_token_int12_kernel,
       {**TOKEN, "kk_ptr": "*fp16", "vv_ptr": "*fp16", "rot_ptr": F32},
       ["INNER", "LAST", "H", "D", "SLOTS"], dict(STATE_CLIP=4.0, FINE=15, COMMIT=False, AT_STATE=False,
                                                  BLOCK_D=d if d == 64 else 128, MINI=16, DECAY=False, OPEN8=False),
       decode_token.token_warps(d if d == 64 else 128, commit=False, int8=True))
      for d in (64, 96)],
    *[(f"int4 GEMV, {label}", int4._int4_gemv_kernel,
       dict(x_ptr=BF16, qw_ptr=U8, sc_ptr=BF16, zp_ptr=U8, y_ptr=BF16, up_ptr=BF16, nw_ptr=BF16, nb_ptr=BF16, r_ptr=BF16),
       ["N", "K", "KW", "ZPW", "stride_xm", "stride_rm", "one_bits"],
       dict(GROUP=64, X16=True, PROLOGUE=int4.PROLOGUES[prologue], W16=True, RESIDUAL=residual, GLU=glu, A8=False,
            DP4A=True, BN=8, WPT=4, NQ=128), 4)
      for label, prologue, residual, glu in [("plain", "none", False, False), ("residual", "none", True, False),
                                             ("RMSNorm prologue", "rms", False, False),
                                             ("RMSNorm prologue, GLU epilogue", "rms", False, True),
                                             ("LayerNorm prologue, residual", "layer", True, False),
                                             ("gated prologue, residual", "gated", True, False)]],
]


def ptxas() -> str:
    """The newest ptxas Triton ships (the plain one may not read the PTX version Triton writes)."""
    found = sorted(glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas*")))
    return max(found, key=lambda p: "blackwell" in p)


def instructions(cubin: str) -> tuple[int, int]:
    """SASS instructions in the kernel's longest loop (the tile loop: between a backward branch and its
    target; 0 without one) and in the whole kernel, from the disassembly of Triton's bundled cuobjdump.
    Instructions, not cycles, but the tile loops run issue- or latency-bound, and what a change removes
    shows here first."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    sass = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True).stdout
    addresses, loops = [], []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if not m:
            continue
        at = int(m.group(1), 16)
        addresses.append(at)
        target = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", m.group(2))
        if target and int(target.group(1), 16) < at:
            loops.append((int(target.group(1), 16), at))
    return max((sum(start <= a <= end for a in addresses) for start, end in loops), default=0), len(addresses)


def typed_signature(kernel, pointers, ints, consts) -> dict:
    """`kernel`'s signature as `compiled_for_hopper` types it: each argument's Triton type, in the kernel's order
    (which the attributes index); a ValueError naming any argument left untyped (a kernel that gained an argument
    since its entry was written). Read from the Python function, so it also runs under Triton's interpreter."""
    fn = kernel
    while hasattr(fn, "fn"):  # an autotuner's JIT function's (or the interpreter's) Python function
        fn = fn.fn
    names = list(inspect.signature(fn).parameters)
    types = {**pointers, **{name: "i32" for name in ints}, **{name: "fp32" for name in FLOATS},
             **{name: "constexpr" for name in consts}}
    untyped = [name for name in names if name not in types]
    if untyped:
        raise ValueError(f"{fn.__name__}: no type or value for {', '.join(untyped)}")
    return {name: types[name] for name in names}


def compiled_for_hopper(kernel, pointers, ints, consts, warps, stages, not_multiple_of_16=NOT_MULTIPLE_OF_16):
    """(ptxas' report, the loop's and the whole kernel's SASS instruction counts, the compiled kernel) of
    `kernel` for sm_90a: its arguments typed (`pointers`: name -> Triton pointer type; `ints`: i32, declared
    multiples of 16 unless in `not_multiple_of_16`; `consts`: the constexprs' values)."""
    jit = kernel if isinstance(kernel, triton.runtime.jit.JITFunction) else kernel.fn  # (autotuned: its kernel)
    signature = typed_signature(kernel, pointers, ints, consts)
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(signature)
               if signature[name] not in ("constexpr", "fp32") and name not in not_multiple_of_16}
    compiled = triton.compile(ASTSource(fn=jit, signature=signature, constexprs=consts, attrs=aligned),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "k.ptx")
        with open(ptx, "w") as f:
            f.write(compiled.asm["ptx"])
        out = subprocess.run([ptxas(), "-v", "--gpu-name", "sm_90a", ptx, "-o", os.path.join(tmp, "k.cubin")],
                             capture_output=True, text=True).stderr
        loop, total = instructions(os.path.join(tmp, "k.cubin"))
    return out, loop, total, compiled


def resources(kernel, pointers, ints, consts, warps, stages) -> str:
    out, loop, total, compiled = compiled_for_hopper(kernel, pointers, ints, consts, warps, stages)
    regs = int(re.search(r"Used (\d+) registers", out).group(1))
    spill = re.search(r"(\d+) bytes spill stores", out)
    fits = 65536 // (32 * warps * regs)
    ttgir = compiled.asm["ttgir"]
    return (f"{regs:4d} registers, {int(spill.group(1)) if spill else 0:4d} bytes spilled, "
            f"{compiled.metadata.shared:6d} bytes shared; {fits} program(s) = {fits * warps} warps per multiprocessor; "
            f"async {ttgir.count('ttg.async_copy_global_to_local')}, converts {ttgir.count('ttg.convert_layout')}; "
            f"loop {loop} SASS instructions, {total} in all")


def main():
    print(f"triton {triton.__version__}, target sm_90a, bf16 inputs, d = 64, tile 64, mini-batch 16")
    for name, (kernel, pointers, ints, consts) in KERNELS.items():
        for warps in (2, 4, 8):
            for stages in (1, 2, 3):
                print(f"{name:44s} warps {warps} stages {stages}: {resources(kernel, pointers, ints, consts, warps, stages)}")
    print("decode kernels (a token inside its mini-batch; the GEMV with 8 rows a program, 4 words a chunk, group 64)")
    for name, kernel, pointers, ints, consts, warps in DECODE_KERNELS:
        print(f"{name:44s} warps {warps} stages 1: {resources(kernel, pointers, ints, consts, warps, 1)}")


if __name__ == "__main__":
    main()
