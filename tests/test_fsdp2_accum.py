"""The caching allocator's replay of FSDP2's step with gradient accumulation and no pipeline
(planner/cost/fsdp2_accum.py): torchtitan's train loop at PP 1, every microbatch's backward reduce-scattering into
the sharded gradients the first one made; the two-unit stage of test_reserve_fsdp2.py counted by hand; one
microbatch unchanged; the plan's reserve taken from it (reserved_by replay), in the cost model and the CLI."""

import dataclasses
import json

import pytest
from test_reserve_fsdp2 import GIB, LAYER, MIB, STAGE, _allocs, _titan

from planner.cost import allocator, costmodel, fsdp2_accum, reserve_fsdp2
from planner.cost.allocator import Alloc, Free
from planner.cost.fsdp2_accum import Fsdp2Accumulated, accumulated_events
from planner.cost.fsdp2_events import DEFAULT, REDUCE_SCATTER, Fsdp2Stage, step_events
from planner.models.synthetic import uniform_blocks

ACCUM = "2c8b5947"  # a torchtitan that accumulates at PP 1 (9dec370 runs one batch a step: runnable)


def test_one_microbatch_is_the_one_microbatch_step():
    assert accumulated_events(Fsdp2Accumulated(STAGE, 1)) == step_events(STAGE)


def test_later_microbatches_add_into_the_sharded_gradients_the_first_made():
    """zero_grad once; the first microbatch's reduce-scatter outputs are the sharded gradients; the second's are
    made on the reduce-scatter stream and freed at once (added into them); the optimizer step once, at the end."""
    events = accumulated_events(Fsdp2Accumulated(STAGE, 2), steps=1)
    assert _allocs(events, REDUCE_SCATTER) == [(("sharded_grad", 1), 12), (("sharded_grad", 0), 12),
                                               (("reduce_output", 1, 1), 12), (("reduce_output", 1, 0), 12)]
    made = events.index(Alloc(("reduce_output", 1, 1), 12 * MIB, REDUCE_SCATTER))
    assert events[made + 1] == Free(("reduce_output", 1, 1))
    assert [e for e in events if isinstance(e, Free) and e.key[0] == "sharded_grad"] == \
        [Free(("sharded_grad", 0)), Free(("sharded_grad", 1))]  # zero_grad's, before the first forward
    assert events.index(Free(("sharded_grad", 1))) < events.index(Alloc(("kept", 0), 10 * MIB, DEFAULT))
    # both microbatches gather, keep and reduce every unit; AdamW's state once, after the second backward
    assert sum(1 for e in events if isinstance(e, Alloc) and e.key == ("kept", 0)) == 2
    states = [i for i, e in enumerate(events) if isinstance(e, Alloc) and e.key[0] == "state"]
    assert len(states) == 4 and states[0] > made


def test_two_microbatches_counted_by_hand():
    """One microbatch's step reserves 196 MiB and holds 142 at its peak (test_reserve_fsdp2's hand count: in
    unit 0's backward of the second step, the sharded gradient of unit 1 among them). The second microbatch:
    the default stream's requests are the first's, met by the blocks it left cached; unit 1's reduce-scatter
    output finds the reduce-scatter stream's two 12 MiB segments held by the sharded gradients and takes a new
    one (12 MiB, >= kMinLargeAlloc: a segment of its own), freed once added, which unit 0's reuses: 196 + 12 =
    208 MiB. Its peak is that moment again, with unit 0's sharded gradient (12) held from the first
    microbatch besides: 154 MiB. The first step alone (no optimizer state before its end): 148 + 12 = 160 MiB
    reserved, 96 + 10 = 106 allocated, at the second microbatch's unit 0 backward (shards 24, sharded
    gradients 24, unit 0's weight and gradient 24, kept 10, unit 1's reduce-scatter input 24)."""
    once = allocator.replay(accumulated_events(Fsdp2Accumulated(STAGE, 2), steps=1))
    assert (once.allocated_peak_bytes, once.reserved_peak_bytes) == (106 * MIB, 160 * MIB)
    steady = reserve_fsdp2.replay(Fsdp2Accumulated(STAGE, 2))
    assert (steady.allocated_peak_bytes, steady.reserved_peak_bytes) == (154 * MIB, 208 * MIB)
    one = reserve_fsdp2.replay(STAGE)  # one microbatch: the one-microbatch step, as before
    assert (one.allocated_peak_bytes, one.reserved_peak_bytes) == (142 * MIB, 196 * MIB)


# three units of 12, 6 and 30 MiB: reduce-scatter outputs of three sizes, the smallest split from a larger block
UNEVEN = Fsdp2Stage(**{**STAGE.__dict__, "layers": (
    LAYER,
    dataclasses.replace(LAYER, unit=1, gathered=(6 * MIB,), grads=(6 * MIB,), shard=(6 * MIB,), state=(6 * MIB,) * 2),
    dataclasses.replace(LAYER, unit=2, gathered=(30 * MIB,), grads=(30 * MIB,), shard=(30 * MIB,),
                        state=(30 * MIB,) * 2))})


@pytest.mark.parametrize("expandable", [False, True])
def test_three_microbatches_replayed_stand_for_any_number(monkeypatch, expandable):
    """Every microbatch after the second plays from the state the one before left: replaying all of M (up to 8)
    gives the peaks the replay's three give."""
    def peaks(stage, m):
        got = reserve_fsdp2.replay(Fsdp2Accumulated(stage, m), expandable=expandable)
        return got.allocated_peak_bytes, got.reserved_peak_bytes

    for stage in (STAGE, UNEVEN):
        capped = [peaks(stage, m) for m in range(3, 9)]
        monkeypatch.setattr(fsdp2_accum, "REPLAYED_MICROBATCHES", 100)
        assert [peaks(stage, m) for m in range(3, 9)] == capped
        monkeypatch.setattr(fsdp2_accum, "REPLAYED_MICROBATCHES", 3)


def test_the_replay_plays_steps_until_the_cache_settles():
    """A step that raises neither peak ends the replay; on a real stage two steps are not always enough
    (torchtitan b5bcd76c on uniform_blocks(4), the default segments: 1956 MiB after two, 2148 after three)."""
    profile = _cuda(uniform_blocks(4))
    setup = _titan(microbatches=2, runtime_version="b5bcd76c")
    built = _stage(profile, setup)
    by_steps = [allocator.replay(accumulated_events(built, steps=k)).reserved_peak_bytes for k in (2, 3, 6)]
    assert by_steps[0] < by_steps[1] == by_steps[2]
    assert reserve_fsdp2.replay(built).reserved_peak_bytes == by_steps[1]
    for stage in (STAGE, UNEVEN):  # settled at two steps: the replay stops there, as six steps give
        six = allocator.replay(accumulated_events(Fsdp2Accumulated(stage, 2), steps=6))
        got = reserve_fsdp2.replay(Fsdp2Accumulated(stage, 2))
        assert (got.allocated_peak_bytes, got.reserved_peak_bytes) == (six.allocated_peak_bytes, six.reserved_peak_bytes)


def _cuda(profile):
    return profile.model_copy(update={"device": profile.device.model_copy(update={"type": "cuda"}),
                                      "assumptions": {**profile.assumptions, "gpu": "h100"}})


def _stage(profile, setup):
    stages = costmodel.split_to_stages([0], [False] * len(profile.layers), profile)
    cost = costmodel.evaluate(stages, profile, setup).stages[0]
    return reserve_fsdp2.stage_of(stages[0], cost, stage=0, profile=profile, setup=setup)


def test_torchtitan_accumulating_at_one_stage_is_replayed():
    """FSDP2 resharding and reducing every microbatch at PP 1 (torchtitan's default without a pipeline): the
    replay runs, the stage in an Fsdp2Accumulated; one microbatch the one-microbatch stage as before; kept whole
    through the microbatches (per-iteration: torch's pipelining at one stage) the pipeline's driver as before."""
    profile = _cuda(uniform_blocks(4))
    setup = _titan(microbatches=2, runtime_version=ACCUM)
    assert setup.data_parallel.zero_gather == "per-microbatch" and reserve_fsdp2.replays(setup)
    built = _stage(profile, setup)
    assert isinstance(built, Fsdp2Accumulated) and built.microbatches == 2 and built.stage.actions == ()
    assert built.stage == _stage(profile, _titan(runtime_version=ACCUM))  # the same stage as one microbatch's
    stages = costmodel.split_to_stages([0], [False] * len(profile.layers), profile)
    cost = costmodel.evaluate(stages, profile, setup).stages[0]
    replayed = reserve_fsdp2.replay(built, expandable=reserve_fsdp2.expandable_segments(profile, setup))
    assert (cost.reserved_by, cost.reserved_bytes) == ("replay", reserve_fsdp2.reserved_bytes(replayed, cost.peak_bytes))
    kept_whole = _titan(microbatches=2, zero_gather="per-iteration", runtime_version=ACCUM)
    assert not isinstance(_stage(profile, kept_whole), Fsdp2Accumulated)
    assert not reserve_fsdp2.replays(_titan(microbatches=2, zero=1, runtime_version=ACCUM))  # no sharding: the divisor, as before


def test_evaluate_prints_the_replayed_reserve_for_two_microbatches(tmp_path):
    """`ckplan evaluate` of a two-microbatch FSDP2 plan under torchtitan at PP 1: reserved_by replay, the figure
    the cost model gives."""
    from fixtures.cli import run_ok

    from planner import io

    profile = _cuda(uniform_blocks(4))
    path = tmp_path / "cuda.json"
    io.save_profile(profile, path)
    out = run_ok("evaluate", "--profile", path, "--layers-per-stage", str(len(profile.layers)), "--ckpt-per-stage", "0",
                 "--dp", "4", "--zero", "3", "--microbatches", "2", "--mem", "80GB", "--precision", "bf16-mixed",
                 "--runtime", "torchtitan", "--runtime-version", ACCUM, "--json")
    stage = json.loads(out.stdout)["hand"]["stages"][0]
    stages = costmodel.split_to_stages([0], [False] * len(profile.layers), profile)
    cost = costmodel.evaluate(stages, profile, _titan(microbatches=2, runtime_version=ACCUM)).stages[0]
    assert (stage["reserved_by"], stage["reserved_bytes"]) == ("replay", cost.reserved_bytes)
    assert stage["reserved_bytes"] >= stage["peak_bytes"]
    assert stage["reserved_bytes"] > costmodel.evaluate(stages, profile, _titan(runtime_version=ACCUM)).stages[0].reserved_bytes
    assert GIB > stage["reserved_bytes"] - cost.peak_bytes  # the replay's, not the margin's
