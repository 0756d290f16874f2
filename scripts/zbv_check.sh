#!/usr/bin/env bash
# ZBV against its controls on CPU (docs/published-runs.md §18.tidy): the bundled GPT profiled at one
# thread, planned on 2 ranks under ZBV, interleaved-1F1B (2 chunks each) and 1F1B with the whole
# layers kept (a roomy cap), each launched ROUNDS times round-robin on gloo; then, per run,
# scripts/schedule_check.py: every chunk's measured F, I, W beside the cost model's, and the
# iteration simulated from the measured actions beside the measured and the predicted one; and
# scripts/split_prediction.py: each plan predicted with the profile's split backward times and without.
#   bash scripts/zbv_check.sh OUT_DIR [ROUNDS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "$1"); ROUNDS=${2:-3}
PY=${PYTHON:-.venv/bin/python}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"
[ -f "$OUT/gpt-t1.json" ] || $PY -m planner.cli profile configs/models/gpt.py --repeats 3 --threads 1 --out "$OUT/gpt-t1.json"
SCHEDULES=(ZBV interleaved-1F1B 1F1B)
for s in "${SCHEDULES[@]}"; do
  chunks=2; [ "$s" = 1F1B ] && chunks=1
  $PY -m planner.cli solve --profile "$OUT/gpt-t1.json" --mem 1GiB --stages 2 --chunks $chunks --schedule "$s" \
    --microbatches 8 --recompute whole-layer --out "$OUT/$s.yaml" > "$OUT/solve-$s.log"
done
for round in $(seq 1 "$ROUNDS"); do
  for s in "${SCHEDULES[@]}"; do
    echo "$s round $round, load $(cut -d' ' -f1-3 /proc/loadavg)"
    $PY -m planner.cli launch "$OUT/$s.yaml" --steps 3 --warmup-steps 1 --report "$OUT/run-$s-$round.json" | grep "^iteration:"
  done
done
for s in "${SCHEDULES[@]}"; do
  $PY scripts/schedule_check.py "$OUT/$s.yaml" "$OUT"/run-"$s"-*.json
done
for s in "${SCHEDULES[@]}"; do
  $PY scripts/split_prediction.py "$OUT/$s.yaml" "$OUT"/run-"$s"-*.json
done
