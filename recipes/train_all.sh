#!/usr/bin/env bash
# Re-train the shipped tiny models and the transformer baseline on one GPU, then distill the
# parallel forms. One training at a time: processes sharing a GPU are time-sliced, which slows
# the launch-heavy TTT training far more than it saves.
#   python3 recipes/train_tiny.py --arch ttt-linear --out x --write-data scratch/data   # once, here
#   MINUTES=4.4 WORK=/tmp/train PACK=$OUT bash recipes/train_all.sh                      # on the GPU
# ARCHS: what to train; DISTILL: which trained TTT models in WORK to convert to the parallel form
# and distill; CTX: training window (fewer sequential mini-batches a step when shorter);
# DISTILL_DATA: the distillation text (docs_train.bin; train.bin, 29x more text: shipped ttt-linear-tiny-parallel).
# WORK gets the model directories and logs; PACK (optional) gets one .tar per model
# plus logs.tar. The session's 10-minute device calls split it: ARCHS="ttt-linear ttt-mlp"
# DISTILL="" first, then ARCHS=transformer with the first call's models carried in WORK.
set -euo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
MINUTES=${MINUTES:-4.4}; BATCH=${BATCH:-256}; DOCS_WEIGHT=${DOCS_WEIGHT:-0.3}; STEPS=${STEPS:-1000}; CTX=${CTX:-512}
ARCHS=${ARCHS-ttt-linear ttt-mlp transformer}; DISTILL=${DISTILL-ttt-linear ttt-mlp}
DATA=${DATA:-scratch/data}; WORK=${WORK:-/tmp/train}; DISTILL_DATA=${DISTILL_DATA:-docs_train.bin}
mkdir -p "$WORK"
for arch in $ARCHS; do
  python3 recipes/train_tiny.py --arch $arch --out "$WORK/$arch" --minutes "$MINUTES" --data-dir "$DATA" \
    --batch "$BATCH" --ctx "$CTX" --docs-weight "$DOCS_WEIGHT" > "$WORK/$arch.log" 2>&1
  tail -n 1 "$WORK/$arch.log"
  if [ -n "${PACK:-}" ]; then tar cf "$PACK/$arch.tar" -C "$WORK" "$arch" "$arch.log"; fi
done
for arch in $DISTILL; do  # distillation runs on the GPU: the teacher is the eager mini-batch loop
  python3 -m edgettt convert "$WORK/$arch" "$WORK/$arch-parallel" --form parallel --distill --steps "$STEPS" \
    --data "$DATA/$DISTILL_DATA" --eval-data "$DATA/test.bin" --ctx 512 --max-tokens 100000 --json --force \
    > "$WORK/$arch-distill.json" 2> "$WORK/$arch-distill.log" &
done
wait
for arch in $DISTILL; do
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); b=r['distill']['before']; print(sys.argv[1], 'KLD', b['kld_mean'], '->', r['kld_mean'], 'bpb', r['ref']['bits_per_byte'], b['model']['bits_per_byte'], '->', r['model']['bits_per_byte'])" "$WORK/$arch-distill.json"
  if [ -n "${PACK:-}" ]; then tar cf "$PACK/$arch-parallel.tar" -C "$WORK" "$arch-parallel" "$arch-distill.json" "$arch-distill.log"; fi
done
