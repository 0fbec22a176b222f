#!/usr/bin/env bash
# Issue 21's model-level GPU table: random-weight TTT-Linear models of a preset against the same-size
# Llama, in one `edgettt speed --device cuda` run (kept workers: each model loads and compiles its decode
# step once; medians of -r repetitions, the paths in turns):
#   original   the mini-batch form (float; quantization takes a converted model)
#   exact      float weights, with the float and with the int8 state
#   parallel   float, int8 and int4 (groups of 64) weights, each with the float and with the int8 state
# (the exact form's quantized weights run the same GEMMs as the parallel form's: left out, for time)
# Decode steps compiled (--compile, the Llama's too) and replayed as CUDA graphs; the quantized layers'
# prefill GEMMs with int8 activations (--activations int8). Then the original as ttt-lm-pytorch runs it:
# plain torch (EDGETTT_KERNELS=0), eager steps.
#
#   PRESET=125m BATCH=1 OUT=results bash benchmarks/model_speed_gpu.sh       (on a CUDA machine)
#
# Writes $OUT/$PRESET-b$BATCH.json / .md and $OUT/$PRESET-b$BATCH-plain.json / .md. For a dry run on
# the CPU: SPEED_OPTIONS= BASELINE= CREATE="--hidden-size 64 --layers 2 --heads 2 --intermediate-size 128"
# TESTS="--pp 32 --tg 4 --depth 0,16" REPS=1. For a shorter run: COMBOS, the parallel form's weights:state
# pairs (default all six, e.g. COMBOS="none:fp32 none:int8 int4:fp32"), PLAIN=0 to leave out the plain run.
set -euo pipefail
PRESET=${PRESET:-125m}
OUT=${OUT:-model_speed}
WORK=${WORK:-$(mktemp -d)}
TESTS=${TESTS:---pp 512,8192 --tg 128 --depth 0,8192}
REPS=${REPS:-3}
BATCH=${BATCH:-1}
SPEED_OPTIONS=${SPEED_OPTIONS---device cuda --compile --activations int8}
BASELINE=${BASELINE-llama:$PRESET}
CREATE=${CREATE:---preset $PRESET}
mkdir -p "$OUT"
M=$WORK/$PRESET
[ -d "$M-original" ] || edgettt create "$M-original" $CREATE
paths=($BASELINE "$M-original")
for form in exact parallel; do
    [ -d "$M-$form" ] || edgettt convert "$M-original" "$M-$form" --form "$form" --no-report
    combos=(${COMBOS:-none:fp32 none:int8 int8:fp32 int8:int8 int4:fp32 int4:int8})
    [ "$form" = exact ] && combos=(none:fp32 none:int8)
    for combo in "${combos[@]}"; do
        weights=${combo%:*} state=${combo#*:}
        name=$M-$form-w$weights-s$state
        [ -d "$name" ] || edgettt quantize "$M-$form" "$name" --weights "$weights" --state "$state" \
            --group-size 64 > /dev/null
        paths+=("$name")
    done
done
speed() {  # name, then the paths and options
    local name=$1; shift
    edgettt speed "$@" --batch "$BATCH" $TESTS -r "$REPS" --force \
        --json "$OUT/$PRESET-b$BATCH$name.json" --markdown "$OUT/$PRESET-b$BATCH$name.md"
}
speed "" "${paths[@]}" $SPEED_OPTIONS
if [ "${PLAIN:-1}" = 1 ]; then
    EDGETTT_KERNELS=0 speed -plain "$M-original" ${SPEED_OPTIONS/--compile/}
fi
