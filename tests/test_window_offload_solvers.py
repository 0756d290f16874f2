"""The solvers under a runtime that offloads as Transformer Engine's window (planner/cost/te_offload.py): evaluate
charges a one-stage pipeline's offloaded layers together, the block's first N as TE's handler runs them, which
no per-layer row of the DP or the MILP sums to, so the solvers do not take the per-layer offload option there
(useful.useful_options, te_offload.window_runs). Before, the DP chose it and its objective left evaluate's
(`ckplan search --arch llama3-70b --gpus 64 ... --runtime megatron`: a SolverMismatch traceback;
docs/published-runs.md §37.mismatch)."""

from __future__ import annotations

import dataclasses

import pytest
from fixtures.cli import run_ok
from test_launchers import _tiny_config
from test_megatron_offload import _write

from planner import io
from planner.cost import costmodel, runtimes, te_offload
from planner.schema import OPTION_OFFLOAD
from planner.solve import search
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


@pytest.mark.parametrize("solver", ["dp", "milp"])
def test_the_solvers_objective_is_evaluate_s_where_te_s_window_runs(tmp_path, solver):
    # before, both offloaded layers.0 (the block's first 1: TE's window): SolverMismatch, 16.130567 ms against
    # evaluate's 16.130422
    profile, setup = _tiny_megatron(tmp_path)
    assert te_offload.window_runs(setup)
    found = _solve(profile, setup, solver)
    cost = costmodel.evaluate(found.stages, profile, setup)
    assert found.solve.objective == pytest.approx(cost.iteration_ms, rel=1e-6)
    assert _offloaded(found.stages) == [] and search.in_rows(cost)


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


def test_only_a_one_stage_pipeline_runs_the_window(tmp_path):
    profile, setup = _tiny_megatron(tmp_path)
    layer = next(layer for layer in costmodel.layer_costs(profile) if layer.kind == "decoder_block")
    offload = next(o for o, option in enumerate(layer.options) if option.name == OPTION_OFFLOAD)
    assert offload not in costmodel.useful_options(layer, costmodel.Context(profile, setup))
    caps = setup.pipeline.mem_caps_bytes * 2
    two = setup.model_copy(update={"pipeline": setup.pipeline.model_copy(update={"stages": 2, "mem_caps_bytes": caps})})
    assert not te_offload.window_runs(two)  # megatron-core refuses --cpu-offloading with PP: ckplan's option stands
    assert offload in costmodel.useful_options(layer, costmodel.Context(profile, two))


def test_a_megatron_search_that_raised_answers(tmp_path):
    """`ckplan search` on one GB200 under --runtime megatron at 2 GB: before, SolverMismatch (the DP offloaded
    the block's first layers, 16.330 ms against evaluate's 16.228); now a plan, exit 0."""
    out = tmp_path / "best.yaml"
    run_ok("search", "--arch-config", _tiny_config(tmp_path), "--gpus", "1", "--global-batch", "8", "--seq-len",
           "2048", "--runtime", "megatron", "--gpu", "gb200", "--mem", "2GB", "--out", out)
    plan = io.load_plan(out)
    assert plan.stages and _offloaded(plan.stages) == []
