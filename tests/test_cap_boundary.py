"""`ckplan solve --mem` at the byte: at the least any plan needs, a plan that evaluate() accepts;
one byte below, one sentence and no file, from the DP and from the MILP alike.

HiGHS keeps integer variables within its mip_feasibility_tolerance of a whole number and
computes its rows there: before planner/solve/milp.solve_within_caps, a --mem one byte under
the need got the MILP's plan, which evaluate() refused with SolverMismatch's traceback."""

import itertools

import pytest
from fixtures.cli import run

from planner import io
from planner.cost import costmodel
from planner.models import synthetic
from planner.schema import TrainSetup

MICROBATCHES = 4


def least_need_bytes(profile, stages: int) -> int:
    """The smallest --mem any plan fits, by brute force over every split and checkpoint set:
    the plan's largest peak and the fit margin (evaluate's verdict, StageCost.fits_allocated)."""
    setup = TrainSetup(stages=stages, microbatches=MICROBATCHES, micro_batch_size=1, schedule="1F1B",
                       mem_caps_bytes=[2**50] * stages)
    n = len(profile.layers)
    needs = []
    for cuts in itertools.combinations(range(1, n), stages - 1):
        for mask in range(2**n):
            plan = costmodel.split_to_stages([0, *cuts], [bool(mask >> i & 1) for i in range(n)], profile)
            cost = costmodel.evaluate(plan, profile, setup)
            needs.append(max(stage.peak_bytes for stage in cost.stages))
    return min(needs) + costmodel.FIT_MARGIN_BYTES


@pytest.mark.parametrize("profile", [synthetic.heterogeneous(5), synthetic.uniform_blocks(4)],
                         ids=["heterogeneous5", "uniform4"])
@pytest.mark.parametrize("solver", ["dp", "milp"])
def test_mem_at_the_need_fits_and_a_byte_below_is_refused(profile, solver, tmp_path):
    path = tmp_path / "p.json"
    io.save_profile(profile, path)
    need = least_need_bytes(profile, 2)
    args = ["solve", "--profile", path, "--stages", 2, "--microbatches", MICROBATCHES, "--solver", solver]

    at = tmp_path / "at.yaml"
    result = run(*args, "--mem", need, "--out", at)
    assert result.exit_code == 0, result.output
    plan = io.load_plan(at)
    setup = TrainSetup(stages=2, microbatches=MICROBATCHES, micro_batch_size=1, schedule="1F1B",
                       mem_caps_bytes=[need] * 2)
    cost = costmodel.evaluate(plan.stages, profile, setup)
    assert cost.feasible and max(stage.peak_bytes for stage in cost.stages) + costmodel.FIT_MARGIN_BYTES == need

    below = tmp_path / "below.yaml"
    result = run(*args, "--mem", need - 1, "--out", below)
    assert result.exit_code == 1
    assert result.output.startswith("Error: no plan fits the caps") and result.output.count("\n") == 1
    assert not below.exists()
