#!/bin/bash
# T24 (docs/published-runs.md §2, §18.agree): BLOOM 176B as Megatron-DeepSpeed ran it, read as a GPT-2 config.
# Prints the iteration time (s), its ratio to the published ~105 s, and the worst stage's allocated peak (GiB).
#   bash scripts/t24_bloom.sh [CONFIG] [OUT_PREFIX]
# CONFIG defaults to configs/published/t24_bloom176b_gpt2.json (its activation: the fused bias-GELU BLOOM ran,
# framework-facts §55); pass a copy with "gelu_new" for the row as scored up to §18. DeepSpeed as BLOOM ran it
# (56c52238, framework-facts §61) and Jean Zay's network (one 100 Gb/s Omni-Path link a ring) since §18.t24;
# RUNTIME="" for the newest DeepSpeed record at the DGX A100's network, as scored to §18.agree.
set -e
cd "$(dirname "$0")/.."
CONFIG=${1:-configs/published/t24_bloom176b_gpt2.json}
OUT=${2:-/tmp/t24}
PY=${PYTHON:-python}
RUNTIME=${RUNTIME---runtime-version 56c52238 --shard-bandwidth 12.5}
export PYTHONPATH=$PWD
L=5,6,6,6,6,6,6,6,6,6,6,5
$PY -m planner.cli profile --arch-config "$CONFIG" --seq-len 2048 --micro-batch-size 2 --tp 4 --attention eager \
  --gpu a100-80g --out "$OUT.profile.json" > /dev/null
$PY -m planner.cli evaluate --profile "$OUT.profile.json" --layers-per-stage $L --ckpt-per-stage $L --dp 8 --zero 1 \
  --microbatches 128 --mem 80GB --precision bf16-mixed --runtime deepspeed $RUNTIME --json > "$OUT.eval.json"
$PY - "$OUT.eval.json" <<'PY'
import json, sys
hand = json.load(open(sys.argv[1]))["hand"]
seconds = hand["iteration_ms"] / 1e3
peak = max(stage["peak_bytes"] for stage in hand["stages"]) / 2**30
print(f"T24: {seconds:.3f} s ({seconds / 105.0:.3f} of ~105 s), worst stage allocated peak {peak:.2f} GiB")
PY
