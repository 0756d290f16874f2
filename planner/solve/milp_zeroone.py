"""ZeRO 1's whole tensors in the MILP (planner/cost/zeroone.py): E_s (MiB), the fullest rank's optimizer state
beyond what static charges every rank, in stage s's held row; under a chunked schedule one E a rank, in its first
chunk's held row, over all its chunks' tensors (its one ZeroRedundancyOptimizer: zeroone.rank_excess_bytes).

Where a run's tensor sizes are not known: E_s ≥ o · (largest tensor of a run present - the stage's parameters / K),
E_s ≥ 0, as evaluate charges such profiles. Where every run's are, evaluate partitions the stage's tensors as
ZeroRedundancyOptimizer does (greedy, largest first), which is no linear function of the counts n_{s,g}: the rows
hold E_s ≥ o · (largest present - parameters / K) - c · (tensors - 1), true of every partition (the rank given the
largest tensor holds at least it and one step count of c bytes), and after each solve a stage whose E_s is below
evaluate's value e for the counts m_g it holds gets the cut E_s ≥ e - (e + B) · Σ_g d_g, d_g = |n_{s,g} - m_g|: e where
the counts are m, and no more than E_s's floor -B (every step count's bytes) elsewhere, the counts being whole. The
solver solves again until no stage is below (highs.solve's problem.lazy), so the answer is evaluate's to the byte.
A rank of several chunks reads s as its stages together: the counts n_{k,g} of each of its stages k, its parameters
less a tied tensor its first and last layers' stages share (as milp_ranks counts them once), and the cut over every d_{k,g}.
"""

from __future__ import annotations

import pulp

from planner.cost import dataparallel, stepcounts, zeroone
from planner.solve.milp_parts import _presence

MIB = 1024 * 1024
TOLERANCE_BYTES = 1.0  # a cut is added where E_s is this far below evaluate's value


def charged_stages(problem, s: int) -> tuple[int, ...]:
    """The stages whose tensors one optimizer partitions, charged in stage s's held row: s alone under a schedule of
    one stage a rank; a rank's stages at its first one (none at its others)."""
    order = problem.schedule
    if order is None or order.num_chunks == 1:
        return (s,)
    stages = order.stages_of(order.stage_to_rank[s])
    return stages if s == stages[0] else ()


def excess_mib(problem, s: int, n) -> list:
    """[E_s] for stage s's held row (adding the lazy cuts' check to the problem where it is exact); [] where no
    rank holds whole tensors, or where another stage of the rank carries it."""
    setup, runs = problem.setup, problem.runs
    optim = dataparallel.whole_tensor_optim_bytes(setup)
    stages = charged_stages(problem, s)
    largest = [run.layer.largest_trained_count for run in runs]
    numels = [run.layer.zero_one_numels(setup.pipeline.stages) for run in runs]
    exact = all(item is not None for item in numels)
    if not optim or not stages or not (any(largest) or exact):
        return []
    step = stepcounts.per_tensor_bytes(problem.profile, setup) if exact else 0
    # every step count's bytes: the stages together hold each layer once at most
    floor = step * sum(len(item) * run.size for item, run in zip(numels, runs)) if exact else 0
    excess = pulp.LpVariable(f"Z_{s}", lowBound=-floor / MIB)
    if not exact:
        problem.lp += excess >= 0, f"zero_one_floor_{s}"
    tied = zeroone.tied_copies(problem.profile, _pinned(problem, stages)) if len(stages) > 1 else []
    params = pulp.lpSum(run.layer.trained_count * n(k, g) for k in stages for g, run in enumerate(runs)) - sum(tied)
    tensors = pulp.lpSum(len(item) * n(k, g) for k in stages for g, item in enumerate(numels)) if exact else 0
    for k in stages:
        for g, run in enumerate(runs):
            if largest[g]:
                # [Constraint] a rank of the shard group holds the run's largest tensor whole (and its step count)
                present = _presence(problem, f"z_{k}_{g}", n(k, g), run.size)
                problem.lp += (excess >= (optim * (largest[g] * present - params / dataparallel.shard_size(setup))
                                          - step * (tensors - present)) / MIB, f"zero_one_{k}_{g}")
    if exact:
        problem.lazy.append(lambda: _cut(problem, stages, n, excess, numels, step, floor))
    return [excess]


def _pinned(problem, stages) -> list[set[str]]:
    """The first and last layers where the rank holds their stages (milp_ranks' tied copies counted once)."""
    names = [layer.name for layer in problem.profile.layers]
    last = problem.setup.pipeline.stages - 1
    return ([{names[0]}] if 0 in stages else []) + ([{names[-1]}] if last in stages else [])


def _cut(problem, stages, n, excess, numels: list, step: int, floor: float) -> int:
    """The cut where E is below evaluate's value for the counts the stages hold: 1 row added, else 0."""
    counts = {k: [round(pulp.value(n(k, g)) or 0) for g in range(len(numels))] for k in stages}
    held = [numel for k in stages for item, count in zip(numels, counts[k]) for numel in item * count]
    if len(stages) > 1:  # a tied tensor the rank's stages share, in its one module once
        names = _stage_names(problem, stages, n, counts)
        for numel in zeroone.tied_copies(problem.profile, names):
            if numel in held:
                held.remove(numel)
    value = zeroone.excess_bytes(held, param_count=sum(held), largest=max(held, default=0), setup=problem.setup,
                                 step_bytes=step)
    if (excess.varValue or 0.0) * MIB >= value - TOLERANCE_BYTES:
        return 0
    index = len(problem.lazy_rows)
    apart = []
    for k in stages:
        for g, count in enumerate(counts[k]):
            # d_{k,g} = |n_{k,g} - m_{k,g}| = above + below, one of them 0 (b says which)
            above, below = (pulp.LpVariable(f"z{side}_{k}_{index}_{g}", lowBound=0) for side in "ab")
            side = pulp.LpVariable(f"zs_{k}_{index}_{g}", cat="Binary")
            size = problem.runs[g].size
            problem.lp += above - below == n(k, g) - count, f"zero_one_apart_{k}_{index}_{g}"
            problem.lp += above <= size * side, f"zero_one_above_{k}_{index}_{g}"
            problem.lp += below <= size * (1 - side), f"zero_one_below_{k}_{index}_{g}"
            apart += [above, below]
    # [Constraint] E is evaluate's value where the stages hold these counts (a count apart by 1 lifts it)
    s = stages[0]
    problem.lp += excess >= (value - (value + floor) * pulp.lpSum(apart)) / MIB, f"zero_one_cut_{s}_{index}"
    problem.lazy_rows.append((s, [count for k in stages for count in counts[k]]))
    return 1


def _stage_names(problem, stages, n, counts: dict) -> list[set[str]]:
    """Each of `stages`' layer names where they hold `counts[k][g]` of each run: the stages cover the runs in order,
    so stage k's layers of run g follow those of the stages before it."""
    names = [layer.name for layer in problem.profile.layers]
    held = []
    for k in stages:
        held.append(set())
        for g, run in enumerate(problem.runs):
            before = sum(round(pulp.value(n(j, g)) or 0) for j in range(k))
            held[-1].update(names[run.start + before + i] for i in range(counts[k][g]))
    return held
