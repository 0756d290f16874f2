"""The least memory a stage needs whatever it recomputes, over every contiguous split, before any
search: where even that passes the caps, no plan fits, and `solve` says so in seconds rather than
after a least-memory search of its own (search.why_not) or a time limit.

For stage s holding layers [i, j), the DP's peak (dpsegments._best_set, which evaluate() agrees with)
is, whatever the checkpoint set,
    peak = max(H - G + max(k_s (K + E) + T, S),  H - G + end)
H: the range's held bytes (weights, gradients, optimizer state, buffers, ZeRO 1's whole tensors:
costmodel.StageRun) with what its first and last layer and its position add; G: the whole gradients
allocated at the stage's first backward (costmodel.lazy_grad... as the DP subtracts them, 0 where the
runtime keeps them all iteration); k_s: its in-flight microbatches; K: the layers' kept bytes, each
layer's least over all its options at least; E: what its edges and position keep; T: the transient,
at least the stage's loss scratch (the layers' extras and the lazy gradients above the activations
only add), less FSDP2's shards where a pipelined stage lacks them (dpmoments.floor); S: the optimizer
step's scratch; end: what the schedule keeps at the step's end. Taking each layer's least kept bytes gives
    need_s(i, j) = H - G + max(k_s (K_min + E) + loss scratch, S, end)  <=  the peak of every set,
and a min-max partition DP over the cuts finds the split whose largest need_s / limit_s is least
(limit_s: costmodel.limit_bytes, at replayfit.relaxed_caps where the allocator replay judges: rows
that admit every plan the replay admits). Above 1, every split has a stage past its limit under
every checkpoint set: no plan fits. One stage per rank (1F1B, GPipe) only: a chunked schedule's rank
holds stages apart in the model, which no contiguous cut describes.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from planner.cost import costmodel
from planner.schema import Profile, TrainSetup
from planner.solve import replayfit
from planner.solve.deadline import Deadline
from planner.solve.dpsegments import Chain

MAX_LAYERS = 1024  # beyond, no bound: its (L+1)^2 arrays a quantity (8 MiB each at 1024) and its L^2 loop grow too


@dataclass(frozen=True)
class StaticNeed:
    """The split whose largest need against its limit is least: stage `stage` holds layers
    [start, end) and needs at least `need_bytes` of allocated memory (by term: `terms`) against the
    `limit_bytes` its cap `cap_bytes` leaves its tensors."""

    stage: int
    start: int
    end: int
    need_bytes: int
    limit_bytes: int
    cap_bytes: int
    terms: dict[str, int]

    @property
    def fits(self) -> bool:
        return self.need_bytes <= self.limit_bytes


@dataclass(frozen=True)
class _Need:
    held: float  # held all iteration
    static: float  # of held: weights, gradients, optimizer state (with ZeRO 1's whole tensors)
    late_grad: float  # the whole gradients allocated at the first backward, out of held at the peak
    activations: float  # in-flight x least kept + loss scratch, with the lazy gradients above them at least
    scratch: float
    end: float

    @property
    def total(self) -> float:
        return self.held - self.late_grad + max(self.activations, self.scratch, self.end)


def chain_of(profile: Profile, setup: TrainSetup) -> Chain:
    """The DP's chain under the rows every plan evaluate() admits meets (replayfit.relaxed_caps where
    the allocator replay judges, else the setup's own)."""
    relaxed = replayfit.relaxed_caps(profile, setup)
    if relaxed is not None:
        setup = setup.model_copy(update={"pipeline": setup.pipeline.model_copy(update={"mem_caps_bytes": relaxed})})
    return Chain(profile, setup)


def least_need(profile: Profile, setup: TrainSetup, chain: Chain | None = None,
               deadline: Deadline | None = None) -> StaticNeed | None:
    """The bound of the module's text at the split that minimises it; None for chunked schedules,
    more stages than layers (no contiguous split of one stage per rank) or more than MAX_LAYERS.
    Expired: past `deadline` (checked a range start at a time)."""
    stages = setup.pipeline.stages
    if setup.pipeline.chunks > 1 or stages > len(profile.layers) or len(profile.layers) > MAX_LAYERS:
        return None
    needs = range_needs(chain or chain_of(profile, setup), deadline)
    num = len(needs.chain)
    limits = np.array([needs.chain.stages[s].cap_bytes for s in range(stages)], dtype=float)
    # best[j]: the least largest need / limit of stages 0..s holding layers [0, j); cuts[s][j]: where stage s begins
    best = np.full(num + 1, math.inf)
    best[0] = 0.0
    cuts = []
    for s in range(stages):
        if deadline is not None:
            deadline.check()
        ratio = needs.totals(s) / limits[s] if limits[s] > 0 else np.full((num + 1, num + 1), math.inf)
        ratio[~needs.valid(s)] = math.inf
        joined = np.maximum(best[:, None], ratio)  # [i, j]: stage s holds [i, j) after the best of [0, i)
        cuts.append(np.argmin(joined, axis=0))
        best = joined.min(axis=0)
    if not math.isfinite(best[num]):
        return None
    split, j = [], num
    for s in reversed(range(stages)):
        i = int(cuts[s][j])
        split.append((s, i, j))
        j = i
    s, i, j = max(split, key=lambda b: needs.at(*b).total / limits[b[0]])
    need = needs.at(s, i, j)
    return StaticNeed(stage=s, start=i, end=j, need_bytes=int(math.ceil(need.total)), limit_bytes=int(limits[s]),
                      cap_bytes=setup.pipeline.mem_caps_bytes[s], terms=_terms(need, needs.chain.stages[s].in_flight))


class Needs:
    """need_s(i, j) of the module's text for every stage s and range [i, j), as (L+1) x (L+1) arrays
    indexed [i, j]: what a range holds whatever stage holds it, grown a layer at a time with the
    stage accumulator's rules (costmodel.StageRun: ZeRO 1's whole tensors, the step's scratch), and
    what each stage's first and last layer and its position add (the edges read once a layer)."""

    def __init__(self, chain: Chain, deadline: Deadline | None = None):
        self.chain = chain
        setup, ctx = chain.setup, chain.ctx
        num, stages = len(chain), len(chain.stages)
        least_kept = [costmodel.least_kept_bytes(layer, ctx) for layer in chain.layers]  # TE's window: 0
        static = [costmodel.layer_value("static", layer, 0, ctx) for layer in chain.layers]
        shape = (num + 1, num + 1)
        self.held, self.static, self.kept, self.late_grad, self.scratch = (np.zeros(shape) for _ in range(5))
        for i in range(num):
            if deadline is not None:
                deadline.check()
            run = costmodel.StageRun(setup, chain.profile.device.type)
            kept = late_grad = layers_static = 0.0
            for j in range(i + 1, num + 1):
                m = j - 1
                run.add(time_ms=0.0, held_bytes=chain.static[m], step_ms=0.0, host_bytes=0.0, params=chain.params[m],
                        largest_params=chain.largest[m], scratch_bytes=chain.step_scratch[m], numels=chain.numels[m])
                kept += least_kept[m]
                late_grad += chain.late_grad[m]
                layers_static += static[m]
                held = run.held_bytes  # with ZeRO 1's whole tensors: optimizer state
                self.held[i, j], self.static[i, j] = held, layers_static + held - run.layers_held_bytes
                self.kept[i, j], self.late_grad[i, j], self.scratch[i, j] = kept, late_grad, run.step_scratch_bytes
        self.edges = [self._edges(s) for s in range(stages)]

    def _edges(self, s: int) -> dict[str, np.ndarray]:
        """Stage s's edges: what opening at layer i ([i, :]) and closing before layer j ([:, j]) add."""
        chain, num = self.chain, len(self.chain)
        opening = [chain.opening_bytes(s, i) for i in range(num)] + [(0.0, 0.0)]
        closing = [(0.0, 0.0)] + [chain.closing_bytes(s, j) for j in range(1, num + 1)]
        open_end = [chain._end(costmodel.opening_end_bytes, i, s) for i in range(num)] + [0.0]
        close_end = [0.0] + [chain._end(costmodel.closing_end_bytes, j - 1, s) for j in range(1, num + 1)]
        column, row = (lambda v: np.array(v, dtype=float)[:, None]), (lambda v: np.array(v, dtype=float)[None, :])
        return {"kept": (column([o[0] for o in opening]), row([c[0] for c in closing])),
                "held": (column([o[1] for o in opening]), row([c[1] for c in closing])),
                "end": (column(open_end), row(close_end))}

    def valid(self, s: int) -> np.ndarray:
        """[i, j]: stage s may hold [i, j) (each stage before it a layer, each after it one)."""
        num, stages = len(self.chain), len(self.chain.stages)
        i, j = np.indices((num + 1, num + 1))
        return (i < j) & (i >= s) & (num - j >= stages - 1 - s) & ((i == 0) if s == 0 else True)

    def _parts(self, s: int, index=...) -> _Need:
        stage = self.chain.stages[s]
        # the edges as [i, j] arrays (opening at i as a column, closing before j as a row), or at (i, j)
        edges = {name: (opening + closing)[index] if index is ... else opening[index[0], 0] + closing[0, index[1]]
                 for name, (opening, closing) in self.edges[s].items()}
        late_grad = self.late_grad[index]
        # the lazy gradients above the activations (one_chunk_gradients_above) shrink as kept grows: at least what
        # they are under unbounded kept bytes (all of them in 1F1B's steady state, else none), linear in them
        above = costmodel.one_chunk_gradients_above(1.0, stage=s, kept=math.inf,
                                                    pipeline=self.chain.setup.pipeline) * late_grad
        # the transient at least the loss's scratch on its floor (FSDP2's shards absent: dpmoments.floor)
        floor = 0.0
        if self.chain.fsdp is not None and self.chain.fsdp.warm_only(s):
            prefix = np.array(self.chain.fsdp.prefix)
            floor = -(prefix[None, :] - prefix[:, None])[index]
        return _Need(held=self.held[index] + edges["held"], static=self.static[index], late_grad=late_grad,
                     activations=stage.in_flight * (self.kept[index] + edges["kept"])
                     + stage.loss_scratch_bytes + floor + above,
                     scratch=self.scratch[index], end=edges["end"])

    def totals(self, s: int) -> np.ndarray:
        need = self._parts(s)
        return need.held - need.late_grad + np.maximum(np.maximum(need.activations, need.scratch), need.end)

    def at(self, s: int, i: int, j: int) -> _Need:
        need = self._parts(s, (i, j))
        return _Need(*(float(v) for v in dataclasses.astuple(need)))


def range_needs(chain: Chain, deadline: Deadline | None = None) -> Needs:
    return Needs(chain, deadline)


def _terms(need: _Need, in_flight: int) -> dict[str, int]:
    """The need by what takes it: held all iteration, then the moment that sets it."""
    terms = {"weights, grads, optimizer state": need.static, "buffers": need.held - need.static}
    if need.late_grad:
        terms["less the whole gradients gone by the peak"] = -need.late_grad
    moment = max(need.activations, need.scratch, need.end)
    if moment == need.activations:
        terms[f"activations x {in_flight} microbatches, every layer at its leanest option"] = need.activations
    elif moment == need.scratch:
        terms["optimizer step scratch"] = need.scratch
    else:
        terms["kept to the step's end"] = need.end
    return {name: int(round(value)) for name, value in terms.items()}
