"""`ckplan solve --schedule auto`: every pipeline schedule torch runs (1F1B, GPipe,
interleaved-1F1B, ZB, ZBV, DualPipeV; --chunks for the interleaved ones, 2 by default), the
plan solved for each, in one table; the fastest that fits is written as the plan."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from planner.errors import SolverTimeLimit, UserError

SCHEDULES = ("1F1B", "GPipe", "interleaved-1F1B", "ZB", "ZBV", "DualPipeV")


@dataclass
class Trial:
    schedule: str
    chunks: int
    plan: object = None  # None: not planned (why_not says in a word, reason in full)
    why_not: str = ""
    reason: str = ""


def chunks_for(schedule: str, chunks: int | None) -> int:
    """The chunks a schedule is tried with: 1 for 1F1B and GPipe, two for a V, --chunks (2)
    for the interleaved ones."""
    if schedule in ("1F1B", "GPipe"):
        return 1
    if schedule in ("ZBV", "DualPipeV"):
        return 2
    return chunks or 2


def run_auto_schedule(profile, profile_path: Path, *, out: Path, time_limit_s: float, solver: str, say,
                      chunks: int | None = None, **options) -> list[Trial]:
    """Solve every schedule, print the table, write the fastest that fits to `out`."""
    from planner import io
    from planner.commands.setup_options import planned_setup
    from planner.solve.deadline import Deadline
    from planner.solve.planning import Unplanned, make_plan

    whole = Deadline(time_limit_s)  # shared: each schedule gets an equal share of what is left
    trials = []
    for index, schedule in enumerate(SCHEDULES):
        trial = Trial(schedule, chunks_for(schedule, chunks))
        share = whole.remaining_s() / (len(SCHEDULES) - index)
        try:
            deadline = Deadline(share)
            setup, _ = planned_setup(profile, profile_path, schedule=schedule, chunks=trial.chunks,
                                     say=say if index == 0 else None, deadline=deadline, **options)
            plan = make_plan(profile, profile_path, setup, time_limit_s=share, solver=solver, deadline=deadline)
        except SolverTimeLimit as exc:
            trial.why_not, trial.reason = "time limit", str(exc)
        except UserError as exc:  # this schedule's own constraint (microbatches, chunks, layers), or the options'
            trial.why_not, trial.reason = "refused", str(exc)
        else:
            if isinstance(plan, Unplanned):
                trial.why_not = "time limit" if plan.status == "timeout" else "does not fit"
                trial.reason = plan.message(setup)
            else:
                trial.plan = plan
        trials.append(trial)
    refusals = {t.reason for t in trials if t.why_not == "refused"}
    if len(refusals) == 1 and all(t.why_not == "refused" for t in trials):
        raise UserError(refusals.pop())  # the options' own fault, whatever the schedule: said once, first
    best = min((t for t in trials if t.plan is not None), key=lambda t: t.plan.predicted.iteration_ms, default=None)
    if best is not None:
        io.save_plan(best.plan, out)
    print_table(trials, best, out)
    if best is None:
        if any(t.why_not == "time limit" for t in trials):
            raise SolverTimeLimit("no schedule was planned before --time-limit (shared among the six); raise it")
        nearest = next((t for t in trials if t.why_not == "does not fit"), None)
        if nearest is not None:
            raise UserError(f"no pipeline schedule fits the caps; {nearest.schedule}: {nearest.reason}")
        raise UserError("no pipeline schedule can be planned with these options: " +
                        "; ".join(f"{t.schedule}: {t.reason}" for t in trials))
    return trials


def print_table(trials: list[Trial], best: Trial | None, out: Path) -> None:
    from rich.table import Table

    from planner.console import console
    from planner.units import format_bytes, format_ms

    base = next((t.plan.predicted.iteration_ms for t in trials if t.schedule == "1F1B" and t.plan), None)
    table = Table(title="pipeline schedules, each with its own plan (same cost model)")
    for column in ("schedule", "chunks", "fits", "iteration", "vs 1F1B", "max peak", "recomputes"):
        table.add_column(column, justify="left" if column in ("schedule", "fits") else "right")
    for trial in trials:
        if trial.plan is None:
            table.add_row(trial.schedule, str(trial.chunks), "no", "—", "—", "—", trial.why_not)
            continue
        plan = trial.plan
        iteration = plan.predicted.iteration_ms
        recomputed = sum(len(s.recompute) + len(set(s.checkpointed) - set(s.recompute)) for s in plan.stages)
        table.add_row(trial.schedule + (" ←" if trial is best else ""), str(trial.chunks), "yes",
                      format_ms(iteration), f"{iteration / base:.3f}×" if base else "—",
                      format_bytes(max(s.predicted.peak_bytes for s in plan.stages)), f"{recomputed} layers")
    console.print(table)
    for trial in trials:  # each reason whole, never cut off inside a cell
        if trial.plan is None and trial.reason:
            console.print(f"{trial.schedule}: {trial.reason}")
    if best is not None:
        console.print(f"fastest that fits: {best.schedule}" + (f" with {best.chunks} chunks per rank" if best.chunks > 1
                                                                else "") + f"; plan written to {out}")
