"""The DP's segments beside a pipeline under FSDP2's moments (fsdpunits.beside_pipeline): each stage's layers
charged at the stage's own moments, as evaluate charges them (gathered.stage_unit_moments, stage_floor), grown
a layer at a time at the range's end (dpsegments._segments_from).

A layer's moments depend on its place in its stage: whether it opens it (no unit before it prefetched, its own
copy-out in its pre-backward at ZeRO 3, the stray prefetch of the stage's last unit in the first backward),
whether it closes it (no unit after it reduced last), the shards of the units up to it not yet made in the
first backward, and what every later layer of the stage adds (HSDP's reduced shards, ZeRO 2's resharded
weights); and the stage adds its own after the fact: its last unit's size (the stray prefetch), its shards and
its microbatch's kept bytes (the later backwards and forwards where no forward follows a backward). So a set
of a range is held as maxima by class of moment, each net of what the layers after it keep and add:

    B      every backward's moments (a later backward's)      F   the forward's moments
    FI     the first backward's, its shards up to it absent    H   the opening layer's first backward, to which the
    OTHER  the layer's other extras (the moment of its             stray prefetch of the range's last unit is added
           shards absent alone: ZeRO 2, no forward after a backward)

the range's layers but its last in `pv`, its last layer's as closing the stage (`ll`) and as not (`lw`: the
next layer reduced last, resharded, its HSDP shard). A set is (ms, kept, mask, pv, lw, ll): extending it by a
layer n folds lw (less n's kept bytes) into pv (less n's kept bytes and its later_backward_bytes), and the
stage's extra is read from max(pv, ll) with the stage's own figures (extra). Exact, not a bound: every term
of stage_unit_moments is one of these classes plus a figure of the range (its prefix of shards known as the
layer is added, its stage's by the end), and max distributes over them; tests/test_dpsolve.py holds every
range's least peak and least recompute to evaluate's brute force. A set is dropped only where another with the
same last option is no worse in every field (front)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from planner.cost import dataparallel, fsdpunits, gathered
from planner.cost.rules import runtime_facts

INF = math.inf
NONE = (-INF,) * 5
B, F, FI, H, OTHER = range(5)


def applies(profile, setup) -> bool:
    """Whether a stage's FSDP2 moments are its own (gathered.stage_unit_moments charges them)."""
    record = runtime_facts(setup)
    return (setup.pipeline.stages > 1 and fsdpunits.charged_per_moment(setup, record.fsdp_units)
            and fsdpunits.beside_pipeline(setup, record.fsdp_units) and not record.fsdp_gathered_from_forward)


class StageMoments:
    """Chain's (dpsegments.Chain) layers' classes of moment, by option and place, read once."""

    def __init__(self, chain):
        self.chain = chain
        profile, setup = chain.profile, chain.setup
        self.units_of = units_of = gathered.stage_units(profile, setup)
        params, fp8, _ = units_of
        grads = dataparallel.param_bytes(setup).grads / dataparallel.shard_size(setup)
        self.shards = [p * grads for p in params]
        self.prefix = [0.0]
        for shard in self.shards:
            self.prefix.append(self.prefix[-1] + shard)
        self.outputs = [dataparallel.gathered_bytes(p, setup, fp8_count=f) for p, f in zip(params, fp8)]
        self.later = [gathered.later_backward_bytes(units_of, m, setup) for m in range(len(params))]
        self.zero2 = setup.data_parallel.zero < 3
        self.warm = [fsdpunits.warm_up(setup, s) for s in range(setup.pipeline.stages)]
        self._cache: dict[tuple, tuple] = {}

    def classes(self, m: int, option: int, kept: float, extra: float, *, opens: bool, closes: bool,
                model_last: bool) -> tuple[float, ...]:
        """Layer m's classes under `option` (its kept bytes and its extra with the solvers' per-layer bound, the
        cost model's layer values), its shards up to it not taken yet (Fi and H: the caller's prefix)."""
        key = (m, option, opens, closes, model_last)
        if key not in self._cache:
            chain, layer = self.chain, self.chain.layers[m]
            other = extra - gathered.fsdp_unit_layer_bytes(layer, option, chain.profile, chain.setup,
                                                           lambda: kept)
            backward, forward = gathered.neighbour_moments(
                layer, option, kept, profile=chain.profile, setup=chain.setup, units_of=self.units_of, index=m,
                opens=opens, closes=closes, model_last=model_last)
            first = max(backward[0], backward[1], backward[2] + self.shards[m])
            opening = (other + first, other + backward[3] if len(backward) > 3 else -INF)
            head, first_back = opening if opens else (-INF, other + first)
            self._cache[key] = (other + max(backward), other + max(forward), first_back, head, other)
        return self._cache[key]

    def grow(self, states: list[tuple], m: int, i: int, shift: int, budget: float, *, last_stage: bool) -> list[tuple]:
        """dpsegments._grow's twin: the sets of [i, m) extended by layer m (its option at bit `shift`)."""
        chain = self.chain
        model_last = last_stage and m == len(chain) - 1
        absent = self.prefix[m + 1] - self.prefix[i]
        choices = [(0, 0.0, chain.kept_plain[m], chain.raw_extra[m])] + [
            (o, ms, kept, extra) for o, ms, kept, extra in chain.raw_alternatives[m]]
        back_step = self.later[m]
        grown = []
        for option, cost, kept, extra in choices:
            closing = self._absent(self.classes(m, option, kept, extra, opens=m == i, closes=True,
                                                model_last=model_last), absent)
            open_end = NONE if m == len(chain) - 1 else self._absent(
                self.classes(m, option, kept, extra, opens=m == i, closes=False, model_last=False), absent)
            code = option << shift
            for ms, before, mask, pv, lw, _ in states:
                if ms + cost > budget:
                    continue
                if pv is None:  # the range's first layer
                    folded = NONE
                else:
                    folded = tuple(max(p - kept + (back_step if c in (B, FI, H) else 0.0), w - kept)
                                   for c, (p, w) in enumerate(zip(pv, lw)))
                grown.append((ms + cost, before + kept, mask | code, folded, open_end, closing))
        return grown

    @staticmethod
    def _absent(values: tuple, absent: float) -> tuple:
        return values[:FI] + (values[FI] - absent, values[H] - absent) + values[OTHER:]

    @staticmethod
    def front(states: list[tuple], timed: bool, shift: int, bits: int) -> list[tuple]:
        """The sets no other set beats or ties in every field (ms where `timed`, kept, every class of its layers
        but the last, and its last layer's as closing and as not), sorted by ms."""
        if not timed:
            states = [(0.0, *state[1:]) for state in states]
        states.sort(key=lambda state: (state[0], state[1]))
        if not states:
            return states
        fields = np.array([(state[0], state[1], *state[3], *state[4], *state[5]) if state[3] is not None
                           else (state[0], state[1]) + (-INF,) * 15 for state in states])
        kept = np.empty_like(fields)
        count, out = 0, []
        for row, state in zip(fields, states):
            if count and np.all(kept[:count] <= row, axis=1).any():
                continue
            kept[count] = row
            count += 1
            out.append(state)
        return out

    def floor(self, i: int, j: int, stages) -> float:
        """The least the transient of [i, j) may be on any of `stages` (gathered.stage_floor: 0, or its shards
        where no forward follows a backward): below it no set's peak falls, and it falls with the range."""
        return -(self.prefix[j] - self.prefix[i]) if any(self.warm_only(s) for s in stages) else 0.0

    def warm_only(self, s: int) -> bool:
        """Whether stage s's transient has gathered.stage_floor's floor: two forwards or more, none after a
        backward."""
        return self.warm[s] >= 2 and self.chain.setup.pipeline.microbatches == self.warm[s]

    def scored(self, states: list[tuple], s: int, i: int, j: int, edge_kept: float, stage):
        """Each set of [i, j) as (ms, kept, extra, mask) on stage s, with the stage whose loss scratch is its own
        floor's, for dpsegments._best_set: its transient max(extra - const kept, loss scratch) is evaluate's
        (assembly.stage_sums: the layers' extras net of what follows, the floor, the loss's scratch on it)."""
        warm, warm_only = self.warm[s], self.warm_only(s)
        shards = self.prefix[j] - self.prefix[i]
        stray = self.outputs[j - 1] if j - i > 1 else 0.0
        floor = -shards if warm_only else 0.0
        out = []
        for ms, kept, mask, pv, _, ll in states:
            v = [max(a, b) for a, b in zip(pv, ll)]
            if warm < 2:
                x = max(v[B], v[F])
            else:
                microbatch = kept + edge_kept
                ahead = v[F]
                if warm_only and self.zero2:
                    ahead = max(v[F] - shards - (warm - 1) * microbatch, v[OTHER] - shards)
                elif warm_only:
                    ahead = v[F] - shards
                x = max(v[FI], v[H] + stray, v[B] - (microbatch if warm_only else 0.0), ahead)
            out.append((ms, kept, max(x, stage.const_kept_bytes + floor), mask))
        return out, dataclasses.replace(stage, loss_scratch_bytes=stage.loss_scratch_bytes + floor)

