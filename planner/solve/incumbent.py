"""A fast heuristic plan to start the MILP from and to bound it with.

The MILP's boundary windows and bottleneck bound are only as tight as the feasible
plan they come from; the baselines are 10-15% from the optimum on heterogeneous
profiles. This heuristic is usually within about 1%: for a range of bottleneck caps
τ, a dynamic programme over stage boundaries picks the split with the least total
time whose every stage is no slower than τ, each candidate stage checkpointing
greedily (least recompute per byte freed first) until it fits its cap. Every plan it
returns is scored by costmodel.evaluate(); it is a bound, never the answer.
"""

from __future__ import annotations

import math

from planner.cost import costmodel
from planner.cost.costmodel import LayerCost
from planner.schema import Profile, StagePlan, TrainSetup
from planner.solve.deadline import Deadline

NUM_CAPS = 40  # bottleneck caps tried, spread between the tightest and loosest plausible


def greedy_checkpoints(layers: list[LayerCost], *, stage: int, profile: Profile, setup: TrainSetup) -> list[bool] | None:
    """Checkpoint flags that make the stage fit its cap, cheapest recompute per freed byte
    first; None if even checkpointing every layer that frees memory does not fit."""
    flags = [False] * len(layers)
    cost = costmodel.stage_cost(layers, flags, stage=stage, profile=profile, setup=setup)
    if cost.fits:
        return flags
    order = sorted(
        (i for i, layer in enumerate(layers) if layer.recompute_saving_bytes > 0),
        key=lambda i: costmodel.recompute_ms(layers[i], setup) / layers[i].recompute_saving_bytes,
    )
    # how many the freed bytes alone call for; then one more at a time while it still does not fit
    excess = cost.peak_bytes + costmodel.FIT_MARGIN_BYTES - cost.allocated_limit_bytes
    freed = 0
    for i in order:
        flags[i] = True
        freed += cost.in_flight * layers[i].recompute_saving_bytes
        if freed < excess:
            continue
        if costmodel.stage_cost(layers, flags, stage=stage, profile=profile, setup=setup).fits:
            return flags
    return None


def _segments(profile: Profile, setup: TrainSetup, max_time_ms: float,
              deadline: Deadline) -> dict[tuple[int, int, int], tuple[float, list[bool]]]:
    """(stage, start, end) -> (time, flags) for segments that fit with greedy checkpointing."""
    layers = costmodel.layer_costs(profile)
    num_layers, num_stages = len(layers), setup.pipeline.stages
    plain = [costmodel.compute_ms(costmodel.layer_time_ms(layer, False), setup.time) for layer in layers]
    found = {}
    for s in range(num_stages):
        starts = [0] if s == 0 else range(s, num_layers - (num_stages - s) + 1)
        for start in starts:
            deadline.check()
            ends = [num_layers] if s == num_stages - 1 else range(start + 1, num_layers - (num_stages - 1 - s) + 1)
            for end in ends:
                if sum(plain[start:end]) > max_time_ms:
                    break
                flags = greedy_checkpoints(layers[start:end], stage=s, profile=profile, setup=setup)
                if flags is None:
                    continue
                time_ms = costmodel.stage_cost(layers[start:end], flags, stage=s, profile=profile,
                                               setup=setup).busy_ms
                if time_ms <= max_time_ms:
                    found[s, start, end] = (time_ms, flags)
    return found


def _least_total(by_stage, num_stages: int, num_layers: int, cap_ms: float):
    """The split with the least Σ time whose stages are all no slower than cap_ms."""
    best = {0: (0.0, [])}  # layers covered by the stages placed so far -> (Σ time, segments)
    for s in range(num_stages):
        step = {}
        for start, end, time_ms in by_stage[s]:
            if time_ms > cap_ms or start not in best:
                continue
            total = best[start][0] + time_ms
            if end not in step or total < step[end][0]:
                step[end] = (total, best[start][1] + [(s, start, end)])
        best = step
    return best[num_layers][1] if num_layers in best else None


def heuristic_plan(profile: Profile, setup: TrainSetup, *, upper_bound_ms: float | None = None,
                   deadline: Deadline | None = None) -> list[StagePlan] | None:
    """The best plan found over a sweep of bottleneck caps, or None if none fits. Raises
    deadline.Expired when the deadline passes first."""
    deadline = deadline or Deadline(None)
    num_layers = len(profile.layers)
    max_time = math.inf if upper_bound_ms is None else costmodel.bottleneck_bound_ms(profile, setup, upper_bound_ms)
    segments = _segments(profile, setup, max_time, deadline)
    by_stage = [[(i, j, t) for (s, i, j), (t, _) in segments.items() if s == stage] for stage in range(setup.pipeline.stages)]
    # the bottleneck is at least the average stage's plain time: sweep caps from there up
    floor = costmodel.compute_ms(sum(costmodel.layer_time_ms(layer, False) for layer in costmodel.layer_costs(profile)),
                                 setup.time) / setup.pipeline.stages
    times = sorted({time_ms for time_ms, _ in segments.values() if time_ms >= floor})
    if not times:
        return None
    picks = sorted({times[round(i * (len(times) - 1) / (NUM_CAPS - 1))] for i in range(NUM_CAPS)})
    best_stages, best_ms = None, math.inf
    for cap_ms in picks:
        deadline.check()
        chosen = _least_total(by_stage, setup.pipeline.stages, num_layers, cap_ms)
        if chosen is None:
            continue
        flags = [False] * num_layers
        for key in chosen:
            for offset, flag in enumerate(segments[key][1]):
                flags[key[1] + offset] = flag
        stages = costmodel.split_to_stages([key[1] for key in chosen], flags, profile)
        cost = costmodel.evaluate(stages, profile, setup)
        if cost.feasible and cost.iteration_ms < best_ms:
            best_stages, best_ms = stages, cost.iteration_ms
    return best_stages
