"""A lower bound on an interleaved 1F1B configuration's iteration that holds its bubble: the least makespan of
the schedule's own order over every split of the layers, relaxed to a linear program (HiGHS).

Why: bounds.setup_bounds's chunked bound is the ranks' mean work plus a fill and drain over the cheapest
layers; a split with tiny first stages makes that fill nothing, so it prunes almost no interleaved
configuration (docs/published-runs.md §37.searchspace). But tiny first stages move the bubble, they do not
remove it: a rank's later chunk waits for the forward through every stage before it.

evaluate() (score.plan_iteration_ms) charges a chunked schedule its order's simulation
(schedule_time.simulate_time, or simulate_lockstep), then the slowest rank's step. In that simulation each
rank runs its actions one at a time in its order, and an action starts no sooner than its input's producer
ended: F of stage k after F of stage k-1, B of stage k after B of stage k+1 (the last stage: its own F), same
microbatch. Sends, side streams, reductions and lockstep's waits only add to that. So the makespan is at
least the longest path through those precedences with each action lasting its stage's F or B, and
    T >= min over splits of (that longest path) + max_r step_r.
The split is relaxed: x[g, s] >= 0 layers of kind g on stage s (bounds.kinds), sum_s x[g, s] the kind's
count, every stage holding at least one layer (sum_g x[g, s] >= 1), contiguity and integrality dropped;
stage s's F is at least sum_g x[g, s] f_g, its B at least sum_g x[g, s] b_g, with f_g the layer's forward
(assembly.stage_sums: forward_ms) and b_g its least time under any option less that forward (the stage's B
is its busy less its F, splittime.stage_times; the stage's own sends and constant terms only add). With one
start-time variable an action, min T over (x, t) subject to
    t_next >= t_a + dur_a (the rank's order), t_a >= t_p + dur_p (its producer p), T >= t_last + dur_last
is that least longest path (an LP: each dur linear in x). The step: max_r step_r >= sum_l min step_l / P.
tests/test_chunkbound.py holds the bound under evaluate() on random plans.
"""

from __future__ import annotations

import functools

import highspy
import numpy as np

from planner.cost import chunked, costmodel, schedules
from planner.cost.rules import compute_ms
from planner.schema import Profile, TrainSetup
from planner.solve.highs import without_banner

SCHEDULES = ("interleaved-1F1B",)  # a full backward's order without pairs: B's chain is the drain's


def holds(setup: TrainSetup) -> bool:
    """Whether the bound applies: an interleaved 1F1B configuration of several chunks a rank."""
    return setup.pipeline.schedule in SCHEDULES and setup.pipeline.chunks > 1


def iteration_bound_ms(profile: Profile, setup: TrainSetup, layers: list[tuple[costmodel.LayerCost, int]]) -> float:
    """The module's bound on every plan's iteration (ms): the least makespan of the order over the relaxed
    splits, plus the ranks' mean least step. 0 where it does not apply or the LP fails."""
    if not holds(setup):
        return 0.0
    order = chunked.schedule_of(setup)
    ctx = costmodel.Context(profile, chunked.stages_view(setup, order))
    forward, backward, counts, step = [], [], [], 0.0
    for layer, count in layers:
        f = compute_ms(layer.fwd_ms, setup.time)
        least = min(costmodel.layer_value("time", layer, o, ctx) for o in range(len(layer.options)))
        forward.append(f)
        backward.append(least - f)
        counts.append(count)
        step += count * min(costmodel.layer_value("step", layer, o, ctx) for o in range(len(layer.options)))
    # a stage's own time terms (the last stage's loss) are in its B; its comm, half each pass less its sends
    # beside the compute, is left out (only adds)
    fixed = [costmodel.stage_value("time", s, ctx) for s in range(order.num_stages)]
    makespan = _least_makespan_cached(setup.pipeline.schedule, setup.pipeline.stages, setup.pipeline.chunks,
                                      setup.pipeline.microbatches, tuple(forward), tuple(backward), tuple(counts),
                                      tuple(fixed))
    return 0.0 if makespan is None else makespan + step / setup.pipeline.stages


@functools.lru_cache(maxsize=1024)
def _least_makespan_cached(schedule: str, ranks: int, chunks: int, microbatches: int, forward: tuple, backward: tuple,
                           counts: tuple, fixed: tuple) -> float | None:
    """least_makespan_ms once per order and numbers: a search's configurations that differ in what the LP does not
    read (data parallelism, ZeRO's stage: the step and the collectives) share it."""
    order = schedules.pipeline_schedule(schedule, num_ranks=ranks, num_microbatches=microbatches, num_chunks=chunks)
    return least_makespan_ms(order, list(forward), list(backward), list(counts), list(fixed))


def least_makespan_ms(order, forward: list[float], backward: list[float], counts: list[int],
                      fixed: list[float] | None = None) -> float | None:
    """The LP of the module's text over `order`'s actions (F and B only), the kinds' forward and backward
    per layer and how many of each, and `fixed`, per stage, what its B takes besides its layers; None where
    HiGHS does not find its optimum."""
    fixed = fixed or [0.0] * order.num_stages
    kinds, stages = len(counts), order.num_stages
    actions = [(rank, a) for rank, acts in enumerate(order.actions) for a in acts]
    if any(a.kind not in ("F", "B") for _, a in actions) or sum(counts) < stages:
        return None
    x0, t0 = 0, kinds * stages  # columns: x[g, s] at g * stages + s, t_a, then T
    index = {(a.stage, a.kind, a.microbatch): t0 + i for i, (_, a) in enumerate(actions)}
    big = t0 + len(actions)
    starts, cols, vals, lower, upper = [0], [], [], [], []

    def row(entries: dict[int, float], lo: float, hi: float = highspy.kHighsInf) -> None:
        cols.extend(entries)
        vals.extend(entries.values())
        starts.append(len(cols))
        lower.append(lo)
        upper.append(hi)

    def after(later: int, earlier: int, stage: int, kind: str) -> None:
        """t_later - t_earlier - dur(earlier) >= 0, dur on `stage` of `kind`: its layers' and, a B, the stage's."""
        per = forward if kind == "F" else backward
        entries = {later: 1.0, earlier: -1.0}
        for g in range(kinds):
            entries[x0 + g * stages + stage] = -per[g]
        row(entries, fixed[stage] if kind == "B" else 0.0)

    for g in range(kinds):
        row({x0 + g * stages + s: 1.0 for s in range(stages)}, counts[g], counts[g])
    for s in range(stages):
        row({x0 + g * stages + s: 1.0 for g in range(kinds)}, 1.0)
    for acts in order.actions:
        for prev, nxt in zip(acts, acts[1:]):
            after(index[(nxt.stage, nxt.kind, nxt.microbatch)], index[(prev.stage, prev.kind, prev.microbatch)],
                  prev.stage, prev.kind)
        last = acts[-1]
        after(big, index[(last.stage, last.kind, last.microbatch)], last.stage, last.kind)
    for _, a in actions:
        producer = ((a.stage - 1, "F") if a.stage > 0 else None) if a.kind == "F" else \
            ((a.stage, "F") if a.stage == stages - 1 else (a.stage + 1, "B"))
        if producer is not None:
            after(index[(a.stage, a.kind, a.microbatch)], index[(*producer, a.microbatch)], *producer)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = big + 1, len(lower)
    lp.col_cost_ = np.array([0.0] * big + [1.0])
    lp.col_lower_ = np.zeros(big + 1)
    lp.col_upper_ = np.full(big + 1, highspy.kHighsInf)
    lp.row_lower_, lp.row_upper_ = np.array(lower), np.array(upper)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = np.array(starts), np.array(cols), np.array(vals)
    without_banner()  # stdout is `ckplan search --json`'s
    solver = highspy.Highs()
    solver.setOptionValue("output_flag", False)
    solver.passModel(lp)
    solver.run()
    if solver.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    return max(0.0, solver.getInfo().objective_function_value)
