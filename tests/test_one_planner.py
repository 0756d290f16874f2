"""Every schedule through one search: the chunked ones get baselines, the cross-check, a
fallback where HiGHS fails, and the same refusals as 1F1B (issue 34: items 5 and 7, and
--solver dp on a chunked schedule)."""

from pathlib import Path

import pytest
from fixtures.cli import run, run_ok

from planner import io
from planner.cost import costmodel
from planner.models.synthetic import layer, profile_of
from planner.schema import TrainSetup
from planner.solve import baselines

FIXTURES = Path(__file__).parent / "fixtures"
REPRO = FIXTURES / "chunked-milp-profile.json"  # a 12-layer LLaMA-style cpu profile HiGHS once failed on


def _profile(n=8):
    return profile_of([layer(f"l{i}", "Block", fwd_ms=1.0, act_mib=10, input_mib=1, output_mib=1,
                             param_count=1000, transient_mib=0.5) for i in range(n)])


def test_a_chunked_solve_where_every_plan_fits_finds_one(tmp_path):
    """At 100 GB every split fits; HiGHS ends this problem in "solve error" (a row 1e-6 short
    of its own check): the search keeps the plan it handed back once it meets every row, or the
    best baseline, and never calls that a time limit."""
    out = tmp_path / "plan.yaml"
    result = run_ok("solve", "--profile", REPRO, "--mem", "100GB", "--stages", "4", "--microbatches", "8",
                    "--schedule", "interleaved-1F1B", "--chunks", "2", "--out", out)
    plan = io.load_plan(out)
    assert [len(stage.chunks) for stage in plan.stages] == [2, 2, 2, 2]
    assert plan.solver.status == "feasible" and "time-limit" not in result.output
    # the plan is at least as fast as every baseline, all of them scored as chunked plans
    assert {b.name for b in plan.baselines} >= {"no-ckpt", "full-ckpt"}
    assert all(plan.predicted.iteration_ms <= b.iteration_ms * (1 + 1e-9) for b in plan.baselines if b.feasible)


def test_a_chunked_plan_reports_the_time_it_was_chosen_by(tmp_path):
    """"optimal" only for the time the plan reports: a chunked plan's MILP minimises a linear
    time, the plan reports the simulated schedule, so it is "feasible", its objective that time."""
    path = tmp_path / "p.json"
    io.save_profile(_profile(), path)
    run_ok("solve", "--profile", path, "--stages", "2", "--schedule", "ZBV", "--mem", "1GiB",
           "--microbatches", "4", "--out", tmp_path / "zbv.yaml", "--json")
    plan = io.load_plan(tmp_path / "zbv.yaml")
    assert plan.solver.status == "feasible" and plan.solver.bound is None
    assert plan.solver.objective == plan.predicted.iteration_ms


def test_solver_dp_on_a_chunked_schedule_is_refused(tmp_path):
    path = tmp_path / "p.json"
    io.save_profile(_profile(), path)
    refused = run("solve", "--profile", path, "--stages", "2", "--schedule", "ZBV", "--mem", "1GiB",
                  "--microbatches", "4", "--solver", "dp", "--out", tmp_path / "zbv.yaml")
    assert refused.exit_code != 0 and "--solver dp" in refused.output and "use --solver milp or auto" in refused.output
    assert not (tmp_path / "zbv.yaml").exists()


def test_chunked_baselines_split_the_pipelines_stages_and_score_as_ranks():
    """The baselines split the layers over all P·V stages and are scored as the ranks that hold
    them, by the same evaluate() as the solver's plan."""
    profile = _profile()
    setup = TrainSetup(stages=2, microbatches=4, micro_batch_size=1, schedule="interleaved-1F1B", chunks=2,
                       mem_caps_bytes=[2**40] * 2)
    found = {b.name: b for b in baselines.all_baselines(profile, setup)}
    full = found["full-ckpt"]
    assert [len(stage.chunks) for stage in full.stages] == [2, 2]
    assert [chunk for stage in full.stages for chunk in stage.chunks] == [["l0", "l1"], ["l4", "l5"], ["l2", "l3"],
                                                                           ["l6", "l7"]]
    cost = costmodel.evaluate(full.stages, profile, setup)
    assert full.iteration_ms == cost.iteration_ms and full.feasible


def test_a_chunked_refusal_gives_the_smallest_cap(tmp_path):
    """As 1F1B's does: the rank that needs most in the least-memory plan, and the cap that fits."""
    path = tmp_path / "p.json"
    io.save_profile(_profile(), path)
    refused = run("solve", "--profile", path, "--stages", "2", "--schedule", "interleaved-1F1B", "--mem", "1MiB",
                  "--microbatches", "4", "--out", tmp_path / "plan.yaml")
    assert refused.exit_code != 0 and "the smallest cap that works with 2 stages is" in refused.output
    assert "Traceback" not in refused.output and not (tmp_path / "plan.yaml").exists()


def test_schedule_auto_says_the_real_reason_first(tmp_path):
    """--zero 1 with --dp 1 is the options' fault under every schedule: that sentence, whole, not
    "no pipeline schedule fits" with the reason cut off in a table cell."""
    path = tmp_path / "p.json"
    io.save_profile(_profile(), path)
    refused = run("solve", "--profile", path, "--stages", "2", "--schedule", "auto", "--mem", "1GiB",
                  "--microbatches", "4", "--dp", "1", "--zero", "1", "--out", tmp_path / "plan.yaml")
    assert refused.exit_code != 0
    assert "give --dp N (N > 1) or drop --zero" in refused.output and "no pipeline schedule fits" not in refused.output


def test_schedule_auto_that_fits_nowhere_gives_the_smallest_cap(tmp_path):
    path = tmp_path / "p.json"
    io.save_profile(_profile(), path)
    refused = run("solve", "--profile", path, "--stages", "2", "--schedule", "auto", "--mem", "1MiB",
                  "--microbatches", "4", "--out", tmp_path / "plan.yaml")
    assert refused.exit_code != 0 and "the smallest cap that works with 2 stages is" in refused.output


def _moe_profile(tmp_path, source="measured"):
    """Two MoE blocks of 4 routed experts (the profile recorded the tokens each received)."""
    blocks = [layer(f"moe{i}", "MoE", fwd_ms=1.0, act_mib=1, input_mib=1, param_count=1000).model_copy(
        update={"routed_tokens": [8, 12, 4, 8], "expert_param_count": 800}) for i in range(2)]
    profile = profile_of(blocks).model_copy(update={"source": source})
    path = tmp_path / "moe.json"
    io.save_profile(profile, path)
    return path


def test_ep_that_does_not_divide_a_measured_profiles_experts_is_refused_at_solve(tmp_path):
    refused = run("solve", "--profile", _moe_profile(tmp_path), "--stages", "2", "--mem", "1GiB", "--dp", "6",
                  "--ep", "3", "--out", tmp_path / "plan.yaml")
    assert refused.exit_code != 0 and "--ep 3 does not divide the model's 4 routed experts" in refused.output
    assert not (tmp_path / "plan.yaml").exists()


def test_ep_with_zero_on_ckplans_runtime_is_refused_at_solve(tmp_path):
    path = _moe_profile(tmp_path)
    refused = run("solve", "--profile", path, "--stages", "2", "--mem", "1GiB", "--dp", "4", "--ep", "2",
                  "--zero", "1", "--out", tmp_path / "plan.yaml")
    assert refused.exit_code != 0 and "ckplan's runtime runs expert parallelism with ZeRO 0 only" in refused.output
    assert not (tmp_path / "plan.yaml").exists()
    run_ok("solve", "--profile", path, "--stages", "2", "--mem", "1GiB", "--dp", "4", "--ep", "2",
           "--zero", "1", "--runtime", "megatron", "--out", tmp_path / "plan.yaml")


# ---------------------------------------------------------------- --time-limit, every stage of a solve


def _timed(*args):
    """The command's result and the CPU seconds this process spent on it: what it builds past
    the limit costs the same on a busy machine, where its wall time grows with the load (the
    suite runs on every core at once)."""
    import time

    started = time.process_time()
    result = run(*args)
    return result, time.process_time() - started


def test_building_a_long_zbv_order_answers_to_the_time_limit(tmp_path):
    """torch's ZBV constructor takes about the square of the microbatches (5 s at 1,000): with
    3,000 and --time-limit 1 the solve stops at the limit and says what it was building."""
    path = tmp_path / "p.json"
    io.save_profile(_profile(), path)
    result, cpu_s = _timed("solve", "--profile", path, "--stages", "2", "--schedule", "ZBV", "--mem", "1GiB",
                            "--microbatches", "3000", "--time-limit", "1", "--out", tmp_path / "plan.yaml")
    assert result.exit_code != 0 and "building ZBV's order" in result.output and "--time-limit 1 s" in result.output
    assert cpu_s < 1 + 5, cpu_s  # main: 45 s and more (the order built to its end)


def test_more_pipeline_stages_than_layers_is_refused_before_the_order_is_built(tmp_path):
    path = tmp_path / "p.json"
    io.save_profile(_profile(100), path)
    result, cpu_s = _timed("solve", "--profile", path, "--stages", "64", "--schedule", "interleaved-1F1B",
                            "--chunks", "64", "--mem", "1GiB", "--out", tmp_path / "plan.yaml")
    assert result.exit_code != 0 and "more than the profile's 100 layers" in result.output
    assert cpu_s < 5, cpu_s


def test_schedule_auto_shares_one_time_limit(tmp_path):
    path = tmp_path / "p.json"
    io.save_profile(_profile(), path)
    result, cpu_s = _timed("solve", "--profile", path, "--stages", "2", "--schedule", "auto", "--mem", "1GiB",
                            "--microbatches", "600", "--time-limit", "3", "--out", tmp_path / "plan.yaml")
    assert "Traceback" not in result.output
    assert cpu_s < 3 + 5, cpu_s  # main: 35 s


def test_a_solve_of_thousands_of_layers_stops_at_its_limit(tmp_path):
    """Every baseline scores whole plans and the DP builds its chain: at 8,000 layers each takes
    a while, and the search checks the limit between them (it once ran 3x past it). Counted in
    CPU seconds, against the same process's own floor: a search given no time still scores one
    plan and writes it, and past the limit it may finish the one step under way, no more. Both
    grow alike on a slow or busy machine (a fixed 3 s of slack failed on CI's 2 cores)."""
    import time

    from planner.models.synthetic import heterogeneous
    from planner.solve import baselines, search  # noqa: F401  imported before the clock starts, as make_plan does
    from planner.solve.planning import make_plan

    profile = heterogeneous(8000, seed=1)
    setup = TrainSetup(stages=4, microbatches=8, micro_batch_size=1, mem_caps_bytes=[2**30] * 4)

    def cpu_s(limit_s):
        started = time.process_time()  # this process's threads (the solvers' too), not other processes'
        make_plan(profile, tmp_path / "p.json", setup, time_limit_s=limit_s)
        return time.process_time() - started

    floor = cpu_s(0.001)
    assert cpu_s(1.0) < 1.0 + 2 * floor


def test_evaluate_sets_ckplans_plan_beside_a_chunked_configuration(tmp_path):
    """The same search for every schedule: evaluate of an interleaved hand configuration shows
    ckplan's plan for it too, started from the hand configuration where it fits."""
    path = tmp_path / "p.json"
    io.save_profile(_profile(), path)
    result = run_ok("evaluate", "--profile", path, "--schedule", "interleaved-1F1B", "--chunks", "2",
                    "--layers-per-stage", "2,2,2,2", "--ckpt-per-stage", "2,2,2,2", "--mem", "1GiB",
                    "--microbatches", "4")
    assert "the schedule simulated" in result.output and "ckplan's plan (feasible)" in result.output
    assert "less)" in result.output  # full recompute everywhere is slower than ckplan's plan


def test_one_chunk_schedules_are_the_one_chunk_case_of_the_description():
    """1F1B's and GPipe's in-flight microbatches per stage (costmodel.in_flight, the closed form
    the stage accumulator and the DP read) are what torch's own order for them holds at its peak
    (schedules.peak_in_flight, which scores the chunked schedules), wherever torch runs them."""
    from planner.cost import schedules

    for name in ("1F1B", "GPipe"):
        for ranks in (1, 2, 3, 4, 8):
            for microbatches in (1, 2, 3, 4, 8, 16):
                if name == "1F1B" and microbatches < ranks:
                    continue  # torch refuses it
                order = schedules.build_schedule(name, num_ranks=ranks, num_microbatches=microbatches)
                setup = TrainSetup(stages=ranks, microbatches=microbatches, micro_batch_size=1, schedule=name,
                                   mem_caps_bytes=[2**30] * ranks)
                assert [peak.activations for peak in schedules.peak_in_flight(order)] == \
                    [costmodel.in_flight(setup.pipeline, r) for r in range(ranks)], (name, ranks, microbatches)


def test_a_model_file_written_before_the_packages_still_loads(tmp_path):
    """`profile --hf-config` wrote `from planner.hfmodels import model_file` into the model files it
    made before planner/models/: they still import."""
    from planner.models.modelfile import load_model_file

    path = tmp_path / "old_hf.py"
    path.write_text("from planner.hfmodels import model_file  # noqa: F401\n"
                    "import torch\n\n\n"
                    "def build_model():\n    return torch.nn.Sequential(torch.nn.Linear(2, 2))\n\n\n"
                    "def example_batch(micro_batch_size):\n"
                    "    return torch.zeros(micro_batch_size, 2), torch.zeros(micro_batch_size, 2)\n")
    loaded = load_model_file(path)
    assert callable(loaded.module.model_file)


# ---------------------------------------------------------------- the step's end, in both solvers as in evaluate


MIB = 2**20
# the last stage's loss values (lossvalues.held_values): 1F1B's k = 1, so M - k + 2 = 4 - 1 + 2 = 5 of 4 B = 20 B
LOSS_VALUES = (4 - 1 + 2) * 4
END_CAP_1 = 1_064_960 + 72 * MIB + LOSS_VALUES + 4096  # cut after l0: stage 1's step end with the fit margin (hand count below)
END_CAP_2 = 16_384 + 72 * MIB + LOSS_VALUES + 4096  # cut after l1: the same, the head alone on stage 1


def _logits_profile():
    """l0, l1 and a head whose output is 8 MiB of logits; l0 the slowest, l1 the largest (1 MiB
    of fp32 Adam state: 65,536 parameters x 16 B)."""
    return profile_of([layer("l0", "A", fwd_ms=2.0, act_mib=4, input_mib=1, param_count=1024),
                       layer("l1", "B", fwd_ms=1.0, act_mib=4, input_mib=1, param_count=65536),
                       layer("head", "H", fwd_ms=1.0, act_mib=4, input_mib=1, output_mib=8, param_count=1024)])


def _titan_setup(cap=2**40, **changes):
    """torchtitan 9dec370: torch's schedule keeps every stage's outputs to the step's end and the
    last stage's step() returns their torch.cat (chunked.stage_end_bytes)."""
    fields = dict(stages=2, microbatches=4, micro_batch_size=1, mem_caps_bytes=[cap] * 2, runtime="torchtitan",
                  runtime_version="9dec370", precision="fp32") | changes
    return TrainSetup(**fields)


def test_the_step_end_sets_the_last_stages_peak_by_hand():
    """Stage 1 of the cut after l0 (l1 and the head; 1F1B, P = 2, M = 4: one microbatch in flight):
    static (65,536 + 1,024) x 16 B; buffers 4 receive buffers of 1 MiB, the 4 input gradients torch
    2.6 leaves on them (M - 1 + 1 at its last steady backward: tests/test_held_input_grads.py) and the
    M - 1 = 3 logits kept past their backward (24 MiB); kept 4 + 4 - 1 (the input, in its buffer) + 8 (the output
    waiting) = 15 MiB; at the step's end the last logits (8 MiB) and the cat of all 4 (32 MiB).
    The buffers also carry the loss values torch keeps to the step's end and the seed: M - k + 2 =
    4 - 1 + 2 = 5 of 4 B, 32 MiB + 20 B (LOSS_VALUES).
    The step's end, 40 MiB over static + buffers, passes the activations' 15: it is the peak."""
    profile = _logits_profile()
    for cut, static, peak in ((1, 1_064_960, END_CAP_1 - 4096), (2, 16_384, END_CAP_2 - 4096)):
        stages = costmodel.split_to_stages([0, cut], [0, 0, 0], profile)
        last = costmodel.evaluate(stages, profile, _titan_setup()).stages[1]
        assert (last.static_bytes, last.buffer_bytes, last.step_end_bytes) == (static, 32 * MIB + LOSS_VALUES, 40 * MIB)
        assert last.peak_bytes == peak == static + 32 * MIB + LOSS_VALUES + 40 * MIB
        assert last.activation_bytes + last.transient_bytes < last.step_end_bytes


# where the DP's and the MILP's peak once differed from evaluate's: the step's end (torchtitan
# 9dec370's kept logits and their merge), and the whole gradients torchtitan's FSDP2 allocates at a
# stage's first backward (gradtiming), out of the peak where all M microbatches are in flight
AGREEMENT = {
    "step end": {},
    "FSDP2, GPipe": dict(schedule="GPipe", dp=2, zero=3, zero_gather="per-iteration"),
    "GPipe": dict(schedule="GPipe"),  # its later backwards' rows (gpipeheld), no gradients allocated late
    "FSDP2, 1F1B, M = P": dict(microbatches=2, dp=2, zero=3, zero_gather="per-iteration"),
}


@pytest.mark.parametrize("changes", AGREEMENT.values(), ids=AGREEMENT.keys())
def test_the_dp_segments_peak_as_evaluate_scores_them(changes):
    """Every range of every stage: the DP's least peak is evaluate's least over the range's
    recompute choices, and evaluate's for the choice the DP made."""
    from itertools import product

    from planner.solve import dpsolve
    from planner.solve.deadline import Deadline

    profile, setup = _logits_profile(), _titan_setup(**changes)
    chain = dpsolve.Chain(profile, setup)
    found = dpsolve.segments(chain, [(1, 2), (3, 3)], max_time_ms=float("inf"), objective="memory",
                             deadline=Deadline(None))
    layers = costmodel.layer_costs(profile)
    assert len(found) == 4  # stage 0: [0, 1), [0, 2); stage 1: [1, 3), [2, 3)
    for seg in found:
        def peak(options, seg=seg):
            return costmodel.stage_cost(layers[seg.start:seg.end], list(options), stage=seg.stage, profile=profile,
                                        setup=setup).peak_bytes

        assert seg.peak_bytes == peak(seg.mask >> b & 1 for b in range(seg.end - seg.start)), seg
        assert seg.peak_bytes == min(peak(options) for options in product((0, 1), repeat=seg.end - seg.start)), seg
    if not changes:
        assert sorted(seg.peak_bytes for seg in found if seg.stage == 1) == [END_CAP_2 - 4096, END_CAP_1 - 4096]


@pytest.mark.parametrize("changes", AGREEMENT.values(), ids=AGREEMENT.keys())
def test_the_milps_rows_peak_as_evaluate_scores_a_plan(changes):
    """A plan fixed in the MILP: the largest of a stage's rows (the activations' moment, with the
    gradients allocated at the first backward where they join it; the optimizer step; the step's
    end) is evaluate's peak; at the step's end of the last stage where that sets it."""
    import pulp

    from planner.solve import highs, milp

    profile, setup = _logits_profile(), _titan_setup(**changes)
    for cut, mask in ((1, 0b000), (1, 0b011), (2, 0b000), (2, 0b101)):
        stages = costmodel.split_to_stages([0, cut], [mask >> i & 1 for i in range(3)], profile)
        cost = costmodel.evaluate(stages, profile, setup)
        problem = milp.build_problem(profile, setup, objective="memory")
        threads = highs.scheduler_threads(1)
        values = milp.start_values(problem, stages, threads=threads)
        for var in problem.lp.variables():
            if not var.name.startswith(("T_", "scale")):
                var.lowBound = var.upBound = values[var.name]
        problem.lp.setObjective(pulp.lpSum(var for var in problem.lp.variables() if var.name.startswith("T_")))
        problem.lp.solve(milp._HiGHS(msg=False, threads=threads))
        assert problem.lp.sol_status == pulp.LpSolutionOptimal

        def value(row):
            mib = sum(coef * var.varValue for var, coef in row.items() if var.name != "scale") + row.constant
            return round((mib - costmodel.FIT_MARGIN_BYTES / MIB) * MIB)

        for k, stage in enumerate(cost.stages):
            rows = {name: value(row) for name, row in problem.lp.constraints.items()
                    if name in (f"cap_{k}", f"cap_grads_{k}", f"step_cap_{k}", f"step_end_{k}",
                                f"cap_gpipe_second_{k}", f"cap_gpipe_last_{k}")}
            assert max(rows.values()) == stage.peak_bytes, (cut, mask, k, rows)
        if not changes:
            assert value(problem.lp.constraints["step_end_1"]) == cost.stages[1].peak_bytes


@pytest.mark.parametrize("solver", ["dp", "milp"])
def test_a_mem_just_below_the_step_end_moves_the_cut(tmp_path, solver):
    """Unlimited, the cut after l0 is fastest (6 ms a stage against 9). Its last stage peaks at the
    step's end; a --mem a byte short of it leaves the cut after l1 (the head alone, 1 MiB less of
    l1's state), a byte short of that nothing, said in one sentence. (Before the solvers charged
    the step's end they took the cut after l0 there, and evaluate refused their plan.) The MILP's
    rows are in MiB, and HiGHS takes an integer's bound to within 1e-6 of a whole number (its
    mip_feasibility_tolerance): 1 byte; it is given 64 bytes short."""
    short = 1 if solver == "dp" else 64
    path = tmp_path / "p.json"
    io.save_profile(_logits_profile(), path)
    titan = ("--runtime", "torchtitan", "--runtime-version", "9dec370", "--precision", "fp32")
    common = ("solve", "--profile", path, "--stages", "2", "--microbatches", "4", "--solver", solver, *titan)
    for cap, layers, peak in ((END_CAP_1, [["l0"], ["l1", "head"]], END_CAP_1 - 4096),
                              (END_CAP_1 - short, [["l0", "l1"], ["head"]], END_CAP_2 - 4096)):
        out = tmp_path / f"{cap}.yaml"
        run_ok(*common, "--mem", cap, "--out", out)
        plan = io.load_plan(out)
        assert [stage.layers for stage in plan.stages] == layers
        assert plan.stages[1].predicted.peak_bytes == peak
    refused = run(*common, "--mem", END_CAP_2 - short, "--out", tmp_path / "none.yaml")
    assert refused.exit_code != 0 and "the smallest cap that works with 2 stages is 72.1 MiB" in refused.output
    assert "kept to the step's end (outputs, sends) and the merge 40 MiB" in refused.output
    assert not (tmp_path / "none.yaml").exists()


@pytest.mark.parametrize("schedule", ["interleaved-1F1B", "ZBV"])
def test_the_milps_rank_step_end_row_is_evaluates_step_end(schedule):
    """A rank of two stages (P = 2, V = 2) fixed in the MILP: its step's end row is evaluate's
    static + buffers + step_end_bytes, the sends every stage holds to the step's end and, on the
    rank of the head, the kept logits and their merge."""
    import pulp

    from planner.solve import highs, milp

    profile = profile_of([layer(f"l{i}", f"K{i}", fwd_ms=1.0, act_mib=4, input_mib=1, param_count=1024)
                          for i in range(3)]
                         + [layer("head", "H", fwd_ms=1.0, act_mib=4, input_mib=1, output_mib=8, param_count=1024)])
    setup = _titan_setup(schedule=schedule, chunks=2)
    stages = costmodel.split_to_stages([0, 1, 2, 3], [0, 0, 0, 0], profile)
    cost = costmodel.evaluate(costmodel.ranks_of(stages, setup), profile, setup)
    problem = milp.build_problem(profile, setup, objective="memory")
    threads = highs.scheduler_threads(1)
    values = milp.start_values(problem, stages, threads=threads)
    for var in problem.lp.variables():
        if not var.name.startswith(("T_", "U_", "scale")):
            var.lowBound = var.upBound = values[var.name]
    problem.lp.solve(milp._HiGHS(msg=False, threads=threads))
    assert problem.lp.sol_status == pulp.LpSolutionOptimal
    for rank, stage in enumerate(cost.stages):
        row = problem.lp.constraints[f"step_end_r{rank}"]
        mib = sum(coef * var.varValue for var, coef in row.items() if var.name != "scale") + row.constant
        assert round((mib - costmodel.FIT_MARGIN_BYTES / MIB) * MIB) == \
            stage.static_bytes + stage.buffer_bytes + stage.step_end_bytes
    # the head's rank (1 interleaved, 0 under ZBV's V): the head's M kept logits, its M input
    # gradients held by their sends and the cat of the logits, 4 x (8 + 1) + 4 x 8 MiB; its other
    # stage's sends, 4 x (1 + 1) MiB (l1), or 4 x 1 (l0, which sends no input gradient); and the walked
    # schedule's loss values, every one kept to the step's end (lossvalues.walked_value_bytes): M x 4 B = 16 B
    head_rank, other = (1, 2) if schedule == "interleaved-1F1B" else (0, 1)
    assert cost.stages[head_rank].step_end_bytes == (4 * 9 + 4 * 8 + 4 * other) * MIB + 4 * 4


@pytest.mark.parametrize("dp, zero, hint", [
    (1, 0, "data parallelism with ZeRO (--dp N --zero 3)"), (4, 1, "a higher ZeRO stage (--zero 2 or 3)"),
    (4, 3, "more data-parallel ranks to shard over (--dp)")])
def test_the_refusal_suggests_sharding_only_where_more_can_be_had(dp, zero, hint):
    """A plan already under ZeRO 3 was told that 'sharding optimizer state with ZeRO would also help'."""
    from planner.solve.planning import infeasible_message
    from planner.solve.search import Shortfall

    setup = TrainSetup(stages=2, microbatches=4, micro_batch_size=1, mem_caps_bytes=[2**30] * 2, dp=dp, zero=zero)
    message = infeasible_message([Shortfall("device", 1, 2**31, 2**30, {"activations": 2**31})], setup)
    assert message.endswith(f"or {hint} would also help") and "1e+03" not in message
