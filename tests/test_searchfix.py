"""`ckplan search --time-limit` holds across the whole search, its profiles included (jobsearch.candidates
looks at the deadline before each profile it has not built), on an injected clock: no real waiting."""

from __future__ import annotations

import json

import pytest
from fixtures.cli import run
from test_launchers import _tiny_config
from test_search import MINI, GiB, profile_for

from planner.solve import jobsearch
from planner.solve.deadline import Deadline
from planner.solve.degrees import JobShape, enumerate_degrees
from planner.units import format_ms


def _first_keys(job: JobShape, n: int) -> tuple[list[tuple], int]:
    """By hand: the first n distinct profiles the enumeration asks for, in its order, and the index of the
    configuration that would need the (n+1)-th."""
    keys: list[tuple] = []
    for index, degrees in enumerate(enumerate_degrees(job)):
        key = (degrees.tp, degrees.sp, degrees.micro_batch_size)
        if key not in keys:
            if len(keys) == n:
                return keys, index
            keys.append(key)
    raise AssertionError("the job needs no more than n profiles")


@pytest.mark.parametrize("n", [1, 3])
def test_the_deadline_stops_the_search_after_n_profiles(n):
    job = JobShape(gpus=8, gpus_per_node=8, global_batch=16, seq_len=2048, num_layers=MINI.num_layers + 2,
                   tp_ok=(1, 2, 4, 8))
    options = jobsearch.JobOptions(mem_cap_bytes=2 * GiB, gpus_per_node=8)
    inner, built = profile_for(MINI), []

    def build(tp, sp, mbs, **keywords):
        built.append((tp, sp, mbs))
        return inner(tp, sp, mbs, **keywords)

    deadline = Deadline(n, clock=lambda: len(built))  # one second a profile
    outcome = jobsearch.search_job(job, options, build, deadline=deadline)
    keys, more = _first_keys(job, n)
    stop = _first_keys(job, n - 1)[1] + 1  # the deadline passes with the n-th profile: no configuration after it
    assert stop < more  # not even those whose profile is built (each bound ~30 ms at scale, §42.profspeed)
    assert built == keys  # n profiles, then no more
    assert outcome.profiles == n and outcome.considered == stop
    assert outcome.unexplored == len(enumerate_degrees(job)) - stop > 0
    assert not outcome.complete
    # at 3 s the configurations kept are solved in bound order between the profiles (solves free on this clock:
    # searchqueue.Queue, §43.searchorder), all while the enumeration ran; at 1 s the limit passes with the first, none
    # kept
    assert outcome.solved == outcome.solved_early and (outcome.ranked == []) == (outcome.solved == 0) == (n == 1)


@pytest.fixture
def clock(monkeypatch):
    """The search command's deadline on a clock that moves 1 s for each analytic profile built and 1000 s for each
    configuration solved."""
    import planner.profiler.analytic as analytic
    import planner.solve.deadline as deadline_mod

    now = [0.0]
    real_profile, real_solve = analytic.analytic_profile, jobsearch.solve_one

    def profile(*args, **kwargs):
        now[0] += 1
        return real_profile(*args, **kwargs)

    def solve(*args, **kwargs):
        solved = real_solve(*args, **kwargs)
        now[0] += 1000
        return solved

    monkeypatch.setattr(analytic, "analytic_profile", profile)
    monkeypatch.setattr(jobsearch, "solve_one", solve)
    monkeypatch.setattr(deadline_mod, "Deadline", lambda limit_s: Deadline(limit_s, clock=lambda: now[0]))
    return now


JOB = ("--gpus", "8", "--global-batch", "8", "--seq-len", "512", "--top", "3")


def test_a_search_cut_short_among_its_profiles_says_what_it_left_and_fails(tmp_path, clock):
    # 2 s: the sample profile and one more, nothing kept before the limit (at 3 s a configuration kept is solved
    # before the next: tests/test_searchtime.py)
    result = run("search", "--arch-config", _tiny_config(tmp_path), *JOB, "--out", tmp_path / "best.yaml",
                 "--time-limit", "2")
    said = " ".join(result.output.split())
    assert result.exit_code != 0 and clock[0] == 2  # the sample profile and one more
    assert "no configuration was solved to a plan that fits before --time-limit" in said
    assert "configurations not explored, the deadline passing before them (profiles built: 1);" in said
    assert "raise --time-limit" in said and not (tmp_path / "best.yaml").exists()


def test_a_search_cut_short_among_its_solves_writes_the_best_so_far(tmp_path, clock):
    result = run("search", "--arch-config", _tiny_config(tmp_path), *JOB, "--out", tmp_path / "best.yaml",
                 "--time-limit", "2500", "--json")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    counts = answer["counts"]
    # under the limit the solves take half the time (searchqueue.Queue): the best bound kept after the first profile
    # is solved (1000 s), the enumeration catches up (1 s a profile: every one built), then the rest in bound order
    # until the limit: 3 solves, ending at 1,002, 2,020 and 3,020 s (the clock), none started past 2,500
    assert clock[0] == 3020 and counts["solved"] == 3 and counts["solved_early"] == 1 and counts["unexplored"] == 0
    assert counts["not_solved"] > 0 and not counts["complete"] and (tmp_path / "best.yaml").exists()
    best, bound = answer["ranked"][0]["iteration_ms"], counts["best_unsolved_bound_ms"]
    text = run("search", "--arch-config", _tiny_config(tmp_path), *JOB, "--out", tmp_path / "best2.yaml",
               "--time-limit", "2500")
    said = " ".join(text.output.split())
    assert (f"{counts['not_solved']} passing the memory bound not solved, the best of them bounded at "
            f"{format_ms(bound)} against {format_ms(best)} found") in said
    assert " found): the ranking is the best of what was solved" in said


def test_search_charges_the_userbuffers_sms_as_evaluate_does(tmp_path):
    """Under --tp-overlap tp-comm-overlap every configuration searched gets TE's userbuffers config and the GPU's SMs
    (ub_sms.setup_fields, comm_setup's): its time is evaluate's, exactly, for the same plan and settings, and it is
    more than with no SMs taken (what search charged before)."""
    from planner.commands.search import _model
    from planner.commands.setup_options import DataParallelOptions, build_setup
    from planner.commands.training_settings import TrainingSettings
    from planner.cost import costmodel
    from planner.models import archs

    build = _model(None, _tiny_config(tmp_path), None, both=False).profile_for(archs.gpu("h100"), 512)
    # TP 2 with sequence parallelism: each block lists the eight collectives the userbuffers overlap
    job = JobShape(gpus=8, gpus_per_node=8, global_batch=8, seq_len=512, num_layers=6, tp_ok=(2,), fixed_tp=(2, True))
    options = jobsearch.JobOptions(mem_cap_bytes=40 * GiB, gpus_per_node=8, runtime="megatron",
                                   tp_overlap="tp-comm-overlap")
    ranked = jobsearch.search_job(job, options, build, top=3).ranked
    assert len(ranked) == 3
    for solved in ranked:
        g, profile = solved.degrees, solved.candidate.profile
        setup = build_setup(solved.candidate.plan_profile or profile, stages=g.pp, mem=str(40 * GiB),
                            microbatches=g.microbatches, schedule=g.schedule, chunks=g.chunks, optimizer="adam",
                            precision="bf16-mixed", parallel_stages=None, runtime="megatron",
                            data_parallel=DataParallelOptions(dp=g.dp, zero=g.zero, shard_group=g.shard_group,
                                                              gpus_per_node=8, tp_overlap="tp-comm-overlap",
                                                              settings=TrainingSettings()))
        assert solved.candidate.setup.comm.gpu_sms == setup.comm.gpu_sms == 132  # H100 SXM's SMs
        assert costmodel.evaluate(solved.stages, profile, setup).iteration_ms == solved.iteration_ms
        without = setup.model_copy(update={"comm": setup.comm.model_copy(update={"gpu_sms": 0})})
        assert costmodel.evaluate(solved.stages, profile, without).iteration_ms < solved.iteration_ms
