"""Every benchmark of the lab, by the name of its one current result: `benchmarks/results/NAME.json`
(and `NAME.md`, or `NAME.txt` for a benchmark whose result is a text report). `benchmarks/run.py`
runs an entry's command and writes its result; `python benchmarks/run.py list` prints this table.

A command is run by bash from the repository root. `{json}` and `{md}` stand for the files the
runner collects (a command without them writes its result to stdout, kept as NAME.txt); `{tmp}` is a
scratch folder of the run. Older results of a benchmark are in git history, not in file names
(`git log -p -- benchmarks/results/NAME.json`).

devices: cpu (this machine's kind), cuda (a CUDA GPU: the H200 through the device tool), offline
(Triton compiles for sm_90a here, nothing runs on a GPU).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Benchmark:
    name: str
    device: str
    command: str
    about: str

    @property
    def writes_text(self) -> bool:
        """The result is the command's stdout (it writes neither {json} nor {md})."""
        return "{json}" not in self.command and "{md}" not in self.command


# models of a preset for the GPU model tables: random weights, the parallel form, its int12 state and int4 weights
_MODELS_125M = ("edgettt create {tmp}/M --preset 125m && edgettt convert {tmp}/M {tmp}/P --form parallel --no-report"
                " && edgettt quantize {tmp}/P {tmp}/P-int12 --weights float --state int12"
                " && edgettt quantize {tmp}/P {tmp}/P-int4 --weights int4-rtn-g64 --lm-head float")


def _model_speed(preset: str, batch: int) -> str:
    return (f"PRESET={preset} BATCH={batch} OUT={{tmp}} bash benchmarks/model_speed_gpu.sh"
            f" && cp {{tmp}}/{preset}-b{batch}.json {{json}} && cp {{tmp}}/{preset}-b{batch}.md {{md}}")


BENCHMARKS = [Benchmark(*entry) for entry in [
    # ---- whole models
    ("bench_125m_b1_h200", "cuda",
     _MODELS_125M + " && edgettt bench llama:125m {tmp}/P {tmp}/P-int12 {tmp}/P-int4 --device cuda --pp 8192 --tg 128"
     " --depth 8192 -r 3 --json {json} --markdown {md}",
     "125m decode at depth 8192 and prefill of 8192 tokens against a same-size Llama, batch 1 (the README's table)"),
    ("model_speed_125m_b1_h200", "cuda", _model_speed("125m", 1),
     "every form and format of a 125m TTT-Linear against the Llama, batch 1 (report: model_speed_h200.md)"),
    ("model_speed_125m_b16_h200", "cuda", _model_speed("125m", 16), "the same at batch 16"),
    ("model_speed_760m_b1_h200", "cuda", _model_speed("760m", 1), "the same at the 760m preset, batch 1"),
    ("model_speed_760m_b16_h200", "cuda", _model_speed("760m", 16), "the same at the 760m preset, batch 16"),
    ("compiled_decode_h200", "cuda",
     "python benchmarks/compiled_decode.py --preset 125m --depth 8192 --tokens 128 --repeats 3 --json {json}",
     "decode steps as CUDA graphs, eager and compiled, against the Llama (report: compiled_decode_h200.md)"),
    ("prefill_gpu_h200", "cuda",
     "python benchmarks/prefill_gpu.py --preset 760m --length 8192 --repeats 5 --json {json}",
     "760m prefill of 8192 tokens: the parallel form, int4, the original, the Llama"),
    ("speed_125m", "cpu",
     "edgettt create {tmp}/M --preset 125m && edgettt convert {tmp}/M {tmp}/P --form parallel --no-report"
     " && edgettt export {tmp}/P {tmp}/float --no-verify && edgettt quantize {tmp}/P {tmp}/Q --weights int4-rtn-g64"
     " --lm-head same && edgettt export {tmp}/Q {tmp}/int4 --no-verify"
     " && edgettt bench {tmp}/float {tmp}/int4 --pp 512 --tg 128 --depth 0,4096 -r 3 --json {json} --markdown {md}",
     "125m exports in ONNX Runtime on this CPU: int4 against float"),
    ("convert_memory_125m_cpu", "cpu",
     "edgettt create {tmp}/M --preset 125m && python benchmarks/convert_memory.py {tmp}/M --forms parallel --report"
     " --json {json}",
     "peak memory of converting the 125m preset, without and with the drift report `convert` prints"),
    ("int4_default_125m_cpu", "cpu",
     "edgettt create {tmp}/M --preset 125m && edgettt convert {tmp}/M {tmp}/P --form parallel --no-report"
     " && edgettt export {tmp}/P {tmp}/float --no-verify && edgettt quantize {tmp}/P {tmp}/Q --weights int4"
     " && edgettt export {tmp}/Q {tmp}/int4 && edgettt bench {tmp}/float {tmp}/int4 --pp 512 --tg 128 -r 5"
     " --json {json} --markdown {md}",
     "the default int4 of the 125m preset (`quantize --weights int4`, then an export that passes its verification) "
     "against the float export in ONNX Runtime on this CPU: bytes, and tokens/s in turns"),
    ("genai_125m_cpu", "cpu",
     "edgettt create {tmp}/M --preset 125m && edgettt convert {tmp}/M {tmp}/P --form parallel --no-report"
     " && edgettt quantize {tmp}/P {tmp}/Q --weights int4-rtn-g32 && edgettt export {tmp}/Q {tmp}/int4"
     " && python benchmarks/anchor_llama.py --preset 125m --out {tmp}/anchors --precision int4"
     " && edgettt bench {tmp}/int4 genai:{tmp}/int4 {tmp}/anchors/llama-125m-int4 --pp 128 --tg 64 --depth 0,512 -r 3"
     " --threads $(nproc)"
     " --json {json} --markdown {md}",
     "the 125m int4 export decoded by onnxruntime-genai, by `edgettt run`'s runner and, in turns, genai's own "
     "Llama-125m int4 (its model builder's export) on this CPU"),
    ("compare_tiny_cpu", "cpu",
     "python benchmarks/anchor_llama.py --preset tiny --out {tmp}/anchors --precision int4 --max-positions 8448"
     " && edgettt compare {tmp}/anchors/llama-tiny-int4 {tmp}/c"
     " && cp {tmp}/c/compare.json {json} && cp {tmp}/c/compare.md {md}",
     "the shipped tiny models side by side (`edgettt compare`, docs/compare.md): bits per byte by length, weight "
     "and state drift, CPU decode of their int4 exports in turns beside a same-size Llama (genai's builder)"),
    ("compare_tiny_gpu", "cuda",
     "edgettt bench ttt-linear-tiny-parallel ttt-mlp-tiny-parallel lact-w1-tiny gated-deltanet-tiny --device cuda"
     " --pp 512 --tg 64 --depth 8192 -r 3 --json {json} --markdown {md}",
     "the shipped tiny models' decode at depth 8192 on the GPU, as `edgettt.prepare` makes them (the GPU row of "
     "`edgettt compare benchmarks/results/compare_tiny_gpu.json ...`, docs/compare.md)"),
    ("gated_deltanet_340m_gpu", "cuda",
     "python -c 'import fla.ops.gated_delta_rule' && edgettt create {tmp}/G --family gated-deltanet --preset 340m"
     " && edgettt bench llama:350m {tmp}/G --device cuda --pp 8192 --tg 128 --depth 0,8192 -r 3"
     " --json {json} --markdown {md}",
     "fla's 340m Gated DeltaNet shape (random weights) through fla's Triton kernels (chunked prefill, fused "
     "recurrent decode) against the same-width Llama (TTT's 350m preset: 1024 wide, 24 layers), batch 1"),
    ("distill_scaling_gpu", "cuda",
     "for n in 1 2 4 8; do [ $(nvidia-smi -L | wc -l) -ge $n ] || break; PYTHONPATH=benchmarks torchrun --standalone"
     " --nproc-per-node $n benchmarks/distill_scaling.py --preset 1b --lengths 2048,8192 --calibrate 8"
     " --json {json} --md {md} $([ $n = 1 ] || echo --append) || exit 1; done",
     "`convert --distill` of the 1b preset over 1, 2, 4, 8 GPUs (as many as the machine has): data parallel and "
     "FSDP2 (shard=1) at 2048 and 8192 tokens, tokens/s and peak memory, and calibrate split over the ranks"),
    ("mixed_precision_cpu", "cpu",
     "python benchmarks/mixed_precision.py --models ttt-linear-tiny-parallel ttt-mlp-tiny-parallel"
     " --factors 1.0 1.1 1.2 1.3 --json {json} --md {md}",
     "quantize --target size=MB at multiples of uniform int4-gptq-g64's bytes: KLD on held-out text against "
     "the uniform model's, the search's time"),
    ("int4_methods_cpu", "cpu", "python benchmarks/int4_methods.py --model ttt-linear-tiny-parallel --json {json} --md {md}",
     "int4 g64 by GPTQ against clip search, act-order and AWQ-style scaling"),
    ("web_tiny_cpu", "cpu",
     "edgettt export ttt-linear-tiny-parallel {tmp}/w/linear --web"
     " && edgettt quantize ttt-linear-tiny-parallel {tmp}/Q --weights int4 && edgettt export {tmp}/Q {tmp}/w/linear-int4 --web"
     " && edgettt export lact-w1-tiny {tmp}/w/lact --web"
     " && python benchmarks/web_decode.py {tmp}/w/linear {tmp}/w/linear-int4 {tmp}/w/lact --tokens 256 --repeats 5"
     " --json {json} --md {md}",
     "decode in headless Chromium (onnxruntime-web, WebAssembly) against native ONNX Runtime on the same tiny "
     "exports and CPU, in turns"),
    ("web_125m_cpu", "cpu",
     "edgettt create {tmp}/M --preset 125m && edgettt convert {tmp}/M {tmp}/P --form parallel --no-report"
     " && edgettt quantize {tmp}/P {tmp}/Q --weights int4 && edgettt export {tmp}/Q {tmp}/w/int4 --web --no-verify"
     " && python benchmarks/web_decode.py {tmp}/w/int4 --tokens 32 --repeats 2 --json {json} --md {md}",
     "the 125m int4 export in the page: what it downloads, load and first-token time, decode tokens/s against native"),
    ("linear_attention_op_cpu", "cpu",
     "python benchmarks/linear_attention_op.py --heads 12 --head-dim 64 --tokens 512 --repeats 7 --json {json}",
     "ONNX's LinearAttention (opset 27) for the open mini-batch's sums, decode and prefill, at the 125m shapes, "
     "against the subgraphs the export writes: agreement and time"),
    ("onnx_cpu", "cpu", "python benchmarks/bench_onnx_cpu.py --json {json}",
     "ttt-linear-tiny-parallel's exports (float, int8, int4, nf4) in ONNX Runtime, in alternation"),
    ("train_step_cpu", "cpu", "python benchmarks/bench_train_step.py --repeats 7 --json {json}",
     "one training step of the shipped tiny models and the bytes autograd saves"),
    ("mixed_distill_cpu", "cpu",
     "python benchmarks/mixed_distill.py --teacher ttt-mlp-tiny --student ttt-mlp-tiny-parallel --lengths 512,2048,8192"
     " --steps 36 --lr 1e-4 --json {json}",
     "distillation at mixed lengths, bits per byte at each length before and after (report: mixed_distill_gpu.md)"),
    ("jax_convert_memory_1b_cpu", "cpu",
     "PYTHONPATH=$TTT_LM_JAX $JAX_PYTHON tests/jax_fixtures/make_jax_fixtures.py --full-size 1b-TTT {tmp}/ckpt"
     " && python benchmarks/convert_memory.py {tmp}/ckpt --json {json}",
     "peak memory of converting a ttt-lm-jax checkpoint of the 1.3b shape (random weights saved by the JAX code; "
     "TTT_LM_JAX: its checkout, JAX_PYTHON: a Python with its pinned JAX and flax)"),
    # ---- kernels
    ("bench_h200", "cuda", "python benchmarks/kernel_bench.py --json {json} --markdown {md}",
     "every Triton kernel against its references: prefill, decode state step, GEMV/GEMM, LaCT, training"),
    ("gemm_h200", "cuda",
     "python benchmarks/kernel_bench.py --seq-lens '' --decode-batch '' --train '' --lact-seq-lens '' --json {json}"
     " --markdown {md}", "the weight matmuls alone: int8/int4 GEMV and GEMM against cuBLAS and bitsandbytes"),
    ("state_step_h200", "cuda",
     "python benchmarks/kernel_bench.py --seq-lens '' --train '' --lact-seq-lens '' --gemv '' --json {json}"
     " --markdown {md}", "the decode state step: float32, bfloat16, int8, int12"),
    ("lact_h200", "cuda",
     "python benchmarks/kernel_bench.py --seq-lens '' --decode-batch '' --gemv '' --train '' --lact-seq-lens 32768"
     " --json {json} --markdown {md}", "LaCT at the public 760M layer shape"),
    ("gemv_h200", "cuda", "python benchmarks/bench_gemv.py --json {json}",
     "the int4 GEMV and its earlier designs, then the weight rows of the kernel benchmark"),
    ("gemv_register_caps_760m_h200", "cuda", "python benchmarks/gemv_register_caps.py --json {json}",
     "the 760m fused decode products with and without a register cap"),
    ("variants_h200", "cuda", "python benchmarks/bench_parallel_variants.py --json {json}",
     "the parallel prefill kernel's cuts and tiles, against fla when installed"),
    ("configs_h200", "cuda", "python benchmarks/bench_parallel_variants.py --configs --json {json}",
     "every launch configuration of the parallel prefill kernel"),
    ("token_warps_760m_h200", "cuda", "python benchmarks/token_warps.py --json {json}",
     "the decode token kernels at the 760m heads with 4, 8, 16 warps"),
    ("token_warps_125m_h200", "cuda", "python benchmarks/token_warps.py --shape 1x12x64 --warps 2,4,8 --rounds 5 --json {json}",
     "the same at the 125m heads"),
    ("ab_int4_prefill_760m_h200", "cuda", "python benchmarks/ab_int4_prefill.py --json {json}",
     "an eager 760m prefill with int4 weights against bf16, two versions of int4_matmul's host path in turns"),
    ("launch_overhead_h200", "cuda", "python benchmarks/launch_overhead.py",
     "host time of one int4 product above the GEMV range, and of a kernel launch"),
    ("lact_parts_h200", "cuda", "python benchmarks/lact_parts.py",
     "each part of LaCT's parallel form timed alone at the public 760M layer shape"),
    ("ncu_gemv_h200", "cuda",
     "EDGETTT_AUTOTUNE=0 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section"
     " SchedulerStats --section Occupancy --section LaunchStats -k regex:int4_gemv -c 2 python benchmarks/ncu_gemv.py",
     "Nsight Compute's view of the int4 GEMV at two shapes"),
    ("kernel_resources", "offline", "python benchmarks/kernel_resources.py",
     "registers, spills, shared memory and SASS counts of the kernels, compiled for sm_90a"),
    ("gemv_instruction_counts", "offline", "python benchmarks/gemv_instruction_counts.py",
     "SASS instructions a weight code in the int4 GEMV's loop and in two sketched alternatives"),
    # ---- ONNX Runtime on the CPU
    ("matmulnbits_cpu", "cpu", "python benchmarks/bench_matmulnbits_cpu.py --json {json} --markdown {md}",
     "one quantized matmul in ONNX Runtime per format and activation precision"),
    ("decode_weights_cpu", "cpu",
     "python benchmarks/bench_matmulnbits_cpu.py --decode-step 125m --rounds 31 --calls 10 --json {json} --markdown {md}",
     "the weight matmuls of one 125m decode step per weight format"),
    ("profile_decode_125m", "cpu",
     "edgettt create {tmp}/M --preset 125m && edgettt convert {tmp}/M {tmp}/P --form parallel --no-report"
     " && edgettt export {tmp}/P {tmp}/E --no-verify && python benchmarks/profile_onnx.py {tmp}/E --steps 64 --json {json}",
     "where a 125m decode step's time goes in ONNX Runtime, by operator"),
    ("decode_floor_cpu", "cpu",
     "edgettt quantize ttt-linear-tiny-parallel {tmp}/T --weights int4 && edgettt export {tmp}/T {tmp}/tiny-int4"
     " --no-verify && edgettt create {tmp}/M --preset 125m && edgettt convert {tmp}/M {tmp}/P --form parallel"
     " --no-report && edgettt quantize {tmp}/P {tmp}/Q --weights int4 && edgettt export {tmp}/Q {tmp}/125m-int4"
     " --no-verify && python benchmarks/decode_floor_cpu.py {tmp}/tiny-int4 {tmp}/125m-int4 --threads 1"
     " --json {json} --markdown {md}",
     "a decode step's floor on this CPU: weight bytes against the copy bandwidth, nodes against ONNX Runtime's "
     "cost per node, beside the measured step (the edge issue's limits)"),
    # ---- accuracy studies
    ("state_options", "cpu",
     "python benchmarks/state_options.py --model ttt-linear-tiny --ctx 8192 --max-tokens 32768 --json {json}"
     " --markdown {md}", "ways to keep the state in 8 bits, against each other"),
    ("state_growth", "cpu",
     "python benchmarks/state_growth.py --models ttt-linear-tiny-parallel --lengths 512,1024,2048,4096,8192 --json {json}",
     "how far a layer's state travels from S0 along a text, original against parallel forms"),
    ("int8_activations_accuracy", "cpu", "python benchmarks/int8_activations_accuracy.py --json {json}",
     "what int8 activations cost in accuracy in a quantized prefill"),
    ("prefill_int8_cpu", "cpu",
     "python benchmarks/int8_activations_by_layer.py ttt-linear-tiny-parallel ttt-mlp-tiny-parallel --markdown {md}",
     "which layers can take int8 activations per tensor in an exported prefill"),
    ("state_int8", "cpu",
     "edgettt report ttt-linear-tiny {tmp}/r --weights int8 --state int12,int8 --ctx 8192 --max-tokens 32768"
     " && cp {tmp}/r/report.json {json} && cp {tmp}/r/report.md {md}",
     "the int12 and int8 states at 8192 tokens in ttt-linear-tiny"),
]]

STUDIES = {  # write-ups in results/ that several runs made (their commands are in them), not one benchmark's output
    "model_speed_h200.md": "the model_speed_* results, read together",
    "mixed_distill_gpu.md": "the distillation stages of the shipped parallel forms on the H200",
    "prefill_design.md": "why the parallel prefill kernel is built as it is",
    "state_buckets.md": "position buckets of the calibrated int8 state's scales",
    "state_int8_onnx_cpu.md": "the int12 state's exports in ONNX Runtime",
    "lact_parallel_drift.md": "LaCT's parallel form: its drift and its distillation",
    "lact_state.md": "LaCT's fast-weight state formats",
    "lact_onnx.md": "LaCT's exports",
    "state_bits.md": "the decode state in 8 and 4 bits at a quarter and a seventh of fp32: options against issue 60",
    "redesign_check_125m.md": "the 125m batch-1 GPU table before and after the core/lab redesign, on one card",
}


def benchmark(name: str) -> Benchmark:
    for b in BENCHMARKS:
        if b.name == name:
            return b
    raise KeyError(name)


def result_files(b: Benchmark) -> list[str]:
    """The file names of a benchmark's one current result."""
    if b.writes_text:
        return [f"{b.name}.txt"]
    return ([f"{b.name}.json"] if "{json}" in b.command else []) + [f"{b.name}.md"]
