"""The interleaved bound with its bubble (planner/solve/chunkbound.py): exact on equal stages by hand, never
above the simulation over every split (brute force) nor evaluate's time of random plans, above the mean-work
bound; and the search it prunes ranks as a brute force over every configuration."""

from __future__ import annotations

import itertools
import random

import pytest
from test_search import MINI, profile_for
from test_search_bounds import random_stages
from test_searchspace import MINI8, _job

from planner.cost import costmodel, pipereduce, schedule_time, schedules
from planner.cost.rules import compute_ms
from planner.schema import TrainSetup
from planner.solve import chunkbound, jobsearch, search
from planner.solve.bounds import kinds, setup_bounds
from planner.solve.degrees import enumerate_degrees

GiB = 2**30


def _order(ranks: int, chunks: int, microbatches: int) -> schedules.Schedule:
    return schedules.pipeline_schedule("interleaved-1F1B", num_ranks=ranks, num_microbatches=microbatches,
                                       num_chunks=chunks)


@pytest.mark.parametrize("microbatches, expected", [(2, 15.0), (4, 27.0)])
def test_equal_stages_by_hand(microbatches, expected):
    """P 2, V 2, four layers of F 1 and B 2 ms: one a stage, so the LP's split is the only one; the interleaved
    schedule takes M V (F + B) + (P - 1)(F + B) = 12 + 3 (M 2), 24 + 3 (M 4), which the simulation agrees with."""
    order = _order(2, 2, microbatches)
    assert chunkbound.least_makespan_ms(order, [1.0], [2.0], [4]) == pytest.approx(expected, abs=1e-6)
    times = [schedule_time.StageTimes(1.0, 1.0, 1.0)] * 4
    assert schedule_time.simulate_time(order, stage_times=times).makespan_ms == pytest.approx(expected)


def _terms(rng: random.Random, stages: int, kinds: int, *, ordered: list[int] | None = None
           ) -> chunkbound.StageTerms:
    """Random terms beside the layers' compute: per stage a fixed B, a half comm, two beside sends; per kind a
    reduction and a step; the window caps of `ordered`."""
    return chunkbound.StageTerms(
        fixed=tuple(rng.uniform(0, 1) for _ in range(stages)), half=tuple(rng.uniform(0, 0.5) for _ in range(stages)),
        sent=tuple((rng.uniform(0, 0.4), rng.uniform(0, 0.4)) for _ in range(stages)),
        reduce=tuple(rng.uniform(0, 1) for _ in range(kinds)), step=tuple(rng.uniform(0, 2) for _ in range(kinds)),
        upper=None if ordered is None else chunkbound.window_caps(ordered, kinds, stages))


def _simulated(order, parts: list[list[int]], kinds_fb, terms: chunkbound.StageTerms) -> float:
    """What evaluate charges a split by its stages' kinds (`parts`), with the terms as splittime.stage_times
    and simulate_time take them: the makespan (beside sends on the receiver, warm-up ones on the sender,
    reductions after each stage's M-th backward) plus the slowest rank's step."""
    times = []
    for s, part in enumerate(parts):
        f = sum(kinds_fb[g][0] for g in part) + terms.half[s]
        b = sum(kinds_fb[g][1] for g in part) + terms.fixed[s] + terms.half[s]
        times.append(schedule_time.StageTimes(f, b / 2, b / 2, reduce_ms=sum(terms.reduce[g] for g in part)))
    steps = [sum(terms.step[g] for s in order.stages_of(r) for g in parts[s]) for r in range(order.num_ranks)]
    return schedule_time.simulate_time(order, stage_times=times, stage_sends=terms.sent).makespan_ms + max(steps)


@pytest.mark.parametrize("ranks, chunks, microbatches", [(2, 2, 2), (2, 2, 4), (3, 2, 6), (2, 3, 4), (4, 2, 8)])
def test_exact_on_the_one_split_with_sends_and_reductions(ranks, chunks, microbatches):
    """As many layers of one kind as stages: one split, so the LP is the simulation's longest path itself, with
    random half comms, beside sends (the warm-up's held on their sender), reductions after each stage's M-th
    backward and steps: equal to the simulation plus the slowest rank's step."""
    rng = random.Random(ranks * 100 + chunks * 10 + microbatches)
    order = _order(ranks, chunks, microbatches)
    stages = ranks * chunks
    terms = _terms(rng, stages, 1)
    least = chunkbound.least_makespan_ms(order, [1.0], [2.0], [stages], terms=terms)
    assert least == pytest.approx(_simulated(order, [[0]] * stages, [(1.0, 2.0)], terms), rel=1e-9)
    assert least > chunkbound.least_makespan_ms(order, [1.0], [2.0], [stages])  # the terms were charged


@pytest.mark.parametrize("ranks, chunks, microbatches", [(2, 2, 2), (2, 2, 4), (3, 2, 3), (2, 3, 4)])
def test_never_above_the_simulation_with_its_terms_over_every_split(ranks, chunks, microbatches):
    """Nine layers of three kinds in a random order, random terms beside: the simulation's makespan plus the
    slowest step of every contiguous split (brute force) is at least the LP's, the window caps included."""
    rng = random.Random(ranks * 1000 + chunks * 10 + microbatches)
    kinds_fb = [(1.0, 2.0), (0.2, 0.3), (2.5, 4.0)]
    layers = [rng.randrange(3) for _ in range(9)]
    order = _order(ranks, chunks, microbatches)
    stages = ranks * chunks
    terms = _terms(rng, stages, 3, ordered=layers)
    least = chunkbound.least_makespan_ms(order, [f for f, _ in kinds_fb], [b for _, b in kinds_fb],
                                         [layers.count(g) for g in range(3)], terms=terms)
    best = float("inf")
    for cuts in itertools.combinations(range(1, len(layers)), stages - 1):
        ends = [0, *cuts, len(layers)]
        best = min(best, _simulated(order, [layers[ends[s]:ends[s + 1]] for s in range(stages)], kinds_fb, terms))
    assert least <= best * (1 + 1e-9), (least, best)


def test_window_caps():
    """Five layers over three stages: stage s holds positions s to s + 2 only."""
    assert chunkbound.window_caps([0, 1, 1, 1, 2], 3, 3) == ((1, 0, 0), (2, 3, 2), (0, 0, 1))


@pytest.mark.parametrize("ranks, chunks, microbatches", [(2, 2, 2), (2, 2, 4), (3, 2, 3), (2, 3, 4)])
def test_never_above_the_simulation_over_every_split(ranks, chunks, microbatches):
    """Nine layers of three kinds in a random order: the simulation's makespan of every contiguous split into
    P V stages (brute force) is at least the LP's; the LP is above the ranks' mean work, M W / P, which a
    tiny-first-stages split made the old bound's."""
    rng = random.Random(ranks * 100 + chunks * 10 + microbatches)
    kinds_fb = [(1.0, 2.0), (0.2, 0.3), (2.5, 4.0)]
    layers = [rng.randrange(3) for _ in range(9)]
    order = _order(ranks, chunks, microbatches)
    stages = ranks * chunks
    least = chunkbound.least_makespan_ms(order, [f for f, _ in kinds_fb], [b for _, b in kinds_fb],
                                         [layers.count(g) for g in range(3)])
    best = float("inf")
    for cuts in itertools.combinations(range(1, len(layers)), stages - 1):
        ends = [0, *cuts, len(layers)]
        times = []
        for s in range(stages):
            part = layers[ends[s]:ends[s + 1]]
            f, b = sum(kinds_fb[g][0] for g in part), sum(kinds_fb[g][1] for g in part)
            times.append(schedule_time.StageTimes(f, b / 2, b / 2))
        best = min(best, schedule_time.simulate_time(order, stage_times=times).makespan_ms)
    work = sum(sum(kinds_fb[g]) for g in layers)
    assert microbatches * work / ranks < least <= best * (1 + 1e-9), (least, best)


@pytest.mark.parametrize("ranks, chunks, microbatches, dp, zero, runtime", [
    (2, 2, 4, 2, 2, "ckplan"),
    (3, 2, 6, 1, 0, "ckplan"),
    (2, 4, 8, 1, 0, "ckplan"),
    (4, 2, 8, 2, 1, "megatron"),  # sends beside the compute, the data-parallel side stream
    (2, 2, 4, 2, 1, "megatron"),
    (4, 2, 4, 1, 0, "torchtitan"),  # torch's time steps (simulate_lockstep)
    (2, 2, 4, 2, 3, "torchtitan"),  # FSDP2's reductions after a stage's last backward, in lockstep
])
def test_never_above_evaluate_on_random_plans(ranks, chunks, microbatches, dp, zero, runtime):
    """Random splits and recompute options of a 6-block model: evaluate's iteration is never under the bound,
    and the bound is at least setup_bounds' on three of the ckplan cases (it holds the bubble) and above the LP
    of the layers' compute alone (the sends, reductions and step are charged)."""
    rng = random.Random(11)
    profile = profile_for(MINI)(2, True, 1)
    whole = dict(zero_gather="per-iteration", runtime_version="9dec370") if zero == 3 else {}
    setup = TrainSetup(stages=ranks, microbatches=microbatches, micro_batch_size=1, schedule="interleaved-1F1B",
                       chunks=chunks, mem_caps_bytes=[80 * GiB] * ranks, precision="bf16-mixed", dp=dp, zero=zero,
                       runtime=runtime, shard_gb_per_s=100.0 if dp > 1 else None,
                       replica_gb_per_s=50.0 if dp > 1 else None, **whole)
    bound = chunkbound.iteration_bound_ms(profile, setup, kinds(profile))
    assert bound > 0
    if zero == 3:  # the case is the reductions'
        assert pipereduce.stage_reductions_ms(costmodel.layer_costs(profile), setup) > 0
    order = costmodel.schedule_of(setup)
    ctx = costmodel.Context(profile, costmodel.stages_view(setup, order))
    compute = [(compute_ms(layer.fwd_ms, setup.time),
                min(costmodel.layer_value("time", layer, o, ctx) for o in range(len(layer.options))), count)
               for layer, count in kinds(profile)]
    alone = chunkbound.least_makespan_ms(order, [f for f, _, _ in compute], [t - f for f, t, _ in compute],
                                         [c for _, _, c in compute],
                                         [costmodel.stage_value("time", s, ctx) for s in range(order.num_stages)])
    assert bound > alone
    # the cheaper form the search asks first (the LP without the step, plus the ranks' mean least step)
    assert alone < chunkbound.iteration_bound_ms(profile, setup, kinds(profile), enough=0.0) <= bound * (1 + 1e-12)
    if runtime == "ckplan":
        assert bound > setup_bounds(profile, setup).time_ms
    for _ in range(30):
        plan = costmodel.ranks_of(random_stages(profile, ranks * chunks, rng, setup), setup)
        assert bound <= costmodel.evaluate(plan, profile, setup).iteration_ms * (1 + 1e-9)


def test_only_interleaved():
    """1F1B's bound is setup_bounds' closed form; ZB's and ZBV's orders split the backward: not this LP's."""
    base = dict(stages=2, microbatches=4, micro_batch_size=1, mem_caps_bytes=[80 * GiB] * 2, precision="bf16-mixed")
    assert chunkbound.holds(TrainSetup(schedule="interleaved-1F1B", chunks=2, **base))
    assert not chunkbound.holds(TrainSetup(schedule="1F1B", chunks=1, **base))
    assert not chunkbound.holds(TrainSetup(schedule="ZBV", chunks=2, **base))


def test_the_search_it_prunes_ranks_as_the_brute_force():
    """8 GPUs a node each, batch 16: the default search (every chunk count) prunes some interleaved
    configurations by their bubble without solving them, and its top 3 are the brute force's over every
    configuration, each solved."""
    job, build = _job(gpus=8, global_batch=16), profile_for(MINI8)
    options = jobsearch.JobOptions(mem_cap_bytes=80 * GiB, gpus_per_node=1)
    outcome = jobsearch.search_job(job, options, build, top=3)
    assert outcome.complete and outcome.pruned_bubble > 0
    every = []
    for degrees in enumerate_degrees(job):
        profile = build(degrees.tp, degrees.sp, degrees.micro_batch_size)
        result = search.plan(profile, jobsearch.job_setup(profile, degrees, options))
        if isinstance(result, search.PlanResult):
            every.append(result.cost.iteration_ms)
    assert [s.iteration_ms for s in outcome.ranked] == pytest.approx(sorted(every)[:3], rel=1e-9)
