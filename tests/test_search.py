"""The whole-job search against brute force: on a small model over 8 GPUs, solving every
configuration (no bound, no pruning) ranks the same fastest configurations as the search, and
every configuration the memory bound prunes has no plan that fits."""

from __future__ import annotations

import math

import pytest

from planner.models import archs
from planner.profiler.analytic import Shape, analytic_profile
from planner.schema import FileRef
from planner.solve import jobsearch, search
from planner.solve.degrees import Degrees, JobShape, differences, enumerate_degrees, zero_choices

GiB = 2**30
MINI = archs.Arch(name="mini", hidden_size=1024, intermediate_size=2816, num_layers=6, num_heads=8, num_kv_heads=4,
                  vocab_size=32000, tie_word_embeddings=False)
MINI_MOE = archs.Arch(name="mini-moe", hidden_size=512, intermediate_size=1024, num_layers=4, num_heads=8,
                      num_kv_heads=4, vocab_size=8000, tie_word_embeddings=False, num_experts=4,
                      num_experts_per_tok=2, moe_intermediate_size=1024)
H100 = archs.gpu("h100")


def profile_for(arch, seq_len=2048):
    cache = {}

    def build(tp, sp, mbs, ep=1):
        if (tp, sp, mbs, ep) not in cache:
            cache[(tp, sp, mbs, ep)] = analytic_profile(
                arch, Shape(seq_len=seq_len, micro_batch_size=mbs, tp=tp, sp=sp, ep=ep), gpu=H100,
                model=FileRef(file=f"arch:{arch.name}", sha256=arch.sha256()))
        return cache[(tp, sp, mbs, ep)]

    return build


def brute_force(job, options, build) -> tuple[list[float], list[Degrees]]:
    """Every configuration solved with no bound; the iteration times of those that fit, fastest
    first, and the configurations the memory bound prunes (each must have no plan)."""
    times, pruned = [], []
    for degrees in enumerate_degrees(job):
        profile = build(degrees.tp, degrees.sp, degrees.micro_batch_size, degrees.ep)  # experts at its own ep
        setup = jobsearch.job_setup(profile, degrees, options)
        result = search.plan(profile, setup)
        bound = jobsearch.bounds_mod.setup_bounds(profile, setup)
        if bound.memory_excess_bytes > 0:
            pruned.append(degrees)
            assert isinstance(result, search.NoFit) and result.status == "infeasible", degrees
            continue
        if isinstance(result, search.PlanResult):
            assert bound.time_ms <= result.cost.iteration_ms * (1 + 1e-9), (degrees, bound, result.cost.iteration_ms)
            times.append(result.cost.iteration_ms)
    return sorted(times), pruned


@pytest.mark.parametrize("cap_gib", [1.6, 2.0])
def test_search_equals_brute_force(cap_gib):
    job = JobShape(gpus=8, gpus_per_node=8, global_batch=16, seq_len=2048, num_layers=MINI.num_layers + 2,
                   tp_ok=(1, 2, 4, 8))
    options = jobsearch.JobOptions(mem_cap_bytes=int(cap_gib * GiB), gpus_per_node=8)
    build = profile_for(MINI)
    outcome = jobsearch.search_job(job, options, build, top=4)
    times, pruned = brute_force(job, options, build)
    assert len(times) >= 4 and pruned  # the case exercises both bounds
    assert [s.iteration_ms for s in outcome.ranked] == pytest.approx(times[:4], rel=1e-9)
    assert outcome.pruned_memory == len(pruned)
    assert outcome.pruned_time > 0 and outcome.solved < outcome.considered - outcome.pruned_memory
    assert outcome.considered == len(enumerate_degrees(job)) and outcome.complete


def test_search_equals_brute_force_with_experts():
    """A mixture of experts: expert parallelism enumerated over the dp ranks it divides."""
    job = JobShape(gpus=8, gpus_per_node=4, global_batch=8, seq_len=1024, num_layers=MINI_MOE.num_layers + 2,
                   tp_ok=(1, 2, 4), num_experts=4)
    options = jobsearch.JobOptions(mem_cap_bytes=int(1.5 * GiB), gpus_per_node=4)
    build = profile_for(MINI_MOE, seq_len=1024)
    outcome = jobsearch.search_job(job, options, build, top=3)
    times, _ = brute_force(job, options, build)
    assert [s.iteration_ms for s in outcome.ranked] == pytest.approx(times[:3], rel=1e-9)
    assert any(d.ep > 1 for d in enumerate_degrees(job))


def test_enumeration_is_complete_on_a_hand_count():
    """8 GPUs, a node of 8, batch 4, a model that takes tp 1 and 2 and has 3 layers: tp 1 with
    pp 1, 2 (pp 4 and 8 exceed the layers' 3); tp 2 and 2+sp with pp 1, 2; dp = the rest; every
    micro-batch size dividing a replica's batch with microbatches >= pp (1F1B); every ZeRO stage
    over every shard group of dp."""
    job = JobShape(gpus=8, gpus_per_node=8, global_batch=4, seq_len=64, num_layers=3, tp_ok=(1, 2))
    found = enumerate_degrees(job)
    expected = 0
    for tp, variants in ((1, 1), (2, 2)):
        for pp in (1, 2):
            dp = 8 // (tp * pp)
            if 4 % dp:
                continue
            per_replica = 4 // dp
            sizes = [m for m in range(1, per_replica + 1) if per_replica % m == 0 and per_replica // m >= pp]
            expected += variants * len(sizes) * len(zero_choices(dp, 1))
    assert len(found) == expected == len(set(found))
    assert all(d.gpus == 8 and d.dp * d.micro_batch_size * d.microbatches == 4 for d in found)
    assert zero_choices(4, 1) == [(0, None), (1, 2), (1, None), (2, 2), (2, None), (3, 2), (3, None)]


def test_differences_name_what_changes():
    a = Degrees(tp=8, sp=True, pp=1, dp=16, micro_batch_size=2, microbatches=4)
    b = Degrees(tp=4, sp=True, pp=2, dp=16, micro_batch_size=2, microbatches=4, zero=1)
    assert differences(a, b) == ["tp 8→4", "pp 1→2", "zero 0→1"]


def test_deadline_stops_the_search_and_says_so():
    from planner.solve.deadline import Deadline

    job = JobShape(gpus=8, gpus_per_node=8, global_batch=16, seq_len=2048, num_layers=8, tp_ok=(1, 2, 4, 8))
    options = jobsearch.JobOptions(mem_cap_bytes=2 * GiB, gpus_per_node=8)
    outcome = jobsearch.search_job(job, options, profile_for(MINI), deadline=Deadline(1e-9))
    # past the deadline before its first profile: none built, every configuration left unexplored
    assert not outcome.complete and outcome.solved == 0 and outcome.profiles == 0
    assert outcome.unexplored == len(enumerate_degrees(job)) and outcome.considered == 0
    assert math.isfinite(outcome.wall_s)
