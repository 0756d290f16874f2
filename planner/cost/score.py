"""The one evaluator: any plan of any schedule scored by the cost model (a stage per rank by the
stage accumulator, several per rank by their rank's simulated order), so every plan, the
solvers', each baseline's and every export's rounding, is scored alike."""

from __future__ import annotations

from collections.abc import Sequence

from planner.cost.assembly import PlanCost, iteration_ms, option_indices, stage_cost
from planner.cost.layers import layer_costs
from planner.cost.reserve import with_replayed_reserve
from planner.schema import CHUNKED_SCHEDULES, Profile, StagePlan, TrainSetup


def evaluate(stages: Sequence[StagePlan], profile: Profile, setup: TrainSetup) -> PlanCost:
    """Score any plan. Raises ValueError if the stages are not a contiguous, complete,
    in-order cover of the profile's layers."""
    if setup.pipeline.schedule in CHUNKED_SCHEDULES:
        from planner.cost.chunked import (
            evaluate_chunked,  # scores each chunk with stage_cost: a cycle
        )

        return evaluate_chunked(stages, profile, setup)
    costs = layer_costs(profile)
    position = {layer.name: idx for idx, layer in enumerate(costs)}
    if len(stages) != setup.pipeline.stages:
        raise ValueError(f"plan has {len(stages)} stages, setup has {setup.pipeline.stages}")
    flat = [name for stage in stages for name in stage.layers]
    if flat != [layer.name for layer in costs]:
        unknown = [name for name in flat if name not in position]
        detail = f"unknown layers {unknown[:3]}" if unknown else "layers missing, repeated or out of order"
        raise ValueError(f"stages do not cover the profile's layers in order: {detail}")
    result = []
    for s, stage in enumerate(stages):
        layers = [costs[position[name]] for name in stage.layers]
        cost = stage_cost(layers, option_indices(stage, layers), stage=s, profile=profile, setup=setup)
        result.append(with_replayed_reserve(cost, stage, s, profile=profile, setup=setup))
    return PlanCost(stages=result, iteration_ms=iteration_ms([c.busy_ms for c in result], setup,
                                                             [c.step_ms for c in result]))
