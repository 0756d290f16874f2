#!/bin/bash
# The rows read through `evaluate --from-megatron` (docs/published-runs.md §17.bridge, §17.megfunc3, §18.megtime):
# Megatron-Bridge's LLaMA recipes B1-B6, T22, T23 and Megatron-LM's functional tests T15-T20 (M1-M6).
# usage: scripts/rows_megatron.sh TREE OUT   (TREE: a checkout of this repository; one JSON a row in OUT)
T=$(cd "$1" && pwd); O=$2; PY=${PY:-/work/main/.venv/bin/python}; mkdir -p "$O"
row() { env PYTHONPATH="$T" "$PY" -m planner.cli evaluate --from-megatron "$T/$2" --gpus "$3" --gpu "$4" "${@:5}" --json > "$O/$1.json" 2>&1; }
row T22 configs/megatron-bridge/b200_8b_fp8cs.yaml 8 b200
row T23 configs/megatron-bridge/h100_8b_fp8cs.yaml 8 h100
row B1 configs/megatron-bridge/gb200_8b_fp8cs.yaml 8 gb200
row B2 configs/megatron-bridge/h100_70b_fp8cs.yaml 64 h100
row B3 configs/megatron-bridge/gb200_70b_fp8cs.yaml 64 gb200
row B4 configs/megatron-bridge/h100_405b_fp8cs.yaml 1024 h100
row B5 configs/megatron-bridge/b200_405b_fp8cs.yaml 128 b200
row B6 configs/megatron-bridge/gb200_405b_fp8cs.yaml 256 gb200
row T15 configs/megatron-lm/gpt3_7b_tp1_pp4.yaml 8 h100
row T16 configs/megatron-lm/gpt3_7b_tp1_pp4.yaml 8 a100-80g
row T17 configs/megatron-lm/gpt3_7b_tp1_pp4.yaml 8 gb200 --gpus-per-node 4
row T18 configs/megatron-lm/gpt3_7b_tp4_pp1.yaml 8 h100
row T19 configs/megatron-lm/gpt3_7b_tp4_pp1.yaml 8 a100-80g
row T20 configs/megatron-lm/gpt3_7b_tp4_pp1.yaml 8 gb200 --gpus-per-node 4
