"""The one builder of a pipeline rank's dictionary in every --json output (evaluate, evaluate
--from-megatron / --from-torchtitan, solve, search), its keys declared once
(planner/schema/summary.py StageSummary): three builders had let a key reach one output and not
another (replayed_reserved_bytes and evaluate --profile --json, 033caec)."""

from __future__ import annotations

from collections.abc import Sequence


def stage_json(stage, cost, reserved_range: tuple[int, int] | None = None) -> dict:
    """`stage` (a StagePlan: one pipeline rank) with `cost` (its StageCost) and its replay's range (reserve_ranges),
    validated."""
    from planner.schema.summary import StageSummary

    predicted = cost.predicted()  # reserved_by as a plan records it ("divisor" where none was said)
    return StageSummary(
        index=stage.index, rank=stage.index, layers=list(stage.layers), checkpointed=list(stage.checkpointed),
        recompute=dict(stage.recompute), static_bytes=cost.static_bytes, after_step_bytes=cost.after_step_bytes,
        step_end_bytes=cost.step_end_bytes, peak_bytes=cost.peak_bytes, reserved_bytes=cost.reserved_bytes,
        reserved_by=predicted.reserved_by, replayed_reserved_bytes=cost.replayed_reserved_bytes,
        cap_replay=cost.cap_replay, uncapped_reserved_bytes=cost.uncapped_reserved_bytes,
        reserved_range_bytes=reserved_range,
        workspace_bytes=cost.workspace_bytes, nccl_buffers=cost.nccl_buffers or {}, cap_bytes=cost.cap_bytes, fits=cost.fits, time_ms=cost.time_ms,
        step_ms=cost.step_ms,
    ).model_dump()


def stages_json(stages: Sequence, plan_cost, ranges: Sequence[tuple[int, int] | None] | None = None) -> list[dict]:
    """Every rank of a plan: `stages` (one StagePlan a rank) scored as `plan_cost` (a PlanCost), with each rank's
    replayed reserve's range where `ranges` (reserve_ranges) gives one."""
    if len(stages) != len(plan_cost.stages):
        raise ValueError(f"{len(stages)} stages but {len(plan_cost.stages)} costs")
    ranges = ranges or [None] * len(stages)
    return [stage_json(stage, cost, found) for stage, cost, found in zip(stages, plan_cost.stages, ranges)]


def reserve_ranges(stages: Sequence, plan_cost, *, profile, setup) -> list[tuple[int, int] | None]:
    """Each rank's replayed reserve's range (planner/cost/replayed_reserve.py reserved_range; None where none)."""
    from planner.cost.replayed_reserve import reserved_range

    return [reserved_range(cost, stage, rank, profile=profile, setup=setup)
            for rank, (stage, cost) in enumerate(zip(stages, plan_cost.stages))]


def range_line(ranges: Sequence[tuple[int, int] | None], plan_cost) -> str | None:
    """One line on the ranks whose replayed reserve moves with its large requests a page off; None where none does."""
    def gib(size: int) -> str:
        return f"{size / 2**30:.1f}"

    # a rank whose ends print alike moved by a page or two, not into another mode: said in the JSON only
    moved = [f"rank {rank} {gib(cost.reserved_bytes)} GiB in [{low}, {high}]"
             for rank, (found, cost) in enumerate(zip(ranges, plan_cost.stages))
             if found is not None and (low := gib(found[0])) != (high := gib(found[1]))]
    if not moved:
        return None
    return ("the caching allocator's replay lands in another mode with each request of 512 MiB or more 2 MiB larger "
            "or smaller: reserved " + "; ".join(moved))
