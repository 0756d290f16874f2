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
(8,192 B, §336, §381)."""

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
        assert 0 <= measured - predicted <= UNCHARGED_BYTES, (zero, measured, predicted)
