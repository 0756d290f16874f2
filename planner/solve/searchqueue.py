"""The whole-job search's branch and bound (jobsearch.search_job): the kept configurations solved in the order
of the cost model's lower bound on their time, each solve bounded, one whose bound reaches the bar pruned.

The bar is the `top`-th best time solved, and each solve is given it as its cutoff (the solver's upper bound on
the plan it may return): a configuration's time is at least its bound and the bar only falls, so one pruned could
never enter the ranking. Before `top` plans are known there is no bar, and a solve's work is bounded by time
instead: while the enumeration runs (under a limit) the solves may take half the time spent (a policy, no figure
fitted), so one begun when they have taken s of e seconds gets e - 2s at most. A solve stopped at its share is not
counted solved nor lost: it waits for the enumeration's end (`deferred`), then goes back in line; the next early
solve waits for a share twice the one that stopped it. Without the share, one early solve with no bar took the
search hostage (docs/published-runs.md §44.searchbb: llama3-8b on 64 H100, tp1 pp1 dp64 ZeRO 3 shard 2 mbs1x2,
whose one stage's checkpoint fronts grow without a cutoff: 370 s for a configuration a better one then prunes).
Given the time, every configuration is solved to its answer or pruned, and the ranking is the exhaustive
search's (tests/test_searchtime.py holds it to a brute force).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from planner.solve import bounds as bounds_mod
from planner.solve import chunkbound
from planner.solve.deadline import Deadline
from planner.solve.results import NoFit

if TYPE_CHECKING:
    from planner.solve.searchoutcome import Candidate, Outcome, Solved


def solve_order(candidate: Candidate) -> tuple:
    """The order configurations are solved in: one chunk a rank first (its DP takes a fraction of a chunked
    schedule's MILP), then by time bound, then by the degrees' key."""
    return (candidate.degrees.chunks > 1, candidate.bounds.time_ms, candidate.degrees.key())


class Queue:
    """The kept configurations not yet solved nor pruned, in `solve_order` (the module's text). `solve`:
    jobsearch.solve_one's signature; it hands back a Solved, None (no plan under the bar) or a NoFit "timeout"
    (stopped by its deadline before any plan)."""

    def __init__(self, outcome: Outcome, *, top: int, deadline: Deadline, solver: str,
                 solve: Callable[..., Solved | NoFit | None]):
        self.outcome, self.top, self.deadline, self.solver, self.solve = outcome, top, deadline, solver, solve
        self.heap: list[tuple] = []
        self.pushed = 0  # of the enumeration's kept list
        self.order = 0  # ties in solve_order broken by the order pushed
        self.solving_s = 0.0  # on the deadline's clock
        self.deferred: list[Candidate] = []  # stopped at their share while the enumeration ran
        # the least share an early solve is begun with: twice the last share that stopped one (a solve's first
        # pass reads the deadline only after its setup, ~1 s at 64 GPUs: shares below it would each stop one)
        self.least_share_s = 0.0

    def push(self, kept: list[Candidate]) -> None:
        for candidate in kept[self.pushed:]:
            self._push(candidate)
            self.pushed += 1

    def _push(self, candidate: Candidate) -> None:
        heapq.heappush(self.heap, (solve_order(candidate), self.order, candidate))
        self.order += 1

    def bar(self) -> float:
        ranked = self.outcome.ranked
        return ranked[self.top - 1].iteration_ms if len(ranked) >= self.top else math.inf

    def share_s(self) -> float:
        """What a solve begun now may take while the enumeration runs: the solves' half of the time spent, less
        what they have taken."""
        return self.deadline.elapsed_s() - 2 * self.solving_s

    def between(self, kept: list[Candidate]) -> None:
        """Before the enumeration's next configuration: solve in bound order while the solves have taken less
        of the time than the enumeration (half the limit's time to each), each within that share."""
        self.push(kept)
        while self.heap and self.share_s() > max(0.0, self.least_share_s):
            solves = self.outcome.solved
            if not self.step(share=True):
                return
            self.outcome.solved_early += self.outcome.solved - solves

    def drain(self) -> None:
        """The enumeration done (or stopped): those deferred back in line, then the rest in bound order until the
        bar or the deadline; what the deadline leaves is pruned where its bound reaches the bar, else counted
        unsolved (outcome.unsolved, in order)."""
        for candidate in self.deferred:
            self._push(candidate)
        self.deferred = []
        while self.heap:
            if not self.step():
                break
        bar, left = self.bar(), [entry[-1] for entry in sorted(self.heap)]
        self.outcome.pruned_time += sum(c.bounds.time_ms >= bar for c in left)
        self.outcome.unsolved = [c for c in left if c.bounds.time_ms < bar]
        if self.outcome.unsolved:
            self.outcome.complete = False
        self.heap = []

    def step(self, *, share: bool = False) -> bool:
        """The best-ordered configuration pruned, solved or deferred (stopped at its `share`); False (it kept)
        where the deadline has passed."""
        outcome, bar = self.outcome, self.bar()
        entry = heapq.heappop(self.heap)
        candidate = entry[-1]
        if candidate.bounds.time_ms >= bar:
            outcome.pruned_time += 1
            return True
        if self.deadline.expired():
            heapq.heappush(self.heap, entry)
            return False
        if not math.isinf(bar) and _bubble_bound_ms(candidate, bar) >= bar:  # an interleaved one's bubble
            outcome.pruned_time += 1
            outcome.pruned_bubble += 1
            return True
        limit = self.deadline.remaining_s()
        if share:
            limit = self.share_s() if limit is None else min(limit, self.share_s())
        begun = self.deadline.clock()
        found = self.solve(candidate, upper_bound_ms=None if math.isinf(bar) else bar,
                           deadline=Deadline(limit, clock=self.deadline.clock), solver=self.solver)
        self.solving_s += self.deadline.clock() - begun
        stopped = isinstance(found, NoFit) or (found is not None and found.solve.timed_out)
        if stopped and share and not self.deadline.expired():  # its share, not the search's limit
            outcome.deferred += 1
            self.least_share_s = 2 * limit
            self.deferred.append(candidate)
            return True
        if isinstance(found, NoFit):  # the search's deadline, before any plan: not solved
            heapq.heappush(self.heap, entry)
            return False
        if stopped:  # the search's deadline, with a plan so far: ranked, but the search did not finish it
            outcome.cut_short += 1
            outcome.complete = False
        _rank(outcome, found, self.top)
        return True


def _bubble_bound_ms(candidate: Candidate, bar: float) -> float:
    """The interleaved schedule's bound with its bubble (chunkbound.py: an LP over the order's actions, tens of
    ms where a chunked MILP takes seconds), asked only of a configuration about to be solved; 0 for the others.
    `bar`: where its cheaper form (shared by the configurations that differ in their step) reaches it, that."""
    if not chunkbound.holds(candidate.setup):
        return 0.0
    return chunkbound.iteration_bound_ms(candidate.profile, candidate.setup, bounds_mod.kinds(candidate.profile),
                                         enough=bar)


def _rank(outcome: Outcome, solved: Solved | None, top: int) -> None:
    """One solve counted, its plan (if any) ranked: the `top` fastest kept."""
    outcome.solved += 1
    if solved is None:
        outcome.solved_without_plan += 1
        return
    outcome.ranked.append(solved)
    outcome.ranked.sort(key=lambda s: (s.iteration_ms, s.degrees.key()))
    del outcome.ranked[top:]
