"""HiGHS through pulp: solving a ckplan MILP (planner/solve/milp.py), judging what it hands back,
starting it from a plan, and reading the plan out."""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, replace
from typing import Literal

import pulp

from planner.cost import costmodel
from planner.schema import StagePlan
from planner.solve import milp_order


@dataclass(frozen=True)
class SolveResult:
    # "timeout": the time limit passed before any plan was found (not proof of infeasibility);
    # "error": HiGHS failed (numerically) before it found a plan it could stand by
    status: Literal["optimal", "feasible", "infeasible", "timeout", "error"]
    objective: float | None
    gap: float | None
    wall_s: float
    solver: str = "milp"  # which solver ran: "dp" or "milp"
    bound: float | None = None  # proven lower bound on the objective
    # where the allocator replay judges the plan (planner/solve/replayfit.py): "relaxed", found under the rows
    # that hold every plan the replay admits, and the status holds against the replay; "searched", found by the
    # search over caps below them (bound: the relaxed solve's, or the last cut solve's where higher); "cut", the
    # DP under those rows with the sets the replay put over excluded until its plan fit (planner/solve/replaycuts.py:
    # the status holds against the replay over the sets the DP weighs); None: the rows are evaluate's verdict
    replay: Literal["relaxed", "searched", "cut"] | None = None
    solves: int = 1  # how many solves under other caps that took (replayfit)
    # the search over caps cut by the deadline (replayfit.search_caps): at most this many of its solves left unmade,
    # and the seconds one of those it made took (the mean: a solve and its plan's replay), which the limit would need
    rounds_left: int = 0
    round_s: float = 0.0
    timed_out: bool = False  # the deadline stopped a solver before it finished: the plan is the best it had then


# ---------------------------------------------------------------- solve and extract


_BANNER_SHOWN = False


def without_banner() -> None:
    """HiGHS prints its banner to the process's stdout the first time a Highs object is made,
    whatever its output options (stdout that `ckplan solve --json` keeps for the JSON alone):
    make that first object with file descriptor 1 pointed at /dev/null."""
    global _BANNER_SHOWN
    if _BANNER_SHOWN:
        return
    import highspy

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    _BANNER_SHOWN = True


# How far HiGHS's MIP solver lets a row's activity pass its bound (HiGHS's option
# mip_feasibility_tolerance, "used for constraints and integrality restrictions" by the MIP solver:
# ERGO-Code/HiGHS PR #560; default 1e-6 in highspy 1.16.0, HighsOptions.h, read with getOptionValue).
# The memory rows are in MiB (milp_rows.MIB), so the default let a plan pass its cap by up to
# 1e-6 MiB, 1.05 bytes: a --mem one byte under a plan's need got that plan from the MILP and then
# evaluate()'s refusal (SolverMismatch). At 1e-7 MiB (0.105 bytes, the LP solver's own
# primal_feasibility_tolerance) no row passes its cap by half a byte, so the rounded integer peak
# evaluate() scores never passes it: the MILP's verdict is evaluate's, to the byte.
MIP_FEASIBILITY_TOLERANCE = 1e-7


class _HiGHS(pulp.HiGHS):
    """pulp's HiGHS (highspy API) with three additions pulp's bridge lacks:
    - the objective's constant goes to HiGHS too; without it HiGHS measures its MIP gap
      against a smaller number than the real objective (gaps several times too large);
    - an optional start solution (variable name -> value), e.g. from the best baseline,
      so a time-limited solve never returns worse than that;
    - the MIP's row tolerance a tenth of a byte on the memory rows (MIP_FEASIBILITY_TOLERANCE)."""

    def __init__(self, *args, start: dict[str, float] | None = None, **kwargs):
        kwargs.setdefault("mip_feasibility_tolerance", MIP_FEASIBILITY_TOLERANCE)
        super().__init__(*args, **kwargs)
        self.start = start
        if not self.msg:
            without_banner()

    def callSolver(self, lp):
        import highspy

        lp.solverModel.changeObjectiveOffset(float(lp.objective.constant))
        if self.start:
            solution = highspy.HighsSolution()
            solution.col_value = [self.start.get(var.name, 0.0) for var in lp.variables()]
            solution.value_valid = True
            lp.solverModel.setSolution(solution)
        super().callSolver(lp)


_SCHEDULER: list[int | None] = []  # the threads HiGHS's scheduler was made with, once it is


def scheduler_threads(threads: int | None) -> int | None:
    """The threads every solve in this process asks HiGHS for: those of the first solve (a MILP's through
    solve(), or an LP's made with highspy directly, as chunkbound's)."""
    if not _SCHEDULER:
        _SCHEDULER.append(threads)
    return _SCHEDULER[0]


def solve(
    problem,
    *,
    time_limit_s: float | None = None,
    mip_gap: float = 1e-4,
    threads: int | None = None,
    log: bool = False,
    start: list[StagePlan] | None = None,
) -> SolveResult:
    """Run HiGHS (_solve_once); where the problem adds rows once it sees a solution (problem.lazy: callables that
    each return how many they added, milp_zeroone's cuts), add them and solve again until none is added."""
    result = _solve_once(problem, time_limit_s=time_limit_s, mip_gap=mip_gap, threads=threads, log=log, start=start)
    wall_s = result.wall_s
    while result.status in ("optimal", "feasible") and sum(check() for check in getattr(problem, "lazy", ())):
        remaining = None if time_limit_s is None else max(time_limit_s - wall_s, 1e-3)
        result = _solve_once(problem, time_limit_s=remaining, mip_gap=mip_gap, threads=threads, log=log)
        wall_s += result.wall_s
    return replace(result, wall_s=wall_s)


def _solve_once(
    problem,
    *,
    time_limit_s: float | None = None,
    mip_gap: float = 1e-4,
    threads: int | None = None,
    log: bool = False,
    start: list[StagePlan] | None = None,
) -> SolveResult:
    """Run HiGHS once. Optimal only when pulp's problem AND solution status both say so; a
    time-limited solve with a solution is "feasible" with its gap. `start`: a feasible
    plan (a baseline's stages) HiGHS begins from."""
    # HiGHS keeps one thread scheduler per process, made by its first solve, and a later solve
    # that asks for other threads does not run (it hands back the start as "feasible", or no
    # solution at all): every solve asks for the threads the first one did
    threads = scheduler_threads(threads)
    values = start_values(problem, start, threads=threads) if start else None
    solver = _HiGHS(msg=log, timeLimit=time_limit_s, gapRel=mip_gap, threads=threads, start=values)
    started = time.perf_counter()
    problem.lp.solve(solver)
    wall_s = time.perf_counter() - started
    sol_status = problem.lp.sol_status
    if sol_status == pulp.LpSolutionOptimal and problem.lp.status == pulp.LpStatusOptimal:
        status = "optimal"
    elif sol_status == pulp.LpSolutionIntegerFeasible:
        status = "feasible"
    elif problem.lp.status == pulp.LpStatusInfeasible:
        return SolveResult("infeasible", None, None, wall_s)
    elif _solve_error(problem) and _holds(problem):
        # HiGHS 1.x ends some solves in "solve error" when its own final check finds a row
        # 1e-6 short (seen: T_iter ≥ rank path, 1e-6 ms under a 236 ms objective, on a 12-layer
        # interleaved-1F1B problem): the solution it hands back meets every row to 1e-8 of the
        # row's size, so it is a plan, "feasible" with no proven gap; evaluate() re-scores it
        objective = float(pulp.value(problem.lp.objective))
        return SolveResult("feasible", objective, None, wall_s)
    elif _solve_error(problem):
        return SolveResult("error", None, None, wall_s)
    else:
        return SolveResult("timeout", None, None, wall_s)
    info = problem.lp.solverModel.getInfo()
    gap = float(info.mip_gap) if info.mip_gap < float("inf") else None
    bound = float(info.mip_dual_bound) + float(problem.lp.objective.constant)
    bound = bound if math.isfinite(bound) else None
    objective = float(pulp.value(problem.lp.objective))
    if start and status == "optimal" and bound is not None and objective - bound > (mip_gap + 1e-9) * abs(objective):
        # HiGHS 1.16 can map a start solution into its presolved space with a lower objective
        # than the start has, then call the start "optimal" against that (seen: start 10.3 ms,
        # "optimal" with dual bound 7.8, true optimum 9.3): an optimum above its own bound is
        # no optimum, so solve again without the start
        remaining = None if time_limit_s is None else max(time_limit_s - wall_s, 1e-3)
        again = _solve_once(problem, time_limit_s=remaining, mip_gap=mip_gap, threads=threads, log=log)
        return SolveResult(again.status, again.objective, again.gap, wall_s + again.wall_s, bound=again.bound)
    return SolveResult(status, objective, gap, wall_s, bound=bound)


def _solve_error(problem) -> bool:
    import highspy

    model = getattr(problem.lp, "solverModel", None)
    return model is not None and model.getModelStatus() == highspy.HighsModelStatus.kSolveError


def _holds(problem, rel: float = 1e-8) -> bool:
    """Whether the values HiGHS left meet every row and bound, each to `rel` of its size (at
    least 1e-9), and the integer variables are whole."""
    for var in problem.lp.variables():
        value = var.varValue
        if value is None:
            return False
        tol = rel * max(1.0, abs(value))
        if (var.lowBound is not None and value < var.lowBound - tol) or (
                var.upBound is not None and value > var.upBound + tol):
            return False
        if var.cat == pulp.LpInteger and abs(value - round(value)) > 1e-6:
            return False
    for row in problem.lp.constraints.values():
        size = max([1.0, abs(row.constant)] + [abs(c * (v.varValue or 0.0)) for v, c in row.items()])
        slack = row.value()  # lhs - rhs
        if (row.sense == pulp.LpConstraintLE and slack > rel * size) or (
                row.sense == pulp.LpConstraintGE and slack < -rel * size) or (
                row.sense == pulp.LpConstraintEQ and abs(slack) > rel * size):
            return False
    return True


def start_values(problem, stages: list[StagePlan], *, threads: int | None = None) -> dict[str, float] | None:
    """Every variable's value for a given plan: fix the prefix and checkpoint counts to the
    plan's, let HiGHS fill in the rest (a tiny solve), and read them back."""
    runs, names = problem.runs, [layer.name for layer in problem.profile.layers]
    position = {name: idx for idx, name in enumerate(names)}
    ends = [position[stage.layers[-1]] + 1 for stage in stages]
    layers = costmodel.layer_costs(problem.profile)
    chosen = {position[name]: layers[position[name]].option_index(stage.option(name))
              for stage in stages for name in stage.layers}
    fixed = {}
    for s, end in enumerate(ends):
        begin = ends[s - 1] if s > 0 else 0
        for g, run in enumerate(runs):
            layers_before = max(0, min(end, run.start + run.size) - run.start)
            if not isinstance(problem.y[s, g], int):
                fixed[problem.y[s, g]] = layers_before
            mine = [chosen[i] for i in range(max(begin, run.start), min(end, run.start + run.size))]
            for o in problem.order[g]:
                fixed[problem.r[s, g, o]] = mine.count(o)
            fixed.update(milp_order.fixed_values(problem, s, g, mine))  # their order, where the MILP chooses it
    saved = {var: (var.lowBound, var.upBound) for var in fixed}
    for var, value in fixed.items():
        var.lowBound = var.upBound = value
    try:  # (HiGHS runs only with the threads the process's first solve asked: scheduler_threads)
        problem.lp.solve(_HiGHS(msg=False, threads=scheduler_threads(threads)))
        if problem.lp.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
            return None  # the plan breaks the formulation's assumptions (or a cap): no start
        return {var.name: var.varValue for var in problem.lp.variables()}
    finally:
        for var, (low, up) in saved.items():
            var.lowBound, var.upBound = low, up


def extract_plan(problem) -> list[StagePlan]:
    """Stage boundaries from the prefix counts; in each stage, each run's layers take their
    options in problem.order, r[s,g,o] of each, the rest none (same-kind layers cost the same), or, where the
    MILP chose the run's order there, in its positions' (milp_order.placed).
    A chunked schedule's stages come back as its ranks, each with its chunks."""
    setup, runs = problem.setup, problem.runs
    prefix = [[int(round(pulp.value(problem.y[s, g]))) for g in range(len(runs))] for s in range(setup.pipeline.stages)]
    bounds = [0] + [sum(prefix[s]) for s in range(setup.pipeline.stages - 1)]
    options = [0] * sum(run.size for run in runs)
    for s in range(setup.pipeline.stages):
        for g, run in enumerate(runs):
            idx = run.start + (prefix[s - 1][g] if s > 0 else 0)
            counts = {o: int(round(pulp.value(problem.r[s, g, o]))) for o in problem.order[g]}
            counts[0] = prefix[s][g] - (prefix[s - 1][g] if s > 0 else 0) - sum(counts.values())
            placed = milp_order.placed(problem, s, g, counts)
            options[idx:idx + len(placed)] = placed
    stages = costmodel.split_to_stages(bounds, options, problem.profile)
    return stages if problem.outer is None else costmodel.ranks_of(stages, problem.outer)
