"""The exact planner as a dynamic programme over (stage, layer boundary).

Why it is exact. The iteration time (costmodel.pipeline_ms) grows with every stage's
time, so once the stages are cut, each stage should checkpoint the cheapest set of its
layers that fits its cap. The search therefore splits in two:

1. Segments (planner/solve/dpsegments.py). For every stage s and layer range [i, j) it may
   hold, the least recompute that fits cap_s. Option vectors of [i, j) (each layer none, full or a selective recompute
   option; whole layers only under --recompute whole-layer) are grown one layer at a time at
   the end, each summarised by (recompute ms, kept bytes per microbatch, extra bytes).
   Appending layer m under option o keeps the summary exact:
       kept += kept_m(o),   extra = max(extra - kept_m(o), transient_m + peak_m(o))
   (none: kept act_m, peak 0; full: kept input_m, peak act_m - input_m)
   (costmodel.transient_extra_bytes: later layers' kept bytes are freed, or not yet made,
   while a layer runs), and every term grows with its predecessor, so a set worse in all
   three than another set of the same range is never needed: only the Pareto front is
   kept. Each stage s then reads off the cheapest set whose costmodel peak fits cap_s
   (static + max(k_s·kept + max(extra, loss scratch), step scratch) + buffers, or the step's
   end where that is more: static + buffers + what the schedule keeps then, the same for every
   set of the range, chunked.stage_end_bytes).
2. Cuts. Labels (Σ time, slowest stage, slowest step) at each (stage, boundary), again
   only the Pareto front, and none whose lower bound (the label plus the least Σ time and
   least bottleneck the remaining stages can reach) exceeds a known plan's time. The
   objective is evaluated on the labels that reach the last layer.
3. Passes. A known plan (the best baseline) bounds the slowest stage and the total
   recompute of any faster plan; ranges slower than the first or recomputing more than
   the second are never built. A first pass caps both tighter (fastest_plan), and a
   second, exhaustive one runs only where the best plan found needs it.

An option that frees nothing (keeps no less than none), or that another option of the layer
beats in kept bytes, time and extra peak alike, is never taken (costmodel.useful_options): it
would add time and never lower a peak. With k options a layer multiplies a range's sets by up
to k + 1 before the front prunes them. min_cap_scale's least-memory plan uses the same
segments, scored by their least peak, and cuts minimising the largest peak / cap.

Every coefficient comes from planner.costmodel; callers re-score the plan with
costmodel.evaluate(). The time limit is a Deadline checked between units of work.
"""

from __future__ import annotations

from planner.cost import costmodel, pipereduce
from planner.schema import Profile, StagePlan, TrainSetup
from planner.solve.deadline import Deadline, Expired
from planner.solve.dpsegments import INF, Chain, Excluded, Segment, _segments_from, front, segments  # noqa: F401

# the first pass caps the slowest stage this far from its floor to the proven bound
PROBE_FRACTION = 0.5


# ---------------------------------------------------------------- cuts


def _remaining_bounds(by_start: list[dict], num_stages: int, num_layers: int):
    """For stages s.. starting at layer i: the least Σ time and the least slowest stage."""
    least_sum = [dict() for _ in range(num_stages + 1)]
    least_max = [dict() for _ in range(num_stages + 1)]
    least_sum[num_stages][num_layers] = least_max[num_stages][num_layers] = 0.0
    for s in reversed(range(num_stages)):
        for i, segs in by_start[s].items():
            sums = [seg.time_ms + least_sum[s + 1][seg.end] for seg in segs if seg.end in least_sum[s + 1]]
            if sums:
                least_sum[s][i] = min(sums)
                least_max[s][i] = min(max(seg.time_ms, least_max[s + 1][seg.end])
                                      for seg in segs if seg.end in least_max[s + 1])
    return least_sum, least_max


def _index(found: list[Segment], num_stages: int, attr: str) -> list[dict[int, list[Segment]]]:
    index = [dict() for _ in range(num_stages)]
    for seg in found:
        index[seg.stage].setdefault(getattr(seg, attr), []).append(seg)
    return index


def fastest_cuts(chain: Chain, found: list[Segment], *, upper_bound_ms: float, deadline: Deadline):
    """The segments (one per stage) of the fastest plan no slower than upper_bound_ms, and its
    iteration time; None when there is none."""
    setup = chain.setup
    num_stages, num_layers = setup.pipeline.stages, len(chain)
    total_step = sum(chain.step_ms)
    drain = pipereduce.drain_ms(chain.layers, setup)  # the stages' reductions after their last backward
    by_start, by_end = _index(found, num_stages, "start"), _index(found, num_stages, "end")
    least_sum, least_max = _remaining_bounds(by_start, num_stages, num_layers)
    limit = upper_bound_ms * (1 + 1e-9)

    def bound(total: float, slowest: float, step: float, s: int, end: int) -> float:
        rest_sum, rest_max = least_sum[s + 1].get(end, INF), least_max[s + 1].get(end, INF)
        return costmodel.pipeline_ms(total + rest_sum, max(slowest, rest_max), step, total_step, setup, drain)

    # label: (Σ time, slowest stage, slowest step, (previous label, segment))
    labels = {0: [(0.0, 0.0, 0.0, None)]}
    for s in range(num_stages):
        deadline.check()
        grown = {}
        for end, segs in by_end[s].items():
            candidates = []
            for seg in segs:
                for total, slowest, step, back in labels.get(seg.start, ()):
                    item = (total + seg.time_ms, max(slowest, seg.time_ms), max(step, seg.step_ms))
                    if bound(*item, s, end) <= limit:
                        candidates.append((*item, ((total, slowest, step, back), seg)))
            if candidates:
                grown[end] = front(candidates)
        labels = grown
    finals = labels.get(num_layers, [])
    if not finals:
        return None
    def iteration_ms(label) -> float:  # from the label's sums and maxima
        return costmodel.pipeline_ms(*label[:3], total_step, setup, drain)

    best = min(finals, key=iteration_ms)
    return _trace(best), iteration_ms(best)


def _trace(label) -> list[Segment]:
    chosen = []
    while label[3] is not None:
        label, seg = label[3]
        chosen.append(seg)
    return chosen[::-1]


def least_memory_cuts(chain: Chain, found: list[Segment], *, deadline: Deadline) -> list[Segment] | None:
    """The cuts whose largest (peak + margin) / cap is smallest (each segment at its least peak)."""
    num_stages, num_layers = len(chain.stages), len(chain)
    by_end = _index(found, num_stages, "end")
    best = {0: (0.0, [])}  # boundary -> (largest ratio so far, segments)
    for s in range(num_stages):
        deadline.check()
        grown = {}
        for end, segs in by_end[s].items():
            for seg in segs:
                if seg.start not in best:
                    continue
                ratio = max(best[seg.start][0], (seg.peak_bytes + costmodel.FIT_MARGIN_BYTES) / chain.stages[s].cap_bytes)
                if end not in grown or ratio < grown[end][0]:
                    grown[end] = (ratio, best[seg.start][1] + [seg])
        best = grown
    return best[num_layers][1] if num_layers in best else None


# ---------------------------------------------------------------- entry points


def boundary_windows(chain: Chain, tau_max: float) -> list[tuple[int, int]]:
    """[lo, hi] for each stage s: how many layers stages 0..s can hold together. Each stage
    takes at least one layer, and no stage of an optimal plan is slower than tau_max, so
    stages 0..s hold layers whose plain fwd + bwd sum to at most (s+1)·tau_max, and the
    stages after s likewise take the rest."""
    num_layers, num_stages = len(chain), len(chain.stages)
    prefix = [0.0]
    for time_ms in chain.plain_ms:
        prefix.append(prefix[-1] + time_ms)
    loss_ms = chain.stages[-1].const_ms
    windows = []
    for s in range(num_stages):
        lo, hi = s + 1, num_layers - (num_stages - 1 - s)
        if s < num_stages - 1 and tau_max < INF:
            while hi > lo and prefix[hi] > (s + 1) * tau_max:
                hi -= 1
            rest = (num_stages - 1 - s) * tau_max - loss_ms
            while lo < hi and prefix[num_layers] - prefix[lo] > rest:
                lo += 1
        windows.append((lo, hi))
    return windows


def to_stages(chain: Chain, chosen: list[Segment]) -> list[StagePlan]:
    options, every = [0] * len(chain), (1 << chain.bits) - 1
    for seg in chosen:
        for offset in range(seg.end - seg.start):
            options[seg.start + offset] = seg.mask >> (offset * chain.bits) & every
    return costmodel.split_to_stages([seg.start for seg in chosen], options, chain.profile)


def fastest_plan(profile: Profile, setup: TrainSetup, *, upper_bound_ms: float | None,
                 deadline: Deadline, excluded: Excluded | None = None,
                 chain: Chain | None = None) -> tuple[list[StagePlan], float] | None:
    """The fastest plan that fits (and, given upper_bound_ms, is no slower than it), with
    its iteration time; None when there is none. Raises deadline.Expired. `excluded`: the
    sets no stage takes (dpsegments.segments); `chain`: Chain(profile, setup), made before.

    The work grows with how slow a stage may be (the boundary windows widen with it) and
    how much it may recompute (its checkpoint fronts grow with it). A known plan bounds
    both (bottleneck_bound_ms, recompute_budget_ms); the search first caps them part of
    the way there, and widens only as far as the best plan found then proves necessary:
    a pass whose caps are at least the bounds of the best plan was exhaustive."""
    chain = chain or Chain(profile, setup)
    bound_ms = INF if upper_bound_ms is None else upper_bound_ms
    floor_ms = (sum(chain.plain_ms) + chain.stages[-1].const_ms) / setup.pipeline.stages
    limits = _limits(chain, bound_ms)
    # when fewer stages compute at once than there are, Σ time decides and the bottleneck
    # bound stays loose: the first pass recomputes nothing, a cheap start for the real one
    sharing = costmodel.parallel_stages(setup) < setup.pipeline.stages
    caps = (floor_ms + (limits[0] - floor_ms) * PROBE_FRACTION, 0.0 if sharing else limits[1] * PROBE_FRACTION)
    best = None
    try:
        while True:
            tau, recompute = (min(cap, limit) for cap, limit in zip(caps, limits))
            found = segments(chain, boundary_windows(chain, tau), max_time_ms=tau, objective="time",
                             deadline=deadline, max_recompute_ms=recompute, excluded=excluded)
            result = fastest_cuts(chain, found, upper_bound_ms=bound_ms, deadline=deadline)
            if result is not None:
                best, bound_ms = result, result[1]
                limits = _limits(chain, bound_ms)
            if tau >= limits[0] and recompute >= limits[1]:
                break
            caps = limits if result is not None else (floor_ms + 2 * (tau - floor_ms),
                                                      max(2 * recompute, limits[1] / 16))
    except Expired as stop:
        # a pass that finished found a plan (not proven optimal): the caller may keep it
        stop.found = None if best is None else (to_stages(chain, best[0]), best[1])
        raise
    if best is None:
        return None
    chosen, objective_ms = best
    return to_stages(chain, chosen), objective_ms


def _limits(chain: Chain, bound_ms: float) -> tuple[float, float]:
    """(slowest stage, total recompute) of any plan no slower than bound_ms."""
    if bound_ms == INF:
        return INF, INF
    return costmodel.bottleneck_bound_ms(chain.profile, chain.setup, bound_ms), recompute_budget_ms(chain, bound_ms)


def recompute_budget_ms(chain: Chain, bound_ms: float) -> float:
    """The most recompute, over all stages, of a plan no slower than bound_ms: its Σ time is
    at most (bound - mean step) / (1 + (M - 1) / P) (the slowest stage is at least the
    mean one) and, when fewer stages compute at once (C < P), (C·bound / h - Σ step) / M."""
    setup = chain.setup
    micro, steps = setup.pipeline.microbatches, sum(chain.step_ms)
    total_ms = (bound_ms - steps / setup.pipeline.stages) / (1 + (micro - 1) / setup.pipeline.stages)
    if costmodel.parallel_stages(setup) < setup.pipeline.stages:
        total_ms = min(total_ms, (costmodel.parallel_stages(setup) * bound_ms / setup.time.cpu_sharing - steps) / micro)
    plain_ms = sum(chain.plain_ms) + chain.stages[-1].const_ms
    return total_ms - plain_ms + 1e-9 * total_ms


def least_memory_plan(profile: Profile, setup: TrainSetup, *, known: list[StagePlan],
                      deadline: Deadline) -> list[StagePlan]:
    """The plan whose largest (peak + margin) / cap is smallest; no range needing more than
    the `known` plan's largest ratio is considered. Raises deadline.Expired."""
    chain = Chain(profile, setup)
    scale = max(c.pressure for c in costmodel.evaluate(known, profile, setup).stages) * (1 + 1e-9)
    found = segments(chain, boundary_windows(chain, INF), max_time_ms=INF, objective="memory", deadline=deadline,
                     cap_scale=scale)
    chosen = least_memory_cuts(chain, found, deadline=deadline)
    return known if chosen is None else to_stages(chain, chosen)


def lower_bound_ms(profile: Profile, setup: TrainSetup) -> float:
    """No plan is faster: Σ time is at least every layer's fwd + bwd (+ loss), the slowest
    stage at least the mean one, the slowest step at least the mean step."""
    chain = Chain(profile, setup)
    base = sum(chain.plain_ms) + chain.stages[-1].const_ms
    steps = sum(chain.step_ms)
    return costmodel.pipeline_ms(base, base / setup.pipeline.stages, steps / setup.pipeline.stages, steps, setup,
                                 pipereduce.drain_ms(chain.layers, setup))
