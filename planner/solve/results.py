"""What a search hands back: a plan with its cost and the solve that found it, or why there is none."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from planner.cost.costmodel import PlanCost
from planner.schema import StagePlan
from planner.solve.highs import SolveResult


@dataclass(frozen=True)
class PlanResult:
    stages: list[StagePlan]
    cost: PlanCost
    solve: SolveResult


@dataclass(frozen=True)
class Shortfall:
    """What stands between a setup and a plan that fits: on `resource` ("device" or
    "host"), stage `stage` needs `need_bytes` against `cap_bytes` even in the plan that
    needs the least, and of that need `terms` (name -> bytes) say what takes it. `least`: found
    before any search (planner/solve/staticneed.py): need_bytes is a lower bound on the stage's
    allocated peak in the split that needs least, and cap_bytes what its cap leaves its tensors."""

    resource: Literal["device", "host"]
    stage: int
    need_bytes: int
    cap_bytes: int
    terms: dict[str, int]
    least: bool = False

    @property
    def over_fraction(self) -> float:
        return self.need_bytes / self.cap_bytes - 1


@dataclass(frozen=True)
class NoFit:
    """No plan was found: "infeasible" (none fits the caps), "timeout" (the time limit
    passed before any plan was found, which proves nothing) or "error" (HiGHS failed before it
    found a plan, and no baseline fits to fall back on)."""

    status: Literal["infeasible", "timeout", "error"]
    wall_s: float
    solver: str


class SolverMismatch(AssertionError):
    """The re-evaluated plan disagrees with the solver's objective: a formulation bug."""
