"""The dynamic programme's segments (planner/solve/dpsolve.py, step 1): the profile's layers as
the cost model's per-layer values (Chain), and for every stage and layer range it may hold the
least recompute that fits its cap, grown a layer at a time at the range's end with the stage
accumulator's sums (costmodel.StageRun) and the evaluator's peak (costmodel.peak_bytes), only the
Pareto front of (recompute ms, kept bytes, extra bytes) kept. Under Megatron-FSDP's double buffer a
layer's extra holds its moments as evaluate places them (megatron_fsdp_moments.stage_moments): a unit's
everywhere, and on the pipeline's last stage the model's last unit's and the output layer's own, from
which on the last stage's sets grow apart from the other stages' (Chain.tail_layers). Beside a pipeline under
FSDP2's moments a set carries its maxima by class of moment instead of one extra (planner/solve/dpmoments.py)."""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from planner.cost import boundgrad, costmodel, gradtiming, megatron_fsdp_moments
from planner.schema import PipelineSetup, Profile, TrainSetup
from planner.solve import dpmoments
from planner.solve.deadline import Deadline

INF = math.inf
Excluded = dict[tuple[int, int, int], frozenset[int]]  # (stage, start, end) -> masks never taken
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
        self.kept_plain, self.raw_extra = per_layer(("kept",), False), per_layer(("extra",), False)
        # Megatron-FSDP's moments (megatron_fsdp_moments): a unit's in its extra on every stage; on the
        # pipeline's last stage the model's last unit and the output layer after it have their own
        # (tail_options); {} where they do not apply
        self.moments = megatron_fsdp_moments.held_layers(ctx)
        self.extra_plain = [self._extra(m, 0, extra, kept)
                            for m, (extra, kept) in enumerate(zip(self.raw_extra, self.kept_plain))]
        # each layer's other choices, (option, recompute ms, kept, extra): the undominated
        # options that keep fewer bytes (one that frees nothing never lowers a peak and always
        # costs time), full alone for whole-layer plans; and their extras before the moments
        self.raw_alternatives = [
            [(o, costmodel.layer_value("time", layer, o, ctx) - plain, costmodel.layer_value("kept", layer, o, ctx),
              costmodel.layer_value("extra", layer, o, ctx)) for o in costmodel.useful_options(layer, ctx)]
            for layer, plain in zip(layers, self.plain_ms)]
        self.alternatives = [[(o, ms, kept, self._extra(m, o, extra, kept)) for o, ms, kept, extra in options]
                             for m, options in enumerate(self.raw_alternatives)]
        self.tail_layers = self._tail_layers()
        # FSDP2's units at each stage's own moments beside a pipeline (planner/solve/dpmoments.py); None elsewhere
        self.fsdp = dpmoments.StageMoments(self) if dpmoments.applies(profile, setup) else None
        self.bits = max(len(layer.options) - 1 for layer in layers).bit_length()  # per layer in a mask
        self.step_scratch = per_layer(("scratch",), False)
        self.static = per_layer(held, False)  # held all step long
        self.host = per_layer(("host",), False)
        self.host_cap = costmodel.host_cap_bytes(setup.data_parallel, pipeline=setup.pipeline)
        self.params = [layer.trained_count for layer in layers]  # with the largest tensor: ZeRO 1's whole tensors
        self.largest = [layer.largest_trained_count for layer in layers]
        self.numels = [layer.zero_one_numels(setup.pipeline.stages) for layer in layers]  # its tensors, exactly
        self.step_ms = per_layer(("step",), False)
        # the step's end (score.rank_cost's own moment): the whole gradients gone by then, per
        # layer, and what a stage's first and last layers leave the schedule keeping
        self.late_grad = [gradtiming.lazy_grad_bytes([layer], setup) for layer in layers]
        self.late_grad_any = any(self.late_grad)
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

    def _extra(self, m: int, option: int, extra: float, kept: float) -> float:
        """Layer m's extra under `option` anywhere but the tail (megatron_fsdp_moments.unit_extra)."""
        if not self.moments:
            return extra
        return megatron_fsdp_moments.unit_extra(self.layers[m], option, extra, kept, self.moments, self.ctx)

    def _tail_layers(self) -> frozenset[int]:
        """The layers whose moments on the pipeline's last stage are their own: the model's last unit (the output
        layers' bucket queued through its backward) and the last layer, where output layers follow that unit."""
        names = [layer.name for layer in self.layers]
        if not self.moments or not megatron_fsdp_moments.after_last_unit(self.moments, names):
            return frozenset()
        return frozenset((names.index(megatron_fsdp_moments.last_unit(self.moments)), len(names) - 1))

    def tail_options(self, m: int, start: int) -> tuple[float, list[tuple]]:
        """Layer m of tail_layers on the last stage starting at layer `start`: (its extra under none, its
        alternatives), as megatron_fsdp_moments.stage_moments places them."""
        held, ctx, layer = self.moments, self.ctx, self.layers[m]
        out_params = megatron_fsdp_moments.output_params(held, [other.name for other in self.layers[start:]])
        if layer.name == megatron_fsdp_moments.last_unit(held):
            queued = megatron_fsdp_moments.queued_bytes(out_params, ctx)
            def extra_of(o, extra, kept):
                return megatron_fsdp_moments.unit_extra(layer, o, extra, kept, held, ctx, queued=queued)
        else:
            def extra_of(o, extra, kept):
                return megatron_fsdp_moments.output_extra(layer, extra, kept, out_params, ctx)
        return (extra_of(0, self.raw_extra[m], self.kept_plain[m]),
                [(o, ms, kept, extra_of(o, extra, kept)) for o, ms, kept, extra in self.raw_alternatives[m]])

    @cached_property
    def _closing(self) -> list[tuple[float, list[tuple]] | None]:
        """Per layer, its (extra under none, alternatives) where it closes a stage before the last, its incoming
        gradient being that stage's receive buffer (boundgrad.closing_grad_bytes: the same on every such stage),
        before the moments as evaluate takes it off; None where nothing comes off."""
        if not boundgrad.applies(self.setup):
            return [None] * len(self.layers)
        out = []
        for m, layer in enumerate(self.layers):
            def less(o, extra, layer=layer):
                return extra - boundgrad.closing_grad_bytes(layer, o, stage=0, profile=self.profile, setup=self.setup)
            plain = less(0, self.raw_extra[m])
            alternatives = [(o, ms, kept, self._extra(m, o, less(o, extra), kept))
                            for o, ms, kept, extra in self.raw_alternatives[m]]
            same = plain == self.raw_extra[m] and all(
                a[3] == b[3] for a, b in zip(alternatives, self.alternatives[m]))
            out.append(None if same else (self._extra(m, 0, plain, self.kept_plain[m]), alternatives))
        return out

    def closing_options(self, m: int) -> tuple[float, list[tuple]] | None:
        """Layer m's (extra under none, alternatives) where it closes a stage before the last (_closing)."""
        return self._closing[m]

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

    @cached_property
    def order(self):
        """The schedule (one stage per rank: the DP's segments only). Built when first asked: the
        MILP's boundary windows read a chain of a chunked schedule's P·V stages, which is none."""
        return costmodel.schedule_of(self.setup)

    def end_bytes(self, s: int, start: int, end: int) -> float:
        """What stage s holding [start, end) keeps at the step's end beyond what it holds all
        iteration (chunked.stage_end_bytes, from its first and last layers alone)."""
        return self._end(costmodel.opening_end_bytes, start, s) + self._end(costmodel.closing_end_bytes, end - 1, s)

    def _end(self, part, layer: int, s: int) -> float:
        """Memoised: a layer's part of the step's end as stage s's first or last layer."""
        key = (part, layer, s)
        if key not in self._edges:
            self._edges[key] = part(self.layers[layer], stage=s, order=self.order, training=self.setup.training)
        return self._edges[key]

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


def _grow(states: list[tuple], chain: Chain, m: int, shift: int, max_recompute_ms: float,
          options: tuple[float, list] | None = None) -> list[tuple]:
    """Option vectors of a range extended by layer m (its option at bit `shift` of the mask),
    each (recompute ms, kept, extra, mask); `options`: layer m's (extra under none, alternatives)
    where they are not the chain's (Chain.tail_options)."""
    plain = chain.kept_plain[m]
    extra_plain, alternatives = options or (chain.extra_plain[m], chain.alternatives[m])
    grown = [(ms, kept + plain, max(extra - plain, extra_plain), mask) for ms, kept, extra, mask in states
             if ms <= max_recompute_ms]
    for option, cost, option_kept, option_extra in alternatives:
        code = option << shift
        grown += [(ms + cost, kept + option_kept, max(extra - option_kept, option_extra), mask | code)
                  for ms, kept, extra, mask in states if ms + cost <= max_recompute_ms]
    return grown


# ---------------------------------------------------------------- segments


def segments(chain: Chain, windows: list[tuple[int, int]], *, max_time_ms: float, objective: str,
             deadline: Deadline, cap_scale: float = 1.0, max_recompute_ms: float = INF,
             excluded: Excluded | None = None) -> list[Segment]:
    """Every (stage, range) within the boundary windows that fits its cap: for objective
    "time" the least recompute (and only if no slower than max_time_ms and recomputing
    at most max_recompute_ms), for "memory" the least peak of those that fit their cap x
    cap_scale. `excluded`: per (stage, start, end), the sets (masks) never taken (the allocator
    replay put them over: planner/solve/replaycuts.py)."""
    num_layers, num_stages = len(chain), len(chain.stages)
    starts = [(0, 0)] + windows[:-1]
    closing = [{j: chain.closing_bytes(s, j) for j in range(lo, hi + 1)} for s, (lo, hi) in enumerate(windows)]
    found = []
    for i in range(num_layers):
        deadline.check()
        stages = [s for s in range(num_stages) if starts[s][0] <= i <= starts[s][1]]
        if stages:
            found += _segments_from(chain, i, stages, windows, closing, max_time_ms=max_time_ms, objective=objective,
                                    cap_scale=cap_scale, max_recompute_ms=max_recompute_ms, excluded=excluded or {},
                                    deadline=deadline)
    return found


def _segments_from(chain: Chain, i: int, stages: list[int], windows, closing, *, max_time_ms: float,
                   objective: str, cap_scale: float, max_recompute_ms: float = INF,
                   excluded: Excluded | None = None, deadline: Deadline | None = None) -> list[Segment]:
    """The segments of every stage in `stages` that starts at layer i."""
    deadline = deadline or Deadline(None)
    found = []
    opening = {s: chain.opening_bytes(s, i) for s in stages}
    # what each GPipe backward of a stage opening at layer i leaves held to the step's end (gpipeheld)
    sent = {s: costmodel.held_per_backward_bytes(chain.layers[i], s, chain.setup) for s in stages}
    timed = objective == "time"
    # the least that opening any of these stages adds (kept, held); closing adds no negative kept
    # bytes, and no held bytes below the stage's own constant (negative for tied copies held once)
    first_kept = min(opening[s][0] for s in stages)
    first_held = min(opening[s][1] + min(chain.stages[s].const_held_bytes, 0.0) for s in stages)
    host_cap = INF if chain.host_cap is None else chain.host_cap - costmodel.FIT_MARGIN_BYTES
    k_low = min(chain.stages[s].in_flight for s in stages)
    k_high = max(chain.stages[s].in_flight for s in stages)
    cap_high = max(chain.stages[s].cap_bytes * cap_scale for s in stages) - costmodel.FIT_MARGIN_BYTES
    # whether a stage's peak may leave out some of its lazily allocated gradients (GPipe; 1F1B's
    # stage with all M in flight): where gradients_above is less than them
    pipeline = chain.setup.pipeline
    discounts = chain.late_grad_any and any(
        costmodel.one_chunk_gradients_above(1.0, stage=s, kept=1.0, pipeline=pipeline) < 1.0 for s in stages)
    late_grad = 0.0  # the range's whole gradients allocated at the stage's first backward
    run = costmodel.StageRun(chain.setup, chain.profile.device.type)  # the accumulator's sums, grown a layer at a time
    # the stages that read one list of sets: all of them, until a layer whose moments on the last stage are its
    # own (Chain.tail_layers) parts the last stage's sets from the others'
    last = len(chain.stages) - 1
    fsdp = chain.fsdp
    groups = [(stages, [(0.0, 0, 0, None, None) if fsdp else (0.0, 0, 0, 0)])]
    for j in range(i + 1, max(windows[s][1] for s in stages) + 1):
        m = j - 1
        deadline.check()  # a range's sets may be many (one stage of a whole 8B model: ~2 s a layer, §44.searchbb)
        run.add(time_ms=chain.plain_ms[m], held_bytes=chain.static[m], step_ms=chain.step_ms[m],
                host_bytes=chain.host[m], params=chain.params[m], largest_params=chain.largest[m],
                scratch_bytes=chain.step_scratch[m], numels=chain.numels[m])
        late_grad += chain.late_grad[m]
        plain, held, step = run.time_ms, run.held_bytes, run.step_ms  # each grows with the range
        if run.host_bytes > host_cap:
            break
        if timed and plain > max_time_ms:
            break
        tail = m in chain.tail_layers or (fsdp is not None and m == len(chain) - 1)
        if tail:
            groups = [part for group in groups for part in _part_last(group, last)]
        budget = min(max_time_ms - plain, max_recompute_ms) if timed else INF
        # static and kept only grow with the range: drop sets that no later end can fit (a
        # byte of room for the peak's rounding to whole bytes); the whole gradients allocated
        # at the first backward may be out of the peak (gradtiming.one_chunk), and grow too
        floor = held - late_grad if late_grad and discounts else held
        if fsdp is not None:  # a stage's transient may be as low as its floor (its shards absent)
            floor += fsdp.floor(i, j, stages)
        grown = []
        closes = chain.closing_options(m) if fsdp is None else None
        for members, states in groups:
            before = states
            if fsdp is not None:
                needed = fsdp.needed(members)
                states = fsdp.grow(states, m, i, (m - i) * chain.bits, budget, last_stage=members == [last],
                                   needed=needed, end=max(windows[s][1] for s in members))
            else:
                options = chain.tail_options(m, i) if tail and members == [last] else None
                states = _grow(states, chain, m, (m - i) * chain.bits, budget, options)
            def fitting(found, floor=floor):  # static and kept only grow: drop the sets no later end can fit
                return [st for st in found
                        if floor + first_held + (k_low if st[1] + first_kept >= 0 else k_high) * (st[1] + first_kept)
                        <= cap_high + 1]
            states = fitting(states)
            if not states:
                continue
            # for the least peak, recompute time plays no part: a front over (kept, extra) alone
            if fsdp is not None:
                states = fsdp.front(states, timed, needed, deadline)
            else:
                states = front(states if timed else [(0.0, *st[1:]) for st in states])
            grown.append((members, states))
            columns = None if fsdp is not None else _columns(states)
            # closing a stage before the last: layer m's extras less its incoming gradient, grown from the sets
            # before it (the carried max cannot give max(prev - kept_m, e_m - r)): an exact front of their own
            ends = None
            if closes is not None and any(s != last and windows[s][0] <= j <= windows[s][1] for s in members):
                ends = fitting(_grow(before, chain, m, (m - i) * chain.bits, budget, closes))
                ends = front(ends if timed else [(0.0, *st[1:]) for st in ends])
                ends = (ends, _columns(ends))
            for s in members:
                if windows[s][0] <= j <= windows[s][1]:
                    kept, edge_held = (a + b for a, b in zip(opening[s], closing[s][j]))
                    sums = (plain + chain.edge_comm_ms(s, i, j), held, step, run.step_scratch_bytes)
                    edge = (kept, edge_held, chain.end_bytes(s, i, j), late_grad, sent[s])
                    scored, cols = ends if ends is not None and s != last else (states, columns)
                    stage = chain.stages[s]
                    if not scored:
                        continue
                    if fsdp is not None:  # each set's extra on this stage, from its classes
                        scored, stage = fsdp.scored(states, s, i, j, kept, stage)
                        cols = _columns(scored)
                    segment = _best_set(stage, s, i, j, scored, sums, edge, objective, cols,
                                        pipeline=chain.setup.pipeline, excluded=(excluded or {}).get((s, i, j)))
                    if segment is not None and (not timed or segment.time_ms <= max_time_ms):
                        found.append(segment)
        groups = grown
        if not groups:
            break
    return found


def _columns(states: list[tuple]):
    """The sets' kept and extra bytes as arrays, where there are many to score at once (else None)."""
    if len(states) < VECTOR_FROM:
        return None
    return (np.array([st[1] for st in states], dtype=np.int64), np.array([st[2] for st in states], dtype=np.int64))


def _part_last(group: tuple[list[int], list[tuple]], last: int) -> list[tuple[list[int], list[tuple]]]:
    """A group of stages and their sets, the last stage parted from the others (the same sets, grown apart)."""
    members, states = group
    if last not in members or members == [last]:
        return [group]
    return [([s for s in members if s != last], states), ([last], states)]


def _best_set(stage: _Stage, s: int, i: int, j: int, states, sums: tuple, edge: tuple, objective: str,
              columns=None, *, pipeline: PipelineSetup, excluded: frozenset[int] | None = None) -> Segment | None:
    """The fitting set with the least recompute ("time", states sorted by it) or peak
    ("memory"). sums: the range's plain ms (with its sends), held bytes, step ms, optimizer step scratch;
    edge: the (kept, held) its first and last layer and its position add, at the step's end
    what the schedule keeps and the whole gradients gone by then, and what each GPipe backward
    leaves held (gpipeheld; the same for every set: none depends on what the stage recomputes); columns: the states' kept and extra bytes as arrays, to score them all at once;
    `excluded`: masks never taken."""
    plain, static, step, step_scratch = sums
    edge_kept, edge_held, end, late_grad, sent = edge
    held = static + edge_held
    limit, in_flight, loss_scratch = stage.cap_bytes - costmodel.FIT_MARGIN_BYTES, stage.in_flight, stage.loss_scratch_bytes
    if objective == "memory":
        limit = INF  # the least peak is wanted, whatever the cap
    # the step's end, its own moment of the peak (score.rank_cost): no set of this range fits below it
    end_peak = int(round(costmodel.step_end_peak_bytes(held, late_grad_bytes=late_grad, end_bytes=end)))
    if end_peak > limit:
        return None
    def peak_of(kept, extra, maximum=max):
        """The evaluator's peak of a rank of one stage (costmodel.rank_cost) for these sets: the
        whole gradients allocated at the first backward are not held all iteration, but join
        the activations as rank_cost's gradients_above says, with what GPipe's backwards leave held."""
        kept = kept + edge_kept
        transient = maximum(extra - stage.const_kept_bytes, loss_scratch)
        if late_grad or sent:
            transient = transient + costmodel.one_chunk_gradients_above(late_grad, stage=s, kept=kept,
                                                                        pipeline=pipeline, maximum=maximum,
                                                                        per_backward=sent)
        return costmodel.peak_bytes(held - late_grad, in_flight, kept, transient, step_scratch, maximum)

    if columns is not None:
        peaks = np.rint(peak_of(*columns, maximum=np.maximum))  # rint: round's half to even
        if end or late_grad:  # else the step's end is the held bytes, which every peak holds
            peaks = np.maximum(peaks, end_peak)
        if excluded:
            peaks[[n for n, state in enumerate(states) if state[3] in excluded]] = INF
        pick = int(np.argmin(peaks)) if objective == "memory" else int(np.argmax(peaks <= limit))
        if peaks[pick] > limit:
            return None
        ms, _, _, mask = states[pick]
        return Segment(s, i, j, plain + ms + stage.const_ms, step, mask, int(peaks[pick]))
    best = None
    for ms, kept, extra, mask in states:
        if excluded and mask in excluded:
            continue
        peak = max(int(round(peak_of(kept, extra))), end_peak)
        if objective == "time":
            if peak <= limit:
                return Segment(s, i, j, plain + ms + stage.const_ms, step, mask, peak)
        elif best is None or peak < best[0]:
            best = (peak, ms, mask)
    if best is None:
        return None
    peak, ms, mask = best
    return Segment(s, i, j, plain + ms + stage.const_ms, step, mask, peak)
