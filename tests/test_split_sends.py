"""The published-rows harness's split of an iteration (scripts/published_rows.py split_terms) where the runtime runs
the pipeline's sends beside the compute (Megatron-core 92c8482e's interleaved overlap_p2p_comm; stagesends.py): those
sends hold no pass of the rank, so they are no busy time of it (else the bubble comes out negative: the rest of the
iteration less a busy time the schedule never ran), only its warm-up forwards' sends, which it waits for at once."""

import pytest
from fixtures.scripts import load_script
from test_solver_sends import _plans, _profile, _setup

from planner.cost import chunked, costmodel

rows_mod = load_script("published_rows")
MIB_MS = 2**20 / 2e9 * 1e3  # one MiB over the fixture's 2 GB/s pipeline link, no latency: 0.524288 ms


def _cut(cuts):
    profile, setup = _profile(), _setup()
    ranks = dict(_plans(profile, setup))[cuts]
    return ranks, profile, setup, costmodel.evaluate(ranks, profile, setup)


def test_rank_sends_by_hand():
    """Cuts (2, 3, 5) of 2 ranks x 2 chunks: stages l0-l1 | l2 | l3-l4 | l5, rank 0 holding stages 0 and 2, rank 1
    stages 1 and 3, every send crossing ranks. Rank 0 sends l1's output (1 MiB), l4's (1 MiB) and l3's input gradient
    (l2's output, 8 MiB); rank 1 l2's output (8 MiB), l2's input gradient (1 MiB) and l5's (1 MiB): 10 MiB a
    microbatch each. Warm-up: rank 0 sends stages 0's and 2's outputs of microbatches 0 and 1 (4 x 1 MiB), rank 1
    stage 1's (2 x 8 MiB)."""
    ranks, profile, setup, _ = _cut((2, 3, 5))
    got = chunked.rank_sends_ms(ranks, profile, setup)
    assert got == [pytest.approx((10 * MIB_MS, 4 * MIB_MS), rel=1e-12), pytest.approx((10 * MIB_MS, 16 * MIB_MS),
                                                                                         rel=1e-12)]


def test_sends_beside_are_no_busy_time_and_the_bubble_is_what_is_left():
    ranks, profile, setup, cost = _cut((2, 3, 5))
    got = rows_mod.split_terms("t", ranks, profile, setup, cost)
    # rank 0 computes F 0.97 + 0.64 + 0.77 + 1.19 = 3.57 ms and B twice that a microbatch, 4 microbatches; its sends,
    # 10 MiB a microbatch, run beside but for its 4 warm-up ones (1 MiB each), which hold it: busy 42.84 + 4 MiB's
    assert got["compute_s"] == pytest.approx(4 * 10.71 / 1e3, rel=1e-12)
    assert got["sends_s"] == pytest.approx(4 * MIB_MS / 1e3, rel=1e-12)
    assert got["sends_beside_s"] == pytest.approx((4 * 10 - 4) * MIB_MS / 1e3, rel=1e-12)
    assert got["sends_s"] + got["sends_beside_s"] == pytest.approx(4 * cost.stages[0].comm_ms / 1e3, rel=1e-12)
    # the bubble: evaluate's 58.384384 ms less the busy 42.84 + 2.097152
    assert cost.iteration_ms == pytest.approx(58.384384, abs=1e-9)
    assert got["bubble_s"] == pytest.approx((58.384384 - 42.84 - 4 * MIB_MS) / 1e3, rel=1e-9) and got["bubble_s"] > 0
    # of which the fill and drain of equal stages, (P - 1) x rank 0's F + B per microbatch / V = 10.71 / 2
    assert got["fill_drain_s"] == pytest.approx(10.71 / 2 / 1e3, rel=1e-12)
    parts = ("compute_s", "tp_comm_s", "cp_exchange_s", "cp_ring_membound_s", "sends_s", "step_and_exposed_dp_s",
             "bubble_s")
    assert sum(got[part] for part in parts) == pytest.approx(got["iteration_s"], abs=1e-12)
