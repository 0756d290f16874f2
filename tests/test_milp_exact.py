"""The chunked MILP's split-backward rows priced as evaluate prices them (issue 33; planner/solve/milp_ranks.py,
docs/published-runs.md §67.milpexact): on scripts/milp_carry_brute.py's drawn profiles (6 heterogeneous layers,
2 ranks x 2 chunks under ZBV), its optimum is brute force's least linear time that fits, and its plan fits."""

import pulp
import pytest

from planner.cost import costmodel
from planner.solve import milp
from scripts.milp_carry_brute import (
    cap_setup,
    drawn_profile,
    every_plan,
    least_fitting,
    roomy_setup,
    with_a_run,
)


def _milp_against_brute_force(seed: int, fraction: float, carries=(0, 1, 2, 4), inputs=False,
                              left=False, run=False) -> tuple[float, float]:
    profile, roomy = drawn_profile(seed, list(carries), inputs, left), roomy_setup()
    profile = with_a_run(profile) if run else profile
    plans = every_plan(profile, roomy)
    setup = cap_setup(plans, roomy, fraction)
    problem = milp.build_problem(profile, setup)
    solved = milp.solve(problem, mip_gap=0.0, threads=1)
    assert costmodel.evaluate(milp.extract_plan(problem), profile, setup).feasible
    return solved.objective, least_fitting(plans, setup)


@pytest.mark.parametrize("seed, fraction, carries, base", [
    # the weight gradients a stage's first layer sends back charged again among what its input pass leaves for
    # the weight pass (10.1 MiB per microbatch between I and W), and the input pass's peak on every layer's
    (7, 0.2, (0,), 462.2775),
    (3, 0.4, (0,), 441.4001),
    # and the largest first group charged the largest carry though no carry precedes it
    (3, 0.4, (0, 1, 2, 4), 441.4001),
    (2, 0.2, (0, 1, 2, 4), 623.5732),
])
def test_the_chunked_milp_equals_brute_force(seed, fraction, carries, base):
    """Before: the MILP's optimum `base` ms, 0.9-4.0% above brute force's."""
    objective, least = _milp_against_brute_force(seed, fraction, carries)
    assert objective == pytest.approx(least, rel=1e-9), base


@pytest.mark.parametrize("seed, fraction, base", [(3, 0.4, 431.4543), (6, 0.4, 495.4488), (2, 0.2, 599.3398)])
def test_the_chunked_milp_prices_the_input_pass_as_evaluate(seed, fraction, base):
    """The input pass's figures drawn too (what each layer leaves for the weight pass 0-50 MiB, its peak 50-200 MiB):
    the rows charged the largest input peak on top of all the stage's layers leave, where evaluate charges each
    layer's peak on what the layers after it leave (costmodel.input_pass_peak_bytes): `base` ms, 1.0-5.0% above."""
    objective, least = _milp_against_brute_force(seed, fraction, inputs=True)
    assert objective == pytest.approx(least, rel=1e-9), base


@pytest.mark.parametrize("seed, fraction, brute_force, base", [
    (2, 0.2, 582.2068, 593.6226), (21, 0.2, 599.5458, 611.3016), (26, 0.4, 547.9247, 594.5566),
    (38, 0.4, 434.7308, 471.7291)])
def test_the_chunked_milp_chooses_a_runs_option_order(seed, fraction, brute_force, base):
    """Four layers one run, the input pass's figures drawn (scripts/milp_carry_brute.py --run --inputs): brute
    force's plan puts a none layer of the run before a full one in a stage, which problem.order's fixed placement
    (full first) could not express: the MILP's optimum was `base` ms, 1.96-8.51% above (docs/published-runs.md
    §67.milpexact, §69.milporder). Now each position of the run in a split stage takes its own option (seeds 2, 21),
    or, where the run's options carry alike, its first layer does and the rest follow input_order (26, 38:
    planner/solve/milp_order.py)."""
    objective, least = _milp_against_brute_force(seed, fraction, inputs=True, run=True)
    assert least == pytest.approx(brute_force, abs=1e-4)
    assert objective == pytest.approx(least, rel=1e-9), base


def test_the_chunked_milp_charges_what_a_layer_leaves_to_the_weight_passs_end():
    """A full option's carry left to the stage's weight pass's end (split_left_bytes, the reruns of §890) under
    every later layer: without those rows the MILP's optimum was 491.1807 ms, 1.3% below brute force's, with a
    plan that does not fit (seed 13, its 20 % cap, scripts/milp_carry_brute.py --left)."""
    objective, least = _milp_against_brute_force(13, 0.2, left=True)
    assert objective == pytest.approx(least, rel=1e-9)


@pytest.mark.parametrize("seed", [13, 4])
@pytest.mark.parametrize("cuts, mask", [((1, 2, 5), 0b111111), ((2, 3, 5), 0b111011), ((1, 3, 4), 0b110101)])
def test_the_chunked_milps_rows_are_evaluates_peak_with_layers_left_to_the_end(seed, cuts, mask):
    _check_rows_against_evaluate(drawn_profile(seed, [0, 1, 2, 4], inputs=True, left=True), cuts, mask)


@pytest.mark.parametrize("seed, carries, inputs", [(7, (0,), False), (2, (0, 1, 2, 4), False), (3, (0, 1, 2, 4), True)])
@pytest.mark.parametrize("cuts, mask", [((1, 2, 4), 0b000000), ((2, 3, 5), 0b001001), ((1, 3, 4), 0b110101)])
def test_the_chunked_milps_rows_are_evaluates_peak_for_a_fixed_plan(seed, carries, inputs, cuts, mask):
    _check_rows_against_evaluate(drawn_profile(seed, list(carries), inputs), cuts, mask)


@pytest.mark.parametrize("seed", [2, 3])
@pytest.mark.parametrize("cuts, mask", [((1, 2, 5), 0b001100), ((1, 3, 5), 0b011010), ((2, 4, 5), 0b000000)])
def test_the_chunked_milps_rows_are_evaluates_peak_over_a_run_of_layers(seed, cuts, mask):
    """The same with four layers one run (their checkpointed layers first in each stage, as the MILP places a run's
    options): two layers of one option in a row carry into each other (the weight pass's d rows), a run's option
    absent from a stage passes the carry on."""
    _check_rows_against_evaluate(with_a_run(drawn_profile(seed, [0, 1, 2, 4], inputs=True)), cuts, mask)


@pytest.mark.parametrize("seed", [2, 26])
@pytest.mark.parametrize("cuts, mask", [((1, 2, 5), 0b001000), ((1, 3, 5), 0b010100), ((2, 4, 5), 0b001000)])
def test_the_chunked_milps_rows_are_evaluates_peak_for_a_run_out_of_problem_order(seed, cuts, mask):
    """The same with a none layer of the run before a full one in a stage (positions the MILP now chooses,
    milp_order.py): start_values fixes the positions to the plan's order, extract_plan reads it back. On the base
    the rows priced problem.order's placement (full first), not the plan's."""
    problem, stages = _check_rows_against_evaluate(with_a_run(drawn_profile(seed, [0, 1, 2, 4], inputs=True)), cuts,
                                                   mask)
    assert [stage.recompute for stage in milp.extract_plan(problem)] == [
        stage.recompute for stage in costmodel.ranks_of(stages, roomy_setup())]


def test_the_chunked_milps_rows_charge_a_first_group_above_its_layers_peak():
    """A hand-edited profile whose first parameter group peaks above its layer's whole weight pass (every option's
    split_first_peak_bytes twice its split_peak_bytes), no layer carrying: evaluate charges the first group on
    nothing (wgroups.weight_pass_peak_bytes), the rows read the peak alone (below evaluate: a plan that does not
    fit)."""
    profile = drawn_profile(2, [0])
    layers = [item.model_copy(update={"recompute_options": [
        option.model_copy(update={"split_first_peak_bytes": 2 * option.split_peak_bytes})
        for option in item.recompute_options]}) for item in profile.layers]
    _check_rows_against_evaluate(profile.model_copy(update={"layers": layers}), (1, 2, 4), 0b010010)


def _check_rows_against_evaluate(profile, cuts, mask):
    """A plan fixed in the MILP (milp.start_values, the pass bounds and carries left to their least): each rank's
    largest memory row is its peak under evaluate, to 2 bytes, never above nor below. Before: 7.8-57.8 MiB above on each
    (what the input pass leaves charged the stage's first layer's sent gradient, the input pass's largest peak on
    all the stage leaves, the largest first group on the largest carry)."""
    from planner.solve import highs

    roomy = roomy_setup()
    stages = costmodel.split_to_stages([0, *cuts], [mask >> i & 1 for i in range(6)], profile)
    cost = costmodel.evaluate(costmodel.ranks_of(stages, roomy), profile, roomy)
    problem = milp.build_problem(profile, roomy, objective="memory")
    values = milp.start_values(problem, stages, threads=1)
    free = ("scale", "T_", "U_", "W_", "C_", "d_")
    for var in problem.lp.variables():
        if not var.name.startswith(free):
            var.lowBound = var.upBound = values[var.name]
    problem.lp.setObjective(pulp.lpSum(var for var in problem.lp.variables() if var.name.startswith(free[1:])))
    problem.lp.solve(highs._HiGHS(msg=False, threads=highs.scheduler_threads(1)))
    assert problem.lp.sol_status == pulp.LpSolutionOptimal
    for rank, peak in enumerate(cost.peak_bytes_per_stage):
        rows = [row for row in problem.lp.constraints() if row.name.startswith(milp.MEMORY_ROWS)
                and (row.name.endswith(f"_r{rank}") or row.name.split("_")[-3 if row.name.startswith("pass_") else -2]
                     == str(rank))]
        largest = max(sum(coef * var.varValue for var, coef in row.items() if var.name != "scale") + row.constant
                      for row in rows) - costmodel.FIT_MARGIN_BYTES / 2**20
        assert largest * 2**20 == pytest.approx(peak, abs=2), rank
    return problem, stages
