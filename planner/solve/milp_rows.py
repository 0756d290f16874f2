"""The MILP's problem and the rows every stage shares (planner/solve/milp.py builds the program):
a stage's memory terms, its transient's constraints, the optimizer step's and the host's rows,
each coefficient read from the cost model's declarations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pulp

from planner.cost import boundgrad, costmodel, gradtiming, megatron_fsdp_moments
from planner.cost.costmodel import LayerCost
from planner.schema import Profile, TrainSetup
from planner.solve import milp_moments, milp_zeroone
from planner.solve.deadline import Deadline
from planner.solve.highs import SolveResult, _HiGHS, extract_plan, solve, start_values  # noqa: F401
from planner.solve.milp_parts import _layer, _presence  # noqa: F401  (milp_ranks, milp take them from here)

# Bytes enter the solver in MiB: coefficients stay well conditioned (1e-2 .. 1e5 for
# models up to ~100 GiB per device) and HiGHS's row tolerance (highs.MIP_FEASIBILITY_TOLERANCE,
# 1e-7 per row) is a tenth of a byte. Its integrality tolerance is not: a count 4e-9 off a whole
# number on a 227 MiB layer is a byte, taken back by milp.solve_within_caps.
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
    # a schedule of several stages per rank: the setup as given (problem.setup counts its P·V stages),
    # and the schedule's order (planner/cost/schedules.py)
    outer: TrainSetup | None = None
    schedule: object = None
    deadline: Deadline | None = None  # building a chunked schedule's rows looks at it per rank
    _moments: dict | None = None  # megatron_fsdp_moments.held_layers, read once (moments())
    # (stage, slot) -> [the slot's layers present] (milp_ranks._slot_presence)
    slots_present: dict = field(default_factory=dict)
    # (stage, run) -> its positions' option binaries where the MILP chooses the run's order there, else None
    # (milp_order.positions)
    positions: dict = field(default_factory=dict)
    # checks that add rows once a solution is seen (highs.solve), and the ZeRO 1 cuts added (milp_zeroone.py)
    lazy: list = field(default_factory=list)
    lazy_rows: list = field(default_factory=list)

    @property
    def ctx(self) -> costmodel.Context:
        return costmodel.Context(self.profile, self.setup)

    def moments(self) -> dict:
        """Megatron-FSDP's layers as its moments read them ({} where they do not apply)."""
        if self._moments is None:
            self._moments = megatron_fsdp_moments.held_layers(self.ctx)
        return self._moments


def _held() -> tuple[str, ...]:
    return costmodel.quantities("held")  # bytes held all iteration (the declarations, read when built)


def _busy() -> tuple[str, ...]:
    return costmodel.quantities("busy")  # ms per microbatch on the critical path


def _extra(problem: Problem, layer: LayerCost, option: int = 0) -> float:
    """A layer's extra peak under `option` as evaluate places it on any stage but at the last stage's tail
    (_tail_rows): with a unit's Megatron-FSDP moments (megatron_fsdp_moments.unit_extra)."""
    extra, held = _layer(problem, ("extra",), layer, option), problem.moments()
    if not held:
        return extra
    kept = _layer(problem, ("kept",), layer, option)
    return megatron_fsdp_moments.unit_extra(layer, option, extra, kept, held, problem.ctx)


def _closing_extra(problem: Problem, layer: LayerCost, option: int, s: int) -> float:
    """_extra where the layer closes stage s: less its incoming gradient before the last stage, that stage's receive
    buffer (boundgrad.closing_grad_bytes), before the moments as evaluate takes it off."""
    extra, held = _layer(problem, ("extra",), layer, option), problem.moments()
    extra -= boundgrad.closing_grad_bytes(layer, option, stage=s, profile=problem.profile, setup=problem.setup)
    if not held:
        return extra
    kept = _layer(problem, ("kept",), layer, option)
    return megatron_fsdp_moments.unit_extra(layer, option, extra, kept, held, problem.ctx)


def _closing_rows(problem: Problem, s: int, g: int, n, closes, scratch, later: dict, used: dict) -> dict:
    """Where stage s (before the last) may close in run g and its last layer's extra then comes down
    (_closing_extra): per option o (0: none), what comes off the row of the run's last layer under o, d_o·z_o with
    z_o ≤ closes(s,g), z_o ≤ [o's layers present] and z_o ≤ 1 - [p's present] for every option p after o in the
    run's order (none last): o is then the stage's last layer's option (`used`: the options' presence binaries, 1
    where their count is positive; the solver wants each z high, so presence forced only upwards is exact); "none":
    none's presence, for its row. And [Constraint] the run's second-to-last layer in the stage, whose extra then may be
    the larger: T_s ≥ (e_o - kept_o)·v_o - K[s,g+1], v_o ≥ w_o + [o's layers ≥ 2] - 1 (_last_option's w_o: o the
    last option), only where o keeps less than comes off (else the last layer's own row is the larger). {} where
    nothing comes off: the rows as before."""
    if s >= problem.setup.pipeline.stages - 1 or not boundgrad.applies(problem.setup):
        return {}
    run = problem.runs[g]
    sequence = [*problem.order[g], 0]
    down = {o: _extra(problem, run.layer, o) - _closing_extra(problem, run.layer, o, s) for o in sequence}
    if not any(value > 0 for value in down.values()):
        return {}
    lp = problem.lp
    plain = n(s, g) - pulp.lpSum(problem.r[s, g, p] for p in problem.order[g])
    present = {**used, 0: _presence(problem, f"qc_{s}_{g}", plain, run.size)}
    ends, last = closes(s, g), None
    cuts = {"none": present[0]}
    for place, o in enumerate(sequence):
        if down[o] <= 0:
            continue
        z = pulp.LpVariable(f"zc_{s}_{g}_{o}", lowBound=0, upBound=1)
        lp += z <= ends, f"closing_ends_{s}_{g}_{o}"
        lp += z <= present[o], f"closing_used_{s}_{g}_{o}"
        for p in sequence[place + 1:]:
            lp += z <= 1 - present[p], f"closing_after_{s}_{g}_{o}_{p}"
        cuts[o] = down[o] / MIB * z
        kept = _layer(problem, ("kept",), run.layer, o)
        before = _extra(problem, run.layer, o) - kept
        if run.size == 1 or before <= 0 or kept >= down[o]:
            continue
        last = last or _last_option(problem, s, g, n)
        count = problem.r[s, g, o] if o else plain
        several = pulp.LpVariable(f"tc_{s}_{g}_{o}", cat="Binary")
        lp += count <= 1 + (run.size - 1) * several, f"closing_several_{s}_{g}_{o}"
        v = pulp.LpVariable(f"vc_{s}_{g}_{o}", lowBound=0)
        lp += v >= last[o] + several - 1, f"closing_pair_{s}_{g}_{o}"
        lp += scratch >= before / MIB * v - later[g + 1], f"closing_before_{s}_{g}_{o}"
    return cuts


def _edge(problem: Problem, quantities, where: str, layer: LayerCost, s: int) -> float:
    return sum(costmodel.edge_value(q, where, layer, s, problem.ctx) for q in quantities)


def _const(problem: Problem, quantities, s: int) -> float:
    return sum(costmodel.stage_value(q, s, problem.ctx) for q in quantities)


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
    given = problem.outer or problem.setup  # the ranks as given
    host_cap = costmodel.host_cap_bytes(given.data_parallel, pipeline=given.pipeline)
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
    fsdp = milp_moments.applies(problem)  # FSDP2's moments beside a pipeline: relaxed rows, cuts (milp_moments)
    scratch = pulp.LpVariable(f"T_{s}", lowBound=None if milp_moments.floor_applies(problem, s)
                              else _const(problem, ("extra",), s) / MIB)
    # K[s,g] (MiB): what stage s's layers of runs g, g+1, ... keep per microbatch, as a
    # recurrence so each transient constraint names one variable instead of every later run
    later = {len(problem.runs): _const(problem, ("kept",), s) / MIB}  # the loss's, freed first
    for g in reversed(range(len(problem.runs))):
        later[g] = pulp.LpVariable(f"K_{s}_{g}")
        lp += later[g] == later[g + 1] + _run_kept_bytes(problem, s, g, n) / MIB, f"later_{s}_{g}"
    step_scratch = []  # per run: (bytes of one layer's step scratch, presence, count)
    for g, run in enumerate(problem.runs):
        layer = run.layer
        extra, step_bytes = _extra(problem, layer), _layer(problem, ("scratch",), layer)
        held.append(_layer(problem, _held(), layer) * n(s, g) / MIB)
        total.append(_run_kept_bytes(problem, s, g, n) / MIB)
        present = None
        if extra > 0 or step_bytes > 0:
            present = _presence(problem, f"p_{s}_{g}", n(s, g), run.size)
        order = problem.order[g]
        used = {} if fsdp else {o: _presence(problem, f"q_{s}_{g}_{o}", problem.r[s, g, o], run.size) for o in order}
        cuts = {} if fsdp else _closing_rows(problem, s, g, n, closes, scratch, later, used)
        if extra > 0 and not fsdp:
            # [Constraint] T_s ≥ the extra of the run's last layer in the stage minus what
            # the runs after it keep (its earlier layers have more after them); where it may close the stage
            # (_closing_rows), its none layers' last, less what comes off it
            on = cuts["none"] if cuts else present
            lp += scratch >= extra / MIB * on - cuts.get(0, 0) - later[g + 1], f"transient_{s}_{g}"
        for place, o in enumerate(order if not fsdp else ()):
            # [Constraint] T_s ≥ the extra of the run's last layer under option o (the run's
            # layers take the options in problem.order, none last) minus what the layers after it keep
            after = (pulp.lpSum(problem.r[s, g, p] * _layer(problem, ("kept",), layer, p) for p in order[place + 1:])
                     + (n(s, g) - pulp.lpSum(problem.r[s, g, p] for p in order)) * _layer(problem, ("kept",), layer)
                     ) / MIB + later[g + 1]
            lp += scratch >= _extra(problem, layer, o) / MIB * used[o] - cuts.get(o, 0) - after, f"recompute_{s}_{g}_{o}"
        total += [_edge(problem, ("kept",), "open", layer, s) / MIB * opens(s, g),
                  _edge(problem, ("kept",), "close", layer, s) / MIB * closes(s, g)]
        held += [_edge(problem, _held(), "open", layer, s) / MIB * opens(s, g),
                 _edge(problem, _held(), "close", layer, s) / MIB * closes(s, g)]
        if present is not None and step_bytes > 0:
            step_scratch.append((step_bytes, present, n(s, g)))
    if fsdp:
        milp_moments.rows(problem, s, n, scratch, later, pulp.lpSum(total))
    if s == problem.setup.pipeline.stages - 1:
        _tail_rows(problem, s, n, scratch, later)
    held += milp_zeroone.excess_mib(problem, s, n)
    k = costmodel.in_flight(problem.setup.pipeline, s)
    host = [_layer(problem, ("host",), run.layer) * n(s, g) / MIB for g, run in enumerate(problem.runs)]
    # activations offloaded: k_s in-flight microbatches of each offloading layer's host bytes
    host += [k * _layer(problem, ("offloaded",), run.layer, o) / MIB * problem.r[s, g, o]
             for g, run in enumerate(problem.runs) for o in problem.order[g]
             if _layer(problem, ("offloaded",), run.layer, o)]
    return _Memory(held, total, scratch, step_scratch, host)


def _tail_rows(problem: Problem, s: int, n, transient, later: dict) -> None:
    """[Constraint] the pipeline's last stage's own Megatron-FSDP moments (megatron_fsdp_moments.stage_moments),
    where output layers follow the model's last unit: T_s ≥ the last unit's extra with the output layers'
    bucket queued beside it, and T_s ≥ each arm of the output layer's (the stage's last layer), each less what
    the runs after it keep (`later`, MiB). The last layer of a run in the stage is the model's last of it, under
    the last option of problem.order the stage uses (_last_option). The output layers' parameters on the stage
    are linear in its counts, and each arm of megatron_fsdp_moments.output_arms affine in them."""
    held, runs, ctx = problem.moments(), problem.runs, problem.ctx
    names = [layer.name for layer in problem.profile.layers]
    after = megatron_fsdp_moments.after_last_unit(held, names) if held else []
    if not after:
        return
    unit = next(g for g, run in enumerate(runs) if run.start <= names.index(megatron_fsdp_moments.last_unit(held))
                < run.start + run.size)
    queued = megatron_fsdp_moments.queued_bytes(megatron_fsdp_moments.output_params(held, after), ctx)
    last = _last_option(problem, s, unit, n)
    layer = runs[unit].layer
    row = [megatron_fsdp_moments.unit_extra(layer, o, _layer(problem, ("extra",), layer, o),
                                            _layer(problem, ("kept",), layer, o), held, ctx, queued=queued) / MIB * w
           for o, w in last.items()]
    problem.lp += transient >= pulp.lpSum(row) - later[unit + 1], f"tail_unit_{s}"
    out = len(runs) - 1
    out_params = pulp.lpSum(held[run.layer.name].count * n(s, g) for g, run in enumerate(runs) if g > unit)
    last, layer = _last_option(problem, s, out, n), runs[out].layer
    for arm in range(2):
        def at(o, count, layer=layer, arm=arm):
            return megatron_fsdp_moments.output_arms(layer, _layer(problem, ("extra",), layer, o),
                                                     _layer(problem, ("kept",), layer, o), count, ctx)[arm]
        slope = at(0, 1) - at(0, 0)  # per parameter, whatever the option
        row = [at(o, 0) / MIB * w for o, w in last.items()] + [slope / MIB * out_params]
        problem.lp += transient >= pulp.lpSum(row) - later[out + 1], f"tail_output_{s}_{arm}"


def _last_option(problem: Problem, s: int, g: int, n) -> dict:
    """w_o (o: problem.order[g], then none, 0): 1 where stage s's last layer of run g is under option o, 0
    elsewhere and where the stage holds none of the run. A run of one layer: its counts. Else binaries, one
    on where the run is present, each on only where its option is used and no option after it in the order."""
    run, order = problem.runs[g], problem.order[g]
    counts = {o: problem.r[s, g, o] for o in order}
    counts[0] = n(s, g) - pulp.lpSum(counts[o] for o in order)
    if run.size == 1:
        return counts
    lp = problem.lp
    w = {o: pulp.LpVariable(f"w_{s}_{g}_{o}", cat="Binary") for o in counts}
    lp += pulp.lpSum(w.values()) == _presence(problem, f"wp_{s}_{g}", n(s, g), run.size), f"last_option_{s}_{g}"
    sequence = [*order, 0]
    for place, o in enumerate(sequence):
        lp += w[o] <= counts[o], f"last_used_{s}_{g}_{o}"
        for p in sequence[place + 1:]:
            lp += counts[p] <= run.size * (1 - w[o]), f"last_after_{s}_{g}_{o}_{p}"
    return w


def _step_end_row(problem: Problem, name: str, stages, held: list, n, opens, closes, cap_mib) -> None:
    """[Constraint] the step's end, its own moment of a rank's peak (score.rank_cost): what the
    rank holds all iteration (`held`, MiB), less the whole gradients its runtime allocates at a
    stage's first backward (gone by then: gradtiming.lazy_grad_bytes, per layer), plus what the
    schedule keeps then, from each of its stages' first and last layers
    (costmodel.opening_end_bytes, closing_end_bytes), ≤ cap. None of it depends on what a stage
    recomputes. No row where the schedule keeps nothing then (held ≤ cap is in the others)."""
    order, training = problem.schedule, (problem.outer or problem.setup).training
    end = []
    for k in stages:
        for g, run in enumerate(problem.runs):
            opening = costmodel.opening_end_bytes(run.layer, stage=k, order=order, training=training)
            closing = costmodel.closing_end_bytes(run.layer, stage=k, order=order, training=training)
            end += [opening / MIB * opens(k, g)] if opening else []
            end += [closing / MIB * closes(k, g)] if closing else []
    if end:
        late = _late_grad_mib(problem, stages, n)
        problem.lp += pulp.lpSum(held) - pulp.lpSum(late) + pulp.lpSum(end) <= cap_mib, f"step_end_{name}"


def _late_grad_mib(problem: Problem, stages, n) -> list:
    """The whole gradients the runtime allocates at each of `stages`' first backward rather than
    holding all iteration (gradtiming.lazy_grad_bytes, per layer; static charges them), in MiB:
    [] where there are none."""
    late = []
    for g, run in enumerate(problem.runs):
        grads = gradtiming.lazy_grad_bytes([run.layer], problem.setup)
        late += [grads / MIB * n(k, g) for k in stages] if grads else []
    return late


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


def _cap_mib(problem: Problem, s: int):
    """cap_s - margin; for the memory objective scale·cap_s - margin (a cap of a few KiB can
    grow too)."""
    cap = costmodel.limit_bytes(s, problem.ctx) / MIB
    if problem.scale is not None:
        cap = cap * problem.scale
    return cap - costmodel.FIT_MARGIN_BYTES / MIB
