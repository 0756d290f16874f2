"""Communication and per-action terms of the cost model, by hand on tiny cases, and both
solvers seeing them (a boundary that carries much costs the plan that cuts there)."""

import pytest

from planner.cost import costmodel
from planner.models.synthetic import MIB, layer, profile_of
from planner.schema import TrainSetup
from planner.solve import search

HUGE = 2**50


def setup(stages: int, microbatches: int, **terms) -> TrainSetup:
    return TrainSetup(stages=stages, microbatches=microbatches, micro_batch_size=1, mem_caps_bytes=[HUGE] * stages,
                      **terms)


def one_boundary():
    """Two layers of 1 ms forward, 2 ms backward; 2 MiB cross the boundary each way."""
    return profile_of([layer("l0", "a", fwd_ms=1.0, act_mib=4, input_mib=1, output_mib=2, param_count=0),
                       layer("l1", "b", fwd_ms=1.0, act_mib=4, input_mib=2, output_mib=1, param_count=0)])


def split(profile):
    return costmodel.split_to_stages([0, 1], [False, False], profile)


# 2 MiB at 2.097152 GB/s is exactly 1 ms; latency 0.1 ms; 0.25 ms per action, two per microbatch
TERMS = dict(send_latency_ms=0.1, send_gb_per_s=2 * MIB / 1e6, action_overhead_ms=0.25)


def test_one_boundary_by_hand():
    profile = one_boundary()
    cost = costmodel.evaluate(split(profile), profile, setup(2, 2, **TERMS))
    # stage 0 sends its output (2 MiB) forward, stage 1 its input's gradient (2 MiB) back
    assert [c.time_ms for c in cost.stages] == [3.0, 3.0]  # compute alone, as a rank measures it
    assert [c.comm_ms for c in cost.stages] == pytest.approx([0.1 + 1.0 + 0.5] * 2, rel=1e-12)
    # Σ busy + (M - 1) · max busy = 2 · 4.6 + 4.6
    assert cost.iteration_ms == pytest.approx(13.8, rel=1e-12)
    assert costmodel.evaluate(split(profile), profile, setup(2, 2)).iteration_ms == 9.0  # uncalibrated: as before


def test_latency_alone_when_the_bandwidth_is_unknown():
    profile = one_boundary()
    cost = costmodel.evaluate(split(profile), profile, setup(2, 2, send_latency_ms=0.1))
    assert [c.comm_ms for c in cost.stages] == [0.1, 0.1]


def test_compute_scale_and_sharing_by_hand():
    profile = one_boundary()
    scaled = costmodel.evaluate(split(profile), profile, setup(2, 2, compute_scale=2.0, **TERMS))
    assert [c.time_ms for c in scaled.stages] == [6.0, 6.0]
    assert scaled.iteration_ms == pytest.approx(3 * 7.6, rel=1e-12)
    # one stage computing at a time: h · M · Σ busy / C = 1.5 · 2 · 9.2 / 1
    shared = costmodel.evaluate(split(profile), profile, setup(2, 2, parallel_stages=1, cpu_sharing=1.5, **TERMS))
    assert shared.iteration_ms == pytest.approx(27.6, rel=1e-12)


def fat_middle():
    """Four 3 ms layers; 64 MiB cross the middle boundary, 1 MiB the others."""
    outputs = [1, 64, 1, 1]
    inputs = [1, 1, 64, 1]
    return profile_of([layer(f"l{i}", f"k{i}", fwd_ms=1.0, act_mib=80, input_mib=inputs[i], output_mib=outputs[i],
                             param_count=0) for i in range(4)])


@pytest.mark.parametrize("method", ["dp", "milp"])
def test_the_solvers_avoid_cutting_where_much_crosses(method):
    profile = fat_middle()
    s = setup(2, 4, send_gb_per_s=64 * MIB / 10e6)  # 64 MiB: 10 ms, 1 MiB: 0.15625 ms
    result = search.plan(profile, s, solver=method, mip_gap=0.0, threads=1)
    assert [len(stage.layers) for stage in result.stages] in ([1, 3], [3, 1])
    # 3.15625 + 9.15625 + 3 · 9.15625
    assert result.cost.iteration_ms == pytest.approx(39.78125, rel=1e-9)
    # uncalibrated, the even cut was the answer
    even = search.plan(profile, setup(2, 4), solver=method, mip_gap=0.0, threads=1)
    assert [len(stage.layers) for stage in even.stages] == [2, 2]
