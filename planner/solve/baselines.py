"""Reference strategies users would otherwise reach for, scored by the same cost model.

Each is a small pure function from (profile, setup) to the pipeline's stages (P·V of them
under a schedule with V chunks per rank, in pipeline order); `all_baselines` scores them, as
the ranks that hold them, with costmodel.evaluate(), so ckplan and every baseline are
compared apples to apples, whatever the schedule.
"""

from __future__ import annotations

from collections.abc import Callable

from planner.cost import costmodel
from planner.schema import BaselineResult, PipelineSetup, Profile, StagePlan, TrainSetup
from planner.solve.deadline import Deadline, Expired

Strategy = Callable[[Profile, TrainSetup, Deadline], list[StagePlan]]
NO_DEADLINE = Deadline(None)
# The scans below look at the deadline every this many rules: a model of a few hundred layers
# is always scored whole (its best baseline is the plan a solve cut short falls back on), one of
# thousands stops at the deadline.
DEADLINE_EVERY = 256


def even_split(num_layers: int, num_stages: int) -> list[int]:
    """Layers per stage, remainder to the middle stages (ColossalAI's distribute_layers)."""
    quotient, remainder = divmod(num_layers, num_stages)
    sizes = [quotient] * num_stages
    start = num_stages // 2 - remainder // 2
    for stage in range(start, start + remainder):
        sizes[stage] += 1
    return sizes


def balanced_split(times_ms: list[float], num_stages: int) -> list[int]:
    """Layers per stage minimising the slowest stage's fwd+bwd time (exact linear-partition DP),
    as DeepSpeed's and torchtitan's compute-balanced partitioners aim to."""
    num_layers = len(times_ms)
    prefix = [0.0]
    for time_ms in times_ms:
        prefix.append(prefix[-1] + time_ms)
    inf = float("inf")
    # best[s][j]: min over splits of layers[:j] into s stages of the slowest stage
    best = [[inf] * (num_layers + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (num_layers + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for s in range(1, num_stages + 1):
        for j in range(s, num_layers - (num_stages - s) + 1):
            best[s][j], cut[s][j] = _best_cut(best[s - 1], prefix, s - 1, j)
    sizes, j = [], num_layers
    for s in range(num_stages, 0, -1):
        sizes.append(j - cut[s][j])
        j = cut[s][j]
    return sizes[::-1]


def _best_cut(before: list[float], prefix: list[float], lo: int, j: int) -> tuple[float, int]:
    """min over i in [lo, j) of max(before[i], prefix[j] - prefix[i]), and the first i that
    reaches it. before[i] never falls as i grows and the last stage's time never rises, so
    the minimum sits where they cross: a binary search instead of a scan (the same i)."""
    def value(i: int) -> float:
        return max(before[i], prefix[j] - prefix[i])

    low, high = lo, j - 1  # the first i where before[i] >= prefix[j] - prefix[i]
    while low < high:
        mid = (low + high) // 2
        if before[mid] >= prefix[j] - prefix[mid]:
            high = mid
        else:
            low = mid + 1
    i = min((i for i in (low - 1, low) if i >= lo), key=lambda i: (value(i), i))
    while i > lo and value(i - 1) == value(i):  # left of the crossing only the last stage counts
        i -= 1
    return value(i), i


def _stages(profile: Profile, sizes: list[int], num_ckpt: Callable[[int], int]) -> list[StagePlan]:
    """Stage plans from layer counts, checkpointing the first num_ckpt(size) layers of each stage."""
    bounds, start = [], 0
    flags = []
    for size in sizes:
        bounds.append(start)
        ckpt = num_ckpt(size)
        flags += [offset < ckpt for offset in range(size)]
        start += size
    return costmodel.split_to_stages(bounds, flags, profile)


def _smallest_fitting(profile: Profile, setup: TrainSetup, sizes: list[int],
                      candidates: list[Callable[[int], int]], deadline: Deadline) -> list[StagePlan]:
    """The first candidate checkpoint rule (ordered by increasing recompute) that fits;
    the last (most recompute) when none does. A plan fits when each stage does, and many
    rules give a stage the same count, so each (stage, count) is scored once."""
    if setup.pipeline.chunks > 1:  # a rank's memory is its chunks' together: score whole plans
        return _smallest_fitting_plan(profile, setup, sizes, candidates, deadline)
    layers = costmodel.layer_costs(profile)
    starts = [sum(sizes[:s]) for s in range(len(sizes))]
    scored: dict[tuple[int, int], bool] = {}

    def stage_fits(s: int, count: int) -> bool:
        if (s, count) not in scored:
            if sizes[s] >= DEADLINE_EVERY:  # a stage of hundreds of layers takes a while to score
                deadline.check()
            held = layers[starts[s]:starts[s] + sizes[s]]
            flags = [offset < count for offset in range(sizes[s])]
            scored[s, count] = costmodel.stage_cost(held, flags, stage=s, profile=profile, setup=setup).fits
        return scored[s, count]

    for count, rule in enumerate(candidates, start=1):
        if count % DEADLINE_EVERY == 0:  # thousands of layers make thousands of rules, each a stage scored
            deadline.check()
        if all(stage_fits(s, rule(size)) for s, size in enumerate(sizes)):
            return _stages(profile, sizes, rule)
    return _stages(profile, sizes, candidates[-1])


def _smallest_fitting_plan(profile: Profile, setup: TrainSetup, sizes: list[int],
                           candidates: list[Callable[[int], int]], deadline: Deadline) -> list[StagePlan]:
    """_smallest_fitting for a schedule whose ranks hold several stages: each rule's whole plan
    scored (the rank's peak depends on the order it runs its chunks in), every distinct plan once."""
    seen = set()
    for rule in candidates:
        deadline.check()
        counts = tuple(rule(size) for size in sizes)
        if counts in seen:
            continue
        seen.add(counts)
        stages = _stages(profile, sizes, rule)
        if costmodel.evaluate(costmodel.as_ranks(stages, setup), profile, setup).feasible:
            return stages
    return _stages(profile, sizes, candidates[-1])


def num_pipeline_stages(pipeline: PipelineSetup) -> int:
    """The pipeline's stages: P ranks x V chunks each."""
    return pipeline.stages * pipeline.chunks


def _ratio_rules(num_layers: int) -> list[Callable[[int], int]]:
    """ColossalAI's rule int(ratio * layers_in_stage) for ratio = 0, 1/L, 2/L, ..., 1."""
    return [lambda size, step=step: int(step / num_layers * size) for step in range(num_layers + 1)]


def no_checkpointing(profile: Profile, setup: TrainSetup, deadline: Deadline = NO_DEADLINE) -> list[StagePlan]:
    return _stages(profile, even_split(len(profile.layers), num_pipeline_stages(setup.pipeline)), lambda size: 0)


def full_checkpointing(profile: Profile, setup: TrainSetup, deadline: Deadline = NO_DEADLINE) -> list[StagePlan]:
    return _stages(profile, even_split(len(profile.layers), num_pipeline_stages(setup.pipeline)), lambda size: size)


def colossalai_ratio(profile: Profile, setup: TrainSetup, deadline: Deadline = NO_DEADLINE) -> list[StagePlan]:
    """Even split (remainder to middle stages); the same ratio of first layers checkpointed in
    every stage, the smallest ratio that fits (step 1/L)."""
    sizes = even_split(len(profile.layers), num_pipeline_stages(setup.pipeline))
    return _smallest_fitting(profile, setup, sizes, _ratio_rules(len(profile.layers)), deadline)


def megatron_block(profile: Profile, setup: TrainSetup, deadline: Deadline = NO_DEADLINE) -> list[StagePlan]:
    """Megatron's recompute-method=block: the first N layers of every stage, smallest N that fits."""
    sizes = even_split(len(profile.layers), num_pipeline_stages(setup.pipeline))
    rules = [lambda size, n=n: min(n, size) for n in range(max(sizes) + 1)]
    return _smallest_fitting(profile, setup, sizes, rules, deadline)


def balanced_ratio(profile: Profile, setup: TrainSetup, deadline: Deadline = NO_DEADLINE) -> list[StagePlan]:
    """Compute-balanced split (DeepSpeed/torchtitan style) with the smallest uniform ratio that fits."""
    times = [layer.fwd_ms + layer.bwd_ms for layer in costmodel.layer_costs(profile)]
    sizes = balanced_split(times, num_pipeline_stages(setup.pipeline))
    return _smallest_fitting(profile, setup, sizes, _ratio_rules(len(profile.layers)), deadline)


BASELINES: dict[str, Strategy] = {
    "no-ckpt": no_checkpointing,
    "full-ckpt": full_checkpointing,
    "colossalai-ratio": colossalai_ratio,
    "megatron-block": megatron_block,
    "balanced-ratio": balanced_ratio,
}


def all_baselines(profile: Profile, setup: TrainSetup, deadline: Deadline = NO_DEADLINE) -> list[BaselineResult]:
    """Every baseline scored; past the deadline, the ones scored by then (the search that
    follows has no time left either, and says so). Baselines that choose the same plan (full
    checkpointing and the ratio rules where every layer is checkpointed) are scored once: a
    plan's cost is a function of the plan, and each score replays every stage's allocator."""
    results, scored = [], {}
    for name, strategy in BASELINES.items():
        try:
            stages = costmodel.as_ranks(strategy(profile, setup, deadline), setup)
        except Expired:
            break
        key = tuple(stage.model_dump_json() for stage in stages)
        cost = scored[key] if key in scored else scored.setdefault(key, costmodel.evaluate(stages, profile, setup))
        results.append(
            BaselineResult(
                name=name,
                feasible=cost.feasible,
                iteration_ms=cost.iteration_ms,
                peak_bytes_per_stage=cost.peak_bytes_per_stage,
                stages=costmodel.with_predictions(stages, cost),
            )
        )
    return results
