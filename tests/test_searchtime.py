"""`ckplan search --time-limit` answers when its profiles take the time: once half the limit is gone with nothing
ranked, jobsearch.search_job solves the best-bound configuration kept so far, once, then enumerates on. On an
injected clock (one second a profile built, solves free): no real waiting."""

from __future__ import annotations

import dataclasses
import json

import pytest
from fixtures.cli import run
from test_launchers import _tiny_config
from test_search import MINI, GiB, profile_for
from test_searchfix import _first_keys, clock  # noqa: F401  (the CLI's clock fixture)

from planner.solve import jobsearch
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


def test_a_limit_twice_the_profiles_runs_exactly_as_no_limit():
    free, built = _search(None)
    profiles = len(built)
    limited, _ = _search(2 * profiles + 1)  # the last profile built before half the limit
    assert profiles == free.profiles > 3 and free.complete and free.solved_early == 0
    assert _ranking(limited) == _ranking(free) and len(free.ranked) == 3
    assert _counts(limited) == _counts(free)


def test_profiles_past_half_the_limit_solve_the_best_bound_kept_once_and_the_ranking_holds(monkeypatch):
    free, built = _search(None)
    solves: list = []
    limited, _ = _search(len(built) + 1, solves, monkeypatch)  # half the limit passed among the profiles
    assert limited.complete and limited.solved_early == 1 and limited.unexplored == 0
    assert len({id(c) for c in solves}) == len(solves) == limited.solved  # none solved twice
    # the extra exact plan leaves the three fastest as they were (solved to the same times)
    assert _ranking(limited) == _ranking(free)


def test_a_search_whose_profiles_outlast_the_limit_returns_the_best_bound_kept_at_half_of_it():
    # limit 3 s: half of it passes with the second profile; the deadline passes with the third, and the enumeration
    # stops at the next configuration, whose bound it would otherwise still take though its profile is built
    outcome, built = _search(3)
    every = enumerate_degrees(JOB)
    _, second = _first_keys(JOB, 1)  # the configuration that builds the second profile
    _, third = _first_keys(JOB, 2)  # the one that builds the third
    _, fourth = _first_keys(JOB, 3)  # the one that would build the fourth
    stop = third + 1
    assert stop < fourth  # configurations on built profiles lie between: the deadline stops them too
    assert len(built) == 3 and outcome.considered == stop and outcome.unexplored == len(every) - stop > 0
    # by hand: the configurations kept by the time the clock read 2 s are those up to the second profile's
    free = jobsearch.candidates(JOB, OPTIONS, jobsearch.Profiles(profile_for(MINI)), jobsearch.Outcome())
    index = {d: i for i, d in enumerate(every)}
    kept = [c for c in free if index[c.degrees] <= second]
    best = min(kept, key=lambda c: (c.bounds.time_ms, c.degrees.key()))
    exact = jobsearch.solve_one(best, upper_bound_ms=None, deadline=Deadline(None))
    assert [(s.degrees, s.iteration_ms) for s in outcome.ranked] == [(best.degrees, exact.iteration_ms)]
    assert outcome.solved == outcome.solved_early == 1 and not outcome.complete
    assert len(outcome.unsolved) > 0 and all(c.degrees != best.degrees for c in outcome.unsolved)


def test_the_command_cut_short_among_its_profiles_writes_the_early_plan_and_says_what_it_left(tmp_path, clock):  # noqa: F811
    """1 s a profile, 1000 s a solve (test_searchfix's clock): the sample and one more profile pass half of 3 s,
    the best bound kept is solved, the deadline passes in it, nothing more is built."""
    result = run("search", "--arch-config", _tiny_config(tmp_path), "--gpus", "8", "--global-batch", "8",
                 "--seq-len", "512", "--top", "3", "--out", tmp_path / "best.yaml", "--time-limit", "3", "--json")
    assert result.exit_code == 0, result.output
    counts = json.loads(result.stdout)["counts"]
    assert clock[0] == 1002 and counts["profiles"] == 1  # the sample (the command's), one profile, one solve
    assert counts["solved"] == counts["solved_early"] == 1 and not counts["complete"]
    assert counts["unexplored"] > 0 and (tmp_path / "best.yaml").exists()
    text = run("search", "--arch-config", _tiny_config(tmp_path), "--gpus", "8", "--global-batch", "8",
               "--seq-len", "512", "--top", "3", "--out", tmp_path / "best2.yaml", "--time-limit", "3")
    said = " ".join(text.output.split())
    assert text.exit_code == 0, text.output
    assert "1 of them the best bound kept when half of --time-limit had gone to profiles" in said
    assert "configurations not explored, the deadline passing before them (profiles built: 1);" in said
    assert "the ranking is the best of what was solved" in said


@pytest.mark.parametrize("limit_s", [1, 2])
def test_no_solve_is_started_past_the_limit(limit_s):
    # 1 s: the deadline passes with the first profile, before any configuration is kept: no solve is started
    # past it; 2 s: half of it passes with the first, and the configuration kept with it is solved
    outcome, built = _search(limit_s)
    assert len(built) == limit_s and not outcome.complete
    assert outcome.solved_early == (0 if limit_s == 1 else 1)
