"""`ckplan solve` says why a plan of several stages a rank is "feasible" with no gap where no --time-limit stopped it
(planner/commands/solve_report.py unproven): it read as a solve cut short (§67.usertrial67)."""

import pytest
from fixtures.cli import run_ok

from planner import io
from planner.models import synthetic

LINE = "feasible, not proven optimal: interleaved-1F1B puts 2 stages on a rank"


@pytest.fixture()
def profile_path(tmp_path):
    layers = [synthetic.layer(f"blocks.{i}", "Block", fwd_ms=10, act_mib=10, input_mib=1, param_count=200_000)
              for i in range(8)]
    path = tmp_path / "p.json"
    io.save_profile(synthetic.profile_of(layers), path)
    return path


def _said(result) -> str:
    return " ".join(result.output.split())


def test_a_chunked_plan_says_why_it_has_no_gap(profile_path, tmp_path):
    out = tmp_path / "plan.yaml"
    result = run_ok("solve", "--profile", profile_path, "--stages", "2", "--mem", "1GiB", "--microbatches", "4",
                    "--schedule", "interleaved-1F1B", "--solver", "milp", "--out", out)
    plan = io.load_plan(out)
    assert (plan.solver.status, plan.solver.gap, plan.solver.timed_out) == ("feasible", None, False)
    assert LINE in _said(result) and "--time-limit ran out" not in _said(result)


def test_a_one_chunk_plan_says_nothing_of_it(profile_path, tmp_path):
    result = run_ok("solve", "--profile", profile_path, "--stages", "2", "--mem", "1GiB", "--microbatches", "4",
                    "--out", tmp_path / "plan.yaml")
    assert "not proven optimal" not in _said(result)
