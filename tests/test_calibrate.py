"""Calibration recovers known constants from synthetic measurements made by the cost model."""

import pytest

from planner.cost import costmodel
from planner.measure import calibrate
from planner.measure.calibrate import PipelineSample, SendSample
from planner.models.synthetic import heterogeneous
from planner.placement import placement_threads
from planner.schema import Calibration, DeviceInfo, FileRef, TrainSetup
from planner.solve import baselines

HUGE = 2**50


def setup(stages: int, **terms) -> TrainSetup:
    return TrainSetup(stages=stages, microbatches=2 * stages, micro_batch_size=1, mem_caps_bytes=[HUGE] * stages,
                      **terms)


def measured(profile, truth: TrainSetup) -> PipelineSample:
    """What a run would measure if the cost model with `truth`'s constants were exact."""
    stages = baselines.no_checkpointing(profile, truth)
    cost = costmodel.evaluate(stages, profile, truth)
    return PipelineSample(stages=stages, stage_ms=[c.time_ms for c in cost.stages], iteration_ms=cost.iteration_ms)


def test_send_line_through_exact_samples():
    # 0.05 ms latency, 2 GB/s: 1 MB takes 0.05 + 0.5 ms
    samples = [SendSample(n, 0.05 + n / 2e6) for n in (1_000, 100_000, 1_000_000, 4_000_000)]
    latency, gb_per_s = calibrate.fit_send(samples)
    assert latency == pytest.approx(0.05, rel=1e-9)
    assert gb_per_s == pytest.approx(2.0, rel=1e-9)


def test_a_send_line_that_does_not_rise_leaves_bandwidth_unresolved():
    assert calibrate.fit_send([SendSample(10, 0.3), SendSample(10_000, 0.1)]) == (pytest.approx(0.2), None)
    with pytest.raises(ValueError, match="two sizes"):
        calibrate.fit_send([SendSample(10, 0.3)])


def test_compute_scale_and_action_overhead_recovered_when_every_stage_has_its_cores():
    profile = heterogeneous(12, seed=3)
    sends = dict(send_latency_ms=0.2, send_gb_per_s=0.5)
    truth = setup(4, compute_scale=1.3, action_overhead_ms=0.7, **sends)
    sample = measured(profile, truth)
    fit, overhead = calibrate.fit_placement(sample, profile, setup(4, **sends), ranks=4, threads=1, cores=4,
                                            plan="p.yaml", action_overhead_ms=None)
    assert fit.compute_scale == pytest.approx(1.3, rel=1e-9)
    assert overhead == pytest.approx(0.7, rel=1e-9)
    assert fit.cpu_sharing == 1.0
    assert fit.predicted_after_ms == pytest.approx(sample.iteration_ms, rel=1e-9)
    assert fit.predicted_before_ms < sample.iteration_ms  # uncalibrated: no sends, no actions, compute as profiled


def test_cpu_sharing_recovered_when_ranks_share_cores_with_the_earlier_action_cost():
    profile = heterogeneous(12, seed=4)
    shared = dict(parallel_stages=2, send_latency_ms=0.1, send_gb_per_s=1.0)
    truth = setup(4, compute_scale=1.8, action_overhead_ms=0.5, cpu_sharing=1.2, **shared)
    sample = measured(profile, truth)
    assert costmodel.capacity_ms(1, 0, truth) > 0
    fit, overhead = calibrate.fit_placement(sample, profile, setup(4, **shared), ranks=4, threads=1, cores=2,
                                            plan="p.yaml", action_overhead_ms=0.5)
    assert overhead == 0.5
    assert fit.compute_scale == pytest.approx(1.8, rel=1e-9)
    assert fit.cpu_sharing == pytest.approx(1.2, rel=1e-9)
    assert fit.predicted_after_ms == pytest.approx(sample.iteration_ms, rel=1e-9)


def test_a_run_faster_than_the_model_without_overhead_fits_zero_overhead():
    profile = heterogeneous(6, seed=5)
    truth = setup(2)
    sample = measured(profile, truth)
    faster = PipelineSample(sample.stages, sample.stage_ms, sample.iteration_ms * 0.9)
    assert calibrate.fit_action_overhead(faster, profile, truth) == 0.0


def calibration(**fields) -> Calibration:
    base = dict(created_at="2026-01-01T00:00:00+00:00", profile=FileRef(file="p.json", sha256="0" * 64),
                backend="gloo", device_type="cpu", send_latency_ms=0.2, send_gb_per_s=1.5, action_overhead_ms=0.3)
    return Calibration(**{**base, **fields})


def placement(ranks, threads, scale):
    from planner.schema import PlacementFit

    return PlacementFit(ranks=ranks, threads=threads, cores=2, compute_scale=scale, plan="p.yaml",
                        measured_iteration_ms=1, predicted_before_ms=1, predicted_after_ms=1)


def test_apply_takes_the_placement_that_was_measured_and_says_when_none_was():
    cal = calibration(placements=[placement(2, 1, 1.1), placement(4, 1, 2.0)])
    applied = calibrate.apply(setup(4), cal, ranks=4, threads=1, source="p.calibration.json")
    assert (applied.time.send_latency_ms, applied.time.send_gb_per_s, applied.time.action_overhead_ms) == (0.2, 1.5, 0.3)
    assert applied.time.compute_scale == 2.0
    assert "measured with 4 ranks x 1 threads" in applied.time.calibration
    other = calibrate.apply(setup(4), cal, ranks=4, threads=2, source="p.calibration.json")
    assert other.time.compute_scale == 1.0 and "no run measured 4 ranks x 2 threads" in other.time.calibration
    assert calibrate.uncalibrated(applied) == setup(4)


def test_merged_keeps_other_placements_and_replaces_the_same_one():
    old = calibration(placements=[placement(2, 1, 1.1), placement(4, 1, 2.0)])
    new = calibration(placements=[placement(4, 1, 1.7)])
    assert [(p.ranks, p.compute_scale) for p in calibrate.merged(old, new).placements] == [(2, 1.1), (4, 1.7)]


# ---------------------------------------------------------------- placement and where solve reads it


@pytest.mark.parametrize("profile_threads, ranks, cores, expected", [
    (2, 2, 2, (1, "cpu_count")),  # profiled at 2 threads: 2 ranks x 2 would oversubscribe 2 cores
    (1, 2, 2, (1, "plan")),
    (1, 4, 2, (1, "plan")),  # more ranks than cores: one thread each, the least there is
    (None, 2, 8, (4, "cpu_count")),
    (None, 4, 2, (1, "cpu_count")),  # a 4-stage plan without threads on 2 cores (test_gpt_runs_in_stages had it)
    (None, 4, 16, (4, "cpu_count")),
    (2, 2, 8, (2, "plan")),
])
def test_launch_threads_never_oversubscribe_by_default(profile_threads, ranks, cores, expected):
    assert placement_threads(profile_threads, ranks, cores) == expected


def test_solve_counts_the_stages_that_compute_at_once_with_the_launchs_threads(monkeypatch):
    from planner.commands import setup_options

    monkeypatch.setattr(setup_options.os, "cpu_count", lambda: 2)
    two_threads = heterogeneous(6).model_copy(update={"device": heterogeneous(6).device.model_copy(
        update={"threads": 2})})
    # a launch gives each of 2 ranks one thread: both compute at once (it was 2 cores / 2 threads = 1)
    assert setup_options.default_parallel_stages(two_threads, 2) is None
    assert setup_options.default_parallel_stages(two_threads, 4) == 2


def test_solve_applies_the_calibration_beside_the_profile_and_says_so(tmp_path, monkeypatch):
    from planner import io
    from planner.commands.calibration import calibrated_setup, calibration_path
    from planner.schema import FileRef

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    profile = heterogeneous(6)  # profiled with 1 thread
    profile_path = tmp_path / "p.json"
    io.save_profile(profile, profile_path)
    plain, notes = calibrated_setup(profile, profile_path, setup(2))
    # compute as profiled; the step charged at the launch's 1 thread a rank (tests/test_step_threads.py)
    assert plain == setup(2).model_copy(update={"rank_threads": 1}) and len(notes) == 1 and "not calibrated" in notes[0]
    two_threads = profile.model_copy(update={"device": profile.device.model_copy(update={"threads": 2})})
    _, notes = calibrated_setup(two_threads, profile_path, setup(2))
    assert "the profile was measured with 2 threads; a launch gives each of the 2 ranks 1" in notes[0]
    pinned = FileRef(file=str(profile_path), sha256=io.sha256_file(profile_path))
    calibration_path(profile_path).write_text(calibration(placements=[placement(2, 1, 1.25)]).model_dump_json())
    stale, notes = calibrated_setup(profile, profile_path, setup(2))  # fitted to another profile: not applied
    assert stale == setup(2) and "fitted to another version" in notes[0] and "is not applied" in notes[0]
    calibration_path(profile_path).write_text(
        calibration(profile=pinned, placements=[placement(2, 1, 1.25)]).model_dump_json())
    applied, notes = calibrated_setup(profile, profile_path, setup(2))
    assert (applied.time.compute_scale, applied.time.send_latency_ms, applied.time.action_overhead_ms) == (1.25, 0.2, 0.3)
    assert str(calibration_path(profile_path)) in notes[0] and "2 ranks x 1 threads" in notes[0]
    calibration_path(profile_path).write_text("{}")
    from planner.errors import UserError

    with pytest.raises(UserError, match="not a valid calibration"):
        calibrated_setup(profile, profile_path, setup(2))


# ---------------------------------------------------------------- the command, wired end to end (no processes)


def test_calibrate_command_fits_a_run_and_solve_then_predicts_it(tmp_path, monkeypatch):
    """A run that behaves exactly like the cost model with known constants: calibrate writes
    those constants beside the profile, and the next solve predicts the run's iteration."""
    from click.testing import CliRunner

    import planner.profiler.commbench as commbench
    import planner.runtime.launcher as launcher
    from planner import io
    from planner.cli import cli
    from planner.schema import DeviceInfo, RunReport, StageMeasured, StageReport

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.chdir(tmp_path)
    profile = heterogeneous(6, seed=7)
    io.save_profile(profile, tmp_path / "p.json")
    (tmp_path / profile.model.file).write_text("")  # calibrate checks the model file exists before timing
    runner = CliRunner()
    solved = runner.invoke(cli, ["solve", "--profile", "p.json", "--mem", "100GiB", "--stages", "2", "--out", "plan.yaml"])
    assert solved.exit_code == 0 and "not calibrated" in solved.output, solved.output
    plan = io.load_plan(tmp_path / "plan.yaml")
    sends = dict(send_latency_ms=0.05, send_gb_per_s=2.0)
    truth = plan.setup.model_copy(update=dict(compute_scale=1.5, action_overhead_ms=0.3, **sends))
    cost = costmodel.evaluate(plan.stages, profile, truth)

    def run_plan(plan_, **kwargs):
        stages = [StageReport(index=s, cap_bytes=1, measured=StageMeasured(peak_bytes=0, fwd_ms=0, bwd_ms=0,
                                                                           time_ms=c.time_ms))
                  for s, c in enumerate(cost.stages)]
        return RunReport(created_at="now", plan=plan_.profile, device=DeviceInfo(type="cpu", name="x", threads=1),
                         backend="gloo", steps=3, warmup_steps=1, microbatches=4, iteration_ms=cost.iteration_ms,
                         iteration_ms_all=[cost.iteration_ms], predicted_iteration_ms=1, losses=[1.0], stages=stages)

    monkeypatch.setattr(launcher, "run_plan", run_plan)
    monkeypatch.setattr(commbench, "measure_sends", lambda **kwargs: [
        SendSample(n, 0.05 + n / 2e6) for n in commbench.SIZES_BYTES])
    monkeypatch.setattr("planner.commands.calibrate.busy_share", lambda: 0.0)  # the test machine may be busy
    result = runner.invoke(cli, ["calibrate", "plan.yaml"])
    assert result.exit_code == 0, result.output
    assert "before" in result.output and "after" in result.output
    written = Calibration.model_validate_json((tmp_path / "p.calibration.json").read_text())
    assert written.send_latency_ms == pytest.approx(0.05) and written.send_gb_per_s == pytest.approx(2.0)
    assert written.action_overhead_ms == pytest.approx(0.3, rel=1e-6)
    assert written.placements[0].compute_scale == pytest.approx(1.5) and len(written.notes) == 3
    again = runner.invoke(cli, ["solve", "--profile", "p.json", "--mem", "100GiB", "--stages", "2", "--out", "plan2.yaml"])
    assert again.exit_code == 0 and "time constants from p.calibration.json" in again.output, again.output
    replanned = io.load_plan(tmp_path / "plan2.yaml")
    assert costmodel.evaluate(plan.stages, profile, replanned.setup).iteration_ms == pytest.approx(
        cost.iteration_ms, rel=1e-6)

    # the same plan again, measured under load and 10x slower per action: a suspect fit, refused and the
    # earlier constants kept; --accept writes it
    before = (tmp_path / "p.calibration.json").read_bytes()
    truth = truth.model_copy(update={"action_overhead_ms": 3.0})
    cost = costmodel.evaluate(plan.stages, profile, truth)
    monkeypatch.setattr("planner.commands.calibrate.busy_share", lambda: 0.6)
    result = runner.invoke(cli, ["calibrate", "plan.yaml"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "60% of the CPU busy" in result.output and "moved from 0.3 ms to 3 ms" in result.output
    assert "keeps the earlier constants" in result.output and "--accept" in result.output
    assert (tmp_path / "p.calibration.json").read_bytes() == before
    result = runner.invoke(cli, ["calibrate", "plan.yaml", "--accept"])
    assert result.exit_code == 0, result.output
    written = Calibration.model_validate_json((tmp_path / "p.calibration.json").read_text())
    assert written.action_overhead_ms == pytest.approx(3.0, rel=1e-6)


def test_a_fit_is_suspect_when_compute_disagrees_with_the_profiles_thread_timing():
    assert calibrate.suspect(calibration(placements=[placement(2, 1, 2.2)]), None, expected_scale=1.5,
                             busy_share=0.1) == []  # 2.2 / 1.5 = 1.47: within 1.5x
    [reason] = calibrate.suspect(calibration(placements=[placement(2, 1, 2.4)]), None, expected_scale=1.5,
                                 busy_share=None)
    assert "x2.4 the profile's" in reason and "at 1 thread says x1.5" in reason
    # 4 ranks of 1 thread time-sharing 2 cores compute up to 2x longer: the demo's x3.58 against
    # x1.82 is sound, x5.5 is not
    four = calibration(placements=[placement(4, 1, 3.58)])
    assert calibrate.suspect(four, None, expected_scale=1.82, busy_share=None, oversubscribed=2.0) == []
    [reason] = calibrate.suspect(calibration(placements=[placement(4, 1, 5.5)]), None, expected_scale=1.82,
                                 busy_share=None, oversubscribed=2.0)
    assert "up to x3.64 for ranks time-sharing the cores" in reason


def test_a_fit_is_suspect_when_it_moved_far_from_the_last_one():
    old = calibration(action_overhead_ms=0.15, placements=[placement(2, 1, 1.5)])
    same = calibration(action_overhead_ms=0.3, placements=[placement(2, 1, 1.6)])
    assert calibrate.suspect(same, old, expected_scale=None, busy_share=None) == []
    # the case: 11.1 ms per action where a quiet machine fits 0.15 ms
    [reason] = calibrate.suspect(calibration(action_overhead_ms=11.1, placements=[placement(2, 1, 1.6)]), old,
                                 expected_scale=None, busy_share=None)
    assert "from 0.15 ms to 11.1 ms" in reason
    [reason] = calibrate.suspect(calibration(action_overhead_ms=0.2, placements=[placement(2, 1, 5.0)]), old,
                                 expected_scale=None, busy_share=None)
    assert "compute moved from x1.5 to x5" in reason
    # noise-level action costs (below 0.05 ms) and another placement's scale are no news
    tiny = calibration(action_overhead_ms=0.001, placements=[placement(4, 1, 9.0)])
    assert calibrate.suspect(tiny, calibration(action_overhead_ms=0.04, placements=[placement(2, 1, 1.5)]),
                             expected_scale=None, busy_share=None) == []


# ---------------------------------------------------------------- threads: a launch's against the profile's


def timed_device(**thread_ms) -> DeviceInfo:
    return DeviceInfo(type="cpu", name="x", threads=4, thread_ms={int(k[1:]): v for k, v in thread_ms.items()})


def test_thread_scale_is_the_profiles_own_timing_at_both_thread_counts():
    device = timed_device(t1=300.0, t2=180.0, t4=120.0)
    assert calibrate.thread_scale(device, 4) == 1.0
    assert calibrate.thread_scale(device, 1) == pytest.approx(2.5)
    assert calibrate.thread_scale(device, 2) == pytest.approx(1.5)
    assert calibrate.thread_scale(device, 3) == pytest.approx(150 / 120)  # halfway between 2 and 4
    assert calibrate.thread_scale(device, 8) == 1.0  # past the last timed count: the last's
    assert calibrate.thread_scale(DeviceInfo(type="cpu", name="x", threads=2), 1) == 1.0  # none timed
    assert calibrate.thread_scale(DeviceInfo(type="cuda", name="h100"), 1) == 1.0


def test_uncalibrated_solve_scales_compute_by_the_thread_timing_and_says_so(tmp_path, monkeypatch):
    from planner import io
    from planner.commands.calibration import calibrated_setup, calibration_path
    from planner.schema import FileRef

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    profile = heterogeneous(6)
    profile = profile.model_copy(update={"device": DeviceInfo(type="cpu", name="x", threads=2,
                                                              thread_ms={1: 170.0, 2: 100.0})})
    profile_path = tmp_path / "p.json"
    io.save_profile(profile, profile_path)
    scaled, notes = calibrated_setup(profile, profile_path, setup(2))  # 2 ranks on 2 cores: 1 thread each
    assert scaled.time.compute_scale == pytest.approx(1.7)
    assert notes[0] == ("a launch gives each of the 2 ranks 1 thread (2 cores): compute x1.7 as the profile timed "
                        "the whole model at 2 threads and 1")
    assert "not calibrated" in notes[1]
    # the two ranks compute at once: the profile's timing beside a copy charges 10% more
    device = profile.device.model_copy(update={"shared_ms": {1: 200.0, 2: 220.0}})
    profile = profile.model_copy(update={"device": device})
    io.save_profile(profile, profile_path)
    scaled, notes = calibrated_setup(profile, profile_path, setup(2))
    assert scaled.time.compute_scale == pytest.approx(1.7 * 1.1)
    assert notes[0].endswith("and x1.1 for 2 ranks computing at once, as it timed the model beside a copy on every "
                             "other core")
    # a calibration that never ran this placement falls back to the profile's timing, not to 1
    pinned = FileRef(file=str(profile_path), sha256=io.sha256_file(profile_path))
    calibration_path(profile_path).write_text(
        calibration(profile=pinned, placements=[placement(4, 1, 2.0)]).model_dump_json())
    applied, notes = calibrated_setup(profile, profile_path, setup(2))
    assert applied.time.compute_scale == pytest.approx(1.87)
    assert "x1.87 by the profile's whole-model timing" in notes[0]


def test_sharing_scale_is_the_profiles_timing_beside_copies_for_ranks_that_compute_at_once():
    device = DeviceInfo(type="cpu", name="x", threads=8, shared_ms={1: 100.0, 4: 130.0})
    assert calibrate.sharing_scale(device, ranks=4, threads=1, cores=8) == pytest.approx(1.3)
    assert calibrate.sharing_scale(device, ranks=2, threads=1, cores=8) == pytest.approx(1.1)  # a third of the way
    assert calibrate.sharing_scale(device, ranks=16, threads=1, cores=2) == pytest.approx(1.1)  # 2 compute at once
    assert calibrate.sharing_scale(device, ranks=8, threads=1, cores=8) == pytest.approx(1.3)  # the last measured
    assert calibrate.sharing_scale(device, ranks=1, threads=1, cores=8) == 1.0  # alone
    assert calibrate.sharing_scale(device, ranks=4, threads=2, cores=8) == 1.0  # ranks of several threads: unmeasured
    assert calibrate.sharing_scale(timed_device(t1=300.0), ranks=4, threads=1, cores=8) == 1.0  # none timed
    both = device.model_copy(update={"thread_ms": {1: 300.0, 8: 60.0}})
    assert calibrate.placement_scale(both, ranks=4, threads=1, cores=8) == pytest.approx(5 * 1.3)


def test_profile_times_the_whole_model_at_each_thread_count_and_restores_torchs():
    import torch

    from planner.profiler.threads import thread_counts, thread_ms, whole_step

    assert thread_counts(1) == [1] and thread_counts(2) == [1, 2] and thread_counts(6) == [1, 2, 4, 6]
    layers = [("0", torch.nn.Linear(8, 8)), ("1", torch.nn.Linear(8, 2))]
    calls = []
    step = whole_step(layers, torch.randn(4, 8), torch.randn(4, 2), torch.nn.functional.mse_loss)
    before = torch.get_num_threads()
    timed = thread_ms(lambda: (calls.append(torch.get_num_threads()), step()), [1, 2], warmup=1, repeats=3)
    assert sorted(timed) == [1, 2] and all(ms > 0 for ms in timed.values())
    assert calls == [1, 2] * 4  # in turns, warm-up included
    assert torch.get_num_threads() == before
    assert layers[0][1].weight.grad is not None  # the backward ran through every layer


def test_an_iteration_faster_than_its_stages_gets_one_scale_between_the_two():
    """Stages measured at 1.5x the profile but the iteration only at 1.2x its prediction
    (ranks slowing each other only while both compute): no action cost, and the scale lies
    where the stages' and the iteration's squared relative errors balance."""
    profile = heterogeneous(6, seed=8)
    plain = setup(2)
    stages = baselines.no_checkpointing(profile, plain)
    cost = costmodel.evaluate(stages, profile, plain)
    sample = PipelineSample(stages, [1.5 * c.time_ms for c in cost.stages], 1.2 * cost.iteration_ms)
    fit, overhead = calibrate.fit_placement(sample, profile, plain, ranks=2, threads=1, cores=2, plan="p",
                                            action_overhead_ms=None)
    assert overhead == 0.0
    # two stages at 1.5 and the iteration at 1.2 with weight 2: 2(x/1.5 - 1)^2 + 2(x/1.2 - 1)^2 is least at
    # x = (1/1.5 + 1/1.2) / (1/1.5^2 + 1/1.2^2)
    best = (1 / 1.5 + 1 / 1.2) / (1 / 1.5**2 + 1 / 1.2**2)
    assert fit.compute_scale == pytest.approx(best, abs=0.3 / calibrate.JOINT_STEPS)


def test_an_analytic_profile_is_not_calibrated_nor_told_to_be(tmp_path):
    """calibrate on a plan from `profile --arch` crashed (NCCL not built in) and every solve on
    one suggested calibrate: it is refused in one sentence, and solve suggests nothing."""
    from fixtures.cli import run, run_ok

    profile_path, plan_path = tmp_path / "a.json", tmp_path / "plan.yaml"
    run_ok("profile", "--arch", "llama3-8b", "--seq-len", "256", "--out", str(profile_path))
    result = run_ok("solve", "--profile", str(profile_path), "--stages", "4", "--out", str(plan_path))
    assert "calibrate PLAN" not in result.output and "analytic profile" in result.output
    result = run("calibrate", str(plan_path))
    assert result.exit_code == 1 and "analytic profile" in result.output and "Traceback" not in result.output
    assert not list(tmp_path.glob("*.calibration.json"))


def test_calibrate_refuses_to_write_over_the_plans_profile_before_any_work(tmp_path, monkeypatch):
    from export_plans import write
    from fixtures.cli import run

    from planner.runtime import launcher

    monkeypatch.setattr(launcher, "run_plan", lambda *a, **k: pytest.fail("ran before refusing --out"))
    _, plan, plan_path = write(tmp_path, [4, 3, 3], set())
    before = (tmp_path / "llm.json").read_bytes()
    result = run("calibrate", str(plan_path), "--out", str(tmp_path / "llm.json"))
    assert result.exit_code == 1 and "plan's profile" in result.output
    assert (tmp_path / "llm.json").read_bytes() == before


def test_sharing_scale_never_makes_ranks_beside_each_other_faster_than_one_alone():
    # a profile on 2 shared cores timed the model beside a copy at 18.9 ms against 29.9 ms alone: x0.633
    # scaled every stage's compute down and predicted a 2-rank launch at 38 ms that measured 176 ms
    device = DeviceInfo(type="cpu", name="x", threads=2, shared_ms={1: 29.9, 2: 18.9})
    assert calibrate.sharing_scale(device, ranks=2, threads=1, cores=2) == 1.0
