"""Each bound of planner/solve/bounds.py is a true lower bound: no plan of the setup, whatever
its split and recompute options, is faster than the time bound or has a busiest stage holding
less than the memory bound (random plans under every schedule; the optima are held to the bound
in test_search.py)."""

from __future__ import annotations

import random

import pytest
from test_search import MINI, profile_for

from planner.cost import costmodel
from planner.schema import SPLIT_BACKWARD_SCHEDULES, StagePlan, TrainSetup, runs_split_backward
from planner.solve.bounds import setup_bounds

GiB = 2**30


def random_stages(profile, num_stages: int, rng: random.Random, setup: TrainSetup) -> list[StagePlan]:
    """Contiguous stages at random cuts, each layer at a random option the schedule runs."""
    names = [layer.name for layer in profile.layers]
    cuts = sorted(rng.sample(range(1, len(names)), num_stages - 1))
    bounds = [0, *cuts, len(names)]
    stages = []
    for s in range(num_stages):
        layers = names[bounds[s]:bounds[s + 1]]
        options = {}
        for layer in profile.layers[bounds[s]:bounds[s + 1]]:
            choices = [o.name for o in layer.recompute_options
                       if setup.pipeline.chunks == 1 or not o.host_bytes
                       if setup.pipeline.schedule not in SPLIT_BACKWARD_SCHEDULES or runs_split_backward(o.name)] or ["none", "full"]
            pick = rng.choice(choices)
            if pick != "none":
                options[layer.name] = pick
        stages.append(StagePlan(index=s, layers=layers, recompute=options))
    return stages


@pytest.mark.parametrize("schedule, chunks, stages, microbatches, dp, zero, runtime", [
    ("1F1B", 1, 1, 4, 8, 3, "ckplan"),
    ("1F1B", 1, 2, 4, 4, 1, "ckplan"),
    ("1F1B", 1, 4, 8, 2, 0, "ckplan"),
    ("GPipe", 1, 3, 2, 1, 0, "ckplan"),
    ("interleaved-1F1B", 2, 2, 4, 2, 2, "ckplan"),
    ("ZBV", 2, 2, 4, 1, 0, "ckplan"),
    ("1F1B", 1, 2, 4, 4, 3, "torchtitan"),
    ("1F1B", 1, 2, 8, 4, 1, "megatron"),
    ("interleaved-1F1B", 2, 2, 4, 2, 1, "megatron"),
    # ranks past the second: the fill and drain (a_r) in the bound
    ("interleaved-1F1B", 2, 3, 6, 1, 0, "ckplan"),
    ("interleaved-1F1B", 2, 4, 8, 2, 1, "megatron"),
    ("interleaved-1F1B", 2, 4, 4, 1, 0, "torchtitan"),
])
def test_bounds_hold_for_random_plans(schedule, chunks, stages, microbatches, dp, zero, runtime):
    rng = random.Random(7)
    profile = profile_for(MINI)(2, True, 1)
    setup = TrainSetup(stages=stages, microbatches=microbatches, micro_batch_size=1, schedule=schedule,
                       chunks=chunks, mem_caps_bytes=[80 * GiB] * stages, precision="bf16-mixed", dp=dp, zero=zero, runtime=runtime,
                       shard_gb_per_s=100.0 if dp > 1 else None, replica_gb_per_s=50.0 if dp > 1 else None)
    bound = setup_bounds(profile, setup)
    assert bound.time_ms > 0 and bound.static_bytes > 0
    for _ in range(25):
        plan = random_stages(profile, stages * chunks, rng, setup)
        if chunks > 1:
            plan = costmodel.ranks_of(plan, setup)
        cost = costmodel.evaluate(plan, profile, setup)
        assert bound.time_ms <= cost.iteration_ms * (1 + 1e-9), (bound.time_ms, cost.iteration_ms)
        assert bound.static_bytes <= max(c.peak_bytes for c in cost.stages) * (1 + 1e-9)
        assert bound.limit_bytes >= max(c.allocated_limit_bytes for c in cost.stages)
