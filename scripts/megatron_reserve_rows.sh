#!/usr/bin/env bash
# The Megatron rows whose reserve is replayed (docs/published-runs.md §18.megrec): the eight Megatron-Bridge
# recipes (T22, T23, B1-B6) and Megatron-LM's 7B functional tests (M1-M6 / T15-T20), each `evaluate
# --from-megatron ... --json` into OUT/<row>.json; then scripts/megatron_reserve_table.py OUT [BEFORE] prints them.
# usage: bash scripts/megatron_reserve_rows.sh TREE OUT
set -u
T=$(cd "$1" && pwd); mkdir -p "$2"; O=$(cd "$2" && pwd)
PY=${PY:-/work/main/.venv/bin/python}
# run inside TREE: `python -m` puts the working directory ahead of PYTHONPATH, so from another checkout it
# would score that checkout's planner instead
row() { name=$1; shift; (cd "$T" && env PYTHONPATH="$T" "$PY" -m planner.cli evaluate "$@" --json) > "$O/$name.json" \
          2> "$O/$name.err" || echo "$name failed: $(tail -1 "$O/$name.err")"; }
B=$T/configs/megatron-bridge; L=$T/configs/megatron-lm
row T22 --from-megatron $B/b200_8b_fp8cs.yaml --gpus 8 --gpu b200
row T23 --from-megatron $B/h100_8b_fp8cs.yaml --gpus 8 --gpu h100
row B1 --from-megatron $B/gb200_8b_fp8cs.yaml --gpus 8 --gpu gb200
row B2 --from-megatron $B/h100_70b_fp8cs.yaml --gpus 64 --gpu h100
row B3 --from-megatron $B/gb200_70b_fp8cs.yaml --gpus 64 --gpu gb200
row B4 --from-megatron $B/h100_405b_fp8cs.yaml --gpus 1024 --gpu h100
row B5 --from-megatron $B/b200_405b_fp8cs.yaml --gpus 128 --gpu b200
row B6 --from-megatron $B/gb200_405b_fp8cs.yaml --gpus 256 --gpu gb200
for y in tp1_pp4 tp4_pp1; do for g in h100 a100-80g gb200; do
  extra=""; [ $g = gb200 ] && extra="--gpus-per-node 4 --nvlink-domain 4"
  row meg_${y}_$g --from-megatron $L/gpt3_7b_${y}_memory_speed.yaml --gpus 8 --gpu $g $extra
done; done
