"""The mixed-integer program on HiGHS (through pulp's highspy API) that chooses each
stage's layers and which of them are checkpointed: `ckplan solve --solver milp`, and what
`--solver auto` takes where the dynamic programme's structure does not hold
(planner/solve/search.py picks). The tests hold it to the DP and to brute force.

Its coefficients are generated from the cost model's description (costmodel.TERMS, read
through layer_value / edge_value / stage_value by quantity), not retyped here.

Formulation. Consecutive layers of one kind and the same numbers (find_runs) form a run g of n_g
interchangeable layers (a fully heterogeneous profile has runs of one). Instead of assigning layers
to stages, the program places stage boundaries through prefix counts, so a plan is
contiguous and in order by construction, and identical layers cost one integer
instead of many symmetric binaries:

    y[s,g] ∈ {0..n_g}  run-g layers in stages 0..s        (y[-1,g] = 0, y[P-1,g] = n_g)
    n[s,g] = y[s,g] - y[s-1,g]                            run-g layers in stage s
    r[s,g,o] ∈ {0..n[s,g]}  run-g layers of stage s under recompute option o (Σ_o ≤ n[s,g];
                          the rest none), for the run's undominated options (costmodel.useful_options)
    f[s,g] = [y[s,g] = n_g]   run g lies wholly in stages 0..s
    t[s,g] = [y[s,g] ≥ 1]     run g is touched by stages 0..s
    open[s,g]  = f[s-1,g-1] - f[s-1,g]                    stage s's first layer is of run g
    close[s,g] = t[s,g] - t[s,g+1]                        stage s's last layer is of run g
    busy_s = time_s + Σ_g send(input_g)·open[s,g] + send(output_g)·close[s,g] + 2·action
             + [split backward, s > 0] Σ_g Σ_o x_g,o·r[s,g,o] (o = none: n - Σ_o r)   x: the passes'
               extra over the full backward per layer and option (splittime.layer_extra_ms), a
               constant: the stage's F + I + W as evaluate simulates it, linear and exact
    τ ≥ busy_s,  σ ≥ step_s                               the bottleneck stage, slowest step
    T ≥ Σ_s busy_s + (M-1)·τ + σ,
    T ≥ h·(M·Σ_s busy_s + Σ_s step_s) / C                 minimise T (costmodel.pipeline_ms)

Bounds. A feasible plan (the best baseline, or incumbent.py's heuristic when better)
starts HiGHS and bounds τ: (M-1)·τ* ≤ T_feasible - Σ(fwd+bwd) - Σ step / P. That bound also gives
every stage boundary a window (stages 0..s hold at most (s+1)·τ of plain time, the
stages after s the rest), which fixes most prefix counts before HiGHS starts. Memory
rows are in MiB, so HiGHS's row tolerance (highs.MIP_FEASIBILITY_TOLERANCE) is ~0.1 byte; its
integrality tolerance, times a layer's bytes, can be more, which solve_within_caps takes back.

Under Megatron-FSDP's double buffer a layer's extra holds its moments (milp_rows._extra), and the last
stage's last unit and output layer their own rows (milp_rows._tail_rows), as evaluate places them.

Every coefficient comes from planner.costmodel; after the solve the plan is
re-scored by costmodel.evaluate() and must agree with the objective.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import pulp

from planner.cost import costmodel, fsdpunits, gathered, pipereduce, splittime
from planner.cost.costmodel import LayerCost
from planner.cost.rules import runtime_facts
from planner.schema import (
    Profile,
    TrainSetup,
)
from planner.solve import dpsolve, highs
from planner.solve.deadline import Deadline
from planner.solve.highs import SolveResult, _HiGHS, extract_plan, solve, start_values  # noqa: F401
from planner.solve.milp_ranks import _chunked_time, _rank_rows
from planner.solve.milp_rows import (  # noqa: F401
    MIB,
    Problem,
    Run,
    _busy,
    _cap_mib,
    _const,
    _edge,
    _extra,
    _held,
    _late_grad_mib,
    _layer,
    _Memory,
    _stage_memory_parts,
    _step_and_host_rows,
    _step_end_row,
)

# The rows that hold a byte count under a cap (milp_rows, milp_ranks): the stage's peak, the
# optimizer step's, the step's end, a chunked rank's every moment, the host's
MEMORY_ROWS = ("cap_", "step_cap_", "step_end_", "live_", "pass_", "host_cap_")
# How many times solve_within_caps tightens the memory rows (by the excess x 4^round: up to 16,384
# times a byte's excess) before it lets evaluate's check speak
TIGHTEN_ROUNDS = 8


def solve_within_caps(problem: Problem, over_bytes: Callable[[Problem], int], *, deadline: Deadline,
                      **kwargs) -> SolveResult:
    """solve(), its plan held to evaluate()'s caps to the byte. HiGHS keeps an integer variable
    within mip_feasibility_tolerance of a whole number and computes its rows at that value: a
    count HiGHS left at 4.2e-9 for 0, on a layer that keeps 227 MiB, lowered a stage's peak row
    by one byte, so a --mem one byte under the plan's need got the plan, which evaluate() (on the
    whole counts extract_plan reads) then refused. Where the plan is over its caps by
    `over_bytes` (evaluate's excess, 0 where it fits) no more than that tolerance can explain
    (_tolerance_bytes), the memory rows are tightened by the excess, four times more each round,
    and the problem solved again; a larger excess is left to evaluate's check (a formulation error). A
    plan within a few bytes of its cap that only a tightened row refuses is given up so: said
    here, the price of never handing a plan that does not fit."""
    result = solve(problem, time_limit_s=deadline.remaining_s(), **kwargs)
    for tightening in range(TIGHTEN_ROUNDS):
        if result.status not in ("optimal", "feasible"):
            return result
        over = over_bytes(problem)
        if not over or over > _tolerance_bytes(problem):
            return result
        for row in problem.lp.constraints():
            if row.name.startswith(MEMORY_ROWS):
                row.constant += over * 4**tightening / MIB
        result = solve(problem, time_limit_s=deadline.remaining_s(), **kwargs)
    return result


def _tolerance_bytes(problem: Problem) -> float:
    """How many bytes HiGHS's tolerances can take off a memory row at most (generously): the row's
    own tolerance and each integer variable's, times its coefficient, over every row (a memory
    row reads continuous variables, the transient's T_s, that other rows bound)."""
    tol = highs.MIP_FEASIBILITY_TOLERANCE
    rows = problem.lp.constraints()
    coefficients = sum(abs(c) for row in rows for v, c in row.items() if v.cat == pulp.LpInteger)
    return tol * (len(rows) + coefficients) * MIB


def find_runs(layers: list[LayerCost], apart: list | None = None) -> list[Run]:
    """Consecutive layers with the same numbers: the kind's and variant's (layers.layer_costs), and what a layer
    has by its place: the output the next layer pays for (output_shared_bytes: the last of a chain of layers that
    each save their input, the layer before's saved output, keeps its own whole), its tied sets, its frozen count (a
    kind's frozen and trained layers share their times, not their gradients: layers.frozen_count), whether its
    input and output need a gradient (a stage's gradient buffers: rules.first_layer_buffer_bytes). `apart`: a
    figure per layer the rows read at a run's first layer beyond its kind's numbers (_units_apart), equal within
    a run too."""
    def numbers(index: int) -> tuple:
        layer = layers[index]
        return layer.kind, layer.variant, layer.output_shared_bytes, layer.tied, layer.shared_before, \
            layer.frozen_param_count, layer.input_grad, layer.output_grad, None if apart is None else apart[index]

    runs: list[Run] = []
    for idx, layer in enumerate(layers):
        if runs and numbers(runs[-1].start) == numbers(idx):
            runs[-1] = Run(runs[-1].start, runs[-1].size + 1, runs[-1].layer)
        else:
            runs.append(Run(idx, 1, layer))
    return runs


def problem_runs(profile: Profile, setup: TrainSetup) -> list[Run]:
    """The runs build_problem builds for `setup` as given (its P·V stages for a chunked schedule): find_runs over
    the profile's layers, split where FSDP2's units are charged per moment (_units_apart). The search route counts
    these to decide whether the layers are distinct enough to start from the heuristic (search._better_start)."""
    setup = costmodel.stages_view(setup, costmodel.schedule_of(setup))
    return find_runs(costmodel.layer_costs(profile), _units_apart(profile, setup))


def _units_apart(profile: Profile, setup: TrainSetup) -> list | None:
    """Each layer's (parameters on the rank, Float8 weights) where FSDP2's units are charged per moment: the
    profile's own counts (gathered.stage_units), not the kind's maximum a LayerCost holds, which the moment rows
    read at a run's first layer (milp_moments._least, _params); a run mixing them charged a layer of no parameters
    its kind's all-gather (§66.milpfsdp: infeasible where evaluate fits). None where not charged per moment.
    With its neighbours' and whether it is the model's last: a layer's own moments read the unit before it
    (prefetched) and after it (reduced last), and the model's last layer's forward end (gathered.fsdp_unit_layer_bytes),
    so a run ending at the model's last layer charged that layer the first one's extra (a one-stage ZeRO 2 plan
    1.25 MiB where evaluate has 1.0: infeasible where it fits, §67.lead)."""
    if not fsdpunits.charged_per_moment(setup, runtime_facts(setup).fsdp_units):
        return None
    params, fp8, _ = gathered.stage_units(profile, setup)
    units, last = list(zip(params, fp8)), len(params) - 1
    return [(unit, units[i - 1] if i > 0 else None, units[i + 1] if i < last else None, i == last)
            for i, unit in enumerate(units)]


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
    deadline: Deadline | None = None,
) -> Problem:
    """objective="time": fastest iteration under the caps; `upper_bound_ms`, the iteration
    time of any feasible plan (e.g. the best baseline's), bounds the bottleneck τ.
    objective="memory": the smallest factor by which every cap could be scaled and still fit.
    A chunked schedule (interleaved-1F1B, ZB, ZBV, DualPipeV) is built over its P·V stages,
    with each rank's rows over its chunks (_rank_rows) and its linear time (_chunked_time)."""
    layers = costmodel.layer_costs(profile)
    runs = problem_runs(profile, setup)
    order = costmodel.schedule_of(setup)
    # a rank of several stages: its rows over its chunks (_rank_rows) against the setup as given
    outer = setup if order.num_chunks > 1 else None
    setup = costmodel.stages_view(setup, order)
    if setup.pipeline.stages > len(layers):
        raise ValueError(f"{setup.pipeline.stages} stages need at least {setup.pipeline.stages} layers, the profile has {len(layers)}")
    lp = pulp.LpProblem("ckplan", pulp.LpMinimize)
    problem = Problem(lp=lp, profile=profile, setup=setup, runs=runs,
                      objective=objective, outer=outer,
                      schedule=order, deadline=deadline)
    tau_max = float("inf")
    if objective == "time" and upper_bound_ms is not None and outer is None:
        tau_max = costmodel.bottleneck_bound_ms(profile, setup, upper_bound_ms)
    layout = _layout(problem, boundary_windows(profile, setup, tau_max))
    n, opens, closes = layout.n, layout.opens, layout.closes
    _option_counts(problem, n)

    # τ: the slowest stage's time per microbatch
    tau = pulp.LpVariable("tau", lowBound=0, upBound=None if tau_max == float("inf") else tau_max)
    if objective == "memory":
        problem.scale = pulp.LpVariable("scale", lowBound=0)
    stage_times = []
    for s in range(setup.pipeline.stages):
        stage_times.append(_stage_time(problem, s, n, opens, closes))
        lp += stage_times[-1] <= tau, f"bottleneck_{s}"
        if outer is None:
            lp += _stage_memory_mib(problem, s, n, opens, closes) <= _cap_mib(problem, s), f"cap_{s}"
    if outer is not None:
        _rank_rows(problem, n, opens, closes)
    if objective == "memory":
        lp += problem.scale
    elif outer is not None:
        lp += _chunked_time(problem, stage_times, tau, n, opens, closes)
    else:
        lp += _pipeline_time(problem, stage_times, tau, n)
    return problem


@dataclass
class _Layout:
    """The stage boundaries as prefix counts: y[s,g] run-g layers in stages 0..s, f[s,g] =
    [y = n_g] (run g lies wholly in stages 0..s), t[s,g] = [y ≥ 1] (run g is touched)."""

    y: dict
    full: dict
    touched: dict
    num_stages: int
    num_runs: int

    def n(self, s: int, g: int):
        """run-g layers in stage s"""
        return self.y[s, g] - (self.y[s - 1, g] if s > 0 else 0)

    def opens(self, s: int, g: int):
        """1 if stage s's first layer is of run g."""
        if s == 0:
            return 1 if g == 0 else 0
        before = self.full[s - 1, g - 1] if g > 0 else 1
        return before - self.full[s - 1, g]

    def closes(self, s: int, g: int):
        """1 if stage s's last layer is of run g."""
        if s == self.num_stages - 1:
            return 1 if g == self.num_runs - 1 else 0
        after = self.touched[s, g + 1] if g + 1 < self.num_runs else 0
        return self.touched[s, g] - after


def _layout(problem: Problem, ends: list[tuple[int, int]]) -> _Layout:
    """The prefix counts within each stage's window of ends, their exact indicators, and the rows
    that keep a plan contiguous, in order and every stage non-empty."""
    lp, runs = problem.lp, problem.runs
    num_stages, num_runs = problem.setup.pipeline.stages, len(runs)
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
    layout = _Layout(y, full, touched, num_stages, num_runs)

    # [Constraint] prefixes grow with s, and every stage holds at least one layer
    for s in range(num_stages):
        lp += pulp.lpSum(layout.n(s, g) for g in range(num_runs)) >= 1, f"nonempty_{s}"
        for g in range(num_runs):
            if s > 0 and s < num_stages - 1:
                lp += y[s, g] >= y[s - 1, g], f"grow_{s}_{g}"
    return layout


def _option_counts(problem: Problem, n) -> None:
    """r[s,g,o]: run-g layers of stage s under option o (only options that keep fewer bytes),
    each run's options in problem.order (the largest extra peak first)."""
    lp, r = problem.lp, problem.r
    for g, run in enumerate(problem.runs):
        options = costmodel.useful_options(run.layer, problem.ctx)
        problem.order[g] = sorted(options, key=lambda o, layer=run.layer: -_extra(problem, layer, o))
    for s in range(problem.setup.pipeline.stages):
        for g, run in enumerate(problem.runs):
            for o in problem.order[g]:
                r[s, g, o] = _count_var(f"r_{s}_{g}_{o}", run.size)
            if problem.order[g]:
                lp += pulp.lpSum(r[s, g, o] for o in problem.order[g]) <= n(s, g), f"ckpt_owned_{s}_{g}"


def _pipeline_time(problem: Problem, stage_times: list, tau, n):
    """A schedule of one stage per rank: T_iter ≥ Σ_s time_s + (M - 1)·τ + σ (critical path, σ:
    the slowest optimizer step), T_iter ≥ (M·Σ_s time_s + Σ_s step_s) / C (capacity; every layer
    steps somewhere): costmodel.pipeline_ms."""
    lp, runs, setup = problem.lp, problem.runs, problem.setup
    t_iter = pulp.LpVariable("T_iter", lowBound=0)
    slowest_step = 0
    step_of = {g: _layer(problem, ("step",), run.layer) for g, run in enumerate(runs)}
    if any(step_of.values()):
        slowest_step = pulp.LpVariable("sigma", lowBound=0)
        for s in range(setup.pipeline.stages):
            lp += pulp.lpSum(step_of[g] * n(s, g) for g in range(len(runs))) <= slowest_step, f"step_{s}"
    drain = pipereduce.drain_ms(costmodel.layer_costs(problem.profile), setup)  # after the stages' last backward
    lp += t_iter >= pulp.lpSum(stage_times) + (setup.pipeline.microbatches - 1) * tau + slowest_step + drain, \
        "critical_path"
    if costmodel.parallel_stages(setup) < setup.pipeline.stages:
        total_step = sum(step_of[g] * run.size for g, run in enumerate(runs))
        lp += t_iter >= setup.time.cpu_sharing * (setup.pipeline.microbatches * pulp.lpSum(stage_times) + total_step) / (
            costmodel.parallel_stages(setup)), "capacity"
    return t_iter


def _stage_time(problem: Problem, s: int, n, opens, closes):
    """busy_s = Σ_g n·time(plain) + Σ_o r_o·(time(o) - time(plain)) + what the first and last
    layer and the stage's position add (costmodel.TERMS: time and comm); under a split backward
    (ZB, ZBV, DualPipeV) past the pipeline's first stage, each layer's passes beyond its full
    backward too (splittime.layer_extra_ms, a constant per layer and option: the stage's F + I + W
    as evaluate simulates it, splittime.stage_times)."""
    terms = [_const(problem, _busy(), s)]
    for g, run in enumerate(problem.runs):
        plain = _layer_busy(problem, run.layer, 0, s)
        terms.append(plain * n(s, g))
        for o in problem.order[g]:
            terms.append((_layer_busy(problem, run.layer, o, s) - plain) * problem.r[s, g, o])
        terms += [_edge(problem, _busy(), "open", run.layer, s) * opens(s, g),
                  _edge(problem, _busy(), "close", run.layer, s) * closes(s, g)]
    return pulp.lpSum(terms)


def _layer_busy(problem: Problem, layer: LayerCost, option: int, s: int) -> float:
    """One layer's busy time on stage s under `option`: its rows, and its split passes' extra
    where the schedule splits the backward and s is not the pipeline's first stage."""
    busy = _layer(problem, _busy(), layer, option)
    if problem.schedule.splits_backward and s > 0:
        busy += splittime.layer_extra_ms(layer, option, problem.setup)
    return busy


def _stage_memory_mib(problem: Problem, s: int, n, opens, closes):
    """peak_s = held + max(k_s·kept + T_s, step scratch), in MiB (costmodel.TERMS: static and
    buffers held, kept, extra, scratch): returns held + k_s·kept + T_s (the training peak)
    and adds the optimizer step's row, held + scratch ≤ cap, the step's end's and the host row
    itself."""
    memory = _stage_memory_parts(problem, s, n, opens, closes)
    k = costmodel.in_flight(problem.setup.pipeline, s)
    cap = _cap_mib(problem, s)
    # the whole gradients a runtime allocates at the stage's first backward (static charges them):
    # gone at the optimizer step and the step's end; beside the activations as gradients_above says
    late = _late_grad_mib(problem, [s], n)
    _step_and_host_rows(problem, f"{s}", [memory], cap, [-term for term in late])
    _step_end_row(problem, f"{s}", [s], memory.held, n, opens, closes, cap)
    _gpipe_rows(problem, s, memory, opens, cap)
    if late and costmodel.one_chunk_gradients_above(1.0, stage=s, kept=1.0, pipeline=problem.setup.pipeline) < 1.0:
        # [Constraint] GPipe, or 1F1B's stage with all M in flight: they arrive as the first
        # backward frees a microbatch, held - G + k·kept + T + max(0, G - kept) ≤ cap
        # (gradtiming.one_chunk), as two rows: this one and the one returned
        lp = problem.lp
        lp += pulp.lpSum(memory.held + [(k - 1) * term for term in memory.kept] + [memory.transient]) <= cap, \
            f"cap_grads_{s}"
        return pulp.lpSum(memory.held + [-term for term in late] + [k * term for term in memory.kept]
                          + [memory.transient])
    # held + k·kept written out term by term: one row fewer between a byte and its cap
    return pulp.lpSum(memory.held + [k * term for term in memory.kept] + [memory.transient])


def _gpipe_rows(problem: Problem, s: int, memory, opens, cap) -> None:
    """[Constraint] GPipe: each backward leaves h held to the step's end (gpipeheld: the input
    gradient its send holds, the last stage's loss value; h of the run that opens the stage), so
    its second and last backwards are moments of their own beside the first's (gradtiming.one_chunk):
    held + (M - 1)·kept + h + T ≤ cap and held + kept + (M - 1)·h + T ≤ cap, the whole gradients
    allocated at the first backward among held (static charges them)."""
    setup, microbatches = problem.setup, problem.setup.pipeline.microbatches
    per_run = [costmodel.held_per_backward_bytes(run.layer, s, setup) / MIB for run in problem.runs]
    if microbatches < 2 or not any(per_run):
        return
    sent = pulp.lpSum(h * opens(s, g) for g, h in enumerate(per_run) if h)
    lp = problem.lp
    lp += pulp.lpSum(memory.held + [(microbatches - 1) * term for term in memory.kept]
                     + [memory.transient, sent]) <= cap, f"cap_gpipe_second_{s}"
    lp += pulp.lpSum(memory.held + memory.kept + [memory.transient, (microbatches - 1) * sent]) <= cap, \
        f"cap_gpipe_last_{s}"
