"""The MILP against brute force, hand-worked optima and the baselines.

Brute force enumerates every contiguous split into P non-empty stages and every
checkpoint subset, scored by costmodel.evaluate(); the MILP must find the same
optimum. The solver gets mip_gap=0 here so "equal" means equal.
"""

import functools
import itertools
import math

import pulp
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from planner.cost import costmodel, dataparallel
from planner.models.synthetic import heterogeneous, layer, profile_of, uniform_blocks
from planner.schema import TrainSetup
from planner.solve import baselines, milp, search

MIB = 2**20
GIB = 2**30
HUGE = 2**50
EXACT = dict(mip_gap=0.0, threads=1)
# A plan fits when every peak stays costmodel.FIT_MARGIN_BYTES below its cap (the MILP's
# constraint, with HiGHS's feasibility tolerance of ~1e-6 GiB on top); generated cases keep
# every plan's peak clear of that edge, where solver tolerance and integer bytes could differ.
MARGIN = costmodel.FIT_MARGIN_BYTES
NEAR_EDGE = 8192


def fits(peaks, caps):
    """costmodel.StageCost.fits for every stage."""
    return all(p + MARGIN <= c for p, c in zip(peaks, caps))


def setup(stages, microbatches, caps, schedule="1F1B"):
    return TrainSetup(stages=stages, microbatches=microbatches, micro_batch_size=1,
                      schedule=schedule, mem_caps_bytes=list(caps))


def all_plans(profile, setup_):
    """(stages, peaks, iteration_ms) for every contiguous split and checkpoint subset,
    scored by costmodel.evaluate() (caps play no part in peaks and times)."""
    n, P = len(profile.layers), setup_.pipeline.stages
    for cuts in itertools.combinations(range(1, n), P - 1):
        bounds = [0, *cuts]
        for mask in range(2**n):
            flags = [bool(mask >> i & 1) for i in range(n)]
            stages = costmodel.split_to_stages(bounds, flags, profile)
            cost = costmodel.evaluate(stages, profile, setup_)
            yield stages, cost.peak_bytes_per_stage, cost.iteration_ms


def brute_optimum(profile, setup_):
    best = None
    for stages, peaks, ms in all_plans(profile, setup_):
        if fits(peaks, setup_.pipeline.mem_caps_bytes) and (best is None or ms < best[1]):
            best = (stages, ms)
    if best is not None:  # the same verdict from evaluate() itself
        assert costmodel.evaluate(best[0], profile, setup_).feasible
    return best


def fits_host(profile, setup_):
    """Whether a plan's every rank keeps within its share of the host memory (always, with no
    host cap); no plan may sit at the edge, where solver tolerance and integer bytes differ."""
    cap = costmodel.host_cap_bytes(setup_.data_parallel, pipeline=setup_.pipeline)
    if cap is None:
        return lambda stages: True

    def check(stages):
        hosts = [c.host_bytes for c in costmodel.evaluate(stages, profile, setup_).stages]
        assume(not any(abs(cap - MARGIN - h) < NEAR_EDGE for h in hosts))
        return all(h + MARGIN <= cap for h in hosts)

    return check


def assert_meets_caps(result, profile, setup_):
    cost = costmodel.evaluate(result.stages, profile, setup_)
    assert cost.feasible
    assert all(p < c for p, c in zip(cost.peak_bytes_per_stage, setup_.pipeline.mem_caps_bytes))
    assert fits(cost.peak_bytes_per_stage, setup_.pipeline.mem_caps_bytes)
    assert cost.iteration_ms == pytest.approx(result.cost.iteration_ms, rel=1e-12)
    assert [st_.predicted.peak_bytes for st_ in result.stages] == cost.peak_bytes_per_stage
    return cost


def best_feasible_baseline(profile, setup_):
    feasible = [b for b in baselines.all_baselines(profile, setup_) if b.feasible]
    return min(feasible, key=lambda b: b.iteration_ms) if feasible else None


# ---------------------------------------------------------------- brute force, generated


def params(draw) -> dict:
    """A layer's parameters and its largest tensor (unknown, all of them, or a quarter): with
    ZeRO 1 a tensor larger than 1/K of its stage is held whole by one rank."""
    count = draw(st.sampled_from([0, 65536, 262144]))
    return {"param_count": count, "largest_param_count": draw(st.sampled_from([None, count, count // 4]))}


@st.composite
def tiny_cases(draw, max_layers=7):
    n = draw(st.integers(1, max_layers))
    stages = draw(st.integers(1, min(3, n)))
    kinds = draw(st.lists(st.sampled_from("AAB C"), min_size=n, max_size=n))  # runs of one kind
    layers = [
        layer(
            f"l{i}", kind if kind != " " else f"solo{i}",
            fwd_ms=draw(st.sampled_from([0.5, 1.0, 2.0, 3.0])),
            bwd_ratio=draw(st.sampled_from([1.0, 2.0])),
            act_mib=draw(st.sampled_from([1, 2, 4, 8, 16])),
            input_mib=draw(st.sampled_from([0.5, 1, 2, 4])),  # sometimes >= act: checkpointing useless
            output_mib=draw(st.sampled_from([0.5, 1, 2, 4])),
            **params(draw),
            transient_mib=draw(st.sampled_from([0, 1, 3])),
            adam_step_ms=draw(st.sampled_from([0.0, 0.0, 0.3, 4.0])),
            recompute_ms=draw(st.sampled_from([None, None, 0.25, 1.5])),
        )
        for i, kind in enumerate(kinds)
    ]
    profile = profile_of(layers).model_copy(update={
        "batch_input_bytes": draw(st.sampled_from([0, MIB])),
        "batch_target_bytes": draw(st.sampled_from([0, MIB // 2])),
        "loss_bytes": draw(st.sampled_from([0, MIB // 2])),
        "loss_ms": draw(st.sampled_from([0.0, 0.5])),
        "loss_transient_bytes": draw(st.sampled_from([0, 2 * MIB, 5 * MIB])),
    })
    micro = draw(st.integers(1, 6))
    schedule = draw(st.sampled_from(["1F1B", "GPipe"]))
    # where each cap lies between its stage's smallest and largest need: a grid that avoids
    # the ends (where a cap would equal some plan's peak exactly)
    fractions = [(step + 0.5) / 16 for step in draw(st.lists(st.integers(0, 15), min_size=stages, max_size=stages))]
    roomy = setup(stages, micro, [HUGE] * stages, schedule)
    # sometimes fewer stages compute at once than there are (ranks sharing cores)
    # and the static side: optimizer, precision, ZeRO over data parallelism, offload
    roomy = roomy.model_copy(update={
        "parallel_stages": draw(st.sampled_from([None, None, 1, 2])),
        "optimizer": draw(st.sampled_from(["adam", "sgd"])),
        "precision": draw(st.sampled_from(["fp32", "bf16-mixed"])),
        "dp": draw(st.sampled_from([1, 4])),
        "zero": draw(st.integers(0, 3)),
        "offload": draw(st.booleans()),
        # the calibrated time terms: sends at each boundary, per-action overhead, compute scale
        "send_latency_ms": draw(st.sampled_from([0.0, 0.0, 0.2])),
        "send_gb_per_s": draw(st.sampled_from([None, 1.0, 0.05])),
        "action_overhead_ms": draw(st.sampled_from([0.0, 0.4])),
        "compute_scale": draw(st.sampled_from([1.0, 1.0, 1.5])),
        "cpu_sharing": draw(st.sampled_from([1.0, 1.0, 1.25])),
    })
    # host memory under offload, a fraction of what the whole model's offloaded optimizer takes
    host_fraction = draw(st.sampled_from([None, None, 0.55, 0.8, 1.1]))
    if roomy.data_parallel.offload and host_fraction is not None:
        whole = sum(layer.param_count for layer in profile.layers) * dataparallel.host_bytes_per_param(roomy)
        roomy = roomy.model_copy(update={"host_mem_bytes": max(1, int(host_fraction * whole))})
    return profile, roomy, fractions


@settings(max_examples=70, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_cases())
def test_milp_equals_brute_force(case):
    """Both solvers: the dynamic programme (plan's default) and the MILP, against one brute force
    (enumerating every plan is most of this test's time: done once for both)."""
    check_equals_brute_force(case, ("dp", "milp"))


def check_equals_brute_force(case, methods):
    profile, roomy, fractions = case
    plans = list(all_plans(profile, roomy))
    P = roomy.pipeline.stages
    # caps: per stage, between the smallest all-checkpointed need and the largest
    # no-checkpoint need over every split
    full = [peaks for stages, peaks, _ in plans if all(s.checkpointed == s.layers for s in stages)]
    none = [peaks for stages, peaks, _ in plans if all(not s.checkpointed for s in stages)]
    lo = [min(p[s] for p in full) for s in range(P)]
    hi = [max(p[s] for p in none) for s in range(P)]
    caps = [int(min(a, b) + f * abs(b - a)) for a, b, f in zip(lo, hi, fractions)]
    assume(all(c > 0 for c in caps))
    assume(not any(abs(c - MARGIN - p) < NEAR_EDGE for _, peaks, _ in plans for p, c in zip(peaks, caps)))
    s = roomy.model_copy(update={"mem_caps_bytes": caps})
    host_ok = fits_host(profile, s)
    feasible = [(ms, stages) for stages, peaks, ms in plans if fits(peaks, caps) and host_ok(stages)]
    event("feasible" if feasible else "infeasible")
    if costmodel.host_cap_bytes(s.data_parallel, pipeline=s.pipeline) is not None:
        device_only = any(fits(p, caps) for _, p, _ in plans)
        event("host capped: " + ("a plan fits" if feasible else "the host rules out what the devices allow"
                                 if device_only else "the devices rule every plan out"))
    if not feasible:
        assert not any(b.feasible for b in baselines.all_baselines(profile, s))
        for method in methods:
            result = search.plan(profile, s, solver=method, **EXACT)
            assert isinstance(result, search.NoFit) and result.status == "infeasible", method
        return
    optimum, best_stages = min(feasible, key=lambda item: item[0])
    assert costmodel.evaluate(best_stages, profile, s).feasible  # brute force's verdict is evaluate()'s
    best = best_feasible_baseline(profile, s)
    for method in methods:
        check_solver_finds_the_optimum(profile, s, method, optimum, best)


def check_solver_finds_the_optimum(profile, s, method, optimum, best):
    n = len(profile.layers)
    result = search.plan(profile, s, solver=method, **EXACT)
    assert isinstance(result, search.PlanResult), result
    assert result.solve.status == "optimal"
    assert result.cost.iteration_ms == pytest.approx(optimum, rel=1e-6)
    assert [name for stage in result.stages for name in stage.layers] == [f"l{i}" for i in range(n)]
    assert_meets_caps(result, profile, s)
    # ckplan is never slower than a feasible baseline; the best one as an upper bound changes nothing
    if best is not None:
        assert result.cost.iteration_ms <= best.iteration_ms * (1 + 1e-9)
        bounded = search.plan(profile, s, upper_bound_ms=best.iteration_ms, solver=method, **EXACT)
        assert bounded.cost.iteration_ms == pytest.approx(optimum, rel=1e-6)
        started = search.plan(profile, s, upper_bound_ms=best.iteration_ms, start=best.stages, solver=method, **EXACT)
        assert started.cost.iteration_ms == pytest.approx(optimum, rel=1e-6)


# ---------------------------------------------------------------- never slower than a baseline


def interesting_caps(profile, stages, microbatches, fraction=0.4, schedule="1F1B"):
    """Per stage, `fraction` of the way from the full-checkpointing to the no-checkpointing need."""
    roomy = setup(stages, microbatches, [HUGE] * stages, schedule)
    lo = costmodel.evaluate(baselines.full_checkpointing(profile, roomy), profile, roomy).peak_bytes_per_stage
    hi = costmodel.evaluate(baselines.no_checkpointing(profile, roomy), profile, roomy).peak_bytes_per_stage
    return setup(stages, microbatches, [int(a + fraction * (b - a)) for a, b in zip(lo, hi)], schedule)


@pytest.mark.parametrize("make, n", [(uniform_blocks, 8), (uniform_blocks, 14), (heterogeneous, 10)])
@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.8])
def test_never_slower_than_a_feasible_baseline(make, n, stages, fraction):
    profile = make(n, seed=n + stages)
    s = interesting_caps(profile, stages, 2 * stages, fraction)
    result = search.plan(profile, s, **EXACT)
    feasible = [b for b in baselines.all_baselines(profile, s) if b.feasible]
    if isinstance(result, search.NoFit):
        assert result.status == "infeasible" and not feasible
        return
    assert_meets_caps(result, profile, s)
    for b in feasible:
        assert result.cost.iteration_ms <= b.iteration_ms * (1 + 1e-9), b.name
    if feasible:
        best = min(b.iteration_ms for b in feasible)
        bounded = search.plan(profile, s, upper_bound_ms=best, **EXACT)
        assert bounded.cost.iteration_ms == pytest.approx(result.cost.iteration_ms, rel=1e-9)


# ---------------------------------------------------------------- hand-worked optima


LOSS_B = 20 / MIB  # the last stage's four loss values and the seed (lossvalues.py), 20 B in MiB


def four_blocks():
    """Four identical blocks (one run): fwd 1 ms, bwd 2 ms, act 10 MiB, input = output = 2 MiB,
    1 MiB static (65536 params x 16 B, adam fp32), no transient.

    P = 2, M = 4. Stage 0 holds a layers, c of them checkpointed; stage 1 holds b = 4 - a, d.
    Recompute extra (act - input = 8, net of what later layers of the stage keep): 0 when
    an unchecked block (act 10 >= 8) follows the last checkpointed one, which the best
    placement (checkpoint the first ones) achieves unless all are checkpointed: 8 [c = a].
    1F1B: k0 = 2, k1 = 1. The first layer's saved input (input_in_act = min(2, 10) = 2) is
    not kept twice on either stage: a recv buffer on stage 1, on stage 0 a slice of the
    input batch that stage 0 holds in buffers (M * batch_input = 0 here).
      peak0 = a (static) + 2 (10 (a - c) + 2 c - 2 (input is a batch slice) + 2 output)
              + 4 * 2 (grad recv) + 2 (microbatch 0's output, kept past its backward by the
              warm-up send: w = 2, M - w >= w - 1; planner/cost/warmupsend.py) + 8 [c = a]
            = 21 a - 16 c + 10 + 8 [c = a]                                           MiB
      peak1 = b + 1 (10 (b - d) + 2 d - 2 (input in recv buffer) + 2 output)
              + (4 + 1) * 2 (recv buffers + the input gradient being sent) + 8 [d = b]
              + 20 B (the four loss values and the backward's seed: planner/cost/lossvalues.py)
            = 11 b - 8 d + 10 + 8 [d = b]                                    MiB + 20 B
      time0 = 3 a + c, time1 = 3 b + d;  T = time0 + time1 + 3 max(time0, time1)
            = 12 + c + d + 3 max(3 a + c, 3 b + d)                                    ms
    GPipe: k0 = k1 = 4, and no input gradient held at its first backward (4 recv buffers: 8, not 10),
    every output in flight there (no warm-up send held), microbatch 0's loss value and the seed:
      peak0 = 41 a - 32 c + 8 + 8 [c = a],  peak1 = 41 b - 32 d + 8 + 8 [d = b]  MiB (+ 8 B)
    Tables (MiB), 1F1B:
      peak0  a = 1: c = 0..1: 31, 23;  a = 2: c = 0..2: 52, 36, 28;  a = 3: c = 0..3: 73, 57, 41, 33
      peak1 (+ 20 B)  b = 1: d = 0..1: 21, 21;  b = 2: d = 0..2: 32, 24, 24;  b = 3: d = 0..3: 43, 35, 27, 27
    """
    return profile_of([layer(f"b{i}", "Block", fwd_ms=1, act_mib=10, input_mib=2, param_count=65536)
                       for i in range(4)])


def shape(result):
    return [len(s.layers) for s in result.stages], [len(s.checkpointed) for s in result.stages]


@pytest.mark.parametrize(
    "caps_mib, schedule, expected_ms, expected_shape, expected_peaks_mib",
    [
        # slack: 2 | 2, nothing checkpointed: T = 12 + 3 * 6 = 30; peaks 42 + 8 + 2 = 52, 22 + 10 = 32 (+ 20 B)
        ((1024, 1024), "1F1B", 30, ([2, 2], [0, 0]), [52, 32 + LOSS_B]),
        # binding on stage 0 (52 > 46; the cap sits 6 MiB under the slack plan, clear of the
        # fit margin): 2 | 2 with the first block of stage 0 checkpointed:
        #   peak0 = 42 - 16 + 10 = 36; T = 12 + 1 + 3 * 7 = 34 (c = 0, d = 1 is 34 ms too but
        #   needs peak0 52)
        #   (1 | 3 without checkpointing: peak0 31, T = 12 + 3 * 9 = 39; 3 | 1 needs c = 2:
        #   63 - 32 + 10 = 41, 47 ms)
        ((46, 1024), "1F1B", 34, ([2, 2], [1, 0]), [36, 32 + LOSS_B]),
        # heterogeneous caps, tight stage 1 (25.5): 2 | 2 with stage 1's first block checkpointed:
        #   peak1 = 22 - 8 + 10 = 24 (d = 0: 32); T = 12 + 1 + 3 * 7 = 34
        #   (3 | 1: peak1 = 21 fits, T = 12 + 3 * 9 = 39; 1 | 3 needs peak1 <= 25.5: none, 27 at best)
        ((1024, 25.5), "1F1B", 34, ([2, 2], [0, 1]), [52, 24 + LOSS_B]),
        # the same caps the other way round: stage 0 fits only 1 block, checkpointed
        #   (21 - 16 + 10 + 8 = 23; unchecked 31; 2 | 2 needs c = 1: 36 or c = 2: 28, 3 | 1 at
        #   least 33 -- all over 25.5):
        #   1 | 3, T = 12 + 1 + 3 * 9 = 40; peak1 = 33 + 10 = 43 (+ 20 B)
        ((25.5, 1024), "1F1B", 40, ([1, 3], [1, 0]), [23, 43 + LOSS_B]),
        # 64 MiB each: 1F1B fits the slack plan (52, 32): 30 ms
        ((64, 64), "1F1B", 30, ([2, 2], [0, 0]), [52, 32 + LOSS_B]),
        # GPipe holds 4 microbatches on stage 0 too: 2 | 2 needs c = 1 (82 - 32 + 8 = 58;
        #   c = 0: 90) and d = 1 (82 - 32 + 8 = 58; d = 0: 90): T = 12 + 2 + 3 * 7 = 35
        #   (1 | 3 needs d = 3: 123 - 96 + 16 = 43 (d = 2: 67), 12 + 3 + 3 * 12 = 51 ms;
        #   3 | 1 needs c = 3: 123 - 96 + 16 = 43 (c = 2: 67), 51 ms)
        ((64, 64), "GPipe", 35, ([2, 2], [1, 1]), [58, 58 + 8 / MIB]),
    ],
)
@pytest.mark.parametrize("method", ["dp", "milp"])
def test_hand_worked_optimum(caps_mib, schedule, expected_ms, expected_shape, expected_peaks_mib, method):
    profile = four_blocks()
    s = setup(2, 4, [int(c * MIB) for c in caps_mib], schedule)
    result = search.plan(profile, s, solver=method, **EXACT)
    assert result.solve.status == "optimal"
    assert result.cost.iteration_ms == pytest.approx(expected_ms, rel=1e-9)
    assert result.solve.objective == pytest.approx(expected_ms, rel=1e-9)
    assert shape(result) == expected_shape
    assert assert_meets_caps(result, profile, s).peak_bytes_per_stage == [int(p * MIB) for p in expected_peaks_mib]
    # and brute force agrees with the hand
    assert brute_optimum(profile, s)[1] == pytest.approx(expected_ms, rel=1e-9)


def test_heterogeneous_caps_and_schedule_change_the_answer():
    profile = four_blocks()
    a = search.plan(profile, setup(2, 4, [GIB, int(25.5 * MIB)]), **EXACT)
    b = search.plan(profile, setup(2, 4, [int(25.5 * MIB), GIB]), **EXACT)
    assert (a.cost.iteration_ms, b.cost.iteration_ms) == pytest.approx((34, 40))
    assert (shape(a), shape(b)) == (([2, 2], [0, 1]), ([1, 3], [1, 0]))
    one_f_one_b = search.plan(profile, setup(2, 4, [64 * MIB] * 2, "1F1B"), **EXACT)
    gpipe = search.plan(profile, setup(2, 4, [64 * MIB] * 2, "GPipe"), **EXACT)
    assert (one_f_one_b.cost.iteration_ms, gpipe.cost.iteration_ms) == pytest.approx((30, 35))


def test_infeasible_caps():
    # stage 0's smallest need: 1 block, checkpointed: 21 - 16 + 8 + 8 = 21 MiB > 20 MiB
    # (2 blocks need at least 26, 3 at least 31; see four_blocks)
    profile = four_blocks()
    s = setup(2, 4, [20 * MIB, GIB])
    result = search.plan(profile, s, **EXACT)
    assert isinstance(result, search.NoFit)
    assert result.status == "infeasible"
    assert brute_optimum(profile, s) is None
    assert not any(b.feasible for b in baselines.all_baselines(profile, s))


@pytest.mark.parametrize("slack, expected_ms", [
    (0, 34),
    (-1, 38),  # 1 byte over cap - margin: the solver's rows are in MiB, its tolerance ~0.1 B
    (-128, 38),
])
def test_evaluate_and_the_milp_agree_at_the_fit_margin(slack, expected_ms):
    # the 34 ms plan (2 | 2, c = 1) peaks at exactly 36 MiB on stage 0. It fits a cap of
    # 36 MiB + FIT_MARGIN_BYTES, not one byte less; then the best is 2 | 2 with c = 2
    # (peak0 28): T = 12 + 2 + 3 * 8 = 38 ms (1 | 3, c = 0, peak0 31: 39 ms).
    # Brute force (evaluate) and the MILP agree.
    profile = four_blocks()
    s = setup(2, 4, [36 * MIB + MARGIN + slack, GIB])
    assert brute_optimum(profile, s)[1] == pytest.approx(expected_ms)
    result = search.plan(profile, s, **EXACT)
    assert result.cost.iteration_ms == pytest.approx(expected_ms)
    assert_meets_caps(result, profile, s)


def test_upper_bound_from_the_best_baseline_keeps_the_optimum():
    profile = four_blocks()
    for caps in ([GIB, GIB], [46 * MIB, GIB], [GIB, int(25.5 * MIB)]):  # test_hand_worked_optimum's
        s = setup(2, 4, caps)
        best = best_feasible_baseline(profile, s)
        free = search.plan(profile, s, **EXACT)
        bounded = search.plan(profile, s, upper_bound_ms=best.iteration_ms, **EXACT)
        assert bounded.cost.iteration_ms == pytest.approx(free.cost.iteration_ms, rel=1e-12)
        # the bound is exactly the baseline's time when the baseline is optimal (slack caps)
        assert free.cost.iteration_ms <= best.iteration_ms


# ---------------------------------------------------------------- solver status


def check_status_against_pulp(problem, result, mip_gap):
    """The SolveResult must say what pulp and HiGHS say, not what we hope."""
    lp = problem.lp
    model_status = lp.solverModel.getModelStatus()
    if result.status == "optimal":
        assert lp.status == pulp.LpStatusOptimal and lp.sol_status == pulp.LpSolutionOptimal
        assert model_status.name == "kOptimal"
        assert result.gap is not None and result.gap <= mip_gap + 1e-12
    elif result.status == "feasible":
        assert lp.sol_status == pulp.LpSolutionIntegerFeasible
        assert model_status.name in {"kTimeLimit", "kInterrupt", "kIterationLimit"}
        assert result.gap == pytest.approx(lp.solverModel.getInfo().mip_gap) and result.gap > mip_gap
    elif result.status == "timeout":
        assert lp.status == pulp.LpStatusNotSolved and lp.sol_status == pulp.LpSolutionNoSolutionFound
        assert model_status.name == "kTimeLimit"
        assert result.objective is None and result.gap is None
        return
    else:
        assert result.status == "infeasible"
        assert lp.status == pulp.LpStatusInfeasible, f"'infeasible' but HiGHS says {model_status.name}"
        return
    # a solution was found: it is a plan, and its objective is what evaluate() says
    cost = costmodel.evaluate(milp.extract_plan(problem), problem.profile, problem.setup)
    assert cost.feasible
    assert cost.iteration_ms == pytest.approx(result.objective, rel=1e-6)


def test_time_limited_solve_reports_its_status_honestly():
    profile = heterogeneous(32, seed=1)
    s = interesting_caps(profile, 4, 8)
    seen = set()
    for limit in (0.4, 1.0, 30.0):
        problem = milp.build_problem(profile, s)
        result = milp.solve(problem, time_limit_s=limit, mip_gap=1e-4, threads=1)
        check_status_against_pulp(problem, result, 1e-4)
        seen.add(result.status)
        if result.status == "optimal":
            break
    assert "optimal" in seen


def test_time_limit_without_a_plan_is_a_timeout_not_infeasible():
    # no start solution and a limit far too short to find one: HiGHS stops at kTimeLimit
    # with nothing; feasible plans exist (the checkpointing baselines fit)
    profile = heterogeneous(64, seed=1)
    s = interesting_caps(profile, 8, 16)
    best = best_feasible_baseline(profile, s)
    assert best is not None
    problem = milp.build_problem(profile, s)
    result = milp.solve(problem, time_limit_s=0.05, threads=1)
    assert result.status == "timeout"
    check_status_against_pulp(problem, result, 1e-4)
    # started from the best baseline, the same short limit returns a plan at least that good
    started = search.plan(profile, s, time_limit_s=0.05, threads=1, upper_bound_ms=best.iteration_ms,
                        start=best.stages, solver="milp")
    assert isinstance(started, search.PlanResult), started
    assert started.solve.status in ("feasible", "optimal")
    assert started.cost.iteration_ms <= best.iteration_ms * (1 + 1e-9)
    assert_meets_caps(started, profile, s)


def test_solve_status_on_small_problems():
    profile = four_blocks()
    for caps in ([GIB, GIB], [20 * MIB, GIB]):  # slack; infeasible (test_infeasible_caps)
        problem = milp.build_problem(profile, setup(2, 4, caps))
        check_status_against_pulp(problem, milp.solve(problem, mip_gap=1e-4), 1e-4)


# ---------------------------------------------------------------- min_cap_scale


def scaled(s, factor, rounding):
    return s.model_copy(update={"mem_caps_bytes": [rounding(c * factor) for c in s.pipeline.mem_caps_bytes]})


def check_min_cap_scale(profile, s, method="dp"):
    """caps x f admit a plan and caps x f x 0.98 do not, both checked by plan()."""
    found = search.min_cap_scale(profile, s, solver=method)
    assert found is not None
    factor, cost = found
    # f is what the found plan needs, margin included
    assert factor == pytest.approx(max((c.peak_bytes + MARGIN) / c.cap_bytes for c in cost.stages))
    admitted = search.plan(profile, scaled(s, factor, math.ceil), **EXACT)
    assert isinstance(admitted, search.PlanResult), f"caps x {factor} admit no plan"
    assert search.plan(profile, scaled(s, factor * 0.98, math.floor), **EXACT).status == "infeasible"
    return factor


@pytest.mark.parametrize("method", ["dp", "milp"])
def test_min_cap_scale_by_hand(method):
    # caps 32 MiB each, 1F1B: the smallest max(peak0, peak1) is 1 | 3: peak0 = 21 - 16 + 10 + 8
    # = 23 (c = 1), peak1 = 33 - 16 + 10 = 27 MiB + 20 B (d = 2; d = 3 also 27): 27 MiB + 20 B.
    # 2 | 2 at best 28 (peak0, c = 2: 42 - 32 + 10 + 8, the warm-up send's 2 MiB among them;
    # peak1 24); 3 | 1 at best 33 (peak0, c = 3).
    profile = four_blocks()
    s = setup(2, 4, [32 * MIB, 32 * MIB])
    factor, cost = search.min_cap_scale(profile, s, solver=method)
    assert factor == pytest.approx((27 * MIB + 20 + MARGIN) / (32 * MIB), rel=1e-4)
    assert cost.peak_bytes_per_stage == [23 * MIB, 27 * MIB + 20]
    check_min_cap_scale(profile, s, method)


@pytest.mark.parametrize("method", ["dp", "milp"])
def test_min_cap_scale_from_caps_below_the_margin(method):
    profile = four_blocks()
    found = search.min_cap_scale(profile, setup(2, 4, [4096, 4096]), solver=method)
    assert found is not None
    assert found[0] == pytest.approx((27 * MIB + 20 + MARGIN) / 4096, rel=1e-4)  # test_min_cap_scale_by_hand


@pytest.mark.xdist_group("min_cap_brute")  # one worker: the brute force (brute_min_cap_scale) once per case
@pytest.mark.parametrize("method", ["dp", "milp"])
@pytest.mark.parametrize("make, n, stages", [(heterogeneous, 7, 2), (uniform_blocks, 5, 3), (heterogeneous, 6, 3)])
def test_min_cap_scale_is_tight(make, n, stages, method):
    """f is brute force's smallest max((peak + margin) / cap) (within the MILP's mip gap)."""
    profile = make(n, seed=7)
    s = interesting_caps(profile, stages, 2 * stages, 0.5)
    factor = check_min_cap_scale(profile, s, method)
    assert factor == pytest.approx(brute_min_cap_scale(make, n, stages), rel=1e-4)  # min_cap_scale: mip_gap 1e-4


@functools.cache
def brute_min_cap_scale(make, n, stages):
    """Brute force's smallest max((peak + margin) / cap) for test_min_cap_scale_is_tight's case:
    enumerating every plan is nearly all of that test's time, and both solvers are held to the
    same answer, so it is enumerated once per case, not once per solver."""
    profile = make(n, seed=7)
    s = interesting_caps(profile, stages, 2 * stages, 0.5)
    return min(max((p + MARGIN) / c for p, c in zip(peaks, s.pipeline.mem_caps_bytes)) for _, peaks, _ in all_plans(profile, s))


def test_solves_that_ask_for_other_threads_still_solve():
    """HiGHS makes its thread scheduler at a process's first solve; a later solve that asked
    for other threads did not run (it handed back the start as "feasible" with a 13.7% gap,
    or a 7 ms "timeout"), so tests failed in some orders. In a fresh process: 2 threads, then 1."""
    import subprocess
    import sys

    code = """
from planner.solve import search
from planner.models.synthetic import heterogeneous
from planner.schema import TrainSetup
profile = heterogeneous(12, seed=3)
setup = TrainSetup(stages=3, microbatches=6, micro_batch_size=1, mem_caps_bytes=[2**50] * 3)
for threads in (2, 1, None):
    print(search.plan(profile, setup, solver="milp", mip_gap=0.0, threads=threads).solve.status)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["optimal"] * 3, out.stdout
