"""`ckplan solve` through click's CliRunner: good runs, the plan file, and every bad input."""

import json

import pytest
import yaml
from fixtures.cli import run

from planner import io
from planner.models import synthetic
from planner.schema import Plan

MIB = 2**20


@pytest.fixture()
def profile_path(tmp_path):
    """Embedding + 6 identical blocks + head; each block keeps 10 MiB per microbatch."""
    layers = [synthetic.layer("embed", "Embedding", fwd_ms=0.5, act_mib=0.01, input_mib=0.01, output_mib=1,
                              param_count=100_000)]
    layers += [synthetic.layer(f"blocks.{i}", "Block", fwd_ms=10, act_mib=10, input_mib=1, param_count=200_000)
               for i in range(6)]
    layers += [synthetic.layer("head", "Head", fwd_ms=4, act_mib=3, input_mib=1, output_mib=2, param_count=100_000)]
    path = tmp_path / "p.json"
    io.save_profile(synthetic.profile_of(layers), path)
    return path


def test_solve_writes_a_plan_that_round_trips(profile_path, tmp_path):
    out = tmp_path / "plan.yaml"
    result = run("solve", "--profile", str(profile_path), "--mem", "60MiB", "--stages", "3", "--out", str(out))
    assert result.exit_code == 0, result.output
    plan = io.load_plan(out)
    assert plan.solver.status == "optimal"
    assert [name for stage in plan.stages for name in stage.layers][0] == "embed"
    assert all(stage.predicted.peak_bytes <= 60 * MIB for stage in plan.stages)
    assert {b.name for b in plan.baselines} == {"no-ckpt", "full-ckpt", "colossalai-ratio", "megatron-block",
                                               "balanced-ratio"}
    assert Plan.model_validate(yaml.safe_load(io.plan_to_yaml(plan))) == plan
    assert "ckplan" in result.output and "full-ckpt" in result.output


def test_solve_json_summary(profile_path, tmp_path):
    result = run("solve", "--profile", str(profile_path), "--mem", "60MiB,60MiB,80MiB", "--stages", "3",
                 "--json", "--out", str(tmp_path / "plan.yaml"))
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)  # notes (e.g. "not calibrated") go to stderr
    assert [s["cap_bytes"] for s in summary["stages"]] == [60 * MIB, 60 * MIB, 80 * MIB]
    assert summary["status"] == "optimal"
    plan = io.load_plan(tmp_path / "plan.yaml")  # static, allocated and reserved peak per rank
    assert [(s["static_bytes"], s["peak_bytes"], s["reserved_bytes"]) for s in summary["stages"]] == [
        (s.predicted.static_bytes, s.predicted.peak_bytes, s.predicted.reserved_bytes) for s in plan.stages]


def test_checkpointing_goes_where_memory_is_short(profile_path, tmp_path):
    """Stage 0 holds min(3 - 0, 6) = 3 microbatches in flight, the last stage one: a cap that
    forces checkpointing forces it on the first stage first."""
    out = tmp_path / "plan.yaml"
    assert run("solve", "--profile", str(profile_path), "--mem", "70MiB", "--stages", "3",
               "--microbatches", "6", "--out", str(out)).exit_code == 0
    plan = io.load_plan(out)
    ckpt = [len(stage.checkpointed) for stage in plan.stages]
    assert ckpt[0] >= ckpt[-1] and sum(ckpt) > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--profile", "missing.json", "--mem", "1GB", "--stages", "2"], "does not exist"),
        (["--mem", "0GB", "--stages", "2"], "greater than zero"),
        (["--mem", "-1GB", "--stages", "2"], "cannot read size"),
        (["--mem", "lots", "--stages", "2"], "cannot read size"),
        (["--mem", "1GB,,1GB", "--stages", "2"], "separate sizes"),
        (["--mem", "1GB,1GB,1GB", "--stages", "2"], "3 caps for 2 stages"),
        (["--mem", "1GB", "--stages", "99"], "exceeds the 8 layers"),
        (["--mem", "1MiB", "--stages", "2"], "whatever it recomputes"),
        (["--mem", "1GB", "--stages", "4", "--microbatches", "2"], "at least as many microbatches"),
    ],
)
def test_bad_input_is_one_sentence_and_writes_nothing(profile_path, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    if "--profile" not in args:
        args = ["--profile", str(profile_path)] + args
    result = run("solve", *args, "--out", "plan.yaml")
    assert result.exit_code != 0
    assert message in result.output
    assert not (tmp_path / "plan.yaml").exists()


def test_corrupt_and_foreign_profiles_are_refused(tmp_path):
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text("{not json")
    result = run("solve", "--profile", str(corrupt), "--mem", "1GB", "--stages", "2")
    assert result.exit_code != 0 and "not valid JSON" in result.output
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"schema_version": 1, "hello": "world"}))
    result = run("solve", "--profile", str(foreign), "--mem", "1GB", "--stages", "2")
    assert result.exit_code != 0 and "not a valid profile" in result.output


def test_sweep_prints_a_table(profile_path, tmp_path):
    result = run("solve", "--profile", str(profile_path), "--mem", "1GB", "--stages", "3", "--sweep", "--json",
                 "--plot", str(tmp_path / "s.png"))
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)  # notes go to stderr
    assert len(rows) == 8
    # more memory never makes ckplan slower, and ckplan fits wherever any baseline does
    times = [row["ckplan"] for row in rows]
    assert all(a >= b - 1e-9 for a, b in zip(times, times[1:]))
    for row in rows:
        baseline_times = [v for k, v in row.items() if k not in ("cap_bytes", "ckplan") and v is not None]
        assert all(row["ckplan"] <= t + 1e-6 for t in baseline_times)


def test_sweep_runs_without_mem_and_takes_it_as_its_top(profile_path, tmp_path):
    """--sweep required --mem and then ignored it."""
    args = ["solve", "--profile", str(profile_path), "--stages", "3", "--sweep", "--json", "--plot",
            str(tmp_path / "s.png")]
    free = json.loads(run(*args).stdout)
    assert len(free) == 8
    top = (free[0]["cap_bytes"] + free[-1]["cap_bytes"]) // 2
    capped = json.loads(run(*args, "--mem", f"{top}B").stdout)
    assert capped[-1]["cap_bytes"] == top and capped[0]["cap_bytes"] == free[0]["cap_bytes"]
    result = run(*args, "--mem", "1KiB")
    assert result.exit_code == 1 and "below the least any plan needs" in result.output


def test_the_title_says_one_stage_computes_at_once_in_the_singular():
    # 2 stages x dp 2 on 2 cores at 1 thread a rank: one stage's two replicas fill the cores
    from planner.commands.solve_report import at_once_words
    from planner.placement import stages_at_once
    one = stages_at_once(cores=2, threads=1, stages=2, dp=2)
    assert at_once_words(one, 2) == ", 1 stage computes at once (shared cores)"
    assert at_once_words(2, 3) == ", 2 stages compute at once (shared cores)"
    assert at_once_words(None, 3) == at_once_words(3, 3) == ""
