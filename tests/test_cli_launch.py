"""`ckplan launch` and `ckplan validate` from the outside: a good plan runs and prints
its tables; every bad plan ends in one sentence, a non-zero exit, no traceback and no
process started."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml
from click.testing import CliRunner
from conftest import ROOT
from fixtures.rt_plans import make_plan

import planner.runtime.launcher as launcher
from planner import io
from planner.cli import cli

TINY = ROOT / "tests" / "fixtures" / "rt_tiny.py"
STAGES = [["0", "1"], ["2", "3", "4"]]


def _invoke(*args: str):
    return CliRunner().invoke(cli, [*args])


@pytest.fixture
def no_processes(monkeypatch):
    """Any attempt to start a rank fails the test: bad plans are refused before."""
    def popen(*args, **kwargs):
        raise AssertionError("a rank process was started for a bad plan")

    monkeypatch.setattr(launcher.subprocess, "Popen", popen)


def _plan_file(folder):
    """A 2-stage plan of a copy of the tiny model, with a relative model path."""
    shutil.copy(TINY, folder / "tiny.py")
    plan = make_plan(folder / "tiny.py", STAGES)
    plan.model.file = "tiny.py"  # resolved against the plan's folder
    path = folder / "plan.yaml"
    io.save_plan(plan, path)
    return path


@pytest.fixture
def plan_file(tmp_path):
    return _plan_file(tmp_path)


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One launch of the plan with --reference, its report written into a folder not yet
    there: the tables, the progress, the report and the reference read off the same run."""
    folder = tmp_path_factory.mktemp("launched")
    plan_path = _plan_file(folder)
    report_path = folder / "out" / "run.json"
    args = ["launch", str(plan_path), "--steps", "1", "--warmup-steps", "0", "--reference"]
    return plan_path, args, _invoke(*args, "--report", str(report_path)), report_path


def _one_clean_error(result, *fragments: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and result.output.rstrip().splitlines()[-1] == errors[0], result.output
    for fragment in fragments:
        assert fragment in result.output, result.output


@pytest.mark.slow
@pytest.mark.xdist_group("launched")  # one worker launches it once for both
def test_launch_prints_tables_and_writes_the_report(launched):
    plan_file, _, result, report_path = launched
    assert result.exit_code == 0, result.output
    assert "peak memory per stage" in result.output and "time per microbatch" in result.output
    assert "iteration: predicted 100 ms" in result.output
    # not on a terminal: one line per step as the slowest rank finishes it, the last one always
    assert "launch: ckplan, 2 stages x dp 1 on cpu: step 2/2" in result.output  # 1 timed + 1 measuring memory
    report = io.load_report(report_path)
    assert report.plan.sha256 == io.sha256_file(plan_file) and report.steps == 1
    assert report.device.threads == 1 and report.threads_source == "plan"
    assert [stage.index for stage in report.stages] == [0, 1]


def test_missing_plan(tmp_path, no_processes):
    _one_clean_error(_invoke("launch", str(tmp_path / "nope.yaml")), "does not exist")


def test_corrupt_yaml(tmp_path, no_processes):
    path = tmp_path / "plan.yaml"
    path.write_text("stages: [unclosed\n")
    _one_clean_error(_invoke("launch", str(path)), "not valid YAML")


def test_unknown_field(plan_file, no_processes):
    data = yaml.safe_load(plan_file.read_text())
    data["setup"]["bogus"] = 1
    plan_file.write_text(yaml.safe_dump(data))
    _one_clean_error(_invoke("launch", str(plan_file)), "setup.bogus")


def test_stale_plan_names_file_and_both_hashes(plan_file, no_processes):
    model = plan_file.parent / "tiny.py"
    planned = io.load_plan(plan_file).model.sha256
    model.write_text(model.read_text() + "\n# changed\n")
    result = _invoke("launch", str(plan_file))
    _one_clean_error(result, "stale", str(model), planned, io.sha256_file(model), "--force")


def test_plan_for_another_model(plan_file, no_processes):
    data = yaml.safe_load(plan_file.read_text())
    data["stages"][1]["layers"] = ["2", "3", "lm_head"]
    plan_file.write_text(yaml.safe_dump(data))
    _one_clean_error(_invoke("launch", str(plan_file)), "'lm_head'", "different model")


def test_missing_model_file(plan_file, no_processes):
    (plan_file.parent / "tiny.py").unlink()
    _one_clean_error(_invoke("launch", str(plan_file)), "tiny.py was not found")


def test_nccl_needs_cuda(plan_file, no_processes):
    _one_clean_error(_invoke("launch", str(plan_file), "--backend", "nccl", "--device", "cpu"), "nccl")


def test_unwritable_report_is_refused_first(plan_file, no_processes):
    blocker = plan_file.parent / "file"
    blocker.write_text("")
    _one_clean_error(_invoke("launch", str(plan_file), "--report", str(blocker / "run.json")), "cannot write")


def test_validate_prints_every_stage(plan_file):
    result = _invoke("validate", str(plan_file))
    assert result.exit_code == 0, result.output
    assert "peak memory per stage" in result.output and "all 2 stages are within their caps" in result.output


def test_validate_fails_a_stage_over_its_cap(plan_file):
    data = yaml.safe_load(plan_file.read_text())
    data["setup"]["mem_caps_bytes"] = [10**9, 1000]
    plan_file.write_text(yaml.safe_dump(data))
    result = _invoke("validate", str(plan_file))
    _one_clean_error(result, "stage 1 needs")
    ok = _invoke("validate", str(plan_file), "--stage", "0")
    assert ok.exit_code == 0 and "stage 0 is within its cap" in ok.output


def test_validate_refuses_a_stage_out_of_range(plan_file):
    _one_clean_error(_invoke("validate", str(plan_file), "--stage", "5"), "out of range")


def test_help_is_instant():
    result = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-X", "importtime", "-m", "planner.cli",
                             "launch", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0 and "--enforce-cap" in result.stdout
    assert "torch" not in json.dumps([line.split("|")[-1].strip() for line in result.stderr.splitlines()])


def test_torchrun_world_size_must_match_the_stages(plan_file, monkeypatch):
    for name, value in {"RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    _one_clean_error(_invoke("launch", str(plan_file)), "torchrun started 3 processes for a plan of 2 stages")


@pytest.mark.slow
def test_torchrun_job_is_joined_and_rank_0_reports(plan_file, tmp_path):
    report_path = tmp_path / "run.json"
    result = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "torchrun"), "--nproc-per-node", "2", "--master-port", str(launcher._free_port()),
         "-m", "planner.cli",
         "launch", str(plan_file), "--steps", "1", "--warmup-steps", "0", "--report", str(report_path)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("peak memory per stage") == 1  # rank 0 only
    assert [stage.index for stage in io.load_report(report_path).stages] == [0, 1]


@pytest.mark.slow
@pytest.mark.xdist_group("launched")
def test_launch_reference_compares_every_step_with_one_process(launched, monkeypatch):
    _, args, result, report_path = launched
    assert result.exit_code == 0, result.output
    assert "loss per step: pipeline vs one process" in result.output
    assert "the pipeline trains like one process: largest loss difference" in result.output
    # the same run against a reference that trained differently: one sentence, exit 1
    import planner.runtime
    import planner.runtime.reference as reference

    report = io.load_report(report_path)
    monkeypatch.setattr(planner.runtime, "run_plan", lambda *a, **k: report)
    real = reference.reference_losses
    monkeypatch.setattr(reference, "reference_losses", lambda *a, **k: [loss - 0.01 for loss in real(*a, **k)])
    _one_clean_error(_invoke(*args), "the pipeline's loss differs from one process by +0.01 at step 0 "
                                          "(tolerance 0.00039; 2 of 2 steps differ)")


@pytest.mark.slow
def test_launch_over_a_cap_fails_in_one_sentence_and_keeps_the_report(plan_file, tmp_path):
    data = yaml.safe_load(plan_file.read_text())
    data["setup"]["mem_caps_bytes"] = [10**9, 1000]
    plan_file.write_text(yaml.safe_dump(data))
    report_path = tmp_path / "run.json"
    result = _invoke("launch", str(plan_file), "--steps", "1", "--warmup-steps", "0", "--report", str(report_path))
    _one_clean_error(result, "1 of 2 stages went over their cap: stage 1 used", "of 1000 B", "the plan does not fit")
    assert "peak memory per stage" in result.output  # the tables first
    assert io.load_report(report_path).stages[1].cap_bytes == 1000


def test_a_chunked_plan_that_offloads_is_refused_before_any_rank_starts(tmp_path, no_processes):
    shutil.copy(TINY, tmp_path / "tiny.py")
    data = yaml.safe_load(io.plan_to_yaml(make_plan(tmp_path / "tiny.py", [["0", "1", "2"], ["3", "4"]])))
    data["setup"]["pipeline"].update(schedule="interleaved-1F1B", chunks=2)
    data["stages"][0].update(layers=["0", "2", "3"], chunks=[["0"], ["2", "3"]], recompute={"2": "offload"})
    data["stages"][1].update(layers=["1", "4"], chunks=[["1"], ["4"]])
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    _one_clean_error(_invoke("launch", str(path)), "layer 2 offloads its activations",
                     "not interleaved-1F1B with 2 chunks per rank")
    # validate replays one stage a rank: a chunked plan is refused first, whatever it holds
    _one_clean_error(_invoke("validate", str(path)), "runs interleaved-1F1B (2 stages a rank)", "ckplan launch")


def test_launchs_time_table_counts_selective_options_as_solve_does():
    """A stage whose plan recomputes two layers under selective options ('attn,mlp 1, mlp 1') and
    checkpoints none whole was shown 'ckpt 0/3', as if the plan recomputed nothing there."""
    from types import SimpleNamespace

    from rich.console import Console

    from planner.commands.launch import time_table

    times = SimpleNamespace(time_ms=2.0, step_ms=1.0, fwd_ms=1.0, bwd_ms=1.0)
    report = SimpleNamespace(strategy="ckplan", stages=[SimpleNamespace(index=0, predicted=times, measured=times)])
    stage = SimpleNamespace(layers=["embed", "blocks.0", "blocks.1"], checkpointed=[],
                            recompute={"blocks.0": "attn,mlp", "blocks.1": "mlp"})
    console = Console(width=200, record=True)
    console.print(time_table(report, [stage]))
    row = next(line for line in console.export_text().splitlines() if line.startswith("│ 0 "))
    assert row.split("│")[2].strip() == "2/3"
