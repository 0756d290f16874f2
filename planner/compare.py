"""Run ckplan's plan and its baselines on the runtime, same steps and seed, and line
the measurements up: ckplan's promise ("same memory, faster training") measured."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from planner.schema import Plan, RunReport, StagePlan

REFERENCE = "full-ckpt"  # speed-ups are against full activation checkpointing


class StrategyResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    same_as: str | None = None  # identical stages to an earlier strategy: measured once
    report: RunReport  # the first round's
    iteration_ms: float  # median over rounds of each round's median step
    iteration_ms_rounds: list[float]  # each round's median step, in round order
    iteration_spread: float  # (p75 - p25) / median of all step times of all rounds
    speedup_vs_full: float | None  # measured: median over rounds of full-ckpt's time / this one's
    peak_over_cap: list[float]  # measured peak / cap per stage
    iteration_error: float  # (measured - predicted) / predicted
    peak_error: list[float | None]  # per stage, (measured - predicted) / predicted; None unpredicted


class Comparison(BaseModel):
    model_config = ConfigDict(extra="forbid")

    plan: str
    steps: int
    warmup_steps: int
    seed: int
    rounds: int = 1  # every strategy once per round, round-robin, so drift hits all alike
    strategies: list[StrategyResult]


def strategies_to_run(plan: Plan) -> list[tuple[str, list[StagePlan]]]:
    """ckplan first, then every baseline that fits its caps (by the cost model)."""
    chosen = [("ckplan", plan.stages)]
    chosen += [(b.name, b.stages) for b in plan.baselines if b.feasible and b.stages]
    return chosen


def _layout(stages: list[StagePlan]) -> tuple:
    return tuple((tuple(s.layers), tuple(sorted(s.checkpointed))) for s in stages)


def _quartile_spread(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q3 - q1) / statistics.median(values)


def run_comparison(
    plan: Plan,
    run: Callable[[str], RunReport],
    *,
    plan_file: str | Path,
    steps: int,
    warmup_steps: int,
    seed: int,
    rounds: int = 1,
    on_start: Callable[[str], None] = lambda name: None,
) -> Comparison:
    """`run(strategy_name) -> RunReport` runs one strategy (the runtime's run_plan). Each
    distinct layout runs once per round; rounds go round-robin over the strategies, so a
    machine that slows down for a while slows every strategy alike."""
    first_of: dict[tuple, str] = {}
    for name, stages in strategies_to_run(plan):
        first_of.setdefault(_layout(stages), name)
    reports: dict[str, list[RunReport]] = {name: [] for name in first_of.values()}
    for _ in range(rounds):
        for name in reports:
            on_start(name)
            reports[name].append(run(name))
    results = []
    for name, stages in strategies_to_run(plan):
        owner = first_of[_layout(stages)]
        results.append(_result(name, None if owner == name else owner, reports[owner]))
    reference = next((r for r in results if r.name == REFERENCE), None)
    for result in results:
        result.speedup_vs_full = paired_speedup(reference, result) if reference else None
    return Comparison(plan=str(plan_file), steps=steps, warmup_steps=warmup_steps, seed=seed, rounds=rounds,
                      strategies=results)


def paired_speedup(slower: StrategyResult, faster: StrategyResult) -> float:
    """How much faster `faster` ran than `slower`: the median over rounds of the ratio of
    their times in the same round. Both ran minutes apart at most within a round, so a
    slow spell of the machine cancels out of each ratio instead of landing on one side."""
    return statistics.median(s / f for s, f in zip(slower.iteration_ms_rounds, faster.iteration_ms_rounds,
                                                    strict=True))


def _result(name: str, same_as: str | None, reports: list[RunReport]) -> StrategyResult:
    report = reports[0]
    stages = report.stages
    per_round = [r.iteration_ms for r in reports]
    iteration_ms = statistics.median(per_round)
    return StrategyResult(
        name=name,
        same_as=same_as,
        report=report,
        iteration_ms=iteration_ms,
        iteration_ms_rounds=per_round,
        iteration_spread=_quartile_spread([t for r in reports for t in r.iteration_ms_all]),
        speedup_vs_full=None,
        peak_over_cap=[max(r.stages[i].measured.peak_bytes for r in reports) / s.cap_bytes for i, s in enumerate(stages)],
        iteration_error=(iteration_ms - report.predicted_iteration_ms) / report.predicted_iteration_ms,
        peak_error=[(max(r.stages[i].measured.peak_bytes for r in reports) - s.predicted.peak_bytes)
                    / s.predicted.peak_bytes if s.predicted else None for i, s in enumerate(stages)],
    )
