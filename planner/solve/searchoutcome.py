"""What the whole-job search hands around: a configuration with its setup and bounds (Candidate), one solved with
its exact plan (Solved), and the search's counts and ranking (Outcome). Apart from jobsearch.py so that its queue
(searchqueue.py) reads them without importing the search back."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.schema import Profile, StagePlan, TrainSetup
from planner.solve import bounds as bounds_mod
from planner.solve.degrees import Degrees


@dataclass(frozen=True)
class Candidate:
    degrees: Degrees
    setup: TrainSetup
    profile: Profile
    bounds: bounds_mod.Bounds
    # the profile a plan file holds where `profile` has the setup's Float8 records applied to it
    # (planner/cost/float8.py: export and evaluate apply them again from the plan's setup)
    plan_profile: Profile | None = None


@dataclass(frozen=True)
class Solved:
    """A configuration with its exact plan."""

    candidate: Candidate
    stages: list[StagePlan]
    cost: object  # costmodel.PlanCost
    solve: object  # milp.SolveResult

    @property
    def iteration_ms(self) -> float:
        return self.cost.iteration_ms

    @property
    def degrees(self) -> Degrees:
        return self.candidate.degrees


@dataclass
class Outcome:
    ranked: list[Solved] = field(default_factory=list)  # fastest first, at most `top`
    considered: int = 0  # configurations enumerated
    duplicates: int = 0  # the same setup as another once the runtime's own mapping is applied
    refused: int = 0  # setups the schema refuses (e.g. a shard group the experts do not divide)
    pruned_memory: int = 0  # memory bound past the card: no solve
    pruned_time: int = 0  # time bound no better than the top-th best found: no solve (exact, at the end too)
    pruned_bubble: int = 0  # of those, the interleaved ones pruned by the bound with their bubble (chunkbound.py)
    solved: int = 0  # solves run
    solved_without_plan: int = 0  # solved, and no plan fits (or none beats the bound it was given)
    profiles: int = 0  # profiles built
    complete: bool = True  # False: the deadline stopped it before the bound did
    unexplored: int = 0  # configurations not enumerated: the deadline passed while their profiles were built
    solved_early: int = 0  # of `solved`, those solved while the enumeration still ran (under a limit, in bound order)
    deferred: int = 0  # solves stopped at their share of the time while the enumeration ran: back in line after it
    cut_short: int = 0  # of `solved`, those the search's own deadline stopped: their plan so far ranked, not proven
    wall_s: float = 0.0
    nearest: Candidate | None = None  # the configuration nearest to fitting by the memory bound
    unsolved: list[Candidate] = field(default_factory=list)  # bounded below the bar, not solved before the deadline
