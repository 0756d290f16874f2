#!/usr/bin/env bash
# The main job, end to end on the bundled GPT example on CPU, from nothing, at default
# settings: set up .venv, profile -> solve -> launch (checked against one process) ->
# compare with the baselines and give the verdict. About 5 minutes on 2 quiet cores.
# Outputs land in out/. The longer tour (calibration, a published LLM planned without its
# hardware and exported, the data-parallel side) is scripts/demo-more.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh plot
CK=.venv/bin/ckplan
mkdir -p out
# Every layer timed with torch's default threads, and the whole model at 1 and 2 threads:
# solve scales the times to the threads a launch gives each rank.
$CK profile configs/models/gpt.py --repeats 3 --out out/gpt-cpu.json
# 80 MiB per stage lies between what full checkpointing (~60 MiB) and none (~120 MiB) need.
$CK solve --profile out/gpt-cpu.json --mem 80MiB --stages 4 --microbatches 8 --out out/plan.yaml
$CK launch out/plan.yaml --steps 4 --warmup-steps 1 --reference --report out/run.json
# rounds run round-robin and speed-ups pair them: rounds are added until ckplan's verdict against
# each baseline resolves, or 5 minutes of rounds are spent; then it says the machine was too noisy
$CK compare out/plan.yaml --steps 3 --warmup-steps 1 --rounds 2 --time-budget 300 --out out/compare.json --plot out/compare.png
