"""A pipeline stage's gradient reductions after its last backward (planner/cost/pipereduce.py):
torchtitan 9dec370's torch (2.6.0) reduces a stage's FSDP2 groups one after another once its M-th
backward is queued, its rank's stream waiting for each but the last, and sends the stage's input
gradient only then. Hand-counted on tiny schedules and a 1,000-parameter layer."""

from __future__ import annotations

import dataclasses

import pytest

from planner.cost import costmodel, dataparallel, pipereduce, runtimes, schedules
from planner.cost.schedule_time import StageTimes, makespan_ms, simulate_time
from planner.models import synthetic
from planner.schema import TrainSetup

GB = 1e9


def setup(**fields) -> TrainSetup:
    base = dict(stages=2, microbatches=2, micro_batch_size=1, mem_caps_bytes=[2**50] * 2, precision="bf16-mixed",
                runtime="torchtitan", runtime_version="9dec370", dp=8, zero=3, zero_gather="per-iteration",
                shard_gb_per_s=1.0)
    return TrainSetup(**(base | fields))


@pytest.mark.parametrize("name", ["1F1B", "GPipe"])
def test_each_stage_reduces_after_its_last_backward_and_delays_its_send(name):
    """P = 2, M = 2, F 1 ms, B 2 ms, stage 0 reduces 0.5 ms, stage 1 0.25 ms. 1F1B: stage 1 runs
    F0 [1, 2], B0 [2, 4], F1 [4, 5], B1 [5, 7], then reduces to 7.25 before B1's gradient leaves;
    stage 0's B0 [4, 6], B1 [7.25, 9.25], its reduction to 9.75. GPipe: stage 1 F0, F1 [1, 3], B0
    [3, 5], B1 [5, 7] + 0.25; stage 0 the same 9.75. The closed form (no actions): 2 x 3 busy +
    (M - 1) x 3 + the drain's 0.75."""
    times = [StageTimes(1.0, 1.0, 1.0, reduce_ms=0.5), StageTimes(1.0, 1.0, 1.0, reduce_ms=0.25)]
    order = schedules.build_schedule(name, num_ranks=2, num_microbatches=2)
    assert simulate_time(order, stage_times=times).makespan_ms == pytest.approx(9.75)
    closed = schedules.pipeline_schedule(name, num_ranks=2, num_microbatches=2, num_chunks=1)
    assert not closed.actions
    assert makespan_ms(closed, stage_times=times) == pytest.approx(9.75)


def test_equal_stages_the_closed_form_is_the_simulation():
    """1F1B, P = 4, M = 8, equal stages, every stage reducing 0.7 ms: (M + P - 1) x (f + b) + 4 x 0.7."""
    times = [StageTimes(1.0, 1.5, 1.5, reduce_ms=0.7)] * 4
    order = schedules.build_schedule("1F1B", num_ranks=4, num_microbatches=8)
    closed = schedules.pipeline_schedule("1F1B", num_ranks=4, num_microbatches=8, num_chunks=1)
    expected = (8 + 4 - 1) * 4.0 + 4 * 0.7
    assert simulate_time(order, stage_times=times).makespan_ms == pytest.approx(expected)
    assert makespan_ms(closed, stage_times=times) == pytest.approx(expected)


def test_an_interleaved_ranks_later_chunk_reduces_in_the_middle_of_its_order():
    """Interleaved 1F1B, P = 2, V = 2, M = 2: each stage's reduction lengthens its 2nd B alone; the
    simulation with it equals the one without, each stage's 2nd B made longer by hand."""
    order = schedules.build_schedule("interleaved-1F1B", num_ranks=2, num_microbatches=2, num_chunks=2)
    plain = [StageTimes(1.0, 1.0, 1.0)] * 4
    reduced = [StageTimes(1.0, 1.0, 1.0, reduce_ms=0.5 + 0.1 * s) for s in range(4)]
    with_reduce = simulate_time(order, stage_times=reduced)
    assert with_reduce.makespan_ms > simulate_time(order, stage_times=plain).makespan_ms
    seen, ends = {}, []
    for rank, actions in enumerate(order.actions):
        for a, start in zip(actions, with_reduce.start_ms[rank]):
            if a.kind == "B":
                seen[a.stage] = seen.get(a.stage, 0) + 1
                if seen[a.stage] == 2:
                    ends.append(start + 2.0 + 0.5 + 0.1 * a.stage)
    assert with_reduce.makespan_ms == pytest.approx(max(ends))
    assert sum(with_reduce.busy_ms) == pytest.approx(4 * 2 * 3.0 + sum(0.5 + 0.1 * s for s in range(4)))


def layers(*param_counts):
    profile = synthetic.profile_of([synthetic.layer(f"l{i}", f"K{i}", fwd_ms=1000.0, act_mib=1, input_mib=1,
                                                    param_count=n) for i, n in enumerate(param_counts)])
    return costmodel.layer_costs(profile), profile


def test_a_stages_reductions_by_hand():
    """dp 8, fp32 gradients (torchtitan's reduce dtype) over 1 GB/s: a reduce-scatter moves 7/8 of
    4 B a parameter. Three layers of 1e6, 2e6, 3e6 parameters: 3.5 + 7 + 10.5 ms."""
    costs, _ = layers(1_000_000, 2_000_000, 3_000_000)
    assert pipereduce.stage_reductions_ms(costs, setup()) == pytest.approx(21.0)
    assert pipereduce.drain_ms(costs, setup()) == pytest.approx(21.0)
    assert pipereduce.drain_ms(costs, setup(schedule="interleaved-1F1B", chunks=2)) == 0.0  # simulated instead


@pytest.mark.parametrize("fields", [dict(runtime_version="2c8b5947"), dict(runtime="ckplan", runtime_version=None), dict(stages=1),
                                    dict(zero_gather="per-microbatch"), dict(dp=1)],
                         ids=["newer-torchtitan", "ckplan", "no-pipeline", "resharded", "no-dp"])
def test_only_torchtitan_9dec370s_pipeline_reduces_after_the_last_backward(fields):
    if fields.get("stages") == 1:
        fields |= dict(mem_caps_bytes=[2**50])
    costs, _ = layers(1_000_000)
    assert pipereduce.stage_reductions_ms(costs, setup(**fields)) == 0.0


def hiding(monkeypatch):
    """torchtitan 9dec370's record, its reductions hidden behind the backward (as before the fact)."""
    record = runtimes.facts("torchtitan", "9dec370")
    plain = dataclasses.replace(record, reduces_after_last_backward=False)
    original = runtimes.of
    monkeypatch.setattr(runtimes, "of", lambda training: plain if original(training) is record else original(training))


def test_the_step_carries_no_reduction_beside_a_pipeline(monkeypatch):
    """A 1e6-parameter layer whose backward (1 s) would hide its 3.5 ms reduce-scatter: under the
    fact the step leaves it to the schedule; without it, it hides (0 exposed) either way."""
    s = setup()
    assert dataparallel.grad_reduce_ms(1_000_000, s) == pytest.approx(3.5)
    gather = dataparallel.weight_gather_ms(1_000_000, s)
    assert dataparallel.exposed_comm_ms(1_000_000, s, bwd_ms=0.0) == pytest.approx(gather)
    hiding(monkeypatch)
    assert dataparallel.exposed_comm_ms(1_000_000, s, bwd_ms=0.0) == pytest.approx(3.5 + gather)
    assert dataparallel.exposed_comm_ms(1_000_000, s, bwd_ms=1000.0) == pytest.approx(gather)


def test_evaluate_puts_the_reductions_on_the_drain(monkeypatch):
    """Two stages of two layers (1e6 + 2e6, 3e6 + 1e6 parameters): 10.5 and 14 ms of reductions,
    each before its stage's last input gradient leaves: the 1F1B drain passes both, 24.5 ms more
    than the record hiding them behind the backward (whose steps hold none either)."""
    costs, profile = layers(1_000_000, 2_000_000, 3_000_000, 1_000_000)
    stages = costmodel.split_to_stages([0, 2], [False] * 4, profile)
    s = setup()
    ranks = costmodel.ranks_of(stages, s)
    after = costmodel.evaluate(ranks, profile, s)
    hiding(monkeypatch)
    before = costmodel.evaluate(ranks, profile, s)
    assert [a.step_ms for a in after.stages] == pytest.approx([b.step_ms for b in before.stages])
    assert after.iteration_ms - before.iteration_ms == pytest.approx(10.5 + 14.0)


@pytest.mark.parametrize("solver", ["dp", "milp"])
def test_the_solvers_objective_is_the_evaluators(solver):
    """The solvers add the drain as a constant (the same whatever the cuts): the plan they return
    re-evaluates to their objective (search._checked raises SolverMismatch otherwise)."""
    from planner.solve import search
    from planner.solve.deadline import Deadline

    _, profile = layers(1_000_000, 2_000_000, 3_000_000, 1_000_000, 2_000_000)
    s = setup(microbatches=4)
    result = search.plan(profile, s, solver=solver, deadline=Deadline(60))
    cost = costmodel.evaluate(result.stages, profile, s)
    assert result.solve.objective == pytest.approx(cost.iteration_ms, rel=1e-9)
    assert pipereduce.drain_ms(costmodel.layer_costs(profile), s) == pytest.approx(3.5 * 9)
