"""The stage output a 1F1B warm-up send keeps past its backward (planner/cost/warmupsend.py; docs/framework-facts.md
§666-§668): the count by hand, held to torch's own Schedule1F1B and ScheduleGPipe code run on a stage that records
what its sends' Works keep, evaluate's stage 0 by hand, and ckplan's own run of tests/fixtures/shared_input.py."""

import weakref
from pathlib import Path

import pytest
from torch.distributed.pipelining import schedules as torch_schedules

from planner.cost import costmodel, lossvalues, warmupsend
from planner.models.synthetic import layer, profile_of
from planner.schema import TrainSetup

MIB = 2**20
HUGE = 2**50


def _setup(stages: int, microbatches: int, schedule: str = "1F1B", **extra) -> TrainSetup:
    return TrainSetup(stages=stages, microbatches=microbatches, micro_batch_size=1, schedule=schedule,
                      mem_caps_bytes=[HUGE] * stages, **extra)


def test_the_count_by_hand():
    """w = min(M, P - s) warm-up forwards; microbatch w - 2's send is held from the warm-up to the steady phase's end,
    past its backward (the w - 1-th) where M - w >= w - 1. P = 4, M = 8: stages 0-2 (w 4, 3, 2); M = 4: stage 2 alone
    (w 2: 2 >= 1; stage 1's w 3: 1 < 2); P = 2, M = 2: none (the lead's exact 2-microbatch run); M = 3: stage 0."""
    def row(P, M, schedule="1F1B"):
        return [warmupsend.held_send_outputs(s, _setup(P, M, schedule)) for s in range(P)]

    assert row(4, 8) == [1, 1, 1, 0]
    assert row(4, 4) == [0, 0, 1, 0]
    assert row(2, 2) == [0, 0] and row(2, 3) == [1, 0] and row(2, 8) == [1, 0]
    assert row(4, 8, "GPipe") == [0] * 4  # every output is in flight at GPipe's first backward
    assert row(1, 4) == [0]


class _Token:
    """A microbatch's stage output."""

    def __init__(self, mb: int):
        self.mb = mb


class _Op:
    def __init__(self, tensor):
        self.tensor, self.peer = tensor, 0


class _Work:
    """A send's Work: it keeps its tensor (gloo's SendWork::tensor_, NCCL's WorkNCCL::outputs_) for its own life."""

    def __init__(self, ops):
        self.tensors = [op.tensor for op in ops]

    def wait(self):
        return True


class _Stage:
    """What a 1F1B or GPipe step asks of a stage, keeping each output from its forward to its backward (fwd_cache)
    and recording, at every backward, how many microbatches are in flight and which outputs past their backward
    are still alive (nothing but the schedule's sends can keep them)."""

    def __init__(self, index: int, stages: int):
        self.stage_index, self.num_stages, self.is_last = index, stages, index == stages - 1
        self.fwd_cache: dict[int, _Token] = {}
        self.made: list[weakref.ref] = []
        self.seen: list[tuple[int, int]] = []  # (in flight, outputs alive past their backward)

    def get_fwd_recv_ops(self, mb):
        return []

    def get_bwd_recv_ops(self, mb):
        return []

    def get_bwd_send_ops(self, mb):
        return []

    def perform_reduce_grad(self, scale):
        pass

    def get_fwd_send_ops(self, mb):
        return [] if self.is_last else [_Op(self.fwd_cache[mb])]

    def forward_one_chunk(self, mb, *args, **kwargs):
        token = _Token(mb)
        self.fwd_cache[mb] = token
        self.made.append(weakref.ref(token))
        return token

    def backward_one_chunk(self, mb, **kwargs):
        current = self.fwd_cache.pop(mb)
        alive = [ref() for ref in self.made]
        past = sum(1 for token in alive if token is not None and token is not current and token.mb not in self.fwd_cache)
        self.seen.append((len(self.fwd_cache) + 1, past))


def _torch_step(schedule_class, stage: _Stage, microbatches: int, monkeypatch) -> list[tuple[int, int]]:
    """torch 2.13.0's own `_step_microbatches` of `schedule_class` run on `stage`, its p2p calls made Works that keep
    their tensors."""
    monkeypatch.setattr(torch_schedules, "_batch_p2p", lambda ops, desc=None: [_Work(ops)] if ops else [])
    monkeypatch.setattr(torch_schedules, "_sorted_batch_p2p", lambda ops, desc=None: {0: [_Work(ops)]} if ops else {})
    schedule = object.__new__(schedule_class)
    schedule._stage, schedule._n_microbatches, schedule._num_stages = stage, microbatches, stage.num_stages
    schedule._loss_fn, schedule._internal_losses, schedule._has_backward = None, [], True
    schedule.scale_grads = True
    schedule._initialize_stage = lambda *args, **kwargs: None
    schedule._step_microbatches(return_outputs=False)
    return stage.seen


@pytest.mark.parametrize("schedule", ["1F1B", "GPipe"])
def test_torchs_own_schedule_holds_what_the_count_says(schedule, monkeypatch):
    """Every stage of 1-5 stages at 1-10 microbatches: at the backwards with the most microbatches in flight (the
    closed form's peak: min(P - s, M) under 1F1B, M under GPipe), the most outputs past their backward a send's Work
    still keeps is held_send_outputs' (1F1B: `send_work`; GPipe: fwd_sends_to_wait keeps every send to the step's end,
    but its peak is its first backward, none past it)."""
    classes = {"1F1B": torch_schedules.Schedule1F1B, "GPipe": torch_schedules.ScheduleGPipe}
    for stages in range(1, 6):
        for microbatches in range(stages, 11):
            setup = _setup(stages, microbatches, schedule)
            for index in range(stages):
                seen = _torch_step(classes[schedule], _Stage(index, stages), microbatches, monkeypatch)
                most = max(flight for flight, _ in seen)
                assert most == costmodel.in_flight(setup.pipeline, index)
                held = max(past for flight, past in seen if flight == most)
                assert held == warmupsend.held_send_outputs(index, setup), (stages, microbatches, index, seen)


def test_evaluate_charges_the_output_on_the_stage_that_holds_it(monkeypatch):
    """Two stages of one layer each (2 MiB out), 1F1B: at 3 microbatches stage 0's peak is 2 MiB over the same
    plan's with the term read as 0, its buffers likewise; at 2 microbatches, and on the last stage, nothing. Under
    torchtitan's oldest record (every stage's outputs kept to the step's end) the output is among those
    (held_outputs_bytes) and nothing more is charged."""
    layers = [layer("l0", "A", fwd_ms=1, act_mib=1, input_mib=2, output_mib=2, param_count=0, transient_mib=1),
              layer("l1", "B", fwd_ms=1, act_mib=1, input_mib=2, output_mib=2, param_count=0, transient_mib=1)]
    profile = profile_of(layers)
    stages = costmodel.split_to_stages([0, 1], [False] * 2, profile)

    def costs(microbatches, **extra):
        return costmodel.evaluate(stages, profile, _setup(2, microbatches, **extra)).stages

    on3, on2 = costs(3), costs(2)
    old = costs(3, runtime="torchtitan", runtime_version="9dec370")
    monkeypatch.setattr(warmupsend, "held_send_outputs", lambda stage, setup: 0)
    off3, off2 = costs(3), costs(2)
    assert on3[0].peak_bytes - off3[0].peak_bytes == 2 * MIB == on3[0].buffer_bytes - off3[0].buffer_bytes
    assert on3[1].peak_bytes == off3[1].peak_bytes
    assert [c.peak_bytes for c in on2] == [c.peak_bytes for c in off2]
    assert [c.peak_bytes for c in old] == [c.peak_bytes for c in costs(3, runtime="torchtitan", runtime_version="9dec370")]


def test_the_last_stage_holds_every_loss_value_and_the_seed_by_hand():
    """shared_input's measured last stage (framework-facts §669): 1F1B at 4 microbatches holds 4 loss values (4 B each)
    and the seed, 20 B, none of it charged but the in-flight microbatch's value, netted off before the layers' backward
    with the loss's saved tensors: 5 values; GPipe (every microbatch in flight, three values charged as kept) that one
    and the seed, 8 B. No other stage, no walked schedule, no runtime of its own schedules."""
    assert lossvalues.held_values_bytes(1, _setup(2, 4)) == 5 * 4
    assert lossvalues.held_values_bytes(1, _setup(2, 8)) == 9 * 4
    assert lossvalues.held_values_bytes(1, _setup(2, 4, "GPipe")) == 2 * 4
    assert lossvalues.held_values_bytes(0, _setup(2, 4)) == 0
    assert lossvalues.held_values_bytes(0, _setup(1, 4)) == 0
    assert lossvalues.held_values_bytes(1, _setup(2, 4, "interleaved-1F1B", chunks=2)) == 0
    assert lossvalues.held_values_bytes(1, _setup(2, 4, runtime="torchtitan")) == 5 * 4
    assert lossvalues.held_values_bytes(1, _setup(2, 4, runtime="megatron")) == 0


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["1F1B", "GPipe"])
def test_the_shared_input_models_stages_peak_at_their_prediction(schedule, tmp_path):
    """Squash + Res | Res + head, 4 microbatches of 4, ckplan's own run: both stages exactly their prediction (stage 0
    under 1F1B holds microbatch 0's output by its warm-up send; the last stage its four loss values and the seed)."""
    from planner import io
    from planner.runtime.launcher import run_plan
    from planner.schema import StagePlan
    from tests.fixtures.cli import run_ok

    root = Path(__file__).resolve().parent.parent
    profile_path, plan_path = tmp_path / "profile.json", tmp_path / "plan.yaml"
    run_ok("profile", root / "tests" / "fixtures" / "shared_input.py", "--micro-batch-size", "4", "--threads", "1",
           "--repeats", "1", "--warmup", "1", "--out", profile_path)
    run_ok("solve", "--profile", profile_path, "--stages", "2", "--mem", "10MiB", "--microbatches", "4",
           "--schedule", schedule, "--out", plan_path)
    plan, profile = io.load_plan(plan_path), io.load_profile(profile_path)
    names = [item.name for item in profile.layers]
    stages = [StagePlan(index=0, layers=names[:2]), StagePlan(index=1, layers=names[2:])]
    cost = costmodel.evaluate(stages, profile, plan.setup)
    plan = plan.model_copy(update={"stages": [stage.model_copy(update={"predicted": c.predicted()})
                                              for stage, c in zip(stages, cost.stages)]})
    report = run_plan(plan, plan_file=plan_path, steps=1, warmup_steps=1)
    assert [s.measured.peak_bytes for s in report.stages] == [s.predicted.peak_bytes for s in report.stages], report
