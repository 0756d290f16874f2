"""A split backward's weight pass across a stage's layers (issue 33; planner/cost/wgroups.py): torch's
stage_backward_weight keeps one parameter group's weight gradients bound while the next group's run, so a
layer's first group peaks on top of what the layer before leaves."""

from pathlib import Path

import pytest
import torch
from torch import nn

from planner.cost import costmodel
from planner.models.synthetic import layer, profile_of
from planner.profiler.splitbackward import split_backward_bytes
from planner.schema import StagePlan, TrainSetup
from planner.schema.profile import RecomputeOption
from scripts.milp_carry_brute import cap_setup, every_plan, roomy_setup

KIB = 1024


def _split(rows):
    """Three layers (each its own kind, so none is normalised to another's figures), each option
    none with (weight-pass peak, first group's peak, carry) in KiB, None where not recorded."""
    def one(item, peak, first, carry):
        none = RecomputeOption(name="none", kept_bytes=item.act_bytes, split_held_bytes=512, split_input_peak_bytes=8192,
                               split_peak_bytes=peak * KIB, split_first_peak_bytes=None if first is None else first * KIB,
                               split_carry_bytes=None if carry is None else carry * KIB)
        full = RecomputeOption(name="full", kept_bytes=item.input_bytes, recompute_ms=item.fwd_ms,
                               recompute_peak_bytes=item.act_bytes - item.input_bytes)
        return item.model_copy(update={"recompute_options": [none, full]})

    items = [layer(f"l{i}", f"K{i}", fwd_ms=1.0, act_mib=10, input_mib=1, output_mib=1, param_count=1024,
                   transient_mib=0.5) for i in range(len(rows))]
    return profile_of([one(item, *row) for item, row in zip(items, rows)])


def _weight_pass_peak(profile) -> int:
    setup = TrainSetup(stages=2, microbatches=4, micro_batch_size=1, schedule="ZBV", chunks=2, mem_caps_bytes=[2**40] * 2)
    view = costmodel.stages_view(setup, costmodel.schedule_of(setup))
    return costmodel.stage_sums(costmodel.layer_costs(profile), [0] * len(profile.layers), stage=1, profile=profile,
                                setup=view).weight_pass_peak_bytes


def test_a_layers_first_group_peaks_on_the_carry_of_the_layer_before():
    """Peaks 8, 48, 8 KiB, first groups 8, 4, 8, carries 6, 44, 1: the second layer's first group 4 + 6 stays
    under its own 48; the third's 8 + 44 = 52 KiB is the pass's peak (48, the largest layer's, before)."""
    assert _weight_pass_peak(_split([(8, 8, 6), (48, 4, 44), (8, 8, 1)])) == 52 * KIB


def test_a_profile_without_group_figures_is_charged_the_layers_whole_gradient():
    """Not recorded (a profile made before): each layer's whole peak on top of the layer before's 1,024
    fp32 weight gradients (4,096 B) less the 512 B its input pass left: 8 KiB + 3,584 B."""
    assert _weight_pass_peak(_split([(8, None, None)] * 3)) == 8 * KIB + 4096 - 512


def test_the_profiler_measures_each_groups_peak_and_carry_by_hand():
    """torch's own passes on a 4-row batch (fp32). Linear(32, 32) + Tanh: one group (weight 4,096 +
    bias 128 B), its saved output gradient 512 B: peak 4,224, carry 4,224 - 512. Linear(32, 32), Tanh,
    Linear(32, 16): the first group 4,224; the second's 2,112 on top of the first's still bound, its
    512 B freed: 5,824; it leaves its 2,112 (its own saved gradient is the incoming one). Linear(32, 16),
    Tanh, Linear(16, 32), Tanh: saved 256 + 512; 2,112, then 2,112 - 256 + 2,176 = 4,032; leaves
    2,176 - 256 - 512 = 1,408."""
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(32, 32), nn.Tanh()),
              nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 16)),
              nn.Sequential(nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 32), nn.Tanh())]
    found = []
    for module in layers:
        x = torch.randn(4, 32, requires_grad=True)
        found.append(split_backward_bytes(module, module, x, torch.randn_like(module(x))))
        assert all(p.grad is None for p in module.parameters())  # the layer's .grad put back
    assert found == [(512, 1024, 4224, 4224, 3712, 0), (512, 1024, 5824, 4224, 1600, 0), (768, 1280, 4032, 2112, 1408, 0)]


@pytest.mark.slow
@pytest.mark.parametrize("microbatches", [2, 8])
def test_dp_tiny_zbv_rank_1_peaks_at_most_its_prediction(microbatches, tmp_path):
    """ckplan's own run (gloo), dp_tiny under ZBV, 2 ranks x 2 chunks, [0 1 2 | 7] and [3 | 4 5 6], 4 samples a
    microbatch: rank 1's peak is stage 2's second group (layer 5's) with layer 4's 4,224 B of gradients still
    bound, its 512 B saved gradient freed: 85,792 / 111,392 B at M 2 / 8, 2,688 / 2,176 B under before
    (§45.ownunder, §66.zbvgroup). Now over by 1,024 B at every M (planned excess: the two gradients passed inside
    stage 2 that rules.passed_grad_bytes holds to W, which dp_tiny's blocks, ending in Tanh, do not hold)."""
    from planner import io
    from planner.cost.assembly import with_predictions
    from planner.runtime.launcher import run_plan
    from tests.fixtures.cli import run_ok

    root = Path(__file__).resolve().parent.parent
    profile_path, plan_path = tmp_path / "profile.json", tmp_path / "plan.yaml"
    run_ok("profile", root / "tests" / "fixtures" / "dp_tiny.py", "--micro-batch-size", "4", "--threads", "1",
           "--repeats", "1", "--warmup", "1", "--out", profile_path)
    run_ok("solve", "--profile", profile_path, "--stages", "2", "--mem", "100MiB", "--microbatches", str(microbatches),
           "--schedule", "ZBV", "--chunks", "2", "--out", plan_path)
    solved, profile = io.load_plan(plan_path), io.load_profile(profile_path)
    ranks = [StagePlan(index=0, layers=["0", "1", "2", "7"], chunks=[["0", "1", "2"], ["7"]]),
             StagePlan(index=1, layers=["3", "4", "5", "6"], chunks=[["3"], ["4", "5", "6"]])]
    cost = costmodel.evaluate(ranks, profile, solved.setup)
    io.save_plan(solved.model_copy(update={"stages": with_predictions(ranks, cost)}), plan_path)
    report = run_plan(io.load_plan(plan_path), plan_file=plan_path, steps=1, warmup_steps=1)
    rank1 = report.stages[1]
    assert 0 <= rank1.predicted.peak_bytes - rank1.measured.peak_bytes <= 1024, report


def _check_chunked_milp_against_brute_force(carries, leasts):
    """Every split of 6 heterogeneous layers into 2 ranks x 2 chunks under ZBV and every checkpoint set, each layer's
    weight pass peaking at 400 MiB and its first group at 100 MiB, layer i carrying carries[i] MiB into the next
    layer's, caps 20/40/60% of the way between the plans' peaks: the MILP's linear time is the least of those that
    fit under evaluate (`leasts`), and its plan fits there."""
    from planner.models.synthetic import heterogeneous
    from planner.solve import milp

    mib = 2**20

    def options(item, carry):
        split = dict(split_held_bytes=mib // 4, split_input_peak_bytes=mib, split_peak_bytes=400 * mib,
                     split_first_peak_bytes=100 * mib, split_carry_bytes=carry * mib)
        return [RecomputeOption(name="none", kept_bytes=item.act_bytes, **split),
                RecomputeOption(name="full", kept_bytes=item.input_bytes, recompute_ms=item.fwd_ms, **split)]

    profile = heterogeneous(6, seed=0)
    profile = profile.model_copy(update={"layers": [item.model_copy(update={"recompute_options": options(item, carry)})
                                                    for item, carry in zip(profile.layers, carries)]})
    roomy = roomy_setup()  # 2 ranks x 2 chunks under ZBV, 4 microbatches
    plans = every_plan(profile, roomy)
    for fraction, least in zip((0.2, 0.4, 0.6), leasts):
        setup = cap_setup(plans, roomy, fraction)
        fitting = [time for _, time, peak in plans if peak + costmodel.FIT_MARGIN_BYTES <= setup.pipeline.mem_caps_bytes[0]]
        assert min(fitting) == pytest.approx(least, rel=1e-8)
        problem = milp.build_problem(profile, setup)
        assert milp.solve(problem, mip_gap=0.0, threads=1).objective == pytest.approx(least, rel=1e-6), fraction
        assert costmodel.evaluate(milp.extract_plan(problem), profile, setup).feasible


BRUTE_LEASTS = (507.6645978, 465.1494076, 422.2396171)  # heterogeneous(6, seed=0) at its three caps (ms)


def test_the_chunked_milp_equals_brute_force_where_layers_carry_weight_gradients():
    """Every layer carrying 200 MiB (so the carry never sets evaluate's weight-pass peak: 100 + 200 < 400): its
    weight-pass rows charged the largest peak on the largest carry (600 MiB where evaluate has 400): 550.92, 501.12,
    456.25 ms against brute force's."""
    _check_chunked_milp_against_brute_force([200] * 6, BRUTE_LEASTS)


def test_the_chunked_milp_charges_no_carry_from_a_stages_last_layer():
    """The model's last layer alone carrying 1,000 MiB, which no layer after it in its stage runs beside (evaluate
    charges it nowhere): the MILP charged it on the largest first group wherever that layer shares its stage,
    515.48 and 465.68 ms against brute force's 507.66 and 465.15."""
    _check_chunked_milp_against_brute_force([0] * 5 + [1000], BRUTE_LEASTS)


def test_what_a_layer_leaves_to_the_passs_end_stays_under_every_later_layer():
    """(peak, first, carry, left) by hand: layer 0 leaves 30 of its 40 carried (its last group's result, 10, goes
    once layer 1's first group returns): layer 1's peak 50 on 30, its first 20 on 40; layer 2's peak 60 on 30 + 5
    (95, the stage's), its first 25 on 30 + 15. Without lefts (a profile made before) the fold is §66.zbvgroup's:
    60."""
    from planner.cost.wgroups import weight_pass_peak_bytes

    layers = [(40, 20, 40, 30), (50, 20, 15, 5), (60, 25, 8, 0)]
    assert weight_pass_peak_bytes(layers) == 95
    assert weight_pass_peak_bytes([row[:3] for row in layers]) == 60


@pytest.mark.slow
@pytest.mark.xdist_group("llama_style_profiles")  # one worker: the shared profiles once (conftest.py)
def test_a_chunk_of_two_blocks_checkpointed_whole_is_not_under_predicted_under_zbv(tmp_path, llama_style_profiles):
    """ckplan's own run (gloo), llama_style under ZBV, 2 ranks x 2 chunks, [0 | 4] and [1 2 | 3], blocks 1 and 2
    `full`, 4 samples a microbatch, M 4: rank 1 measured 12,149,388 B, planned 8,605,324 before (3,544,064 under;
    without the checkpoints exact): block 1's weight-pass reruns stay under block 2's whole pass (§890)."""
    from planner import io
    from planner.cost.assembly import with_predictions
    from planner.runtime.launcher import run_plan
    from tests.fixtures.cli import run_ok

    # llama_style.py measured at 4 samples a microbatch (the command's default), one thread, one repeat, no warmup
    profile_path, plan_path = llama_style_profiles[0], tmp_path / "plan.yaml"
    run_ok("solve", "--profile", profile_path, "--stages", "2", "--mem", "100MiB", "--microbatches", "4",
           "--schedule", "ZBV", "--chunks", "2", "--out", plan_path)
    solved, profile = io.load_plan(plan_path), io.load_profile(profile_path)
    ranks = [StagePlan(index=0, layers=["0", "4"], chunks=[["0"], ["4"]]),
             StagePlan(index=1, layers=["1", "2", "3"], chunks=[["1", "2"], ["3"]], checkpointed=["1", "2"])]
    cost = costmodel.evaluate(ranks, profile, solved.setup)
    io.save_plan(solved.model_copy(update={"stages": with_predictions(ranks, cost)}), plan_path)
    report = run_plan(io.load_plan(plan_path), plan_file=plan_path, steps=1, warmup_steps=1)
    rank1 = report.stages[1]
    assert rank1.predicted.peak_bytes >= rank1.measured.peak_bytes, report
