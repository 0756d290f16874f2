"""A stage's reserved peak from the caching allocator's replay (planner/cost/reserve.py): the
event sequence a stage's step makes from its layers' records, counted by hand, and the plan's
reserve taken from it where the profile has records (the divisor where it has none)."""

import pytest
from fixtures.cli import run_ok

from planner import io
from planner.cost import costmodel
from planner.cost.allocator import Alloc, Free, Ready, replay
from planner.cost.reserve import StageMemory, stage_events
from planner.models.synthetic import uniform_blocks
from planner.schema import AllocRecord, DeviceInfo, TrainSetup

MIB = 2**20
GIB = 2**30

# forward: kept 8 MiB (id 1), a 4 MiB scratch (2) freed, the 16 MiB output (3); backward: the
# input's 6 MiB gradient (4), then the kept tensor freed. One 12 MiB parameter.
RECORD = AllocRecord(forward=[8 * MIB, 4 * MIB, -2, 16 * MIB], backward=[6 * MIB, -1], output=3, input_grad=4,
                     params=[12 * MIB])


class _Layer:  # what stage_events reads of a LayerProfile
    input_in_act_bytes = 0
    fwd_ms = bwd_ms = 0.0
    recompute_options = ()


def test_one_layer_one_microbatch_as_events_and_peaks_by_hand():
    memory = StageMemory(static_bytes=48 * MIB, buffer_bytes=16 * MIB, scratch_bytes=12 * MIB)
    events = stage_events([_Layer()], ["none"], [RECORD], actions=[("F", 0), ("B", 0)], memory=memory,
                          num_microbatches=1, loss=None)
    assert [e for e in events if not (isinstance(e, Alloc) and e.nbytes == 0)] == [
        # static: 48 MiB, four copies of the 12 MiB parameter: weight, gradient, then the receive
        # buffer, then Adam's two states
        Alloc(("static", 0, 0), 12 * MIB), Alloc(("static", 1, 0), 12 * MIB), Alloc(("buffer", 0), 16 * MIB),
        Alloc(("static", 2, 0), 12 * MIB), Alloc(("static", 3, 0), 12 * MIB),
        # F0
        Alloc((0, 0, 1), 8 * MIB), Alloc((0, 0, 2), 4 * MIB), Free((0, 0, 2)), Alloc((0, 0, 3), 16 * MIB),
        # B0: the output gradient sits in a receive buffer; the output leaves fwd_cache; the input's
        # gradient is sent
        Alloc((0, 0, 4), 6 * MIB), Free((0, 0, 1)), Free((0, 0, 3)), Free((0, 0, 4)),
        # the optimizer step's scratch
        Alloc(("scratch", 0), 12 * MIB), Free(("scratch", 0))]
    got = replay(events)
    # static: five segments of their own (64 MiB); 8 MiB opens a 20 MiB segment whose remainder
    # serves the 4 MiB scratch and later the 6 MiB gradient; 16 MiB its own segment: 100 MiB.
    # allocated: 64 + 8 + 16 + 6 at B0's start
    assert (got.reserved_peak_bytes, got.allocated_peak_bytes) == (100 * MIB, 94 * MIB)


def test_offload_holds_a_saved_block_until_its_copy_out_is_done():
    memory = StageMemory(static_bytes=0, buffer_bytes=0, scratch_bytes=0)
    events = stage_events([_Layer()], ["offload"], [RECORD], actions=[("F", 0), ("F", 1), ("B", 0), ("B", 1)],
                          memory=memory, num_microbatches=2, loss=None)
    # each forward's kept 8 MiB is freed on the copy stream's terms, ready when its backward begins
    assert events.index(Free((0, 0, 1), deferred=True)) < events.index(Alloc((1, 0, 1), 8 * MIB))
    # (the copy back is allocated before the compute waits for it, which is when the copy out is
    # known done)
    assert events.index(Alloc(("back", 0, 0, 1), 8 * MIB)) < events.index(Ready((0, 0, 1))) \
        < events.index(Free(("back", 0, 0, 1)))
    # by hand (no static bytes: the parameter's 12 MiB is not allocated): F0's 8 + 4 MiB share a 20 MiB segment (A), its 16 MiB output one of 16 (B); F1's 8 MiB
    # cannot have mb 0's block (still copying): it and the 4 take the rest of A, its output a third
    # segment (C); at B0 the 8 MiB copy back fits nowhere (A's free tail is 4 MiB): a fourth
    # segment (D). 20 + 16 + 16 + 20
    got = replay(events)
    assert (got.reserved_peak_bytes, got.allocated_peak_bytes) == (72 * MIB, 46 * MIB)
    # freed at once instead, A is whole again for every later request: 20 + 16 + 16
    at_once = [Free(e.key) if isinstance(e, Free) else e for e in events if not isinstance(e, Ready)]
    assert replay(at_once).reserved_peak_bytes == 52 * MIB


def _with_records(profile, record=RECORD):
    layers = [layer.model_copy(update={"alloc_records": {"none": record, "full": record}}) for layer in profile.layers]
    return profile.model_copy(update={"layers": layers, "device": DeviceInfo(type="cuda", name="test gpu"),
                                      "loss_alloc": AllocRecord(forward=[512, 4 * MIB, -2], backward=[2 * MIB],
                                                                output=1, input_grad=3)})


def test_a_plan_reserves_by_the_replay_where_its_profile_recorded_allocations():
    profile = _with_records(uniform_blocks(2))
    setup = TrainSetup(stages=2, microbatches=4, micro_batch_size=1, mem_caps_bytes=[80 * GIB] * 2)
    stages = costmodel.split_to_stages([0, 2], [False] * 4, profile)
    cost = costmodel.evaluate(stages, profile, setup)
    assert [c.reserved_by for c in cost.stages] == ["replay", "replay"]
    assert all(c.reserved_bytes >= c.peak_bytes for c in cost.stages)
    # without records, or with --fragmentation stated, the divisor as before
    plain = uniform_blocks(2).model_copy(update={"device": DeviceInfo(type="cuda", name="test gpu")})
    assert {c.reserved_by for c in costmodel.evaluate(stages, plain, setup).stages} == {None}
    stated = setup.model_copy(update={"pipeline": setup.pipeline.model_copy(update={"fragmentation": 0.1})})
    assert {c.reserved_by for c in costmodel.evaluate(stages, profile, stated).stages} == {None}
    assert [s.predicted.reserved_by for s in costmodel.with_predictions(stages, cost)] == ["replay", "replay"]


def test_a_profile_without_records_still_loads_and_says_divisor(tmp_path):
    profile = uniform_blocks(2).model_copy(update={"device": DeviceInfo(type="cuda", name="test gpu")})
    path = tmp_path / "p.json"
    io.save_profile(profile, path)
    assert io.load_profile(path).layers[0].alloc_records == {}
    run_ok("solve", "--profile", path, "--stages", "2", "--microbatches", "4", "--mem", "80GiB",
           "--out", tmp_path / "plan.yaml")
    plan = io.load_plan(tmp_path / "plan.yaml")
    assert {s.predicted.reserved_by for s in plan.stages} == {"divisor"}


class _TimedLayer(_Layer):
    fwd_ms, bwd_ms = 1.0, 2.0


def test_timed_copies_free_a_saved_block_once_its_copy_out_is_done():
    memory = StageMemory(static_bytes=0, buffer_bytes=0, scratch_bytes=0)
    actions = [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    # 8 MiB at 1 MiB/ms: mb 0's copy ends at 1 + 8 = 9 ms, after F1 (which starts at 1 ms): held
    slow = stage_events([_TimedLayer()], ["offload"], [RECORD], actions=actions, memory=memory, num_microbatches=2,
                        loss=None, copy_ms_per_byte=1 / MIB)
    assert slow.index(Ready((0, 0, 1))) > slow.index(Alloc((1, 0, 1), 8 * MIB))
    # at 0.1 ms/MiB mb 0's copy ends at 1.8 ms: not yet at F1's start (1 ms), done at B0's (2 ms)
    fast = stage_events([_TimedLayer()], ["offload"], [RECORD], actions=actions, memory=memory, num_microbatches=2,
                        loss=None, copy_ms_per_byte=0.1 / MIB)
    assert fast.index(Alloc((1, 0, 1), 8 * MIB)) < fast.index(Ready((0, 0, 1))) \
        < fast.index(Alloc(("back", 0, 0, 1), 8 * MIB))
    # instant copies: each block is cached before the next layer's forward allocates
    instant = stage_events([_TimedLayer()], ["offload"], [RECORD], actions=actions, memory=memory, num_microbatches=2,
                           loss=None, copy_ms_per_byte=0.0)
    assert instant.index(Ready((0, 0, 1))) < instant.index(Alloc((1, 0, 1), 8 * MIB))
    assert replay(instant).reserved_peak_bytes <= replay(fast).reserved_peak_bytes <= replay(slow).reserved_peak_bytes


def test_1f1b_replays_its_warm_up_and_two_steady_pairs_gpipe_every_microbatch():
    from planner.cost.reserve import replayed_microbatches

    def pipeline(schedule, microbatches):
        return TrainSetup(stages=4, microbatches=microbatches, micro_batch_size=1, mem_caps_bytes=[GIB] * 4,
                          schedule=schedule).pipeline

    assert [replayed_microbatches(pipeline("1F1B", 1000), s) for s in range(4)] == [6, 5, 4, 4]
    assert replayed_microbatches(pipeline("1F1B", 5), 0) == 5
    assert replayed_microbatches(pipeline("GPipe", 1000), 0) == 1000


CHAIN = '''
import torch
from torch import nn


def build_model():
    return nn.Sequential(nn.Linear(1024, 2048), nn.GELU(), nn.Linear(2048, 1024), nn.GELU())


def example_batch(micro_batch_size):
    return torch.randn(micro_batch_size, 1024), torch.randn(micro_batch_size, 1024)
'''


def test_a_fake_gpu_profile_is_replayed_on_every_stage_end_to_end(tmp_path):
    import json

    model = tmp_path / "chain.py"
    model.write_text(CHAIN)
    run_ok("profile", model, "--fake", "--device", "cuda", "--gpu", "h100-sxm", "--micro-batch-size", "256",
           "--out", tmp_path / "f.json")
    profile = io.load_profile(tmp_path / "f.json")
    assert all(layer.alloc_records for layer in profile.layers) and profile.loss_alloc is not None
    result = run_ok("evaluate", "--profile", tmp_path / "f.json", "--mem", "1GiB", "--microbatches", "4",
                    "--layers-per-stage", "2,2", "--ckpt-per-stage", "1,0", "--json")
    summary = json.loads(result.stdout)
    for plan in ("hand", "ckplan"):  # the hand configuration and ckplan's plan beside it
        stages = summary[plan]["stages"]
        assert [s["reserved_by"] for s in stages] == ["replay", "replay"]
        assert all(s["reserved_bytes"] >= s["peak_bytes"] for s in stages)


# A record whose parameter (10 MiB + 512 B) takes a 12 MiB segment of its own: the replay's reserve
# runs about 1.2-1.3x the allocated peak, beyond the divisor's 1 / 0.85.
_WASTEFUL = AllocRecord(forward=[8 * MIB, 4 * MIB, -2, 16 * MIB], backward=[6 * MIB, -1], output=3, input_grad=4,
                        params=[10 * MIB + 512])


def test_the_replay_orders_only_the_runtime_whose_step_it_replays():
    profile = _with_records(uniform_blocks(2))
    stages = costmodel.split_to_stages([0, 2], [False] * 4, profile)
    # Megatron-LM's step by its own replay (reserve_megatron.py); DeepSpeed's by none
    for runtime, by in (("ckplan", "replay"), ("torchtitan", None), ("megatron", "replay"), ("deepspeed", None)):
        setup = TrainSetup(stages=2, microbatches=4, micro_batch_size=1, mem_caps_bytes=[80 * GIB] * 2,
                           training={"runtime": runtime})
        assert {c.reserved_by for c in costmodel.evaluate(stages, profile, setup).stages} == {by}, runtime


def test_a_stage_fits_by_its_replayed_reserve_and_the_solvers_find_the_best_plan_that_does():
    import itertools

    from planner.solve import search
    from planner.solve.deadline import Deadline

    profile = _with_records(uniform_blocks(4), _WASTEFUL)
    setup = TrainSetup(stages=2, microbatches=4, micro_batch_size=1, mem_caps_bytes=[2450 * MIB] * 2)
    # the solvers' rows (the divisor) admit a plan the replay without a cap puts above the cap; torch's
    # release-and-retry (planner/cost/capped_reserve.py) keeps each stage within it: it fits, on the capped reserve
    once = search._plan_once(profile, setup, solver="dp", mip_gap=1e-4, threads=None, log=False, upper_bound_ms=None,
                             start=None, deadline=Deadline(60), baselines_scored=False)
    assert all(c.fits_allocated for c in once.cost.stages) and once.cost.feasible
    assert any(c.uncapped_reserved_bytes + c.workspace_bytes > c.cap_bytes and c.cap_replay == "retried"
               and c.reserved_bytes < c.uncapped_reserved_bytes for c in once.cost.stages)
    # brute force over every split and recompute choice, judged by the replay
    best = min(cost.iteration_ms for cut in range(1, len(profile.layers))
               for options in itertools.product([0, 1], repeat=len(profile.layers))
               if (cost := costmodel.evaluate(costmodel.split_to_stages([0, cut], list(options), profile), profile,
                                              setup)).feasible)
    for solver in ("dp", "milp"):
        found = search.plan(profile, setup, solver=solver, time_limit_s=60)
        assert found.cost.feasible and found.cost.iteration_ms == pytest.approx(best, rel=1e-9), solver
        assert all(c.reserved_by == "replay" and c.device_need_bytes <= c.cap_bytes for c in found.cost.stages)
        assert found.cost.stages[0].cap_bytes == 2450 * MIB  # scored against the caps as given
