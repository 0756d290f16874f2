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
    report: RunReport
    iteration_ms: float  # median over measured steps
    iteration_spread: float  # (p75 - p25) / median of the step times: the run's own noise
    speedup_vs_full: float | None  # measured
    peak_over_cap: list[float]  # measured peak / cap per stage
    iteration_error: float  # (measured - predicted) / predicted
    peak_error: list[float | None]  # per stage, (measured - predicted) / predicted; None unpredicted


class Comparison(BaseModel):
    model_config = ConfigDict(extra="forbid")

    plan: str
    steps: int
    warmup_steps: int
    seed: int
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
    on_start: Callable[[str], None] = lambda name: None,
) -> Comparison:
    """`run(strategy_name) -> RunReport` runs one strategy (the runtime's run_plan)."""
    measured: dict[tuple, tuple[str, RunReport]] = {}
    results: list[StrategyResult] = []
    for name, stages in strategies_to_run(plan):
        layout = _layout(stages)
        same_as = measured[layout][0] if layout in measured else None
        if same_as is None:
            on_start(name)
            measured[layout] = (name, run(name))
        results.append(_result(name, same_as, measured[layout][1]))
    reference = next((r.iteration_ms for r in results if r.name == REFERENCE), None)
    for result in results:
        result.speedup_vs_full = reference / result.iteration_ms if reference else None
    return Comparison(plan=str(plan_file), steps=steps, warmup_steps=warmup_steps, seed=seed, strategies=results)


def _result(name: str, same_as: str | None, report: RunReport) -> StrategyResult:
    stages = report.stages
    return StrategyResult(
        name=name,
        same_as=same_as,
        report=report,
        iteration_ms=report.iteration_ms,
        iteration_spread=_quartile_spread(report.iteration_ms_all),
        speedup_vs_full=None,
        peak_over_cap=[s.measured.peak_bytes / s.cap_bytes for s in stages],
        iteration_error=(report.iteration_ms - report.predicted_iteration_ms) / report.predicted_iteration_ms,
        peak_error=[(s.measured.peak_bytes - s.predicted.peak_bytes) / s.predicted.peak_bytes if s.predicted else None
                    for s in stages],
    )
