#!/usr/bin/env bash
# The model-level GPU table: random-weight TTT-Linear models of a preset against the same-size
# Llama, in one `edgettt bench --device cuda` run (kept workers: each model loads and compiles its decode
# step once; medians of -r repetitions, the paths in turns):
#   original   the mini-batch form (float; quantization takes a converted model)
#   exact      float weights, with the float and with the int12 state
#   parallel   float, int8 and int4 (groups of 64) weights, each with the float and with the int12 state
# (the exact form's quantized weights run the same GEMMs as the parallel form's: left out, for time)
# Every model as `edgettt.prepare` makes it: decode steps compiled (the Llama's too) and replayed as CUDA
# graphs, prefills timed as graph replays, the quantized layers weight-only. Then the original as
# ttt-lm-pytorch runs it: plain torch (no kernels), eager steps (through the API's CudaOptions).
#
#   PRESET=125m BATCH=1 OUT=results bash benchmarks/model_speed_gpu.sh       (on a CUDA machine)
#
# Writes $OUT/$PRESET-b$BATCH.json / .md and $OUT/$PRESET-b$BATCH-plain.json / .md. For a dry run on
# the CPU: SPEED_OPTIONS= BASELINE= CREATE="--set num_attention_heads=2 --set intermediate_size=128" PLAIN=0
# TESTS="--pp 32 --tg 4 --depth 0,16" REPS=1. For a shorter run: COMBOS, the parallel form's weights:state
# pairs (default all six, e.g. COMBOS="none:fp32 none:int12 int4:fp32"), PLAIN=0 to leave out the plain run.
set -euo pipefail
PRESET=${PRESET:-125m}
OUT=${OUT:-model_speed}
WORK=${WORK:-$(mktemp -d)}
TESTS=${TESTS:---pp 512,8192 --tg 128 --depth 0,8192}
REPS=${REPS:-3}
BATCH=${BATCH:-1}
SPEED_OPTIONS=${SPEED_OPTIONS---device cuda}
BASELINE=${BASELINE-llama:$PRESET}
CREATE=${CREATE:---preset $PRESET}
mkdir -p "$OUT"
M=$WORK/$PRESET
[ -d "$M-original" ] || edgettt create "$M-original" $CREATE
paths=($BASELINE "$M-original")
for form in exact parallel; do
    [ -d "$M-$form" ] || edgettt convert "$M-original" "$M-$form" --form "$form" --no-report
    combos=(${COMBOS:-none:fp32 none:int12 int8:fp32 int8:int12 int4:fp32 int4:int12})
    [ "$form" = exact ] && combos=(none:fp32 none:int12)
    for combo in "${combos[@]}"; do
        weights=${combo%:*} state=${combo#*:}
        name=$M-$form-w$weights-s$state
        [ -d "$name" ] || edgettt quantize "$M-$form" "$name" --weights "$weights" --state "$state" > /dev/null
        paths+=("$name")
    done
done
edgettt bench "${paths[@]}" $SPEED_OPTIONS --batch "$BATCH" $TESTS -r "$REPS" --force \
    --json "$OUT/$PRESET-b$BATCH.json" --markdown "$OUT/$PRESET-b$BATCH.md"
if [ "${PLAIN:-1}" = 1 ]; then  # eager steps, eager prefill: a lab switch, so through the API
    python - "$M-original" "$OUT/$PRESET-b$BATCH-plain" "$BATCH" $TESTS -r "$REPS" <<'EOF'
import sys
from edgettt.benchmark import CudaOptions, run, table, tests, write
from edgettt.cli import int_list
from edgettt.outputs import plan_outputs
path, out, batch, args = sys.argv[1], sys.argv[2], int(sys.argv[3]), dict(zip(sys.argv[4::2], sys.argv[5::2]))
lists = [int_list(None, None, args[k], low=0 if k == "--depth" else 1) for k in ("--pp", "--tg", "--depth")]
outs = plan_outputs((out + ".json", "json", True, "--json"), (out + ".md", "markdown", True, "--markdown"))
result = run([path], tests(*lists), int(args["-r"]), device="cuda", batch=batch,
             cuda=CudaOptions(kernels=False, compile=False, graph_prefill=False))
write(result, *outs)
print(table(result))
EOF
fi
