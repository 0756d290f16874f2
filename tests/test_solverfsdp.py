"""The DP and the MILP see Megatron-FSDP's buffers at their moments (planner/cost/megatron_fsdp_moments.py) as
evaluate() does: each unit's moments in its extra on every stage, the output layers' bucket queued through the
model's last unit and the output layer's own post-backward on the pipeline's last stage. Brute force over every
cut and recompute choice of a tiny LLaMA (three blocks, Float8 on b200, --fsdp-double-buffer, four ranks) against
both solvers' optimum and their plan's evaluate() verdict, at caps on either side of every plan's peak. The
profile is made a CPU one so a stage's limit is its cap to the byte (on CUDA the allocator's 2 MiB segments round
the limit past the moments' few KiB: the solvers' rows are the same functions either way).

Before the solvers placed the moments (this branch's base, 416499f), the DP picked at a cap of 936,960 B a plan of
0.7295 ms whose last stage evaluate() put 12,288 B over its cap (the brute-force optimum: 0.8267 ms), at 878,208 B
one where none fits, and at 1,145,984 B one of 0.6752 ms over the cap (0.7295); `ckplan solve` at 936,960 B
stopped on "solver plan exceeds the caps of stages [1] under evaluate()" (SolverMismatch)."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest
from click.testing import CliRunner
from test_bridge_memory import TINY, setup

from planner import io
from planner.cli import cli
from planner.cost import costmodel, float8, megatron_fsdp_moments
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef
from planner.solve import dpsegments, dpsolve, milp
from planner.solve.deadline import Deadline

THREE = dataclasses.replace(TINY, num_layers=3)


def _job(cap: int, *, stages: int = 2, recompute: str = "whole-layer", unfused: bool = True):
    return setup(float8=True, fp8_all_gather=True, dp=4, zero=3, fsdp_double_buffer=True, microbatches=4,
                 stages=stages, unfused_grad_accumulation=unfused, grad_reduce_bf16=True,
                 mem_caps_bytes=[cap] * stages, recompute=recompute)


def _base_profile(arch=THREE):
    """The tiny LLaMA's analytic profile on b200, made a CPU one (the limit is the cap)."""
    tiny = analytic.analytic_profile(arch, Shape(seq_len=32, micro_batch_size=2), gpu=archs.gpu("b200"),
                                     model=FileRef(file="arch:test", sha256="0" * 64))
    return tiny.model_copy(update={"device": tiny.device.model_copy(update={"type": "cpu"})})


def _profile(job, arch=THREE):
    return float8.float8_profile(_base_profile(arch), job)  # as solve and evaluate apply --float8


def _every_plan(tiny, job):
    """(iteration ms, each stage's allocated peak, stages) of every cut and whole-layer choice, by evaluate()."""
    count = len(costmodel.layer_costs(tiny))
    plans = []
    for cut in range(1, count):
        for options in itertools.product((0, 1), repeat=count):
            stages = costmodel.split_to_stages([0, cut], list(options), tiny)
            cost = costmodel.evaluate(stages, tiny, job)
            plans.append((cost.iteration_ms, [stage.peak_bytes for stage in cost.stages], stages))
    return plans


@pytest.fixture(scope="module")
def brute():
    job = _job(2**40)
    tiny = _profile(job)
    return tiny, _every_plan(tiny, job)


def _caps(plans) -> list[int]:
    """A cap at, and a byte and a few KiB under, what each plan's largest stage needs (its peak + the margin)."""
    needs = sorted({max(peaks) + costmodel.FIT_MARGIN_BYTES for _, peaks, _ in plans})
    return [need - below for need in needs for below in (0, 1, 4096, 12288)]


def _optimum(plans, cap: int) -> float | None:
    fitting = [ms for ms, peaks, _ in plans if max(peaks) + costmodel.FIT_MARGIN_BYTES <= cap]
    return min(fitting, default=None)


def _fits(stages, tiny, job) -> bool:
    return all(stage.fits_allocated for stage in costmodel.evaluate(stages, tiny, job).stages)


def test_the_moments_move_the_peaks_here(brute):
    """The case has moments to see: the plans' peaks with and without the double buffer's moments differ."""
    tiny, plans = brute
    job = _job(2**40)
    assert megatron_fsdp_moments.applies(job)
    held = megatron_fsdp_moments.held_layers(costmodel.Context(tiny, job))
    assert megatron_fsdp_moments.after_last_unit(held, list(held)) == ["output"]
    assert len({max(peaks) for _, peaks, _ in plans}) > 10


def test_the_dp_finds_the_brute_force_optimum_and_its_plan_fits_under_evaluate(brute):
    tiny, plans = brute
    for cap in _caps(plans):
        job = _job(cap)
        best = _optimum(plans, cap)
        found = dpsolve.fastest_plan(tiny, job, upper_bound_ms=None, deadline=Deadline(None))
        if best is None:
            assert found is None, cap
            continue
        stages, objective_ms = found
        assert objective_ms == pytest.approx(best, rel=1e-12), cap
        assert _fits(stages, tiny, job), cap


def test_the_dps_stage_peaks_are_evaluates_for_its_plan(brute):
    """The segments the DP cuts its fastest plan from hold, each, the peak evaluate() gives that stage, to the byte."""
    tiny, plans = brute
    for cap in _caps(plans)[::4]:
        job = _job(cap)
        chain = dpsegments.Chain(tiny, job)
        found = dpsegments.segments(chain, dpsolve.boundary_windows(chain, float("inf")), max_time_ms=float("inf"),
                                    objective="time", deadline=Deadline(None))
        cuts = dpsolve.fastest_cuts(chain, found, upper_bound_ms=float("inf"), deadline=Deadline(None))
        if cuts is None:
            continue
        cost = costmodel.evaluate(dpsolve.to_stages(chain, cuts[0]), tiny, job)
        assert [seg.peak_bytes for seg in cuts[0]] == [stage.peak_bytes for stage in cost.stages], cap


def test_the_milp_finds_the_brute_force_optimum_and_its_plan_fits_under_evaluate(brute):
    tiny, plans = brute
    for cap in _caps(plans)[::3]:  # every plan's need, and a byte under the next
        job = _job(cap)
        best = _optimum(plans, cap)
        problem = milp.build_problem(tiny, job)
        result = milp.solve(problem, mip_gap=0.0, time_limit_s=60)
        if best is None:
            assert result.status == "infeasible", cap
            continue
        assert result.status == "optimal", cap
        stages = milp.extract_plan(problem)
        assert costmodel.evaluate(stages, tiny, job).iteration_ms == pytest.approx(best, rel=1e-9), cap
        assert _fits(stages, tiny, job), cap


def _segment_peaks(tiny, job):
    """Every segment the DP scores, least peak first (objective "memory": the least peak of each range)."""
    chain = dpsegments.Chain(tiny, job)
    return chain, dpsegments.segments(chain, dpsolve.boundary_windows(chain, float("inf")), max_time_ms=float("inf"),
                                      objective="memory", deadline=Deadline(None))


@pytest.mark.parametrize("unfused", [True, False])
def test_each_dp_segments_least_peak_is_evaluates_over_every_option(unfused):
    """Every recompute option of the blocks (not whole layers): the least peak the DP finds for each stage and range
    is the least evaluate() gives that stage over every choice of its layers' options, to the byte (two blocks:
    the options' products stay small)."""
    job = _job(2**40, recompute="options", unfused=unfused)
    tiny = _profile(job, TINY)
    layers = costmodel.layer_costs(tiny)
    chain, found = _segment_peaks(tiny, job)
    count = len(layers)
    checked = 0
    for seg in found:
        if (seg.stage == 1) != (seg.end == count) or seg.start == seg.end or (seg.stage == 0 and seg.start):
            continue
        cut = seg.end if seg.stage == 0 else seg.start
        mine = range(0, cut) if seg.stage == 0 else range(cut, count)
        choices = [range(len(layers[m].options)) if m in mine else (0,) for m in range(count)]
        least = min(
            costmodel.evaluate(costmodel.split_to_stages([0, cut], list(options), tiny), tiny, job)
            .stages[seg.stage].peak_bytes
            for options in itertools.product(*choices)
            if all(o == 0 or o in costmodel.useful_options(layers[m], chain.ctx) for m, o in enumerate(options)))
        assert seg.peak_bytes == least, (seg.stage, seg.start, seg.end)
        checked += 1
    assert checked == 2 * (count - 1)


def test_solve_reports_evaluates_peak_for_its_plan(tmp_path):
    """`ckplan solve` (the DP): the plan it writes is the brute-force optimum under the setup it wrote (a CPU
    profile's ranks share the cores: its time differs from the fixture's), and the peaks it predicts per stage
    are what `ckplan evaluate` gives the same plan."""
    path = tmp_path / "tiny.json"
    io.save_profile(_base_profile(), path)
    cap = 936960
    flags = ["--profile", str(path), "--microbatches", "4", "--precision", "bf16-mixed",
             "--runtime", "megatron", "--dp", "4", "--zero", "3", "--fsdp-double-buffer", "--float8",
             "--fp8-all-gather", "--no-gradient-accumulation-fusion", "--grad-reduce-in-bf16", "--mem", f"{cap}B"]
    result = CliRunner().invoke(cli, ["solve", *flags, "--stages", "2", "--recompute", "whole-layer", "--solver", "dp",
                                      "--out", str(tmp_path / "plan.yaml")])
    assert result.exit_code == 0, result.output
    plan = io.load_plan(tmp_path / "plan.yaml")
    plans = _every_plan(_profile(plan.setup), plan.setup)
    assert plan.predicted.iteration_ms == pytest.approx(_optimum(plans, cap), rel=1e-12)
    checkpointed = [name for stage in plan.stages for name in stage.checkpointed]
    result = CliRunner().invoke(cli, ["evaluate", *flags, "--layers-per-stage",
                                      ",".join(str(len(stage.layers)) for stage in plan.stages),
                                      *(["--checkpoint", ",".join(checkpointed)] if checkpointed else []), "--json"])
    assert result.exit_code == 0, result.output
    scored = json.loads(result.stdout[result.stdout.index("{"):])
    assert [stage.predicted.peak_bytes for stage in plan.stages] == [stage["peak_bytes"] for stage in scored["hand"]["stages"]]


def test_a_last_stage_of_output_layers_alone_holds_their_moment():
    """The output layer's bucket and bf16 gradient exist where the last stage holds no unit too: its extra is its
    post-backward there, as where a unit precedes it (tests/test_fsdpalloc.py): the head's bucket 8256 x 2 B, its
    bf16 gradient 8256 x 2 B and its input's gradient, nothing kept (before: nothing moved on such a stage)."""
    job = _job(2**40)
    tiny = _profile(job)
    layers = costmodel.layer_costs(tiny)
    ctx = costmodel.Context(tiny, job)
    zero = [{"extra": 0.0, "kept": 0.0}]
    got = megatron_fsdp_moments.stage_moments(layers[-1:], [0], zero, stage=1, ctx=ctx)
    assert got == [{"extra": 16512 + 16512 + layers[-1].input_bytes, "kept": 0.0}]
    # a first stage of the same layer (not the pipeline's last): nothing of the head's
    assert megatron_fsdp_moments.stage_moments(layers[-1:], [0], zero, stage=0, ctx=ctx) == zero


def test_the_milp_and_the_dp_agree_over_every_option():
    """Every recompute option of two blocks: at caps at each stage range's least peak, the MILP's optimum is the
    DP's (held to brute force above), and its plan fits under evaluate()."""
    tiny = _profile(_job(2**40, recompute="options"), TINY)
    _, found = _segment_peaks(tiny, _job(2**40, recompute="options"))
    needs = sorted({seg.peak_bytes + costmodel.FIT_MARGIN_BYTES for seg in found})
    solved = 0
    for cap in needs[len(needs) // 2:]:
        job = _job(cap, recompute="options")
        by_dp = dpsolve.fastest_plan(tiny, job, upper_bound_ms=None, deadline=Deadline(None))
        problem = milp.build_problem(tiny, job)
        result = milp.solve(problem, mip_gap=0.0, time_limit_s=60)
        if by_dp is None:
            assert result.status == "infeasible", cap
            continue
        assert result.status == "optimal", cap
        stages = milp.extract_plan(problem)
        assert costmodel.evaluate(stages, tiny, job).iteration_ms == pytest.approx(by_dp[1], rel=1e-9), cap
        assert _fits(stages, tiny, job), cap
        solved += 1
    assert solved
