"""The solvers under a runtime that offloads as Transformer Engine's window (planner/cost/te_offload.py): evaluate
charges a one-stage pipeline's offloaded layers together, the block's first N as TE's handler runs them, which
no per-layer row of the DP or the MILP sums to, so the solvers do not take the per-layer offload option there
(useful.useful_options, te_offload.window_runs) and choose the window whole instead, the fastest N
(planner/solve/dpwindow.py, dpwindow.with_window). Before the per-layer rows went, the DP chose the option and its
objective left evaluate's (`ckplan search --arch llama3-70b --gpus 64 ... --runtime megatron`: a SolverMismatch
traceback; docs/published-runs.md §37.mismatch); before the window, no solver offloaded there (§39.megoffload)."""

from __future__ import annotations

import dataclasses

import pytest
from fixtures.cli import run_ok
from test_launchers import _tiny_config
from test_megatron_offload import _write

from planner import io
from planner.cost import costmodel, reserve, runtimes, te_offload
from planner.cost.float8 import float8_profile
from planner.schema import OPTION_OFFLOAD, StagePlan
from planner.solve import dpsolve, dpwindow, search
from planner.solve.deadline import Deadline


def _tiny_megatron(tmp_path):
    """The tiny 4-layer Megatron job on one GB200 (its host link makes an offload cheaper than a recompute),
    its cap cut to its own no-recompute peak over the 0.85 divisor: the DP then needs to free some bytes."""
    from planner.commands.evaluate_config import predict
    from planner.models.configs import megatron

    found = predict(megatron.read(_write(tmp_path)), gpus=1, gpu_name="gb200")
    cap = int(found.cost.stages[0].peak_bytes / 0.85)
    pipeline = found.setup.pipeline.model_copy(update={"mem_caps_bytes": [cap]})
    return found.profile, found.setup.model_copy(update={"pipeline": pipeline})


def _offloaded(stages) -> list[str]:
    return [name for stage in stages for name in stage.layers if stage.option(name) == OPTION_OFFLOAD]


def _solve(profile, setup, solver: str):
    """One solve under the caps as given (search.plan's step under each set of caps it tries), checked against
    evaluate (search._checked: SolverMismatch where the objective is not evaluate's)."""
    return search._plan_once(profile, setup, solver=solver, mip_gap=1e-4, threads=None, log=False,
                             upper_bound_ms=None, start=None, deadline=Deadline(None), baselines_scored=True)


def _plan(profile, setup, solver: str):
    """search.plan: the solver's plan or TE's window, whichever is faster and admitted."""
    return search.plan(profile, setup, solver=solver, deadline=Deadline(None))


def _window_plan(profile, num: int) -> list[StagePlan]:
    """One stage, the block's first `num` decoder layers offloaded, the rest at none: TE's window at N = num."""
    names = [layer.name for layer in profile.layers]
    block = [layer.name for layer in profile.layers if layer.kind == "decoder_block"]
    return [StagePlan(index=0, layers=names, recompute={name: OPTION_OFFLOAD for name in block[:num]})]


def _brute_force(profile, setup) -> dict[int, float]:
    """Every N whose window plan meets the solvers' rows under evaluate, with evaluate's time."""
    costs = {num: costmodel.evaluate(_window_plan(profile, num), profile, setup) for num in range(1, 4)}
    return {num: cost.iteration_ms for num, cost in costs.items() if search.in_rows(cost)}


@pytest.mark.parametrize("solver", ["dp", "milp"])
def test_the_solvers_take_te_s_window_where_it_is_fastest_and_agree_with_evaluate(tmp_path, solver):
    # before (§37.mismatch) neither offloaded: 16.131005 ms (DP), 16.131027 (MILP), recomputing; the window at N = 2
    # (N = 1 passes the rows) is 16.129504 ms, as evaluate charges it. TE v2.9's window (the Bridge's megatron-core:
    # v2.10's holds a group fewer, so N = 1 meets the rows there, test_te210_window.py)
    profile, setup = _tiny_megatron(tmp_path)
    setup = setup.model_copy(update={"training": setup.training.model_copy(update={"runtime_version": "92c8482e"})})
    divisor = setup.pipeline.model_copy(update={"fragmentation": 0.15})  # the rows are the verdict: no replay
    setup = setup.model_copy(update={"pipeline": divisor})
    assert te_offload.window_runs(setup)
    found = _plan(profile, setup, solver)
    cost = costmodel.evaluate(found.stages, profile, setup)
    assert found.solve.objective == pytest.approx(cost.iteration_ms, rel=1e-9) and cost.feasible
    windows = _brute_force(profile, setup)
    assert 1 not in windows and found.solve.objective == pytest.approx(min(windows.values()), rel=1e-12)
    assert _offloaded(found.stages) == ["layers.0", "layers.1"]  # the first N = 2, the fastest, first of equals
    assert all(option == OPTION_OFFLOAD for stage in found.stages for option in stage.recompute.values())
    per_layer, _ = dpsolve.fastest_plan(profile, setup, upper_bound_ms=None, deadline=Deadline(None))
    assert costmodel.evaluate(per_layer, profile, setup).iteration_ms > found.solve.objective


def test_the_dp_over_n_is_evaluate_at_every_n(tmp_path, monkeypatch):
    """A host link slow enough that the copies show past the compute (1 ms a MiB): each N's time from the DP's
    sums is evaluate's for that N's plan, and the fastest N is the brute force's."""
    profile, setup = _tiny_megatron(tmp_path)
    big = setup.pipeline.model_copy(update={"mem_caps_bytes": [2 * setup.pipeline.mem_caps_bytes[0]]})
    setup = setup.model_copy(update={"pipeline": big})
    monkeypatch.setattr(reserve, "host_copy_ms_per_byte", lambda profile, setup: 1.0 / 2**20)
    times = {num: ms for (first, num), ms in dpwindow.window_times(profile, setup).items()}
    brute = _brute_force(profile, setup)
    assert set(times) == set(brute) == {1, 2, 3}
    for num, ms in brute.items():
        assert times[num] == pytest.approx(ms, rel=1e-12)
    assert len({round(ms, 6) for ms in brute.values()}) == 3  # N matters here: the copies are exposed
    stages, best_ms = dpwindow.fastest_window(profile, setup)
    assert best_ms == pytest.approx(min(brute.values()), rel=1e-12)
    assert len(_offloaded(stages)) == min(brute, key=brute.get)


def test_where_the_record_offloads_per_layer_the_solvers_still_offload(tmp_path, monkeypatch):
    """The same job with the record's fact off: evaluate charges ckplan's per-layer option, the rows the DP
    sums, and the DP offloads (so the test above does not pass for want of an offload worth taking)."""
    profile, setup = _tiny_megatron(tmp_path)
    record = runtimes.of
    monkeypatch.setattr(te_offload.runtimes, "of",
                        lambda training: dataclasses.replace(record(training), te_window_offload=False))
    assert not te_offload.window_runs(setup)
    found = _solve(profile, setup, "dp")
    assert _offloaded(found.stages)
    assert found.solve.objective == pytest.approx(costmodel.evaluate(found.stages, profile, setup).iteration_ms,
                                                  rel=1e-9)


def _offload_index(profile) -> tuple[costmodel.LayerCost, int]:
    layer = next(layer for layer in costmodel.layer_costs(profile) if layer.kind == "decoder_block")
    return layer, next(o for o, option in enumerate(layer.options) if option.name == OPTION_OFFLOAD)


def _two_stages(setup):
    caps = setup.pipeline.mem_caps_bytes * 2
    return setup.model_copy(update={"pipeline": setup.pipeline.model_copy(update={"stages": 2, "mem_caps_bytes": caps})})


def test_megatron_offers_no_offload_beside_a_pipeline(tmp_path, monkeypatch):
    """megatron-core refuses --cpu-offloading with PP > 1 (the record's offload_refuses_pipeline): at one stage
    the window is the solvers' choice, at two no offload is offered; with the fact off (a control) it is."""
    profile, setup = _tiny_megatron(tmp_path)
    layer, offload = _offload_index(profile)
    assert offload not in costmodel.useful_options(layer, costmodel.Context(profile, setup))
    two = _two_stages(setup)
    assert not te_offload.window_runs(two) and te_offload.pipeline_refuses(two)
    assert offload not in costmodel.useful_options(layer, costmodel.Context(profile, two))
    record = runtimes.of
    monkeypatch.setattr(te_offload.runtimes, "of",
                        lambda training: dataclasses.replace(record(training), offload_refuses_pipeline=False))
    assert offload in costmodel.useful_options(layer, costmodel.Context(profile, two))


def test_a_megatron_search_that_raised_answers_with_a_plan_megatron_runs(tmp_path):
    """`ckplan search` on one GB200 under --runtime megatron at 2 GB: before §37.mismatch, SolverMismatch (the DP
    offloaded the block's first layers, 16.330 ms against evaluate's 16.228); now a plan, exit 0, and where it
    offloads, TE's window as megatron-core runs it (the first N decoder layers, nothing recomputed beside)."""
    out = tmp_path / "best.yaml"
    run_ok("search", "--arch-config", _tiny_config(tmp_path), "--gpus", "1", "--global-batch", "8", "--seq-len",
           "2048", "--runtime", "megatron", "--gpu", "gb200", "--mem", "2GB", "--out", out)
    plan = io.load_plan(out)
    # the profile as search charges it (float8_profile: TE's fused SwiGLU keeps only its input, te_kept.py)
    profile = float8_profile(io.load_profile(io.plan_profile_path(plan, out, remedy="")), plan.setup)
    assert costmodel.evaluate(plan.stages, profile, plan.setup).feasible  # the replay's verdict: it fits
    offloaded = _offloaded(plan.stages)
    assert plan.stages and offloaded == [f"layers.{i}" for i in range(len(offloaded))]
    assert not offloaded or all(option == OPTION_OFFLOAD for stage in plan.stages for option in stage.recompute.values())


def test_a_window_beside_a_per_layer_plan_over_the_caps_is_a_plan_without_a_bound(tmp_path):
    """with_window handed a per-layer plan that evaluate does not admit (cost.feasible False): the admitted window
    replaces it, "feasible" with no bound (that plan proves nothing of the other per-layer plans), the solver's name
    kept; before, it read NoFit's `solver` off the PlanResult and raised AttributeError."""
    from planner.solve import replayfit
    from planner.solve.highs import SolveResult
    from planner.solve.results import PlanResult

    profile, base = _tiny_megatron(tmp_path)
    cap = int(base.pipeline.mem_caps_bytes[0] * 0.95)  # the all-none plan over it; a window admitted at the relaxed rows
    setup = base.model_copy(update={"pipeline": base.pipeline.model_copy(update={"mem_caps_bytes": [cap]})})
    stages = [StagePlan(index=0, layers=[layer.name for layer in profile.layers], recompute={})]
    cost = costmodel.evaluate(stages, profile, setup)
    assert not cost.feasible
    found = PlanResult(stages, cost, SolveResult("feasible", cost.iteration_ms, None, 0.0, solver="dp"))
    out = dpwindow.with_window(profile, setup, found, Deadline(None), None, replayfit.relaxed_caps(profile, setup))
    assert out is not found and out.cost.feasible and _offloaded(out.stages)
    assert (out.solve.status, out.solve.solver, out.solve.bound, out.solve.gap) == ("feasible", "dp", None, None)
    assert out.cost.iteration_ms == pytest.approx(costmodel.evaluate(out.stages, profile, setup).iteration_ms)


def test_a_window_the_deadline_stops_before_it_is_weighed_says_so(tmp_path):
    """with_window stopped by the deadline before it weighs TE's window: the per-layer plan it hands back is not
    the setup's answer (the window is faster), so it says it timed out, and a search's queue solves it again.
    Before, it came back as the DP's "optimal": B4's tp1 pp1 dp512 ZeRO 3 cp2 configuration, stopped at its share
    two clock reads before its end, ranked 14,317.632 ms where its answer is 11,700.070 (§45.membound2)."""
    profile, setup = _tiny_megatron(tmp_path)
    setup = setup.model_copy(update={"training": setup.training.model_copy(update={"runtime_version": "92c8482e"})})
    setup = setup.model_copy(update={"pipeline": setup.pipeline.model_copy(update={"fragmentation": 0.15})})
    per_layer = _solve(profile, setup, "dp")
    answer = dpwindow.with_window(profile, setup, per_layer, Deadline(None), None, None)
    assert answer.cost.iteration_ms < per_layer.cost.iteration_ms and not per_layer.solve.timed_out
    stopped = dpwindow.with_window(profile, setup, per_layer, Deadline(0.0), None, None)
    assert stopped.stages == per_layer.stages and stopped.solve.timed_out
    assert (stopped.solve.status, stopped.solve.bound) == ("feasible", None)  # its bound is the per-layer plans'
    none = search.NoFit("infeasible", 0.0, "dp")  # no per-layer plan fits: the window, not weighed, may
    assert dpwindow.with_window(profile, setup, none, Deadline(0.0), None, None).status == "timeout"
