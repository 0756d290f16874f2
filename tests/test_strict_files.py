"""Files and setups read strictly, with bounds on every count: a plan whose setup holds a string,
a bool or a list where a number belongs, or 10^7 microbatches, is refused in one sentence when it
is loaded; a setup past a bound names the option that set it; a calibration's constants are
bounded as the setup's are (no compute x1e-300, no traceback from solve)."""

from __future__ import annotations

import json
import pathlib

import pytest
import yaml
from click.testing import CliRunner
from fixtures.rt_plans import make_plan

from planner import io
from planner.cli import cli
from planner.commands.calibration import calibration_path
from planner.models import synthetic
from planner.schema import Calibration, PlacementFit

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def _refused(result, *needles: str) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit), result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    for needle in needles:
        assert needle in result.output, result.output
    return errors[0]


def _invoke(*args):
    return CliRunner().invoke(cli, [str(arg) for arg in args])


@pytest.fixture()
def no_run(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the plan was run")

    monkeypatch.setattr("planner.runtime.validate_plan", refuse)
    monkeypatch.setattr("planner.runtime.run_plan", refuse)


def _plan_with(tmp_path, edit) -> pathlib.Path:
    path = tmp_path / "plan.yaml"
    data = yaml.safe_load(io.plan_to_yaml(make_plan(FIXTURES / "tiny.py", [["0", "1"], ["2"]])))
    edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("value, needle", [
    ("2; import os", "field 'setup.data_parallel.dp' = '2; import os': Input should be a valid integer"),
    ("2", "field 'setup.data_parallel.dp' = '2'"),
    ([2], "field 'setup.data_parallel.dp': Input should be a valid integer"),
    (True, "field 'setup.data_parallel.dp' = True"),
    (2.0, "field 'setup.data_parallel.dp' = 2.0"),
])
@pytest.mark.parametrize("command", ["validate", "launch"])
def test_a_count_of_the_wrong_type_is_refused_when_the_plan_loads(tmp_path, no_run, command, value, needle):
    path = _plan_with(tmp_path, lambda data: data["setup"]["data_parallel"].update(dp=value))
    _refused(_invoke(command, path), "is not a valid plan", needle, "re-create it with `ckplan solve`")


def test_ten_million_microbatches_are_refused_before_any_replay(tmp_path, no_run):
    path = _plan_with(tmp_path, lambda data: data["setup"]["pipeline"].update(microbatches=10**7))
    _refused(_invoke("validate", path), "field 'setup.pipeline.microbatches' = 10000000",
             "less than or equal to 65536")


@pytest.mark.parametrize("edit, needle", [
    (lambda data: data["stages"][0].update(index="0"), "field 'stages.0.index'"),
    (lambda data: data["setup"]["pipeline"].update(stages=10**6), "field 'setup.pipeline.stages'"),
    (lambda data: data["setup"]["pipeline"].update(micro_batch_size=10**9), "setup.pipeline.micro_batch_size"),
    (lambda data: data["stages"][1]["predicted"].update(peak_bytes=-1), "stages.1.predicted.peak_bytes"),
])
def test_every_count_in_a_plan_is_bounded(tmp_path, no_run, edit, needle):
    _refused(_invoke("validate", _plan_with(tmp_path, edit)), "is not a valid plan", needle)


def test_a_plan_as_solve_writes_it_still_loads(tmp_path):
    plan = make_plan(FIXTURES / "tiny.py", [["0", "1"], ["2"]])
    plan.device.thread_ms = {1: 3.0, 2: 1.75}  # integer keys, written as strings
    io.save_plan(plan, tmp_path / "plan.yaml")
    assert io.load_plan(tmp_path / "plan.yaml") == plan
    assert io.load_plan(FIXTURES / "plan_v1" / "plan_v1.yaml").setup.pipeline.stages > 0


@pytest.fixture()
def profile_path(tmp_path):
    layers = [synthetic.layer(f"blocks.{i}", "Block", fwd_ms=1, act_mib=1, input_mib=0.5, param_count=1000)
              for i in range(3)]
    path = tmp_path / "p.json"
    io.save_profile(synthetic.profile_of(layers), path)
    return path


@pytest.mark.parametrize("args, needle", [
    (["--microbatches", "100000"], "invalid setup: --microbatches must be at most 65,536"),
    (["--host-mem", "2000000TB", "--offload-optimizer", "--host-step-ns", "1"], "invalid setup: --host-mem must be at most 1 EiB"),
])
def test_a_setup_past_a_bound_names_the_option(profile_path, tmp_path, args, needle):
    out = tmp_path / "plan.yaml"
    line = _refused(_invoke("solve", "--profile", profile_path, "--mem", "1GB", "--stages", "2", *args, "--out", out),
                    needle)
    assert "Input should be" not in line and "1152921504606846976" not in line
    assert not out.exists()


@pytest.mark.parametrize("fields, needle", [
    ({"send_latency_ms": 1e6}, "field 'send_latency_ms'"),
    ({"placements": [{"compute_scale": 1e-300}]}, "field 'placements.0.compute_scale'"),
    ({"placements": [{"cpu_sharing": 1e9}]}, "field 'placements.0.cpu_sharing'"),
    ({"action_overhead_ms": float("inf")}, "field 'action_overhead_ms'"),
])
def test_calibration_constants_out_of_range_are_one_sentence(profile_path, tmp_path, fields, needle):
    placement = dict(ranks=2, threads=1, cores=2, compute_scale=1.25, plan="plan.yaml", measured_iteration_ms=10.0,
                     predicted_before_ms=8.0, predicted_after_ms=10.0)
    data = json.loads(Calibration(created_at="2026-01-01T00:00:00+00:00", profile=io.file_ref(profile_path),
                                  backend="gloo", device_type="cpu", send_latency_ms=0.2, send_gb_per_s=1.5,
                                  placements=[PlacementFit(**placement)]).model_dump_json())
    for key, value in fields.items():
        if key == "placements":
            data["placements"][0].update(value[0])
        else:
            data[key] = value
    calibration_path(profile_path).write_text(json.dumps(data))
    out = tmp_path / "plan.yaml"
    _refused(_invoke("solve", "--profile", profile_path, "--mem", "1GB", "--stages", "2", "--out", out),
             "is not a valid calibration", needle)
    assert not out.exists()




def test_a_compute_scale_far_from_one_is_never_applied_without_a_word(profile_path, tmp_path):
    placement = dict(ranks=2, threads=1, cores=2, plan="plan.yaml", measured_iteration_ms=10.0,
                     predicted_before_ms=8.0, predicted_after_ms=10.0)
    import os

    for scale, said in ((0.115, "predicted 8.7x faster than the profile's times"), (1.25, None)):
        calibration = Calibration(created_at="2026-01-01T00:00:00+00:00", profile=io.file_ref(profile_path),
                                  backend="gloo", device_type="cpu", send_latency_ms=0.2,
                                  placements=[PlacementFit(compute_scale=scale, **{**placement,
                                                                                   "cores": os.cpu_count() or 1})])
        calibration_path(profile_path).write_text(calibration.model_dump_json())
        result = _invoke("solve", "--profile", profile_path, "--mem", "1GB", "--stages", "2",
                         "--out", tmp_path / "plan.yaml")
        assert result.exit_code == 0, result.output
        if said:
            assert f"every stage's compute is scaled x{scale:.3g}, so the plan is {said}" in result.output
        else:
            assert "every stage's compute is scaled" not in result.output


def test_a_replay_that_runs_out_of_memory_is_one_sentence(tmp_path, monkeypatch):
    def exhausted(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr("planner.runtime.replay.replay_stage", exhausted)
    path = _plan_with(tmp_path, lambda data: data["setup"]["pipeline"].update(microbatches=60000))
    _refused(_invoke("validate", path), "replaying stage 0 ran out of this machine's memory",
             "60,000 microbatches of 2 samples")
