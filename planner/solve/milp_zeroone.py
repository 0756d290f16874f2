"""ZeRO 1's whole tensors in the MILP (planner/cost/zeroone.py): E_s (MiB), the fullest rank's optimizer state
beyond what static charges every rank, in stage s's held row.

Where a run's tensor sizes are not known: E_s ≥ o · (largest tensor of a run present - the stage's parameters / K),
E_s ≥ 0, as evaluate charges such profiles. Where every run's are, evaluate partitions the stage's tensors as
ZeroRedundancyOptimizer does (greedy, largest first), which is no linear function of the counts n_{s,g}: the rows
hold E_s ≥ o · (largest present - parameters / K) - c · (tensors - 1), true of every partition (the rank given the
largest tensor holds at least it and one step count of c bytes), and after each solve a stage whose E_s is below
evaluate's value e for the counts m_g it holds gets the cut E_s ≥ e - (e + B) · Σ_g d_g, d_g = |n_{s,g} - m_g|: e where
the counts are m, and no more than E_s's floor -B (every step count's bytes) elsewhere, the counts being whole. The
solver solves again until no stage is below (highs.solve's problem.lazy), so the answer is evaluate's to the byte.
"""

from __future__ import annotations

import pulp

from planner.cost import dataparallel, stepcounts, zeroone
from planner.solve.milp_parts import _presence

MIB = 1024 * 1024
TOLERANCE_BYTES = 1.0  # a cut is added where E_s is this far below evaluate's value


def excess_mib(problem, s: int, n) -> list:
    """[E_s] for stage s's held row (adding the lazy cuts' check to the problem where it is exact); [] where no
    rank holds whole tensors."""
    setup, runs = problem.setup, problem.runs
    optim = dataparallel.whole_tensor_optim_bytes(setup)
    largest = [run.layer.largest_trained_count for run in runs]
    numels = [run.layer.zero_one_numels(setup.pipeline.stages) for run in runs]
    exact = all(item is not None for item in numels)
    if not optim or not (any(largest) or exact):
        return []
    step = stepcounts.per_tensor_bytes(problem.profile, setup) if exact else 0
    floor = step * sum(len(item) * run.size for item, run in zip(numels, runs)) if exact else 0
    excess = pulp.LpVariable(f"Z_{s}", lowBound=-floor / MIB)
    if not exact:
        problem.lp += excess >= 0, f"zero_one_floor_{s}"
    params = pulp.lpSum(run.layer.trained_count * n(s, g) for g, run in enumerate(runs))
    tensors = pulp.lpSum(len(item) * n(s, g) for g, item in enumerate(numels)) if exact else 0
    for g, run in enumerate(runs):
        if largest[g]:
            # [Constraint] a rank of the shard group holds the run's largest tensor whole (and its step count)
            present = _presence(problem, f"z_{s}_{g}", n(s, g), run.size)
            problem.lp += (excess >= (optim * (largest[g] * present - params / dataparallel.shard_size(setup))
                                      - step * (tensors - present)) / MIB, f"zero_one_{s}_{g}")
    if exact:
        problem.lazy.append(lambda: _cut(problem, s, n, excess, numels, step, floor))
    return [excess]


def _cut(problem, s: int, n, excess, numels: list, step: int, floor: float) -> int:
    """Stage s's cut where E_s is below evaluate's value for the counts it holds: 1 row added, else 0."""
    counts = [round(pulp.value(n(s, g)) or 0) for g in range(len(numels))]
    held = [numel for item, count in zip(numels, counts) for numel in item * count]
    value = zeroone.excess_bytes(held, param_count=sum(held), largest=max(held, default=0), setup=problem.setup,
                                 step_bytes=step)
    if (excess.varValue or 0.0) * MIB >= value - TOLERANCE_BYTES:
        return 0
    index = len(problem.lazy_rows)
    apart = []
    for g, count in enumerate(counts):
        # d_g = |n_{s,g} - m_g| = above + below, one of them 0 (b_g says which)
        above, below = (pulp.LpVariable(f"z{side}_{s}_{index}_{g}", lowBound=0) for side in "ab")
        side = pulp.LpVariable(f"zs_{s}_{index}_{g}", cat="Binary")
        size = problem.runs[g].size
        problem.lp += above - below == n(s, g) - count, f"zero_one_apart_{s}_{index}_{g}"
        problem.lp += above <= size * side, f"zero_one_above_{s}_{index}_{g}"
        problem.lp += below <= size * (1 - side), f"zero_one_below_{s}_{index}_{g}"
        apart += [above, below]
    # [Constraint] E_s is evaluate's value where stage s holds these counts (a count apart by 1 lifts it)
    problem.lp += excess >= (value - (value + floor) * pulp.lpSum(apart)) / MIB, f"zero_one_cut_{s}_{index}"
    problem.lazy_rows.append((s, counts))
    return 1
