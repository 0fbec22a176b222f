#!/usr/bin/env bash
# Re-train the shipped tiny models and the transformer baseline on one GPU, then distill the
# parallel forms. One training at a time: processes sharing a GPU are time-sliced, which slows
# the launch-heavy TTT training far more than it saves.
#   python3 recipes/train_tiny.py --arch ttt-linear --out x --write-data scratch/data   # once, here
#   MINUTES=6 STEPS=600 WORK=/tmp/train PACK=$OUT bash recipes/train_all.sh              # on the GPU
# WORK gets the model directories and logs; PACK (optional) gets one .tar per model plus logs.tar.
set -euo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
MINUTES=${MINUTES:-6}; BATCH=${BATCH:-32}; DOCS_WEIGHT=${DOCS_WEIGHT:-0.3}; ARCHS=${ARCHS:-ttt-linear ttt-mlp transformer}; STEPS=${STEPS:-600}; DATA=${DATA:-scratch/data}; WORK=${WORK:-/tmp/train}
mkdir -p "$WORK"
for arch in $ARCHS; do
  python3 recipes/train_tiny.py --arch $arch --out "$WORK/$arch" --minutes "$MINUTES" --data-dir "$DATA" \
    --batch "$BATCH" --docs-weight "$DOCS_WEIGHT" > "$WORK/$arch.log" 2>&1
done
tail -n 1 "$WORK"/*.log
if [ -n "${PACK:-}" ]; then  # the trained models first, in case distillation runs out of time
  for m in ttt-linear ttt-mlp; do tar cf "$PACK/$m.tar" -C "$WORK" "$m"; done
fi
for arch in ttt-linear ttt-mlp; do
  python3 -m edgettt convert "$WORK/$arch" "$WORK/$arch-parallel" --form parallel --distill --steps "$STEPS" \
    --data "$DATA/train.bin" --eval-data "$DATA/test.bin" --ctx 512 --max-tokens 100000 --json \
    > "$WORK/$arch-distill.json" 2> "$WORK/$arch-distill.log" &
done
wait
for arch in ttt-linear ttt-mlp; do
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); b=r['distill']['before']; print(sys.argv[1], 'KLD', b['kld_mean'], '->', r['kld_mean'], 'bpb', r['ref']['bits_per_byte'], b['model']['bits_per_byte'], '->', r['model']['bits_per_byte'])" "$WORK/$arch-distill.json"
done
if [ -n "${PACK:-}" ]; then
  for m in ttt-linear-parallel ttt-mlp-parallel; do tar cf "$PACK/$m.tar" -C "$WORK" "$m"; done
  (cd "$WORK" && tar cf "$PACK/logs.tar" *.log *.json $(ls -d transformer 2>/dev/null))
fi
