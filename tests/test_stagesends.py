"""Pipeline sends run beside the compute (planner/cost/stagesends.py): a hand count of a 2-stage
1F1B order (F 1 ms, B 2 ms, every send 0.5 ms) with the sends in the passes, as the terms charge
them, and beside them, as Megatron-core's overlap_p2p_comm runs them."""

from types import SimpleNamespace

from planner.cost import runtimes, splittime
from planner.cost.schedule_time import StageTimes, simulate_time, warmup_forwards
from planner.cost.schedules import build_schedule


def test_sends_in_the_passes_hold_the_sender():
    # each stage sends one 0.5 ms tensor a microbatch, half of it charged to F, half to B
    order = build_schedule("1F1B", num_ranks=2, num_microbatches=2)
    times = [StageTimes(1.25, 1.125, 1.125)] * 2
    # r0 F0 0-1.25, F1 1.25-2.5; r1 F0 1.25-2.5, B0 2.5-4.75, F1 4.75-6, B1 6-8.25; r0 B0 4.75-7, B1 8.25-10.5
    assert simulate_time(order, stage_times=times).makespan_ms == 10.5


def test_sends_beside_the_compute_are_the_receivers_wait():
    order = build_schedule("1F1B", num_ranks=2, num_microbatches=2)
    times = [StageTimes(1.0, 1.0, 1.0)] * 2
    # stage 0 sends its output on, stage 1 its input's gradient back
    sends = [(0.5, 0.0), (0.0, 0.5)]
    # r0 F0 0-1, F1 1-2; r1 F0 1.5-2.5, B0 2.5-4.5, F1 4.5-5.5 (its input there at 2.5), B1 5.5-7.5;
    # r0 B0 from 4.5 + 0.5 to 7, B1 from 7.5 + 0.5 to 10
    assert simulate_time(order, stage_times=times, stage_sends=sends).makespan_ms == 10.0
    # a send on the sender's own rank is no wait: one rank, two stages
    one = build_schedule("interleaved-1F1B", num_ranks=1, num_microbatches=1, num_chunks=2)
    assert simulate_time(one, stage_times=times, stage_sends=sends).makespan_ms == 6.0


def test_warmup_forward_sends_hold_the_sender():
    # interleaved, 2 ranks, V = 2, M = 2, F 1 ms, B 2 ms; stage 0's output send 0.5 ms, every input
    # gradient's send 0.5 ms, the other outputs' nothing. r0: F0.0 F0.1 F2.0 F2.1 B2.0 B2.1 B0.0 B0.1, all
    # four forwards its warm-up ((2 - 0 - 1) x 2 + 1 x 2); r1: F1.0 F1.1 F3.0 B3.0 F3.1 B3.1 B1.0 B1.1 (2)
    order = build_schedule("interleaved-1F1B", num_ranks=2, num_microbatches=2, num_chunks=2)
    assert [warmup_forwards(order, rank) for rank in (0, 1)] == [4, 2]
    times = [StageTimes(1.0, 1.0, 1.0)] * 4
    sends = [(0.5, 0.0), (0.0, 0.5), (0.0, 0.5), (0.0, 0.5)]
    # r0 F0.0 0-1 and its send to 1.5, F0.1 1.5-2.5 and its send to 3; r1 F1.0 1.5-2.5 (no more wait),
    # F1.1 3-4; r0 F2.0 3-4, F2.1 4-5; r1 F3.0 4-5, B3.0 5-7, F3.1 7-8, B3.1 8-10; r0 B2.0 7.5-9.5,
    # B2.1 10.5-12.5; r1 B1.0 10-12, B1.1 13-15; r0 B0.0 12.5-14.5, B0.1 15.5-17.5
    timeline = simulate_time(order, stage_times=times, stage_sends=sends)
    assert timeline.start_ms[0][:4] == (0.0, 1.5, 3.0, 4.0)
    assert timeline.makespan_ms == 17.5
    # were the warm-up's sends beside the compute too (F0.1 at 1, F2.0 2.5-3.5, ...), 17.0


def test_warmup_is_the_orders_first_forwards():
    # Megatron's count (P - rank - 1) x 2 + (V - 1) x P, at most M x V, is where torch's interleaved
    # order runs forwards only
    for ranks, chunks, microbatches in ((2, 2, 4), (3, 2, 3), (4, 3, 8), (4, 2, 4)):
        order = build_schedule(
            "interleaved-1F1B", num_ranks=ranks, num_microbatches=microbatches, num_chunks=chunks
        )
        for rank, actions in enumerate(order.actions):
            warm = warmup_forwards(order, rank)
            assert warm == min((ranks - rank - 1) * 2 + (chunks - 1) * ranks, microbatches * chunks)
            assert {a.kind for a in actions[:warm]} == {"F"}


def test_the_sends_beside_leave_the_passes():
    # two 0.5 ms sends and 0.25 ms of actions
    stage = SimpleNamespace(forward_ms=1.0, comm_ms=1.0 + 0.25, busy_ms=3.0 + 1.25)
    inside = splittime.stage_times([stage], splits=None)[0]
    assert (inside.forward_ms, inside.backward_ms) == (1.625, 2.625)
    both = splittime.stage_times([stage], splits=None, beside=[(0.5, 0.5)])[0]
    assert (both.forward_ms, both.backward_ms) == (1.125, 2.125)
    back = splittime.stage_times([stage], splits=None, beside=[(0.0, 0.5)])[0]
    assert (back.forward_ms, back.backward_ms) == (1.375, 2.375)


def test_which_sends_each_record_runs_beside():
    # d98e8a64 waits the output's send at once; 92c8482e waits both at the next send
    assert runtimes.facts("megatron", "d98e8a64").stage_sends_beside == "backward"
    assert runtimes.facts("megatron", "92c8482e").stage_sends_beside == "both"
    assert runtimes.facts("ckplan").stage_sends_beside == "none"
