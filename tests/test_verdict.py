"""Speed-up intervals and verdicts on synthetic round data, and compare's extra rounds."""

import math
import random

import pytest

from planner.measure.compare import run_comparison, verdict_sentence
from planner.measure.verdict import paired_speedup, student_t_cdf, student_t_quantile
from planner.schema import (
    BaselineResult,
    DeviceInfo,
    FileRef,
    Plan,
    PlanPredicted,
    RunReport,
    SolverInfo,
    StageMeasured,
    StagePlan,
    StageReport,
    TrainSetup,
)


@pytest.mark.parametrize(("p", "df", "expected"), [
    (0.975, 1, 12.7062), (0.975, 2, 4.3027), (0.975, 5, 2.5706), (0.975, 30, 2.0423),
    (0.95, 1, 6.3138), (0.995, 10, 3.1693), (0.9, 4, 1.5332),
])
def test_student_t_quantiles_match_the_printed_tables(p, df, expected):
    assert student_t_quantile(p, df) == pytest.approx(expected, abs=1e-4)
    assert student_t_cdf(expected, df) == pytest.approx(p, abs=1e-5)


def test_two_rounds_by_hand():
    # logs of the ratios: ln 1.2 and ln 1.1; mean and sd by hand, t(0.975, 1) = 12.7062
    speedup = paired_speedup([1.2, 1.1], [1.0, 1.0])
    logs = [math.log(1.2), math.log(1.1)]
    mean, sd = sum(logs) / 2, abs(logs[0] - logs[1]) / math.sqrt(2)
    assert speedup.ratio == pytest.approx(math.sqrt(1.2 * 1.1))
    assert speedup.low == pytest.approx(math.exp(mean - 12.7062 * sd / math.sqrt(2)), rel=1e-5)
    assert speedup.high == pytest.approx(math.exp(mean + 12.7062 * sd / math.sqrt(2)), rel=1e-5)
    assert speedup.verdict == "unresolved"  # two rounds 10% apart cannot settle a 15% speed-up


def test_clearly_faster_clearly_slower_and_overlapping():
    base = [1000, 1300, 900, 1100, 1250]  # the machine drifts by ±20% between rounds ...
    faster = [t / 1.2 * (1 + e) for t, e in zip(base, [0.01, -0.01, 0.0, 0.02, -0.02])]  # ... pairing cancels it
    assert paired_speedup(base, faster).verdict == "faster"
    assert paired_speedup(faster, base).verdict == "slower"
    noisy = [t * (1 + e) for t, e in zip(base, [0.15, -0.12, 0.1, -0.08, 0.02])]
    result = paired_speedup(base, noisy)
    assert result.verdict == "unresolved" and result.low < 1 < result.high


def test_one_round_is_never_a_verdict():
    assert paired_speedup([2.0], [1.0]).verdict == "unresolved"


def test_a_verdict_never_claims_faster_when_the_interval_crosses_one():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(2, 8)
        slower = [rng.uniform(900, 1100) for _ in range(n)]
        faster = [t / rng.uniform(0.9, 1.15) for t in slower]
        result = paired_speedup(slower, faster, confidence=rng.choice([0.8, 0.9, 0.95]))
        assert (result.verdict == "faster") == (result.low > 1)
        assert (result.verdict == "slower") == (result.high < 1)
        assert result.low <= result.ratio <= result.high


# ---------------------------------------------------------------- compare's rounds


def _plan() -> Plan:
    ckplan = [StagePlan(index=0, layers=["a"]), StagePlan(index=1, layers=["b"], checkpointed=["b"])]
    full = [StagePlan(index=0, layers=["a"], checkpointed=["a"]), StagePlan(index=1, layers=["b"], checkpointed=["b"])]
    return Plan(
        created_at="now", model=FileRef(file="m.py", sha256="0"), profile=FileRef(file="p.json", sha256="0"),
        device=DeviceInfo(type="cpu", name="cpu"), dtype="float32",
        setup=TrainSetup(stages=2, microbatches=4, micro_batch_size=1, mem_caps_bytes=[100, 100]),
        stages=ckplan, predicted=PlanPredicted(iteration_ms=100.0), solver=SolverInfo(status="optimal"),
        baselines=[BaselineResult(name="full-ckpt", feasible=True, iteration_ms=120.0,
                                  peak_bytes_per_stage=[50, 50], stages=full)],
    )


def _report(iteration_ms: float, stage_ms: float) -> RunReport:
    stages = [StageReport(index=i, cap_bytes=100, measured=StageMeasured(
        peak_bytes=50, fwd_ms=stage_ms / 3, bwd_ms=2 * stage_ms / 3, time_ms=stage_ms, step_ms=1.0)) for i in range(2)]
    return RunReport(created_at="now", plan=FileRef(file="plan.yaml", sha256="0"),
                     device=DeviceInfo(type="cpu", name="cpu"), backend="gloo", steps=1, warmup_steps=0,
                     microbatches=4, iteration_ms=iteration_ms, iteration_ms_all=[iteration_ms],
                     predicted_iteration_ms=100.0, losses=[1.0], stages=stages)


def _runner(times: dict[str, list[float]]):
    calls: list[str] = []

    def run(name: str) -> RunReport:
        ms = times[name][sum(1 for c in calls if c == name)]
        calls.append(name)
        return _report(ms, ms / 5)

    return run, calls


def _compare(times, **kwargs):
    run, calls = _runner(times)
    return run_comparison(_plan(), run, plan_file="plan.yaml", steps=1, warmup_steps=0, seed=0, **kwargs), calls


def test_compare_stops_once_every_verdict_is_resolved():
    drift = [1.0, 1.3, 0.9, 1.1, 1.2, 1.0]
    times = {"ckplan": [100 * d for d in drift], "full-ckpt": [125 * d * (1 + 0.05 * (-1) ** i)
                                                                 for i, d in enumerate(drift)]}
    comparison, calls = _compare(times, rounds=2, max_rounds=6)
    assert comparison.resolved and comparison.rounds == 3  # two rounds: t(1) is too wide for ±5%
    assert calls == ["ckplan", "full-ckpt", "full-ckpt", "ckplan", "ckplan", "full-ckpt"]  # interleaved, each round reversed
    full = comparison.strategies[1]
    assert full.ckplan_vs.verdict == "faster" and full.ckplan_vs.ratio == pytest.approx(1.25, rel=0.02)
    assert comparison.strategies[0].vs_full.verdict == "faster"
    # the busiest rank's compute: 4 microbatches x stage time + step, per round
    assert full.compute_ms_rounds[0] == pytest.approx(4 * 125 * 1.05 / 5 + 1.0)


def test_compare_spends_its_budget_when_noise_hides_the_difference():
    times = {"ckplan": [100, 130, 90, 110], "full-ckpt": [95, 140, 85, 118]}
    comparison, calls = _compare(times, rounds=2, max_rounds=4)
    assert comparison.rounds == 4 and not comparison.resolved
    assert comparison.strategies[1].ckplan_vs.verdict == "unresolved"


def test_compare_without_max_rounds_runs_exactly_rounds():
    times = {"ckplan": [100, 130, 90], "full-ckpt": [95, 140, 85]}
    comparison, calls = _compare(times, rounds=3)
    assert comparison.rounds == 3 and len(calls) == 6


def _clocked(times, seconds_per_run: float, **kwargs):
    """_compare with a clock that advances seconds_per_run for every strategy run."""
    run, calls = _runner(times)
    now = [0.0]

    def timed(name: str) -> RunReport:
        now[0] += seconds_per_run
        return run(name)

    comparison = run_comparison(_plan(), timed, plan_file="plan.yaml", steps=1, warmup_steps=0, seed=0,
                                clock=lambda: now[0], **kwargs)
    return comparison, calls


def test_rounds_are_added_until_the_time_budget_would_run_out_then_it_says_too_noisy():
    noisy = {"ckplan": [100, 130, 90, 110, 95, 140] * 3, "full-ckpt": [95, 140, 85, 118, 99, 120] * 3}
    comparison, calls = _clocked(noisy, 10.0, rounds=2, time_budget_s=65.0)
    # 20 s a round: after 3 rounds (60 s) a fourth would end at 80 s, past the budget
    assert comparison.rounds == 3 and comparison.stopped == "time_budget" and not comparison.resolved
    assert comparison.wall_s == 60.0 and comparison.time_budget_s == 65.0
    sentence = verdict_sentence(comparison)
    assert sentence.startswith("verdict: the machine was too noisy to tell ckplan from full-ckpt after 3 rounds "
                               "in 1.0 min (the 1.08 min time budget (--time-budget) ran out)")
    assert "longer --time-budget" in sentence


def test_a_resolved_verdict_is_said_with_its_interval():
    times = {"ckplan": [100, 101, 99, 100] * 4, "full-ckpt": [125, 127, 124, 126] * 4}
    comparison, _ = _clocked(times, 10.0, rounds=2, time_budget_s=600.0)
    assert comparison.resolved and comparison.stopped == "resolved" and comparison.rounds == 2
    assert verdict_sentence(comparison).startswith("verdict, resolved after 2 rounds in 0.7 min: ckplan 1.25x faster "
                                                   "than full-ckpt [")


def test_strategies_that_run_alike_resolve_as_the_same_speed():
    times = {"ckplan": [100, 110, 95, 105, 100, 98] * 3, "full-ckpt": [100.5, 109.5, 95.5, 105.2, 99.6, 98.4] * 3}
    comparison, _ = _clocked(times, 1.0, rounds=2, time_budget_s=600.0)
    full = comparison.strategies[1]
    assert comparison.resolved and full.ckplan_vs.verdict == "same"
    assert "ckplan 1.00x as fast as full-ckpt" in verdict_sentence(comparison)


def test_max_rounds_still_caps_the_rounds_within_a_budget():
    noisy = {"ckplan": [100, 130, 90, 110, 95, 140], "full-ckpt": [95, 140, 85, 118, 99, 120]}
    comparison, _ = _clocked(noisy, 1.0, rounds=2, max_rounds=4, time_budget_s=600.0)
    assert comparison.rounds == 4 and comparison.stopped == "max_rounds"
    assert "--max-rounds was reached" in verdict_sentence(comparison)
