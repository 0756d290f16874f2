"""The reserved peak of the GPU check's stages (docs/gpu-check.md) predicted by the caching
allocator replay (planner/cost/reserve.py) and by the divisor it replaces, against what the
H100 measured:

    .venv/bin/python scripts/reserve_check.py FAKE.json

FAKE.json: `ckplan profile --hf-config llama.json --fake --device cuda --gpu h100-sxm --dtype
bfloat16 --seq-len 4096 --micro-batch-size 1` of the check's config (scripts/gpu_check.py's
llama_config: LLaMA 3 8B widths, 6 layers). The measured profile the check scored its plans
from is not in the repository, so the fake profile of the same model stands in for it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from planner import io
from planner.cost import allocator, costmodel, reserve
from planner.schema import StagePlan, TrainSetup

MIB = 2**20
# docs/gpu-check.md, "Stage memory": torch.cuda.max_memory_reserved of one replayed step on an
# NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, 2026-11-26; and the divisor's prediction there
MEASURED_MIB = {("none", 0): 25_334, ("full", 0): 14_176, ("attn", 0): 24_016, ("mlp-act", 0): 22_678,
                ("offload", 0): 20_958, ("none", 3): 11_504}
MEASURED_ALLOCATED_MIB = {("none", 0): 23_953.0, ("full", 0): 13_650.6, ("attn", 0): 22_665.5,
                          ("mlp-act", 0): 21_105.0, ("offload", 0): 13_650.6, ("none", 3): 11_502.3}
DIVISOR_THEN_MIB = {("none", 0): 28_144, ("full", 0): 15_986, ("attn", 0): 26_628, ("mlp-act", 0): 24_792,
                    ("offload", 0): 15_986, ("none", 3): 13_458}


def stages_for(option: str, names: list[str]) -> list[StagePlan]:
    """Stage 0 = the embedding and all blocks but the last two, each under `option`; then one
    block a stage; then the head (scripts/gpu_check.py, section_stage_memory)."""
    blocks = names[1:-1]
    first = [names[0], *blocks[:-2]]
    chosen = {name: option for name in blocks[:-2]} if option != "none" else {}
    rest = [[name] for name in blocks[-2:]] + [[names[-1]]]
    return [StagePlan(index=0, layers=first).with_recompute(chosen),
            *(StagePlan(index=i + 1, layers=layers) for i, layers in enumerate(rest))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path)
    args = parser.parse_args()
    profile = io.load_profile(args.profile)
    names = [layer.name for layer in profile.layers]
    by_name = {layer.name: layer for layer in profile.layers}
    print("| plan | stage | allocated (cost model) | allocated (replay) | reserved, divisor (this profile) "
          "| reserved, divisor (check) | reserved, replay | measured | divisor error | replay error "
          "| fragmentation beyond the replay | replay ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (option, index), measured in MEASURED_MIB.items():
        setup = TrainSetup(stages=4, microbatches=8, micro_batch_size=1, mem_caps_bytes=[79 * 2**30] * 4,
                           optimizer="adam", precision="bf16")
        stages = stages_for(option, names)
        cost = costmodel.evaluate(stages, profile, setup).stages[index]
        plan = stages[index]
        options = [plan.option(name) for name in plan.layers]
        started = time.perf_counter()
        replayed = reserve.replay_stage(
            [by_name[name] for name in plan.layers], options, stage=index, setup=setup,
            memory=reserve.StageMemory(cost.static_bytes, cost.buffer_bytes, cost.step_scratch_bytes),
            loss=profile.loss_alloc,
            copy_ms_per_byte=reserve.host_copy_ms_per_byte(profile, setup) if "offload" in options else None)
        took_ms = (time.perf_counter() - started) * 1e3
        divisor = allocator.reserved_bytes(cost.peak_bytes, allocator.DEFAULT_FRAGMENTATION) / MIB
        mine = cost.reserved_bytes / MIB
        # what the device reserved beyond its allocated peak, less what the replay reserves beyond its own
        beyond = (measured - MEASURED_ALLOCATED_MIB[(option, index)]) - (mine - cost.peak_bytes / MIB)
        print(f"| {option} | {index} | {cost.peak_bytes / MIB:,.1f} MiB | {replayed.allocated_peak_bytes / MIB:,.1f} MiB "
              f"| {divisor:,.0f} MiB | {DIVISOR_THEN_MIB[(option, index)]:,} MiB | {mine:,.0f} MiB | {measured:,} MiB "
              f"| {measured / divisor - 1:+.1%} | {measured / mine - 1:+.1%} | {beyond:+,.0f} MiB | {took_ms:.0f} |")


if __name__ == "__main__":
    main()
