#!/usr/bin/env bash
# Re-train the shipped models and the same-size transformer, then distil the TTT models' parallel forms:
# every stage of recipes/results/README.md in order, each continuing the last, with the steps the shipped
# runs made (they ran on the clock, several on a shared GPU or the CPU; here the steps set each schedule).
#   python3 recipes/train_tiny.py --arch ttt-linear --out x --write-data scratch/data   # once, here
#   GPUS=2 WORK=/tmp/train PACK=$OUT bash recipes/train_all.sh                          # on the GPUs
#   DRY=1 bash recipes/train_all.sh                                                     # print the commands
# A model to ship then gets its eval.json from recipes/eval_card.py (docs/models.md) and a MODEL_CARD.md.
# With GPUS > 1 the archs run side by side, one a GPU; with one GPU, one at a time (processes sharing a
# GPU are time-sliced, which slows the launch-heavy TTT training far more than it saves).
# Environment: ARCHS (trained), DISTILL (distilled), DATA (the data parts), WORK (models and logs), PACK
# (optional: one .tar a final model there), DRY (print, run nothing).
set -euo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
ARCHS=${ARCHS-ttt-linear ttt-mlp transformer lact lact-w1 gated-deltanet}; DISTILL=${DISTILL-ttt-linear ttt-mlp}
GPUS=${GPUS:-1}; DATA=${DATA:-scratch/data}; WORK=${WORK:-/tmp/train}; DRY=${DRY:-}
# the TTT models, their transformer and Gated DeltaNet: twice the 1.9M models' parameters, stored in bf16, dropout 0.1
LARGE="--hidden 256 --layers 5 --store bfloat16 --dropout 0.1"
declare -A SIZE_OF=([ttt-linear]=$LARGE [ttt-mlp]=$LARGE [transformer]=$LARGE [lact]="" [lact-w1]="" [gated-deltanet]=$LARGE)
# each arch's schedules, ';' between them: "steps lr eval-every [train_tiny.py options]"; every one after the
# first continues the one before (--init); early stopping keeps the best validation weights of each. Gated
# DeltaNet takes ttt-linear's, its delta rule compiled (0.126 s a step on an H100 against 0.168 eager). The last TTT and transformer schedule is the docs-weighted tail: 15% of its windows from python-docs:train.
declare -A SCHEDULES_OF=(
  [ttt-linear]="2349 3e-3 500; 1146 1e-3 250; 5230 1.5e-3 500; 1222 3e-4 100 --docs-weight 0.15"
  [ttt-mlp]="430 3e-3 200 --compile; 782 2e-3 200 --compile; 831 1.5e-3 200 --compile;
             143 3e-4 40 --compile --docs-weight 0.15"
  [transformer]="4304 3e-3 250; 660 3e-4 50 --docs-weight 0.15"
  [lact]="1507 3e-3 500" [lact-w1]="1681 3e-3 500"
  [gated-deltanet]="2349 3e-3 500 --compile; 1146 1e-3 250 --compile; 5230 1.5e-3 500 --compile;
                   1222 3e-4 100 --compile --docs-weight 0.15")
# each TTT model's parallel form: the plain conversion, then benchmarks/mixed_distill.py stages (';' between
# them), each continuing the last; @ stands for $DATA/. The first makes it a decayed form (--decay).
declare -A DISTILL_OF=(
  [ttt-linear]="--decay 0.97 --lengths 512,2048 --batch 4 --lr 3e-3 --steps 5540 --data @train.bin;
                --lengths 512,2048 --batch 4 --lr 1e-3 --steps 3456 --data @train.bin;
                --lengths 512,2048 --batch 2 --lr 3e-4 --steps 589 --data @docs_train.bin"
  [ttt-mlp]="--decay 0.97 --lengths 512,2048,8192 --batch 4 --lr 5e-4 --pool 24 --steps 444 --data @train.bin;
             --lengths 512,2048,8192 --batch 4 --lr 3e-4 --pool 24 --steps 422 --data @train.bin;
             --lengths 512,2048 --batch 1 --lr 3e-4 --steps 333 --data @docs_train.bin;
             --lengths 512,2048 --batch 4 --lr 1e-4 --hard-weight 0.3 --steps 295 --data @docs_train.bin")
run() {  # the command, or only its line with DRY
  if [ -n "$DRY" ]; then echo "$*"; else "$@"; fi
}
stages() {  # a ';'-separated list -> one stage a line, blanks trimmed
  echo "$1" | tr ';' '\n' | sed -e 's/^ *//' -e 's/ *$//' | grep -v '^$'
}
train_arch() {  # arch: its schedules in turn, output $WORK/$arch (each stage's in $WORK/$arch-sN)
  local arch=$1 i=0 init="" steps lr every options
  while read -r steps lr every options; do
    i=$((i + 1))
    run python3 recipes/train_tiny.py --arch "$arch" --out "$WORK/$arch-s$i" --steps "$steps" --minutes 600 \
      --lr "$lr" --eval-every "$every" --data-dir "$DATA" ${SIZE_OF[$arch]} $options $init
    init="--init $WORK/$arch-s$i"
  done < <(stages "${SCHEDULES_OF[$arch]}")
  run cp -r "$WORK/$arch-s$i" "$WORK/$arch"
}
distill_arch() {  # arch: its parallel form, output $WORK/$arch-parallel (each stage's in $WORK/$arch-pN)
  local arch=$1 i=0 options
  run python3 -m edgettt convert "$WORK/$arch" "$WORK/$arch-p0" --form parallel --no-report --force
  while read -r options; do
    i=$((i + 1))
    run python3 benchmarks/mixed_distill.py --teacher "$WORK/$arch" --student "$WORK/$arch-p$((i - 1))" \
      ${options//@/$DATA/} --store bfloat16 --eval-data "$DATA/test.bin" --max-tokens 100000 \
      --save "$WORK/$arch-p$i" --json "$WORK/$arch-p$i.json"
  done < <(stages "${DISTILL_OF[$arch]}")
  run cp -r "$WORK/$arch-p$i" "$WORK/$arch-parallel"
  # distilled at 512 and 2048, measured to hold at 8192: the shipped config.json says 8192 (where the warning starts)
  run python3 -c 'import json, sys; p = sys.argv[1] + "/config.json"; c = json.load(open(p)); c["distilled_ctx"] = 8192; json.dump(c, open(p, "w"), indent=2)' "$WORK/$arch-parallel"
}
on_gpus() {  # function, archs: one arch a GPU side by side when GPUS > 1, else one after another
  local fn=$1 job=0; shift
  for arch in "$@"; do
    if [ "$GPUS" -gt 1 ] && [ -z "$DRY" ]; then
      CUDA_VISIBLE_DEVICES=$((job % GPUS)) $fn "$arch" > "$WORK/$fn.$arch.log" 2>&1 &
    else
      $fn "$arch"
    fi
    job=$((job + 1))
  done
  wait
}
[ -n "$DRY" ] || mkdir -p "$WORK"
on_gpus train_arch $ARCHS
on_gpus distill_arch $DISTILL
if [ -n "${PACK:-}" ] && [ -z "$DRY" ]; then
  for arch in $ARCHS; do tar cf "$PACK/$arch.tar" -C "$WORK" "$arch"; done
  for arch in $DISTILL; do tar cf "$PACK/$arch-parallel.tar" -C "$WORK" "$arch-parallel"; done
fi
