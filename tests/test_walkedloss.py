"""The last stage's loss values on a walked schedule (issue 33; planner/cost/lossvalues.py's walked_value_bytes): each
microbatch's value stays from its backward to the step's end with the stage's held output."""

from pathlib import Path

import pytest

from planner.cost import costmodel, lossvalues
from planner.cost.chunked import schedule_of, sends_held_bytes
from planner.models.synthetic import layer, profile_of
from planner.schema import StagePlan, TrainSetup

HUGE = 2**50


def _setup(microbatches: int, schedule: str = "interleaved-1F1B", chunks: int = 2, **extra) -> TrainSetup:
    return TrainSetup(stages=2, microbatches=microbatches, micro_batch_size=1, schedule=schedule, chunks=chunks,
                      mem_caps_bytes=[HUGE] * 2, **extra)


def _layers():
    return [layer(f"l{i}", "A", fwd_ms=1, act_mib=1, input_mib=2, output_mib=2, param_count=0, transient_mib=1)
            for i in range(4)]


def test_the_value_rides_with_the_last_stages_output_by_hand(monkeypatch):
    """4 B (an fp32 scalar) on the last stage of interleaved 1F1B and ZBV (stage 3: rank 1's second chunk, rank 0's
    second under the V), with what its sends hold (sends_held_bytes' output, 4 B more than with the term read as 0),
    nowhere else, not on a closed form (lossvalues.held_values charges those) nor under a runtime whose own schedules
    keep no such list (Megatron-LM)."""
    l3 = _layers()[-1]
    for schedule in ("interleaved-1F1B", "ZBV"):
        setup = _setup(4, schedule)
        order = schedule_of(setup)
        assert [lossvalues.walked_value_bytes(s, order, setup.training) for s in range(4)] == [0, 0, 0, 4]
        on = sends_held_bytes(l3, l3, stage=3, order=order, training=setup.training)
        with monkeypatch.context() as patch:
            patch.setattr(lossvalues, "walked_value_bytes", lambda stage, order, training: 0)
            off = sends_held_bytes(l3, l3, stage=3, order=order, training=setup.training)
        assert (on[0] - off[0], on[1] - off[1]) == (4, 0)
    one = _setup(4, "1F1B", chunks=1)
    assert lossvalues.walked_value_bytes(1, schedule_of(one), one.training) == 0
    megatron = _setup(4, runtime="megatron")
    assert lossvalues.walked_value_bytes(3, schedule_of(megatron), megatron.training) == 0


def test_evaluate_holds_every_value_at_the_step_end(monkeypatch):
    """Interleaved 1F1B, 2 ranks x 2 chunks of one layer: the rank of the last stage holds M values more at its step's
    end than with the term read as 0, the other rank nothing more; its peak never less."""
    profile = profile_of(_layers())
    names = [item.name for item in profile.layers]
    stages = [StagePlan(index=0, layers=[names[0], names[2]], chunks=[[names[0]], [names[2]]]),
              StagePlan(index=1, layers=[names[1], names[3]], chunks=[[names[1]], [names[3]]])]
    for microbatches in (2, 4, 8):
        on = costmodel.evaluate(stages, profile, _setup(microbatches)).stages
        with monkeypatch.context() as patch:
            patch.setattr(lossvalues, "walked_value_bytes", lambda stage, order, training: 0)
            off = costmodel.evaluate(stages, profile, _setup(microbatches)).stages
        assert on[1].step_end_bytes - off[1].step_end_bytes == 4 * microbatches
        assert on[0].step_end_bytes == off[0].step_end_bytes and on[0].peak_bytes == off[0].peak_bytes
        assert on[1].peak_bytes >= off[1].peak_bytes


@pytest.mark.slow
@pytest.mark.parametrize("microbatches", [2, 8])
def test_shared_input_interleaved_ranks_peak_at_their_prediction(microbatches, tmp_path):
    """ckplan's own run (gloo), shared_input in 2 ranks x 2 chunks, 4 samples a microbatch: both ranks exactly their
    prediction (rank 1, the last stage's, was 4 B a microbatch under: its loss values, §45.ownunder)."""
    from planner import io
    from planner.runtime.launcher import run_plan
    from tests.fixtures.cli import run_ok

    root = Path(__file__).resolve().parent.parent
    profile_path, plan_path = tmp_path / "profile.json", tmp_path / "plan.yaml"
    run_ok("profile", root / "tests" / "fixtures" / "shared_input.py", "--micro-batch-size", "4", "--threads", "1",
           "--repeats", "1", "--warmup", "1", "--out", profile_path)
    run_ok("solve", "--profile", profile_path, "--stages", "2", "--mem", "100MiB", "--microbatches", str(microbatches),
           "--schedule", "interleaved-1F1B", "--chunks", "2", "--out", plan_path)
    plan, profile = io.load_plan(plan_path), io.load_profile(profile_path)
    cost = costmodel.evaluate(plan.stages, profile, plan.setup)
    plan = plan.model_copy(update={"stages": [stage.model_copy(update={"predicted": c.predicted()})
                                              for stage, c in zip(plan.stages, cost.stages)]})
    report = run_plan(plan, plan_file=plan_path, steps=1, warmup_steps=1)
    assert [s.measured.peak_bytes for s in report.stages] == [s.predicted.peak_bytes for s in report.stages], report
