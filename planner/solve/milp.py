"""The mixed-integer program on HiGHS (through pulp's highspy API) that chooses each
stage's layers and which of them are checkpointed: `ckplan solve --solver milp`, and what
`--solver auto` takes where the dynamic programme's structure does not hold
(planner/search.py picks). The tests hold it to the DP and to brute force.

Its coefficients are generated from the cost model's description (costmodel.TERMS, read
through layer_value / edge_value / stage_value by quantity), not retyped here.

Formulation. Consecutive layers of one kind form a run g of n_g interchangeable
layers (a fully heterogeneous profile has runs of one). Instead of assigning layers
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

from dataclasses import dataclass, field
from typing import Literal

import pulp

from planner.cost import costmodel, dataparallel
from planner.cost.costmodel import LayerCost
from planner.schema import (
    CHUNKED_SCHEDULES,
    SPLIT_BACKWARD_SCHEDULES,
    Profile,
    TrainSetup,
)
from planner.solve import dpsolve
from planner.solve.deadline import Deadline
from planner.solve.highs import SolveResult, _HiGHS, extract_plan, solve, start_values  # noqa: F401

# Bytes enter the solver in MiB: coefficients stay well conditioned (1e-2 .. 1e5 for
# models up to ~100 GiB per device) and HiGHS's feasibility tolerance (1e-7 per row)
# is a tenth of a byte, so a plan the solver accepts never exceeds a cap under evaluate().
MIB = float(2**20)


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
    r: dict[tuple[int, int, int], object] = field(default_factory=dict)  # (stage, run, option) -> count
    # per run, its options in the order a stage's layers of the run take them: the largest
    # extra peak first (no other order has a smaller transient: swapping two neighbours that
    # are out of order never lowers it), none last
    order: dict[int, list[int]] = field(default_factory=dict)
    scale: pulp.LpVariable | None = None  # memory objective: caps are multiplied by it
    # a chunked schedule: the setup as given (problem.setup is then one of its P·V stages'),
    # and the schedule's order (planner/schedules.py)
    outer: TrainSetup | None = None
    schedule: object = None
    deadline: Deadline | None = None  # building a chunked schedule's rows looks at it per rank

    @property
    def ctx(self) -> costmodel.Context:
        split = self.outer is not None and self.outer.pipeline.schedule in SPLIT_BACKWARD_SCHEDULES
        return costmodel.Context(self.profile, self.setup, split_backward=split, chunked=self.outer is not None)


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
    deadline: Deadline | None = None,
) -> Problem:
    """objective="time": fastest iteration under the caps; `upper_bound_ms`, the iteration
    time of any feasible plan (e.g. the best baseline's), bounds the bottleneck τ.
    objective="memory": the smallest factor by which every cap could be scaled and still fit.
    A chunked schedule (interleaved-1F1B, ZB, ZBV, DualPipeV) is built over its P·V stages,
    with each rank's rows over its chunks (_rank_rows) and its linear time (_chunked_time)."""
    layers = costmodel.layer_costs(profile)
    outer, order = None, None
    if setup.pipeline.schedule in CHUNKED_SCHEDULES:
        outer, order = setup, costmodel.schedule_of(setup)
        setup = costmodel.stage_setup(setup, order)
    if setup.pipeline.stages > len(layers):
        raise ValueError(f"{setup.pipeline.stages} stages need at least {setup.pipeline.stages} layers, the profile has {len(layers)}")
    runs = find_runs(layers)
    num_stages, num_runs = setup.pipeline.stages, len(runs)
    lp = pulp.LpProblem("ckplan", pulp.LpMinimize)
    problem = Problem(lp=lp, profile=profile, setup=setup, runs=runs, objective=objective, outer=outer,
                      schedule=order, deadline=deadline)
    tau_max = float("inf")
    if objective == "time" and upper_bound_ms is not None and outer is None:
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

    # r[s,g,o]: run-g layers of stage s under option o (only options that keep fewer bytes)
    r = problem.r
    for g, run in enumerate(runs):
        options = costmodel.useful_options(run.layer, problem.ctx)
        problem.order[g] = sorted(options, key=lambda o, layer=run.layer: -_layer(problem, ("extra",), layer, o))
    for s in range(num_stages):
        for g, run in enumerate(runs):
            for o in problem.order[g]:
                r[s, g, o] = _count_var(f"r_{s}_{g}_{o}", run.size)
            if problem.order[g]:
                lp += pulp.lpSum(r[s, g, o] for o in problem.order[g]) <= n(s, g), f"ckpt_owned_{s}_{g}"

    # τ: the slowest stage's time per microbatch
    tau = pulp.LpVariable("tau", lowBound=0, upBound=None if tau_max == float("inf") else tau_max)
    if objective == "memory":
        problem.scale = pulp.LpVariable("scale", lowBound=0)
    stage_times = []
    for s in range(num_stages):
        stage_times.append(_stage_time(problem, s, n, opens, closes))
        lp += stage_times[-1] <= tau, f"bottleneck_{s}"
        if outer is None:
            lp += _stage_memory_mib(problem, s, n, opens, closes) <= _cap_mib(problem, s), f"cap_{s}"
    if outer is not None:
        from planner.solve.milp_ranks import (  # they build on this module's rows
            _chunked_time,
            _rank_rows,
        )

        _rank_rows(problem, n, opens, closes)
        if objective == "time":
            lp += _chunked_time(problem, stage_times, tau, n)
        else:
            lp += problem.scale
        return problem

    if objective == "time":
        # T_iter ≥ Σ_s time_s + (M - 1)·τ + σ (critical path, σ: the slowest optimizer step),
        # T_iter ≥ (M·Σ_s time_s + Σ_s step_s) / C (capacity; every layer steps somewhere)
        t_iter = pulp.LpVariable("T_iter", lowBound=0)
        slowest_step = 0
        step_of = {g: _layer(problem, ("step",), run.layer) for g, run in enumerate(runs)}
        if any(step_of.values()):
            slowest_step = pulp.LpVariable("sigma", lowBound=0)
            for s in range(num_stages):
                lp += pulp.lpSum(step_of[g] * n(s, g) for g in range(num_runs)) <= slowest_step, f"step_{s}"
        lp += t_iter >= pulp.lpSum(stage_times) + (setup.pipeline.microbatches - 1) * tau + slowest_step, "critical_path"
        if costmodel.parallel_stages(setup) < setup.pipeline.stages:
            total_step = sum(step_of[g] * run.size for g, run in enumerate(runs))
            lp += t_iter >= setup.time.cpu_sharing * (setup.pipeline.microbatches * pulp.lpSum(stage_times) + total_step) / (
                costmodel.parallel_stages(setup)), "capacity"
        lp += t_iter
    else:
        lp += problem.scale
    return problem




def _held() -> tuple[str, ...]:
    return costmodel.quantities("held")  # bytes held all iteration (the declarations, read when built)


def _busy() -> tuple[str, ...]:
    return costmodel.quantities("busy")  # ms per microbatch on the critical path


def _layer(problem: Problem, quantities, layer: LayerCost, option: int = 0) -> float:
    return sum(costmodel.layer_value(q, layer, option, problem.ctx) for q in quantities)


def _edge(problem: Problem, quantities, where: str, layer: LayerCost, s: int) -> float:
    return sum(costmodel.edge_value(q, where, layer, s, problem.ctx) for q in quantities)


def _const(problem: Problem, quantities, s: int) -> float:
    return sum(costmodel.stage_value(q, s, problem.ctx) for q in quantities)


def _stage_time(problem: Problem, s: int, n, opens, closes):
    """busy_s = Σ_g n·time(plain) + Σ_o r_o·(time(o) - time(plain)) + what the first and last
    layer and the stage's position add (costmodel.TERMS: time and comm)."""
    terms = [_const(problem, _busy(), s)]
    for g, run in enumerate(problem.runs):
        plain = _layer(problem, _busy(), run.layer)
        terms.append(plain * n(s, g))
        for o in problem.order[g]:
            terms.append((_layer(problem, _busy(), run.layer, o) - plain) * problem.r[s, g, o])
        terms += [_edge(problem, _busy(), "open", run.layer, s) * opens(s, g),
                  _edge(problem, _busy(), "close", run.layer, s) * closes(s, g)]
    return pulp.lpSum(terms)


@dataclass
class _Memory:
    """One stage's memory in MiB: what it holds all iteration, what it keeps per in-flight
    microbatch, its transient T_s (a variable), its optimizer step's scratch per run (bytes of
    one layer's step scratch, presence, count) and its host bytes."""

    held: list
    kept: list
    transient: pulp.LpVariable
    step_scratch: list
    host: list


def _stage_memory_mib(problem: Problem, s: int, n, opens, closes):
    """peak_s = held + max(k_s·kept + T_s, step scratch), in MiB (costmodel.TERMS: static and
    buffers held, kept, extra, scratch): returns held + k_s·kept + T_s (the training peak)
    and adds the optimizer step's row, held + scratch ≤ cap, and the host row itself."""
    memory = _stage_memory_parts(problem, s, n, opens, closes)
    k = costmodel.in_flight(problem.setup.pipeline, s)
    _step_and_host_rows(problem, f"{s}", [memory], _cap_mib(problem, s))
    # held + k·kept written out term by term: one row fewer between a byte and its cap
    return pulp.lpSum(memory.held + [k * term for term in memory.kept] + [memory.transient])


def _step_and_host_rows(problem: Problem, name: str, memories: list[_Memory], cap_mib, extra_held=()) -> None:
    """The optimizer step's row, held + scratch ≤ cap (costmodel.step_scratch_bytes: cuda every
    layer's, cpu twice the largest layer's), and the host row, for stages `memories` on one rank
    (`extra_held`: the rank's own terms on top of its stages')."""
    lp = problem.lp
    held = [term for memory in memories for term in memory.held] + list(extra_held)
    scratch = [item for memory in memories for item in memory.step_scratch]
    if scratch:
        if problem.profile.device.type == "cuda":
            step = pulp.lpSum(num_bytes / MIB * count for num_bytes, _, count in scratch)
        else:
            step = pulp.LpVariable(f"S_{name}", lowBound=0)
            for g, (num_bytes, present, _) in enumerate(scratch):
                lp += step >= 2 * num_bytes / MIB * present, f"step_scratch_{name}_{g}"
        lp += pulp.lpSum(held) + step <= cap_mib, f"step_cap_{name}"
    host_cap = costmodel.host_cap_bytes(problem.outer or problem.setup)
    if host_cap is not None:
        # [Constraint] host: the rank's host bytes within its share of the node's
        lp += (pulp.lpSum(term for memory in memories for term in memory.host)
               <= (host_cap - costmodel.FIT_MARGIN_BYTES) / MIB), f"host_cap_{name}"


def _stage_memory_parts(problem: Problem, s: int, n, opens, closes) -> _Memory:
    """Stage s's memory terms, with the transient's constraints (costmodel.transient_extra_bytes)."""
    lp = problem.lp
    held = [_const(problem, _held(), s) / MIB]  # live at the optimizer step too
    total = [_const(problem, ("kept",), s) / MIB]
    # T_s = max(a layer's extra (transient, + recompute) net of what the layers after it keep,
    # the stage's own extra, the loss's scratch): costmodel.transient_extra_bytes
    scratch = pulp.LpVariable(f"T_{s}", lowBound=_const(problem, ("extra",), s) / MIB)
    # K[s,g] (MiB): what stage s's layers of runs g, g+1, ... keep per microbatch, as a
    # recurrence so each transient constraint names one variable instead of every later run
    later = {len(problem.runs): _const(problem, ("kept",), s) / MIB}  # the loss's, freed first
    for g in reversed(range(len(problem.runs))):
        later[g] = pulp.LpVariable(f"K_{s}_{g}")
        lp += later[g] == later[g + 1] + _run_kept_bytes(problem, s, g, n) / MIB, f"later_{s}_{g}"
    step_scratch = []  # per run: (bytes of one layer's step scratch, presence, count)
    for g, run in enumerate(problem.runs):
        layer = run.layer
        extra, step_bytes = _layer(problem, ("extra",), layer), _layer(problem, ("scratch",), layer)
        held.append(_layer(problem, _held(), layer) * n(s, g) / MIB)
        total.append(_run_kept_bytes(problem, s, g, n) / MIB)
        present = None
        if extra > 0 or step_bytes > 0:
            present = _presence(problem, f"p_{s}_{g}", n(s, g), run.size)
        if extra > 0:
            # [Constraint] T_s ≥ the extra of the run's last layer in the stage minus what
            # the runs after it keep (its earlier layers have more after them)
            lp += scratch >= extra / MIB * present - later[g + 1], f"transient_{s}_{g}"
        order = problem.order[g]
        for place, o in enumerate(order):
            used = _presence(problem, f"q_{s}_{g}_{o}", problem.r[s, g, o], run.size)
            # [Constraint] T_s ≥ the extra of the run's last layer under option o (the run's
            # layers take the options in problem.order, none last) minus what the layers after it keep
            after = (pulp.lpSum(problem.r[s, g, p] * _layer(problem, ("kept",), layer, p) for p in order[place + 1:])
                     + (n(s, g) - pulp.lpSum(problem.r[s, g, p] for p in order)) * _layer(problem, ("kept",), layer)
                     ) / MIB + later[g + 1]
            lp += scratch >= _layer(problem, ("extra",), layer, o) / MIB * used - after, f"recompute_{s}_{g}_{o}"
        total += [_edge(problem, ("kept",), "open", layer, s) / MIB * opens(s, g),
                  _edge(problem, ("kept",), "close", layer, s) / MIB * closes(s, g)]
        held += [_edge(problem, _held(), "open", layer, s) / MIB * opens(s, g),
                 _edge(problem, _held(), "close", layer, s) / MIB * closes(s, g)]
        if present is not None and step_bytes > 0:
            step_scratch.append((step_bytes, present, n(s, g)))
    held += _zero_one_excess_mib(problem, s, n)
    k = costmodel.in_flight(problem.setup.pipeline, s)
    host = [_layer(problem, ("host",), run.layer) * n(s, g) / MIB for g, run in enumerate(problem.runs)]
    # activations offloaded: k_s in-flight microbatches of each offloading layer's host bytes
    host += [k * _layer(problem, ("offloaded",), run.layer, o) / MIB * problem.r[s, g, o]
             for g, run in enumerate(problem.runs) for o in problem.order[g]
             if _layer(problem, ("offloaded",), run.layer, o)]
    return _Memory(held, total, scratch, step_scratch, host)


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
    """Bytes per microbatch stage s's layers of run g keep (those under an option less)."""
    return _run_bytes(problem, "kept", s, g, n)


def _run_bytes(problem: Problem, quantity: str, s: int, g: int, n):
    """`quantity` of stage s's layers of run g, each under its option (a linear expression)."""
    layer = problem.runs[g].layer
    plain = _layer(problem, (quantity,), layer)
    total = plain * n(s, g)
    for o in problem.order[g]:
        total -= (plain - _layer(problem, (quantity,), layer, o)) * problem.r[s, g, o]
    return total


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
    cap = costmodel.limit_bytes(s, problem.ctx) / MIB
    if problem.scale is not None:
        cap = cap * problem.scale
    return cap - costmodel.FIT_MARGIN_BYTES / MIB
