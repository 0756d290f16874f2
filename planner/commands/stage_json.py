"""The one builder of a pipeline rank's dictionary in every --json output (evaluate, evaluate
--from-megatron / --from-torchtitan, solve, search), its keys declared once
(planner/schema/summary.py StageSummary): three builders had let a key reach one output and not
another (replayed_reserved_bytes and evaluate --profile --json, 033caec)."""

from __future__ import annotations

from collections.abc import Sequence


def stage_json(stage, cost) -> dict:
    """`stage` (a StagePlan: one pipeline rank) with `cost` (its StageCost), validated."""
    from planner.schema.summary import StageSummary

    predicted = cost.predicted()  # reserved_by as a plan records it ("divisor" where none was said)
    return StageSummary(
        index=stage.index, rank=stage.index, layers=list(stage.layers), checkpointed=list(stage.checkpointed),
        recompute=dict(stage.recompute), static_bytes=cost.static_bytes, after_step_bytes=cost.after_step_bytes,
        step_end_bytes=cost.step_end_bytes, peak_bytes=cost.peak_bytes, reserved_bytes=cost.reserved_bytes,
        reserved_by=predicted.reserved_by, replayed_reserved_bytes=cost.replayed_reserved_bytes,
        cap_replay=cost.cap_replay, uncapped_reserved_bytes=cost.uncapped_reserved_bytes,
        workspace_bytes=cost.workspace_bytes, nccl_buffers=cost.nccl_buffers or {}, cap_bytes=cost.cap_bytes, fits=cost.fits, time_ms=cost.time_ms,
        step_ms=cost.step_ms,
    ).model_dump()


def stages_json(stages: Sequence, plan_cost) -> list[dict]:
    """Every rank of a plan: `stages` (one StagePlan a rank) scored as `plan_cost` (a PlanCost)."""
    if len(stages) != len(plan_cost.stages):
        raise ValueError(f"{len(stages)} stages but {len(plan_cost.stages)} costs")
    return [stage_json(stage, cost) for stage, cost in zip(stages, plan_cost.stages)]
