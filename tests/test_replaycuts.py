"""The DP held to the allocator replay by lazy cuts (planner/solve/replaycuts.py): where the relaxed rows' plan is
over by the replay, each over stage's exact set is excluded and the DP solved again until its plan fits, which is
then the fastest plan that fits (against a brute force over every split and option vector, the replay the judge);
a larger cap never returns a slower plan (Mistral-NeMo-12B at 77 and 80 GB did: docs/published-runs.md §39)."""

from __future__ import annotations

import itertools
import json

import pytest
from fixtures.cli import run_ok

from planner import io
from planner.cost import costmodel
from planner.models import synthetic
from planner.schema import AllocRecord, DeviceInfo, TrainSetup
from planner.solve import planning, replaycuts, replayfit, search

MIB = 1 << 20
# parameter copies of 10 MiB + 524 B: each a 12 MiB segment whose 2 MiB tail nothing later fits (test_solvefit's
# TAILED): the replay reserves more than the allocated peak, so the relaxed rows admit plans the replay puts over
TAILED = int(10.0005 * MIB)
ACTS = (40, 24, 56, 32, 48, 36)  # MiB a block keeps: unlike, so the splits differ in what they hold


def _profile(acts=ACTS):
    """Blocks of one 10 MiB + 524 B parameter, keeping `acts` MiB each (a forward record of that many bytes
    in three tensors), recomputed or not; 10 ms forward, 20 ms backward."""
    def record(act):
        return AllocRecord(forward=[(act - 10) * MIB, 4 * MIB, -2, 6 * MIB], backward=[1 * MIB, -1], output=3,
                           input_grad=4, params=[TAILED])
    layers = [synthetic.layer(f"blocks.{i}", "Block", fwd_ms=10, act_mib=act, input_mib=1, param_count=TAILED // 4)
              for i, act in enumerate(acts)]
    profile = synthetic.profile_of(layers, name="tiny6")
    layers = [layer.model_copy(update={"alloc_records": {"none": record(act), "full": record(act)}})
              for layer, act in zip(profile.layers, acts)]
    return profile.model_copy(update={
        "layers": layers, "device": DeviceInfo(type="cuda", name="test gpu"),
        "loss_alloc": AllocRecord(forward=[512, 4 * MIB, -2], backward=[2 * MIB], output=1, input_grad=3)})


def _setup(cap_mib: int, stages: int = 2) -> TrainSetup:
    return TrainSetup(stages=stages, microbatches=2 * stages, micro_batch_size=1,
                      mem_caps_bytes=[cap_mib * MIB] * stages)


def _brute(profile, setup) -> float | None:
    """The fastest plan the replay admits, over every split and every layer recomputed or not."""
    count, best = len(profile.layers), None
    for cuts in itertools.combinations(range(1, count), setup.pipeline.stages - 1):
        for options in itertools.product((0, 1), repeat=count):
            cost = costmodel.evaluate(costmodel.split_to_stages([0, *cuts], list(options), profile), profile, setup)
            if cost.feasible and (best is None or cost.iteration_ms < best):
                best = cost.iteration_ms
    return best


@pytest.fixture(scope="module")
def profile():
    return _profile()


def test_the_relaxed_rows_plan_is_over_and_the_search_over_caps_missed_the_fastest(profile):
    """The case: at 918 MiB the relaxed rows' plan is over by the replay; the search over caps (§37.solvefit)
    answered 640 ms "feasible", the brute force finds 580 ms."""
    setup = _setup(918)
    relaxed = replayfit.relaxed_caps(profile, setup)
    under = setup.model_copy(update={"pipeline": setup.pipeline.model_copy(update={"mem_caps_bytes": relaxed})})
    first = search._plan_once(profile, under, solver="dp", mip_gap=0.0, threads=None, log=False, upper_bound_ms=None,
                              start=None, deadline=search.Deadline(None), baselines_scored=False)
    assert not costmodel.evaluate(first.stages, profile, setup).feasible
    assert _brute(profile, setup) == 580.0


@pytest.mark.parametrize("cap_mib", [909, 912, 918, 923, 933])
def test_solve_is_the_brute_force_over_every_plan_with_the_replay_the_judge(profile, cap_mib):
    """909 MiB: none fits (the cuts exclude every plan the relaxed rows admit, a proof); 912-923 MiB: 620, 580,
    530 ms after cuts; 933 MiB: 490 ms, the relaxed rows' first plan fits. (530 ms was first admitted at 921 MiB:
    boundgrad3's warm-up send holds stage 0's 1 MiB output, its own block in the replay, a 2 MiB small segment
    more: 394,264,576 -> 396,361,728 B reserved, so 923.)"""
    setup = _setup(cap_mib)
    found, best = search.plan(profile, setup, solver="dp"), _brute(profile, setup)
    if best is None:
        assert cap_mib == 909 and isinstance(found, search.NoFit) and found.status == "infeasible"
        return
    assert found.cost.feasible and found.cost.iteration_ms == best == {912: 620.0, 918: 580.0, 923: 530.0,
                                                                        933: 490.0}[cap_mib]
    assert found.solve.status == "optimal" and found.solve.gap == 0.0
    assert (found.solve.replay, found.solve.solves > 1) == (("relaxed", False) if cap_mib == 933 else ("cut", True))


@pytest.mark.parametrize("cap_mib", [909, 912, 918, 933])
def test_the_milps_no_good_cuts_reach_the_brute_force_too(profile, cap_mib):
    """The MILP's twin: each over stage's integer point (prefix and option counts) excluded by a no-good row."""
    setup = _setup(cap_mib)
    found, best = search.plan(profile, setup, solver="milp", mip_gap=0.0), _brute(profile, setup)
    if best is None:
        assert cap_mib == 909 and isinstance(found, search.NoFit) and found.status == "infeasible"
        return
    assert found.cost.iteration_ms == best and found.solve.status == "optimal" and found.solve.solver == "milp"
    assert found.solve.replay == ("relaxed" if cap_mib == 933 else "cut")


def test_a_larger_cap_never_returns_a_slower_plan(profile):
    """The NeMo-style sweep: every cap from 906 to 936 MiB in 3 MiB steps; the times never rise."""
    times = []
    for cap_mib in range(906, 937, 3):
        found = search.plan(profile, _setup(cap_mib), solver="dp")
        times.append(found.cost.iteration_ms if isinstance(found, search.PlanResult) else float("inf"))
    assert times == sorted(times, reverse=True)
    assert times[0] == float("inf") and times[-1] == 490.0  # none fits at 906 MiB; the relaxed plan at 936 MiB


def test_no_plan_faster_than_the_known_one_fits_proves_it(profile):
    """A plan known to fit and no faster one the cuts admit: the known plan, "optimal"."""
    setup = _setup(918)
    best = search.plan(profile, setup, solver="dp")
    relaxed = replayfit.relaxed_caps(profile, setup)
    again = replaycuts.fastest_fitting(profile, setup, relaxed, evaluate=lambda s: costmodel.evaluate(s, profile, setup),
                                       known=(best.stages, best.cost), upper_bound_ms=None,
                                       deadline=search.Deadline(None))
    assert again.solve.status == "optimal" and again.cost.iteration_ms == best.cost.iteration_ms == 580.0


def test_unclosed_cuts_give_way_to_the_search_with_their_bound(profile):
    """One round allowed: the cuts do not close; their last solve's time bounds any plan that fits."""
    setup = _setup(918)
    relaxed = replayfit.relaxed_caps(profile, setup)
    unclosed = replaycuts.fastest_fitting(profile, setup, relaxed, known=None, upper_bound_ms=None,
                                          evaluate=lambda s: costmodel.evaluate(s, profile, setup),
                                          deadline=search.Deadline(None), max_rounds=1)
    assert isinstance(unclosed, replaycuts.Unclosed) and unclosed.solves == 1 and unclosed.excluded >= 1
    assert unclosed.bound_ms <= 580.0
    # its one solve, the relaxed rows' plan (over by the replay), is the search over caps' first: not solved again
    assert not unclosed.first.cost.feasible and unclosed.first.solve.bound == unclosed.bound_ms
    searched = replayfit.search_caps(setup, relaxed, lambda caps, bar, first: pytest.fail("solved again")
                                     if caps == relaxed else search.NoFit("infeasible", 0.0, "dp"),
                                     evaluate=lambda s: costmodel.evaluate(s, profile, setup), least_memory=lambda: None,
                                     known_ms=None, elapsed_s=lambda: 0.0, first=unclosed.first)
    assert isinstance(searched, search.NoFit)  # every cap between gave none here (the stub), and no least plan


def test_solve_says_what_the_cut_status_proves(tmp_path, profile):
    path = tmp_path / "tiny6.json"
    io.save_profile(profile, path)
    args = ("solve", "--profile", path, "--stages", "2", "--microbatches", "4", "--mem", "918MiB", "--solver", "dp",
            "--out", tmp_path / "plan.yaml")
    summary = json.loads(run_ok(*args, "--json").stdout)
    assert (summary["status"], summary["replay"], summary["iteration_ms"], summary["gap"]) == ("optimal", "cut", 580.0, 0.0)
    told = " ".join(run_ok(*args).output.split())
    assert "'optimal' holds against the replay, over the checkpoint sets the DP weighs" in told
    assert io.load_plan(tmp_path / "plan.yaml").solver.replay == "cut"


def test_a_search_over_caps_cut_by_the_deadline_says_so_not_that_none_fits(profile):
    """The relaxed rows' plan is over by the replay, and the next solve meets the deadline: the search found no
    plan in its time, which is not a proof that none fits (it said "infeasible", and solve "no plan fits the caps")."""
    setup = _setup(918)
    relaxed = replayfit.relaxed_caps(profile, setup)
    evaluate = lambda s: costmodel.evaluate(s, profile, setup)  # noqa: E731
    first = replaycuts.fastest_fitting(profile, setup, relaxed, known=None, upper_bound_ms=None, evaluate=evaluate,
                                       deadline=search.Deadline(None), max_rounds=1).first
    searched = replayfit.search_caps(setup, relaxed, lambda caps, bar, first: search.NoFit("timeout", 60.0, "dp"),
                                     evaluate=evaluate, least_memory=lambda: None, known_ms=None, elapsed_s=lambda: 60.0,
                                     first=first)
    assert isinstance(searched, search.NoFit) and searched.status == "timeout"
    told = " ".join(planning.Unplanned("timeout", None, 60.0).message(setup).split())
    assert "raise --time-limit, which bounds the baselines and the search together" in told
    assert "each of the search's solves under caps costs seconds" in told
    # where no replay judges the fit (a stated --fragmentation), the sentence is the plain one
    plain = _setup(918).model_copy(update={"pipeline": setup.pipeline.model_copy(update={"fragmentation": 0.1})})
    assert planning.Unplanned("timeout", None, 60.0).message(plain).endswith("; raise --time-limit")


def test_a_timeout_under_the_replay_quotes_the_jobs_own_figures(tmp_path, profile, monkeypatch):
    """The timeout's words named one model's figure (Mistral-Small-24B at --time-limit 240) to every job: they say
    this job's stages, the baselines scored and the seconds spent."""
    from fixtures.cli import run

    from planner.solve import baselines

    path = tmp_path / "tiny6.json"
    io.save_profile(profile, path)
    monkeypatch.setattr(search, "plan", lambda *args, **kwargs: search.NoFit("timeout", 1.0, "dp"))
    result = run("solve", "--profile", path, "--stages", "2", "--microbatches", "4", "--mem", "918MiB", "--solver",
                 "dp", "--out", tmp_path / "plan.yaml")
    told = " ".join(result.output.split())
    assert result.exit_code != 0 and "Mistral" not in told
    total = len(baselines.BASELINES)
    assert "judged by the allocator's replay of its 2 stages" in told
    assert f"{total} of the {total} baselines were scored, and the search" in told
    assert " s " in told.split("; in ")[1] and "the search under caps found no plan in what was left" in told


def test_a_search_over_caps_cut_with_a_plan_says_the_limit_that_lets_it_finish(profile):
    """Mistral-Small-24B on 8 stages at 80GB (docs/published-runs.md §42.usertrial5): at the default --time-limit
    the search over caps made 5 of its solves, gave a plan 29.7% over its bound, and said only "a faster plan may
    fit"; at 120 s it made 13 and found one 1.5% over. The cut search now says how many solves it left and the limit
    that would let it make them: the seconds spent, and each one left at the mean of those made."""
    from planner.commands.solve_report import cut_short, replay_line
    from planner.schema import SolverInfo

    setup = _setup(918)
    relaxed = replayfit.relaxed_caps(profile, setup)
    evaluate = lambda s: costmodel.evaluate(s, profile, setup)  # noqa: E731
    first = replaycuts.fastest_fitting(profile, setup, relaxed, known=None, upper_bound_ms=None, evaluate=evaluate,
                                       deadline=search.Deadline(None), max_rounds=1).first
    fits = search.plan(profile, setup, solver="dp")
    assert fits.cost.feasible and not first.cost.feasible
    answers = iter([fits, search.NoFit("timeout", 60.0, "dp")])
    clock = itertools.count(5, 5)  # each reading of the clock 5 s later: the first round 5 s, its next cut at 15 s
    searched = replayfit.search_caps(setup, relaxed, lambda caps, bar, first: next(answers), evaluate=evaluate,
                                     least_memory=lambda: None, known_ms=None, elapsed_s=lambda: next(clock),
                                     first=first)
    assert searched.solve.status == "feasible" and searched.solve.replay == "searched"
    assert (searched.solve.rounds_left, searched.solve.round_s, searched.solve.wall_s) == (
        replayfit.REPLAY_ROUNDS - 1, 5.0, 20)
    assert searched.solve.timed_out
    info = SolverInfo(status="feasible", wall_s=20, replay="searched", solves=2, rounds_left=5, round_s=5.0,
                      timed_out=True)
    assert cut_short(info) == ("--time-limit ran out with at most 5 of the search's solves under caps unmade, 5.0 s "
                               "each here (a DP and the allocator's replay of every stage): --time-limit 45 lets it "
                               "finish")
    assert "--time-limit" not in replay_line(info)
    assert cut_short(info.model_copy(update={"rounds_left": 0, "timed_out": False})) is None


def test_a_solve_the_deadline_stopped_says_so(tmp_path, profile):
    """Phi-4 on 4 stages at 80GB (§42.usertrial5): the default --time-limit stopped the DP, solve returned the
    full-checkpointing baseline "feasible, gap 2.26e-01" and said the status "holds against the replay", never that
    the limit had cut it. A plan the deadline stopped is now marked and said so."""
    from planner.commands.solve_report import cut_short
    from planner.schema import SolverInfo

    setup = _setup(918)
    fits = search.plan(profile, setup, solver="dp")
    assert not fits.solve.timed_out
    stopped = search.plan(profile, setup, solver="dp", start=fits.stages, upper_bound_ms=fits.cost.iteration_ms,
                          deadline=search.Deadline(1e-9))
    assert stopped.solve.status == "feasible" and stopped.solve.timed_out
    assert stopped.cost.iteration_ms == fits.cost.iteration_ms
    info = SolverInfo(status="feasible", wall_s=61.25, timed_out=True)
    assert cut_short(info) == ("--time-limit ran out after 61.2 s, before the solver finished: this is the best plan "
                               "it had then (a baseline where it had none faster); a longer --time-limit lets it "
                               "finish and may find a faster plan")


class _Clock:
    """A clock the test moves."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_cuts_keep_the_time_while_a_round_leaves_the_search_over_caps_its_rounds():
    """No share of the time fixed: the first round takes what is left; each later one starts while the time left
    holds it and replayfit.REPLAY_ROUNDS more at the rounds' mean so far, and is given that time less theirs."""
    clock = _Clock()
    rounds = replaycuts._Rounds(search.Deadline(100.0, clock=clock), after=replayfit.REPLAY_ROUNDS)
    assert replayfit.REPLAY_ROUNDS == 6
    assert rounds.next().limit_s == 100.0
    clock.now = 10.0
    rounds.ended()  # one round of 10 s: 90 s left >= 7 x 10
    assert rounds.next().limit_s == 90.0 - 6 * 10.0
    clock.now = 30.0
    rounds.ended()  # a round of 20 s: mean 15, 70 s left < 7 x 15
    assert rounds.next() is None
    unlimited = replaycuts._Rounds(search.Deadline(None), after=6)
    unlimited.taken.append(1e9)
    assert unlimited.next().limit_s is None
    alone = replaycuts._Rounds(search.Deadline(100.0, clock=clock), after=0)  # nothing after: all that is left
    clock.now = 80.0
    alone.taken.append(50.0)
    assert alone.next().limit_s == 50.0


@pytest.mark.parametrize("round_s, solves", [(30.0, 1), (12.0, 2), (10.0, 4)])
def test_the_cuts_give_way_when_the_time_left_holds_no_more_rounds(profile, monkeypatch, round_s, solves):
    """A 100 s solve at 918 MiB, whose cuts close at their fourth solve, its DP solves taking `round_s` each: at
    30 s one round (70 s left < 7 x 30), at 12 s two (76 s < 84), at 10 s the four they need (after the third,
    70 s = 7 x 10): the fastest plan that fits, proven. Where they give way, their bound is the search's."""
    from planner.solve import dpsolve

    clock = _Clock()
    solve = dpsolve.fastest_plan

    def timed(*args, **kwargs):  # done as its time is up
        found = solve(*args, **kwargs)
        clock.now += round_s
        return found

    monkeypatch.setattr(dpsolve, "fastest_plan", timed)
    setup = _setup(918)
    relaxed = replayfit.relaxed_caps(profile, setup)
    found = replaycuts.fastest_fitting(profile, setup, relaxed, known=None, upper_bound_ms=None,
                                       evaluate=lambda s: costmodel.evaluate(s, profile, setup),
                                       deadline=search.Deadline(100.0, clock=clock))
    assert clock.now == solves * round_s
    if solves == 4:
        assert found.solve.status == "optimal" and found.cost.iteration_ms == 580.0 and found.solve.solves == 4
        return
    assert isinstance(found, replaycuts.Unclosed) and found.solves == solves
    assert found.excluded >= solves and found.bound_ms <= 580.0
