"""NCCL's CTAs beside the compute under Megatron-LM's interleaved side stream (planner/cost/schedule_time.py's
Issue.share, megatron_dp.stage_shares, nccl_sms.collective_shares), by hand on tiny simulated schedules: while a
collective taking a share s of the SMs runs, the rank's compute beside it runs at 1 - s of its rate, so an action
it overlaps for T ms of wall time ends s x T ms of work later (nccl_sms.py's first order)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from planner.cost import megatron_dp, nccl_sms, schedules
from planner.cost.schedule_time import Issue, SideStream, StageTimes, simulate_time
from planner.schema import TrainSetup
from tests.test_megatron_dp import GATHER_MS, REDUCE_MS, _layer, _setup

H100 = SimpleNamespace(assumptions={"gpu": "h100-sxm"})  # what dataparallel.profile_gpu reads of a profile
SHARE = 24 / 132  # an H100's 24 NVLink ring channels (a CTA each) of its 132 SMs, 2 ranks in one node


def _one_rank() -> tuple[schedules.Schedule, list[StageTimes]]:
    """1F1B's order on one rank, two microbatches: F0 B0 F1 B1, F 10 ms, B 20 ms (I 10 + W 10)."""
    order = schedules.build_schedule("1F1B", num_ranks=1, num_microbatches=2, num_chunks=1)
    return order, [StageTimes(10.0, 10.0, 10.0)]


def test_a_collective_slows_the_compute_it_overlaps_by_its_share_of_the_overlap():
    order, times = _one_rank()
    # 12 ms at the start taking a quarter of the SMs: F0 does 12 x 3/4 = 9 ms of work by 12, its last 1 ms after
    side = SideStream(((Issue(12.0, share=0.25),),))
    timeline = simulate_time(order, stage_times=times, side=side)
    assert timeline.start_ms[0] == (0.0, 13.0, 33.0, 43.0)
    assert timeline.makespan_ms == 63.0  # 60 ms of compute + 0.25 x 12
    # no share: the stream costs the compute nothing (the simulation before this branch)
    bare = simulate_time(order, stage_times=times, side=SideStream(((Issue(12.0),),)))
    assert bare.makespan_ms == 60.0


def test_a_collective_the_compute_waits_for_slows_nothing_and_one_past_the_compute_only_ends_the_stream():
    order, times = _one_rank()
    waited = SideStream(((Issue(12.0, key="AG", share=0.5),),), waits={(0, 0): ["AG"]})
    assert simulate_time(order, stage_times=times, side=waited).makespan_ms == 12.0 + 60.0  # idle while it runs
    after = SideStream(((),), issues={(0, 3): [Issue(8.0, "end", share=0.5)]})  # after the last backward
    assert simulate_time(order, stage_times=times, side=after).makespan_ms == 60.0 + 8.0


def test_a_collective_issued_inside_an_action_slows_the_rest_of_its_work():
    order, times = _one_rank()
    # B0 (20 ms from 10) issues 4 ms at half its work, taking half the SMs: 10 ms full rate, 4 ms doing 2, 8 more
    side = SideStream(((),), issues={(0, 1): [Issue(4.0, 0.5, share=0.5)]})
    timeline = simulate_time(order, stage_times=times, side=side)
    assert timeline.start_ms[0] == (0.0, 10.0, 32.0, 42.0)
    assert timeline.makespan_ms == 62.0


def test_collective_share_is_the_rings_ctas_over_the_sms_and_nothing_without_a_gpu():
    setup = _setup(stages=2, chunks=2, microbatches=4, overlap_grad_reduce=True)
    layers = [_layer("l0")]  # 100M parameters, no experts
    assert nccl_sms.collective_shares(H100, setup, layers) == (SHARE, SHARE)
    assert nccl_sms.collective_shares(None, setup, layers) == (0.0, 0.0)
    unknown = SimpleNamespace(assumptions={}, device=SimpleNamespace(name="Some Accelerator"))
    assert nccl_sms.collective_shares(unknown, setup, layers) == (0.0, 0.0)
    assert megatron_dp.stage_shares([_layer("l0")], H100, setup) == (SHARE, SHARE)


def _interleaved_one_rank(setup: TrainSetup, profile) -> float:
    """Interleaved 1F1B on one rank, two chunks (stages 0 and 1, a 100M-parameter layer each), two microbatches:
    F0s0 F0s1 B0s1 F1s0 B0s0 F1s1 B1s1 B1s0, F 5 ms, B 10 ms: 60 ms of compute."""
    order = schedules.build_schedule("interleaved-1F1B", num_ranks=1, num_microbatches=2, num_chunks=2)
    return megatron_dp.makespan_ms(order, [StageTimes(5.0, 5.0, 5.0)] * 2, [[_layer("l0")], [_layer("l1")]], setup,
                                   step_window_ms=[0.0], profile=profile)


def test_megatrons_aligned_reduction_slows_the_last_backward_it_runs_beside():
    setup = _setup(stages=2, chunks=2, microbatches=4, overlap_grad_reduce=True)
    # chunk 1's reduction (8 ms) issued as its last backward ends (50 ms), beside chunk 0's last backward (50-60):
    # that backward ends SHARE x 8 later, then chunk 0's reduction runs 8 ms
    assert _interleaved_one_rank(setup, None) == 60.0 + REDUCE_MS
    assert _interleaved_one_rank(setup, H100) == pytest.approx(60.0 + SHARE * REDUCE_MS + REDUCE_MS)


def test_megatrons_opening_gathers_slow_the_first_forward_beside_the_second_chunks():
    setup = _setup(stages=2, chunks=2, microbatches=4, overlap_grad_reduce=True, overlap_param_gather=True)
    # both chunks' gathers (4 ms each) issued at the start; F0s0 waits for chunk 0's (0-4), runs beside chunk 1's
    # (4-8): it ends SHARE x 4 later, and so does everything after it, the last backward's slowing included
    assert _interleaved_one_rank(setup, None) == GATHER_MS + 60.0 + REDUCE_MS
    assert _interleaved_one_rank(setup, H100) == pytest.approx(
        GATHER_MS + 60.0 + SHARE * GATHER_MS + SHARE * REDUCE_MS + REDUCE_MS)
