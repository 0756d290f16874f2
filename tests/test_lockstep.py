"""torch 2.6.0's PipelineScheduleMulti runs by time steps, each step's p2p batch waited before the
next (schedule_time.simulate_lockstep; the runtime record's multi_schedule_lockstep, torchtitan
9dec370's): hand-counted on interleaved 1F1B with P = 2, V = 2, M = 2."""

from __future__ import annotations

import dataclasses

import pytest

from planner.cost import costmodel, runtimes, schedules
from planner.cost.schedule_time import StageTimes, makespan_ms, simulate_lockstep, simulate_time
from planner.models import synthetic
from planner.schema import TrainSetup

F, B = 1.0, 2.0
TIMES = [StageTimes(F, B / 2, B / 2)] * 4


def order():
    return schedules.build_schedule("interleaved-1F1B", num_ranks=2, num_microbatches=2, num_chunks=2)


def test_torchs_time_steps_are_kept():
    """Stages 0, 2 on rank 0, 1, 3 on rank 1; torch's list with its idle steps."""
    steps = [[(a.time_step, f"{a.kind}{a.stage}.{a.microbatch}") for a in actions] for actions in order().actions]
    assert steps == [
        [(0, "F0.0"), (1, "F0.1"), (2, "F2.0"), (3, "F2.1"), (7, "B2.0"), (9, "B2.1"), (11, "B0.0"), (13, "B0.1")],
        [(1, "F1.0"), (2, "F1.1"), (4, "F3.0"), (5, "B3.0"), (6, "F3.1"), (7, "B3.1"), (9, "B1.0"), (11, "B1.1")],
    ]


def test_lockstep_by_hand():
    """F 1, B 2. Steps 0-3: the forwards exchange each step, both ranks ready at 1, 2, 3, 4; step 4
    rank 1's F3.0 [4, 5] sends nothing; step 5 its B3.0 [5, 7] sends to rank 0 (idle): both at 7;
    step 6 F3.1 [7, 8]; step 7 B2.0 [7, 9] and B3.1 [8, 10] exchange: both at 10; step 9 B2.1 and
    B1.0 [10, 12]; step 11 B0.0 and B1.1 [12, 14]; step 13 B0.1 [14, 16]. Data flow alone: 15 (rank
    1's F3.0 starts at 3, as F2.0 ends, not with its step)."""
    timeline = simulate_lockstep(order(), stage_times=TIMES)
    assert timeline.makespan_ms == pytest.approx(16.0)
    assert timeline.start_ms[1] == pytest.approx((1, 2, 4, 5, 7, 8, 10, 12))
    assert simulate_time(order(), stage_times=TIMES).makespan_ms == pytest.approx(15.0)
    assert makespan_ms(order(), stage_times=TIMES, lockstep=True) == pytest.approx(16.0)
    assert makespan_ms(order(), stage_times=TIMES) == pytest.approx(15.0)


def test_a_send_adds_to_each_exchanging_step():
    """A 0.5 ms send: each of the 8 steps where the ranks exchange (0, 1, 2, 3, 5, 7, 9, 11) ends
    0.5 later for both; the last step (13) sends nothing: 16 + 8 x 0.5."""
    assert simulate_lockstep(order(), stage_times=TIMES, send_ms=0.5).makespan_ms == pytest.approx(20.0)


def test_one_stage_a_rank_is_not_lockstep():
    """1F1B is a PipelineScheduleSingle: its own waits, the data flow's order."""
    one = schedules.build_schedule("1F1B", num_ranks=2, num_microbatches=2)
    times = [StageTimes(F, B / 2, B / 2)] * 2
    assert not one.several_stages_a_rank
    assert makespan_ms(one, stage_times=times, lockstep=True) == simulate_time(one, stage_times=times).makespan_ms


def test_evaluate_reads_the_record(monkeypatch):
    """torchtitan 9dec370 scores an interleaved plan in lockstep; the same record without the fact
    by the data flow, never longer."""
    profile = synthetic.profile_of([synthetic.layer(f"l{i}", f"K{i}", fwd_ms=1.0 + i % 3, act_mib=1, input_mib=1,
                                                    param_count=1000) for i in range(8)])
    s = TrainSetup(stages=2, microbatches=2, micro_batch_size=1, mem_caps_bytes=[2**50] * 2, schedule="interleaved-1F1B",
                   chunks=2, runtime="torchtitan", runtime_version="9dec370", precision="bf16-mixed")
    ranks = costmodel.ranks_of(costmodel.split_to_stages([0, 2, 4, 6], [False] * 8, profile), s)
    lock = costmodel.evaluate(ranks, profile, s).iteration_ms
    record = runtimes.facts("torchtitan", "9dec370")
    plain = dataclasses.replace(record, multi_schedule_lockstep=False)
    original = runtimes.of
    monkeypatch.setattr(runtimes, "of", lambda training: plain if original(training) is record else original(training))
    flow = costmodel.evaluate(ranks, profile, s).iteration_ms
    assert lock > flow
