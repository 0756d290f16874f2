"""Run ckplan's plan and its baselines on the runtime, same steps and seed, and line
the measurements up: ckplan's promise ("same memory, faster training") measured.

Strategies run round-robin, every distinct layout once per round, each round in the
reverse order of the one before (A B C, C B A, ...), so a machine that slows down for a while
slows all alike and none always runs first; speed-ups are paired by round and carry a
confidence interval and a verdict (planner.verdict). Rounds are added until ckplan's verdict
against every other strategy is resolved, `max_rounds` are run, or the next round would end
past the time budget: then the comparison says the machine was too noisy to tell.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from planner.measure import verdict
from planner.schema import Plan, RunReport, StagePlan

REFERENCE = "full-ckpt"  # speed-ups are against full activation checkpointing
MIN_ROUNDS_FOR_VERDICT = 2  # one round has no spread to judge by


class Interval(BaseModel):
    """A paired speed-up (> 1: faster) with its confidence interval and verdict."""

    model_config = ConfigDict(extra="forbid")

    ratio: float  # geometric mean over rounds of the same-round time ratio
    low: float | None  # None: one round, no interval
    high: float | None
    verdict: verdict.Verdict

    @classmethod
    def of(cls, speedup: verdict.SpeedUp) -> Interval:
        bounded = speedup.rounds >= MIN_ROUNDS_FOR_VERDICT
        return cls(ratio=speedup.ratio, low=speedup.low if bounded else None,
                   high=speedup.high if bounded else None, verdict=speedup.verdict)


class StrategyResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    same_as: str | None = None  # identical stages to an earlier strategy: measured once
    report: RunReport  # the first round's
    iteration_ms: float  # median over rounds of each round's median step
    iteration_ms_rounds: list[float]  # each round's median step, in round order
    iteration_spread: float  # (p75 - p25) / median of all step times of all rounds
    # the busiest rank's compute per iteration, M x (fwd + bwd) + step, measured inside the
    # ranks (waiting on neighbours excluded): per round, and their median
    compute_ms_rounds: list[float] = []
    compute_ms: float = 0.0
    speedup_vs_full: float | None  # this strategy's iteration speed-up over full checkpointing (ratio)
    vs_full: Interval | None = None  # the same with its interval and verdict
    ckplan_vs: Interval | None = None  # ckplan's iteration speed-up over this strategy
    ckplan_vs_compute: Interval | None = None  # the same on the busiest rank's compute
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
    confidence: float = 0.95
    resolved: bool = False  # ckplan's verdict against every other strategy is faster, slower or the same
    # why rounds stopped being added: every verdict resolved, --max-rounds reached, or the next
    # round would have ended past the time budget
    stopped: Literal["resolved", "max_rounds", "time_budget"] = "max_rounds"
    wall_s: float = 0.0  # the rounds' wall time
    time_budget_s: float | None = None
    strategies: list[StrategyResult]


def strategies_to_run(plan: Plan) -> list[tuple[str, list[StagePlan]]]:
    """ckplan first, then every baseline that fits its caps (by the cost model)."""
    chosen = [("ckplan", plan.stages)]
    chosen += [(b.name, b.stages) for b in plan.baselines if b.feasible and b.stages]
    return chosen


def _first_of(plan: Plan) -> dict[tuple, str]:
    """Each distinct layout of the strategies to run, and the first strategy that has it."""
    first_of: dict[tuple, str] = {}
    for name, stages in strategies_to_run(plan):
        first_of.setdefault(_layout(stages), name)
    return first_of


def strategies_to_run_once(plan: Plan) -> list[str]:
    """The strategies a comparison runs, one per distinct plan, in order."""
    return list(_first_of(plan).values())


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
    max_rounds: int | None = None,
    time_budget_s: float | None = None,
    confidence: float = 0.95,
    clock: Callable[[], float] = time.monotonic,
) -> Comparison:
    """`run(strategy_name) -> RunReport` runs one strategy (the runtime's run_plan). Runs
    `rounds` rounds, then more while any verdict of ckplan against another strategy is
    unresolved, up to `max_rounds` (None: no limit) and while the next round, as long as the
    rounds so far on average, ends within `time_budget_s` of the start (None: no budget; with
    neither, no round past `rounds`)."""
    first_of = _first_of(plan)
    reports: dict[str, list[RunReport]] = {name: [] for name in first_of.values()}
    if max_rounds is None and time_budget_s is None:
        max_rounds = rounds
    start = clock()
    while True:
        order = list(reports) if len(reports["ckplan"]) % 2 == 0 else list(reversed(reports))
        for name in order:
            reports[name].append(run(name))
        comparison = _compare(plan, first_of, reports, plan_file=plan_file, steps=steps,
                              warmup_steps=warmup_steps, seed=seed, confidence=confidence)
        done, elapsed = comparison.rounds, clock() - start
        stopped = ("resolved" if comparison.resolved else
                   "max_rounds" if max_rounds is not None and done >= max(rounds, max_rounds) else
                   "time_budget" if time_budget_s is not None and elapsed * (done + 1) / done > time_budget_s
                   else None)
        if done >= rounds and stopped is not None:
            return comparison.model_copy(update={"stopped": stopped, "wall_s": elapsed,
                                                 "time_budget_s": time_budget_s})


def _compare(plan, first_of, reports, *, plan_file, steps, warmup_steps, seed, confidence) -> Comparison:
    results = []
    for name, stages in strategies_to_run(plan):
        owner = first_of[_layout(stages)]
        results.append(_result(name, None if owner == name else owner, reports[owner]))
    by_name = {r.name: r for r in results}
    reference, ckplan = by_name.get(REFERENCE), by_name["ckplan"]
    for result in results:
        if reference is not None:
            result.vs_full = Interval.of(paired_speedup(reference, result, confidence=confidence))
            result.speedup_vs_full = result.vs_full.ratio
        if result is not ckplan and result.same_as != "ckplan":  # an identical layout: no contest
            result.ckplan_vs = Interval.of(paired_speedup(result, ckplan, confidence=confidence))
            result.ckplan_vs_compute = Interval.of(verdict.paired_speedup(
                result.compute_ms_rounds, ckplan.compute_ms_rounds, confidence=confidence))
    num_rounds = len(ckplan.iteration_ms_rounds)
    contested = [r.ckplan_vs for r in results if r.ckplan_vs is not None]
    resolved = num_rounds >= MIN_ROUNDS_FOR_VERDICT and all(v.verdict != "unresolved" for v in contested)
    return Comparison(plan=str(plan_file), steps=steps, warmup_steps=warmup_steps, seed=seed, rounds=num_rounds,
                      confidence=confidence, resolved=resolved, strategies=results)


def paired_speedup(slower: StrategyResult, faster: StrategyResult, *, confidence: float = 0.95) -> verdict.SpeedUp:
    """How much faster `faster` ran than `slower`, from the ratio of their times in the
    same round. Both ran minutes apart at most within a round, so a slow spell of the
    machine cancels out of each ratio instead of landing on one side."""
    return verdict.paired_speedup(slower.iteration_ms_rounds, faster.iteration_ms_rounds, confidence=confidence)


def busiest_rank_compute_ms(report: RunReport) -> float:
    """The busiest rank's own work per iteration: every microbatch's forward and backward
    (recompute included) plus its optimizer step, as timed inside the rank."""
    return max(report.microbatches * s.measured.time_ms + (s.measured.step_ms or 0.0) for s in report.stages)


def _result(name: str, same_as: str | None, reports: list[RunReport]) -> StrategyResult:
    report = reports[0]
    stages = report.stages
    per_round = [r.iteration_ms for r in reports]
    compute_rounds = [busiest_rank_compute_ms(r) for r in reports]
    iteration_ms = statistics.median(per_round)
    return StrategyResult(
        name=name,
        same_as=same_as,
        report=report,
        iteration_ms=iteration_ms,
        iteration_ms_rounds=per_round,
        iteration_spread=_quartile_spread([t for r in reports for t in r.iteration_ms_all]),
        compute_ms_rounds=compute_rounds,
        compute_ms=statistics.median(compute_rounds),
        speedup_vs_full=None,
        peak_over_cap=[max(r.stages[i].measured.peak_bytes for r in reports) / s.cap_bytes for i, s in enumerate(stages)],
        iteration_error=(iteration_ms - report.predicted_iteration_ms) / report.predicted_iteration_ms,
        peak_error=[(max(r.stages[i].measured.peak_bytes for r in reports) - s.predicted.peak_bytes)
                    / s.predicted.peak_bytes if s.predicted else None for i, s in enumerate(stages)],
    )


def verdict_sentence(comparison: Comparison) -> str:
    """What the comparison found, plainly: each verdict of ckplan against the others, or that
    the machine was too noisy to tell, after how many rounds and how long."""
    spent = f"{comparison.rounds} rounds in {comparison.wall_s / 60:.1f} min"
    contested = [(r.name, r.ckplan_vs) for r in comparison.strategies if r.ckplan_vs is not None]
    if not contested:
        return f"verdict: every baseline runs ckplan's own plan; nothing to tell apart ({spent})"
    words = {"faster": "faster than", "slower": "slower than", "same": "as fast as", "unresolved": "vs"}
    found = "; ".join(f"ckplan {v.ratio:.2f}x {words[v.verdict]} {name}"
                      + (f" [{v.low:.2f}, {v.high:.2f}]" if v.low is not None else "") for name, v in contested)
    if comparison.resolved:
        return f"verdict, resolved after {spent}: {found}"
    unresolved = [name for name, v in contested if v.verdict == "unresolved"]
    why = (f"the {comparison.time_budget_s / 60:.3g} min time budget (--time-budget) ran out"
           if comparison.stopped == "time_budget" else "--max-rounds was reached")
    return (f"verdict: the machine was too noisy to tell ckplan from {', '.join(unresolved)} after {spent} ({why}): "
            f"{found}; run it on a quieter machine or give it a longer --time-budget")
