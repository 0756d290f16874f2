"""The exact planner as a dynamic programme over (stage, layer boundary).

Why it is exact. The iteration time (costmodel.iteration_ms) grows with every stage's
time, so once the stages are cut, each stage should checkpoint the cheapest set of its
layers that fits its cap. The search therefore splits in two:

1. Segments. For every stage s and layer range [i, j) it may hold, the least recompute
   that fits cap_s. Option vectors of [i, j) (each layer none, full or a selective recompute
   option; whole layers only under --recompute whole-layer) are grown one layer at a time at
   the end, each summarised by (recompute ms, kept bytes per microbatch, extra bytes).
   Appending layer m under option o keeps the summary exact:
       kept += kept_m(o),   extra = max(extra - kept_m(o), transient_m + peak_m(o))
   (none: kept act_m, peak 0; full: kept input_m, peak act_m - input_m)
   (costmodel.transient_extra_bytes: later layers' kept bytes are freed, or not yet made,
   while a layer runs), and every term grows with its predecessor, so a set worse in all
   three than another set of the same range is never needed: only the Pareto front is
   kept. Each stage s then reads off the cheapest set whose costmodel peak fits cap_s
   (static + max(k_s·kept + max(extra, loss scratch), step scratch) + buffers).
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

import math
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from planner.cost import costmodel, dataparallel
from planner.schema import Profile, StagePlan, TrainSetup
from planner.solve.deadline import Deadline, Expired

INF = math.inf
# the first pass caps the slowest stage this far from its floor to the proven bound
PROBE_FRACTION = 0.5
VECTOR_FROM = 24  # checkpoint sets per range from which numpy scores them


@dataclass(frozen=True)
class Segment:
    """Stage `stage` holds layers [start, end); `mask` packs each layer's recompute option
    index, chain.bits bits per layer: layer start + b's is (mask >> b·bits) & (2^bits - 1)."""

    stage: int
    start: int
    end: int
    time_ms: float
    step_ms: float
    mask: int
    peak_bytes: int


@dataclass(frozen=True)
class _Stage:
    """What the cost model charges stage s for its position (not its layers)."""

    in_flight: int
    const_kept_bytes: float
    const_held_bytes: float
    loss_scratch_bytes: float
    const_ms: float
    cap_bytes: int




class Chain:
    """The profile's layers as flat per-layer lists of the cost model's values
    (costmodel.TERMS, read through layer_value / edge_value / stage_value)."""

    def __init__(self, profile: Profile, setup: TrainSetup):
        self.profile, self.setup = profile, setup
        self.ctx = ctx = costmodel.Context(profile, setup)
        # how the declared quantities combine (costmodel.QUANTITY_DECLARATIONS): held all iteration, busy per mb
        self.held, self.busy = held, busy = costmodel.quantities("held"), costmodel.quantities("busy")
        self._edges: dict[tuple, float] = {}
        self.layers = layers = costmodel.layer_costs(profile)

        def per_layer(quantities, ckpt: bool) -> list[float]:
            return [sum(costmodel.layer_value(q, layer, ckpt, ctx) for q in quantities) for layer in layers]

        # compute as the run takes it; the sends and actions at the stage's edges
        self.plain_ms = per_layer(("time",), False)
        self.kept_plain, self.extra_plain = per_layer(("kept",), False), per_layer(("extra",), False)
        # each layer's other choices, (option, recompute ms, kept, extra): the undominated
        # options that keep fewer bytes (one that frees nothing never lowers a peak and always
        # costs time), full alone for whole-layer plans
        self.alternatives = [
            [(o, costmodel.layer_value("time", layer, o, ctx) - plain, costmodel.layer_value("kept", layer, o, ctx),
              costmodel.layer_value("extra", layer, o, ctx)) for o in costmodel.useful_options(layer, ctx)]
            for layer, plain in zip(layers, self.plain_ms)]
        self.bits = max(len(layer.options) - 1 for layer in layers).bit_length()  # per layer in a mask
        self.step_scratch = per_layer(("scratch",), False)
        self.static = per_layer(held, False)  # held all step long
        self.host = per_layer(("host",), False)
        self.host_cap = costmodel.host_cap_bytes(setup)
        self.params = [layer.param_count for layer in layers]  # with the largest tensor: ZeRO 1's whole tensors
        self.largest = [layer.largest_param_count for layer in layers]
        self.step_ms = per_layer(("step",), False)
        self.stages = [
            _Stage(
                in_flight=costmodel.in_flight(setup.pipeline, s),
                const_kept_bytes=costmodel.stage_value("kept", s, ctx),
                const_held_bytes=sum(costmodel.stage_value(q, s, ctx) for q in held),
                loss_scratch_bytes=costmodel.stage_value("extra", s, ctx),
                const_ms=sum(costmodel.stage_value(q, s, ctx) for q in busy),
                cap_bytes=costmodel.limit_bytes(s, ctx),  # the allocated peak the device's cap admits
            )
            for s in range(setup.pipeline.stages)
        ]

    def __len__(self) -> int:
        return len(self.layers)

    def _edge(self, quantities, where: str, layer: int, s: int) -> float:
        """Memoised: the segments ask for the same edges for every range."""
        key = (quantities, where, layer, s)
        if key not in self._edges:
            self._edges[key] = sum(costmodel.edge_value(q, where, self.layers[layer], s, self.ctx) for q in quantities)
        return self._edges[key]

    def opening_bytes(self, s: int, start: int) -> tuple[float, float]:
        """(kept per microbatch, held) that layer `start` adds by opening stage s."""
        return self._edge(("kept",), "open", start, s), self._edge(self.held, "open", start, s)

    def edge_comm_ms(self, s: int, start: int, end: int) -> float:
        """Per microbatch, what stage s's first and last layer add: its sends."""
        return self._edge(self.busy, "open", start, s) + self._edge(self.busy, "close", end - 1, s)

    def closing_bytes(self, s: int, end: int) -> tuple[float, float]:
        """(kept, held) that layer `end - 1` adds by closing stage s, with the stage's own."""
        stage = self.stages[s]
        return (self._edge(("kept",), "close", end - 1, s) + stage.const_kept_bytes,
                self._edge(self.held, "close", end - 1, s) + stage.const_held_bytes)


# ---------------------------------------------------------------- Pareto fronts


def front(items: list[tuple]) -> list[tuple]:
    """The items that no other item beats or ties in all of their first three fields (all
    minimised), sorted by the first."""
    items.sort(key=lambda item: item[:3])
    kept, keys, seconds = [], [], []  # a staircase: keys ascending, seconds strictly descending
    for item in items:
        key, second = item[1], item[2]
        pos = bisect_right(keys, key) - 1
        if pos >= 0 and seconds[pos] <= second:
            continue
        kept.append(item)
        end = pos + 1
        while end < len(keys) and seconds[end] >= second:
            end += 1
        keys[pos + 1:end], seconds[pos + 1:end] = [key], [second]
    return kept


def _grow(states: list[tuple], chain: Chain, m: int, shift: int, max_recompute_ms: float) -> list[tuple]:
    """Option vectors of a range extended by layer m (its option at bit `shift` of the mask),
    each (recompute ms, kept, extra, mask)."""
    plain = chain.kept_plain[m]
    grown = [(ms, kept + plain, max(extra - plain, chain.extra_plain[m]), mask) for ms, kept, extra, mask in states
             if ms <= max_recompute_ms]
    for option, cost, option_kept, option_extra in chain.alternatives[m]:
        code = option << shift
        grown += [(ms + cost, kept + option_kept, max(extra - option_kept, option_extra), mask | code)
                  for ms, kept, extra, mask in states if ms + cost <= max_recompute_ms]
    return grown


# ---------------------------------------------------------------- segments


def segments(chain: Chain, windows: list[tuple[int, int]], *, max_time_ms: float, objective: str,
             deadline: Deadline, cap_scale: float = 1.0, max_recompute_ms: float = INF) -> list[Segment]:
    """Every (stage, range) within the boundary windows that fits its cap: for objective
    "time" the least recompute (and only if no slower than max_time_ms and recomputing
    at most max_recompute_ms), for "memory" the least peak of those that fit their cap x
    cap_scale."""
    num_layers, num_stages = len(chain), len(chain.stages)
    starts = [(0, 0)] + windows[:-1]
    closing = [{j: chain.closing_bytes(s, j) for j in range(lo, hi + 1)} for s, (lo, hi) in enumerate(windows)]
    found = []
    for i in range(num_layers):
        deadline.check()
        stages = [s for s in range(num_stages) if starts[s][0] <= i <= starts[s][1]]
        if stages:
            found += _segments_from(chain, i, stages, windows, closing, max_time_ms=max_time_ms, objective=objective,
                                    cap_scale=cap_scale, max_recompute_ms=max_recompute_ms)
    return found


def _segments_from(chain: Chain, i: int, stages: list[int], windows, closing, *, max_time_ms: float,
                   objective: str, cap_scale: float, max_recompute_ms: float = INF) -> list[Segment]:
    """The segments of every stage in `stages` that starts at layer i."""
    found = []
    opening = {s: chain.opening_bytes(s, i) for s in stages}
    timed = objective == "time"
    # the least that opening any of these stages adds (kept, held); closing adds no negative kept
    # bytes, and no held bytes below the stage's own constant (negative for tied copies held once)
    first_kept = min(opening[s][0] for s in stages)
    first_held = min(opening[s][1] + min(chain.stages[s].const_held_bytes, 0.0) for s in stages)
    host_cap = INF if chain.host_cap is None else chain.host_cap - costmodel.FIT_MARGIN_BYTES
    k_low = min(chain.stages[s].in_flight for s in stages)
    k_high = max(chain.stages[s].in_flight for s in stages)
    cap_high = max(chain.stages[s].cap_bytes * cap_scale for s in stages) - costmodel.FIT_MARGIN_BYTES
    states = [(0.0, 0, 0, 0)]
    plain = static = step = host = 0.0
    params = largest = 0  # the range's parameters and largest tensor (dataparallel.zero_one_excess_bytes)
    scratch_sum = scratch_max = 0.0  # the optimizer step's scratch: cuda sums it, cpu takes the largest
    for j in range(i + 1, max(windows[s][1] for s in stages) + 1):
        m = j - 1
        plain += chain.plain_ms[m]
        static += chain.static[m]
        params += chain.params[m]
        largest = max(largest, chain.largest[m])
        held = static + dataparallel.zero_one_excess_bytes(params, largest, chain.setup)  # grows with the range
        step += chain.step_ms[m]
        host += chain.host[m]
        if host > host_cap:  # host bytes only grow with the range
            break
        scratch_sum += chain.step_scratch[m]
        scratch_max = max(scratch_max, chain.step_scratch[m])
        if timed and plain > max_time_ms:
            break
        states = _grow(states, chain, m, (m - i) * chain.bits, min(max_time_ms - plain, max_recompute_ms) if timed else INF)
        # static and kept only grow with the range: drop sets that no later end can fit (a
        # byte of room for the peak's rounding to whole bytes)
        states = [st for st in states
                  if held + first_held + (k_low if st[1] + first_kept >= 0 else k_high) * (st[1] + first_kept) <= cap_high + 1]
        if not states:
            break
        # for the least peak, recompute time plays no part: a front over (kept, extra) alone
        states = front(states if timed else [(0.0, *st[1:]) for st in states])
        columns = None
        if len(states) >= VECTOR_FROM:  # many sets: score them all at once
            columns = (np.array([st[1] for st in states], dtype=np.int64), np.array([st[2] for st in states], dtype=np.int64))
        for s in stages:
            if windows[s][0] <= j <= windows[s][1]:
                kept, edge_held = (a + b for a, b in zip(opening[s], closing[s][j]))
                sums = (plain + chain.edge_comm_ms(s, i, j), held, step,
                        _step_scratch(chain, scratch_sum, scratch_max))
                segment = _best_set(chain.stages[s], s, i, j, states, sums, (kept, edge_held), objective, columns)
                if segment is not None and (not timed or segment.time_ms <= max_time_ms):
                    found.append(segment)
    return found


def _step_scratch(chain: Chain, scratch_sum: float, scratch_max: float) -> float:
    """costmodel.step_scratch_bytes of a range, from its running sum and maximum."""
    return costmodel.step_scratch_bytes([scratch_sum] if chain.profile.device.type == "cuda" else [scratch_max],
                                        chain.profile.device.type)


def _best_set(stage: _Stage, s: int, i: int, j: int, states, sums: tuple, edge: tuple[int, int],
              objective: str, columns=None) -> Segment | None:
    """The fitting set with the least recompute ("time", states sorted by it) or peak
    ("memory"). sums: the range's plain ms (with its sends), held bytes, step ms, optimizer step scratch;
    edge: the (kept, held) its first and last layer and its position add; columns:
    the states' kept and extra bytes as arrays, to score them all at once."""
    plain, static, step, step_scratch = sums
    edge_kept, edge_held = edge
    held = static + edge_held
    limit, in_flight, loss_scratch = stage.cap_bytes - costmodel.FIT_MARGIN_BYTES, stage.in_flight, stage.loss_scratch_bytes
    if objective == "memory":
        limit = INF  # the least peak is wanted, whatever the cap
    if columns is not None:
        kept, extra = columns
        # costmodel.stage_cost's peak (rint: round's half to even)
        peaks = np.rint(costmodel.peak_bytes(held, in_flight, kept + edge_kept,
                                             np.maximum(extra - stage.const_kept_bytes, loss_scratch),
                                             step_scratch, maximum=np.maximum))
        pick = int(np.argmin(peaks)) if objective == "memory" else int(np.argmax(peaks <= limit))
        if peaks[pick] > limit:
            return None
        ms, _, _, mask = states[pick]
        return Segment(s, i, j, plain + ms + stage.const_ms, step, mask, int(peaks[pick]))
    best = None
    for ms, kept, extra, mask in states:
        peak = int(round(costmodel.peak_bytes(held, in_flight, kept + edge_kept,
                                              max(extra - stage.const_kept_bytes, loss_scratch),
                                              step_scratch)))
        if objective == "time":
            if peak <= limit:
                return Segment(s, i, j, plain + ms + stage.const_ms, step, mask, peak)
        elif best is None or peak < best[0]:
            best = (peak, ms, mask)
    if best is None:
        return None
    peak, ms, mask = best
    return Segment(s, i, j, plain + ms + stage.const_ms, step, mask, peak)


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
    by_start, by_end = _index(found, num_stages, "start"), _index(found, num_stages, "end")
    least_sum, least_max = _remaining_bounds(by_start, num_stages, num_layers)
    limit = upper_bound_ms * (1 + 1e-9)

    def bound(total: float, slowest: float, step: float, s: int, end: int) -> float:
        rest_sum, rest_max = least_sum[s + 1].get(end, INF), least_max[s + 1].get(end, INF)
        return costmodel.pipeline_ms(total + rest_sum, max(slowest, rest_max), step, total_step, setup)

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
        return costmodel.pipeline_ms(*label[:3], total_step, setup)

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
                 deadline: Deadline) -> tuple[list[StagePlan], float] | None:
    """The fastest plan that fits (and, given upper_bound_ms, is no slower than it), with
    its iteration time; None when there is none. Raises deadline.Expired.

    The work grows with how slow a stage may be (the boundary windows widen with it) and
    how much it may recompute (its checkpoint fronts grow with it). A known plan bounds
    both (bottleneck_bound_ms, recompute_budget_ms); the search first caps them part of
    the way there, and widens only as far as the best plan found then proves necessary:
    a pass whose caps are at least the bounds of the best plan was exhaustive."""
    chain = Chain(profile, setup)
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
                             deadline=deadline, max_recompute_ms=recompute)
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
    return costmodel.pipeline_ms(base, base / setup.pipeline.stages, steps / setup.pipeline.stages, steps, setup)
