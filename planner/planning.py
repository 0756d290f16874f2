"""Make a plan: the baselines, then the exact solver bounded by the best of them, as a
Plan that says what it rests on. `ckplan solve`, `solve --auto-dp` and the benchmarks
all plan through `make_plan`."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from planner.errors import SolverTimeLimit, UserError


def make_plan(profile, profile_path: Path, setup, *, time_limit_s: float, deadline=None):
    """Baselines, then the exact solver (bounded by the best feasible baseline), as a Plan.
    One deadline (default: time_limit_s from now) bounds all of it."""
    from planner import baselines, io, milp
    from planner.deadline import Deadline
    from planner.schema import FileRef, Plan, PlanPredicted, SolverInfo

    deadline = deadline or Deadline(time_limit_s)
    references = baselines.all_baselines(profile, setup)
    best = min((b for b in references if b.feasible), key=lambda b: b.iteration_ms, default=None)
    result = milp.plan(profile, setup, deadline=deadline,
                       upper_bound_ms=best.iteration_ms if best else None, start=best.stages if best else None)
    if isinstance(result, milp.SolveResult) and result.status == "timeout":
        raise SolverTimeLimit(f"the solver found no plan within --time-limit {time_limit_s:g} s and no baseline "
                        "fits to start from; raise --time-limit")
    if isinstance(result, milp.SolveResult):
        raise UserError(_infeasible_message(profile, setup, deadline))
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
        solver=SolverInfo(status=result.solve.status, objective=result.solve.objective, gap=result.solve.gap,
                          wall_s=round(result.solve.wall_s, 4)),
        baselines=references,
    )


def _infeasible_message(profile, setup, deadline) -> str:
    """Which stage cannot fit, the smallest cap that would, and what else would help."""
    from planner import costmodel, milp
    from planner.units import format_bytes

    caps = setup.mem_caps_bytes
    found = milp.min_cap_scale(profile, setup, deadline=deadline)
    if found is None:
        return ("no plan fits the caps, and --time-limit ran out before the smallest cap that would fit "
                "was found; raise --time-limit to learn it")
    scale, cost = found
    tightest = max(range(setup.stages), key=lambda s: cost.stages[s].peak_bytes / caps[s])
    need = cost.stages[tightest]
    if len(set(caps)) == 1:
        needed = max(cost.peak_bytes_per_stage) + costmodel.FIT_MARGIN_BYTES
        smallest = f"the smallest cap that works with {setup.stages} stages is {format_bytes(needed, round_up=True)}"
    else:
        smallest = f"every cap would have to grow by {(scale - 1) * 100:.0f}%"
    return (
        f"no plan fits the caps: even in the least-memory plan stage {tightest} needs "
        f"{format_bytes(need.peak_bytes)} (of which {format_bytes(need.static_bytes)} weights, grads and "
        f"optimizer state) against its cap of {format_bytes(caps[tightest])}; {smallest}. "
        "More stages, a smaller micro-batch (re-profile with --micro-batch-size) or sharding optimizer "
        "state with ZeRO would also help"
    )
