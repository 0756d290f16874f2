"""The dynamic programme's parts against brute force, the whole against the MILP, and the
time limit through an injected clock.

(test_milp.py's property test holds both solvers to brute force over every plan.)
"""

import itertools
import random

import pytest

from planner.cost import costmodel
from planner.models.synthetic import heterogeneous, layer, profile_of, uniform_blocks
from planner.schema import TrainSetup
from planner.solve import baselines, dpsegments, dpsolve, search
from planner.solve.deadline import Deadline, Expired

MIB = 2**20
HUGE = 2**50


def beaten(item, items):
    """Some other item is no worse in all three fields and better in one."""
    return any(other[:3] != item[:3] and all(x <= y for x, y in zip(other[:3], item[:3])) for other in items)


def test_front_keeps_exactly_the_items_nothing_beats():
    rng = random.Random(0)
    for _ in range(200):
        items = [(rng.randint(0, 4), rng.randint(0, 4), rng.randint(0, 4), n) for n in range(rng.randint(0, 12))]
        kept = dpsolve.front(list(items))
        assert sorted({item[:3] for item in kept}) == sorted({a[:3] for a in items if not beaten(a, items)})
        assert len(kept) == len({item[:3] for item in kept})  # one item per value


def random_case(seed):
    """Up to 7 layers, some sharing a kind, with every cost-model term switched on at random."""
    rng = random.Random(seed)
    n = rng.randint(1, 7)
    layers = [
        layer(f"l{i}", rng.choice(["A", "B", f"solo{i}"]), fwd_ms=rng.choice([0.5, 1.0, 3.0]),
              act_mib=rng.choice([1, 4, 16]), input_mib=rng.choice([0.5, 2, 4]),
              output_mib=rng.choice([0.5, 2]), param_count=rng.choice([0, 65536]),
              transient_mib=rng.choice([0, 3]), adam_step_ms=rng.choice([0.0, 0.3]),
              recompute_ms=rng.choice([None, 0.25]))
        for i in range(n)
    ]
    profile = profile_of(layers).model_copy(update={
        "batch_input_bytes": rng.choice([0, MIB]), "batch_target_bytes": rng.choice([0, MIB // 2]),
        "loss_bytes": rng.choice([0, MIB // 2]), "loss_ms": rng.choice([0.0, 0.5]),
        "loss_transient_bytes": rng.choice([0, 5 * MIB])})
    stages = rng.randint(1, min(3, n))
    setup = TrainSetup(stages=stages, microbatches=rng.randint(stages, 6), micro_batch_size=1,
                       schedule=rng.choice(["1F1B", "GPipe"]), mem_caps_bytes=[HUGE] * stages,
                       zero=rng.randint(0, 3), dp=rng.choice([1, 4]), **comm_terms(random.Random(-seed).choice))
    return profile, setup, rng


def comm_terms(choice) -> dict:
    """The calibrated time terms (sends, actions, compute scale, core sharing), on or off."""
    return dict(send_latency_ms=choice([0.0, 0.2]), send_gb_per_s=choice([None, 1.0, 0.05]),
                action_overhead_ms=choice([0.0, 0.4]), compute_scale=choice([1.0, 1.5, 0.75]),
                cpu_sharing=choice([1.0, 1.25]))


@pytest.mark.parametrize("seed", range(40))
def test_each_range_gets_its_least_recompute_and_least_peak(seed, monkeypatch):
    """For every (stage, range), the segment is the cheapest checkpoint subset that fits
    (and, for "memory", the smallest peak of all), both found by trying every subset: whether
    numpy scores the sets or Python does (dpsegments.VECTOR_FROM), each held to the one brute
    force (trying every subset costs more than both solves, so it is made once a case)."""
    _check_every_range(*random_case(seed), monkeypatch)


@pytest.mark.parametrize("seed", range(12))
def test_fsdp2s_moments_beside_a_pipeline_are_evaluates_in_every_range(seed, monkeypatch):
    """The same, every case ckplan's runtime at ZeRO 2 or 3 beside a 1F1B or GPipe pipeline (dp 4, HSDP's two
    groups of 2 in a third of them), where a stage's FSDP2 moments are its own (gathered.stage_unit_moments:
    the first and last unit, the shards absent in the first backward, the stray prefetch): the DP grows them
    by class (planner/solve/dpmoments.py), and each range's least recompute and least peak is evaluate's."""
    from planner.solve import dpmoments

    profile, roomy, rng = random_case(1000 + seed)
    while len(profile.layers) < 2:
        profile, roomy, rng = random_case(rng.randint(2000, 10**6))
    stages = rng.randint(2, min(3, len(profile.layers)))
    roomy = TrainSetup(stages=stages, microbatches=rng.choice([stages, stages + 1, 6]), micro_batch_size=1,
                       schedule=rng.choice(["1F1B", "GPipe"]), mem_caps_bytes=[HUGE] * stages, zero=2 + seed % 2,
                       dp=4, shard_group=2 if seed % 3 == 0 else None)
    assert dpmoments.applies(profile, roomy)
    _check_every_range(profile, roomy, rng, monkeypatch)


def test_the_time_limit_is_read_while_a_range_of_fsdp2s_moments_grows(monkeypatch):
    """Beside a pipeline under FSDP2's moments a range's sets may be many (§42.dpseg): a limit that passes while
    the first range grows stops it there, before its next layer, not at the next range's start."""
    from planner.solve import dpmoments

    profile = uniform_blocks(6)
    setup = TrainSetup(stages=2, microbatches=4, micro_batch_size=1, schedule="1F1B", mem_caps_bytes=[HUGE] * 2,
                       zero=3, dp=4)
    assert dpmoments.applies(profile, setup)
    chain = dpsolve.Chain(profile, setup)
    grown, real = [], dpmoments.StageMoments.grow

    def grow(self, states, m, i, *args, **keywords):
        grown.append((i, m))
        return real(self, states, m, i, *args, **keywords)

    monkeypatch.setattr(dpmoments.StageMoments, "grow", grow)
    ticks = iter(range(10**6))
    deadline = Deadline(2.5, clock=lambda: next(ticks))  # made at 0; its checks read 1, 2, then 3: past it
    with pytest.raises(Expired):
        dpsegments.segments(chain, [(1, len(chain))] * 2, max_time_ms=dpsolve.INF, objective="time",
                            deadline=deadline)
    assert grown == [(0, 0)]


def _check_every_range(profile, roomy, rng, monkeypatch):
    layers = costmodel.layer_costs(profile)
    n, P = len(layers), roomy.pipeline.stages
    ranges = [(s, i, j) for s in range(P) for i in range(n) for j in range(i + 1, n + 1)]

    def scored(s, i, j, caps):
        setup = roomy.model_copy(update={"mem_caps_bytes": caps})
        return [costmodel.stage_cost(layers[i:j], list(flags), stage=s, profile=profile, setup=setup)
                for flags in itertools.product([False, True], repeat=j - i)]

    peaks = [c.peak_bytes for s, i, j in ranges for c in scored(s, i, j, [HUGE] * P)]
    caps = [rng.choice(peaks) + costmodel.FIT_MARGIN_BYTES + rng.choice([0, MIB]) for _ in range(P)]
    setup = roomy.model_copy(update={"mem_caps_bytes": caps})
    every = {(s, i, j): scored(s, i, j, caps) for s, i, j in ranges}
    for vector_from in (1, 10**9):  # numpy scores the sets, or Python does
        monkeypatch.setattr(dpsegments, "VECTOR_FROM", vector_from)
        chain = dpsolve.Chain(profile, setup)
        windows = [(1, n)] * P  # every range for every stage
        # every stage in one group of sets, and each stage alone (under FSDP2's moments a group of stages of
        # one kind holds fewer classes: dpmoments.needed)
        groups = [list(range(P))] + ([[s] for s in range(P)] if chain.fsdp is not None else [])
        for objective, i, members in itertools.product(("time", "memory"), range(n), groups):
            found = {(seg.stage, seg.start, seg.end): seg
                     for seg in dpsolve._segments_from(chain, i, members, windows, _closing(chain, P, n),
                                                       max_time_ms=dpsolve.INF, objective=objective, cap_scale=1.0)}
            for s in members:
                for j in range(i + 1, n + 1):
                    where = (vector_from, objective, s, i, j)
                    costs = every[s, i, j]
                    fitting = [c for c in costs if c.fits]
                    seg = found.get((s, i, j))
                    if objective == "time":
                        if not fitting:
                            assert seg is None, where
                            continue
                        assert seg.time_ms == pytest.approx(min(c.busy_ms for c in fitting), rel=1e-12), where
                    else:
                        # the DP drops the sets whose static and kept bytes alone pass the largest cap of the stages
                        # grown together (a lower bound of their peak): the least peak is exact wherever it could
                        # fit that cap; past it, any set (none fits) or none. A checkpointed layer whose rerun saves
                        # none of its input (Cohere's, §858) may keep fewer bytes and still peak higher, so the set
                        # that keeps least is not always the one that peaks least.
                        least = min(c.peak_bytes for c in costs)
                        cap_high = max(chain.stages[t].cap_bytes for t in members) - costmodel.FIT_MARGIN_BYTES
                        if least > cap_high + 1:
                            assert seg is None or seg.peak_bytes >= least, where
                            if seg is None:
                                continue
                        else:
                            assert seg is not None and seg.peak_bytes == least, where
                    flags = [bool(seg.mask >> b & 1) for b in range(j - i)]
                    again = costmodel.stage_cost(layers[i:j], flags, stage=s, profile=profile, setup=setup)
                    assert again.peak_bytes == seg.peak_bytes, where
                    assert again.busy_ms == pytest.approx(seg.time_ms, rel=1e-12) or objective == "memory", where


def _closing(chain, P, n):
    return [{j: chain.closing_bytes(s, j) for j in range(1, n + 1)} for s in range(P)]


def interesting(profile, stages, fraction, schedule="1F1B"):
    roomy = TrainSetup(stages=stages, microbatches=2 * stages, micro_batch_size=1, schedule=schedule,
                       mem_caps_bytes=[HUGE] * stages)
    low = costmodel.evaluate(baselines.full_checkpointing(profile, roomy), profile, roomy).peak_bytes_per_stage
    high = costmodel.evaluate(baselines.no_checkpointing(profile, roomy), profile, roomy).peak_bytes_per_stage
    return roomy.model_copy(update={"mem_caps_bytes": [int(a + fraction * (b - a)) for a, b in zip(low, high)]})


@pytest.mark.parametrize("make, n, stages, fraction, schedule, parallel", [
    (heterogeneous, 14, 3, 0.3, "1F1B", None),
    (heterogeneous, 12, 4, 0.6, "GPipe", None),
    (heterogeneous, 16, 2, 0.15, "1F1B", None),
    (uniform_blocks, 14, 4, 0.4, "1F1B", None),
    (uniform_blocks, 20, 3, 0.05, "GPipe", None),
    # ranks sharing cores: Σ time decides, the first pass recomputes nothing
    (heterogeneous, 14, 4, 0.2, "1F1B", 2),
    (uniform_blocks, 16, 4, 0.5, "1F1B", 1),
])
def test_agrees_with_the_milp_beyond_brute_force(make, n, stages, fraction, schedule, parallel, monkeypatch):
    profile = make(n, seed=n + stages)
    s = interesting(profile, stages, fraction, schedule).model_copy(update={"parallel_stages": parallel})
    dp = search.plan(profile, s)
    monkeypatch.setattr(dpsegments, "VECTOR_FROM", 1)  # numpy scores every range's sets: the same plan
    vectored = search.plan(profile, s)
    assert [st.checkpointed for st in getattr(vectored, "stages", [])] == [st.checkpointed for st in getattr(dp, "stages", [])]
    exact = search.plan(profile, s, solver="milp", mip_gap=0.0, threads=1)
    if isinstance(exact, search.NoFit):
        assert exact.status == "infeasible" and dp.status == "infeasible"
        return
    assert dp.solve.status == "optimal" and dp.solve.gap == 0.0
    assert dp.cost.iteration_ms == pytest.approx(exact.cost.iteration_ms, rel=1e-9)
    assert dp.cost.feasible
    assert dp.cost.iteration_ms == costmodel.evaluate(dp.stages, profile, s).iteration_ms


def test_an_upper_bound_changes_nothing_but_the_work():
    profile = heterogeneous(30, seed=2)
    s = interesting(profile, 5, 0.4)
    free = search.plan(profile, s)
    best = min((b for b in baselines.all_baselines(profile, s) if b.feasible), key=lambda b: b.iteration_ms)
    bounded = search.plan(profile, s, upper_bound_ms=best.iteration_ms, start=best.stages)
    assert bounded.cost.iteration_ms == pytest.approx(free.cost.iteration_ms, rel=1e-12)
    # a bound no plan can meet: nothing is faster, so the answer is "infeasible"
    assert search.plan(profile, s, upper_bound_ms=free.cost.iteration_ms * 0.999).status == "infeasible"


# ---------------------------------------------------------------- the time limit


class Clock:
    """Time moves `tick` seconds each time it is read."""

    def __init__(self, tick: float):
        self.now, self.tick, self.reads = 0.0, tick, 0

    def __call__(self) -> float:
        self.now += self.tick
        self.reads += 1
        return self.now


def case_with_baseline():
    profile = heterogeneous(40, seed=5)
    s = interesting(profile, 6, 0.4)
    best = min((b for b in baselines.all_baselines(profile, s) if b.feasible), key=lambda b: b.iteration_ms)
    return profile, s, best


def test_past_the_deadline_the_start_plan_comes_back_as_feasible_with_an_honest_gap(monkeypatch):
    profile, s, best = case_with_baseline()
    searched = []
    monkeypatch.setattr(dpsolve, "_segments_from", lambda *a, **k: searched.append(a) or [])
    deadline = Deadline(0.5, clock=Clock(tick=1.0))  # expired at its first reading
    result = search.plan(profile, s, upper_bound_ms=best.iteration_ms, start=best.stages, deadline=deadline)
    assert searched == []  # no range was scored after the deadline
    assert result.solve.status == "feasible"
    assert [st.layers for st in result.stages] == [st.layers for st in best.stages]
    assert result.cost.iteration_ms == best.iteration_ms == result.solve.objective
    monkeypatch.undo()
    optimum = search.plan(profile, s).cost.iteration_ms
    assert optimum < best.iteration_ms
    # the gap is measured against a proven lower bound: it covers the real distance
    assert 0 < result.solve.gap < 1
    assert best.iteration_ms * (1 - result.solve.gap) <= optimum


def test_past_the_deadline_without_a_plan_is_a_timeout():
    profile, s, _ = case_with_baseline()
    result = search.plan(profile, s, upper_bound_ms=None, start=None, deadline=Deadline(0.5, clock=Clock(1.0)))
    # no start given: plan() scores the baselines for one, so a plan still comes back
    assert result.solve.status == "feasible"
    nothing_fits = s.model_copy(update={"mem_caps_bytes": [MIB] * s.pipeline.stages})
    result = search.plan(profile, nothing_fits, deadline=Deadline(0.5, clock=Clock(1.0)))
    assert isinstance(result, search.NoFit)
    assert (result.status, result.solver) == ("timeout", "dp")


def test_the_deadline_stops_the_search_part_way():
    """A clock that moves a little per reading: a limit of a few readings stops the search
    inside its loops (before it ends), a generous one lets it finish."""
    profile, s, best = case_with_baseline()
    full = Clock(1.0)
    optimal = search.plan(profile, s, upper_bound_ms=best.iteration_ms, start=best.stages, deadline=Deadline(1e9, full))
    assert optimal.solve.status == "optimal"
    reads = full.reads
    short = Clock(1.0)
    stopped = search.plan(profile, s, upper_bound_ms=best.iteration_ms, start=best.stages,
                        deadline=Deadline(reads // 2, short))
    assert stopped.solve.status == "feasible"
    assert reads // 2 <= short.reads < reads  # it read the clock until the limit, not beyond the next check


def test_min_cap_scale_and_the_milp_honour_the_deadline():
    profile, s, best = case_with_baseline()
    assert search.min_cap_scale(profile, s, deadline=Deadline(0.5, clock=Clock(1.0))) is None
    with pytest.raises(Expired):
        Deadline(0.5, clock=Clock(1.0)).check()
    # the MILP gets what is left of the deadline (nothing): it returns the start it was given
    result = search.plan(profile, s, solver="milp", upper_bound_ms=best.iteration_ms, start=best.stages,
                       deadline=Deadline(0.5, clock=Clock(1.0)))
    assert result.solve.status in ("feasible", "optimal")
    assert result.cost.iteration_ms <= best.iteration_ms


def test_solve_command_spends_one_deadline_on_baselines_and_search(tmp_path):
    """`ckplan solve`'s make_plan: past the deadline the best baseline is the plan, marked
    "feasible" with its gap, and the search does not run."""
    from planner import io
    from planner.solve.planning import make_plan

    profile, s, best = case_with_baseline()
    path = tmp_path / "p.json"
    io.save_profile(profile, path)
    plan = make_plan(profile, path, s, time_limit_s=0.5, deadline=Deadline(0.5, clock=Clock(1.0)))
    assert plan.solver.status == "feasible" and 0 < plan.solver.gap < 1
    assert [st.layers for st in plan.stages] == [st.layers for st in best.stages]
    assert plan.predicted.iteration_ms == best.iteration_ms
    assert make_plan(profile, path, s, time_limit_s=60).solver.status == "optimal"


def test_the_sweep_spends_one_deadline():
    from planner.commands.sweep import sweep_points

    profile, s, _ = case_with_baseline()
    rows, statuses = sweep_points(profile, s, time_limit_s=60)
    assert len(rows) == 8 and statuses == ["optimal"] * 8
    # past the deadline before the smallest cap is known: no points, not made-up ones
    assert sweep_points(profile, s, time_limit_s=60, deadline=Deadline(0.5, clock=Clock(1.0))) == ([], [])


def test_a_plan_found_before_the_deadline_is_kept(monkeypatch):
    """Stopped after a pass found a plan but before the exhaustive pass ended, the search
    returns that plan, faster than the start, still only "feasible"."""
    profile = heterogeneous(40, seed=3)
    s = interesting(profile, 8, 0.4).model_copy(update={"parallel_stages": 2})
    best = min((b for b in baselines.all_baselines(profile, s) if b.feasible), key=lambda b: b.iteration_ms)
    clock, passes = Clock(1.0), []  # (clock readings when a pass's cuts begin, found a plan)
    real_cuts = dpsolve.fastest_cuts

    def cuts(*args, **kwargs):
        began = clock.reads
        result = real_cuts(*args, **kwargs)
        passes.append((began, result is not None))
        return result

    monkeypatch.setattr(dpsolve, "fastest_cuts", cuts)
    optimal = search.plan(profile, s, start=best.stages, deadline=Deadline(1e9, clock))
    first = next(n for n, (_, found) in enumerate(passes) if found)
    assert first < len(passes) - 1  # a plan, then a pass to prove it
    stopped = search.plan(profile, s, start=best.stages, deadline=Deadline(passes[first + 1][0] + 2, Clock(1.0)))
    assert stopped.solve.status == "feasible"
    assert optimal.cost.iteration_ms <= stopped.cost.iteration_ms < best.iteration_ms
    assert costmodel.evaluate(stopped.stages, profile, s).iteration_ms == stopped.cost.iteration_ms
