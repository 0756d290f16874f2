"""The gradient of a stage's output charged once (planner/cost/boundgrad.py; docs/published-runs.md §44.boundgrad2):
the profile's amount by hand, evaluate's stage before the last by hand, and the DP and the MILP held to evaluate and to
brute force where a stage before the last peaks at its last layer's backward."""

import itertools
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from torch import nn

from planner.cost import costmodel
from planner.models.synthetic import heterogeneous, layer, profile_of
from planner.profiler.transients import _transient_parts
from planner.schema import TrainSetup
from planner.solve import milp
from tests.test_dpsolve import _check_every_range, random_case
from tests.test_milp import check_equals_brute_force, tiny_cases

MIB = 2**20
HUGE = 2**50


class _ForwardTemporary(nn.Module):
    """A forward that makes a temporary of 64 x its input (no gradient through it) and a backward of one add."""

    def forward(self, x):
        with torch.no_grad():
            big = x.repeat(64, 1).sum()
        return x * 2 + big


def test_the_transient_says_how_much_of_it_is_the_incoming_gradient():
    """A linear's backward sets its transient, the incoming gradient in it (4 x 32 floats, 512 B): all of it counted;
    a forward's temporary sets the other's, and none of it is the gradient."""
    torch.manual_seed(0)
    x = torch.randn(4, 32, requires_grad=True)
    linear = nn.Linear(32, 32)
    grad = torch.ones(4, 32)
    transient, incoming = _transient_parts(linear, x, grad)
    assert incoming == 4 * 32 * 4 and transient >= incoming
    x.grad = None
    transient, incoming = _transient_parts(_ForwardTemporary(), x, grad)
    assert transient > 16 * 4 * 32 * 4 and incoming == 0  # the temporary's, far above any backward's


def test_a_kind_takes_off_what_every_one_of_its_layers_holds_apart_from_the_gradient():
    """The kind's transient is its layers' max (10 MiB); without the gradient they hold 6 and 0 MiB: 4 MiB of the
    kind's transient is the gradient, not the 8 MiB of the layer that has the most of it."""
    layers = [layer("a", "K", fwd_ms=1, act_mib=1, input_mib=1, param_count=0, transient_mib=10),
              layer("b", "K", fwd_ms=1, act_mib=1, input_mib=1, param_count=0, transient_mib=8)]
    layers = [layers[0].model_copy(update={"incoming_grad_bytes": 4 * MIB}),
              layers[1].model_copy(update={"incoming_grad_bytes": 8 * MIB})]
    costs = costmodel.layer_costs(profile_of(layers))
    assert [c.transient_bytes for c in costs] == [10 * MIB] * 2
    assert [c.incoming_grad_bytes for c in costs] == [4 * MIB] * 2


def _two_stages(incoming_mib: float):
    """Three layers, 2 MiB out each; the last of stage 0 has a 5 MiB backward transient, `incoming_mib` of it its
    output's gradient."""
    layers = [layer("l0", "A", fwd_ms=1, act_mib=1, input_mib=2, output_mib=2, param_count=0, transient_mib=1),
              layer("l1", "B", fwd_ms=1, act_mib=1, input_mib=2, output_mib=2, param_count=0, transient_mib=5),
              layer("l2", "C", fwd_ms=1, act_mib=1, input_mib=2, output_mib=2, param_count=0, transient_mib=5)]
    layers = [item.model_copy(update={"incoming_grad_bytes": int(incoming_mib * MIB) if item.name != "l0" else 0})
              for item in layers]
    setup = TrainSetup(stages=2, microbatches=2, micro_batch_size=1, schedule="GPipe", mem_caps_bytes=[HUGE] * 2)
    stages = costmodel.split_to_stages([0, 2], [False] * 3, profile_of(layers))
    return costmodel.evaluate(stages, profile_of(layers), setup)


def test_a_stage_before_the_last_charges_its_last_layers_transient_less_the_gradient():
    """Stage 0 = [l0, l1]: its transient is l1's 5 MiB less the 2 MiB that is the stage's receive buffer, 3 MiB (l0's
    1 MiB less the 1 MiB l1 keeps after it is less); its peak falls by exactly those 2 MiB. The last stage's l2 keeps
    its gradient in its transient (the loss's, charged nowhere else): unchanged."""
    before, after = _two_stages(0), _two_stages(2)
    assert before.stages[0].transient_bytes == 5 * MIB and after.stages[0].transient_bytes == 3 * MIB
    assert before.stages[0].peak_bytes - after.stages[0].peak_bytes == 2 * MIB
    assert after.stages[1].transient_bytes == before.stages[1].transient_bytes == 5 * MIB
    assert after.stages[1].peak_bytes == before.stages[1].peak_bytes


def _with_incoming(profile, rng):
    """Each kind's layers with all, half or none of their transient its output's gradient."""
    share = {kind: rng.choice([1.0, 0.5, 0.0]) for kind in {item.kind for item in profile.layers}}
    return profile.model_copy(update={"layers": [
        item.model_copy(update={"incoming_grad_bytes": int(item.transient_bytes * share[item.kind])})
        for item in profile.layers]})


@pytest.mark.parametrize("seed", range(16))
def test_every_range_of_the_dp_is_evaluates_where_a_stage_closes_before_the_last(seed, monkeypatch):
    """test_dpsolve's check of every (stage, range), on profiles whose layers' transients hold their output's
    gradient, two or three stages: each range's least recompute and least peak is evaluate's, stage by stage."""
    profile, roomy, rng = random_case(3000 + seed)
    while len(profile.layers) < 2 or not any(item.transient_bytes for item in profile.layers):
        profile, roomy, rng = random_case(rng.randint(4000, 10**6))
    stages = rng.randint(2, min(3, len(profile.layers)))
    roomy = roomy.model_copy(update={"stages": stages, "microbatches": max(stages, roomy.pipeline.microbatches),
                                     "mem_caps_bytes": [HUGE] * stages})
    _check_every_range(_with_incoming(profile, rng), roomy, rng, monkeypatch)


@st.composite
def _closing_cases(draw):
    # at most 5 layers (2 or 3 stages still): brute force's 2^n checkpoint sets at 6 and 7 layers were three quarters
    # of this test's time, and a stage closes before the last at any of these sizes (§66.suitetime)
    profile, roomy, fractions = draw(tiny_cases(max_layers=5))
    assume(roomy.pipeline.stages >= 2)
    shares = [draw(st.sampled_from([1.0, 0.5, 0.0])) for _ in profile.layers]
    layers = [item.model_copy(update={"incoming_grad_bytes": int(item.transient_bytes * share)})
              for item, share in zip(profile.layers, shares)]
    assume(any(item.incoming_grad_bytes for item in layers))
    return profile.model_copy(update={"layers": layers}), roomy, fractions


def _one_kind_params_on_the_first():
    """Three layers of one kind, parameters on the first only (65,536), the last's 1 MiB transient its output's
    gradient; 3 stages of GPipe, dp 4 under ZeRO 3: FSDP2's moments charge each layer its own parameters, the kind's
    maximum elsewhere (layers.layer_costs). Only every layer checkpointed fits (peaks 4,128,768 / 4,980,736 /
    3,932,172 B); the MILP's run of all three charged l1 and l2 l0's all-gather (196,608 B over on stage 1) and
    called it infeasible (§66.milpfsdp)."""
    layers = [layer(f"l{i}", "A", fwd_ms=0.5, bwd_ratio=1.0, act_mib=1, input_mib=0.5, output_mib=0.5,
                    param_count=65536 if i == 0 else 0, transient_mib=1 if i == 2 else 0) for i in range(3)]
    layers[2] = layers[2].model_copy(update={"incoming_grad_bytes": MIB})
    roomy = TrainSetup(stages=3, microbatches=2, micro_batch_size=1, schedule="GPipe", mem_caps_bytes=[HUGE] * 3,
                       dp=4, zero=3, precision="fp32")
    return profile_of(layers), roomy, [0.03125] * 3


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(_closing_cases())
@example(_one_kind_params_on_the_first())
def test_both_solvers_equal_brute_force_where_a_stage_closes_before_the_last(case):
    """test_milp's brute force (every split, every checkpoint set, scored by evaluate) on cases whose layers' transients
    hold their output's gradient, 2 or 3 stages: the DP's and the MILP's optimum is brute force's and their plans'
    peaks are evaluate's (check_solver_finds_the_optimum: assert_meets_caps)."""
    check_equals_brute_force(case, ("dp", "milp"))


def test_the_chunked_milp_equals_brute_force_where_a_virtual_stage_closes_before_the_last():
    """Every split of 6 heterogeneous layers into 2 ranks x 2 chunks and every checkpoint set, each layer's transient as
    large as what it keeps and half of it its output's gradient, under a cap 40% of the way between the plans' peaks:
    the MILP's linear time is the least of those that fit under evaluate (the chunked path, stage_sums per virtual
    stage), and its plan fits there (without the closing rows the MILP's least is 423.13 against 414.40 ms)."""
    from tests.test_chunked_schedules import _chunked_linear

    profile = heterogeneous(6, seed=3)
    profile = profile.model_copy(update={"layers": [
        item.model_copy(update={"transient_bytes": item.act_bytes, "incoming_grad_bytes": item.act_bytes // 2})
        for item in profile.layers]})
    roomy = TrainSetup(stages=2, microbatches=4, micro_batch_size=1, schedule="interleaved-1F1B", chunks=2,
                       mem_caps_bytes=[HUGE] * 2)
    plans = []
    for cuts in itertools.combinations(range(1, 6), 3):
        for mask in range(2**6):
            stages = costmodel.split_to_stages([0, *cuts], [mask >> i & 1 for i in range(6)], profile)
            plans.append((stages, max(costmodel.evaluate(costmodel.ranks_of(stages, roomy), profile, roomy)
                                      .peak_bytes_per_stage)))
    low, high = min(p for _, p in plans), max(p for _, p in plans)
    cap = int(low + 0.4 * (high - low))
    setup = roomy.model_copy(update={"mem_caps_bytes": [cap] * 2})
    fitting = [_chunked_linear(stages, profile, setup) for stages, peak in plans
               if peak + costmodel.FIT_MARGIN_BYTES <= cap]
    problem = milp.build_problem(profile, setup)
    assert milp.solve(problem, mip_gap=0.0, threads=1).objective == pytest.approx(min(fitting), rel=1e-6)
    assert costmodel.evaluate(milp.extract_plan(problem), profile, setup).feasible


@pytest.mark.slow
def test_a_two_stage_plan_on_gloo_runs_at_its_predicted_peak_on_the_stage_before_the_last(tmp_path):
    """dp_tiny (8 x Linear(32, 32) + Tanh) profiled, split 4 | 4 under GPipe, 4 microbatches of 4, launched on gloo
    against one process: stage 0's measured peak is its prediction to the byte, and the prediction that counts its
    last block's incoming gradient again (the profile read as one made before the field: incoming_grad_bytes 0) is
    over by exactly that gradient, 4 x 32 x 4 B."""
    from fixtures.cli import run_ok

    from planner import io
    from planner.cost.assembly import with_predictions
    from planner.runtime.launcher import run_plan
    from planner.runtime.reference import against_reference
    from planner.schema import StagePlan

    profile_path, plan_path = tmp_path / "tiny.json", tmp_path / "plan.yaml"
    run_ok("profile", Path(__file__).parent / "fixtures" / "dp_tiny.py", "--micro-batch-size", "4", "--threads", "1",
           "--repeats", "1", "--warmup", "1", "--out", profile_path)
    run_ok("solve", "--profile", profile_path, "--stages", "2", "--schedule", "GPipe", "--mem", "1GiB",
           "--microbatches", "4", "--out", plan_path)
    solved, profile = io.load_plan(plan_path), io.load_profile(profile_path)
    assert profile.layers[3].incoming_grad_bytes == 4 * 32 * 4
    stages = [StagePlan(index=0, layers=["0", "1", "2", "3"]), StagePlan(index=1, layers=["4", "5", "6", "7"])]
    plan = solved.model_copy(update={"stages": with_predictions(stages, costmodel.evaluate(stages, profile,
                                                                                            solved.setup))})
    io.save_plan(plan, plan_path)
    report = run_plan(io.load_plan(plan_path), plan_file=plan_path, steps=1, warmup_steps=1)
    assert all(diff.ok for diff in against_reference(plan, report, plan_file=plan_path, seed=0))
    first = report.stages[0]
    assert first.measured.peak_bytes == first.predicted.peak_bytes
    before = profile.model_copy(update={"layers": [item.model_copy(update={"incoming_grad_bytes": 0})
                                                   for item in profile.layers]})
    twice = costmodel.evaluate(stages, before, solved.setup).stages[0].peak_bytes
    assert twice - first.measured.peak_bytes == 4 * 32 * 4


def test_the_milps_runs_part_where_fsdp2s_units_differ_within_a_kind():
    """_one_kind_params_on_the_first's layers, one kind: the MILP's runs part l0 (65,536 parameters) from l1 and l2
    (none), and its least cap scale is evaluate's for the one plan that fits, stage 1's peak and fit margin over its
    cap: (4,980,736 + 4,096) / 4,997,120 (on main a run of all three: 1.0467, stage 2 over by l0's all-gather less its
    shard, 262,144 - 65,536 B)."""
    profile, roomy, _ = _one_kind_params_on_the_first()
    setup = roomy.model_copy(update={"mem_caps_bytes": [4145152, 4997120, 3948555]})
    problem = milp.build_problem(profile, setup, objective="memory")
    # l1 and l2 part too: l1's unit before is l0's (prefetched), l2's is none and it is the model's last (§67.lead)
    assert [(run.start, run.size) for run in problem.runs] == [(0, 1), (1, 1), (2, 1)]
    assert milp.solve(problem, mip_gap=0.0, threads=1).objective == pytest.approx(4984832 / 4997120, rel=1e-6)
