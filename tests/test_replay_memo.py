"""A stage's replay remembered by its inputs (planner/cost/reserve.py replay_stage) and the floor under any capped
replay (allocator.held_peak, capped_reserve.under_cap's `held`): what the solvers get is what a fresh replay
gives, to the byte, and a capped replay is skipped only where it fails."""

import random

import pytest

from planner.cost import allocator, capped_reserve, costmodel, reserve
from planner.cost.allocator import Alloc, Free, Ready, Sync, replay
from planner.cost.reserve import StageMemory, replay_stage, stage_events
from planner.models.synthetic import uniform_blocks
from planner.schema import AllocRecord, DeviceInfo, TrainSetup

MIB = 2**20
GIB = 2**30

RECORD = AllocRecord(forward=[8 * MIB, 4 * MIB, -2, 16 * MIB], backward=[6 * MIB, -1], output=3, input_grad=4,
                     params=[12 * MIB])
LOSS = AllocRecord(forward=[512, 4 * MIB, -2], backward=[2 * MIB], output=1, input_grad=3)


def _forget():
    for memo in (reserve._REPLAYED, reserve._HELD, reserve._EVENTS):
        memo.clear()


def _profile(layers=6, record=RECORD):
    profile = uniform_blocks(layers)
    made = [layer.model_copy(update={"alloc_records": {"none": record.model_copy(deep=True),
                                                       "full": record.model_copy(deep=True)}})
            for layer in profile.layers]
    return profile.model_copy(update={"layers": made, "device": DeviceInfo(type="cuda", name="test gpu"),
                                      "loss_alloc": LOSS})


def _fresh(layers, options, *, stage, setup, memory, loss, rate=None, cap=None):
    """replay_stage's figure made the long way: stage_events, then allocator.replay, nothing remembered."""
    from planner.cost.fsdp2_layers import replayed_microbatches
    from planner.cost.schedules import build_schedule

    pipeline = setup.pipeline
    order = build_schedule(pipeline.schedule, num_ranks=pipeline.stages,
                           num_microbatches=replayed_microbatches(pipeline, stage))
    records = reserve.records_for(layers, options)
    events = stage_events(layers, options, records, actions=[(a.kind, a.microbatch) for a in order.actions[stage]],
                          memory=memory, num_microbatches=pipeline.microbatches,
                          loss=loss if stage == pipeline.stages - 1 else None, copy_ms_per_byte=rate)
    return replay(events, cap_bytes=cap), events


@pytest.mark.parametrize("schedule", ["1F1B", "GPipe"])
def test_a_remembered_replay_is_the_fresh_one_for_every_stage_option_and_cap(schedule):
    _forget()
    profile = _profile()
    setup = TrainSetup(stages=2, microbatches=4, micro_batch_size=1, mem_caps_bytes=[80 * GIB] * 2, schedule=schedule)
    memory = StageMemory(static_bytes=96 * MIB, buffer_bytes=32 * MIB, scratch_bytes=24 * MIB)
    rng = random.Random(7)
    for trial in range(24):
        stage = trial % 2
        layers = profile.layers[:3] if stage == 0 else profile.layers[3:]
        options = [rng.choice(["none", "full", "offload"]) for _ in layers]
        rate = rng.choice([None, 1e-6])
        cap = rng.choice([None, 60 * MIB, 200 * MIB])
        want, _ = _fresh(layers, options, stage=stage, setup=setup, memory=memory, loss=LOSS, rate=rate, cap=cap)
        for _ in range(2):  # made, then remembered
            got = replay_stage(layers, options, stage=stage, setup=setup, memory=memory, loss=LOSS,
                               copy_ms_per_byte=rate, cap_bytes=cap)
            assert got == want


def test_what_the_events_read_is_what_the_memo_tells_apart():
    """A record changed in place, a layer's time (offload's copies are timed by it), the memory, the rate: each
    gives the fresh replay's figure, not the remembered one."""
    _forget()
    profile = _profile(layers=4)
    setup = TrainSetup(stages=2, microbatches=4, micro_batch_size=1, mem_caps_bytes=[80 * GIB] * 2)
    layers, options = profile.layers[-2:], ["offload", "none"]
    memory = StageMemory(static_bytes=0, buffer_bytes=0, scratch_bytes=0)

    def both(layers, memory=memory, rate=1e-6):
        got = replay_stage(layers, options, stage=1, setup=setup, memory=memory, loss=LOSS, copy_ms_per_byte=rate)
        want, _ = _fresh(layers, options, stage=1, setup=setup, memory=memory, loss=LOSS, rate=rate)
        assert got == want
        return got

    first = both(layers)
    layers[0].alloc_records["none"].forward[0] = 40 * MIB  # in place: the same objects, other content
    assert both(layers) != first
    slower = [layers[0].model_copy(update={"fwd_ms": 1e4, "bwd_ms": 1e4}), layers[1]]
    both(slower)
    both(layers, memory=StageMemory(static_bytes=64 * MIB, buffer_bytes=0, scratch_bytes=0))
    both(layers, rate=None)


def _random_events(rng: random.Random, count: int) -> list:
    events, live, waiting = [], [], []
    for n in range(count):
        roll = rng.random()
        if live and roll < 0.4:
            key = live.pop(rng.randrange(len(live)))
            deferred = rng.random() < 0.2
            events.append(Free(key, deferred=deferred))
            if deferred:
                waiting.append(key)
        elif waiting and roll < 0.45:
            events.append(Ready(waiting.pop(0)))
        elif roll < 0.47:
            events.append(Sync())
            waiting = []
        else:
            size = rng.choice([rng.randrange(1, 4096), rng.randrange(1, 2 * MIB), rng.randrange(MIB, 12 * MIB),
                               rng.randrange(10 * MIB, 64 * MIB)])
            events.append(Alloc(("r", n), size, rng.choice([0, 0, 0, 1])))
            live.append(("r", n))
    return events


def _held_by_hand(events) -> int:
    """The floor by brute force: after each event, the rounded sizes of the allocations not yet freed, summed."""
    peak = 0
    for end in range(len(events) + 1):
        freed = {e.key for e in events[:end] if isinstance(e, Free)}
        peak = max(peak, sum(allocator.block_bytes(e.nbytes) for e in events[:end]
                             if isinstance(e, Alloc) and e.key not in freed))
    return peak


@pytest.mark.parametrize("seed", range(6))
def test_the_held_floor_is_under_every_replay_and_a_cap_below_it_fails(seed):
    rng = random.Random(seed)
    events = _random_events(rng, 120)
    held = allocator.held_peak(events)
    assert held == _held_by_hand(events)
    for expandable in (False, True):
        free = replay(events, expandable=expandable)
        assert free.allocated_peak_bytes >= held and free.oom is None
        for cap in (held - 1, held // 2, held - 512):
            assert replay(events, expandable=expandable, cap_bytes=cap).oom is not None
        for cap in (held, free.reserved_peak_bytes, held + 64 * MIB):  # at or above it: the replay decides
            capped = replay(events, expandable=expandable, cap_bytes=cap)
            assert capped.oom is None or capped.reserved_peak_bytes >= held


def test_a_plan_over_its_cap_scores_the_same_with_the_floor_as_with_the_capped_replay(monkeypatch):
    """evaluate() on plans whose stages pass the cap: the floor's verdict where it skips the capped replay equals the
    capped replay's (cap_replay, reserves, fits), stage by stage."""
    profile = _profile(layers=8)
    scored = {}
    for cap_mib in (2000, 2600, 2900, 3200, 3600):
        setup = TrainSetup(stages=2, microbatches=4, micro_batch_size=1, mem_caps_bytes=[cap_mib * MIB] * 2)
        for ckpt in ([False] * 8, [True] * 8):
            stages = costmodel.split_to_stages([0, 4], ckpt, profile)
            _forget()
            scored[cap_mib, tuple(ckpt), "floor"] = costmodel.evaluate(stages, profile, setup).stages
    skipped = []
    original = capped_reserve.under_cap

    def without_floor(cost, replayed, *, play, reserved_of, held=None):
        if held is not None and (floor := held()) is not None:
            skipped.append(floor)
        return original(cost, replayed, play=play, reserved_of=reserved_of)

    monkeypatch.setattr(capped_reserve, "under_cap", without_floor)
    for (cap_mib, ckpt, _), stages_with_floor in list(scored.items()):
        setup = TrainSetup(stages=2, microbatches=4, micro_batch_size=1, mem_caps_bytes=[cap_mib * MIB] * 2)
        _forget()
        plan = costmodel.split_to_stages([0, 4], list(ckpt), profile)
        assert costmodel.evaluate(plan, profile, setup).stages == stages_with_floor
    assert skipped  # the floor was asked of some stage past its cap
    verdicts = {stage.cap_replay for stages in scored.values() for stage in stages}
    assert verdicts == {capped_reserve.OOM, capped_reserve.RETRIED, capped_reserve.FITS}


def test_the_collector_is_paused_inside_and_as_it_was_after():
    import gc

    from planner import collector

    assert gc.isenabled()
    with collector.paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector.paused():
        raise RuntimeError("a replay that fails")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector.paused():
            pass
        assert not gc.isenabled()  # a caller that paused it keeps it paused
    finally:
        gc.enable()
