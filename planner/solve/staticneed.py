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
only add); S: the optimizer step's scratch; end: what the schedule keeps at the step's end. Taking
each layer's least kept bytes gives
    need_s(i, j) = H - G + max(k_s (K_min + E) + loss scratch, S, end)  <=  the peak of every set,
and a min-max partition DP over the cuts finds the split whose largest need_s / limit_s is least
(limit_s: costmodel.limit_bytes, at replayfit.relaxed_caps where the allocator replay judges: rows
that admit every plan the replay admits). Above 1, every split has a stage past its limit under
every checkpoint set: no plan fits. One stage per rank (1F1B, GPipe) only: a chunked schedule's rank
holds stages apart in the model, which no contiguous cut describes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.cost import costmodel
from planner.schema import Profile, TrainSetup
from planner.solve import replayfit
from planner.solve.dpsegments import Chain


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


def least_need(profile: Profile, setup: TrainSetup, chain: Chain | None = None) -> StaticNeed | None:
    """The bound of the module's text at the split that minimises it; None for chunked schedules or
    more stages than layers (no contiguous split of one stage per rank)."""
    stages = setup.pipeline.stages
    if setup.pipeline.chunks > 1 or stages > len(profile.layers):
        return None
    chain = chain or chain_of(profile, setup)
    needs = range_needs(chain)
    limits = [chain.stages[s].cap_bytes for s in range(stages)]
    num = len(chain)

    def ratio(need: _Need, s: int) -> float:
        return need.total / limits[s] if limits[s] > 0 else math.inf

    # best[j]: the least largest ratio of stages 0..s holding layers [0, j); cut[s][j]: where stage s begins
    best = {0: 0.0}
    cuts = []
    for s in range(stages):
        nxt, cut = {}, {}
        for j in range(s + 1, num - (stages - s - 1) + 1):
            for i, before in best.items():
                if i < j and (s, i, j) in needs:
                    value = max(before, ratio(needs[s, i, j], s))
                    if value < nxt.get(j, math.inf):
                        nxt[j], cut[j] = value, i
        best = {j: v for j, v in nxt.items() if s < stages - 1 or j == num}
        cuts.append(cut)
    if num not in best:
        return None
    bounds, j = [], num
    for s in reversed(range(stages)):
        i = cuts[s][j]
        bounds.append((s, i, j))
        j = i
    s, i, j = max(bounds, key=lambda b: ratio(needs[b], b[0]))
    need = needs[s, i, j]
    return StaticNeed(stage=s, start=i, end=j, need_bytes=int(math.ceil(need.total)), limit_bytes=limits[s],
                      cap_bytes=setup.pipeline.mem_caps_bytes[s], terms=_terms(need, chain.stages[s].in_flight))


def range_needs(chain: Chain) -> dict[tuple[int, int, int], _Need]:
    """need_s(i, j) of the module's text for every stage s and range [i, j) (each stage's first layer
    at least s, its last leaving a layer for each stage after it)."""
    setup, ctx = chain.setup, chain.ctx
    stages, num = len(chain.stages), len(chain)
    least_kept = [min(costmodel.layer_value("kept", layer, o, ctx) for o in range(len(layer.options)))
                  for layer in chain.layers]
    static = [costmodel.layer_value("static", layer, 0, ctx) for layer in chain.layers]
    pipeline = setup.pipeline
    found = {}
    for i in range(num):
        run = costmodel.StageRun(setup, chain.profile.device.type)
        kept = late_grad = layers_static = 0.0
        for j in range(i + 1, num + 1):
            m = j - 1
            run.add(time_ms=0.0, held_bytes=chain.static[m], step_ms=0.0, host_bytes=0.0, params=chain.params[m],
                    largest_params=chain.largest[m], scratch_bytes=chain.step_scratch[m])
            kept += least_kept[m]
            late_grad += chain.late_grad[m]
            layers_static += static[m]
            whole = run.held_bytes - run.layers_held_bytes  # ZeRO 1's whole tensors: optimizer state
            for s in range(min(i, stages - 1) + 1):  # stage s opens at layer s or later
                if num - j < stages - 1 - s:  # a layer left for each stage after it
                    continue
                open_kept, open_held = chain.opening_bytes(s, i)
                close_kept, close_held = chain.closing_bytes(s, j)
                stage = chain.stages[s]
                # the lazy gradients above the activations (one_chunk_gradients_above) shrink as kept grows: at
                # least what they are under unbounded kept bytes (all of them in 1F1B's steady state, else none)
                above = costmodel.one_chunk_gradients_above(late_grad, stage=s, kept=math.inf,
                                                            pipeline=pipeline) if late_grad else 0.0
                found[s, i, j] = _Need(
                    held=run.held_bytes + open_held + close_held, static=layers_static + whole, late_grad=late_grad,
                    activations=stage.in_flight * (kept + open_kept + close_kept) + stage.loss_scratch_bytes + above,
                    scratch=run.step_scratch_bytes, end=chain.end_bytes(s, i, j))
    return found


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
