"""The planner's entry points (plan, min_cap_scale) and the mixed-integer program on HiGHS
(through pulp's highspy API) that chooses each stage's layers and which of them are
checkpointed.

plan() and min_cap_scale() solve with planner.dpsolve's exact dynamic programme by
default (milliseconds to a second where HiGHS took seconds to minutes on heterogeneous
layers and many stages); method="milp" solves the program below instead, and the tests
hold the two to each other and to brute force.

Formulation. Consecutive layers of one kind form a run g of n_g interchangeable
layers (a fully heterogeneous profile has runs of one). Instead of assigning layers
to stages, the program places stage boundaries through prefix counts, so a plan is
contiguous and in order by construction, and identical layers cost one integer
instead of many symmetric binaries:

    y[s,g] ∈ {0..n_g}  run-g layers in stages 0..s        (y[-1,g] = 0, y[P-1,g] = n_g)
    n[s,g] = y[s,g] - y[s-1,g]                            run-g layers in stage s
    r[s,g] ∈ {0..n[s,g]}  run-g layers checkpointed in stage s
    f[s,g] = [y[s,g] = n_g]   run g lies wholly in stages 0..s
    t[s,g] = [y[s,g] ≥ 1]     run g is touched by stages 0..s
    open[s,g]  = f[s-1,g-1] - f[s-1,g]                    stage s's first layer is of run g
    close[s,g] = t[s,g] - t[s,g+1]                        stage s's last layer is of run g
    busy_s = time_s + Σ_g send(input_g)·open[s,g] + send(output_g)·close[s,g] + 2·action
    τ ≥ busy_s,  σ ≥ step_s                               the bottleneck stage, slowest step
    T ≥ Σ_s busy_s + (M-1)·τ + σ,
    T ≥ h·(M·Σ_s busy_s + Σ_s step_s) / C                 minimise T (costmodel.iteration_ms)

Bounds. A feasible plan (the best baseline, or incumbent.py's heuristic when better)
starts HiGHS and bounds τ: (M-1)·τ* ≤ T_feasible - Σ(fwd+bwd) - Σ step / P. That bound also gives
every stage boundary a window (stages 0..s hold at most (s+1)·τ of plain time, the
stages after s the rest), which fixes most prefix counts before HiGHS starts. Memory
rows are in MiB, so HiGHS's row tolerance is ~0.1 byte.

Every coefficient comes from planner.costmodel; after the solve the plan is
re-scored by costmodel.evaluate() and must agree with the objective.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Literal

import pulp

from planner import costmodel, dataparallel, dpsolve, incumbent
from planner.costmodel import LayerCost, PlanCost
from planner.deadline import Deadline, Expired
from planner.schema import Profile, StagePlan, TrainSetup

# Bytes enter the solver in MiB: coefficients stay well conditioned (1e-2 .. 1e5 for
# models up to ~100 GiB per device) and HiGHS's feasibility tolerance (1e-7 per row)
# is a tenth of a byte, so a plan the solver accepts never exceeds a cap under evaluate().
MIB = float(2**20)
HEURISTIC_RUNS_PER_STAGE = 2  # more runs of distinct layers per stage: start from incumbent.py


class SolverMismatch(AssertionError):
    """The re-evaluated plan disagrees with the solver's objective: a formulation bug."""


@dataclass(frozen=True)
class Run:
    start: int  # first layer index
    size: int
    layer: LayerCost  # every layer of the run has these (kind-normalised) numbers


@dataclass
class Problem:
    lp: pulp.LpProblem
    profile: Profile
    setup: TrainSetup
    runs: list[Run]
    objective: Literal["time", "memory"]
    y: dict[tuple[int, int], object] = field(default_factory=dict)
    r: dict[tuple[int, int], object] = field(default_factory=dict)
    scale: pulp.LpVariable | None = None  # memory objective: caps are multiplied by it


@dataclass(frozen=True)
class SolveResult:
    # "timeout": the time limit passed before any plan was found (not proof of infeasibility)
    status: Literal["optimal", "feasible", "infeasible", "timeout"]
    objective: float | None
    gap: float | None
    wall_s: float


@dataclass(frozen=True)
class PlanResult:
    stages: list[StagePlan]
    cost: PlanCost
    solve: SolveResult


def find_runs(layers: list[LayerCost]) -> list[Run]:
    runs: list[Run] = []
    for idx, layer in enumerate(layers):
        if runs and runs[-1].layer.kind == layer.kind:
            runs[-1] = Run(runs[-1].start, runs[-1].size + 1, runs[-1].layer)
        else:
            runs.append(Run(idx, 1, layer))
    return runs


def _count_var(name: str, size: int) -> pulp.LpVariable:
    if size == 1:
        return pulp.LpVariable(name, cat="Binary")
    return pulp.LpVariable(name, lowBound=0, upBound=size, cat="Integer")


def boundary_windows(profile: Profile, setup: TrainSetup, tau_max: float) -> list[tuple[int, int]]:
    """[lo, hi] for each stage s: how many layers stages 0..s can hold together
    (dpsolve.boundary_windows, shared so both solvers prune alike)."""
    return dpsolve.boundary_windows(dpsolve.Chain(profile, setup), tau_max)


def build_problem(
    profile: Profile,
    setup: TrainSetup,
    *,
    objective: Literal["time", "memory"] = "time",
    upper_bound_ms: float | None = None,
) -> Problem:
    """objective="time": fastest iteration under the caps; `upper_bound_ms`, the iteration
    time of any feasible plan (e.g. the best baseline's), bounds the bottleneck τ.
    objective="memory": the smallest factor by which every cap could be scaled and still fit."""
    layers = costmodel.layer_costs(profile)
    if setup.stages > len(layers):
        raise ValueError(f"{setup.stages} stages need at least {setup.stages} layers, the profile has {len(layers)}")
    runs = find_runs(layers)
    num_stages, num_runs = setup.stages, len(runs)
    lp = pulp.LpProblem("ckplan", pulp.LpMinimize)
    problem = Problem(lp=lp, profile=profile, setup=setup, runs=runs, objective=objective)
    tau_max = float("inf")
    if objective == "time" and upper_bound_ms is not None:
        tau_max = costmodel.bottleneck_bound_ms(profile, setup, upper_bound_ms)
    ends = boundary_windows(profile, setup, tau_max)

    # y[s,g]: run-g layers in stages 0..s (fixed for the last stage), within the window
    # [lo, hi] of where stage s can end
    y = problem.y
    for s in range(num_stages):
        lo, hi = ends[s]
        for g, run in enumerate(runs):
            low = min(max(lo - run.start, 0), run.size)
            high = min(max(hi - run.start, 0), run.size)
            if s == num_stages - 1 or low == high:
                y[s, g] = high
            else:
                y[s, g] = _count_var(f"y_{s}_{g}", run.size)
                y[s, g].lowBound, y[s, g].upBound = low, high
    # f[s,g] = [y = n_g], t[s,g] = [y ≥ 1]: exact indicators (one run of one layer: y itself)
    full, touched = {}, {}
    for s in range(num_stages - 1):
        for g, run in enumerate(runs):
            if isinstance(y[s, g], int):  # fixed by its window
                full[s, g], touched[s, g] = int(y[s, g] == run.size), int(y[s, g] >= 1)
                continue
            if run.size == 1:
                full[s, g] = touched[s, g] = y[s, g]
                continue
            full[s, g] = pulp.LpVariable(f"f_{s}_{g}", cat="Binary")
            touched[s, g] = pulp.LpVariable(f"t_{s}_{g}", cat="Binary")
            lp += y[s, g] >= run.size * full[s, g], f"full_lo_{s}_{g}"
            lp += y[s, g] <= run.size - 1 + full[s, g], f"full_hi_{s}_{g}"
            lp += y[s, g] >= touched[s, g], f"touch_lo_{s}_{g}"
            lp += y[s, g] <= run.size * touched[s, g], f"touch_hi_{s}_{g}"

    # [Constraint] contiguity: a stage range may enter run g+1 only after run g is complete
    for s in range(num_stages - 1):
        for g in range(num_runs - 1):
            lp += touched[s, g + 1] <= full[s, g], f"contig_{s}_{g}"
    def n(s: int, g: int):
        """run-g layers in stage s"""
        return y[s, g] - (y[s - 1, g] if s > 0 else 0)

    # [Constraint] prefixes grow with s, and every stage holds at least one layer
    for s in range(num_stages):
        lp += pulp.lpSum(n(s, g) for g in range(num_runs)) >= 1, f"nonempty_{s}"
        for g in range(num_runs):
            if s > 0 and s < num_stages - 1:
                lp += y[s, g] >= y[s - 1, g], f"grow_{s}_{g}"

    def opens(s: int, g: int):
        """1 if stage s's first layer is of run g."""
        if s == 0:
            return 1 if g == 0 else 0
        before = full[s - 1, g - 1] if g > 0 else 1
        return before - full[s - 1, g]

    def closes(s: int, g: int):
        """1 if stage s's last layer is of run g."""
        if s == num_stages - 1:
            return 1 if g == num_runs - 1 else 0
        after = touched[s, g + 1] if g + 1 < num_runs else 0
        return touched[s, g] - after

    # r[s,g]: run-g layers checkpointed in stage s (only where checkpointing frees memory)
    r = problem.r
    for s in range(num_stages):
        for g, run in enumerate(runs):
            if run.layer.recompute_saving_bytes > 0:
                r[s, g] = _count_var(f"r_{s}_{g}", run.size)
                lp += r[s, g] <= n(s, g), f"ckpt_owned_{s}_{g}"

    # τ: the slowest stage's time per microbatch
    tau = pulp.LpVariable("tau", lowBound=0, upBound=None if tau_max == float("inf") else tau_max)
    if objective == "memory":
        problem.scale = pulp.LpVariable("scale", lowBound=0)
    stage_times = []
    for s in range(num_stages):
        stage_times.append(_stage_time(problem, s, n, opens, closes))
        lp += stage_times[-1] <= tau, f"bottleneck_{s}"
        lp += _stage_memory_mib(problem, s, n, opens, closes) <= _cap_mib(problem, s), f"cap_{s}"

    if objective == "time":
        # T_iter ≥ Σ_s time_s + (M - 1)·τ + σ (critical path, σ: the slowest optimizer step),
        # T_iter ≥ (M·Σ_s time_s + Σ_s step_s) / C (capacity; every layer steps somewhere)
        t_iter = pulp.LpVariable("T_iter", lowBound=0)
        slowest_step = 0
        step_of = {g: costmodel.layer_step_ms(run.layer, setup) for g, run in enumerate(runs)}
        if any(step_of.values()):
            slowest_step = pulp.LpVariable("sigma", lowBound=0)
            for s in range(num_stages):
                lp += pulp.lpSum(step_of[g] * n(s, g) for g in range(num_runs)) <= slowest_step, f"step_{s}"
        lp += t_iter >= pulp.lpSum(stage_times) + (setup.microbatches - 1) * tau + slowest_step, "critical_path"
        if costmodel.parallel_stages(setup) < setup.stages:
            total_step = sum(step_of[g] * run.size for g, run in enumerate(runs))
            lp += t_iter >= setup.cpu_sharing * (setup.microbatches * pulp.lpSum(stage_times) + total_step) / (
                costmodel.parallel_stages(setup)), "capacity"
        lp += t_iter
    else:
        lp += problem.scale
    return problem


def _stage_time(problem: Problem, s: int, n, opens, closes):
    """busy_s = c·(Σ_g n·(fwd + bwd) + r·recompute (+ loss on the last stage)) + the sends
    of the stage's first and last layer + its actions, from the cost model."""
    setup = problem.setup
    terms = [costmodel.stage_constant_ms(problem.profile, s, setup), costmodel.stage_constant_comm_ms(setup)]
    for g, run in enumerate(problem.runs):
        plain = costmodel.compute_ms(costmodel.layer_time_ms(run.layer, False), setup)
        terms.append(plain * n(s, g))
        if (s, g) in problem.r:
            terms.append((costmodel.compute_ms(costmodel.layer_time_ms(run.layer, True), setup) - plain)
                         * problem.r[s, g])
        terms += [costmodel.first_layer_comm_ms(run.layer, s, setup) * opens(s, g),
                  costmodel.last_layer_comm_ms(run.layer, s, setup) * closes(s, g)]
    return pulp.lpSum(terms)


def _stage_memory_mib(problem: Problem, s: int, n, opens, closes):
    """peak_s = static + max(k_s·kept + T_s, step scratch) + buffers, in MiB: returns
    static + buffers + k_s·kept + T_s (the training peak) and adds the optimizer step's
    row, static + buffers + scratch ≤ cap, itself."""
    setup, lp = problem.setup, problem.lp
    device_type = problem.profile.device.type
    k = costmodel.in_flight(setup, s)
    const_kept, const_buffers = costmodel.stage_constant_bytes(problem.profile, s, setup)
    held = [const_buffers / MIB]  # static + buffers: live at the optimizer step too
    total = [k * const_kept / MIB]
    # T_s = max(a layer's transient (+ recompute) net of what the layers after it keep,
    # the loss's scratch on the last stage): costmodel.transient_extra_bytes
    scratch = pulp.LpVariable(f"T_{s}", lowBound=costmodel.stage_constant_transient_bytes(problem.profile, s, setup) / MIB)
    total.append(scratch)
    # K[s,g] (MiB): what stage s's layers of runs g, g+1, ... keep per microbatch, as a
    # recurrence so each transient constraint names one variable instead of every later run
    later = {len(problem.runs): 0}
    for g in reversed(range(len(problem.runs))):
        later[g] = pulp.LpVariable(f"K_{s}_{g}")
        lp += later[g] == later[g + 1] + _run_kept_bytes(problem, s, g, n) / MIB, f"later_{s}_{g}"
    step_scratch = []  # per run: (bytes of one layer's step scratch, presence, count)
    for g, run in enumerate(problem.runs):
        layer = run.layer
        # static + k·kept written out, not k·K[s,0]: one row fewer between a byte and its cap
        held.append((costmodel.static_bytes(layer, setup) + costmodel.reduced_bytes(layer, setup)) * n(s, g) / MIB)
        total.append(k * _run_kept_bytes(problem, s, g, n) / MIB)
        present = None
        if layer.transient_bytes > 0 or costmodel.layer_step_scratch_bytes(layer, setup, device_type) > 0:
            present = _presence(problem, f"p_{s}_{g}", n(s, g), run.size)
        if layer.transient_bytes > 0:
            # [Constraint] T_s ≥ the transient of the run's last layer in the stage minus what
            # the runs after it keep (its earlier layers have more after them)
            lp += scratch >= layer.transient_bytes / MIB * present - later[g + 1], f"transient_{s}_{g}"
        if (s, g) in problem.r:
            used = _presence(problem, f"q_{s}_{g}", problem.r[s, g], run.size)
            # [Constraint] T_s ≥ transient + recompute extra of the run's last checkpointed layer
            # (the first r of the run are the checkpointed ones) minus what the layers after it keep
            after = (n(s, g) - problem.r[s, g]) * costmodel.kept_bytes(layer, False) / MIB + later[g + 1]
            extra = costmodel.layer_extra_bytes(layer, True)
            lp += scratch >= extra / MIB * used - after, f"recompute_{s}_{g}"
        total += [k * costmodel.first_layer_kept_bytes(layer) / MIB * opens(s, g),
                  k * costmodel.last_layer_kept_bytes(layer) / MIB * closes(s, g)]
        held += [costmodel.first_layer_buffer_bytes(layer, s, setup) / MIB * opens(s, g),
                 costmodel.last_layer_buffer_bytes(layer, s, setup) / MIB * closes(s, g)]
        if present is not None and costmodel.layer_step_scratch_bytes(layer, setup, device_type) > 0:
            step_scratch.append((costmodel.layer_step_scratch_bytes(layer, setup, device_type), present, n(s, g)))
    held += _zero_one_excess_mib(problem, s, n)
    if step_scratch:
        # [Constraint] the optimizer step: static + buffers + its scratch ≤ cap
        # (costmodel.step_scratch_bytes: cuda every layer's, cpu twice the largest layer's)
        if problem.profile.device.type == "cuda":
            step = pulp.lpSum(num_bytes / MIB * count for num_bytes, _, count in step_scratch)
        else:
            step = pulp.LpVariable(f"S_{s}", lowBound=0)
            for g, (num_bytes, present, _) in enumerate(step_scratch):
                lp += step >= 2 * num_bytes / MIB * present, f"step_scratch_{s}_{g}"
        lp += pulp.lpSum(held) + step <= _cap_mib(problem, s), f"step_cap_{s}"
    return pulp.lpSum(held + total)


def _zero_one_excess_mib(problem: Problem, s: int, n) -> list:
    """ZeRO 1's whole tensors (dataparallel.zero_one_excess_bytes): [E_s] with
    E_s ≥ o · (largest tensor of a run in the stage - the stage's parameters / K), E_s ≥ 0;
    [] where it cannot arise."""
    setup = problem.setup
    largest = [run.layer.largest_param_count for run in problem.runs]
    optim = dataparallel.whole_tensor_optim_bytes(setup)
    if not optim or not any(largest):
        return []
    params = pulp.lpSum(run.layer.param_count * n(s, g) for g, run in enumerate(problem.runs))
    excess = pulp.LpVariable(f"Z_{s}", lowBound=0)
    for g, run in enumerate(problem.runs):
        if largest[g]:
            # [Constraint] a rank of the shard group holds the run's largest tensor whole
            present = _presence(problem, f"z_{s}_{g}", n(s, g), run.size)
            problem.lp += (excess >= optim * (largest[g] * present - params / dataparallel.shard_size(setup)) / MIB,
                           f"zero_one_{s}_{g}")
    return [excess]


def _run_kept_bytes(problem: Problem, s: int, g: int, n):
    """Bytes per microbatch stage s's layers of run g keep (checkpointed ones their input)."""
    layer = problem.runs[g].layer
    kept = costmodel.kept_bytes(layer, False) * n(s, g)
    if (s, g) in problem.r:
        kept -= (costmodel.kept_bytes(layer, False) - costmodel.kept_bytes(layer, True)) * problem.r[s, g]
    return kept


def _presence(problem: Problem, name: str, count, size: int):
    """A binary that is 1 when `count` (0..size) is positive; the count itself when size is 1."""
    if size == 1:
        return count
    flag = pulp.LpVariable(name, cat="Binary")
    problem.lp += size * flag >= count, f"{name}_link"
    return flag


def _cap_mib(problem: Problem, s: int):
    """cap_s - margin; for the memory objective scale·cap_s - margin (a cap of a few KiB can
    grow too)."""
    cap = problem.setup.mem_caps_bytes[s] / MIB
    if problem.scale is not None:
        cap = cap * problem.scale
    return cap - costmodel.FIT_MARGIN_BYTES / MIB


# ---------------------------------------------------------------- solve and extract


class _HiGHS(pulp.HiGHS):
    """pulp's HiGHS (highspy API) with two additions pulp's bridge lacks:
    - the objective's constant goes to HiGHS too; without it HiGHS measures its MIP gap
      against a smaller number than the real objective (gaps several times too large);
    - an optional start solution (variable name -> value), e.g. from the best baseline,
      so a time-limited solve never returns worse than that."""

    def __init__(self, *args, start: dict[str, float] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.start = start

    def callSolver(self, lp):
        import highspy

        lp.solverModel.changeObjectiveOffset(float(lp.objective.constant))
        if self.start:
            solution = highspy.HighsSolution()
            solution.col_value = [self.start.get(var.name, 0.0) for var in lp.variables()]
            solution.value_valid = True
            lp.solverModel.setSolution(solution)
        super().callSolver(lp)


def solve(
    problem: Problem,
    *,
    time_limit_s: float | None = None,
    mip_gap: float = 1e-4,
    threads: int | None = None,
    log: bool = False,
    start: list[StagePlan] | None = None,
) -> SolveResult:
    """Run HiGHS. Optimal only when pulp's problem AND solution status both say so; a
    time-limited solve with a solution is "feasible" with its gap. `start`: a feasible
    plan (a baseline's stages) HiGHS begins from."""
    values = start_values(problem, start) if start else None
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
    else:
        return SolveResult("timeout", None, None, wall_s)
    info = problem.lp.solverModel.getInfo()
    gap = float(info.mip_gap) if info.mip_gap < float("inf") else None
    return SolveResult(status, float(pulp.value(problem.lp.objective)), gap, wall_s)


def start_values(problem: Problem, stages: list[StagePlan]) -> dict[str, float] | None:
    """Every variable's value for a given plan: fix the prefix and checkpoint counts to the
    plan's, let HiGHS fill in the rest (a tiny solve), and read them back."""
    runs, names = problem.runs, [layer.name for layer in problem.profile.layers]
    position = {name: idx for idx, name in enumerate(names)}
    ends = [position[stage.layers[-1]] + 1 for stage in stages]
    ckpt = {position[name] for stage in stages for name in stage.checkpointed}
    fixed = {}
    for s, end in enumerate(ends):
        begin = ends[s - 1] if s > 0 else 0
        for g, run in enumerate(runs):
            layers_before = max(0, min(end, run.start + run.size) - run.start)
            if not isinstance(problem.y[s, g], int):
                fixed[problem.y[s, g]] = layers_before
            if (s, g) in problem.r:
                fixed[problem.r[s, g]] = sum(1 for i in range(max(begin, run.start), min(end, run.start + run.size)) if i in ckpt)
    saved = {var: (var.lowBound, var.upBound) for var in fixed}
    for var, value in fixed.items():
        var.lowBound = var.upBound = value
    try:
        problem.lp.solve(_HiGHS(msg=False))
        if problem.lp.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
            return None  # the plan breaks the formulation's assumptions (or a cap): no start
        return {var.name: var.varValue for var in problem.lp.variables()}
    finally:
        for var, (low, up) in saved.items():
            var.lowBound, var.upBound = low, up


def extract_plan(problem: Problem) -> list[StagePlan]:
    """Stage boundaries from the prefix counts; in each stage, the first r[s,g] layers of
    each run are the checkpointed ones (same-kind layers cost the same)."""
    setup, runs = problem.setup, problem.runs
    prefix = [[int(round(pulp.value(problem.y[s, g]))) for g in range(len(runs))] for s in range(setup.stages)]
    bounds = [0] + [sum(prefix[s]) for s in range(setup.stages - 1)]
    checkpointed = [False] * sum(run.size for run in runs)
    for s in range(setup.stages):
        for g, run in enumerate(runs):
            if (s, g) not in problem.r:
                continue
            count = int(round(pulp.value(problem.r[s, g])))
            first = run.start + (prefix[s - 1][g] if s > 0 else 0)
            for idx in range(first, first + count):
                checkpointed[idx] = True
    return costmodel.split_to_stages(bounds, checkpointed, problem.profile)


def plan(
    profile: Profile,
    setup: TrainSetup,
    *,
    time_limit_s: float | None = None,
    mip_gap: float = 1e-4,
    threads: int | None = None,
    log: bool = False,
    upper_bound_ms: float | None = None,
    start: list[StagePlan] | None = None,
    method: Literal["dp", "milp"] = "dp",
    deadline: Deadline | None = None,
) -> PlanResult | SolveResult:
    """The fastest plan that fits, re-scored by costmodel.evaluate(). Returns the SolveResult
    alone when no plan was found (infeasible, or timeout). `start`: a feasible plan (e.g. the
    best baseline) to begin from and to fall back on; `upper_bound_ms`: the iteration time
    of a feasible plan. method "dp": dpsolve's exact dynamic programme (mip_gap, threads and
    log play no part); "milp": HiGHS, the cross-check. `deadline` (default: time_limit_s from
    now) bounds everything; past it the best plan known is returned as "feasible"."""
    deadline = deadline or Deadline(time_limit_s)
    if method == "milp":
        return _plan_milp(profile, setup, deadline=deadline, mip_gap=mip_gap, threads=threads, log=log,
                          upper_bound_ms=upper_bound_ms, start=start)
    return _plan_dp(profile, setup, deadline=deadline, upper_bound_ms=upper_bound_ms, start=start)


def _plan_dp(profile: Profile, setup: TrainSetup, *, deadline: Deadline, upper_bound_ms, start) -> PlanResult | SolveResult:
    start, start_cost = _feasible_start(profile, setup, upper_bound_ms, start)
    if start_cost is not None:
        upper_bound_ms = min(upper_bound_ms or math.inf, start_cost.iteration_ms)
    try:
        found = dpsolve.fastest_plan(profile, setup, upper_bound_ms=upper_bound_ms, deadline=deadline)
    except Expired as stop:
        if stop.found is not None:  # a first pass beat the start
            start = stop.found[0]
            start_cost = costmodel.evaluate(start, profile, setup)
        return _cut_short(profile, setup, start, start_cost, deadline)
    if found is None:
        if start is not None:
            raise SolverMismatch("the dynamic programme found no plan as fast as the feasible start plan")
        return SolveResult("infeasible", None, None, deadline.elapsed_s())
    stages, objective_ms = found
    return _checked(stages, profile, setup, SolveResult("optimal", objective_ms, 0.0, deadline.elapsed_s()))


def _feasible_start(profile: Profile, setup: TrainSetup, upper_bound_ms, start):
    """(start, its cost) if the start fits, else (None, None); with neither a start nor a
    bound given, the best feasible baseline (cheap) is the start."""
    if start is None and upper_bound_ms is None:
        start = _best_baseline(profile, setup)
    cost = costmodel.evaluate(start, profile, setup) if start is not None else None
    return (start, cost) if cost is not None and cost.feasible else (None, None)


def _cut_short(profile: Profile, setup: TrainSetup, start, start_cost, deadline: Deadline) -> PlanResult | SolveResult:
    """The deadline passed: the best plan known (`start`), "feasible", its gap measured
    against a proven lower bound on any plan's time; "timeout" without one."""
    if start is None:
        return SolveResult("timeout", None, None, deadline.elapsed_s())
    bound_ms = dpsolve.lower_bound_ms(profile, setup)
    gap = max(0.0, (start_cost.iteration_ms - bound_ms) / start_cost.iteration_ms)
    solve = SolveResult("feasible", start_cost.iteration_ms, gap, deadline.elapsed_s())
    return PlanResult(stages=costmodel.with_predictions(start, start_cost), cost=start_cost, solve=solve)


def _best_baseline(profile: Profile, setup: TrainSetup) -> list[StagePlan] | None:
    from planner import baselines

    feasible = [b for b in baselines.all_baselines(profile, setup) if b.feasible]
    return min(feasible, key=lambda b: b.iteration_ms).stages if feasible else None


def _checked(stages: list[StagePlan], profile: Profile, setup: TrainSetup, result: SolveResult) -> PlanResult:
    """Re-score the plan with costmodel.evaluate(): it must fit and agree with the objective."""
    cost = costmodel.evaluate(stages, profile, setup)
    if abs(cost.iteration_ms - result.objective) > 1e-6 * max(1.0, abs(result.objective)):
        raise SolverMismatch(
            f"plan re-evaluates to {cost.iteration_ms!r} ms but the solver's objective is {result.objective!r}"
        )
    if not cost.feasible:
        over = [s for s, c in enumerate(cost.stages) if not c.fits]
        raise SolverMismatch(f"solver plan exceeds the caps of stages {over} under evaluate()")
    return PlanResult(stages=costmodel.with_predictions(stages, cost), cost=cost, solve=result)


def _plan_milp(profile: Profile, setup: TrainSetup, *, deadline: Deadline, mip_gap: float, threads, log,
               upper_bound_ms, start) -> PlanResult | SolveResult:
    """Build, solve on HiGHS, extract and cross-check; past the deadline, the start plan."""
    try:
        upper_bound_ms, start = _better_start(profile, setup, upper_bound_ms, start, deadline)
        problem = build_problem(profile, setup, upper_bound_ms=upper_bound_ms)
        deadline.check()
    except Expired:
        return _cut_short(profile, setup, *_feasible_start(profile, setup, upper_bound_ms, start), deadline)
    result = solve(problem, time_limit_s=deadline.remaining_s(), mip_gap=mip_gap, threads=threads, log=log,
                   start=start)
    result = SolveResult(result.status, result.objective, result.gap, deadline.elapsed_s())
    if result.status in ("infeasible", "timeout"):
        return result
    return _checked(extract_plan(problem), profile, setup, result)


def _better_start(profile: Profile, setup: TrainSetup, upper_bound_ms, start, deadline: Deadline):
    """With many distinct layers, the MILP's bounds are only as tight as its starting plan:
    take the heuristic's plan when it beats the one given (within 0.05% of the optimum on
    heterogeneous 128x16, against 15% for the best baseline). Runs of identical layers
    keep the MILP small without it."""
    if len(find_runs(costmodel.layer_costs(profile))) <= HEURISTIC_RUNS_PER_STAGE * setup.stages:
        return upper_bound_ms, start
    found = incumbent.heuristic_plan(profile, setup, upper_bound_ms=upper_bound_ms, deadline=deadline)
    if found is None:
        return upper_bound_ms, start
    cost = costmodel.evaluate(found, profile, setup)
    if cost.feasible and (upper_bound_ms is None or cost.iteration_ms < upper_bound_ms):
        return cost.iteration_ms, found
    return upper_bound_ms, start


def min_cap_scale(profile: Profile, setup: TrainSetup, *, time_limit_s: float | None = 30.0,
                  method: Literal["dp", "milp"] = "dp", deadline: Deadline | None = None) -> tuple[float, PlanCost] | None:
    """The smallest factor by which every cap can be multiplied so that some plan fits,
    and the cost of that plan (for telling a user what cap would work). None when the
    deadline (default: time_limit_s from now) passed first."""
    deadline = deadline or Deadline(time_limit_s)
    if method == "milp":
        problem = build_problem(profile, setup, objective="memory")
        result = solve(problem, time_limit_s=deadline.remaining_s())
        if result.status in ("infeasible", "timeout"):
            return None
        stages = extract_plan(problem)
    else:
        try:
            from planner import baselines

            known = baselines.full_checkpointing(profile, setup)
            stages = dpsolve.least_memory_plan(profile, setup, known=known, deadline=deadline)
        except Expired:
            return None
    cost = costmodel.evaluate(stages, profile, setup)
    return max((c.peak_bytes + costmodel.FIT_MARGIN_BYTES) / c.cap_bytes for c in cost.stages), cost
