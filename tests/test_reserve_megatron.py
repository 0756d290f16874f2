"""Megatron-LM's reserved peak from the caching allocator's replay (planner/cost/reserve_megatron.py): its
static allocations and its schedule's events counted by hand on tiny stages, the segments and reserved bytes
of a step replayed by hand, and the hook choosing the replay for --runtime megatron on cuda."""

import json

from fixtures.cli import run, run_ok

from planner import io
from planner.cost import costmodel, reserve_megatron
from planner.cost.allocator import Alloc, Free, replay, settled_replay
from planner.cost.reserve_megatron import (
    MegatronStatic,
    loss_record,
    schedule_order,
    static_events,
    step_events,
    step_player,
)
from planner.models.synthetic import uniform_blocks
from planner.schema import AllocRecord, DeviceInfo, TrainSetup

MIB = 2**20
GIB = 2**30


class _Layer:  # what the layers' passes read of a LayerProfile
    input_in_act_bytes = 0
    fwd_ms = bwd_ms = 0.0
    recompute_options = ()


def test_megatron_1f1b_order_warms_up_p_minus_s_minus_1_forwards():
    assert schedule_order(3, 0, 4) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2), ("B", 3)]
    assert schedule_order(3, 2, 2) == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]  # the last stage, and one stage
    assert schedule_order(4, 0, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]  # all warm-up: M < P - s - 1


def test_static_by_hand_the_model_freed_into_ddp_buffers_then_the_main_shards():
    # two tensors of 2 and 4 MiB (bf16), the distributed optimizer over K = 2: main_grad fp32 (2x), the fp32
    # main shard 4 / 2 / 2 = 1x, its bf16 clone 1 / 2
    static = MegatronStatic(tensors=((2 * MIB,), (4 * MIB,)), distributed=True, grad_ratio=2.0, main_ratio=1.0,
                            moment_ratio=1.0, clone_ratio=0.5, rest_bytes=0)
    assert static_events(static) == [
        Alloc(("param", 0, 0), 2 * MIB), Alloc(("param", 1, 0), 4 * MIB),  # get_model: built on the GPU
        Alloc(("param_data", 0), 6 * MIB), Alloc(("grad_data", 0), 12 * MIB),  # DDP's buffers, whole
        Free(("param", 0, 0)), Free(("param", 1, 0)),  # param.data now a view of param_data
        Alloc(("clone", 0, 0), 1 * MIB), Alloc(("main", 0, 0), 2 * MIB), Free(("clone", 0, 0)),  # clone().float()
        Alloc(("clone", 1, 0), 2 * MIB), Alloc(("main", 1, 0), 4 * MIB), Free(("clone", 1, 0)),
        Alloc(("rest",), 0)]
    # by hand: 2 MiB opens a 20 MiB segment A; 4 and param_data's 6 split it; grad_data 12 MiB its own
    # segment B; the two tensors freed merge at A's front (6 MiB); the 1 MiB clone is small: a 2 MiB small
    # segment; the mains take A's front and its tail: 20 + 12 + 2. Allocated at its most when the second
    # main shard is made beside its clone: main 2 + clone 2 + param_data 6 + main 4 + grad_data 12
    got = replay(static_events(static))
    assert (got.reserved_peak_bytes, got.allocated_peak_bytes, got.segments) == (34 * MIB, 26 * MIB, 3)
    # plain DDP (ZeRO 0): the tensors stay, no param_data
    plain = MegatronStatic(tensors=((2 * MIB,),), distributed=False, grad_ratio=2.0, main_ratio=2.0,
                           moment_ratio=2.0, clone_ratio=1.0, rest_bytes=0)
    assert static_events(plain)[:2] == [Alloc(("param", 0, 0), 2 * MIB), Alloc(("grad_data", 0), 4 * MIB)]


# a middle stage's one layer: kept 8 MiB (id 1), a 4 MiB scratch (2) freed, the 16 MiB output (3); backward
# the input's 6 MiB gradient (4), the kept tensor freed
MIDDLE = AllocRecord(forward=[8 * MIB, 4 * MIB, -2, 16 * MIB], backward=[6 * MIB, -1], output=3, input_grad=4,
                     params=[])


def test_a_middle_stage_keeps_what_megatron_s_schedule_references():
    static = MegatronStatic(tensors=((),), distributed=True, grad_ratio=2.0, main_ratio=0.0, moment_ratio=0.0,
                            clone_ratio=0.0, rest_bytes=0)
    events = step_events([_Layer()], ["none"], [MIDDLE], static=static, stage=1, stages=3, num_microbatches=2,
                         loss=None, input_bytes=6 * MIB, steps=1)
    step = events[len(static_events(static)):]
    M0, M1 = (0, 0, 0), (0, 0, 1)  # the passes' keys: (step, chunk, microbatch)
    assert step == [
        # F0 (warm-up): the received input, the layer, its output freed once sent (a 1-element tensor left)
        Alloc(("in", M0), 6 * MIB), Alloc((M0, 0, 1), 8 * MIB), Alloc((M0, 0, 2), 4 * MIB), Free((M0, 0, 2)),
        Alloc((M0, 0, 3), 16 * MIB), Free((M0, 0, 3)), Alloc(("stub", M0), 1),
        # F1 (then B0): its input received; the output gradient for B0 received before its output is freed
        Alloc(("in", M1), 6 * MIB), Alloc((M1, 0, 1), 8 * MIB), Alloc((M1, 0, 2), 4 * MIB), Free((M1, 0, 2)),
        Alloc((M1, 0, 3), 16 * MIB), Alloc(("ograd", M0), 16 * MIB), Free((M1, 0, 3)), Alloc(("stub", M1), 1),
        # B0: the input gradient made and sent, not freed (input_tensor_grad and x.grad keep it)
        Alloc((M0, 0, 4), 6 * MIB), Free((M0, 0, 1)), Free((M0, 0, 3)), Free(("stub", M0)),
        # B1 (cool-down): the pop lets input 0 go (its gradient still referenced); the next output gradient
        # received, the previous let go; B1's input gradient made, B0's let go
        Free(("in", M0)), Alloc(("ograd", M1), 16 * MIB), Free(("ograd", M0)),
        Alloc((M1, 0, 4), 6 * MIB), Free((M1, 0, 1)), Free((M1, 0, 3)), Free((M0, 0, 4)), Free(("stub", M1)),
        # the schedule returns: its last output gradient freed; input 1 and its gradient stay with the model
        Free(("ograd", M1))]


# one stage (no pipelining): an embedding-like layer (its 8 MiB output, no input gradient) and a head (kept
# 4 MiB, the 12 MiB logits; backward the 2 MiB input gradient), the loss keeping the logits' fp32 copy
EMBED = AllocRecord(forward=[8 * MIB], backward=[], output=1, input_grad=0, params=[2 * MIB])
HEAD = AllocRecord(forward=[4 * MIB, 12 * MIB], backward=[2 * MIB, -1], output=2, input_grad=3, params=[4 * MIB])


def test_one_stage_two_steps_replayed_by_hand():
    static = MegatronStatic(tensors=((2 * MIB,), (4 * MIB,)), distributed=True, grad_ratio=2.0, main_ratio=1.0,
                            moment_ratio=1.0, clone_ratio=0.5, rest_bytes=0)
    loss = loss_record(12 * MIB, 2.0)
    assert loss == AllocRecord(forward=[24 * MIB], backward=[12 * MIB, -1], output=0, input_grad=2)
    events = step_events([_Layer(), _Layer()], ["none", "none"], [EMBED, HEAD], static=static, stage=0, stages=1,
                         num_microbatches=2, loss=loss, input_bytes=0)
    # the first step's forward: 8 MiB finds no free block of 8 (A's two 4 MiB holes): segment D of 20 MiB;
    # the head's kept 4 takes A's hole, the 12 MiB logits D's rest; the loss's 24 MiB its own segment E.
    # Adam's moments (2, 2, 4, 4 MiB) then fill A's holes and the front of D. In the second step the 8 and
    # the 4 take D's rest, the logits split E, and the loss's 24 MiB finds no 24 MiB block: segment F.
    # reserved A 20 + grad_data 12 + small 2 + D 20 + E 24 + F 24; allocated: static and moments 36 MiB,
    # the head's kept 4, the logits 12 and the loss's 24
    got = replay(events)
    assert (got.reserved_peak_bytes, got.allocated_peak_bytes, got.segments) == (102 * MIB, 76 * MIB, 6)


def _megatron_profile(record=MIDDLE):
    profile = uniform_blocks(2)
    layers = [layer.model_copy(update={"alloc_records": {"none": record, "full": record}}) for layer in profile.layers]
    return profile.model_copy(update={"layers": layers, "device": DeviceInfo(type="cuda", name="NVIDIA H100 80GB HBM3")})


def _setup(runtime="megatron", **dp):
    setup = TrainSetup(stages=2, microbatches=4, micro_batch_size=1, mem_caps_bytes=[80 * GIB] * 2)
    return setup.model_copy(update={
        "training": setup.training.model_copy(update={"runtime": runtime, "precision": "bf16-mixed"}),
        "data_parallel": setup.data_parallel.model_copy(update={"dp": 2, "zero": 1, **dp})})


def test_the_hook_replays_megatron_on_cuda_and_keeps_the_divisor_where_it_cannot():
    profile = _megatron_profile()
    stages = costmodel.split_to_stages([0, 2], [False] * 4, profile)
    setup = _setup()
    assert reserve_megatron.replays(setup)
    cost = costmodel.evaluate(stages, profile, setup)
    assert [c.reserved_by for c in cost.stages] == ["replay", "replay"]
    assert all(c.reserved_bytes >= c.peak_bytes for c in cost.stages)
    # ZeRO 3 under Megatron-LM (Megatron-FSDP, not read), or no records: the divisor
    assert not reserve_megatron.replays(_setup(zero=3))
    assert {c.reserved_by for c in costmodel.evaluate(stages, profile, _setup(zero=3)).stages} == {None}
    plain = uniform_blocks(2).model_copy(update={"device": DeviceInfo(type="cuda", name="test gpu")})
    assert {c.reserved_by for c in costmodel.evaluate(stages, plain, setup).stages} == {None}
    # DeepSpeed's record orders no replay: the divisor
    assert {c.reserved_by for c in costmodel.evaluate(stages, profile, _setup("deepspeed")).stages} == {None}


def test_evaluate_says_reserved_by_replay_for_megatron(tmp_path):
    path = tmp_path / "p.json"
    io.save_profile(_megatron_profile(), path)
    out = run_ok("evaluate", "--profile", path, "--layers-per-stage", "2,2", "--ckpt-per-stage", "0,0",
                 "--microbatches", "4", "--dp", "2", "--zero", "1", "--mem", "80GiB", "--precision", "bf16-mixed",
                 "--runtime", "megatron", "--json").stdout
    stages = json.loads(out)["hand"]["stages"]
    assert [s["reserved_by"] for s in stages] == ["replay", "replay"]


def test_the_allocator_setting_reaches_megatrons_replay_and_is_refused_where_it_does_not_run(tmp_path):
    path = tmp_path / "p.json"
    io.save_profile(_megatron_profile(), path)
    common = ["evaluate", "--profile", path, "--ckpt-per-stage", "0,0", "--microbatches", "4", "--dp", "2",
              "--mem", "80GiB", "--precision", "bf16-mixed", "--runtime", "megatron", "--json"]
    reserved = {flag: [s["reserved_bytes"] for s in json.loads(run_ok(*common, "--layers-per-stage", "2,2",
                                                                       "--zero", "1", flag).stdout)["hand"]["stages"]]
                for flag in ("--expandable-segments", "--no-expandable-segments")}
    # the flag reaches the replay (allocator.CachingAllocator(expandable=True)), and moves its reserve
    assert reserved["--expandable-segments"] != reserved["--no-expandable-segments"]
    refused = run(*common, "--layers-per-stage", "2,2", "--zero", "3", "--expandable-segments")
    assert refused.exit_code != 0 and "Traceback" not in refused.output
    assert "the replay of Megatron-LM's step runs one stage a rank or its interleaved schedule, under ZeRO 0 or 1" \
        in " ".join(refused.output.split())


def test_three_steady_pairs_reserve_what_every_microbatch_does(monkeypatch):
    static = MegatronStatic(tensors=((2 * MIB,), (4 * MIB,)), distributed=True, grad_ratio=2.0, main_ratio=1.0,
                            moment_ratio=1.0, clone_ratio=0.5, rest_bytes=0)
    kwargs = dict(static=static, stage=1, stages=3, num_microbatches=12, loss=None, input_bytes=6 * MIB)
    short = replay(step_events([_Layer()], ["none"], [MIDDLE], **kwargs))
    assert reserve_megatron.replayed_microbatches(3, 1, 12) == 4  # one warm-up forward and three pairs
    monkeypatch.setattr(reserve_megatron, "replayed_microbatches", lambda stages, stage, m: m)
    assert replay(step_events([_Layer()], ["none"], [MIDDLE], **kwargs)) == short


def test_the_replay_plays_steps_until_the_cache_settles(monkeypatch):
    # a middle stage of 3, two microbatches: the layer keeps 10 MiB, a 30 MiB scratch freed, its 24 MiB output;
    # backward the input's 14 MiB gradient. Two steps reserve 170 MiB; the third step's 24 MiB output finds no
    # free block of its size in what the second left (a new 24 MiB segment), the fourth adds none: 194 MiB, the
    # figure a later step logs (max_memory_reserved over the run), where two steps said 170
    record = AllocRecord(forward=[10 * MIB, 30 * MIB, -2, 24 * MIB], backward=[14 * MIB, -1], output=3, input_grad=4,
                         params=[])
    static = MegatronStatic(tensors=((8 * MIB,),), distributed=True, grad_ratio=2.0, main_ratio=1.0, moment_ratio=1.0,
                            clone_ratio=0.5, rest_bytes=0)
    kwargs = dict(static=static, stage=1, stages=3, num_microbatches=2, loss=None, input_bytes=14 * MIB)
    reserved = [replay(step_events([_Layer()], ["none"], [record], steps=n, **kwargs)).reserved_peak_bytes // MIB
                for n in (2, 3, 4, 8)]
    assert reserved == [170, 194, 194, 194]
    events, one_step = step_player([_Layer()], ["none"], [record], **kwargs)
    played = []
    settled = settled_replay(events, lambda index: played.append(index) or one_step(index), min_steps=2,
                             max_steps=reserve_megatron.MAX_STEPS)
    assert settled.reserved_peak_bytes == 194 * MIB and played == [0, 1, 2, 3]  # the fourth raised neither peak
    # the hook plays the settled replay (not a fixed count of steps)
    calls = []
    monkeypatch.setattr(reserve_megatron.allocator, "settled_replay",
                        lambda *a, **k: calls.append(k) or settled_replay(*a, **k))
    profile = _megatron_profile(record)
    costmodel.evaluate(costmodel.split_to_stages([0, 2], [False] * 4, profile), profile, _setup())
    assert [(k["min_steps"], k["max_steps"]) for k in calls] == [(2, 8), (2, 8)]
