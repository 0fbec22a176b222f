#!/usr/bin/env bash
# Issue 21's model-level GPU table in one run: random-weight TTT-Linear models of a preset (original,
# exact and parallel forms; the parallel form with int8 / int4 weights and with the int8 state) against
# the same-size Llama, timed by `edgettt speed --device cuda` (medians of -r repetitions, the paths in turns).
#
#   PRESET=125m OUT=results bash benchmarks/model_speed_gpu.sh        (on a CUDA machine; PRESET=760m too)
#
# (Written 2026-12-02 without device time left: its steps were run on the CPU with a small model, the
# speed commands not yet; results go to benchmarks/results/model_speed_h200.md when they are.)
#
# Writes $OUT/$PRESET-*.json and .md:
#   float    llama, parallel, exact, original: decode steps compiled (--compile, every model alike)
#   weights  llama, parallel float / int8 / int4 weights: prefill GEMMs with int8 activations
#            (--activations int8), decode steps compiled (the weights' kernels run inside the graph as
#            single operations, `weight_formats.int4_linear`)
#   state    llama, parallel with the float and with the int8 state: steps compiled (a quantized state
#            compiles: checked on the CPU, 5 graphs for 32 positions, logits within 5e-3 of eager)
#   plain    the original as ttt-lm-pytorch runs it: plain torch (EDGETTT_KERNELS=0), eager steps
set -euo pipefail
PRESET=${PRESET:-125m}
OUT=${OUT:-model_speed}
WORK=${WORK:-$(mktemp -d)}
TESTS=${TESTS:---pp 512,8192 --tg 128 --depth 0,8192}
REPS=${REPS:-3}
BATCH=${BATCH:-1}
mkdir -p "$OUT"
M=$WORK/$PRESET
[ -d "$M-ttt" ] || edgettt create "$M-ttt" --preset "$PRESET"
[ -d "$M-exact" ] || edgettt convert "$M-ttt" "$M-exact" --form exact --no-report
[ -d "$M-par" ] || edgettt convert "$M-ttt" "$M-par" --form parallel --no-report
[ -d "$M-par-int8" ] || edgettt quantize "$M-par" "$M-par-int8" --weights int8
[ -d "$M-par-int4" ] || edgettt quantize "$M-par" "$M-par-int4" --weights int4 --group-size 64
[ -d "$M-par-state8" ] || edgettt quantize "$M-par" "$M-par-state8" --weights none --state int8
speed() {  # name, then the paths and options
    local name=$1; shift
    edgettt speed "$@" --device cuda --batch "$BATCH" $TESTS -r "$REPS" --force \
        --json "$OUT/$PRESET-b$BATCH-$name.json" --markdown "$OUT/$PRESET-b$BATCH-$name.md"
}
speed float llama:"$PRESET" "$M-par" "$M-exact" "$M-ttt" --compile
speed weights llama:"$PRESET" "$M-par" "$M-par-int8" "$M-par-int4" --activations int8 --compile
speed state llama:"$PRESET" "$M-par" "$M-par-state8" --compile
EDGETTT_KERNELS=0 speed plain "$M-ttt"
