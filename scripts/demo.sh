#!/usr/bin/env bash
# The main job, end to end on the bundled GPT example on CPU, from nothing:
# set up .venv, profile -> calibrate -> solve -> launch -> compare; then a published LLM
# planned without its hardware, scored and exported. Outputs land in out/
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh plot
CK=.venv/bin/ckplan
mkdir -p out
# One torch thread per layer measurement: the runtime gives each stage's rank the
# profile's thread count, so measured and predicted times are comparable.
$CK profile configs/models/gpt.py --threads 1 --repeats 3 --out out/gpt-cpu.json
# Calibrate this machine first: sends between stages, the schedule's cost per action and
# the compute scale, measured on a 2-stage plan whose ranks fit the cores; then what 4
# ranks sharing 2 cores cost, on the 4-stage plan. solve reads out/gpt-cpu.calibration.json.
$CK solve --profile out/gpt-cpu.json --mem 1GiB --stages 2 --microbatches 4 --out out/plan-2.yaml
$CK calibrate out/plan-2.yaml --steps 3 --warmup-steps 1
# 80 MiB per stage lies between what full checkpointing (~60 MiB) and none (~120 MiB) need.
$CK solve --profile out/gpt-cpu.json --mem 80MiB --stages 4 --microbatches 8 --out out/plan.yaml
$CK calibrate out/plan.yaml --steps 3 --warmup-steps 1
$CK solve --profile out/gpt-cpu.json --mem 80MiB --stages 4 --microbatches 8 --out out/plan.yaml
$CK launch out/plan.yaml --steps 4 --warmup-steps 1 --report out/run.json
# rounds run round-robin and speed-ups pair them; rounds are added (up to 4) until ckplan's
# verdict against every other strategy is resolved
$CK compare out/plan.yaml --steps 4 --warmup-steps 1 --rounds 2 --max-rounds 4 --out out/compare.json \
  --plot out/compare.png
# A published LLM planned without its hardware: LLaMA 3 70B at 8k tokens, 8-way tensor
# parallel with sequence parallelism on H100s, 4 pipeline stages. Then ColossalAI's own
# hand configuration for it scored beside ckplan's plan, and the plan exported.
$CK profile --arch llama3-70b --seq-len 8192 --micro-batch-size 1 --tp 8 --sp --gpu h100 --out out/llama3-70b.json
$CK solve --profile out/llama3-70b.json --stages 4 --mem 80GB --microbatches 16 --precision bf16-mixed \
  --out out/llama3-70b.yaml
$CK evaluate --profile out/llama3-70b.json --mem 80GB --microbatches 16 --precision bf16-mixed \
  --layers-per-stage 19,20,20,21 --ckpt-per-stage 19,19,19,13
for framework in megatron colossalai torchtitan deepspeed; do
  $CK export out/llama3-70b.yaml --to "$framework"
done
# The data-parallel side: 8 replicas of every stage on 40 GB devices. Every ZeRO stage x
# shard group x optimizer offload, the checkpointing re-solved for each; the fastest that
# fits is written and exported (ZeRO carried into the framework's options).
COLUMNS=200 $CK solve --profile out/llama3-70b.json --stages 4 --mem 40GB --microbatches 16 --precision bf16-mixed \
  --dp 8 --auto-dp --out out/llama3-70b-dp8.yaml
$CK export out/llama3-70b-dp8.yaml --to megatron
