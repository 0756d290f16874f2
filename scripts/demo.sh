#!/usr/bin/env bash
# The main job, end to end on the bundled GPT example on CPU, from nothing:
# set up .venv, profile -> solve -> launch -> compare. Outputs land in out/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh plot
CK=.venv/bin/ckplan
mkdir -p out
# One torch thread per layer measurement: the runtime gives each stage's rank the
# profile's thread count, so measured and predicted times are comparable.
$CK profile configs/models/gpt.py --threads 1 --repeats 3 --out out/gpt-cpu.json
# 80 MiB per stage lies between what full checkpointing (~60 MiB) and none (~120 MiB) need.
$CK solve --profile out/gpt-cpu.json --mem 80MiB --stages 4 --microbatches 8 --out out/plan.yaml
$CK launch out/plan.yaml --steps 4 --warmup-steps 1 --report out/run.json
# two rounds, round-robin: a shared machine drifts by tens of percent within minutes
$CK compare out/plan.yaml --steps 4 --warmup-steps 1 --rounds 2 --out out/compare.json --plot out/compare.png
