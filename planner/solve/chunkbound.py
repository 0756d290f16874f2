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
microbatch. Side streams and lockstep's waits only add to that. So the makespan is at least the longest path
through those precedences with each action lasting at least what the simulation runs it, and
    T >= min over splits of (that longest path + max_r step_r).
The split is relaxed: x[g, s] >= 0 layers of kind g on stage s (bounds.kinds), sum_s x[g, s] the kind's
count, every stage holding at least one layer (sum_g x[g, s] >= 1), contiguity and integrality dropped but
each x[g, s] at most the kind's layers at positions stage s can hold (s to s + n - S of n layers over S
stages: a contiguous split's). What each action lasts, as splittime.stage_times and simulate_time charge it:
  - F of stage s: sum_g x[g, s] f_g (f_g the layer's forward, assembly.stage_sums' forward_ms) + h_s;
  - B of stage s: sum_g x[g, s] b_g (b_g its least time under any option less that forward) + the stage's own
    time terms (the last stage's loss) + h_s, and on the stage's M-th backward its gradient reductions
    (pipereduce.stage_reductions_ms, a sum over its layers: sum_g x[g, s] r_g);
  - h_s: half the stage's comm (its input gradient's send, its output's, its actions) less the sends its
    runtime runs beside the compute (stagesends.beside_ms), the least over the layers that can open and close
    stage s: the comm and the beside sends are terms of its first and last layer;
  - a beside send adds to its receiver's wait (the edge F(s) -> F(s+1), B(s) -> B(s-1), where they cross
    ranks) and, a warm-up forward's, to its sender's next action (schedule_time.warmup_forwards); not under
    lockstep, whose simulation waits for no beside send.
The step: max_r step_r >= sum over the rank's stages of sum_g x[g, s] s_g, s_g a layer's least step, in the
same LP (a z column; the objective T + z). With one start-time variable an action, min T + z over (x, t, z)
subject to t_next >= t_a + dur_a (the rank's order), t_a >= t_p + dur_p + send (its producer p),
T >= t_last + dur_last is that least longest path plus step (an LP: each dur linear in x).
tests/test_chunkbound.py holds the bound under evaluate() on random plans and the simulation over every split.
"""

from __future__ import annotations

import dataclasses
import functools

import highspy
import numpy as np

from planner.cost import chunked, costmodel, pipereduce, runtimes, schedules, stagesends
from planner.cost.rules import compute_ms
from planner.cost.schedule_time import warmup_forwards
from planner.schema import Profile, TrainSetup
from planner.solve.highs import scheduler_threads, without_banner

SCHEDULES = ("interleaved-1F1B",)  # a full backward's order without pairs: B's chain is the drain's


@dataclasses.dataclass(frozen=True)
class StageTerms:
    """What the LP charges beside the layers' compute (tuples, hashable: the LP's cache key). Per stage:
    `fixed`, its own time terms (its B); `half`, the least half of its comm less its beside sends (its F and B
    each); `sent`, the least (output's, input gradient's) send beside the compute, its receiver's wait. Per kind:
    `reduce`, a layer's reductions after the stage's M-th backward; `step`, its least step. `upper`, per kind per
    stage, the most of the kind a contiguous split puts there (None: the kind's count)."""

    fixed: tuple = ()
    half: tuple = ()
    sent: tuple | None = None
    reduce: tuple = ()
    step: tuple = ()
    upper: tuple | None = None


def holds(setup: TrainSetup) -> bool:
    """Whether the bound applies: an interleaved 1F1B configuration of several chunks a rank."""
    return setup.pipeline.schedule in SCHEDULES and setup.pipeline.chunks > 1


def iteration_bound_ms(profile: Profile, setup: TrainSetup, layers: list[tuple[costmodel.LayerCost, int]],
                       enough: float = float("inf")) -> float:
    """The module's bound on every plan's iteration (ms): the least makespan of the order over the relaxed
    splits plus the slowest rank's least step. 0 where it does not apply or the LP fails. First the LP without
    the step, plus the ranks' mean least step (min (T + z) >= min T + min z, and the slowest rank's is at least
    the mean): that LP does not read the step, so a search's configurations that differ only there share it (the
    cache; ZeRO's stage among them unless it moves the reductions after a stage's last backward, StageTerms.reduce:
    torchtitan's ZeRO 3 kept whole charges them there, its ZeRO 1 and 2 none, so those differ); where it
    reaches `enough` (the bar the caller prunes at) it is the answer, else the LP with the step in it."""
    if not holds(setup):
        return 0.0
    pipeline = setup.pipeline
    order = _order(pipeline.schedule, pipeline.stages, pipeline.microbatches, pipeline.chunks)
    view = chunked.stages_view(setup, order)
    ctx = costmodel.Context(profile, view)
    forward, backward, counts, reduce, step = [], [], [], [], []
    for layer, count in layers:
        f = compute_ms(layer.fwd_ms, setup.time)
        options = range(len(layer.options))
        forward.append(f)
        backward.append(min(costmodel.layer_value("time", layer, o, ctx) for o in options) - f)
        counts.append(count)
        reduce.append(pipereduce.stage_reductions_ms([layer], setup))  # as evaluate: the setup, not the view
        step.append(min(costmodel.layer_value("step", layer, o, ctx) for o in options))
    terms = dataclasses.replace(_stage_terms(profile, order, view, layers), reduce=tuple(reduce))
    shape = (pipeline.schedule, pipeline.stages, pipeline.chunks, pipeline.microbatches, tuple(forward),
             tuple(backward), tuple(counts))
    found = _least_makespan_cached(*shape, terms)
    if found is None:
        return 0.0
    mean = found + sum(c * t for c, t in zip(counts, step)) / pipeline.stages
    if mean >= enough or not any(step):
        return mean
    joint = _least_makespan_cached(*shape, dataclasses.replace(terms, step=tuple(step)))
    return mean if joint is None else max(mean, joint)


def _stage_terms(profile: Profile, order: schedules.Schedule, view: TrainSetup,
                 layers: list[tuple[costmodel.LayerCost, int]]) -> StageTerms:
    """StageTerms' per-stage parts: a stage's comm and beside sends are terms of its first and last layer, so
    each is bounded by the least over the layers a contiguous split can open or close it with (positions s to
    s + n - S), as splittime.stage_times and stagesends.beside_ms charge them."""
    ctx = costmodel.Context(profile, view)
    kind_of = {dataclasses.replace(layer, name=""): g for g, (layer, _) in enumerate(layers)}
    ordered = [kind_of[dataclasses.replace(layer, name="")] for layer in costmodel.layer_costs(profile)]
    stages, spare = order.num_stages, len(ordered) - order.num_stages
    lockstep = runtimes.of(view.training).multi_schedule_lockstep
    fixed, half, sent = [], [], []
    for s in range(stages):
        can = [layers[g][0] for g in sorted(set(ordered[s:s + spare + 1]))]
        opens = [(costmodel.edge_value("comm", "open", layer, s, ctx),
                  stagesends.input_grad_beside_ms(layer, s, order, view)) for layer in can]
        closes = [(costmodel.edge_value("comm", "close", layer, s, ctx),
                   stagesends.output_beside_ms(layer, s, order, view)) for layer in can]
        comm = (min(c - b for c, b in opens) + min(c - b for c, b in closes)
                + costmodel.stage_value("comm", s, ctx))
        fixed.append(costmodel.stage_value("time", s, ctx))
        half.append(comm / 2)
        sent.append((0.0, 0.0) if lockstep else (min(b for _, b in closes), min(b for _, b in opens)))
    return StageTerms(fixed=tuple(fixed), half=tuple(half), sent=tuple(sent) if any(map(any, sent)) else None,
                      upper=window_caps(ordered, len(layers), stages))


def window_caps(ordered: list[int], kinds: int, stages: int) -> tuple:
    """Per kind, per stage: how many of the kind's layers (`ordered`, each layer's kind in the model's order) a
    contiguous split into `stages` non-empty stages can put on the stage: those at positions s to s + n - S."""
    spare = len(ordered) - stages
    return tuple(tuple(ordered[s:s + spare + 1].count(g) for s in range(stages)) for g in range(kinds))


@functools.lru_cache(maxsize=1024)
def _least_makespan_cached(schedule: str, ranks: int, chunks: int, microbatches: int, forward: tuple, backward: tuple,
                           counts: tuple, terms: StageTerms) -> float | None:
    """least_makespan_ms once per order and numbers: a search's configurations that differ in what the LP does not
    read share it."""
    return least_makespan_ms(_order(schedule, ranks, microbatches, chunks), list(forward), list(backward),
                             list(counts), terms=terms)


@functools.lru_cache(maxsize=256)
def _order(schedule: str, ranks: int, microbatches: int, chunks: int) -> schedules.Schedule:
    """The order once per shape (torch builds it in tens of ms): a search's configurations share it."""
    return schedules.pipeline_schedule(schedule, num_ranks=ranks, num_microbatches=microbatches, num_chunks=chunks)


def least_makespan_ms(order, forward: list[float], backward: list[float], counts: list[int],
                      fixed: list[float] | None = None, *, terms: StageTerms | None = None) -> float | None:
    """The LP of the module's text over `order`'s actions (F and B only), the kinds' forward and backward
    per layer and how many of each, and `terms` (`fixed`, per stage, what its B takes besides its layers, where
    no terms are given): its least makespan plus the slowest rank's step; None where HiGHS does not find its
    optimum."""
    terms = terms or StageTerms(fixed=tuple(fixed or ()))
    kinds, stages = len(counts), order.num_stages
    fixed = list(terms.fixed) or [0.0] * stages
    half = list(terms.half) or [0.0] * stages
    sent = terms.sent or ((0.0, 0.0),) * stages
    reduce = list(terms.reduce) or [0.0] * kinds
    step = list(terms.step) or [0.0] * kinds
    actions = [(rank, a) for rank, acts in enumerate(order.actions) for a in acts]
    if any(a.kind not in ("F", "B") for _, a in actions) or sum(counts) < stages:
        return None
    x0, t0 = 0, kinds * stages  # columns: x[g, s] at g * stages + s, t_a, then T, then z (the slowest step)
    index = {(a.stage, a.kind, a.microbatch): t0 + i for i, (_, a) in enumerate(actions)}
    big = t0 + len(actions)
    z = big + 1
    last_backward = {}  # stage -> the key of its M-th backward: its rank runs its list in order
    warm = set()  # the warm-up forwards whose beside send holds the sender (simulate_time's `held`)
    for rank, acts in enumerate(order.actions):
        for a in acts:
            if a.kind == "B":
                last_backward[a.stage] = (a.stage, a.kind, a.microbatch)
        if terms.sent:
            warm.update((a.stage, a.kind, a.microbatch) for a in acts[:warmup_forwards(order, rank)]
                        if a.kind == "F" and _crosses(order, a.stage, a.stage + 1))
    starts, cols, vals, lower, upper = [0], [], [], [], []

    def row(entries: dict[int, float], lo: float, hi: float = highspy.kHighsInf) -> None:
        cols.extend(entries)
        vals.extend(entries.values())
        starts.append(len(cols))
        lower.append(lo)
        upper.append(hi)

    def after(later: int, key: tuple, more: float = 0.0) -> None:
        """t_later - t_key - dur(key) >= more: the action `key` (stage, kind, microbatch) as it runs, its
        layers' and its stage's, the M-th backward's reductions with it."""
        stage, kind, _ = key
        per = forward if kind == "F" else backward
        entries = {later: 1.0, index[key]: -1.0}
        for g in range(kinds):
            entries[x0 + g * stages + stage] = -per[g] - (reduce[g] if last_backward.get(stage) == key else 0.0)
        row(entries, half[stage] + (fixed[stage] if kind == "B" else 0.0) + more)

    for g in range(kinds):
        row({x0 + g * stages + s: 1.0 for s in range(stages)}, counts[g], counts[g])
    for s in range(stages):
        row({x0 + g * stages + s: 1.0 for g in range(kinds)}, 1.0)
    for rank, acts in enumerate(order.actions):
        for prev, nxt in zip(acts, acts[1:]):
            key = (prev.stage, prev.kind, prev.microbatch)
            after(index[(nxt.stage, nxt.kind, nxt.microbatch)], key, sent[prev.stage][0] if key in warm else 0.0)
        last = acts[-1]
        after(big, (last.stage, last.kind, last.microbatch))
        row({z: 1.0, **{x0 + g * stages + s: -step[g] for s in order.stages_of(rank) for g in range(kinds)}}, 0.0)
    for _, a in actions:
        later = index[(a.stage, a.kind, a.microbatch)]
        if a.kind == "F" and a.stage > 0:
            key = (a.stage - 1, "F", a.microbatch)
            # held or beside, the receiver waits for the send (held: it is in the sender's clock)
            after(later, key, sent[a.stage - 1][0] if _crosses(order, a.stage - 1, a.stage) else 0.0)
        elif a.kind == "B" and a.stage == stages - 1:
            after(later, (a.stage, "F", a.microbatch))
        elif a.kind == "B":
            after(later, (a.stage + 1, "B", a.microbatch),
                  sent[a.stage + 1][1] if _crosses(order, a.stage + 1, a.stage) else 0.0)
    columns = z + 1
    col_upper = np.full(columns, highspy.kHighsInf)
    if terms.upper is not None:
        for g in range(kinds):
            col_upper[x0 + g * stages:x0 + (g + 1) * stages] = terms.upper[g]
    cost = np.zeros(columns)
    cost[big] = cost[z] = 1.0
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = columns, len(lower)
    lp.col_cost_ = cost
    lp.col_lower_ = np.zeros(columns)
    lp.col_upper_ = col_upper
    lp.row_lower_, lp.row_upper_ = np.array(lower), np.array(upper)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = np.array(starts), np.array(cols), np.array(vals)
    without_banner()  # stdout is `ckplan search --json`'s
    solver = highspy.Highs()
    solver.setOptionValue("output_flag", False)
    threads = scheduler_threads(None)  # HiGHS's one scheduler a process: a later MILP's threads must be these
    if threads is not None:
        solver.setOptionValue("threads", threads)
    solver.passModel(lp)
    solver.run()
    if solver.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    return max(0.0, solver.getInfo().objective_function_value)


def _crosses(order: schedules.Schedule, sender: int, receiver: int) -> bool:
    """Whether stage `sender`'s tensor to stage `receiver` goes to another rank."""
    return 0 <= receiver < order.num_stages and order.stage_to_rank[sender] != order.stage_to_rank[receiver]
