"""`ckplan search --time-limit` answers before its enumeration ends: under a limit jobsearch.search_job solves the
kept configurations in bound order while it enumerates (half the time spent to each), pruning those whose bound is
no better than the top-th best found, and says what the limit left. On an injected clock (one second a profile
built, solves free): no real waiting."""

from __future__ import annotations

import dataclasses
import json

import pytest
from fixtures.cli import run
from test_launchers import _tiny_config
from test_search import MINI, GiB, profile_for
from test_searchfix import _first_keys, clock  # noqa: F401  (the CLI's clock fixture)

from planner.solve import jobsearch, searchqueue
from planner.solve.deadline import Deadline
from planner.solve.degrees import JobShape, enumerate_degrees

JOB = JobShape(gpus=8, gpus_per_node=8, global_batch=16, seq_len=2048, num_layers=MINI.num_layers + 2,
               tp_ok=(1, 2, 4, 8))
OPTIONS = jobsearch.JobOptions(mem_cap_bytes=8 * GiB, gpus_per_node=8)


def _search(limit_s: float | None, solves: list | None = None, monkeypatch=None) -> tuple[jobsearch.Outcome, list]:
    """search_job on JOB with a deadline of `limit_s` on a clock of one second a profile built; the profiles
    built, in order; each candidate solved appended to `solves`."""
    inner, built = profile_for(MINI), []

    def build(tp, sp, mbs, **keywords):
        built.append((tp, sp, mbs))
        return inner(tp, sp, mbs, **keywords)

    if solves is not None:
        real = jobsearch.solve_one

        def solve(candidate, **keywords):
            solves.append(candidate)
            return real(candidate, **keywords)

        monkeypatch.setattr(jobsearch, "solve_one", solve)
    deadline = None if limit_s is None else Deadline(limit_s, clock=lambda: len(built))
    return jobsearch.search_job(JOB, OPTIONS, build, top=3, deadline=deadline), built


def _counts(outcome: jobsearch.Outcome) -> dict:
    return {k: v for k, v in dataclasses.asdict(outcome).items()
            if k not in ("ranked", "nearest", "unsolved", "wall_s")}


def _ranking(outcome: jobsearch.Outcome) -> list:
    return [(s.degrees, s.iteration_ms) for s in outcome.ranked]


def _brute(kept: list) -> list:
    """Every configuration solved exactly, without a bar: the top 3 (the ranking's order)."""
    solved = [jobsearch.solve_one(c, upper_bound_ms=None, deadline=Deadline(None)) for c in kept]
    solved = sorted((s for s in solved if s is not None), key=lambda s: (s.iteration_ms, s.degrees.key()))
    return [(s.degrees, s.iteration_ms) for s in solved[:3]]


def test_a_limit_past_the_profiles_ranks_as_no_limit_and_accounts_for_every_configuration(monkeypatch):
    free, built = _search(None)
    profiles = len(built)
    solves: list = []
    limited, _ = _search(2 * profiles + 1, solves, monkeypatch)
    solves = list(solves)  # the search's (the brute force below solves through the same function)
    assert profiles == free.profiles > 3 and free.complete and free.solved_early == 0
    assert _ranking(limited) == _ranking(free) and len(free.ranked) == 3 and limited.complete
    # the branch and bound's best equals the exhaustive best (every kept configuration solved, no bar)
    kept = jobsearch.candidates(JOB, OPTIONS, jobsearch.Profiles(profile_for(MINI)), jobsearch.Outcome())
    assert _ranking(limited) == _brute(kept)
    # every configuration kept is solved or pruned by its bound, once (the limit's early solves come before the
    # bar is set by the best bounds of all: more solves than without a limit, never fewer counted)
    assert limited.solved + limited.pruned_time == free.solved + free.pruned_time == len(kept)
    assert len({id(c) for c in solves}) == len(solves) == limited.solved >= free.solved
    assert 0 < limited.solved_early <= limited.solved and limited.unsolved == [] and limited.unexplored == 0
    same = {k: v for k, v in _counts(limited).items() if k not in ("solved", "solved_early", "pruned_time")}
    assert same == {k: v for k, v in _counts(free).items() if k not in ("solved", "solved_early", "pruned_time")}
    # pruning never drops a configuration whose bound is below the final bar (the third best): the bar only falls
    bar = limited.ranked[2].iteration_ms
    assert {id(c) for c in kept if c.bounds.time_ms < bar} <= {id(c) for c in kept
                                                              if any(s.degrees == c.degrees for s in solves)}


def test_the_solves_after_the_enumeration_come_in_bound_order(monkeypatch):
    solves: list = []
    free, _ = _search(None, solves, monkeypatch)
    orders = [searchqueue.solve_order(c) for c in solves]
    assert orders == sorted(orders) and len(orders) == free.solved > 1


def test_a_search_whose_profiles_outlast_the_limit_solves_what_it_kept_in_bound_order_and_says_the_rest():
    # limit 3 s: the deadline passes with the third profile, and the enumeration stops at the next configuration;
    # before each configuration the ones kept so far were solved or pruned (solves are free on this clock), so
    # what is left is the configuration that built the third profile, if its bound is below the bar
    outcome, built = _search(3)
    every = enumerate_degrees(JOB)
    _, third = _first_keys(JOB, 2)  # the one that builds the third profile
    _, fourth = _first_keys(JOB, 3)  # the one that would build the fourth
    stop = third + 1
    assert stop < fourth  # configurations on built profiles lie between: the deadline stops them too
    assert len(built) == 3 and outcome.considered == stop and outcome.unexplored == len(every) - stop > 0
    free = jobsearch.candidates(JOB, OPTIONS, jobsearch.Profiles(profile_for(MINI)), jobsearch.Outcome())
    index = {d: i for i, d in enumerate(every)}
    before = [c for c in free if index[c.degrees] < third]
    last = [c for c in free if index[c.degrees] == third]
    # by brute force: the ranking is the best of the configurations kept before the last, every one solved
    assert _ranking(outcome) == _brute(before)
    bar = outcome.ranked[-1].iteration_ms if len(outcome.ranked) == 3 else float("inf")
    assert [c.degrees for c in outcome.unsolved] == [c.degrees for c in last if c.bounds.time_ms < bar]
    assert outcome.solved == outcome.solved_early and not outcome.complete
    assert outcome.solved + outcome.pruned_time + len(outcome.unsolved) == len(before) + len(last)


def test_the_command_cut_short_among_its_profiles_writes_the_early_plan_and_says_what_it_left(tmp_path, clock):  # noqa: F811
    """1 s a profile, 1000 s a solve (test_searchfix's clock): the sample and one more profile, then the best bound
    kept is solved (the solves had taken none of the 2 s spent), the deadline passes in it, nothing more is built."""
    result = run("search", "--arch-config", _tiny_config(tmp_path), "--gpus", "8", "--global-batch", "8",
                 "--seq-len", "512", "--top", "3", "--out", tmp_path / "best.yaml", "--time-limit", "3", "--json")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    counts = answer["counts"]
    assert clock[0] == 1002 and counts["profiles"] == 1  # the sample (the command's), one profile, one solve
    assert counts["solved"] == counts["solved_early"] == 1 and not counts["complete"]
    assert counts["unexplored"] > 0 and (tmp_path / "best.yaml").exists()
    # the one configuration kept by then was solved: none left bounded and unsolved (the rest never enumerated)
    assert counts["not_solved"] == 0 and counts["best_unsolved_bound_ms"] is None and len(answer["ranked"]) == 1
    text = run("search", "--arch-config", _tiny_config(tmp_path), "--gpus", "8", "--global-batch", "8",
               "--seq-len", "512", "--top", "3", "--out", tmp_path / "best2.yaml", "--time-limit", "3")
    said = " ".join(text.output.split())
    assert text.exit_code == 0, text.output
    assert "1 of them solved in bound order while the enumeration ran, half the time spent to each" in said
    assert "configurations not explored, the deadline passing before them (profiles built: 1);" in said
    assert "the ranking is the best of what was solved" in said


def test_the_command_accounts_for_every_configuration_it_kept(tmp_path):
    """A real clock and a limit far past the search: every configuration past the memory bound is solved or pruned
    by its bound, none left; the counts add up exactly."""
    result = run("search", "--arch-config", _tiny_config(tmp_path), "--gpus", "8", "--global-batch", "8",
                 "--seq-len", "512", "--top", "2", "--out", tmp_path / "best.yaml", "--time-limit", "9999", "--json")
    assert result.exit_code == 0, result.output
    counts = json.loads(result.stdout)["counts"]
    kept = counts["considered"] - counts["duplicates"] - counts["refused"] - counts["pruned_memory"]
    assert counts["complete"] and counts["not_solved"] == 0 and counts["best_unsolved_bound_ms"] is None
    assert counts["solved"] + counts["pruned_time"] == kept > counts["solved"] > 0


@pytest.mark.parametrize("limit_s", [1, 2])
def test_no_solve_is_started_past_the_limit(limit_s):
    # 1 s: the deadline passes with the first profile, before any configuration is kept: no solve is started
    # past it; 2 s: the configurations kept with the first profile are solved before the second is built (solves
    # are free on this clock), none after it
    outcome, built = _search(limit_s)
    assert len(built) == limit_s and not outcome.complete
    assert (outcome.solved_early > 0) == (limit_s == 2) and outcome.solved == outcome.solved_early
