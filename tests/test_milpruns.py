"""The runs the MILP builds (milp.problem_runs) counted alike where the MILP builds them and where the search
route decides whether its layers are distinct enough to start the MILP from the heuristic's plan
(search._better_start, HEURISTIC_RUNS_PER_STAGE): under ZeRO 2/3 FSDP2's units split a kind's run by each
layer's own parameters (milp._units_apart, §66.milpfsdp), docs/published-runs.md §67.review66."""

from __future__ import annotations

from planner.cost import costmodel
from planner.models.synthetic import layer, profile_of
from planner.schema import TrainSetup
from planner.solve import milp, search
from planner.solve.deadline import Deadline

HUGE = 2**50


def _alternating(count: int = 4):
    """`count` layers of one kind A, 65,536 parameters on every other one (l0, l2, ...), none on the rest: one run by
    the kind's numbers, `count` runs once FSDP2's units are charged per moment (one stage, dp 4, ZeRO 3)."""
    layers = [layer(f"l{i}", "A", fwd_ms=0.5, act_mib=1, input_mib=0.5, param_count=65536 if i % 2 == 0 else 0)
              for i in range(count)]
    setup = TrainSetup(stages=1, microbatches=2, micro_batch_size=1, schedule="1F1B", mem_caps_bytes=[HUGE],
                       dp=4, zero=3, precision="fp32")
    return profile_of(layers), setup


def test_problem_runs_are_the_runs_build_problem_builds():
    """4 layers of one kind, parameters on l0 and l2: 1 run by the kind alone, 4 under ZeRO 3 (each its own), and 1
    under ZeRO 1 (units not charged per moment); problem_runs is build_problem's, run by run."""
    profile, setup = _alternating()
    assert len(milp.find_runs(costmodel.layer_costs(profile))) == 1
    assert [run.start for run in milp.problem_runs(profile, setup)] == [0, 1, 2, 3]
    assert milp.problem_runs(profile, setup) == milp.build_problem(profile, setup).runs
    zero1 = setup.model_copy(update={"zero": 1})
    assert len(milp.problem_runs(profile, zero1)) == 1


def test_the_search_counts_the_runs_the_milp_builds(monkeypatch):
    """One stage, 4 runs under ZeRO 3 > HEURISTIC_RUNS_PER_STAGE (2) x 1: the search route asks the heuristic for a
    start (counting the kind's one run, it did not); under ZeRO 1, one run, it does not."""
    profile, setup = _alternating()
    asked = []
    monkeypatch.setattr(search.incumbent, "heuristic_plan", lambda *args, **kwargs: asked.append(1))
    assert search._better_start(profile, setup, None, None, Deadline(None)) == (None, None)
    assert asked == [1]
    search._better_start(profile, setup.model_copy(update={"zero": 1}), None, None, Deadline(None))
    assert asked == [1]


def test_a_run_ending_at_the_models_last_layer_is_charged_that_layers_own_moments():
    """Two layers of one kind on one stage, dp 4, ZeRO 2 (FSDP2's moments per layer, none beside a pipeline): the last
    layer's extra under full recompute is 1.0 MiB (no unit after it to reduce), the first's 1.25; one run charged the
    last the first's, and the MILP called the only fitting plan (both checkpointed: 3,670,016 B under evaluate, the cap
    3,710,976) infeasible — hypothesis's example on CI (docs/published-runs.md §67.lead)."""
    layers = [layer(f"l{i}", "A", fwd_ms=0.5, bwd_ratio=1.0, act_mib=act, input_mib=1, output_mib=0.5,
                    param_count=65536) for i, act in enumerate((1, 2))]
    profile = profile_of(layers)
    setup = TrainSetup(stages=1, microbatches=1, micro_batch_size=1, schedule="1F1B", mem_caps_bytes=[3710976],
                       dp=4, zero=2, precision="fp32")
    assert len(milp.problem_runs(profile, setup)) == 2
    both = costmodel.split_to_stages([0], [1, 1], profile)
    assert costmodel.evaluate(both, profile, setup).stages[0].peak_bytes == 3670016
    result = search.plan(profile, setup, solver="milp", mip_gap=0.0, threads=1)
    assert isinstance(result, search.PlanResult), result
    assert result.stages[0].checkpointed == ["l0", "l1"]
    assert result.cost.iteration_ms == costmodel.evaluate(both, profile, setup).iteration_ms
