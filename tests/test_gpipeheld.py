"""GPipe's backwards leave their input-gradient sends and the last stage's loss values held to the step's end
(planner/cost/gpipeheld.py): a stage past the first whose kept bytes a microbatch are fewer than its input gradient
peaks at its last backward, in evaluate, the DP and the MILP alike (issue 33, §45.ownunder's gap)."""

import dataclasses
from pathlib import Path

import pytest

from planner.cost import costmodel, gpipeheld, gradtiming
from planner.cost.gpipeheld import held_per_backward_bytes
from planner.models.synthetic import layer, profile_of
from planner.schema import StagePlan, TrainSetup
from planner.solve import search
from tests.test_milp import brute_optimum

MIB = 2**20
HUGE = 2**50


def _profile():
    """b0 (10 MiB kept, 1 MiB in and out), up (1 MiB in, 4 MiB out) and a head reading those 4 MiB and keeping
    0.5 MiB (its 0.5 MiB of act is its input, in the receive buffer when it opens a stage, and its 0.5 MiB output)."""
    return profile_of([layer("b0", "Block", fwd_ms=1, act_mib=10, input_mib=1, output_mib=1, param_count=0),
                       layer("up", "Up", fwd_ms=1, act_mib=0.5, input_mib=1, output_mib=4, param_count=0),
                       layer("head", "Head", fwd_ms=2, act_mib=0.5, input_mib=4, output_mib=0.5, param_count=0)])


def _setup(microbatches=4, schedule="GPipe", caps=None, stages=2, **extra) -> TrainSetup:
    return TrainSetup(stages=stages, microbatches=microbatches, micro_batch_size=1, schedule=schedule,
                      mem_caps_bytes=caps or [HUGE] * stages, **extra)


def _plan(cut: int) -> list[StagePlan]:
    names = ["b0", "up", "head"]
    return [StagePlan(index=0, layers=names[:cut]), StagePlan(index=1, layers=names[cut:])]


def test_what_each_backward_leaves_by_hand():
    """The input gradient (the stage input's bytes) past the first stage, the loss value's 4 B on the last, under
    GPipe only; none for an input needing no gradient, none beside Megatron-LM (no such sends held, no values)."""
    head, up = costmodel.layer_costs(_profile())[2], costmodel.layer_costs(_profile())[1]
    assert held_per_backward_bytes(head, 1, _setup()) == 4 * MIB + 4
    assert held_per_backward_bytes(head, 0, _setup()) == 0
    assert held_per_backward_bytes(up, 1, _setup(stages=3)) == MIB  # a middle stage: no loss value
    assert held_per_backward_bytes(head, 2, _setup(stages=3)) == 4 * MIB + 4
    assert held_per_backward_bytes(head, 1, _setup(schedule="1F1B")) == 0
    assert held_per_backward_bytes(head, 0, _setup(stages=1)) == 0
    assert held_per_backward_bytes(dataclasses.replace(head, input_grad=False), 1, _setup()) == 4
    assert held_per_backward_bytes(head, 1, _setup(runtime="megatron")) == 0


def test_one_chunk_takes_the_first_second_or_last_backward():
    """Above M·kept (gradtiming.one_chunk), lazy gradients L, kept K, per backward h, M = 4: max(0, L - K at the
    first backward, L - K + h at the second, L + 3 (h - K) at the last); with no h, L - K as before."""
    def above(lazy, kept, h, m=4):
        return gradtiming.one_chunk(lazy, in_flight=m, kept=kept, microbatches=m, steady=False, per_backward=h)
    assert above(10, 3, 0) == 7
    assert above(10, 3, 2) == 9  # the second: 10 - 3 + 2 (the last: 10 - 3 = 7)
    assert above(10, 3, 5) == 16  # the last: 10 + 3 * 2
    assert above(0, 3, 5) == 6 and above(0, 3, 2) == 0  # no lazy gradients: 3 (h - K) or the first
    assert above(10, 3, 5, m=1) == 7  # one backward: its first is its last
    assert gradtiming.one_chunk(10, in_flight=2, kept=3, microbatches=4, steady=True) == 10  # 1F1B as before


@pytest.mark.parametrize("microbatches, first, last", [(1, 9 * MIB // 2 + 8, 9 * MIB // 2 + 8),
                                                       (2, 9 * MIB + 8, 25 * MIB // 2 + 12),
                                                       (4, 18 * MIB + 8, 57 * MIB // 2 + 20)])
def test_the_head_alone_peaks_at_its_last_backward(microbatches, first, last, monkeypatch):
    """[b0, up] | [head]: M receive buffers of 4 MiB and 2 loss values of 4 B, K = 0.5 MiB; at the first backward
    M·K, at the last K + (M - 1)·(4 MiB + 4 B). M = 1: 4 + 0.5 MiB + 8 B at both (one backward); M = 2: 8 + 1 MiB
    + 8 B, 8 + 0.5 + 4 MiB + 12 B; M = 4: 16 + 2 MiB + 8 B, 16 + 0.5 + 12 MiB + 20 B. Stage 0 holds nothing more."""
    on = costmodel.evaluate(_plan(2), _profile(), _setup(microbatches)).stages
    with monkeypatch.context() as patch:  # what each backward leaves read as nothing: the first backward alone
        patch.setattr(gpipeheld, "held_per_backward_bytes", lambda first, stage, setup: 0)
        off = costmodel.evaluate(_plan(2), _profile(), _setup(microbatches)).stages
    assert (off[1].peak_bytes, on[1].peak_bytes) == (first, last)
    assert on[0].peak_bytes == off[0].peak_bytes == microbatches * (27 * MIB // 2 + 4 * MIB)


@pytest.mark.parametrize("method", ["dp", "milp"])
def test_the_solvers_leave_the_head_alone_where_its_last_backward_does_not_fit(method):
    """Stage 1 capped at 23 MiB: [b0, up] | [head] (30 ms: 6 | 6 ms a microbatch, 12 + 3 * 6) peaked 18 MiB + 8 B
    at its first backward, 28.5 MiB + 20 B at its last; [b0] | [up, head] (39 ms: 3 | 9, 12 + 3 * 9) holds 4 receive
    buffers of 1 MiB and 8 B of values, K = 1 MiB, h = 1 MiB + 4 B: 4 + 1 + 3 (1 MiB + 4 B) MiB + 8 B = 8 MiB + 20 B,
    and stage 0 4 x 10 MiB + 4 gradient receive buffers of 1 MiB = 44 MiB; b0 recomputed buys nothing there."""
    s = _setup(caps=[HUGE, 23 * MIB])
    result = search.plan(_profile(), s, solver=method, mip_gap=0.0, threads=1)
    assert result.solve.status == "optimal"
    assert [stage.layers for stage in result.stages] == [["b0"], ["up", "head"]]
    assert result.cost.iteration_ms == pytest.approx(39.0)
    assert result.cost.peak_bytes_per_stage == [44 * MIB, 8 * MIB + 20]
    assert brute_optimum(_profile(), s)[1] == pytest.approx(39.0)


@pytest.mark.slow
@pytest.mark.parametrize("microbatches", [2, 8])
def test_shared_input_head_alone_peaks_at_its_prediction(microbatches, tmp_path):
    """ckplan's own run (gloo), shared_input under GPipe cut 3 | 1 (the head alone: kept 1,032 B a microbatch, its
    input gradient 2,048 B), 4 samples a microbatch: both stages exactly their prediction (stage 1 was
    (M - 1)·1,020 B under: 11,108 / 10,088 and 37,244 / 30,104 at M 2 and 8, §45.ownunder)."""
    from planner import io
    from planner.runtime.launcher import run_plan
    from tests.fixtures.cli import run_ok
    root = Path(__file__).resolve().parent.parent
    profile_path, plan_path = tmp_path / "profile.json", tmp_path / "plan.yaml"
    run_ok("profile", root / "tests" / "fixtures" / "shared_input.py", "--micro-batch-size", "4", "--threads", "1",
           "--repeats", "1", "--warmup", "1", "--out", profile_path)
    run_ok("solve", "--profile", profile_path, "--stages", "2", "--mem", "100MiB", "--microbatches", str(microbatches),
           "--schedule", "GPipe", "--out", plan_path)
    plan, profile = io.load_plan(plan_path), io.load_profile(profile_path)
    names = [item.name for item in profile.layers]
    stages = [StagePlan(index=0, layers=names[:3]), StagePlan(index=1, layers=names[3:])]
    cost = costmodel.evaluate(stages, profile, plan.setup)
    plan = plan.model_copy(update={"stages": [stage.model_copy(update={"predicted": c.predicted()})
                                              for stage, c in zip(stages, cost.stages)]})
    io.write_atomic(plan_path, io.plan_to_yaml(plan))
    report = run_plan(plan, plan_file=plan_path, steps=1, warmup_steps=1)
    assert [s.measured.peak_bytes for s in report.stages] == [s.predicted.peak_bytes for s in report.stages], report


def test_the_replays_hold_each_sent_gradient_under_gpipe():
    """ckplan's own step replay (reserve.stage_events): under GPipe past the first stage each input gradient sent
    (test_reserve's RECORD: 6 MiB, id 4) is freed only once every backward has run, so B1 starts with B0's beside
    it; otherwise at its own backward's end. gpipeheld.sends_held says where (not stage 0, not 1F1B, not
    Megatron-LM's record)."""
    from planner.cost.allocator import Free
    from planner.cost.reserve import StageMemory, stage_events
    from tests.test_reserve import RECORD, _Layer
    actions = [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    memory = StageMemory(static_bytes=0, buffer_bytes=0, scratch_bytes=0)

    def frees(held):
        events = stage_events([_Layer()], ["none"], [RECORD], actions=actions, memory=memory, num_microbatches=2,
                              loss=None, sends_held=held)
        return [e.key for e in events if isinstance(e, Free) and e.key[-1] == 4]
    assert frees(False) == [(0, 0, 4), (1, 0, 4)]
    held = stage_events([_Layer()], ["none"], [RECORD], actions=actions, memory=memory, num_microbatches=2,
                        loss=None, sends_held=True)
    body = [e for e in held if e.key[0] != "scratch"]  # before the optimizer step's scratch
    assert body[-2:] == [Free((0, 0, 4)), Free((1, 0, 4))]  # after B1's last event
    assert [gpipeheld.sends_held(s, _setup()) for s in (0, 1)] == [False, True]
    assert not gpipeheld.sends_held(1, _setup(schedule="1F1B"))
    assert not gpipeheld.sends_held(1, _setup(runtime="megatron"))
