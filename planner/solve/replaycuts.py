"""The DP's plan held to the allocator replay by lazy cuts (issue 33): solve under the relaxed rows, replay the
plan, exclude each stage's exact set (its range and every layer's option) the replay put over, solve again,
until the plan fits.

Why the answer is optimal against the replay. The relaxed rows (replayfit.relaxed_caps) admit every stage the
replay admits: a replayed stage's reserved peak is never below its allocated peak (replayfit's text). A stage's
replay reads its own range, options and position alone (costmodel.evaluate scores each rank by itself: its
in-flight microbatches, its buffers, its cap), so a set the replay put over at stage s over [i, j) is over in
every plan: excluding it removes no plan that fits. Each solve is therefore the fastest plan of all the plans
that may fit, a lower bound on any plan that does; the first that fits is the fastest that fits ("optimal"),
and a solve that finds none (or none faster than a plan known to fit) proves there is none (or that one
optimal). The DP weighs each range's undominated sets of (recompute ms, kept bytes, extra bytes)
(dpsegments.front): under the rows a dominated set is never needed; under the replay, a set dominated only by
sets the replay put over is not weighed. That is what the proof ranges over: the sets the DP weighs.

A larger cap admits every stage a smaller one admits (the rows are monotone in the cap; the replay's reserved
peak is its own, released only where the cap stops it), so where the cuts close, a larger cap never returns a
slower plan. Where they do not close within MAX_ROUNDS solves or the time _Rounds gives them, the caller searches
caps (replayfit.search_caps) with the rest, and the last solve's time is the bound on any plan that fits.

How long the cuts keep the time (_Rounds). Every round that does not close proves progress: the DP never returns
an excluded set, so the stage over is a set not excluded before, and the bound never falls. So the cuts give way on
time alone: a round starts while the time left holds it and, after it, the search over caps' own rounds
(replayfit.REPLAY_ROUNDS, each a solve and a replay as a round is), each at what the rounds so far took on
average; the first round takes what is left, its plan being the search over caps' first solve as well. No share
of the time is fixed: Phi-4's cuts gave way at half of it (CUT_SHARE 0.5 before) with 4.8% of speed unfound.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from planner.cost import costmodel
from planner.cost.costmodel import PlanCost
from planner.schema import Profile, StagePlan, TrainSetup
from planner.solve import dpsolve
from planner.solve.deadline import Deadline, Expired
from planner.solve.dpsegments import Chain, Excluded
from planner.solve.highs import SolveResult
from planner.solve.replayfit import REPLAY_ROUNDS
from planner.solve.results import NoFit, PlanResult

MAX_ROUNDS = 64  # solves before the cuts give way to the search over caps (each one DP solve and one replay)
# the MILP's: a HiGHS solve each (70B on 4 stages: ~15 s), excluding one integer point of counts each
MILP_ROUNDS = 8


@dataclasses.dataclass
class Unclosed:
    """The cuts did not close: `bound_ms`, the last solve's time, no plan that fits is faster (None: no solve
    finished); `solves`, how many ran; `excluded`, the sets the replay put over; `fits`, a plan found that fits
    (a time-limited MILP solve's), with its cost."""

    bound_ms: float | None
    solves: int
    excluded: int
    fits: tuple[list[StagePlan], PlanCost] | None = None
    first: PlanResult | None = None  # the first solve's plan, under the relaxed rows (the search over caps' first)


def fastest_fitting(profile: Profile, setup: TrainSetup, relaxed: list[int], *,
                    evaluate: Callable[[list[StagePlan]], PlanCost], known: tuple[list[StagePlan], PlanCost] | None,
                    upper_bound_ms: float | None, deadline: Deadline,
                    max_rounds: int = MAX_ROUNDS) -> PlanResult | NoFit | Unclosed:
    """The fastest plan the replay admits under `setup`'s caps, proven (the module's text), or Unclosed.
    `known`: a plan that fits, with its cost (returned, "optimal", where no faster plan fits); `upper_bound_ms`:
    the time of a plan that fits, where none is given."""
    under = setup.model_copy(update={"pipeline": setup.pipeline.model_copy(update={"mem_caps_bytes": relaxed})})
    outer, rounds = deadline, _Rounds(deadline, after=REPLAY_ROUNDS)
    chain = Chain(profile, under)
    bar = known[1].iteration_ms if known is not None else upper_bound_ms
    excluded: Excluded = {}
    bound, first = None, None
    for solves in range(1, max_rounds + 1):
        deadline = rounds.next()
        try:
            if deadline is None:  # the next round would leave the search over caps less than its rounds
                raise Expired
            found = dpsolve.fastest_plan(profile, under, upper_bound_ms=bar, deadline=deadline, excluded=excluded,
                                         chain=chain)
        except Expired:
            return Unclosed(bound, solves - 1, sum(map(len, excluded.values())), first=first)
        if found is None:  # no plan that may fit is faster than the one known, or none at all
            if known is None:
                return NoFit("infeasible", outer.elapsed_s(), "dp")
            stages, cost = known
            return _result(stages, cost, cost.iteration_ms, solves, outer, excluded)
        stages, bound = found
        cost = evaluate(stages)
        if first is None:  # the relaxed rows' own plan, "optimal" for them: the search over caps need not solve again
            first = PlanResult(stages, cost, SolveResult("optimal", bound, 0.0, outer.elapsed_s(), solver="dp",
                                                         bound=bound))
        if cost.feasible:
            return _result(stages, cost, bound, solves, outer, excluded)
        rounds.ended()
        for s, (stage, stage_cost) in enumerate(zip(stages, cost.stages, strict=True)):
            if not stage_cost.fits:
                start, end, mask = _key(chain, stage)
                excluded[(s, start, end)] = excluded.get((s, start, end), frozenset()) | {mask}
    return Unclosed(bound, max_rounds, sum(map(len, excluded.values())), first=first)


@dataclasses.dataclass
class _Rounds:
    """The cuts' clock (the module's text): `after`, the rounds the caller may still run once the cuts give way
    (the search over caps'; 0 where nothing follows them)."""

    outer: Deadline
    after: int
    began: float = 0.0
    taken: list[float] = dataclasses.field(default_factory=list)  # each round's seconds

    def next(self) -> Deadline | None:
        """The next round's deadline: what is left less the rounds after, at the rounds' mean so far; None where
        that does not hold one more round."""
        self.began, left = self.outer.elapsed_s(), self.outer.remaining_s()
        if left is None or not self.taken:
            return Deadline(left, clock=self.outer.clock)
        mean = sum(self.taken) / len(self.taken)
        return Deadline(left - self.after * mean, clock=self.outer.clock) if left >= (1 + self.after) * mean else None

    def ended(self) -> None:
        self.taken.append(self.outer.elapsed_s() - self.began)


def _key(chain: Chain, stage: StagePlan) -> tuple[int, int, int]:
    """(start, end, mask) of a stage as dpsegments reads it: its layer range and every layer's option index,
    chain.bits bits a layer from the range's first."""
    start = next(m for m, layer in enumerate(chain.layers) if layer.name == stage.layers[0])
    end = start + len(stage.layers)
    options = costmodel.option_indices(stage, chain.layers[start:end])
    return start, end, sum(option << (offset * chain.bits) for offset, option in enumerate(options))


def _result(stages: list[StagePlan], cost: PlanCost, bound_ms: float, solves: int, deadline: Deadline,
            excluded: Excluded) -> PlanResult:
    """"optimal" against the replay: "relaxed" where the relaxed rows' first solve proved it, "cut" after cuts."""
    gap = max(0.0, (cost.iteration_ms - bound_ms) / cost.iteration_ms)
    solve = SolveResult("optimal", cost.iteration_ms, gap, deadline.elapsed_s(), solver="dp", bound=bound_ms,
                        replay="cut" if excluded else "relaxed", solves=solves)
    return PlanResult(stages=costmodel.with_predictions(stages, cost), cost=cost, solve=solve)


def tightened(found: PlanResult | NoFit, unclosed: Unclosed | None) -> PlanResult | NoFit:
    """The search over caps' answer with the cuts' bound where it is the higher (each cut solve's time bounds any
    plan that fits, and rises with the sets excluded), and the cut solves counted; the cuts' plan that fits where
    it is the faster."""
    if unclosed is None:
        return found
    if unclosed.fits is not None and (not isinstance(found, PlanResult) or unclosed.fits[1].iteration_ms
                                      < found.cost.iteration_ms):
        stages, cost = unclosed.fits
        wall_s = found.solve.wall_s if isinstance(found, PlanResult) else found.wall_s
        solve = SolveResult("feasible", cost.iteration_ms, None, wall_s, solver="milp", replay="searched")
        found = PlanResult(stages=costmodel.with_predictions(stages, cost), cost=cost, solve=solve)
    if not isinstance(found, PlanResult) or found.solve.replay != "searched":
        return found
    bound = max((b for b in (found.solve.bound, unclosed.bound_ms) if b is not None), default=None)
    gap = None if bound is None else max(0.0, (found.cost.iteration_ms - bound) / found.cost.iteration_ms)
    return dataclasses.replace(found, solve=dataclasses.replace(found.solve, bound=bound, gap=gap,
                                                                solves=found.solve.solves + unclosed.solves
                                                                - (unclosed.first is not None)))


def milp_fastest_fitting(profile: Profile, setup: TrainSetup, relaxed: list[int], *,
                         evaluate: Callable[[list[StagePlan]], PlanCost], over_bytes: Callable[[object], int],
                         known: tuple[list[StagePlan], PlanCost] | None, upper_bound_ms: float | None,
                         deadline: Deadline, mip_gap: float, threads, log: bool, max_rounds: int = MILP_ROUNDS,
                         after: int = REPLAY_ROUNDS) -> PlanResult | NoFit | Unclosed:
    """The MILP's twin of fastest_fitting (one stage per rank): each stage the replay put over is excluded as its
    exact integer point (its boundaries' prefix counts and its option counts per run: milp.extract_plan places a
    run's options in one order, so the point is the plan), a no-good row, and HiGHS solves again. "optimal" where
    HiGHS proves its plan (within mip_gap) and that plan fits; a time-limited solve (_Rounds' time) ends the
    cuts, its plan, where it fits, a candidate (Unclosed.fits). `over_bytes`: how far the MILP's plan passes the
    rows (milp.solve_within_caps); `after`: the rounds its caller runs once the cuts give way (_Rounds)."""
    from planner.solve import milp

    outer, rounds = deadline, _Rounds(deadline, after=after)

    under = setup.model_copy(update={"pipeline": setup.pipeline.model_copy(update={"mem_caps_bytes": relaxed})})
    bar = known[1].iteration_ms if known is not None else upper_bound_ms
    try:
        problem = milp.build_problem(profile, under, upper_bound_ms=bar, deadline=deadline)
    except Expired:
        return Unclosed(None, 0, 0)
    start = known[0] if known is not None else None
    bound, cuts = None, 0
    for solves in range(1, max_rounds + 1):
        deadline = rounds.next()
        if deadline is None:  # the next round would leave the search over caps less than its rounds
            return Unclosed(bound, solves - 1, cuts)
        result = milp.solve_within_caps(problem, over_bytes, deadline=deadline, mip_gap=mip_gap, threads=threads,
                                        log=log, start=start)
        if result.status in ("timeout", "error"):
            return Unclosed(bound, solves, cuts)
        if result.status == "infeasible":  # none that may fit is faster than the known plan, or none at all
            if known is None:
                return NoFit("infeasible", outer.elapsed_s(), "milp")
            return _proved(*known, known[1].iteration_ms, "optimal", solves, cuts, outer, "milp")
        bound = max((b for b in (bound, result.bound) if b is not None), default=None)
        stages = milp.extract_plan(problem)
        cost = evaluate(stages)
        if cost.feasible and result.status == "optimal":
            return _proved(stages, cost, result.bound, result.status, solves, cuts, outer, "milp")
        if result.status != "optimal":  # time-limited: no bound from it; its plan a candidate where it fits
            return Unclosed(bound, solves, cuts, (stages, cost) if cost.feasible else None)
        rounds.ended()
        for s, stage_cost in enumerate(cost.stages):
            if not stage_cost.fits:
                _no_good(problem, s, cuts)
                cuts += 1
    return Unclosed(bound, max_rounds, cuts)


def _no_good(problem, s: int, cut: int) -> None:
    """A row that excludes stage s's point of the solved problem: its free prefix counts and option counts, at
    least one of them one below or one above its value (two binaries each, big-M by the variable's bounds)."""
    import pulp

    runs = range(len(problem.runs))
    free = [problem.y[s - 1, g] for g in runs if s > 0] + [problem.y[s, g] for g in runs]
    free += [problem.r[s, g, o] for g in runs for o in problem.order[g]]
    moves = []
    for k, var in enumerate(v for v in free if isinstance(v, pulp.LpVariable)):
        value, low, high = round(var.value()), var.lowBound or 0, var.upBound
        if value > low:
            below = pulp.LpVariable(f"cut_{cut}_{k}_lo", cat="Binary")
            problem.lp += var <= value - 1 + (high - value + 1) * (1 - below), f"cut_{cut}_{k}_lo"
            moves.append(below)
        if value < high:
            above = pulp.LpVariable(f"cut_{cut}_{k}_hi", cat="Binary")
            problem.lp += var >= value + 1 - (value + 1 - low) * (1 - above), f"cut_{cut}_{k}_hi"
            moves.append(above)
    problem.lp += pulp.lpSum(moves) >= 1, f"cut_{cut}"


def _proved(stages, cost: PlanCost, bound_ms: float | None, status: str, solves: int, cuts: int, deadline: Deadline,
            solver: str) -> PlanResult:
    """The MILP's plan that fits: HiGHS's status and bound (its gap against evaluate's time)."""
    gap = None if bound_ms is None else max(0.0, (cost.iteration_ms - bound_ms) / cost.iteration_ms)
    solve = SolveResult(status, cost.iteration_ms, gap, deadline.elapsed_s(), solver=solver, bound=bound_ms,
                        replay="cut" if cuts else "relaxed", solves=solves)
    return PlanResult(stages=costmodel.with_predictions(stages, cost), cost=cost, solve=solve)


def moments_fastest_fitting(profile, setup, *, deadline, mip_gap: float, threads, log: bool, upper_bound_ms, start):
    """The MILP's plan held to evaluate's FSDP2 moments by cuts (milp_moments' text; search._plan_milp where
    dpmoments.applies): "optimal" where the cuts close, else the fastest plan found that fits ("feasible"),
    or the start, or NoFit("timeout")."""
    import dataclasses


    def evaluate(stages):
        return costmodel.evaluate(stages, profile, setup)

    known = None
    if start is not None:
        cost = evaluate(start)
        known = (start, cost) if cost.feasible else None
    found = milp_fastest_fitting(profile, setup, list(setup.pipeline.mem_caps_bytes), evaluate=evaluate,
                                            over_bytes=lambda problem: 0, known=known, upper_bound_ms=upper_bound_ms,
                                            deadline=deadline, mip_gap=mip_gap, threads=threads, log=log,
                                            max_rounds=MAX_ROUNDS, after=0)
    if isinstance(found, PlanResult):  # no replay here: the cuts are the moments'
        return dataclasses.replace(found, solve=dataclasses.replace(found.solve, replay=None))
    if isinstance(found, NoFit):
        return found
    fits = found.fits or known
    if fits is None:
        return NoFit("timeout", deadline.elapsed_s(), "milp")
    stages, cost = fits
    solve = SolveResult("feasible", cost.iteration_ms, None, deadline.elapsed_s(), solver="milp", bound=found.bound_ms)
    return PlanResult(stages=costmodel.with_predictions(stages, cost), cost=cost, solve=solve)
