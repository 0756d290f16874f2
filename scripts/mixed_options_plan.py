"""Write a hand-made plan that gives chosen layers chosen recompute options, scored by the
cost model, for `ckplan launch PLAN --reference` (predicted vs measured peak per stage):

    .venv/bin/python scripts/mixed_options_plan.py PROFILE MODEL.py OUT.yaml \
        --stage embed=save-matmuls,layers.0=attn --stage layers.1=mlp-act,layers.2=full \
        --stage layers.3=attn,mlp-act;head=norm --microbatches 4

Each --stage lists a stage's layers in order (`name=option`; a bare name: none), separated
by commas, or by semicolons where an option itself holds a comma.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from planner import io
from planner.cost import costmodel
from planner.schema import (
    FileRef,
    Plan,
    PlanPredicted,
    SolverInfo,
    StagePlan,
    TrainSetup,
)

GIB = 2**30


def _stage(index: int, text: str) -> StagePlan:
    items = text.split(";") if ";" in text else text.split(",")
    layers, chosen = [], {}
    for item in items:
        name, _, option = item.partition("=")
        layers.append(name)
        if option:
            chosen[name] = option
    return StagePlan(index=index, layers=layers).with_recompute(chosen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("model", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--stage", action="append", required=True)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--schedule", default="1F1B")
    parser.add_argument("--precision", default=None, choices=["fp32", "bf16", "bf16-mixed"],
                        help="[default: the profile's dtype, as the runtime trains it: fp32 or bf16]")
    parser.add_argument("--mem-gib", type=float, default=1.0, help="every stage's cap, GiB [default: 1]")
    args = parser.parse_args()
    profile = io.load_profile(args.profile)
    stages = [_stage(index, text) for index, text in enumerate(args.stage)]
    precision = args.precision or {"bfloat16": "bf16"}.get(profile.dtype.removeprefix("torch."), "fp32")
    setup = TrainSetup(stages=len(stages), microbatches=args.microbatches, micro_batch_size=profile.micro_batch_size,
                       schedule=args.schedule, mem_caps_bytes=[int(args.mem_gib * GIB)] * len(stages), optimizer="adam",
                       precision=precision)
    cost = costmodel.evaluate(stages, profile, setup)
    plan = Plan(created_at=profile.created_at, model=io.file_ref(args.model),
                profile=FileRef(file=str(args.profile), sha256=io.sha256_file(args.profile)),
                device=profile.device, dtype=profile.dtype, setup=setup,
                stages=costmodel.with_predictions(stages, cost),
                predicted=PlanPredicted(iteration_ms=cost.iteration_ms, peak_bytes_max=max(cost.peak_bytes_per_stage)),
                solver=SolverInfo(name="hand", status="feasible"))
    io.save_plan(plan, args.out)
    for stage, stage_cost in zip(stages, cost.stages, strict=True):
        print(f"stage {stage.index}: {stage.recompute or 'none'}: predicted peak {stage_cost.peak_bytes:,} B")


if __name__ == "__main__":
    main()
