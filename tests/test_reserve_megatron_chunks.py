"""Megatron-LM's interleaved schedule replayed (planner/cost/reserve_megatron_chunks.py): its order against
schedules.py's own table and warm-up count, a rank of two chunks counted by hand through the caching allocator's
rules, and the hook choosing the replay for --runtime megatron's virtual pipeline stages."""

from planner.cost import reserve_megatron
from planner.cost.allocator import Alloc, Free, replay, settled_replay
from planner.cost.reserve_megatron import MegatronStatic, static_events
from planner.cost.reserve_megatron_chunks import (
    interleaved_order,
    rank_events,
    rank_player,
    replayed_microbatches,
    schedule_table,
)
from planner.schema import AllocRecord, TrainSetup

MIB = 2**20


class _Layer:  # what the layers' passes read of a LayerProfile
    input_in_act_bytes = 0
    fwd_ms = bwd_ms = 0.0
    recompute_options = ()
    input_bytes = 2 * MIB


def test_the_table_is_megatrons_own_example_and_the_backwards_run_the_chunks_in_reverse():
    # schedules.py 1226-1240's example: PP 2, 5 microbatches, VP 2, a group of 3
    table = schedule_table(5, 2, 3)
    assert [mb for mb, _ in table] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [chunk for _, chunk in table] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]
    forwards, backwards, warmup = interleaved_order(2, 0, 2, 5, group=3)
    assert forwards[:4] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert backwards[:4] == [(1, 0), (1, 1), (1, 2), (0, 0)]  # chunk C - 1 - the table's, oldest first
    assert warmup == (2 - 0 - 1) * 2 + (2 - 1) * 3  # get_pp_rank_microbatches
    # PP 4, VP 2, 8 microbatches (group P): the first rank warms up 10, the last 4; never past M x C
    assert [interleaved_order(4, s, 2, 8)[2] for s in range(4)] == [10, 8, 6, 4]
    assert interleaved_order(4, 0, 2, 2)[2] == 4
    assert replayed_microbatches(64, 8) == 64 and replayed_microbatches(128, 8) == 32


# rank 0 of PP 2, two chunks: chunk 0 (the first stage: no input received, no input gradient) keeps 4 MiB and
# makes its 2 MiB output; chunk 1 the same and, in its backward, its input's 2 MiB gradient
FIRST = AllocRecord(forward=[4 * MIB, 2 * MIB], backward=[-1], output=2, input_grad=0)
LATER = AllocRecord(forward=[4 * MIB, 2 * MIB], backward=[2 * MIB, -1], output=2, input_grad=3)
EMPTY = MegatronStatic(tensors=((), ()), distributed=True, grad_ratio=2.0, main_ratio=0.0, moment_ratio=0.0,
                       clone_ratio=0.0, rest_bytes=0)


def test_a_rank_of_two_chunks_replayed_by_hand():
    events = rank_events([([_Layer()], ["none"], [FIRST]), ([_Layer()], ["none"], [LATER])], static=EMPTY, stage=0,
                         stages=2, num_microbatches=2, loss=None, steps=1)
    step = events[len(static_events(EMPTY)):]
    c0m0, c0m1, c1m0, c1m1 = (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)  # (step, chunk, microbatch)
    assert step == [
        # the warm-up is every forward ((2 - 0 - 1) x 2 + 2 = 4): F(c0, m0), its output deallocated once sent
        Alloc((c0m0, 0, 1), 4 * MIB), Alloc((c0m0, 0, 2), 2 * MIB), Free((c0m0, 0, 2)), Alloc(("stub", c0m0), 1),
        # F(c0, m1); send_forward_recv_forward receives chunk 1's first input before the output goes
        Alloc((c0m1, 0, 1), 4 * MIB), Alloc((c0m1, 0, 2), 2 * MIB), Alloc(("in", c1m0), 2 * MIB),
        Free((c0m1, 0, 2)), Alloc(("stub", c0m1), 1),
        Alloc((c1m0, 0, 1), 4 * MIB), Alloc((c1m0, 0, 2), 2 * MIB), Alloc(("in", c1m1), 2 * MIB),
        Free((c1m0, 0, 2)), Alloc(("stub", c1m0), 1),
        Alloc((c1m1, 0, 1), 4 * MIB), Alloc((c1m1, 0, 2), 2 * MIB), Free((c1m1, 0, 2)), Alloc(("stub", c1m1), 1),
        # the cool-down: recv_backward; B(c1, m0) makes its input gradient, kept by input_tensor_grad; its input
        # (no longer the model's, popped) goes once the backward returns
        Alloc(("ograd", c1m0), 2 * MIB),
        Alloc((c1m0, 0, 3), 2 * MIB), Free((c1m0, 0, 1)), Free((c1m0, 0, 2)), Free(("stub", c1m0)),
        Free(("in", c1m0)),
        # send_backward_recv_backward: the next output gradient, then the variable lets the last one go
        Alloc(("ograd", c1m1), 2 * MIB), Free(("ograd", c1m0)),
        Alloc((c1m1, 0, 3), 2 * MIB), Free((c1m1, 0, 1)), Free((c1m1, 0, 2)), Free((c1m0, 0, 3)),
        Free(("stub", c1m1)),
        Alloc(("ograd", c0m0), 2 * MIB), Free(("ograd", c1m1)),
        Free((c0m0, 0, 1)), Free((c0m0, 0, 2)), Free(("stub", c0m0)),
        Alloc(("ograd", c0m1), 2 * MIB), Free(("ograd", c0m0)),
        Free((c0m1, 0, 1)), Free((c0m1, 0, 2)), Free(("stub", c0m1)),
        # nothing more received: the variable lets the last go; chunk 1's model keeps its last input (and .grad)
        Free(("ograd", c0m1))]
    # By hand (all blocks between 1 and 10 MiB: 20 MiB segments; the 512 B stubs a 2 MiB small segment): F(c0,
    # m0) opens A (4 at 0, its output freed); F(c0, m1) takes 4 at 4, its output 2 at 8, chunk 1's input 2 at
    # 10, the output freed (a 2 MiB hole at 8); F(c1, m0): 4 at 12 (the hole is too small), its output the hole
    # at 8, the next input 2 at 16, the output freed: A's free blocks are 2 at 8 and 2 at 18. F(c1, m1)'s 4 MiB
    # finds none: segment B. Reserved 20 + 2 + 20; allocated at its most at B(c1, m0)'s input gradient: the four
    # kept 16, the two inputs 4, the output gradient 2, the input gradient 2, and the four stubs
    got = replay(events)
    assert (got.reserved_peak_bytes, got.allocated_peak_bytes, got.segments) == (42 * MIB, 24 * MIB + 4 * 512, 3)


def test_the_interleaved_replay_settles_as_a_fixed_count_of_steps_would():
    # the steps rank_player makes are rank_events' own, and once the cache settles further steps move no peak
    chunks = [([_Layer()], ["none"], [FIRST]), ([_Layer()], ["none"], [LATER])]
    kwargs = dict(static=EMPTY, stage=0, stages=2, num_microbatches=2, loss=None)
    events, one_step = rank_player(chunks, **kwargs)
    assert events + one_step(0) + one_step(1) == rank_events(chunks, steps=2, **kwargs)
    settled = settled_replay(*rank_player(chunks, **kwargs), min_steps=2, max_steps=reserve_megatron.MAX_STEPS)
    assert settled == replay(rank_events(chunks, steps=reserve_megatron.MAX_STEPS, **kwargs))


def test_the_hook_replays_megatrons_interleaved_schedule():
    setup = TrainSetup(stages=2, microbatches=4, micro_batch_size=1, mem_caps_bytes=[2**40] * 2,
                       schedule="interleaved-1F1B", chunks=2, precision="bf16-mixed", runtime="megatron")
    setup = setup.model_copy(update={"data_parallel": setup.data_parallel.model_copy(update={"dp": 2, "zero": 1})})
    assert reserve_megatron.replays(setup)
    zero3 = setup.model_copy(update={"data_parallel": setup.data_parallel.model_copy(update={"zero": 3})})
    assert not reserve_megatron.replays(zero3)  # Megatron-FSDP: not read
