"""A stage's reserved peak from the replay that orders its runtime's step: FSDP2's
(planner/cost/reserve_fsdp2.py), Megatron-LM's (planner/cost/reserve_megatron.py) or ckplan's own
(planner/cost/reserve.py); else the cost model's (the divisor). The fit is that replay's under the cap,
with torch's out-of-memory path (planner/cost/capped_reserve.py). Nothing here reads a file or prints."""

from __future__ import annotations

import functools
from collections.abc import Callable

from planner import collector
from planner.cost import (
    capped_reserve,
    loss_records,
    reserve,
    reserve_deepspeed,
    reserve_fsdp2,
    reserve_megatron,
    reserve_megatron_chunks,
    reserve_megatron_fsdp,
    runtimes,
)
from planner.cost.allocator import Replayed
from planner.cost.assembly import StageCost
from planner.cost.replay_memo import remembered, stage_key
from planner.schema import OPTION_NONE, OPTION_OFFLOAD, Profile, StagePlan, TrainSetup


def with_replayed_reserve(cost: StageCost, plan: StagePlan, index: int, *, profile: Profile,
                          setup: TrainSetup) -> StageCost:
    """`cost` with its reserved peak from the replay where one runs (cuda, no --fragmentation stated:
    FSDP2's step where reserve_fsdp2.replays says it orders the runtime's; Megatron-LM's where
    reserve_megatron.replays does, or Megatron-FSDP's where reserve_megatron_fsdp.replays does; else ckplan's step where the
    runtime's record says so, records for every layer's option, one chunk per rank), under the cap
    (capped_reserve.under_cap); else as it was (the divisor)."""
    if cost.reserved_bytes is None or setup.pipeline.fragmentation is not None:
        return cost
    with collector.paused():  # the replay's events and blocks: planner/collector.py
        return _with_replayed(cost, plan, index, profile=profile, setup=setup)


def _with_replayed(cost: StageCost, plan: StagePlan, index: int, *, profile: Profile, setup: TrainSetup) -> StageCost:
    found = _replay_of(cost, plan, index, profile=profile, setup=setup)
    if found is None:
        return cost
    play, reserved_of, *held = found
    replayed = play(None)
    if replayed is None:
        return cost
    return capped_reserve.under_cap(cost, replayed, play=play, reserved_of=reserved_of, held=held[0] if held else None)


def replays(setup: TrainSetup) -> bool:
    """Whether a replay orders the setup's step, so that evaluate() judges a cuda stage by its replayed reserve
    (with_replayed_reserve's routes; a stage whose layers lack the records an option needs keeps the divisor's):
    FSDP2's, Megatron-FSDP's, DeepSpeed's ZeRO 3, Megatron-LM's, or ckplan's own step where the runtime's record
    says so and each rank runs one chunk (reserve.replay_stage); none where --fragmentation is stated."""
    if setup.pipeline.fragmentation is not None:
        return False
    return (reserve_fsdp2.replays(setup) or reserve_megatron_fsdp.replays(setup) or reserve_deepspeed.replays(setup)
            or reserve_megatron.replays(setup)
            or (runtimes.of(setup.training).step_replayed and setup.pipeline.chunks == 1))


def _replay_of(cost: StageCost, plan: StagePlan, index: int, *, profile: Profile, setup: TrainSetup
               ) -> tuple[Callable[[int | None], Replayed | None], Callable[[Replayed], int]] | tuple | None:
    """The replay that orders the stage's step, as a function of the bytes the allocator may reserve (None: no
    cap), and how a replay makes its reserved peak, then (ckplan's step) the most bytes its sequence holds live at
    once (capped_reserve.under_cap's `held`); None where no replay orders it."""
    if reserve_fsdp2.replays(setup):  # FSDP2's step, on its streams
        # The replay with the optimizer's state made at the first step and the loss's scratch as its tensors,
        # under the allocator the launch ran, is within 10% of every published torchtitan reserve it orders
        # but M17's, whose allocated peak is itself 26% short (docs/published-runs.md §15.ttalloc): the
        # fragmentation margin is retired where it runs.
        expandable = reserve_fsdp2.expandable_segments(profile, setup)
        key = stage_key(reserve_fsdp2.replay, plan, cost, index, profile=profile, setup=setup) + (expandable,)
        stage = functools.cache(lambda: reserve_fsdp2.stage_of(plan, cost, stage=index, profile=profile, setup=setup))
        return (lambda cap: remembered(key + (cap,), lambda: reserve_fsdp2.replay(stage(), expandable=expandable,
                                                                                  cap_bytes=cap)),
                lambda replayed: reserve_fsdp2.reserved_bytes(replayed, cost.peak_bytes))
    by_peak: Callable[[Replayed], int] = lambda replayed: reserve.reserved_bytes(replayed, cost.peak_bytes)  # noqa: E731
    route = _other_route(setup)
    if route is None:
        return _own_replay(cost, plan, index, profile=profile, setup=setup, by_peak=by_peak)
    replay, play = route
    key = stage_key(replay, plan, cost, index, profile=profile, setup=setup)
    return (lambda cap: remembered(key + (cap,), lambda: play(plan, cost, index, profile=profile, setup=setup,
                                                              cap_bytes=cap)), by_peak)


def _other_route(setup: TrainSetup) -> tuple[Callable, Callable] | None:
    """The replay of another step than FSDP2's that orders the setup's, as (its function, the key's route; a call of
    it on (plan, cost, index) under a cap); None: ckplan's own, or none."""
    if reserve_megatron_fsdp.replays(setup):  # Megatron-LM's step under Megatron-FSDP's double buffer, one stage
        replay = reserve_megatron_fsdp.replay_stage
        return replay, lambda plan, cost, index, **named: replay(plan, cost, **named)
    if reserve_deepspeed.replays(setup):  # DeepSpeed's ZeRO 3: its coordinator's gathers, buckets and partitions
        replay = reserve_deepspeed.replay_stage
        return replay, lambda plan, cost, index, **named: replay(plan, cost, **named)
    if reserve_megatron.replays(setup):  # DDP or the distributed optimizer: its buffers, optimizer and schedule
        if setup.pipeline.chunks > 1:
            replay = reserve_megatron_chunks.replay_rank
            return replay, lambda plan, cost, index, **named: replay(plan, cost, rank=index, **named)
        replay = reserve_megatron.replay_stage
        return replay, lambda plan, cost, index, **named: replay(plan, cost, stage=index, **named)
    return None


def _own_replay(cost: StageCost, plan: StagePlan, index: int, *, profile: Profile, setup: TrainSetup, by_peak):
    """ckplan's own step's replay (reserve.replay_stage, remembered there by its events' inputs) and its floor."""
    if not runtimes.of(setup.training).step_replayed:
        return None
    by_name = {layer.name: layer for layer in profile.layers}
    from planner.cost import layers as layer_numbers
    from planner.cost import warmupsend

    held = warmupsend.held_send_outputs(index, setup)
    if held and plan.layers:
        last = next(layer for layer in layer_numbers.layer_costs(profile) if layer.name == plan.layers[-1])
        held *= last.output_bytes
    memory = reserve.StageMemory(cost.static_bytes, cost.buffer_bytes, cost.step_scratch_bytes,
                                 held_send_bytes=held if plan.layers else 0)
    options = [plan.option(name) for name in plan.layers]
    rate = reserve.host_copy_ms_per_byte(profile, setup) if OPTION_OFFLOAD in options else None
    expandable = reserve_fsdp2.expandable_segments(profile, setup)
    layers, loss = [by_name[name] for name in plan.layers], loss_records.stage_loss(profile, setup)
    return (lambda cap: reserve.replay_stage(layers, options, stage=index, setup=setup, memory=memory, loss=loss,
                                             copy_ms_per_byte=rate, expandable=expandable, cap_bytes=cap), by_peak,
            lambda: reserve.held_bytes(layers, options, stage=index, setup=setup, memory=memory, loss=loss,
                                       copy_ms_per_byte=rate))


def reserved_range(cost: StageCost, plan: StagePlan, index: int, *, profile: Profile, setup: TrainSetup
                   ) -> tuple[int, int] | None:
    """The lowest and highest reserved peak of the stage's replay and of its variants (reserved_variants), where
    FSDP2's replay set `cost`'s reserve within the cap; None elsewhere."""
    figures = reserved_variants(cost, plan, index, profile=profile, setup=setup)
    return None if figures is None else (min(cost.reserved_bytes, *figures), max(cost.reserved_bytes, *figures))


def reserved_variants(cost: StageCost, plan: StagePlan, index: int, *, profile: Profile, setup: TrainSetup
                      ) -> list[int] | None:
    """The stage's reserved peak under each of reserve_range.VARIANTS (its large requests a page larger, a page
    smaller), in their order, where FSDP2's replay set `cost`'s reserve (with_replayed_reserve) within the cap; None
    elsewhere (another runtime's replay, the divisor, a capped replay)."""
    from planner.cost.capped_reserve import FITS
    from planner.cost.reserve_range import VARIANTS

    if cost.reserved_by != "replay" or cost.cap_replay != FITS or not reserve_fsdp2.replays(setup):
        return None
    stage = reserve_fsdp2.stage_of(plan, cost, stage=index, profile=profile, setup=setup)
    expandable = reserve_fsdp2.expandable_segments(profile, setup)
    return [reserve_fsdp2.reserved_bytes(reserve_fsdp2.replay(stage, expandable=expandable, perturb=change),
                                         cost.peak_bytes) for change in VARIANTS]


def divisor_reason(plan: StagePlan, index: int, *, profile: Profile, setup: TrainSetup) -> str:
    """Why a cuda stage's reserve is the divisor's (with_replayed_reserve ran no replay for it), in words: the
    setup's (--fragmentation stated, or no replay orders the runtime's step), a layer with no allocation record
    for its option, the last stage with no loss record, or a replay that does not order this shape of schedule."""
    if setup.pipeline.fragmentation is not None:
        return "--fragmentation is stated"
    if not replays(setup):
        return "no replay orders the runtime's step under this schedule"
    by_name = {layer.name: layer for layer in profile.layers}
    for name in plan.layers:
        option = plan.option(name)
        if by_name[name].alloc_records.get(OPTION_NONE if option == OPTION_OFFLOAD else option) is None:
            return f"{name} has no allocation record for its option {option!r}"
    if (index == setup.pipeline.stages - 1 and runtimes.of(setup.training).step_replayed
            and loss_records.stage_loss(profile, setup) is None):
        return "the profile has no allocation record of the loss"
    return "its runtime's replay does not run this stage"
