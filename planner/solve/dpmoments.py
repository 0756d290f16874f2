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

A set of a range is held as the two things its future reads: its classes where the range ends here (its
layers but the last net of what the last keeps and adds, the last as closing the stage) and where it goes on
(the last as not closing, and what the next layer adds to the backward's classes), each only for the classes
the stages that read the set score (needed), and, where a stage reads only their maximum, as that maximum
(the backward's and the forward's where one forward precedes the first backward; with the first backward's
where a forward follows a backward); going on, classes are merged only where every later layer of the range
adds the same to each (grow). So a set is (ms, kept, mask, ending, going); the stage's extra is read from
`ending` with the stage's own figures (scored). Exact, not a bound: every term of stage_unit_moments is one of
these classes plus a figure of the range (its prefix of shards known as the layer is added, its stage's by the
end), max distributes over them, and a class's growth is its own: tests/test_dpsolve.py holds every range's
least peak and least recompute to evaluate's brute force. A set is dropped only where another is no worse in
every field (front). The sets may still be many (ten options a layer: §42.dpseg), so the time limit is read as
a range grows."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from planner.cost import dataparallel, fsdpunits, gathered
from planner.cost.rules import runtime_facts

INF = math.inf
NONE = (-INF,) * 5
BLOCK = 128  # sets scored at once by front
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

    def needed(self, members) -> tuple[tuple[int, ...], ...]:
        """The classes `scored` reads on `members`' stages, as groups whose maximum alone it reads: a backward's
        and the forward's (one group) where no second forward precedes the first backward; with the first
        backward's in that group and the opening layer's apart (the range's stray prefetch is added to it) where
        one does and a forward follows a backward; each apart where none follows (the microbatch's kept bytes
        and the shards come off some, ZeRO 2's other extras read too). Stages of different kinds: each class
        apart. A class is grown from its own alone (grow), so no other is tracked."""
        kinds = {0 if self.warm[s] < 2 else 1 if not self.warm_only(s) else 2 for s in members}
        if kinds == {0}:
            return ((B, F),)
        if kinds == {1}:
            return ((B, F, FI), (H,))
        needed = (B, F, FI, H) + ((OTHER,) if self.zero2 and any(self.warm_only(s) for s in members) else ())
        return tuple((c,) for c in needed)

    def grow(self, states: list[tuple], m: int, i: int, shift: int, budget: float, *, last_stage: bool,
             needed: tuple[tuple[int, ...], ...], end: int) -> list[tuple]:
        """dpsegments._grow's twin: the sets of [i, m) extended by layer m (its option at bit `shift`). A set is
        (ms, kept, mask, ending, going): its classes as the stage's extra reads them where the range ends at m + 1
        (its layers but the last net of what the last keeps and adds, the last as closing the stage), and as
        the next layer's extension reads them (the last as not closing, and what layer m + 1 adds to the
        backward's classes already added) — the two are all the future reads of a set, so its layers but the
        last are not kept apart. Only the `needed` classes are grown (the rest -inf), each group of them held as
        its maximum (in its first class) where it ends; where it goes on, as its maximum where every class of the
        group gets the same from each later layer up to `end` (the range's last end), else apart by what they get
        (a backward's classes the later bytes, the others none). `going` is none where the range cannot pass
        m + 1."""
        chain = self.chain
        model_last = last_stage and m == len(chain) - 1
        absent = self.prefix[m + 1] - self.prefix[i]
        choices = [(0, 0.0, chain.kept_plain[m], chain.raw_extra[m])] + [
            (o, ms, kept, extra) for o, ms, kept, extra in chain.raw_alternatives[m]]
        going_on = m + 1 < min(end, len(chain))
        step = self.later[m + 1] if going_on else 0.0
        steps = [step if c in (B, FI, H) else 0.0 for c in range(5)]
        if going_on and any(self.later[k] for k in range(m + 1, min(end, len(chain)))):
            ahead = tuple(part for group in needed
                          for part in (tuple(c for c in group if c in (B, FI, H)), tuple(c for c in group
                                                                                       if c not in (B, FI, H)))
                          if part)
        else:
            ahead = needed
        grown = []
        # the sets' fields as arrays, each option's extension a few numpy passes over all of them (one set at a time
        # in Python took most of a ZeRO 2/3 solve's time: §66.suitetime); the same floats, max and sums exact
        ms_all = np.array([state[0] for state in states], dtype=float)
        going_all = np.array([NONE if state[4] is None else state[4] for state in states], dtype=float).reshape(-1, 5)
        for option, cost, kept, extra in choices:
            closing = self._absent(self.classes(m, option, kept, extra, opens=m == i, closes=True,
                                                model_last=model_last), absent)
            open_end = self._absent(self.classes(m, option, kept, extra, opens=m == i, closes=False,
                                                 model_last=False), absent) if going_on else None
            code = option << shift
            rows = np.flatnonzero(~(ms_all + cost > budget))
            pv = going_all[rows] - kept
            endings = self._merged(np.maximum(pv, closing), needed)
            nexts = [None] * len(rows) if open_end is None else self._merged(
                np.maximum(pv + steps, open_end), ahead)
            for row, ending, nxt in zip(rows.tolist(), endings, nexts):
                ms, before, mask = states[row][:3]
                grown.append((ms + cost, before + kept, mask | code, ending, nxt))
        return grown

    @staticmethod
    def _merged(values: np.ndarray, groups: tuple[tuple[int, ...], ...]) -> list[tuple]:
        """Each row's classes as each group's maximum in its first class, every other class -inf."""
        out = np.full_like(values, -INF)
        for group in groups:
            out[:, group[0]] = values[:, list(group)].max(axis=1)
        return list(map(tuple, out.tolist()))

    @staticmethod
    def _absent(values: tuple, absent: float) -> tuple:
        return values[:FI] + (values[FI] - absent, values[H] - absent) + values[OTHER:]

    @staticmethod
    def front(states: list[tuple], timed: bool, needed: tuple[tuple[int, ...], ...], deadline=None) -> list[tuple]:
        """The sets no other set beats or ties in every field (ms where `timed`, kept, the `needed` classes as
        ending and as going on), sorted by every field, ms first. A set is dropped where any set before it in that
        order is no worse in every field: one that is no worse comes before it, and one dropped is itself beaten
        by one kept that beats this one too, so a block of sets is scored at once against the sets kept and the
        block's own before it. `deadline` is checked every block."""
        if not timed:
            states = [(0.0, *state[1:]) for state in states]
        if not states:
            return states
        held = [c for group in needed for c in group]
        fields = np.array([(state[0], state[1], *(state[3][c] for c in held),
                            *((state[4][c] for c in held) if state[4] is not None else ()))
                           for state in states])
        fields = fields[:, (fields != fields[0]).any(axis=0) | (np.arange(fields.shape[1]) < 2)]  # no constant
        order = np.lexsort(fields.T[::-1])
        fields = fields[order]
        kept, out = fields[:0].T, []  # a field a row: each field's comparison is one contiguous pass
        for start in range(0, len(fields), BLOCK):
            if deadline is not None:
                deadline.check()
            block = fields[start:start + BLOCK]
            beaten = np.tril(_no_worse(block.T, block), -1).any(axis=1)
            if kept.shape[1]:
                beaten |= _no_worse(kept, block).any(axis=1)
            kept = np.concatenate([kept, block[~beaten].T], axis=1)
            out += [states[order[start + n]] for n in np.flatnonzero(~beaten)]
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
        for ms, kept, mask, v, _ in states:
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


def _no_worse(sets, block) -> np.ndarray:
    """[r, k]: whether set k (a column of `sets`, a field a row) is no worse than block's row r in every field,
    field by field (numpy's all() over a short last axis took most of front's time: §66.suitetime)."""
    out = sets[0][None, :] <= block[:, 0][:, None]
    for field in range(1, len(sets)):
        out &= sets[field][None, :] <= block[:, field][:, None]
    return out
