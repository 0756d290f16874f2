"""The search: one entry point that plans a setup with the solver the user picked (or the
one whose structure fits), re-scores the plan with costmodel.evaluate(), and says why no
plan fits as a value, not an exception.

Solvers (`ckplan solve --solver`):
    dp    planner/solve/dpsolve.py: exact dynamic programme over stage boundaries (contiguous
          stages, one chunk of layers per rank: 1F1B and GPipe)
    milp  planner/solve/milp.py: the mixed-integer program on HiGHS (pulp's highspy API), the
          formulation for plan spaces where the DP's structure breaks
    auto  the DP where its structure holds, else the MILP

Both read the same cost description (costmodel.TERMS); the tests hold them to each other
and to brute force. After every solve the plan is re-scored by evaluate() and must agree
with the solver's objective. Both are exact for their rows (each stage's allocated peak under
the cap less the buffers and the divisor's reserve); where evaluate() judges by the allocator
replay instead, planner/solve/replayfit.py solves under the caps that make the rows agree with it
and says what that proves.
"""

from __future__ import annotations

import math
from typing import Literal

from planner.cost import allocator, costmodel
from planner.cost.costmodel import PlanCost
from planner.errors import UserError
from planner.schema import Profile, StagePlan, TrainSetup
from planner.solve import (
    baselines,
    dpmoments,
    dpsolve,
    dpwindow,
    incumbent,
    milp,
    replaycuts,
    replayfit,
    staticneed,
)
from planner.solve.deadline import Deadline, Expired
from planner.solve.milp import SolveResult
from planner.solve.results import NoFit, PlanResult, Shortfall, SolverMismatch  # noqa: F401 (the search's answers, named here too)

Solver = Literal["auto", "dp", "milp"]
SOLVERS = ("auto", "dp", "milp")
HEURISTIC_RUNS_PER_STAGE = 2  # more runs of distinct layers per stage: start the MILP from incumbent.py


def pick_solver(setup: TrainSetup, solver: Solver = "auto", profile: Profile | None = None) -> Literal["dp", "milp"]:
    """The DP where its structure holds (contiguous stages, one chunk per rank, no host cap on
    offloaded activations), the MILP otherwise; a named solver as asked (UserError: the DP
    where it cannot hold)."""
    host_bound = profile is not None and offload_meets_host_cap(profile, setup)
    if solver == "dp" and setup.pipeline.chunks > 1:
        raise UserError(f"--solver dp plans schedules of one stage per rank (1F1B, GPipe), whose stages' in-flight "
                        f"microbatches follow from their position; {setup.pipeline.schedule} gives each rank "
                        f"{setup.pipeline.chunks} stages, whose memory depends on the order the rank runs them in: "
                        "use --solver milp or auto")
    if solver == "dp" and host_bound:
        raise UserError("--solver dp cannot weigh activations offloaded to the host against --host-mem (a stage's "
                        "host bytes grow with its in-flight microbatches); use --solver milp or auto")
    if solver != "auto":
        return solver
    return "dp" if setup.pipeline.chunks == 1 and not host_bound else "milp"


def offload_meets_host_cap(profile: Profile, setup: TrainSetup) -> bool:
    """Whether a host cap is set and some layer may offload activations to that host."""
    if costmodel.host_cap_bytes(setup.data_parallel, pipeline=setup.pipeline) is None:
        return False
    ctx = costmodel.Context(profile, setup)
    return any(layer.options[o].host_bytes for layer in costmodel.layer_costs(profile)
               for o in costmodel.useful_options(layer, ctx))


def plan(
    profile: Profile,
    setup: TrainSetup,
    *,
    solver: Solver = "auto",
    time_limit_s: float | None = None,
    mip_gap: float = 1e-4,
    threads: int | None = None,
    log: bool = False,
    upper_bound_ms: float | None = None,
    start: list[StagePlan] | None = None,
    deadline: Deadline | None = None,
    baselines_scored: bool = False,
) -> PlanResult | NoFit:
    """The fastest plan that fits, re-scored by costmodel.evaluate(), or NoFit. `start`: a
    feasible plan (e.g. the best baseline) to begin from and to fall back on; `upper_bound_ms`:
    the iteration time of a feasible plan. mip_gap, threads and log concern the MILP only.
    `deadline` (default: time_limit_s from now) bounds everything; past it the best plan
    known is returned as "feasible" with its gap. `baselines_scored`: the caller scored the
    baselines already and none fits (or gave the best as `start`): they are not scored again.

    The solvers bound each stage's allocated peak under the cap less the divisor's reserve
    (costmodel.limit_bytes). Where evaluate() judges by the caching allocator's replay instead
    (planner/cost/reserve.py), replayfit.search_caps solves under rows that admit every plan the
    replay admits, then under caps between; what that proves is replayfit's text, and the
    result's solve.replay says which held. With no start, a setup where no split holds some stage's
    static bytes and leanest activations (static_refusal) is "infeasible" before any solve. Where the runtime's
    offload is Transformer Engine's window, the fastest window evaluate admits replaces a slower plan (dpwindow.with_window)."""
    deadline = deadline or Deadline(time_limit_s)
    if start is None and static_refusal(profile, setup, deadline) is not None:  # no split holds it, whatever it recomputes
        return NoFit("infeasible", deadline.elapsed_s(), pick_solver(setup, solver, profile))
    given = None  # the start, where it fits: the answer if nothing found beats it
    relaxed = replayfit.relaxed_caps(profile, setup)
    if start is not None:
        start_cost = costmodel.evaluate(start, profile, setup)
        given = (start, start_cost) if start_cost.feasible else None
        # a start the replay admits meets the relaxed rows (replayfit); else only one within the rows as given
        if not (in_rows(start_cost) or (relaxed is not None and start_cost.feasible)):
            start, upper_bound_ms = None, None
    kwargs = dict(solver=solver, mip_gap=mip_gap, threads=threads, log=log, deadline=deadline,
                  baselines_scored=baselines_scored)
    if relaxed is None:  # the rows are evaluate's verdict
        found = _plan_once(profile, setup, upper_bound_ms=upper_bound_ms, start=start, **kwargs)
    else:
        found = None
        if pick_solver(setup, solver, profile) == "dp":  # lazy cuts: a proof, where they close (replaycuts)
            found = replaycuts.fastest_fitting(
                profile, setup, relaxed, evaluate=lambda stages: costmodel.evaluate(stages, profile, setup),
                known=given, upper_bound_ms=upper_bound_ms, deadline=deadline)
        elif setup.pipeline.chunks == 1:  # the MILP's twin: a rank's replay reads its one stage alone
            found = replaycuts.milp_fastest_fitting(
                profile, setup, relaxed, evaluate=lambda stages: costmodel.evaluate(stages, profile, setup),
                over_bytes=lambda problem: _over_caps_bytes(problem, profile, setup), known=given,
                upper_bound_ms=upper_bound_ms, deadline=deadline, mip_gap=mip_gap, threads=threads, log=log)
        if found is None or isinstance(found, replaycuts.Unclosed):  # no proof: the search over caps
            first = found.first if found is not None else None
            found = replaycuts.tightened(_search_caps(profile, setup, relaxed, given, start, upper_bound_ms, kwargs,
                                                      first), found)
    found = dpwindow.with_window(profile, setup, found, deadline, upper_bound_ms, relaxed)
    if given is not None and (not isinstance(found, PlanResult) or not found.cost.feasible
                              or given[1].iteration_ms < found.cost.iteration_ms):
        timed_out = found.status == "timeout" if isinstance(found, NoFit) else found.solve.timed_out
        solve = SolveResult("feasible", given[1].iteration_ms, None, deadline.elapsed_s(),
                            solver=pick_solver(setup, solver, profile), timed_out=timed_out)
        return PlanResult(stages=costmodel.with_predictions(given[0], given[1]), cost=given[1], solve=solve)
    return found


def _search_caps(profile: Profile, setup: TrainSetup, relaxed: list[int], given, start, upper_bound_ms,
                 kwargs: dict, first: PlanResult | None) -> PlanResult | NoFit:
    """replayfit.search_caps with plan()'s solves; `first`, the relaxed rows' solve where the cuts made it."""
    deadline = kwargs["deadline"]

    def solve_under(caps: list[int], bar: float | None, first: bool) -> PlanResult | NoFit:
        under = setup.model_copy(update={"pipeline": setup.pipeline.model_copy(update={"mem_caps_bytes": caps})})
        return _plan_once(profile, under, upper_bound_ms=upper_bound_ms if first else bar,
                          start=start if first else None, **kwargs)

    return replayfit.search_caps(
        setup, relaxed, solve_under, evaluate=lambda stages: costmodel.evaluate(stages, profile, setup),
        least_memory=lambda: least_memory_plan(profile, setup, solver=kwargs["solver"], deadline=deadline),
        known_ms=given[1].iteration_ms if given else upper_bound_ms, elapsed_s=deadline.elapsed_s, first=first)


def in_rows(cost: PlanCost) -> bool:
    """The plan meets the solvers' own rows (each stage's allocated peak under limit_bytes, the
    host cap): a start or a bound they can reach. Whether it fits is cost.feasible, the replay's
    verdict where the replay runs."""
    return all(stage.fits_allocated and stage.fits_host for stage in cost.stages)


def _plan_once(profile: Profile, setup: TrainSetup, *, solver: Solver, mip_gap: float, threads, log: bool,
               upper_bound_ms, start, deadline: Deadline, baselines_scored: bool) -> PlanResult | NoFit:
    """plan() under one set of caps: the solvers' answer, re-scored; its cost may fail the
    replay's verdict (plan() then lowers the caps)."""
    if baselines_scored and upper_bound_ms is None:
        upper_bound_ms = math.inf  # no bound, and no second scoring of the baselines for one
    if deadline.expired():  # the baselines took it all: the best of them, or nothing
        return _cut_short(profile, setup, *_feasible_start(profile, setup, upper_bound_ms, start, deadline), deadline,
                          pick_solver(setup, solver, profile))
    if pick_solver(setup, solver, profile) == "milp":
        found = _plan_milp(profile, setup, deadline=deadline, mip_gap=mip_gap, threads=threads, log=log,
                           upper_bound_ms=upper_bound_ms, start=start)
    else:
        found = _plan_dp(profile, setup, deadline=deadline, upper_bound_ms=upper_bound_ms, start=start)
    return found


def _plan_dp(profile: Profile, setup: TrainSetup, *, deadline: Deadline, upper_bound_ms, start) -> PlanResult | NoFit:
    start, start_cost = _feasible_start(profile, setup, upper_bound_ms, start, deadline)
    if start_cost is not None:
        upper_bound_ms = min(upper_bound_ms or math.inf, start_cost.iteration_ms)
    try:
        found = dpsolve.fastest_plan(profile, setup, upper_bound_ms=upper_bound_ms, deadline=deadline)
    except Expired as stop:
        if stop.found is not None:  # a first pass beat the start
            start = stop.found[0]
            start_cost = costmodel.evaluate(start, profile, setup)
        return _cut_short(profile, setup, start, start_cost, deadline, "dp")
    if found is None:
        if start is not None:
            raise SolverMismatch("the dynamic programme found no plan as fast as the feasible start plan")
        return NoFit("infeasible", deadline.elapsed_s(), "dp")
    stages, objective_ms = found
    return _checked(stages, profile, setup,
                    SolveResult("optimal", objective_ms, 0.0, deadline.elapsed_s(), solver="dp", bound=objective_ms))


def _feasible_start(profile: Profile, setup: TrainSetup, upper_bound_ms, start, deadline: Deadline | None = None):
    """(start, its cost) if the start fits, else (None, None); with neither a start nor a
    bound given, the best feasible baseline (cheap) is the start."""
    if start is None and upper_bound_ms is None:
        start = best_baseline(profile, setup, deadline)
    cost = costmodel.evaluate(start, profile, setup) if start is not None else None
    return (start, cost) if cost is not None and in_rows(cost) else (None, None)


def _cut_short(profile: Profile, setup: TrainSetup, start, start_cost, deadline: Deadline,
               solver: str, status: Literal["timeout", "error"] = "timeout") -> PlanResult | NoFit:
    """The deadline passed (or HiGHS failed): the best plan known (`start`), "feasible", its gap
    measured against a proven lower bound on any plan's time; `status` without one."""
    if start is None:
        return NoFit(status, deadline.elapsed_s(), solver)
    timed_out = status == "timeout"
    if setup.pipeline.chunks > 1:  # no proven bound on a simulated schedule's time
        solve = SolveResult("feasible", start_cost.iteration_ms, None, deadline.elapsed_s(), solver=solver,
                            timed_out=timed_out)
        return PlanResult(stages=costmodel.with_predictions(start, start_cost), cost=start_cost, solve=solve)
    bound_ms = dpsolve.lower_bound_ms(profile, setup)
    gap = max(0.0, (start_cost.iteration_ms - bound_ms) / start_cost.iteration_ms)
    solve = SolveResult("feasible", start_cost.iteration_ms, gap, deadline.elapsed_s(), solver=solver, bound=bound_ms,
                        timed_out=timed_out)
    return PlanResult(stages=costmodel.with_predictions(start, start_cost), cost=start_cost, solve=solve)


def best_baseline(profile: Profile, setup: TrainSetup, deadline: Deadline | None = None) -> list[StagePlan] | None:
    feasible = [b for b in baselines.all_baselines(profile, setup, deadline or Deadline(None)) if b.feasible]
    return min(feasible, key=lambda b: b.iteration_ms).stages if feasible else None


def _checked(stages: list[StagePlan], profile: Profile, setup: TrainSetup, result: SolveResult) -> PlanResult:
    """Re-score the plan with costmodel.evaluate(): it must fit and agree with the objective."""
    cost = costmodel.evaluate(stages, profile, setup)
    size = max(1.0, abs(result.objective))
    # an incumbent HiGHS did not prove optimal may sit above its plan's time by its gap (_checked_chunked)
    slack = 0.0 if result.status != "feasible" else float("inf") if result.gap is None else result.gap * size
    if cost.iteration_ms - result.objective > 1e-6 * size or result.objective - cost.iteration_ms > 1e-6 * size + slack:
        raise SolverMismatch(
            f"plan re-evaluates to {cost.iteration_ms!r} ms but the solver's objective is {result.objective!r}"
        )
    _check_solver_rows(cost, "stages")
    return PlanResult(stages=costmodel.with_predictions(stages, cost), cost=cost, solve=result)


def _check_solver_rows(cost: costmodel.PlanCost, what: str) -> None:
    """The solvers' rows must hold under evaluate() (the allocated peak under limit_bytes, the
    host cap); the replay's verdict is plan()'s to act on."""
    over = [s for s, c in enumerate(cost.stages) if not (c.fits_allocated and c.fits_host)]
    if over:
        raise SolverMismatch(f"solver plan exceeds the caps of {what} {over} under evaluate()")


def _plan_milp(profile: Profile, setup: TrainSetup, *, deadline: Deadline, mip_gap: float, threads, log,
               upper_bound_ms, start) -> PlanResult | NoFit:
    """Build, solve on HiGHS, extract and cross-check; past the deadline (or where HiGHS fails),
    the start plan."""
    if dpmoments.applies(profile, setup):  # FSDP2's own moments beside a pipeline: relaxed rows and cuts
        return replaycuts.moments_fastest_fitting(profile, setup, deadline=deadline, mip_gap=mip_gap, threads=threads,
                                            log=log, upper_bound_ms=upper_bound_ms, start=start)
    try:
        upper_bound_ms, start = _better_start(profile, setup, upper_bound_ms, start, deadline)
        if start is None and setup.pipeline.chunks > 1:
            start = _chunked_start(profile, setup)
        problem = milp.build_problem(profile, setup, upper_bound_ms=upper_bound_ms, deadline=deadline)
        deadline.check()
    except Expired:
        return _cut_short(profile, setup, *_feasible_start(profile, setup, upper_bound_ms, start, deadline), deadline,
                          "milp")
    milp_start = costmodel.pipeline_stages(start, setup) if start is not None else None
    result = milp.solve_within_caps(problem, lambda solved: _over_caps_bytes(solved, profile, setup), deadline=deadline,
                                    mip_gap=mip_gap, threads=threads, log=log, start=milp_start)
    if result.status in ("timeout", "error"):  # the start, if there is one, is still the best plan known
        return _cut_short(profile, setup, *_feasible_start(profile, setup, upper_bound_ms, start, deadline), deadline,
                          "milp", status=result.status)
    if result.status == "infeasible":
        return NoFit(result.status, deadline.elapsed_s(), "milp")
    # HiGHS's "feasible" once the deadline has passed is its incumbent at the time limit, not its answer: a search
    # that gave this solve a share of its time solves it again (searchqueue.py), never ranks the incumbent as final
    result = SolveResult(result.status, result.objective, result.gap, deadline.elapsed_s(), solver="milp",
                         bound=result.bound, timed_out=result.status == "feasible" and deadline.expired())
    if setup.pipeline.chunks > 1:
        return _checked_chunked(milp.extract_plan(problem), profile, setup, result, start, mip_gap=mip_gap)
    return _checked(milp.extract_plan(problem), profile, setup, result)


def _over_caps_bytes(problem, profile: Profile, setup: TrainSetup) -> int:
    """How far the MILP's plan passes the solvers' rows under evaluate() (0 where it meets them)."""
    cost = costmodel.evaluate(milp.extract_plan(problem), profile, setup)
    return max(max(0, c.peak_bytes + costmodel.FIT_MARGIN_BYTES - c.allocated_limit_bytes,
                   0 if c.fits_host else c.host_bytes + costmodel.FIT_MARGIN_BYTES - c.host_cap_bytes)
               for c in cost.stages)


def _checked_chunked(ranks: list[StagePlan], profile: Profile, setup: TrainSetup, result: SolveResult,
                     start: list[StagePlan] | None, *, mip_gap: float = 0.0) -> PlanResult:
    """A chunked schedule's MILP minimises a linear time (milp._chunked_time), while the plan
    reports its simulated schedule's (evaluate): the objective is held to the linear time
    re-scored (costmodel.chunked_linear_ms), the plan must fit, and the faster of it and the start
    under the simulated time is kept, "feasible", its objective the time it reports (no bound
    on that time is proven)."""
    linear = costmodel.chunked_linear_ms(ranks, profile, setup)
    size = max(1.0, abs(result.objective))
    # The MILP's time may sit above the plan's own linear time by up to the gap HiGHS stops at
    # (seen: 2.1e-5 of the objective above it, at mip_gap 1e-4, search over a tiny LLaMA with
    # interleaved-1F1B), never below it by more than its row tolerance: that would be a row the
    # MILP undercounts. A plan HiGHS did not prove optimal (its incumbent at a time limit) may carry
    # slack in its time variables (τ above every stage's time): its objective sits above its linear
    # time by up to its own gap (any plan's linear time is at least the bound), by an unproven amount
    # where HiGHS gives no gap (seen: 2.0% above, a search's share of its time on CI)
    allowed = mip_gap
    if result.status == "feasible":
        allowed = float("inf") if result.gap is None else max(mip_gap, result.gap)
    if linear - result.objective > 1e-6 * size or result.objective - linear > (allowed + 1e-6) * size:
        raise SolverMismatch(f"plan re-evaluates to a linear time of {linear!r} ms but the solver's objective is "
                             f"{result.objective!r} ({result.status}, gap {result.gap!r})")
    cost = costmodel.evaluate(ranks, profile, setup)
    _check_solver_rows(cost, "ranks")
    if start is not None:
        start_cost = costmodel.evaluate(start, profile, setup)
        if in_rows(start_cost) and start_cost.iteration_ms < cost.iteration_ms:
            ranks, cost = start, start_cost
    solve = SolveResult("feasible", cost.iteration_ms, None, result.wall_s, solver="milp", timed_out=result.timed_out)
    return PlanResult(stages=costmodel.with_predictions(ranks, cost), cost=cost, solve=solve)


def _chunked_start(profile: Profile, setup: TrainSetup) -> list[StagePlan] | None:
    """A chunked schedule's starting plan for the MILP where no baseline was given and it fits:
    the layers split evenly over the P·V stages, every layer recomputed whole (on 405B under ZBV,
    HiGHS found no plan in 300 s without one); as ranks."""
    order = costmodel.schedule_of(setup)
    names = [layer.name for layer in profile.layers]
    cuts = [round(k * len(names) / order.num_stages) for k in range(order.num_stages + 1)]
    stages = [StagePlan(index=k, layers=names[cuts[k]:cuts[k + 1]], checkpointed=names[cuts[k]:cuts[k + 1]])
              for k in range(order.num_stages)]
    if not all(stage.layers for stage in stages):
        return None
    ranks = costmodel.ranks_of(stages, setup)
    return ranks if in_rows(costmodel.evaluate(ranks, profile, setup)) else None


def _better_start(profile: Profile, setup: TrainSetup, upper_bound_ms, start, deadline: Deadline):
    """With many distinct layers, the MILP's bounds are only as tight as its starting plan:
    take the heuristic's plan when it beats the one given (within 0.05% of the optimum on
    heterogeneous 128x16, against 15% for the best baseline). Runs of identical layers
    keep the MILP small without it."""
    if (setup.pipeline.chunks > 1  # the heuristic grows one stage per rank
            or len(milp.problem_runs(profile, setup)) <= HEURISTIC_RUNS_PER_STAGE * setup.pipeline.stages):
        return upper_bound_ms, start
    found = incumbent.heuristic_plan(profile, setup, upper_bound_ms=upper_bound_ms, deadline=deadline)
    if found is None:
        return upper_bound_ms, start
    cost = costmodel.evaluate(found, profile, setup)
    if in_rows(cost) and (upper_bound_ms is None or cost.iteration_ms < upper_bound_ms):
        return cost.iteration_ms, found
    return upper_bound_ms, start


# ---------------------------------------------------------------- why no plan fits


def min_cap_scale(profile: Profile, setup: TrainSetup, *, time_limit_s: float | None = 30.0,
                  solver: Solver = "auto", deadline: Deadline | None = None) -> tuple[float, PlanCost] | None:
    """The smallest factor by which every device cap can be multiplied so that some plan fits
    the solvers' rows (host caps as they are), and the cost of that plan. None when the deadline
    (default: time_limit_s from now) passed first, or when no device cap would do (the host's)."""
    deadline = deadline or Deadline(time_limit_s)
    stages = least_memory_plan(profile, setup, solver=solver, deadline=deadline)
    if stages is None:
        return None
    cost = costmodel.evaluate(stages, profile, setup)
    if not all(stage.fits_host for stage in cost.stages):
        return None
    return max(c.pressure for c in cost.stages), cost


def least_memory_plan(profile: Profile, setup: TrainSetup, *, solver: Solver = "auto",
                      deadline: Deadline) -> list[StagePlan] | None:
    """The plan whose busiest stage's allocated peak is least against its row (the DP's exact least-memory
    plan; the MILP's memory objective); None when the deadline passed first or HiGHS found none."""
    if pick_solver(setup, solver, profile) == "milp":
        problem = milp.build_problem(profile, setup, objective="memory")
        result = milp.solve(problem, time_limit_s=deadline.remaining_s())
        if result.status in ("infeasible", "timeout", "error"):
            return None
        return milp.extract_plan(problem)
    try:
        known = baselines.full_checkpointing(profile, setup)
        return dpsolve.least_memory_plan(profile, setup, known=known, deadline=deadline)
    except Expired:
        return None


def least_host_bytes(profile: Profile, setup: TrainSetup) -> float:
    """The least any plan can put on the busiest rank's host: the optimizer's host bytes split
    as evenly as contiguous stages allow (the exact linear partition of baselines)."""
    ctx = costmodel.Context(profile, setup)
    per_layer = [costmodel.layer_value("host", layer, False, ctx) for layer in costmodel.layer_costs(profile)]
    sizes = baselines.balanced_split(per_layer, setup.pipeline.stages)
    bounds = [sum(sizes[:s]) for s in range(setup.pipeline.stages + 1)]
    return max(sum(per_layer[bounds[s]:bounds[s + 1]]) for s in range(setup.pipeline.stages))


def why_not(profile: Profile, setup: TrainSetup, *, deadline: Deadline, solver: Solver = "auto",
            least_memory: bool = True) -> list[Shortfall] | None:
    """What keeps every plan from fitting: the host share (if even the evenest split of the
    offloaded optimizer exceeds it) and the device cap of the stage that needs most in the
    plan that needs least (with its need broken into the cost model's terms; a search of its
    own, skipped without `least_memory`). [] when each cap alone could be met (only together
    they cannot) or the device was not searched; None when the deadline passed first."""
    found = []
    host_cap = costmodel.host_cap_bytes(setup.data_parallel, pipeline=setup.pipeline)
    if host_cap is not None:
        need = least_host_bytes(profile, setup)
        if need + costmodel.FIT_MARGIN_BYTES > host_cap:
            found.append(Shortfall("host", 0, int(math.ceil(need)) + costmodel.FIT_MARGIN_BYTES, host_cap,
                                   {"offloaded optimizer": int(math.ceil(need))}))
            return found
    refusal = static_refusal(profile, setup, deadline)
    if refusal is not None:  # no split holds it, whatever it recomputes: no search needed to say so
        found.append(Shortfall("device", refusal.stage, refusal.need_bytes, refusal.limit_bytes, refusal.terms,
                               least=True))
        return found
    if not least_memory:
        return found
    least = min_cap_scale(profile, setup, solver=solver, deadline=deadline)
    if least is None:
        return None if deadline.expired() else found
    _, cost = least
    if all(stage.fits_device for stage in cost.stages):  # evaluate's verdict: the replay's where it runs
        return found
    fragmentation = costmodel.fragmentation(setup.pipeline, device_type=profile.device.type)
    needs = [cap_needed_bytes(stage, fragmentation) for stage in cost.stages]
    s = max(range(setup.pipeline.stages), key=lambda i: needs[i] / max(1, cost.stages[i].cap_bytes))
    stage = cost.stages[s]
    terms = need_terms(stage)
    if stage.reserved_bytes is not None:  # the reserve the need holds: the replay's where it runs, else the row's
        terms["allocator's fragmentation margin"] = needs[s] - stage.workspace_bytes - stage.peak_bytes
    found.append(Shortfall("device", s, needs[s], stage.cap_bytes, terms))
    return found


def static_refusal(profile: Profile, setup: TrainSetup, deadline: Deadline | None = None
                   ) -> staticneed.StaticNeed | None:
    """The stage past its limit in the split that needs least, whatever it recomputes (staticneed.py;
    a byte of room for the peak's rounding); None where some split may fit, no bound applies or
    `deadline` passed before it was known."""
    try:
        need = staticneed.least_need(profile, setup, deadline=deadline)
    except Expired:
        return None
    return need if need is not None and need.need_bytes > need.limit_bytes + 1 else None


def cap_needed_bytes(stage: costmodel.StageCost, fragmentation: float) -> int:
    """The least cap under which `stage` fits by evaluate's verdict: where the allocator replay
    judges it, its replayed reserved peak with the buffers and the margin (device_need_bytes: the
    search solves under rows that admit it, planner/solve/replayfit.py); elsewhere the solvers' row,
    which holds the allocated peak within what the cap admits once the buffers and the divisor's
    reserve are taken (assembly.limit_bytes: on cuda allocator.allocated_limit of the cap less the
    buffers, whose inverse is reserved_bytes), and the device need."""
    allocated = stage.peak_bytes + costmodel.FIT_MARGIN_BYTES
    if stage.reserved_bytes is None:  # cpu: the cap holds the peak itself
        return max(allocated, stage.device_need_bytes)
    if stage.reserved_by == "replay":
        return stage.device_need_bytes
    row = allocator.reserved_bytes(allocated, fragmentation) + stage.workspace_bytes
    return max(row, stage.device_need_bytes)


def need_terms(stage: costmodel.StageCost) -> dict[str, int]:
    """A stage's peak by what takes it: held all iteration, then the moment that sets it: the
    activations of its in-flight microbatches with the largest transient, the optimizer step's
    scratch, or the step's end (the outputs the schedule keeps and their merge)."""
    terms = {"weights, grads, optimizer state": stage.static_bytes, "buffers": stage.buffer_bytes}
    moment = max(stage.activation_bytes + stage.transient_bytes, stage.step_scratch_bytes)
    if stage.step_end_bytes > moment:
        terms["kept to the step's end (outputs, sends) and the merge"] = stage.step_end_bytes
    elif stage.activation_bytes + stage.transient_bytes >= stage.step_scratch_bytes:
        terms[f"activations x {stage.in_flight} microbatches"] = stage.activation_bytes
        if stage.transient_bytes >= 0:
            terms["largest transient"] = stage.transient_bytes
        else:  # static counts gradient shards the step set to None and no backward has made again (stage_floor)
            terms["freed before the peak (gradient shards static counts), net of the largest transient"] = \
                stage.transient_bytes
    else:
        terms["optimizer step scratch"] = stage.step_scratch_bytes
    if stage.reserved_bytes is not None:  # cuda: what the allocator reserves beyond, and NCCL's buffers
        terms["allocator's fragmentation margin"] = stage.reserved_bytes - stage.peak_bytes
        terms["communication buffers"] = stage.workspace_bytes
    return terms
