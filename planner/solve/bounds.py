"""Proven lower bounds on what any plan of a setup costs, computed before a solve: the whole-job
search (jobsearch.py) rules a configuration out on memory without solving it, and solves the
rest in the order of their time bound, stopping once the bound passes the best found.

Each bound reads the cost model's own per-layer terms (costmodel.layer_value), so it is a bound
on what evaluate() charges; tests/test_search_bounds.py holds every bound under solved values.

Memory: a stage's peak holds its static bytes (weights, gradients, optimizer state: the same
under every recompute option) and, one chunk a rank (1F1B, GPipe), at least one microbatch's kept
activations; the busiest stage holds at least the mean,
    max_s peak_s >= (sum_l static_l + K) / P,
    K = sum_l min_o kept_l,o + P (min open edge + min close edge) + sum_s kept constant_s
(the edges: what opening and closing a stage adds to its kept bytes, at their least over the
layers; K is 0 for chunked schedules), and no plan fits where that mean exceeds the largest
allocated peak any stage may reach (costmodel.limit_bytes: the card less NCCL's buffers and the
allocator's margin; where the allocator replay judges, at replayfit.relaxed_caps: the card less the buffers,
which every plan the replay admits meets). With one stage the bound is the single stage's static bytes plus its
activations at their cheapest options.

Time, one chunk a rank (1F1B, GPipe): evaluate() charges
    T = sum_s busy_s + (M - 1) max_s busy_s + max_s step_s,
busy_s at least its layers' compute at their cheapest option (recompute only adds) plus the
stage's own constant terms, the slowest stage at least the mean and the slowest step at least
the mean step, so
    T >= W + (M - 1) W / P + sum_l step_l / P,   W = sum_l min_o time_l,o + sum_s const_s.
Chunked schedules (simulated): each rank runs its share of M microbatches' work one action at a
time, then its optimizer step, the busiest at least the mean: T >= (M W + sum_l step_l) / P; under a
split backward a layer's time at least its cheapest option's with its passes' extra where that extra
is below nothing (splittime). Under interleaved 1F1B rank r also waits for one microbatch's forward
through stages 0..r-1 before its first action and, its last action a backward of stage r, for that
microbatch's backward through them after it: T >= M R_r + a_r, a_r the r cheapest layers' time
(r non-empty stages), so T >= (M W + sum_{r<P} a_r) / P.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from planner.cost import costmodel, splittime, termvalues
from planner.schema import CHUNKED_SCHEDULES, SPLIT_BACKWARD_SCHEDULES, Profile, TrainSetup
from planner.solve import replayfit


@dataclass(frozen=True)
class Bounds:
    time_ms: float  # no plan of the setup is faster
    static_bytes: float  # the busiest stage holds at least this (static bytes and kept activations)
    limit_bytes: int  # the largest allocated peak any stage may reach

    @property
    def memory_excess_bytes(self) -> float:
        """How far the memory bound is past the limit (> 0: nothing fits)."""
        return self.static_bytes - self.limit_bytes


def kinds(profile: Profile) -> list[tuple[costmodel.LayerCost, int]]:
    """The profile's layers as (one representative, how many), layers with equal numbers taken
    once: the bounds read each distinct layer once, not 128 times."""
    counts: dict = {}
    for layer in costmodel.layer_costs(profile):
        key = dataclasses.replace(layer, name="")
        if key in counts:
            counts[key][1] += 1
        else:
            counts[key] = [layer, 1]
    return [(layer, count) for layer, count in counts.values()]


def setup_bounds(profile: Profile, setup: TrainSetup, layers: list[tuple[costmodel.LayerCost, int]] | None = None,
                 *, timed: bool = True) -> Bounds:
    """The memory and time lower bounds of every plan of `setup` (see the module's text). `timed` False: the
    memory bound alone (time_ms nan; the two share no term, so its memory fields are the timed call's)."""
    layers = layers if layers is not None else kinds(profile)
    memory = _memory_bounds(profile, setup, layers)
    if not timed:
        return memory
    ctx = costmodel.Context(profile, setup)
    # a layer's terms read the pipeline of P·V stages, as evaluate() gives them (costmodel.stages_view): the
    # setup's own P ranks read as stages // chunks ranks, none where V exceeds P (a tied layer's sum)
    of_layer = costmodel.Context(profile, costmodel.stages_view(setup, costmodel.schedule_of(setup)))
    stages, microbatches = setup.pipeline.stages, setup.pipeline.microbatches
    step = compute = 0.0
    cheapest: list[tuple[float, int]] = []  # (a layer's least time, how many such layers)
    for layer, count in layers:
        options = range(len(layer.options))
        step += count * min(termvalues.layer_values("step", layer, options, of_layer))
        times = termvalues.layer_values("time", layer, options, of_layer)  # layer_value's, each option
        least = min(times[o] + _split_extra_floor(layer, o, of_layer) for o in options)
        compute += count * least
        cheapest.append((least, count))
    constant = sum(costmodel.stage_value(q, s, ctx) for s in range(stages) for q in ("time", "comm"))
    work = compute + constant
    if setup.pipeline.schedule in CHUNKED_SCHEDULES:
        time_ms = microbatches * work / stages + max(step, _fill_and_drain(cheapest, setup)) / stages
    else:
        time_ms = work + (microbatches - 1) * work / stages + step / stages
    return dataclasses.replace(memory, time_ms=max(0.0, time_ms))


def _memory_bounds(profile: Profile, setup: TrainSetup, layers: list[tuple[costmodel.LayerCost, int]]) -> Bounds:
    """setup_bounds' memory fields: the static and kept bytes (TE's window keeps 0 of an offloaded layer) against
    the limit, both with the cuBLAS workspaces every rank keeps, as evaluate's allocated peak and its limit hold
    them; time_ms nan."""
    ctx = costmodel.Context(profile, setup)
    of_layer = costmodel.Context(profile, costmodel.stages_view(setup, costmodel.schedule_of(setup)))
    static = kept = 0.0
    for layer, count in layers:
        static += count * costmodel.layer_value("static", layer, 0, of_layer)
        kept += count * costmodel.least_kept_bytes(layer, of_layer)
    cublas = costmodel.cublas_workspaces_bytes(ctx)
    rows = _rows_context(profile, setup, ctx)  # once: the replay's relaxed caps read every rank's buffers
    limit = max(costmodel.limit_bytes(s, rows) for s in range(setup.pipeline.stages)) + cublas
    held = static + (0.0 if setup.pipeline.schedule in CHUNKED_SCHEDULES else max(0.0, _activations(kept, layers, ctx)))
    return Bounds(time_ms=math.nan, static_bytes=held / setup.pipeline.stages + cublas, limit_bytes=limit)


def _fill_and_drain(cheapest: list[tuple[float, int]], setup: TrainSetup) -> float:
    """Σ_r a_r of the module's text, under interleaved 1F1B (a rank r holds stages r, r + P, ...; no split
    backward): rank r starts no sooner than one microbatch's forward through stages 0..r-1 and, its last action
    being a backward of stage r, ends no later than that microbatch's backward through them before the
    iteration does; those r stages are r contiguous, non-empty runs of layers, at least the r cheapest layers.
    0 for the other chunked schedules (a split backward's or a V's last action need not be stage r's)."""
    if setup.pipeline.schedule != "interleaved-1F1B":
        return 0.0
    ranks, total, taken, prefix = setup.pipeline.stages, 0.0, 0, 0.0
    for least, count in sorted(cheapest):
        for _ in range(min(count, ranks - 1 - taken)):
            taken += 1
            prefix += least
            total += prefix  # a_taken: the `taken` cheapest layers
    return total


def _rows_context(profile: Profile, setup: TrainSetup, ctx: costmodel.Context) -> costmodel.Context:
    """The context whose rows hold every plan evaluate() admits: where the allocator replay judges, the rows at
    replayfit.relaxed_caps (the cap less the buffers, not the divisor's margin); else the setup's own."""
    relaxed = replayfit.relaxed_caps(profile, setup)
    if relaxed is None:
        return ctx
    pipeline = setup.pipeline.model_copy(update={"mem_caps_bytes": relaxed})
    return costmodel.Context(profile, setup.model_copy(update={"pipeline": pipeline}))


def _split_extra_floor(layer: costmodel.LayerCost, option: int, ctx) -> float:
    """The least a split backward (ZB, ZBV, DualPipeV) adds to the layer's time on any stage: its passes'
    extra past the first stage (splittime.layer_extra_ms), nothing on the first; 0 where the extra is
    above nothing, the extra where the recorded pair came out under the full backward."""
    if ctx.setup.pipeline.schedule not in SPLIT_BACKWARD_SCHEDULES:
        return 0.0
    return min(0.0, splittime.layer_extra_ms(layer, option, ctx.setup))


def _activations(kept: float, layers: list[tuple[costmodel.LayerCost, int]], ctx) -> float:
    """K of the module's text: the stages' kept bytes together, at least."""
    stages = ctx.setup.pipeline.stages
    edges = sum(min(costmodel.edge_value("kept", where, layer, s, ctx) for layer, _ in layers
                    for s in range(stages)) for where in ("open", "close"))
    return kept + stages * edges + sum(costmodel.stage_value("kept", s, ctx) for s in range(stages))
