"""ckplan's runtime at ZeRO 0, 2 and 3 on one stage (2/3 by FSDP2, torch 2.13): the tied GPT fixture and its untied
twin profiled, solved and run on gloo, each rank's peak held to the prediction (below). FSDP2's units
are charged per moment (planner/cost/fsdpunits.py): at the peak, the start of blocks.3's backward, ZeRO 3 holds
blocks.3, blocks.2 prefetched and the tied [embed, head] unit gathered; ZeRO 2 peaks at the head's forward with
blocks.3's all-gather output (untied: the head's copy-out, its output and blocks.3's). The largest layer's
constant term put ZeRO 3 9.4% (tied) and 10.5% (untied) over, ZeRO 2 7% over.

Every ZeRO stage is held to the bytes explained (branch zero0tied): the prediction never over, and under by no more
than 12 B: the schedule's two 4 B losses and the loss's 4 B root gradient, read, not charged (§384). Before, 208 B more: Adam's step counts, a 4 B fp32 scalar per parameter tensor, which
torch 2.13.0's Adam keeps on the CPU (adam.py 168-176: on the parameter's device only when capturable or fused), so
on gloo's device and never on a GPU's (§382, planner/cost/stepcounts.py). ZeRO 2 can be under by 4,100 B more, not
traced (§384): the untied twin always, the tied one in a loaded CI run (988,372 measured, 984,272 predicted; 4 B under
alone), so both keep the launched tests' 2%. Before, the tied GPT's ZeRO 0 was 9,436 B under: the whole
global batch each replica kept as a view (1,024 B, §383) and the tied table's gradient in autograd's InputBuffer
(8,192 B, §336, §381).

Under load a ZeRO 3 rank can peak above that by gloo's copy of one reduce-scatter input, held late (§565): gloo
reduce-scatters a clone of the input (the unit's fp32 gradients) and frees it when its worker thread drops the
work, which a loaded host can delay past the next unit's pre-backward. The tied GPT measured 866,140 against
864,976 in CI and once in four runs pinned to one core (`taskset -c 0`): blocks.3's 50,816 B clone still held at
blocks.2's copy-out. Held longer (played at its worst, to the next reduce-scatter), 34,060 B over (tied) and
25,612 (untied), under the clone; ZeRO 2's 10,500 and 14,340 stay inside its 2%; ZeRO 0 all-reduces in place.
Inside the call the clone is always there, beside the input and the output, but in place of the unit's unsharded
gradients, which FSDP2 frees before the call (_fsdp_collectives.py 606) and the prediction charges at that moment:
the same bytes, the reduce dtype being the parameters' on ckplan's runtime (no mixed-precision policy), so only the
late part is allowed (§610-§612)."""

from __future__ import annotations

import pytest
from conftest import ROOT
from fixtures.cli import run_ok

UNCHARGED_BYTES = 12  # two losses and a root gradient, not charged: §384
FIXTURES = {"tied": ROOT / "tests" / "fixtures" / "tied_gpt.py", "untied": ROOT / "tests" / "fixtures" / "untied_gpt.py"}


@pytest.fixture(scope="module", params=sorted(FIXTURES))
def gpt_profile(request, tmp_path_factory):
    profile = tmp_path_factory.mktemp(request.param) / "profile.json"
    run_ok("profile", FIXTURES[request.param], "--micro-batch-size", "2", "--threads", "1", "--repeats", "1",
           "--warmup", "1", "--out", profile)
    return profile


def late_clone_bytes(profile, setup) -> int:
    """gloo's copy of the largest reduce-scatter input a one-stage ZeRO 3 rank makes (§565): the largest FSDP2
    unit's parameters (a tied parameter once, in its unit) in the reduce dtype."""
    from planner.cost import dataparallel, fsdpunits, gathered

    params, _, units = gathered._units_args(profile, setup)
    sizes: dict[int, int] = {}
    for unit, count in zip(fsdpunits.unit_of_layers(len(params), units["grouping"], units["tied"]), params):
        sizes[unit] = sizes.get(unit, 0) + count
    return int(max(sizes.values()) * dataparallel.param_bytes(setup).grads)


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_the_clone_inside_the_call_takes_the_freed_gradients_bytes(precision):
    """By hand: under ckplan's record FSDP2 reduces in the parameters' dtype (planner/runtime/mesh.py sets no
    MixedPrecisionPolicy), so gloo's clone of a unit's reduce-scatter input (the unit's parameters x the reduce
    dtype) is exactly the unit's unsharded gradients FSDP2 freed before the call (x the weights' dtype), 4 B or 2 B
    a parameter both: the synchronous clone adds nothing to the post-backward moment (§612); were the reduce dtype
    wider, the clone would exceed the freed gradients and need its own charge."""
    from planner.cost import dataparallel
    from planner.schema import DataParallelSetup, PipelineSetup, TrainingSetup, TrainSetup

    setup = TrainSetup(pipeline=PipelineSetup(stages=1, microbatches=2, micro_batch_size=2, mem_caps_bytes=[2**30]),
                       data_parallel=DataParallelSetup(dp=2, zero=3), training=TrainingSetup(precision=precision))
    held = dataparallel.param_bytes(setup)
    assert held.grads == held.weights == {"fp32": 4, "bf16-mixed": 2}[precision]


def test_the_late_clone_is_the_largest_units_fp32_gradients(gpt_profile):
    """By hand: a block's 12,704 parameters (two LayerNorms 64 + 64, attention 3,168 + 1,056, MLP 4,224 + 4,128)
    x 4 B; the tied GPT's [embed, head] unit (2,048 + 512 + 64) and the untied twin's embed and head are smaller."""
    from planner import io
    from planner.schema import DataParallelSetup, PipelineSetup, TrainSetup

    setup = TrainSetup(pipeline=PipelineSetup(stages=1, microbatches=2, micro_batch_size=2, mem_caps_bytes=[2**30]),
                       data_parallel=DataParallelSetup(dp=2, zero=3))
    assert late_clone_bytes(io.load_profile(gpt_profile), setup) == 12_704 * 4 == 50_816


@pytest.mark.slow
@pytest.mark.parametrize("zero", [0, 2, 3])
def test_one_stage_every_zero_peak_at_the_prediction(tmp_path, gpt_profile, zero):
    from planner import io
    from planner.runtime.launcher import run_plan

    plan_path = tmp_path / "plan.yaml"
    run_ok("solve", "--profile", gpt_profile, "--stages", "1", "--dp", "2", "--zero", zero, "--mem", "1GiB",
           "--microbatches", "2", "--out", plan_path)
    report = run_plan(io.load_plan(plan_path), plan_file=plan_path, steps=1, warmup_steps=1)
    for stage in report.stages:
        measured, predicted = stage.measured.peak_bytes, stage.predicted.peak_bytes
        if zero == 2:  # §384; the tied twin too: under CI's load it measured the same 4,100 B more (988,372 / 984,272)
            assert abs(measured - predicted) <= 0.02 * predicted, (zero, measured, predicted)
            continue
        # ZeRO 3: never under; over by the bytes read and not charged, or by gloo's one clone held late (§565)
        late = late_clone_bytes(io.load_profile(gpt_profile), io.load_plan(plan_path).setup) if zero == 3 else 0
        assert 0 <= measured - predicted <= UNCHARGED_BYTES + late, (zero, measured, predicted)
