"""The MILP beside a pipeline under FSDP2's moments (dpmoments.applies): rows that relax each stage's own
moments (gathered.stage_unit_moments) to what no place in a stage can lower, and cuts that hold the plan to
evaluate's (replaycuts.moments_fastest_fitting: the replay's lazy cuts).

Why cuts and not rows. A layer's moments there depend on its place in its stage (whether it opens or closes
it, the shards of the layers before it in the first backward, what each layer after it adds, the stage's last
unit's size): linear rows for them need a binary per layer and place, where the MILP's runs count
interchangeable layers (milp.py's formulation), and the runs' compression is what lets it plan a model of
thousands of layers. So the rows charge each layer's moments as if nothing of its stage were beside it
(gathered.neighbour_moments' `alone`, never above any place's), the prefix of absent shards as the stage's
(never below it), ZeRO 2's resharded units after it as all the stage's; each row is then at most evaluate's
moment for that layer, and the MILP's optimum a lower bound on any plan evaluate admits. A plan evaluate puts
over has its stage's exact point excluded (replaycuts._no_good: that stage's range and options are over in
every plan, evaluate scoring each stage by itself) and HiGHS solves again: the first plan that fits is the
fastest that fits, evaluate's optimum, not a bound (replaycuts' text)."""

from __future__ import annotations

import pulp

from planner.cost import costmodel, dataparallel, fsdpunits, gathered
from planner.solve import dpmoments
from planner.solve.milp_parts import _layer, _presence

MIB = float(2**20)


def applies(problem) -> bool:
    """Whether a stage's FSDP2 moments are its own (one stage per rank: the MILP's chunked stages are not)."""
    return problem.outer is None and dpmoments.applies(problem.profile, problem.setup)


def floor_applies(problem, s: int) -> bool:
    """Whether stage s's transient may go below 0 (gathered.stage_floor): its shards absent where no forward
    follows a backward."""
    warm = fsdpunits.warm_up(problem.setup, s)
    return applies(problem) and warm >= 2 and problem.setup.pipeline.microbatches == warm


def _least(problem, g: int, option: int) -> tuple[float, float, float, float]:
    """(backward, forward, first backward less its shard, other extras) of run g's layer under `option`, each
    the least any place of a stage gives it (the module's text), the layer's other extras in each."""
    cache = problem.__dict__.setdefault("_fsdp_least", {})
    if (g, option) in cache:
        return cache[g, option]
    profile, setup = problem.profile, problem.setup
    run = problem.runs[g]
    layer = run.layer
    units_of = cache.setdefault("units", gathered.stage_units(profile, setup))
    kept, extra = _layer(problem, ("kept",), layer, option), _layer(problem, ("extra",), layer, option)
    other = extra - gathered.fsdp_unit_layer_bytes(layer, option, profile, setup, lambda: kept)
    last = run.start + run.size == len(profile.layers)
    shard = units_of[0][run.start] * dataparallel.param_bytes(setup).grads / dataparallel.shard_size(setup)
    values = []
    for model_last in ((False, True) if last else (False,)):
        backward, forward = gathered.neighbour_moments(layer, option, kept, profile=profile, setup=setup,
                                                       units_of=units_of, index=run.start, opens=False,
                                                       closes=True, model_last=model_last, alone=True)
        values.append((max(backward), max(forward), max(backward[0], backward[1], backward[2] + shard)))
    least = tuple(other + min(v[k] for v in values) for k in range(3)) + (other,)
    cache[g, option] = least
    return least


def rows(problem, s: int, n, transient, later: dict, kept_mib) -> None:
    """[Constraint] stage s's transient T_s at least each layer's relaxed moments (the module's text), net of
    what the layers after it keep, for the run's last layer in the stage under each option (as milp_rows'
    transient rows place them); `kept_mib`: the stage's kept bytes a microbatch (MiB, linear)."""
    setup, lp = problem.setup, problem.lp
    grads = dataparallel.param_bytes(setup).grads / dataparallel.shard_size(setup)
    shards = pulp.lpSum(_params(problem, g)[0] * grads / MIB * n(s, g) for g in range(len(problem.runs)))
    zero2 = setup.data_parallel.zero < 3
    resharded = pulp.lpSum(dataparallel.gathered_bytes(*_params(problem, g)[:1], setup, fp8_count=_params(problem, g)[1])
                           / MIB * n(s, g) for g in range(len(problem.runs))) if zero2 else 0
    warm = fsdpunits.warm_up(setup, s)
    warm_only = warm >= 2 and setup.pipeline.microbatches == warm
    # the least any moment may be made, with the unused rows' big-M: every shard of the model absent
    total_shards = sum(layer.param_count for layer in problem.profile.layers) * grads / MIB
    if warm_only:  # gathered.stage_floor: the loss's scratch and nothing else, the shards absent
        lp += transient >= costmodel.stage_value("extra", s, problem.ctx) / MIB - shards, f"fsdp_floor_{s}"
    for g in range(len(problem.runs)):
        order = problem.order[g]
        for place, option in enumerate([*order, 0]):
            if option == 0:
                used = _presence(problem, f"fp_{s}_{g}", n(s, g), problem.runs[g].size)
                after = later[g + 1]
            else:
                used = _presence(problem, f"fq_{s}_{g}_{option}", problem.r[s, g, option], problem.runs[g].size)
                after = _after(problem, s, g, place, n) + later[g + 1]
            backward, forward, first, other = (value / MIB for value in _least(problem, g, option))
            arms = [(backward, resharded), (forward, 0)]
            if warm >= 2:
                arms = [(first, shards + resharded), (backward, resharded + (kept_mib if warm_only else 0))]
                if not warm_only:
                    arms.append((forward, 0))
                elif zero2:
                    arms += [(forward, shards + (warm - 1) * kept_mib), (other, shards)]
                else:
                    arms.append((forward, shards))
            for k, (value, less) in enumerate(arms):
                big = abs(value) + total_shards + 1.0
                lp += transient >= value * used - less - after - big * (1 - used), f"fsdp_{s}_{g}_{option}_{k}"


def _params(problem, g: int) -> tuple[float, float]:
    """Run g's layer's parameters on the rank and its Float8 weights (gathered.stage_units')."""
    cache = problem.__dict__.setdefault("_fsdp_least", {})
    units_of = cache.setdefault("units", gathered.stage_units(problem.profile, problem.setup))
    return units_of[0][problem.runs[g].start], units_of[1][problem.runs[g].start]


def _after(problem, s: int, g: int, place: int, n):
    """What run g's layers after its last under option problem.order[g][place] keep in stage s (MiB)."""
    order, layer = problem.order[g], problem.runs[g].layer
    return (pulp.lpSum(problem.r[s, g, p] * _layer(problem, ("kept",), layer, p) for p in order[place + 1:])
            + (n(s, g) - pulp.lpSum(problem.r[s, g, p] for p in order)) * _layer(problem, ("kept",), layer)) / MIB
