"""Baselines: the splits and checkpoint rules users would otherwise reach for."""

import itertools
import random

import pytest

from planner.cost import costmodel
from planner.models.synthetic import heterogeneous, layer, profile_of, uniform_blocks
from planner.schema import TrainSetup
from planner.solve import baselines

MIB = 2**20
HUGE = 2**50


def setup(stages, microbatches=None, caps=None, schedule="1F1B"):
    return TrainSetup(
        stages=stages, microbatches=microbatches or 2 * stages, micro_batch_size=1, schedule=schedule,
        mem_caps_bytes=caps or [HUGE] * stages,
    )


def sizes_of(stages):
    return [len(stage.layers) for stage in stages]


def ckpt_counts(stages):
    return [len(stage.checkpointed) for stage in stages]


def stages_with(profile, sizes, counts):
    """Stage plans with `sizes` layers per stage, the first `counts[s]` of stage s checkpointed."""
    bounds = [0, *itertools.accumulate(sizes)][:-1]
    flags = [offset < count for size, count in zip(sizes, counts) for offset in range(size)]
    return costmodel.split_to_stages(bounds, flags, profile)


def peaks(profile, setup_, strategy):
    return costmodel.evaluate(strategy(profile, setup_), profile, setup_).peak_bytes_per_stage


# ---------------------------------------------------------------- even split (ColossalAI)


@pytest.mark.parametrize(
    "layers, stages, expected",
    [
        # ColossalAI distribute_layers: quotient everywhere, the remainder to the middle,
        # starting at P // 2 - remainder // 2
        (10, 4, [2, 3, 3, 2]),  # r=2, start 2 - 1 = 1
        (9, 4, [2, 2, 3, 2]),  # r=1, start 2 - 0 = 2
        (11, 4, [2, 3, 3, 3]),  # r=3, start 2 - 1 = 1
        (8, 4, [2, 2, 2, 2]),  # r=0
        (7, 3, [2, 3, 2]),  # r=1, start 1
        (8, 3, [3, 3, 2]),  # r=2, start 1 - 1 = 0
        (13, 6, [2, 2, 2, 3, 2, 2]),  # r=1, start 3
        (17, 6, [2, 3, 3, 3, 3, 3]),  # r=5, start 3 - 2 = 1
        (34, 8, [4, 4, 4, 5, 5, 4, 4, 4]),  # r=2, start 4 - 1 = 3
        (5, 5, [1, 1, 1, 1, 1]),
        (4, 1, [4]),
        (3, 2, [1, 2]),  # r=1, start 1
    ],
)
def test_even_split_puts_the_remainder_in_the_middle(layers, stages, expected):
    assert baselines.even_split(layers, stages) == expected


def test_even_split_always_covers_the_layers():
    for layers in range(1, 40):
        for stages in range(1, layers + 1):
            sizes = baselines.even_split(layers, stages)
            assert sum(sizes) == layers and len(sizes) == stages
            assert max(sizes) - min(sizes) <= 1


# ---------------------------------------------------------------- balanced split


def brute_min_max(times, stages):
    """min over every contiguous split into `stages` non-empty parts of the slowest part."""
    n, best = len(times), float("inf")
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = (0, *cuts, n)
        best = min(best, max(sum(times[a:b]) for a, b in itertools.pairwise(bounds)))
    return best


@pytest.mark.parametrize("seed", range(60))
def test_balanced_split_is_the_exact_min_max_partition(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 9)
    stages = rng.randint(1, n)
    times = [rng.choice([0.5, 1.0, 2.0, 3.0, 7.5]) if seed % 2 else rng.uniform(0.1, 10) for _ in range(n)]
    sizes = baselines.balanced_split(times, stages)
    assert len(sizes) == stages and sum(sizes) == n and min(sizes) >= 1
    bounds = [0, *itertools.accumulate(sizes)]
    slowest = max(sum(times[a:b]) for a, b in itertools.pairwise(bounds))
    assert slowest == pytest.approx(brute_min_max(times, stages), rel=1e-12)


def test_balanced_split_by_hand():
    # 1 1 1 1 | 4 on two stages: 4 and 4; an even split would give 2 and 6
    assert baselines.balanced_split([1, 1, 1, 1, 4], 2) == [4, 1]
    # one heavy layer in the middle gets a stage to itself
    assert baselines.balanced_split([1, 1, 9, 1, 1], 3) == [2, 1, 2]


# ---------------------------------------------------------------- no / full checkpointing


def test_no_and_full_checkpointing_flags():
    p = heterogeneous(10, seed=3)
    s = setup(4)
    none, full = baselines.no_checkpointing(p, s), baselines.full_checkpointing(p, s)
    assert sizes_of(none) == sizes_of(full) == [2, 3, 3, 2]
    assert all(stage.checkpointed == [] for stage in none)
    assert all(stage.checkpointed == stage.layers for stage in full)
    assert [stage.index for stage in full] == [0, 1, 2, 3]
    assert [name for stage in none for name in stage.layers] == [lay.name for lay in p.layers]


# ---------------------------------------------------------------- uniform rules: smallest that fits


def blocks_profile():
    """Eight identical blocks, 1 MiB static each (65536 params x 16 B), act 10 MiB, input 2 MiB."""
    return profile_of([
        layer(f"b{i}", "B", fwd_ms=1, act_mib=10, input_mib=2, param_count=65536) for i in range(8)
    ])


def colossal_flags(layers, sizes, step):
    """ColossalAI: int(ratio * layers_in_stage) first layers per stage, ratio = step / L."""
    return [int(step / layers * size) for size in sizes]


def test_colossalai_ratio_by_hand():
    # 8 blocks on 2 stages (4 + 4), M = 4, 1F1B: stage 0 holds k=2, stage 1 k=1.
    # The rules checkpoint a stage's FIRST layers, so a following unchecked block (act 10)
    # covers the recompute extra (act - input = 8) unless the whole stage is checkpointed.
    # Stage 0 with c checkpointed (out of 4):
    #   static 4; kept = 10 (4 - c) + 2 c - input_in_act(b0) 2 (a slice of the batch, which
    #   stage 0 holds in buffers: M * batch_input = 0 here) + output 2 = 40 - 8 c;
    #   buffers = M * output = 8, + 2 the warm-up send's held stage output (w = 2, M - w = 2 >= w - 1 = 1:
    #   §45.boundgrad3) = 10; recompute = 8 [c = 4]
    #   peak = 4 + 2 (40 - 8 c) + 10 + 8 [c = 4] = 94 - 16 c + 8 [c = 4]
    #   c = 0: 94, 1: 78, 2: 62, 3: 46, 4: 38 MiB
    # Stage 1 (last, k=1): kept = 10 (4 - d) + 2 d - 2 + 2 = 40 - 8 d;
    #   buffers = (M + 1) * input = 10 (recv buffers + the input gradient being sent), + the loss values:
    #   M - k + 2 = 5 of 4 B = 20 B (§45.boundgrad3)
    #   peak = 4 + 40 - 8 d + 10 + 8 [d = 4] (+ 20 B): d = 0: 54, 1: 46, 2: 38, 3: 30, 4: 30 MiB
    # caps 56 MiB on both (6 MiB under c = 2's 62, so c = 2 fails by more than the fit margin):
    # ratio = step / 8, c = d = int(step / 8 * 4) = step // 2;
    # c = 3 is the first that fits stage 0 (46) -> step 6 (ratio 0.75); step 5 gives c = 2 (62).
    p = blocks_profile()
    s = setup(2, 4, caps=[56 * MIB, 56 * MIB])
    stages = baselines.colossalai_ratio(p, s)
    assert ckpt_counts(stages) == [3, 3]
    assert [st.checkpointed for st in stages] == [["b0", "b1", "b2"], ["b4", "b5", "b6"]]
    assert peaks(p, s, baselines.colossalai_ratio) == [46 * MIB, 30 * MIB + 5 * 4]
    # Megatron block: the smallest N with min(N, 4) per stage: N = 3 as well here
    assert ckpt_counts(baselines.megatron_block(p, s)) == [3, 3]
    # a cap of 100 MiB: nothing needs checkpointing (92, 54)
    roomy = setup(2, 4, caps=[100 * MIB, 100 * MIB])
    assert ckpt_counts(baselines.colossalai_ratio(p, roomy)) == [0, 0]
    assert ckpt_counts(baselines.megatron_block(p, roomy)) == [0, 0]
    # a cap no rule meets (c = d = 4 needs 36 and 30 + the margin): the last rule
    # (everything checkpointed), reported infeasible
    tight = setup(2, 4, caps=[30 * MIB, 30 * MIB])
    for strategy in (baselines.colossalai_ratio, baselines.megatron_block):
        stages = strategy(p, tight)
        assert ckpt_counts(stages) == [4, 4]
        assert not costmodel.evaluate(stages, p, tight).feasible


def random_case(seed):
    rng = random.Random(seed)
    n_layers = rng.randint(4, 14)
    stages = rng.randint(1, min(4, n_layers))
    p = uniform_blocks(n_layers - 2, seed=seed) if seed % 2 else heterogeneous(n_layers, seed=seed)
    micro = rng.choice([1, 2, stages, 2 * stages, 8])
    schedule = rng.choice(["1F1B", "GPipe"])
    roomy = setup(stages, micro, schedule=schedule)
    lo = peaks(p, roomy, baselines.full_checkpointing)
    hi = peaks(p, roomy, baselines.no_checkpointing)
    frac = rng.uniform(-0.1, 1.1)
    caps = [max(1, int(a + frac * (b - a))) for a, b in zip(lo, hi)]
    return p, setup(stages, micro, caps=caps, schedule=schedule)


@pytest.mark.parametrize("seed", range(40))
def test_colossalai_ratio_is_the_smallest_ratio_that_fits(seed):
    p, s = random_case(seed)
    stages = baselines.colossalai_ratio(p, s)
    sizes = baselines.even_split(len(p.layers), s.pipeline.stages)
    assert sizes_of(stages) == sizes
    # every stage checkpoints its FIRST layers
    assert all(st.checkpointed == st.layers[: len(st.checkpointed)] for st in stages)
    steps = [step for step in range(len(p.layers) + 1)
             if colossal_flags(len(p.layers), sizes, step) == ckpt_counts(stages)]
    assert steps, "the counts match no ColossalAI ratio"
    step = steps[0]
    fits = costmodel.evaluate(stages, p, s).feasible
    if fits:
        if step > 0:
            smaller = stages_with(p, sizes, colossal_flags(len(p.layers), sizes, step - 1))
            assert not costmodel.evaluate(smaller, p, s).feasible
    else:  # nothing fits: every ratio fails and the full ratio is returned
        assert step == len(p.layers)
        for k in range(len(p.layers) + 1):
            tried = stages_with(p, sizes, colossal_flags(len(p.layers), sizes, k))
            assert not costmodel.evaluate(tried, p, s).feasible


@pytest.mark.parametrize("seed", range(40))
def test_megatron_block_is_the_smallest_n_that_fits(seed):
    p, s = random_case(seed)
    stages = baselines.megatron_block(p, s)
    sizes = baselines.even_split(len(p.layers), s.pipeline.stages)
    assert sizes_of(stages) == sizes
    assert all(st.checkpointed == st.layers[: len(st.checkpointed)] for st in stages)
    counts = ckpt_counts(stages)
    n = max(counts)
    assert counts == [min(n, size) for size in sizes]
    if costmodel.evaluate(stages, p, s).feasible:
        if n > 0:
            smaller = stages_with(p, sizes, [min(n - 1, size) for size in sizes])
            assert not costmodel.evaluate(smaller, p, s).feasible
    else:
        assert counts == sizes


@pytest.mark.parametrize("seed", range(20))
def test_balanced_ratio_uses_the_compute_balanced_split(seed):
    p, s = random_case(seed)
    stages = baselines.balanced_ratio(p, s)
    times = [c.fwd_ms + c.bwd_ms for c in costmodel.layer_costs(p)]
    assert sizes_of(stages) == baselines.balanced_split(times, s.pipeline.stages)


# ---------------------------------------------------------------- all baselines


@pytest.mark.parametrize("seed", range(20))
def test_all_baselines_are_runnable_and_scored_by_evaluate(seed):
    p, s = random_case(seed)
    results = baselines.all_baselines(p, s)
    assert [r.name for r in results] == list(baselines.BASELINES)
    names = [lay.name for lay in p.layers]
    for result in results:
        stages = result.stages
        assert [st.index for st in stages] == list(range(s.pipeline.stages))
        assert [name for st in stages for name in st.layers] == names  # contiguous, complete
        assert all(set(st.checkpointed) <= set(st.layers) for st in stages)
        cost = costmodel.evaluate(stages, p, s)
        assert result.peak_bytes_per_stage == cost.peak_bytes_per_stage
        assert [st.predicted.peak_bytes for st in stages] == cost.peak_bytes_per_stage
        assert [st.predicted.time_ms for st in stages] == [c.time_ms for c in cost.stages]
        assert result.iteration_ms == cost.iteration_ms
        assert result.feasible == cost.feasible
        # the same plan, scored from its stage strategy directly
        direct = costmodel.evaluate(baselines.BASELINES[result.name](p, s), p, s)
        assert direct.peak_bytes_per_stage == result.peak_bytes_per_stage


def test_no_checkpointing_is_fastest_and_full_is_smallest_of_the_even_splits():
    p = uniform_blocks(14, seed=1)
    s = setup(4)
    by_name = {r.name: r for r in baselines.all_baselines(p, s)}
    assert all(r.feasible for r in by_name.values())  # caps are huge
    # with room to spare, the ratio rules checkpoint nothing: same plan as no-ckpt
    assert by_name["colossalai-ratio"].iteration_ms == by_name["no-ckpt"].iteration_ms
    assert by_name["megatron-block"].iteration_ms == by_name["no-ckpt"].iteration_ms
    assert by_name["full-ckpt"].iteration_ms > by_name["no-ckpt"].iteration_ms
    assert all(f <= n for f, n in zip(by_name["full-ckpt"].peak_bytes_per_stage,
                                      by_name["no-ckpt"].peak_bytes_per_stage))


def test_baselines_choosing_one_plan_are_scored_once(monkeypatch):
    # eight identical blocks that fit only fully checkpointed: full-ckpt, colossalai-ratio and megatron-block all
    # choose every layer checkpointed on the even split, one plan, so evaluate (each stage's replay) runs for it once
    p = blocks_profile()
    tight = setup(2, caps=[int(4 * MIB + 4 * 2 * MIB + 10 * MIB + 64 * MIB)] * 2)
    expected = baselines.all_baselines(p, tight)
    plans = {name: tuple(st.model_dump_json(exclude={"predicted"}) for st in r.stages)
             for name, r in zip(baselines.BASELINES, expected)}
    calls = []
    real = costmodel.evaluate
    monkeypatch.setattr(costmodel, "evaluate", lambda stages, profile, setup: calls.append(1) or real(stages, profile,
                                                                                                      setup))
    again = baselines.all_baselines(p, tight)
    assert len(calls) == len(set(plans.values())) < len(baselines.BASELINES)
    assert again == expected  # each baseline's figures as scored alone
