"""Solving where the caching allocator's replay judges a plan (issue 33): the solvers' rows held to
evaluate()'s verdict, both ways.

The solvers (dpsolve.py, milp.py) hold each stage's allocated peak under a row: the cap less the
communication buffers and the divisor's reserve (costmodel.limit_bytes). evaluate() judges a cuda stage by
the allocator's replay where one orders its step (planner/cost/replayed_reserve.py): the replayed reserved
peak, the buffers and FIT_MARGIN_BYTES within the cap. Where the replay reserves more than the divisor, the
rows admit plans the replay puts over; where it reserves less, they refuse plans the replay admits
(Mistral-NeMo-12B on 4 stages at 80GB, docs/published-runs.md §35.usertrial and §37.solvefit).

What is proved. A replayed stage's reserved peak is never below its allocated peak: reserve.reserved_bytes adds
to the replay's segments what the cost model's peak holds past the replay's allocated peak, reserve_fsdp2's is
at least that peak in 2 MiB segments, and a segment holds every block allocated in it. So on every stage the
replay admits, peak + FIT_MARGIN_BYTES <= cap - buffers, and a stage the divisor judges meets its row at its
cap. The rows under relaxed_caps (per rank the cap whose divisor row admits cap - buffers, never below the
cap) therefore admit every plan evaluate() admits, and search_caps solves under them first:
- no plan under them: none fits the caps (the solvers' "infeasible" is a proof against the replay);
- the fastest under them fits: no plan that fits is faster (the solver's status holds against the replay);
- else caps between are tried, at most REPLAY_ROUNDS solves more: the caps as given first (the plan found
  before the replay was searched, where it fits, is the least this returns); then, from each plan found, one
  that fits raises each stage to what its replayed ratio of reserved to allocated admits, one over lowers it to
  that (never below caps whose plan fitted, or gave none); with no plan fitting yet, the least-memory plan and the
  caps its replay admits; else halfway. Each plan is judged by evaluate() under the caps given; the fastest that
  fits is returned "feasible", its gap against the relaxed solve's bound (proven: no plan that fits is faster).
  Not proved: that no plan between is faster (caps that let the solvers reach it may not be among those tried),
  nor, where none of those plans fits and neither does the least-memory plan, that none fits ("infeasible" then
  says the search found none; "timeout" where the deadline cut the rounds short).
Never returned: a plan evaluate() puts over a cap.
search.plan calls search_caps only where planner/solve/replaycuts.py's lazy cuts, which prove their answer, did
not close: a schedule of several stages a rank, or the cuts' rounds or time spent (their bound then tightens
the gap).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from planner.cost import allocator, costmodel, replayed_reserve
from planner.cost.costmodel import PlanCost
from planner.schema import Profile, StagePlan, TrainSetup
from planner.solve.results import NoFit, PlanResult

# Solves under caps between the relaxed rows and the caps given, after the relaxed one (search_caps)
REPLAY_ROUNDS = 6
CAPS_RESOLUTION = 1 << 20  # the caps' search stops once the bracket is this narrow on every stage

# solve(caps, upper_bound_ms, first): the solvers' plan under those caps, re-scored by evaluate() under them;
# `first` with the caller's start and bound, the others with `upper_bound_ms` alone
SolveUnder = Callable[[list[int], "float | None", bool], "PlanResult | NoFit"]


def relaxed_caps(profile: Profile, setup: TrainSetup) -> list[int] | None:
    """Per rank, the cap whose divisor row (costmodel.limit_bytes) admits an allocated peak of the cap less the
    buffers, never below the cap: rows that admit every plan the replay admits (the module's text). None where no
    replay judges (cpu, --fragmentation stated, a runtime whose step no replay orders): the rows are the verdict."""
    if profile.device.type != "cuda" or not replayed_reserve.replays(setup):
        return None
    ctx = costmodel.Context(profile, setup)
    kept = 1 - costmodel.fragmentation(setup.pipeline, device_type="cuda")
    caps = []
    for rank, cap in enumerate(setup.pipeline.mem_caps_bytes):
        buffers = costmodel.workspace_bytes(rank, ctx)
        if cap <= buffers:  # the buffers alone take the cap: no row admits anything
            caps.append(cap)
            continue
        # allocator.allocated_limit keeps whole 2 MiB segments x (1 - f): one more than the division asks, so its
        # float product never falls short of cap - buffers
        segments = math.ceil((cap - buffers) / kept / allocator.ROUND_LARGE) + 1
        caps.append(max(cap, buffers + segments * allocator.ROUND_LARGE))
    return caps


def search_caps(setup: TrainSetup, relaxed: list[int], solve: SolveUnder, *, evaluate: Callable[[list[StagePlan]], PlanCost],
                least_memory: Callable[[], list[StagePlan] | None], known_ms: float | None,
                elapsed_s: Callable[[], float], first: PlanResult | None = None) -> PlanResult | NoFit:
    """The fastest plan found that fits the caps `setup` gives by evaluate()'s verdict (the module's text):
    solved under `relaxed`, then under caps between. `known_ms`: the time of a plan that fits (the rounds
    look for faster ones only); `least_memory`: the plan that needs least, tried once no plan fits below caps
    that gave none (its replay's caps then the next tried). `first`: the solve under `relaxed`, made before
    (replaycuts' first)."""
    first = first or solve(relaxed, None, True)
    if isinstance(first, NoFit):
        return first
    cost = evaluate(first.stages)
    if cost.feasible:
        return _judged(first, cost, dataclasses.replace(first.solve, replay="relaxed"))
    given = list(setup.pipeline.mem_caps_bytes)
    over, below, best, probed, solves, stopped = relaxed, None, None, False, 1, None
    trial = given  # the rows as given first: the plan found before the replay was searched, the least this returns
    rounds_left, spent = 0, []  # where the deadline cuts the rounds: at most how many were left, each round's seconds
    for round_index in range(REPLAY_ROUNDS):
        bar = min((ms for ms in (known_ms, best[1].iteration_ms if best else None) if ms is not None), default=None)
        began = elapsed_s()
        result = solve(trial, bar, False) if min(trial) > 0 else None
        solves += result is not None
        if isinstance(result, NoFit) and result.status != "infeasible":
            stopped = result.status  # the deadline passed, or HiGHS failed: the best found stands
            rounds_left = REPLAY_ROUNDS - round_index if stopped == "timeout" else 0
            break
        cost = evaluate(result.stages) if isinstance(result, PlanResult) else None
        spent.append(elapsed_s() - began)
        if cost is not None and not cost.feasible:
            over = trial
        else:
            below = trial
            if cost is not None and (best is None or cost.iteration_ms < best[1].iteration_ms):
                best = (result, cost)
        if below is None:  # every plan so far over: lower the stages over to what their replay admits
            trial = ratio_caps(cost, trial, given, lower=True)
            continue
        if cost is not None and not cost.feasible:  # over: down to what its replay admits, above the caps below
            trial = _within(ratio_caps(cost, trial, given, lower=True), below, over)
            if trial is None:  # its replay admits no more than the rows below: no plan between promises to fit
                break
            continue
        trial = _within(ratio_caps(cost, given, given, lower=False), below, over) if cost is not None else None
        if trial is None and best is None and not probed:  # none fits yet: the plan that needs least
            probed, best, trial = True, *_probe(least_memory, evaluate, below, over, given)
        if trial is None:  # halfway, where the bracket is still open
            if max(abs(b - a) for a, b in zip(below, over, strict=True)) <= CAPS_RESOLUTION:
                break
            trial = [(a + b) // 2 for a, b in zip(below, over, strict=True)]
    if best is None and not probed:
        best, _ = _probe(least_memory, evaluate, given, relaxed, given)
    if best is None:  # cut short by the deadline (or HiGHS): not that none fits, which the rounds did not show
        return NoFit(stopped or "infeasible", elapsed_s(), first.solve.solver)
    result, cost = best
    bound = first.solve.bound
    gap = None if bound is None else max(0.0, (cost.iteration_ms - bound) / cost.iteration_ms)
    solve_result = dataclasses.replace(first.solve, status="feasible", objective=cost.iteration_ms, gap=gap,
                                       wall_s=elapsed_s(), replay="searched", solves=solves, rounds_left=rounds_left,
                                       round_s=sum(spent) / len(spent) if rounds_left and spent else 0.0,
                                       timed_out=first.solve.timed_out or stopped == "timeout")
    return _judged(result, cost, solve_result)


def _probe(least_memory, evaluate, below: list[int], over: list[int], given: list[int]):
    """(the least-memory plan as (PlanResult, cost) where it fits, else None; the caps its replay admits within the
    bracket, _within)."""
    stages = least_memory()
    cost = evaluate(stages) if stages is not None else None
    if cost is None:
        return None, None
    fits = (PlanResult(stages, cost, None), cost) if cost.feasible else None
    return fits, _within(ratio_caps(cost, given, given, lower=False), below, over)


def _within(caps: list[int], below: list[int], over: list[int]) -> list[int] | None:
    """`caps` held within the bracket (`below`, `over`); None where they pass `below` by no more than
    CAPS_RESOLUTION on any stage (nothing new to solve) or reach `over` on every stage."""
    held = [max(low, min(cap, high)) for low, cap, high in zip(below, caps, over, strict=True)]
    if max(h - b for h, b in zip(held, below, strict=True)) <= CAPS_RESOLUTION or held == list(over):
        return None
    return held


def _judged(result: PlanResult, cost: PlanCost, solve) -> PlanResult:
    """`result`'s plan with its cost under the caps given (the solvers scored it under theirs)."""
    return PlanResult(stages=costmodel.with_predictions(result.stages, cost), cost=cost, solve=solve)


def ratio_caps(cost: PlanCost | None, caps: list[int], given: list[int], *, lower: bool) -> list[int]:
    """Caps under which each stage of `cost` (scored under the caps given) may allocate what it can hold: where
    the replay judges it, what its replayed ratio of reserved to allocated admits (the allocated limit
    (cap - buffers) x peak / replayed reserve, less the fit margin, and the cap whose divisor limit is that: the
    limit is linear in the cap less the buffers); where the divisor does, its cap given. With `lower`, only the
    stages over their cap move, each below `caps`; the others keep `caps`, as do all where no plan was found
    (`cost` None)."""
    if cost is None:
        return caps
    found = []
    for cap, limit, stage in zip(caps, given, cost.stages, strict=True):
        fitted = limit
        if stage.reserved_by == "replay" and stage.reserved_bytes:
            room = stage.cap_bytes - stage.workspace_bytes
            wanted = room * stage.peak_bytes / stage.reserved_bytes - costmodel.FIT_MARGIN_BYTES
            fitted = stage.workspace_bytes + int(room * wanted / max(1, stage.allocated_limit_bytes))
        if lower:
            fitted = cap if stage.fits_device else min(fitted, cap - CAPS_RESOLUTION)
        found.append(fitted)
    return found
