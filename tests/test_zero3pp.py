"""ckplan's runtime at ZeRO 2/3 beside a pipeline (2 stages x dp 2, 4 gloo processes): FSDP2's units charged per
moment as the stage runs them (planner/cost/gathered.py stage_unit_moments, §399-§401, §435-§436), where the largest
layer's constant term put the tied GPT 18-45% over its measured peak. Each split is pinned (the solver's choice
moved with a timed profile). The last stage of 1F1B (one forward before each backward) is held as one stage is
(tests/test_zero3peak.py): ZeRO 3 within the 12 B read and not charged (§384), ZeRO 2 within 2% (its 4,100 B, §384).
A stage that runs two forwards before its first backward (its first backward finds no gradient shard yet, its last
unit's all-gather output prefetched by its first where it has two units: §400-§401, §435) within 3%: ZeRO 0's own
4,096 B over (§402). What a split's prediction holds over that is held with its cause (OVER_FIRST, OVER_LAST)."""

from __future__ import annotations

import pytest
from conftest import ROOT
from fixtures.cli import run_ok

from planner.cost import fsdpunits
from planner.schema import DataParallelSetup, PipelineSetup, TrainSetup

UNCHARGED_BYTES = 12  # two losses and a root gradient, not charged: §384


def _setup(schedule: str, stages: int, microbatches: int) -> TrainSetup:
    return TrainSetup(pipeline=PipelineSetup(stages=stages, microbatches=microbatches, schedule=schedule,
                                             micro_batch_size=1, mem_caps_bytes=[2**30] * stages,
                                             chunks=2 if schedule == "ZBV" else 1),
                      data_parallel=DataParallelSetup(dp=2, zero=3))


def test_the_stray_prefetch_follows_two_forwards_before_a_first_backward():
    # 1F1B's warm-up min(P - s, M): stage 0 of 2 runs F0 F1 B0, the last stage F0 B0; GPipe runs all M first
    assert [fsdpunits.stray_prefetch(_setup("1F1B", 2, 2), s) for s in (0, 1)] == [True, False]
    assert [fsdpunits.stray_prefetch(_setup("1F1B", 3, 4), s) for s in (0, 1, 2)] == [True, True, False]
    assert [fsdpunits.stray_prefetch(_setup("GPipe", 2, 2), s) for s in (0, 1)] == [True, True]
    assert not fsdpunits.stray_prefetch(_setup("GPipe", 2, 1), 0)


def test_beside_a_pipeline_only_per_layer_units_reduced_every_microbatch():
    piped = _setup("1F1B", 2, 2)
    assert fsdpunits.beside_pipeline(piped, "per-layer")
    assert not fsdpunits.beside_pipeline(piped, "root-ends")  # a root unit spans the model's ends
    assert not fsdpunits.beside_pipeline(_setup("ZBV", 2, 2), "per-layer")  # chunked, a split backward: not read
    whole = piped.model_copy(update={"data_parallel": DataParallelSetup(dp=2, zero=3, zero_gather="per-iteration")})
    assert not fsdpunits.beside_pipeline(whole, "per-layer")
    assert not fsdpunits.beside_pipeline(_setup("1F1B", 1, 2), "per-layer")


@pytest.fixture(scope="module")
def tied_plans(tmp_path_factory):
    """The tied GPT's profile and a solved 2-stage plan per ZeRO stage (its setup; the split is pinned below)."""
    folder = tmp_path_factory.mktemp("tied")
    profile = folder / "profile.json"
    run_ok("profile", ROOT / "tests" / "fixtures" / "tied_gpt.py", "--micro-batch-size", "2", "--threads", "1",
           "--repeats", "1", "--warmup", "1", "--out", profile)
    plans = {}
    for zero in (2, 3):
        plans[zero] = folder / f"plan{zero}.yaml"
        run_ok("solve", "--profile", profile, "--stages", "2", "--dp", "2", "--zero", zero, "--mem", "1GiB",
               "--microbatches", "2", "--schedule", "1F1B", "--out", plans[zero])
    return profile, plans


def _pinned(plan_path, profile_path, cut: int):
    """The solved plan with its split pinned to the profile's first `cut` layers | the rest, each stage's
    prediction evaluate's for that split (so a timed profile cannot move the split)."""
    from planner import io
    from planner.cost import costmodel
    from planner.schema import StagePlan

    plan, profile = io.load_plan(plan_path), io.load_profile(profile_path)
    names = [layer.name for layer in profile.layers]
    stages = [StagePlan(index=0, layers=names[:cut]), StagePlan(index=1, layers=names[cut:])]
    cost = costmodel.evaluate(stages, profile, plan.setup)
    return plan.model_copy(update={"stages": [stage.model_copy(update={"predicted": c.predicted()})
                                              for stage, c in zip(stages, cost.stages)]})


# What a split's prediction holds over its measured peak on gloo (planner/cost/gloowork.py, §67.ownexact; before, the
# embedding alone and the head alone measured above their predictions, §437-§438). The embedding alone on the first
# stage peaks inside its reduce-scatter in the final callback, the second microbatch's, in 5 runs of 6 (§437, §612):
# the input (10,240 B, the unit's 2,560 parameters x 4), gloo's clone of it (in the gradients' place), the
# reduce-scatter's output (5,120) and the last trained tensor's gradient, the position table's (2,048: §839), now
# charged, where the prediction holds 4,224 B more of the microbatches' kept and transient than the run; on the sixth
# 6,016 B above main's prediction in its own backward with a 10,240 B gloo buffer still held (§611, §840), 3,072 B
# below it. At ZeRO 3 the prediction also charges its pre-backward all-gather output (10,240) as gloo's work may hold
# it through the backward and reduce-scatter of a stage's only unit (§840). The head alone on the last stage: main
# charged 71,192 (ZeRO 3) and measured 71,180-71,320 and, under load, up to 79,640 with its gathered weights' 8,448 B
# still held (§438): charged now, 79,640; at ZeRO 2 charged 79,640 where it measures 75,044-75,288 (§42.dpseg's loaded
# runs measured 8,448 B more: 3,852 B above, left). Measured in /tmp/zero3split (§41.zero3split), /tmp/glooclone
# (§43.glooclone) and this branch's runs.
# A stage of one unit also charges, through its backward, its previous microbatch's reduce-scatter input (the unit's
# gradients: the embedding's 10,240 B, the head's 8,448) that gloo's work may still hold (gloowork.
# earlier_reduce_scatter_bytes, §860): the head alone at ZeRO 2 measured 83,736 B in one fresh-clone CI run of five
# (§67.lead), 4,096 above main's 79,640, and exactly that with its first reduce-scatter's input held to its second
# (scripts/peak_live.py, PEAK_LIVE_HOLD_RS); the usual run now 8,448 B further below its prediction (the head's
# backward, the embedding's backward now 896 B above its reduce-scatter moment: 896 more there). Never under.
EARLIER = {(1, 2): 896, (1, 3): 896, (5, 2): 8_448, (5, 3): 8_448}
OVER_FIRST = {(1, 2): 5_120 + 2_048 - 2_944 + EARLIER[1, 2],  # the usual run's over
              (1, 3): 10_240 + 5_120 + 2_048 - 2_944 + EARLIER[1, 3]}
OVER_LAST = {(5, 3): 8_448 + 128 + EARLIER[5, 3], (5, 2): 4_352 + 252 + EARLIER[5, 2]}
# A first stage whose worst rank, under load, peaks one moment later with an earlier collective's buffer still held
# (the other rank of the stage at the usual bytes; §438): [embed, blocks.0-1] at ZeRO 3 peaks at blocks.0's
# copy-out in the first backward with a third 50,816 B tensor (12,704 parameters x 4, a block's size) beside its
# all-gather output and blocks.1's reduce-scatter input: gloo's clone of that input, its work not yet let go by
# gloo's worker thread (§565, §611: 0.5-11% of synchronous calls on this host): 620,584 B, in the lead's run, this
# branch's test run and a loaded rerun (26,560 B above main's prediction; 1,280 less above this branch's, which
# charges blocks.1's reduce-scatter output and last gradient beside the clone: §839).
LATE_HELD = {(3, 3): 26_560 - 1_280}


@pytest.mark.slow
@pytest.mark.parametrize("zero", [2, 3])
@pytest.mark.parametrize("cut", [1, 3, 5], ids=["embedding-alone", "middle", "head-alone"])
def test_every_kind_of_split_peaks_at_the_prediction(tied_plans, cut, zero):
    """A pinned split, not the solver's (which a timed profile moves): the embedding alone on the first stage, the
    head alone on the last, and [embed, blocks.0-1] | [blocks.2-3, head]; the tied table is split across the
    stages in each (a copy a stage, §399). The untied twin measures the same bytes on every split (§41.zero3split).
    [embed, blocks.0] | ... and ... | [blocks.3, head] are left out: their worst rank's peak moves between runs by
    8,448 B or more (the head's gathered weights, gloo's completion order; §438)."""
    from planner.runtime.launcher import run_plan

    profile, plans = tied_plans
    plan = _pinned(plans[zero], profile, cut)
    report = run_plan(plan, plan_file=plans[zero], steps=1, warmup_steps=1)
    (first, last) = [(s.measured.peak_bytes, s.predicted.peak_bytes) for s in report.stages]
    if (cut, zero) in OVER_FIRST:
        assert 0 <= first[1] - first[0] <= OVER_FIRST[cut, zero], first
    else:  # two forwards before its first backward: ZeRO 0's own 4,096 B over (§402), within 3%
        assert abs(first[0] - first[1]) <= 0.03 * first[0] or first[0] - first[1] == LATE_HELD.get((cut, zero)), first
    if (cut, zero) in OVER_LAST:
        assert 0 <= last[1] - last[0] <= OVER_LAST[cut, zero], last
    elif zero == 2:  # §384's unexplained 4,100 B under
        assert abs(last[0] - last[1]) <= 0.02 * last[1], last
    else:
        assert 0 <= last[0] - last[1] <= UNCHARGED_BYTES, last
