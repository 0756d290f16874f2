"""No early solve takes the search hostage (planner/solve/searchqueue.py, §44.searchbb): while the enumeration
runs a solve gets the solves' half of the time spent, one stopped there waits for the enumeration's end (counted
neither solved nor lost), the next early solve waits for twice that share, and the ranking stays the brute
force's. On an injected clock: one second a profile built, a stopped solve takes its whole share."""

from __future__ import annotations

import math

import pytest
from test_search import MINI, profile_for
from test_searchtime import JOB, OPTIONS, _brute

from planner.solve import dpsegments, dpsolve, jobsearch
from planner.solve.deadline import Deadline, Expired
from planner.solve.degrees import Degrees
from planner.solve.results import NoFit

LIMIT_S = 10_000.0


def _search(monkeypatch, *, stalls: bool, hard: Degrees | None = None) -> tuple[jobsearch.Outcome, list, list]:
    """search_job on test_searchtime's JOB under LIMIT_S; configuration `hard` (None: the first solved) stops at
    every deadline (`stalls`) or at those under 1000 s (a share, here), and takes it all. Returns the outcome,
    each solve begun as (candidate, its deadline's limit, profiles built then), and the profiles built."""
    inner, built, now, begun = profile_for(MINI), [], [0.0], []
    real = jobsearch.solve_one

    def build(tp, sp, mbs, **keywords):
        built.append((tp, sp, mbs))
        now[0] += 1
        return inner(tp, sp, mbs, **keywords)

    def solve(candidate, *, deadline, **keywords):
        begun.append((candidate, deadline.limit_s, len(built)))
        if candidate.degrees == (hard or begun[0][0].degrees) and (stalls or deadline.limit_s < 1000):
            now[0] += deadline.limit_s
            return NoFit("timeout", deadline.limit_s, "dp")
        return real(candidate, deadline=deadline, **keywords)

    monkeypatch.setattr(jobsearch, "solve_one", solve)
    outcome = jobsearch.search_job(JOB, OPTIONS, build, top=3, deadline=Deadline(LIMIT_S, clock=lambda: now[0]))
    return outcome, begun, built


def _kept() -> list:
    return jobsearch.candidates(JOB, OPTIONS, jobsearch.Profiles(profile_for(MINI)), jobsearch.Outcome())


def test_a_solve_stopped_at_its_share_waits_for_the_enumeration_and_the_ranking_is_the_brute_force(monkeypatch):
    kept = _kept()
    best = _brute(kept)
    # the fastest configuration of all stops at its share: the ranking would lose its head if it were dropped
    outcome, begun, built = _search(monkeypatch, stalls=False, hard=best[0][0])
    again = [i for i, (c, _, _) in enumerate(begun) if c.degrees == best[0][0]]
    first, share, _ = begun[again[0]]
    # its share: the time spent when it began less twice what the solves had taken; tried once more after every
    # profile was built, with the rest of the limit
    assert 0 < share < 1000 and len(again) == 2 and outcome.deferred == 1
    assert begun[again[1]][2] == len(built) and begun[again[1]][1] >= 1000
    # while the enumeration ran no solve began after it with less than twice the share that stopped it
    early = [limit for _, limit, profiles in begun[again[0] + 1:again[1]] if profiles < len(built)]
    assert all(limit >= 2 * share for limit in early)
    assert [(s.degrees, s.iteration_ms) for s in outcome.ranked] == best
    # every configuration kept solved or pruned once: the one stopped is counted once, when it was solved
    assert outcome.complete and outcome.unsolved == [] and outcome.solved + outcome.pruned_time == len(kept)
    assert outcome.solved == len(begun) - 1


def test_a_solve_the_deadline_stops_is_left_unsolved_not_lost(monkeypatch):
    kept = _kept()
    best = _brute(kept)
    outcome, begun, _ = _search(monkeypatch, stalls=True, hard=best[0][0])
    hard = next(c for c, _, _ in begun if c.degrees == best[0][0])
    # stopped at its share, then by the search's own deadline: said unsolved with its bound, never counted solved
    assert outcome.deferred == 1 and not outcome.complete
    assert [c.degrees for c in outcome.unsolved] == [hard.degrees]
    assert outcome.solved + outcome.pruned_time + len(outcome.unsolved) == len(kept)
    assert outcome.solved == len(begun) - 2 and outcome.solved_without_plan < outcome.solved
    assert not any(s.degrees == hard.degrees for s in outcome.ranked)
    bar = outcome.ranked[-1].iteration_ms if len(outcome.ranked) == 3 else math.inf
    assert hard.bounds.time_ms < bar  # it could still enter the ranking: it is said, with its bound


def test_the_dp_reads_the_deadline_within_one_stages_range(monkeypatch):
    """One stage: every range starts at layer 0, so the DP's fronts are grown in one call; the deadline is read
    before each layer they grow by, not only before each start (llama3-8b's one stage: ~100 s unread)."""
    profile = profile_for(MINI)(1, False, 1)
    setup = jobsearch.job_setup(profile, Degrees(tp=1, sp=False, pp=1, dp=8, micro_batch_size=1, microbatches=2,
                                                 schedule="1F1B", chunks=1, zero=0), OPTIONS)
    grown, real = [], dpsegments._grow

    def grow(*args, **keywords):
        grown.append(args[2])
        return real(*args, **keywords)

    monkeypatch.setattr(dpsegments, "_grow", grow)
    assert dpsolve.fastest_plan(profile, setup, upper_bound_ms=None, deadline=Deadline(None)) is not None
    layers = len(grown)
    assert layers == len(profile.layers) > 3 and grown == list(range(layers))  # one start, grown layer by layer
    grown.clear()
    calls = [0]

    def clock() -> float:  # one second each time the deadline is read
        calls[0] += 1
        return float(calls[0])

    with pytest.raises(Expired):
        dpsolve.fastest_plan(profile, setup, upper_bound_ms=None, deadline=Deadline(3.5, clock=clock))
    assert 0 < len(grown) < layers



def test_a_milp_the_deadline_stops_says_so_and_is_solved_again():
    """A chunked configuration's MILP stopped at its share by the deadline hands back HiGHS's incumbent: it says it
    timed out (so the queue defers it and solves it again) wherever it is slower than the configuration's own
    answer; it was ranked as final, and a slow host chose which configurations lost their best plan that way. The
    deadline expires at each of its reads in turn (a clock of 0, then 1e9), as a share would on any host."""
    from planner.solve import bounds as bounds_mod
    from planner.solve.searchoutcome import Candidate

    profile = profile_for(MINI)(1, False, 1)
    degrees = Degrees(tp=1, sp=False, pp=2, dp=4, micro_batch_size=1, microbatches=4, schedule="interleaved-1F1B",
                      chunks=2, zero=0)
    setup = jobsearch.job_setup(profile, degrees, OPTIONS)
    candidate = Candidate(degrees, setup, profile, bounds_mod.setup_bounds(profile, setup, bounds_mod.kinds(profile)))
    answer = jobsearch.solve_one(candidate, upper_bound_ms=None, deadline=Deadline(None)).iteration_ms
    incumbents = []
    for reads_before in range(2, 100):
        reads = [0]

        def clock(reads=reads, reads_before=reads_before) -> float:
            reads[0] += 1
            return 0.0 if reads[0] <= reads_before else 1e9

        found = jobsearch.solve_one(candidate, upper_bound_ms=None, deadline=Deadline(1.0, clock=clock))
        if reads[0] <= reads_before:  # finished before the deadline passed: every later clock the same
            break
        if not isinstance(found, NoFit) and found.iteration_ms > answer + 1e-9:
            incumbents.append((reads_before, found.solve.timed_out))
    assert incumbents and all(timed_out for _, timed_out in incumbents), incumbents

def test_the_command_says_the_solves_stopped_at_their_share(tmp_path, monkeypatch):
    """The first solve the command begins while it enumerates is stopped at its share (the real clock's seconds
    spent, under 1000 s): the text and the JSON say it, and the counts still add up."""
    import json

    from fixtures.cli import run
    from test_launchers import _tiny_config

    real, begun = jobsearch.solve_one, []

    def solve(candidate, *, deadline, **keywords):
        begun.append(candidate.degrees)
        if candidate.degrees == begun[0] and deadline.limit_s < 1000:
            return NoFit("timeout", deadline.limit_s, "dp")
        return real(candidate, deadline=deadline, **keywords)

    monkeypatch.setattr(jobsearch, "solve_one", solve)
    args = ("search", "--arch-config", _tiny_config(tmp_path), "--gpus", "8", "--global-batch", "8", "--seq-len", "512",
            "--top", "2", "--time-limit", "9999")
    counts = json.loads(run(*args, "--out", tmp_path / "a.yaml", "--json").stdout)["counts"]
    kept = counts["considered"] - counts["duplicates"] - counts["refused"] - counts["pruned_memory"]
    assert counts["deferred"] == 1 and counts["complete"] and counts["solved"] + counts["pruned_time"] == kept
    begun.clear()
    said = " ".join(run(*args, "--out", tmp_path / "b.yaml").output.split())
    assert ("1 solve stopped at the solves' share of the time while the enumeration ran, the configuration waiting "
            "for its end;") in said


def test_a_plan_the_searchs_own_deadline_stopped_leaves_the_search_incomplete(monkeypatch):
    """The last solve the search's deadline stops with a plan so far: ranked (it is a plan that fits) and counted
    cut short, and the search does not call itself complete though nothing is left in line (review63's drain)."""
    import dataclasses

    inner, now, calls = profile_for(MINI), [0.0], [0]
    real = jobsearch.solve_one

    def solve(candidate, *, deadline, **keywords):
        calls[0] += 1
        found = real(candidate, deadline=deadline, **keywords)
        if calls[0] == 3:  # the deadline passes during this solve, which hands back its plan so far
            now[0] = LIMIT_S + 1
            found = dataclasses.replace(found, solve=dataclasses.replace(found.solve, timed_out=True))
        return found

    monkeypatch.setattr(jobsearch, "solve_one", solve)
    outcome = jobsearch.search_job(JOB, OPTIONS, inner, top=3, deadline=Deadline(LIMIT_S, clock=lambda: now[0]))
    assert calls[0] == 3 and not outcome.unsolved
    assert outcome.cut_short == 1 and any(s.solve.timed_out for s in outcome.ranked)
    assert not outcome.complete
