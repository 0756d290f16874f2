"""Make a plan: the baselines, then the search (planner/solve/search.py) bounded by the best of
them, as a Plan that says what it rests on, or an Unplanned that says why there is none.
`ckplan solve`, `solve --auto-dp`, `solve --sweep`, `evaluate` and the benchmarks all plan
through `search_plan` / `make_plan`, with the setup `setup_options.planned_setup` made
(calibration included)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path


@dataclass(frozen=True)
class Unplanned:
    """No plan: the search's verdict ("infeasible", "timeout", "error") and, for "infeasible", what
    stands in the way (search.why_not; None where the time limit cut that short too)."""

    status: str
    shortfalls: list | None
    time_limit_s: float
    # what ran before the deadline, for the timeout's words: seconds spent, baselines scored of those there are
    elapsed_s: float | None = None
    baselines: tuple[int, int] | None = None

    @property
    def resource(self) -> str:
        """Why, in a word or two: "time limit", "host memory", "device memory"."""
        if self.status == "timeout":
            return "time limit"
        if self.shortfalls and self.shortfalls[0].resource == "host":
            return "host memory"
        return "device memory"

    def message(self, setup) -> str:
        if self.status == "timeout":
            told = (f"the solver found no plan within --time-limit {self.time_limit_s:g} s and no baseline "
                    "fits to start from; raise --time-limit")
            from planner.cost import replayed_reserve
            if not replayed_reserve.replays(setup):
                return told
            return f"{told}, which bounds the baselines and the search together: {self._what_ran(setup)}"
        if self.status == "error":
            return ("the MILP solver (HiGHS) failed numerically before it found a plan, and no baseline fits to "
                    "fall back on; try --solver dp where the schedule has one stage per rank, or other caps")
        return infeasible_message(self.shortfalls, setup)

    def _what_ran(self, setup) -> str:
        """This job's own figures: the stages each plan's replay judges, the baselines scored and the seconds spent."""
        stages = setup.pipeline.stages
        said = (f"here each plan is judged by the allocator's replay of its {stages} stage{'s' if stages > 1 else ''}, "
                "so each baseline and each of the search's solves under caps costs seconds")
        if self.elapsed_s is None or self.baselines is None:
            return said
        scored, total = self.baselines
        return (f"{said}; in {self.elapsed_s:.1f} s {scored} of the {total} baselines were scored"
                + ("" if scored == total else " before the deadline")
                + ", and the search under caps found no plan in what was left")


def search_plan(profile, setup, *, time_limit_s: float, solver: str = "auto", deadline=None, starts=()):
    """(the search's result, the baselines): the baselines scored, then the search started from
    the fastest feasible one of them and of `starts` (stage plans, e.g. a hand configuration).
    One deadline (default: time_limit_s from now) bounds all of it."""
    from planner.cost import costmodel
    from planner.solve import baselines, search
    from planner.solve.deadline import Deadline

    deadline = deadline or Deadline(time_limit_s)
    if search.static_refusal(profile, setup, deadline) is not None:  # no split holds its static bytes: nothing to score
        return search.NoFit("infeasible", deadline.elapsed_s(), search.pick_solver(setup, solver, profile)), []
    references = baselines.all_baselines(profile, setup, deadline)
    known = [(b.iteration_ms, b.stages) for b in references if b.feasible]
    for stages in starts:
        cost = costmodel.evaluate(stages, profile, setup)
        if cost.feasible:
            known.append((cost.iteration_ms, stages))
    upper, start = min(known, key=lambda item: item[0], default=(None, None))
    result = search.plan(profile, setup, solver=solver, deadline=deadline, upper_bound_ms=upper, start=start,
                         baselines_scored=True)
    return result, references


def make_plan(profile, profile_path: Path, setup, *, time_limit_s: float, solver: str = "auto", deadline=None,
              explain: bool = True):
    """The Plan, or an Unplanned saying why there is none (with `explain`, down to the stage and
    the terms of the least-memory plan: a search of its own; without, only whether the host
    alone rules it out)."""
    from planner import io
    from planner.schema import FileRef, Plan, PlanPredicted, SolverInfo
    from planner.solve import search
    from planner.solve.deadline import Deadline

    deadline = deadline or Deadline(time_limit_s)
    result, references = search_plan(profile, setup, time_limit_s=time_limit_s, solver=solver, deadline=deadline)
    if isinstance(result, search.NoFit):
        shortfalls = (search.why_not(profile, setup, deadline=deadline, solver=solver, least_memory=explain)
                      if result.status == "infeasible" else None)
        from planner.solve.baselines import BASELINES
        return Unplanned(result.status, shortfalls, time_limit_s, elapsed_s=deadline.elapsed_s(),
                         baselines=(len(references), len(BASELINES)))
    solve = result.solve
    return Plan(
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        model=FileRef(file=profile.model.file, sha256=profile.model.sha256),
        profile=io.file_ref(profile_path),
        device=profile.device,
        dtype=profile.dtype,
        profile_source=profile.source,
        setup=setup,
        stages=result.stages,
        predicted=PlanPredicted(iteration_ms=result.cost.iteration_ms, peak_bytes_max=max(result.cost.peak_bytes_per_stage)),
        solver=SolverInfo(name=solve.solver, status=solve.status, objective=solve.objective, bound=solve.bound,
                          gap=solve.gap, wall_s=round(solve.wall_s, 4), replay=solve.replay, solves=solve.solves,
                          rounds_left=solve.rounds_left, round_s=round(solve.round_s, 4),
                          timed_out=solve.timed_out),
        baselines=references,
    )


def infeasible_message(shortfalls, setup) -> str:
    """Which stage cannot fit, which terms take its memory, the smallest cap that would, and
    what else would help."""
    from planner.units import format_bytes

    if shortfalls is None:
        return ("no plan fits the caps, and --time-limit ran out before the smallest cap that would fit "
                "was found; raise --time-limit to learn it")
    if not shortfalls and setup.pipeline.chunks > 1:
        return (f"no plan of {setup.pipeline.schedule} with {setup.pipeline.chunks} chunks per rank fits the caps; "
                "raise --mem, or try 1F1B, whose ranks keep fewer microbatches")
    if not shortfalls:
        return ("no plan fits the device and host caps together, though each alone could be met; raise "
                "--mem or --host-mem")
    need = shortfalls[0]
    parts = ", ".join(f"{name} {format_bytes(num_bytes)}" for name, num_bytes in need.terms.items() if num_bytes)
    if need.least:
        cap = setup.pipeline.mem_caps_bytes[need.stage]
        return (f"no plan fits the caps, whatever it recomputes: in every split of the layers over "
                f"{setup.pipeline.stages} stages some stage needs more than its cap leaves its tensors, and in the "
                f"split that needs least stage {need.stage} needs at least {format_bytes(need.need_bytes)} ({parts}) "
                f"against the {format_bytes(need.cap_bytes)} its cap of {format_bytes(cap)} leaves its tensors (less "
                "the communication buffers and workspaces). More stages, a smaller micro-batch "
                f"(re-profile with --micro-batch-size), a larger --mem or {_shard_hint(setup)} would help")
    if need.resource == "host":
        return (f"no plan fits the host memory: even split as evenly as the stages allow, the offloaded "
                f"optimizer needs {format_bytes(need.need_bytes)} per rank against its share of --host-mem, "
                f"{format_bytes(need.cap_bytes)}; raise --host-mem, shard it with --zero 1 and --dp > 1, add "
                "--stages, or drop --offload-optimizer")
    caps = setup.pipeline.mem_caps_bytes
    if len(set(caps)) == 1:
        smallest = (f"the smallest cap that works with {setup.pipeline.stages} stages is "
                    f"{format_bytes(need.need_bytes, round_up=True)}")
    else:
        smallest = f"every cap would have to grow by {need.over_fraction * 100:.0f}%"
    shard = _shard_hint(setup)
    return (
        f"no plan fits the caps: even in the least-memory plan stage {need.stage} needs "
        f"{format_bytes(need.need_bytes)} ({parts}) against its cap of {format_bytes(need.cap_bytes)}, "
        f"{need.over_fraction * 100:.0f}% over; {smallest}. More stages, a smaller micro-batch (re-profile with "
        f"--micro-batch-size) or {shard} would also help"
    )


def _shard_hint(setup) -> str:
    """What would shard the static bytes further."""
    data_parallel = setup.data_parallel
    if data_parallel.zero >= 3:
        return "more data-parallel ranks to shard over (--dp)"
    if data_parallel.dp > 1:
        return f"a higher ZeRO stage (--zero {data_parallel.zero + 1} or 3)"
    return "data parallelism with ZeRO (--dp N --zero 3)"
