"""Transformer Engine's offload window as a choice of the solvers: the fastest N.

Where the runtime's offload is TE's window handler (te_offload.window_runs: the record's te_window_offload, one
pipeline stage of one chunk), megatron-core offloads the decoder block's first N layers, 0 < N < the block's
layers, and nothing recomputes beside it (TransformerConfig refuses --cpu-offloading with recompute:
docs/framework-facts.md §321). So a plan with the window is fixed by N: every layer at none but the block's first
N, offloaded. For a fixed N its cost is additive per layer (te_offload.window_per_layer, the function evaluate
charges the stage by): the offloaded layers keep 0, each block layer's extra gains the groups held beside it, each
exposed copy adds to its layer's time from the layers' plain compute. Each N's stage is then summed with the DP's
own accumulator and peak (dpsegments._best_set on the one range [0, L)), so its time and peak are evaluate's, and
the fastest N that fits is exact over N. The per-layer solvers (DP, MILP) never offer the option there
(useful.useful_options); search.plan takes the window where it is faster than their plan and evaluate admits
it (admitted_window: where the allocator replay judges, the fastest N whose replay fits, each N summed under the
rows that hold every plan the replay admits).

Not offered under Megatron-FSDP's moments (their extras are placed after the window's in evaluate, stage_moments,
which this sum does not repeat)."""

from __future__ import annotations

import dataclasses
import math

from planner.cost import costmodel, pipereduce, reserve, te_offload
from planner.cost.costmodel import PlanCost
from planner.cost.rules import compute_ms
from planner.schema import OPTION_OFFLOAD, Profile, StagePlan, TrainSetup
from planner.solve.deadline import Deadline, Expired
from planner.solve.dpsegments import INF, Chain, Segment, _best_set
from planner.solve.dpsolve import to_stages
from planner.solve.highs import SolveResult
from planner.solve.results import NoFit, PlanResult, SolverMismatch


def blocks(chain: Chain) -> list[list[int]]:
    """The layers TE's handler windows: those that offer the offload option, where they are one kind's every
    layer, at least two (te_offload.window_layers takes one kind's first N, and megatron-core the decoder
    layers' first N: the two agree where the decoder layers are one kind). None where the layers that offer it
    are of several kinds (a dense block before MoE blocks: Megatron's window runs over both, evaluate's over one)."""
    offering = [m for m, layer in enumerate(chain.layers) if any(o.name == OPTION_OFFLOAD for o in layer.options)]
    kinds = {chain.layers[m].kind for m in offering}
    if len(kinds) != 1:
        return []
    block = [m for m, layer in enumerate(chain.layers) if layer.kind in kinds]
    return [block] if block == offering and len(block) >= 2 else []


def applies(chain: Chain) -> bool:
    """Whether the solvers choose the window for this chain: the runtime's handler at one stage of one chunk,
    no Megatron-FSDP moments."""
    return te_offload.window_runs(chain.setup) and len(chain.stages) == 1 and not chain.moments


def window_segment(chain: Chain, block: list[int], count: int, ms_per_byte: float | None) -> Segment | None:
    """The one stage holding every layer, the block's first `count` offloaded as TE's window and the rest at
    none, as the DP scores a range (None where it passes the cap or the host cap)."""
    num = len(chain)
    plain = [{"kept": chain.kept_plain[m], "extra": chain.raw_extra[m], "time": chain.plain_ms[m], "offloaded": 0.0}
             for m in range(num)]
    offloaded = set(block[:count])
    none = [dict(plain[m]) if m in offloaded else None for m in range(num)]
    layers = chain.layers
    values = te_offload.window_per_layer(plain, none, [layer.kind for layer in layers],
                                         [compute_ms(layer.fwd_ms, chain.setup.time) for layer in layers],
                                         [compute_ms(layer.bwd_ms, chain.setup.time) for layer in layers],
                                         ms_per_byte=ms_per_byte, handler=te_offload.handler_of(chain.setup))
    if values is None:
        return None
    run = costmodel.StageRun(chain.setup, chain.profile.device.type)
    ms = kept = extra = late_grad = 0.0
    mask = 0
    for m, value in enumerate(values):
        run.add(time_ms=chain.plain_ms[m], held_bytes=chain.static[m], step_ms=chain.step_ms[m],
                host_bytes=chain.host[m], params=chain.params[m], largest_params=chain.largest[m],
                scratch_bytes=chain.step_scratch[m], numels=chain.numels[m])
        late_grad += chain.late_grad[m]
        ms += value["time"] - chain.plain_ms[m]  # the exposed copies
        kept += value["kept"]
        extra = max(extra - value["kept"], value["extra"])  # dpsegments._grow's recurrence
        if m in offloaded:
            mask |= layers[m].option_index(OPTION_OFFLOAD) << (m * chain.bits)
    stage = chain.stages[0]
    host_cap = INF if chain.host_cap is None else chain.host_cap - costmodel.FIT_MARGIN_BYTES
    if run.host_bytes + stage.in_flight * sum(value["offloaded"] for value in values) > host_cap:
        return None
    opening, closing = chain.opening_bytes(0, 0), chain.closing_bytes(0, num)
    edge_kept, edge_held = opening[0] + closing[0], opening[1] + closing[1]
    sums = (run.time_ms + chain.edge_comm_ms(0, 0, num), run.held_bytes, run.step_ms, run.step_scratch_bytes)
    edge = (edge_kept, edge_held, chain.end_bytes(0, 0, num), late_grad, 0)  # one stage: no GPipe sends (gpipeheld)
    return _best_set(stage, 0, 0, num, [(ms, kept, extra, mask)], sums, edge, "time",
                     pipeline=chain.setup.pipeline)


def iteration_ms(chain: Chain, segment: Segment) -> float:
    """The plan's iteration time from its one segment, as dpsolve.fastest_cuts reads a label."""
    setup = chain.setup
    return costmodel.pipeline_ms(segment.time_ms, segment.time_ms, segment.step_ms, sum(chain.step_ms), setup,
                                 pipereduce.drain_ms(chain.layers, setup))


def _windows(chain: Chain):
    """(block, N, its segment) for every window that fits."""
    ms_per_byte = reserve.host_copy_ms_per_byte(chain.profile, chain.setup)
    for block in blocks(chain):
        for count in range(1, len(block)):
            segment = window_segment(chain, block, count, ms_per_byte)
            if segment is not None:
                yield block, count, segment


def window_times(profile: Profile, setup: TrainSetup) -> dict[tuple[int, int], float]:
    """Every window that fits, (its block's first layer, N) -> its iteration time; {} where the solvers do not
    choose the window (applies)."""
    chain = Chain(profile, setup)
    if not applies(chain):
        return {}
    return {(block[0], count): iteration_ms(chain, segment) for block, count, segment in _windows(chain)}


def admitted_window(profile: Profile, setup: TrainSetup, *, rows: TrainSetup, faster_than_ms: float,
                    deadline: Deadline) -> tuple[list[StagePlan], float, PlanCost] | None:
    """The fastest window plan faster than `faster_than_ms` that evaluate admits under `setup` (cost.feasible: its
    allocated peak within the rows, or the allocator replay's verdict where the replay judges), summed under `rows`
    (the setup at the caps whose rows hold every plan the replay admits, replayfit.relaxed_caps, where it judges),
    with its iteration time and evaluate's cost; None where none is. Raises deadline.Expired."""
    chain = Chain(profile, rows)
    if not applies(chain):
        return None
    for ms, segment in sorted(((iteration_ms(chain, segment), segment) for _, _, segment in _windows(chain)),
                              key=lambda item: item[0]):
        if ms >= faster_than_ms:
            return None
        deadline.check()
        stages = to_stages(chain, [segment])
        cost = costmodel.evaluate(stages, profile, setup)
        if cost.feasible:  # evaluate's verdict: the rows, or the replay where it judges
            return stages, ms, cost
    return None


def fastest_window(profile: Profile, setup: TrainSetup) -> tuple[list[StagePlan], float] | None:
    """The fastest plan with TE's window that fits, and its iteration time; None where none fits or the solvers
    do not choose the window."""
    chain = Chain(profile, setup)
    if not applies(chain):
        return None
    timed = [(iteration_ms(chain, segment), segment) for _, _, segment in _windows(chain)]
    if not timed:
        return None
    best_ms, segment = min(timed, key=lambda item: item[0])
    return to_stages(chain, [segment]), best_ms


def with_window(profile: Profile, setup: TrainSetup, found: PlanResult | NoFit, deadline: Deadline,
                 upper_bound_ms: float | None, relaxed: list[int] | None) -> PlanResult | NoFit:
    """The solvers' plan, or Transformer Engine's offload window where the runtime's offload is that handler and
    the fastest N that evaluate admits (dpwindow.admitted_window: at the relaxed rows where the replay judges) is
    faster than it (where it fits: a plan over the caps, or none, stands for no time) and than `upper_bound_ms`;
    its objective held to evaluate's (SolverMismatch)."""
    if not te_offload.window_runs(setup) or (isinstance(found, NoFit) and found.status != "infeasible"):
        return found
    solved = isinstance(found, PlanResult) and found.cost.feasible
    bar = min(found.cost.iteration_ms if solved else math.inf, upper_bound_ms or math.inf)
    rows = setup if relaxed is None else setup.model_copy(
        update={"pipeline": setup.pipeline.model_copy(update={"mem_caps_bytes": relaxed})})
    try:
        window = admitted_window(profile, setup, rows=rows, faster_than_ms=bar, deadline=deadline)
    except Expired:  # the window not weighed: the solvers' plan (or none) is not the setup's answer, and says so
        if isinstance(found, NoFit):
            return NoFit("timeout", deadline.elapsed_s(), found.solver)
        # the DP's bound holds for per-layer plans only: none is proven over the window's
        stopped = dataclasses.replace(found.solve, status="feasible", bound=None, gap=None, timed_out=True)
        return PlanResult(found.stages, found.cost, stopped)
    if window is None:
        return found
    stages, objective_ms, cost = window
    if abs(cost.iteration_ms - objective_ms) > 1e-6 * max(1.0, objective_ms):
        raise SolverMismatch(f"the offload window re-evaluates to {cost.iteration_ms!r} ms but its objective is "
                             f"{objective_ms!r}")
    if solved:  # the faster of two: a bound on both is the lesser of theirs
        status, solver, bound, replay = found.solve.status, found.solve.solver, found.solve.bound, found.solve.replay
        bound = None if bound is None else min(bound, objective_ms)
    elif isinstance(found, NoFit):  # no per-layer plan fits, and the window's N is exact
        status, solver, bound = "optimal", found.solver, objective_ms
        replay = None if relaxed is None else "relaxed"
    else:  # a per-layer plan that does not fit proves nothing of the others: the window is a plan, no bound
        status, solver, bound, replay = "feasible", found.solve.solver, None, found.solve.replay
    gap = None if bound is None else max(0.0, 1 - bound / objective_ms)
    solve = SolveResult(status, objective_ms, gap, deadline.elapsed_s(), solver=solver, bound=bound, replay=replay)
    return PlanResult(stages=costmodel.with_predictions(stages, cost), cost=cost, solve=solve)
