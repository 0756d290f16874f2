"""The caching allocator's replay of FSDP2's one-stage step (planner/cost/reserve_fsdp2.py): a two-unit
stage counted by hand from the allocator's rules (allocator.py), its all-gather buffers held on the
copy-in stream, where the default stream cannot reuse them; the optimizer's state made at the first step and
the loss's scratch as its tensors; the allocator the launch ran (--expandable-segments, else torchtitan's
one-node script's); and the plan's reserve taken from it under torchtitan (one stage, or one a rank of 1F1B)."""

from planner.cost import allocator, costmodel, reserve_fsdp2
from planner.cost.allocator import Alloc, Free
from planner.cost.fsdp2_events import (
    COPY_IN,
    DEFAULT,
    REDUCE_SCATTER,
    Fsdp2Layer,
    Fsdp2Stage,
    step_events,
)
from planner.models.synthetic import uniform_blocks
from planner.schema import TrainSetup

MIB = 2**20
GIB = 2**30

# Two layers, each its own unit, sharded over K = 2 ranks; each one 12 MiB tensor gathered (bf16) and
# as its unsharded gradient; its fp32 shard 12 MiB and Adam's two states 12 MiB each; 10 MiB kept
# from its forward to its backward; no scratch. The reduce-scatter input is fp32: 24 MiB, its output
# (the sharded gradient) 12 MiB.
LAYER = Fsdp2Layer(unit=0, kept_bytes=10 * MIB, extra_bytes=0, gathered=(12 * MIB,), grads=(12 * MIB,),
                   shard=(12 * MIB,), state=(12 * MIB, 12 * MIB), scratch=())
STAGE = Fsdp2Stage(layers=(LAYER, Fsdp2Layer(**{**LAYER.__dict__, "unit": 1})), kept_from_forward=frozenset(),
                   shard_group=2, reduce_ratio=2.0, buffer_bytes=0, loss_kept_bytes=0, loss_extra_bytes=0)


def _allocs(events, stream):
    return [(e.key, e.nbytes // MIB) for e in events if isinstance(e, Alloc) and e.stream == stream and e.nbytes]


def test_each_allocation_on_the_stream_fsdp2_makes_it_on():
    events = step_events(STAGE, steps=1)
    # forward: each unit's staging (12 / K) and flat output; backward: unit 1 again, then unit 0 prefetched
    unit = {u: [(("staging", u), 6), (("ag_out", u), 12)] for u in (0, 1)}
    assert _allocs(events, COPY_IN) == unit[0] + unit[1] + unit[1] + unit[0]
    assert _allocs(events, REDUCE_SCATTER) == [(("sharded_grad", 1), 12), (("sharded_grad", 0), 12)]
    # the forward holds unit 0's result until unit 1's copy-out, then the root's post-forward drops unit 1's
    forward = events[events.index(Alloc(("staging", 1), 6 * MIB, COPY_IN)):]
    assert forward[:4] == [Alloc(("staging", 1), 6 * MIB, COPY_IN), Alloc(("ag_out", 1), 12 * MIB, COPY_IN),
                           Free(("staging", 1)), Free(("ag_out", 0))]


def test_two_units_counted_by_hand():
    """The first step, the optimizer's state not made yet (AdamW makes it in the first step's optimizer
    step). Static: the two 12 MiB shards, each a segment of its own (>= 10 MiB: kMinLargeAlloc), 24 MiB.
    Forward, unit 0: staging 6 MiB takes a 20 MiB copy-in segment (C1: 1-10 MiB requests, kLargeBuffer)
    and is split; the 12 MiB output takes the 14 MiB rest, split again (2 MiB > kSmallSize left). The
    unsharded weight takes a default segment (12), kept 0 another (10). Unit 1: staging reuses C1's
    freed 6 MiB front; its output finds no 12 MiB copy-in block: a new segment (C2, 12); unit 0's
    output is freed (C1 merges whole: 20); the weight reuses unit 0's freed default block, kept 1 a new
    segment (10). Backward: every copy-in request fits C1 and C2 again; unit 1's 12 MiB gradient finds
    no free default block (its weights hold both 12s' worth: the reused one), so a new default segment
    (12), while C2's 12 MiB lies free on the copy-in stream; the 24 MiB reduce-scatter input a new one
    (24); each sharded gradient a reduce-scatter segment (12 + 12). The optimizer step's four 12 MiB
    states take the two free 12 MiB default blocks whole and the 24 MiB input's block split in two.
    Reserved: 24 + (12 + 10 + 10 + 12 + 24) + (20 + 12) + 24 = 148 MiB; allocated peak at the step's
    end: shards 24, states 48, sharded gradients 24 = 96 MiB.
    The second step meets the states where the first step's unsharded weight, gradient and reduce-scatter
    input were: unit 0's weight (12), unit 1's gradient (12) and the input (24) take new default segments:
    196 MiB; its allocated peak, in unit 0's backward, static 72, unit 0's weight 12 with its gradient 12,
    kept 0 10, unit 1's input 24 and sharded gradient 12: 142 MiB. A third step reuses every block."""
    once = allocator.replay(step_events(STAGE, steps=1))
    assert (once.allocated_peak_bytes, once.reserved_peak_bytes) == (96 * MIB, 148 * MIB)
    steady = reserve_fsdp2.replay(STAGE)
    assert (steady.allocated_peak_bytes, steady.reserved_peak_bytes) == (142 * MIB, 196 * MIB)
    third = allocator.replay(step_events(STAGE, steps=3))
    assert (third.allocated_peak_bytes, third.reserved_peak_bytes) == (142 * MIB, 196 * MIB)


def test_the_optimizer_state_is_made_at_the_first_steps_optimizer_step_per_parameter():
    """torch 2.6.0 AdamW._init_group makes exp_avg then exp_avg_sq of each parameter at the first
    step(); torchtitan 9dec370 makes none before (no checkpoint loaded): after the first backward,
    before the foreach scratch, never again."""
    events = step_events(STAGE)
    states = [i for i, e in enumerate(events) if isinstance(e, Alloc) and e.key[0] == "state"]
    assert [events[i].key for i in states] == [("state", 0, 0), ("state", 0, 1), ("state", 1, 0), ("state", 1, 1)]
    first_step_end = [i for i, e in enumerate(events) if e == Free(("sharded_grad", 0))][1]  # the second zero_grad
    last_backward = max(i for i, e in enumerate(events[:first_step_end]) if isinstance(e, Free) and e.key[0] == "rs_in")
    assert last_backward < states[0] and states[-1] < first_step_end


def test_the_loss_scratch_is_made_as_tensors_of_the_loss_largest_size():
    loss = Fsdp2Stage(**{**STAGE.__dict__, "loss_extra_bytes": 30 * MIB, "loss_tensor_bytes": 12 * MIB})
    made = [(e.key, e.nbytes // MIB) for e in step_events(loss, steps=1)
            if isinstance(e, Alloc) and e.key[0] == "loss_extra"]
    assert made == [(("loss_extra", 0), 12), (("loss_extra", 1), 12), (("loss_extra", 2), 6)]
    whole = Fsdp2Stage(**{**loss.__dict__, "loss_tensor_bytes": 0})  # a measured loss: one block
    assert [(e.key, e.nbytes // MIB) for e in step_events(whole, steps=1)
            if isinstance(e, Alloc) and e.key[0] == "loss_extra"] == [(("loss_extra", 0), 30)]


def test_a_big_block_split_by_the_first_steps_state_costs_the_next_step_a_segment():
    """The default segments: a 100 MiB activation freed, then the first step's 12 MiB state made into its
    block (best fit: the only free block), so the next step's 100 MiB activation finds 88 MiB and takes a
    segment of its own; expandable segments grow the one segment by the 12 MiB (one 20 MiB page)."""
    events = [Alloc("act", 100 * MIB), Free("act"), Alloc("state", 12 * MIB), Alloc("act2", 100 * MIB)]
    assert allocator.replay(events).reserved_peak_bytes == 200 * MIB
    assert allocator.replay(events, expandable=True).reserved_peak_bytes == 120 * MIB


def test_a_block_cached_on_the_copy_in_stream_is_not_the_default_streams():
    """The same events on one stream, by hand: unit 1's forward output reuses unit 0's freed 12 MiB
    weight block, its weight the 20 MiB all-gather segment (split 12 | 8), so the forward takes 72 +
    20 + 12 + 10 + 10; the backward adds a 12 MiB gradient segment and the 24 MiB reduce-scatter input,
    and the sharded gradients reuse freed 12 MiB blocks instead of two reduce-scatter segments:
    160 MiB, where FSDP2's streams take 196 (the copy-in stream's 12 MiB block lies free while unit 1's
    gradient takes a default segment; the reduce-scatter stream holds 24 MiB of its own)."""
    events = step_events(STAGE)
    one_stream = [e._replace(stream=DEFAULT) if isinstance(e, Alloc) else e for e in events]
    assert allocator.replay(one_stream).reserved_peak_bytes == 160 * MIB
    assert reserve_fsdp2.replay(STAGE).reserved_peak_bytes == 196 * MIB


def test_a_unit_kept_gathered_from_forward_is_not_gathered_again():
    kept = Fsdp2Stage(**{**STAGE.__dict__, "kept_from_forward": frozenset({1})})
    events = step_events(kept, steps=1)
    assert _allocs(events, COPY_IN) == [(("staging", 0), 6), (("ag_out", 0), 12), (("staging", 1), 6),
                                        (("ag_out", 1), 12), (("staging", 0), 6), (("ag_out", 0), 12)]
    assert allocator.replay(events).reserved_peak_bytes >= allocator.replay(events).allocated_peak_bytes


def _reserve_is_the_replays(stages, profile, setup) -> None:
    """The replay ran on every stage and is the reserve ("replay"), whether above or below the margin's
    peak / (1 - fragmentation) (the margin is retired where FSDP2's step is replayed), never below the
    allocated peak; nothing is reported beside it."""
    from planner.cost import reserve_fsdp2 as r

    plans = costmodel.split_to_stages([0] if len(stages) == 1 else [0, 3], [False] * len(profile.layers), profile)
    for index, (c, plan) in enumerate(zip(stages, plans)):
        replayed = r.replay(r.stage_of(plan, c, stage=index, profile=profile, setup=setup),
                            expandable=r.expandable_segments(profile, setup))
        assert (c.reserved_by, c.replayed_reserved_bytes) == ("replay", None)
        assert c.reserved_bytes == r.reserved_bytes(replayed, c.peak_bytes) >= c.peak_bytes


def _titan(**fields) -> TrainSetup:
    base = dict(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[80 * GIB], precision="bf16-mixed",
                runtime="torchtitan", runtime_version="9dec370", dp=4, zero=3)
    return TrainSetup(**(base | fields))


def test_torchtitans_one_stage_fsdp2_reserve_is_the_replays_and_never_below_the_allocated_peak():
    profile = uniform_blocks(4).model_copy(update={"device": uniform_blocks(4).device.model_copy(update={"type": "cuda"})})
    stages = costmodel.split_to_stages([0], [False] * len(profile.layers), profile)
    cost = costmodel.evaluate(stages, profile, _titan())
    _reserve_is_the_replays(cost.stages, profile, _titan())
    # beside a pipeline, or without ZeRO 3, or with --fragmentation stated: the divisor, as before
    two = costmodel.split_to_stages([0, 2], [False] * len(profile.layers), profile)
    assert {c.reserved_by for c in costmodel.evaluate(two, profile, _titan(stages=2, mem_caps_bytes=[80 * GIB] * 2,
                                                                           microbatches=2)).stages} == {None}
    assert {c.reserved_by for c in costmodel.evaluate(stages, profile, _titan(zero=1)).stages} == {None}
    assert {c.reserved_by for c in costmodel.evaluate(stages, profile, _titan(fragmentation=0.1)).stages} == {None}


# Beside a pipeline (torchtitan 9dec370 under PP): the same two layers, one microbatch in flight and two in all
PIPED = Fsdp2Stage(**{**STAGE.__dict__, "kept_from_forward": frozenset({0, 1}), "root_units": frozenset({1}),
                      "actions": (("F", 0), ("B", 0), ("F", 1), ("B", 1)), "keeps_last_input": True})


def test_beside_a_pipeline_units_are_gathered_once_upcast_at_the_first_backward_and_reduced_root_first():
    events = step_events(PIPED, steps=1)
    unit = {u: [(("staging", u), 6), (("ag_out", u), 12)] for u in (0, 1)}
    assert _allocs(events, COPY_IN) == unit[0] + unit[1]  # the first forward alone gathers
    # the fp32 copies (24 MiB) made once, at the first backward; each later gradient is added into them
    assert [key for key, _ in _allocs(events, DEFAULT) if key[0] == "acc"] == [("acc", 1, 0), ("acc", 0, 0)]
    # after the last backward: the root's unit (1) reduced first, each input dropped before the next
    tail = events[events.index(Free(("unsharded", 1, 0))):]
    assert tail[:6] == [Free(("unsharded", 1, 0)), Free(("rs_in", "last")), Alloc(("rs_in", "last"), 24 * MIB),
                        Free(("acc", 1, 0)), Alloc(("sharded_grad", 1), 12 * MIB, REDUCE_SCATTER),
                        Free(("unsharded", 0, 0))]
    # torch before pytorch#144535: the last input is not dropped at the step's end (only the optimizer's
    # state, made at this first step, follows the last reduce-scatter)
    end = tail.index(Alloc(("sharded_grad", 0), 12 * MIB, REDUCE_SCATTER))
    assert {e.key[0] for e in tail[end + 1:]} == {"state"}
    steady = reserve_fsdp2.replay(PIPED)
    assert steady.reserved_peak_bytes >= steady.allocated_peak_bytes


def test_beside_a_pipeline_the_peak_by_hand():
    """Static 72 MiB; both units gathered at microbatch 0's forward (24) and held; its kept (20); its
    backward's gradients (12 each) upcast to fp32 copies (24 each) as each unit's post-backward runs;
    microbatch 1's forward keeps 20 again. The peak is microbatch 1's backward of layer 1, its bf16
    gradient made before its post-backward adds it into the copy: static 72, weights 24, fp32 copies
    48, kept 20, the gradient 12: 176 MiB. The reduce after it holds less: each unit's fp32 input (24)
    beside its copy (24) once the weights and activations are gone. That is the second step's: the first
    has no optimizer state yet (48 less: 128 MiB), and the second also holds the first's last reduce-scatter
    input (24, keeps_last_input): 200 MiB."""
    once = allocator.replay(step_events(PIPED, steps=1))
    assert once.allocated_peak_bytes == (176 - 48) * MIB
    assert reserve_fsdp2.replay(PIPED).allocated_peak_bytes == (176 + 24) * MIB


def test_torchtitan_beside_a_1f1b_pipeline_is_replayed_where_gradients_are_kept_whole():
    profile = uniform_blocks(4).model_copy(update={"device": uniform_blocks(4).device.model_copy(update={"type": "cuda"})})
    two = costmodel.split_to_stages([0, 3], [False] * len(profile.layers), profile)
    setup = _titan(stages=2, mem_caps_bytes=[80 * GIB] * 2, microbatches=4, zero_gather="per-iteration")
    cost = costmodel.evaluate(two, profile, setup)
    _reserve_is_the_replays(cost.stages, profile, setup)


def test_torchtitans_replay_runs_expandable_segments_on_cuda_not_on_rocm():
    from planner.cost import reserve_fsdp2 as r

    profile = uniform_blocks(2)
    cuda = profile.model_copy(update={"assumptions": {**profile.assumptions, "gpu": "h100-sxm"}})
    rocm = profile.model_copy(update={"assumptions": {**profile.assumptions, "gpu": "mi300x"}})
    assert r.expandable_segments(cuda, _titan()) and not r.expandable_segments(rocm, _titan())
    assert not r.expandable_segments(cuda, _titan(runtime="ckplan", runtime_version=None))
    # torchtitan's one-node script sets them, its Slurm script for several nodes does not: 16 ranks at 8 a node
    # run the default segments, unless the job's launch is stated (--expandable-segments / --no-...)
    assert not r.expandable_segments(cuda, _titan(dp=16))
    assert r.expandable_segments(cuda, _titan(dp=16, expandable_segments=True))
    assert not r.expandable_segments(cuda, _titan(expandable_segments=False))
    assert r.expandable_segments(cuda, _titan(dp=16, gpus_per_node=16))
    assert not r.expandable_segments(rocm, _titan(expandable_segments=True))  # ROCm's torch ignored it
    # the two-unit stage under expandable segments: one segment a stream (default, copy-in, reduce-scatter),
    # each a whole number of 20 MiB pages (every request here is the large pool's); at this scale the pages
    # round up more than the default segments waste (220 MiB against 196)
    grown = r.replay(STAGE, expandable=True)
    assert grown.segments == 3 and grown.reserved_peak_bytes % (20 * MIB) == 0
    assert grown.reserved_peak_bytes >= grown.allocated_peak_bytes == r.replay(STAGE).allocated_peak_bytes


def test_evaluate_json_reports_the_replayed_reserve_the_cost_model_gives(tmp_path):
    """`evaluate --profile ... --json` says each stage's reserve and how it was made (reserved_by: the FSDP2
    replay's under torchtitan, the margin retired there): the same figures the cost model gives (as
    `--from-torchtitan` and `solve --json` do)."""
    import json

    from fixtures.cli import run_ok

    from planner import io

    base = uniform_blocks(4)
    profile = base.model_copy(update={"device": base.device.model_copy(update={"type": "cuda"}),
                                      "assumptions": {**base.assumptions, "gpu": "h100"}})  # its links
    path = tmp_path / "cuda.json"
    io.save_profile(profile, path)
    out = run_ok("evaluate", "--profile", path, "--layers-per-stage", str(len(profile.layers)), "--ckpt-per-stage", "0",
                 "--dp", "4", "--zero", "3", "--microbatches", "1", "--mem", "80GB", "--precision", "bf16-mixed",
                 "--runtime", "torchtitan", "--runtime-version", "9dec370", "--json")
    stage = json.loads(out.stdout)["hand"]["stages"][0]
    stages = costmodel.split_to_stages([0], [False] * len(profile.layers), profile)
    cost = costmodel.evaluate(stages, profile, _titan()).stages[0]
    assert (stage["reserved_bytes"], stage["reserved_by"], stage["replayed_reserved_bytes"]) == \
        (cost.reserved_bytes, cost.reserved_by, cost.replayed_reserved_bytes)
    assert stage["reserved_by"] == "replay" and stage["reserved_bytes"] >= stage["peak_bytes"]  # it ran


def test_the_allocator_setting_is_refused_where_no_replay_runs_and_reaches_the_replay_where_one_does(tmp_path):
    import json

    from fixtures.cli import run, run_ok

    from planner import io

    base = uniform_blocks(4)
    profile = base.model_copy(update={"device": base.device.model_copy(update={"type": "cuda"}),
                                      "assumptions": {**base.assumptions, "gpu": "h100"}})
    path = tmp_path / "cuda.json"
    io.save_profile(profile, path)
    common = ["evaluate", "--profile", path, "--layers-per-stage", str(len(profile.layers)), "--ckpt-per-stage", "0",
              "--microbatches", "1", "--mem", "80GB", "--precision", "bf16-mixed"]
    # Megatron-LM under ZeRO 3 (Megatron-FSDP): its step is not replayed (reserve_megatron.replays)
    refused = run(*common, "--dp", "4", "--zero", "3", "--runtime", "megatron", "--no-expandable-segments")
    assert refused.exit_code != 0 and "Traceback" not in refused.output
    assert "--no-expandable-segments changes the caching allocator's replay" in refused.output
    titan = [*common, "--dp", "4", "--zero", "3", "--runtime", "torchtitan", "--runtime-version", "9dec370", "--json"]
    margin = run(*titan, "--fragmentation", "0.1", "--expandable-segments")  # no replay runs: refused, not ignored
    assert margin.exit_code != 0 and "--fragmentation states the reserve's margin" in margin.output
    stated = {flag: json.loads(run_ok(*titan, flag).stdout)["hand"]["stages"][0]
              for flag in ("--expandable-segments", "--no-expandable-segments")}
    assert stated["--expandable-segments"]["reserved_bytes"] != stated["--no-expandable-segments"]["reserved_bytes"]
    stages = costmodel.split_to_stages([0], [False] * len(profile.layers), profile)
    for flag, on in (("--expandable-segments", True), ("--no-expandable-segments", False)):
        cost = costmodel.evaluate(stages, profile, _titan(expandable_segments=on)).stages[0]
        assert (stated[flag]["reserved_bytes"], stated[flag]["replayed_reserved_bytes"]) == \
            (cost.reserved_bytes, cost.replayed_reserved_bytes)
