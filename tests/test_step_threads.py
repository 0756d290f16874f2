"""A CPU profile times each layer's optimizer step at the thread counts a launch may give its ranks (1, 2, 4, ...
below the profile's threads; planner/profiler/threads.py at_fewer_threads), and the cost model charges the step at
the threads the launch gives (TimeConstants.rank_threads, set where the placement sets compute_scale): a rank runs
one thread where profile ran two, and on a loaded 2-core host Adam on a 512 x 64 table took 19.7-63.7 ms at 2
threads against 0.1 ms at 1 (§42.runtrial), which the plan charged as the rank's step."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import ROOT
from fixtures.cli import run_ok

from planner import io
from planner.cost import layers as layer_terms
from planner.cost.rules import layer_step_ms


@pytest.fixture(scope="module")
def two_thread_profile(tmp_path_factory):
    path = tmp_path_factory.mktemp("steps") / "profile.json"
    run_ok("profile", ROOT / "tests" / "fixtures" / "tiny.py", "--threads", "2", "--repeats", "1", "--warmup", "1",
           "--out", path)
    return path


def test_a_two_thread_profile_times_each_step_at_one_thread_too(two_thread_profile):
    profile = io.load_profile(two_thread_profile)
    assert profile.device.threads == 2
    for layer in profile.layers:
        assert set(layer.step_thread_ms) == {1}, layer.name  # thread_counts(2) below 2
        assert set(layer.step_thread_ms[1]) == set(layer.step_ms)
        assert (layer.step_thread_ms[1]["adam"] > 0) == (layer.param_count > 0), layer.name
    cost = layer_terms.layer_costs(profile)[0]  # Linear(8, 16): the profile's own 2 threads' step beside 1's
    assert [count for count, _ in cost.step_thread_ms] == [1, 2]
    assert dict(cost.step_thread_ms)[2] == cost.step_ms


def test_the_step_at_a_count_by_hand(two_thread_profile):
    cost = dataclasses.replace(layer_terms.layer_costs(io.load_profile(two_thread_profile))[0],
                               step_ms=(("adam", 9.0),),
                               step_thread_ms=((1, (("adam", 1.0),)), (4, (("adam", 7.0),)), (8, (("adam", 9.0),))))
    assert cost.step_at("adam", None) == 9.0  # as profiled
    assert cost.step_at("adam", 1) == 1.0 and cost.step_at("adam", 8) == 9.0
    assert cost.step_at("adam", 2) == 3.0  # a third of the way from 1 to 4
    assert cost.step_at("adam", 6) == 8.0 and cost.step_at("adam", 16) == 9.0
    assert cost.step_at("sgd", 1) == 0.0
    assert dataclasses.replace(cost, step_thread_ms=()).step_at("adam", 1) == 9.0  # none timed: the profiled


def test_a_plan_charges_the_step_at_the_threads_its_launch_gives(two_thread_profile, tmp_path):
    from planner.runtime import rank_threads

    plan_path = tmp_path / "plan.yaml"
    run_ok("solve", "--profile", two_thread_profile, "--stages", "2", "--microbatches", "2", "--mem", "1GiB",
           "--out", plan_path)
    plan, profile = io.load_plan(plan_path), io.load_profile(two_thread_profile)
    threads = rank_threads(plan)[0]
    assert plan.setup.time.rank_threads == threads
    costs = {cost.name: cost for cost in layer_terms.layer_costs(profile)}
    for stage in plan.stages:
        expected = sum(layer_step_ms(costs[name], plan.setup) for name in stage.layers)
        at_threads = sum(costs[name].step_at("adam", threads) for name in stage.layers)
        assert stage.predicted.step_ms == pytest.approx(expected) == pytest.approx(at_threads)
    profiled = plan.setup.model_copy(update={"rank_threads": None})
    assert layer_step_ms(costs["0"], profiled) == dict(costs["0"].step_ms)["adam"]


def test_calibrate_fits_a_run_against_the_step_at_the_runs_threads():
    """A plan solved for two threads a rank, run (and calibrated) with one: the fit scores the run with the step
    at one thread, as apply() later charges it, so the action cost it finds gives back the run's iteration. Fitted
    at the plan's two threads (5 ms a step against 0.05) the action cost came out 0 and the compute scale 0.987, the
    step's difference folded into it (455.9 ms predicted after the fit against the run's 449.9)."""
    from planner.commands.calibrate import placed
    from planner.cost import costmodel
    from planner.measure import calibrate
    from planner.models.synthetic import uniform_blocks
    from planner.schema import DeviceInfo, TrainSetup

    blocks = uniform_blocks(4)
    layers = [layer.model_copy(update={"step_ms": {"adam": 5.0}, "step_thread_ms": {1: {"adam": 0.05}}})
              for layer in blocks.layers]
    profile = blocks.model_copy(update={"layers": layers, "device": DeviceInfo(type="cpu", name="cpu", threads=2)})
    solved = TrainSetup(stages=2, microbatches=4, micro_batch_size=1, mem_caps_bytes=[2**40] * 2, rank_threads=2)
    stages = costmodel.split_to_stages([0, 3], [False] * len(layers), profile)
    ran = costmodel.evaluate(stages, profile, solved.model_copy(update={"rank_threads": 1, "action_overhead_ms": 0.3}))
    sample = calibrate.PipelineSample(stages=stages, stage_ms=[stage.time_ms for stage in ran.stages],
                                      iteration_ms=ran.iteration_ms)
    setup = placed(calibrate.uncalibrated(solved), threads=1, cores=64)
    assert setup.time.rank_threads == 1
    fit, overhead = calibrate.fit_placement(sample, profile, setup, ranks=2, threads=1, cores=64, plan="plan.yaml",
                                            action_overhead_ms=None)
    assert overhead == pytest.approx(0.3, rel=1e-6) and fit.compute_scale == pytest.approx(1.0)
    assert fit.predicted_after_ms == pytest.approx(sample.iteration_ms, rel=1e-9)
