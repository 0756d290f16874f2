"""The stage output a 1F1B warm-up send keeps (planner/cost/warmupsend.py) in every replay that runs torch's
Schedule1F1B: a tensor of its own, so a block of its own, not spread over the receive buffers (ckplan's step,
reserve._static_events) nor merged into the buffers' block (FSDP2's, fsdp2_chunks.one_stage_rank). The other
replays run schedules that keep no warm-up send (the records' warmup_send_held: Megatron-LM frees a sent output,
DeepSpeed and ColossalAI run their own), so they hold none. Hand counts of the caching allocator's segments:
requests of at most 1 MiB from 2 MiB segments, below 10 MiB from 20 MiB ones, larger ones their own (2 MiB
granularity)."""

import dataclasses

from planner.cost import allocator, costmodel, reserve, reserve_fsdp2, runtimes
from planner.cost.allocator import Alloc
from planner.cost.fsdp2_chunks import rank_events
from planner.models.synthetic import uniform_blocks
from planner.schema import TrainSetup

MIB, GIB = 2**20, 2**30


def test_the_records_that_hold_one():
    for runtime, version in (("ckplan", None), ("torchtitan", "2c8b5947"), ("torchtitan", "b5bcd76c")):
        assert runtimes.facts(runtime, version).warmup_send_held
    for runtime in ("megatron", "deepspeed", "colossalai"):
        assert not runtimes.facts(runtime, None).warmup_send_held


def test_ckplans_step_holds_it_in_a_small_segment_of_its_own():
    """4 receive buffers of 1 MiB and the held 1 MiB output: five 1 MiB small-pool blocks, two a 2 MiB segment:
    3 segments, 6 MiB. Spread over the buffers (4 x 1.25 MiB) they were large-pool requests in one 20 MiB
    segment."""
    own = reserve._static_events([], reserve.StageMemory(0, 5 * MIB, 0, held_send_bytes=MIB), 4)
    assert [e.nbytes for e in own if e.key[0] == "buffer"] == [MIB] * 4 + [0, MIB]
    assert allocator.replay(own).reserved_peak_bytes == 3 * 2 * MIB
    spread = reserve._static_events([], reserve.StageMemory(0, 5 * MIB, 0), 4)
    assert allocator.replay(spread).reserved_peak_bytes == 20 * MIB


def _titan(version: str) -> TrainSetup:
    return TrainSetup(stages=2, microbatches=4, micro_batch_size=1, mem_caps_bytes=[80 * GIB] * 2,
                      precision="bf16-mixed", runtime="torchtitan", runtime_version=version, dp=4, zero=3,
                      zero_gather="per-iteration")


def _stage_zero(version: str):
    from tests.test_fsdp2_chunks import _cuda

    profile = _cuda(uniform_blocks(4))
    setup = _titan(version)
    stages = costmodel.split_to_stages([0, 3], [False] * len(profile.layers), profile)
    cost = costmodel.evaluate(stages, profile, setup)
    rank = reserve_fsdp2.stage_of(stages[0], cost.stages[0], stage=0, profile=profile, setup=setup)
    return profile, cost.stages[0], rank


def test_fsdp2s_step_holds_it_as_a_block_of_its_own():
    """Stage 0 of 2, M = 4 under torchtitan 2c8b5947 (torch's Schedule1F1B, outputs not kept to the step's end): w
    = 2 warm-up forwards, M - w = 2 >= w - 1, so one stage output (block 2's, 8 MiB) is held. The rank's buffers
    (the whole batch, 32 MiB) no longer carry it: a 32 MiB block is a segment of its own, the 8 MiB one comes from
    a 20 MiB segment, 52 MiB where the merged 40 MiB block took 40."""
    profile, cost, rank = _stage_zero("2c8b5947")
    output = profile.layers[2].output_bytes
    assert output == 8 * MIB and rank.held_send_bytes == output
    assert rank.buffer_bytes == 32 * MIB
    static = rank_events(rank, steps=0)
    assert static[-2:] == [Alloc(("buffers",), 32 * MIB, 0), Alloc(("send",), 8 * MIB, 0)]
    shards = allocator.replay(static[:-2]).reserved_peak_bytes
    assert allocator.replay(static).reserved_peak_bytes == shards + 32 * MIB + 20 * MIB
    merged = dataclasses.replace(rank, buffer_bytes=40 * MIB, held_send_bytes=0)
    assert allocator.replay(rank_events(merged, steps=0)).reserved_peak_bytes == shards + 40 * MIB


def test_none_where_every_output_is_kept_anyway():
    """9dec370 keeps every stage output to the step's end (output_chunks): each is its own block already, and no
    warm-up send is counted beside them."""
    profile, _, rank = _stage_zero("9dec370")
    assert rank.held_send_bytes == 0 and rank.output_bytes == (profile.layers[2].output_bytes,)
