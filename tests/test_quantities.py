"""Quantities declare how they combine (costmodel.QUANTITY_DECLARATIONS): the stage accumulator
(stage_cost), the DP's chain and the MILP's rows read the declaration, so a new quantity is one
declaration and its rows, with no solver edit; and the MILP's rows agree with the accumulator."""

import dataclasses
import itertools

import pulp
import pytest

from planner.cost import costmodel, quantities, terms
from planner.models import synthetic
from planner.schema import TrainSetup
from planner.solve import baselines, highs, milp, search

MIB = 2**20
HUGE = 2**50
EXACT = dict(mip_gap=0.0, threads=1)
WORKSPACE_MIB = 5


def setup(stages, caps=None, microbatches=4, **changes):
    return TrainSetup(stages=stages, microbatches=microbatches, micro_batch_size=1,
                      mem_caps_bytes=caps or [HUGE] * stages, **changes)


def chain(n=5):
    return synthetic.profile_of([
        synthetic.layer(f"l{i}", f"K{i}", fwd_ms=1 + i % 2, act_mib=4 + 2 * i, input_mib=1, param_count=65536 * (i + 1),
                        transient_mib=i % 3)
        for i in range(n)
    ])


def with_a_workspace(monkeypatch):
    """A new quantity, a workspace each rank holds all iteration (say a library's scratch), of
    5 MiB on every stage but the first: one declaration (it combines as "held") and its row."""
    declared = (*costmodel.QUANTITY_DECLARATIONS, costmodel.Quantity("workspace", "held", "a library's workspace"))
    row = costmodel.Term("a library's workspace per rank", "workspace", "stage",
                         lambda stage, ctx: WORKSPACE_MIB * MIB if stage > 0 else 0, "a test")
    rows = (*costmodel.TERMS, row)
    monkeypatch.setattr(quantities, "QUANTITY_DECLARATIONS", declared)  # read when asked (quantities.declared)
    monkeypatch.setattr(terms, "TERMS", rows)
    monkeypatch.setattr(terms, "_BY_PLACE", costmodel.index_terms(rows))


def brute_optimum(profile, setup_):
    n, best = len(profile.layers), None
    for cuts in itertools.combinations(range(1, n), setup_.pipeline.stages - 1):
        for mask in range(2**n):
            stages = costmodel.split_to_stages([0, *cuts], [bool(mask >> i & 1) for i in range(n)], profile)
            cost = costmodel.evaluate(stages, profile, setup_)
            if cost.feasible and (best is None or cost.iteration_ms < best):
                best = cost.iteration_ms
    return best


def test_an_undeclared_quantity_is_refused():
    with pytest.raises(ValueError, match="unknown quantity"):
        costmodel.index_terms([costmodel.Term("a workspace", "workspace", "stage", lambda s, ctx: 0, "none")])


@pytest.mark.parametrize("solver", ["dp", "milp"])
def test_a_new_quantity_is_one_declaration_and_reaches_every_solver(monkeypatch, solver):
    profile = chain()
    roomy = setup(2)
    before = costmodel.evaluate(baselines.no_checkpointing(profile, roomy), profile, roomy)
    with_a_workspace(monkeypatch)
    after = costmodel.evaluate(baselines.no_checkpointing(profile, roomy), profile, roomy)
    assert [a.peak_bytes - b.peak_bytes for a, b in zip(after.stages, before.stages)] == [0, WORKSPACE_MIB * MIB]
    assert [a.buffer_bytes - b.buffer_bytes for a, b in zip(after.stages, before.stages)] == [0, WORKSPACE_MIB * MIB]
    # a cap the workspace makes binding: the solvers must hold it to find the brute-force optimum
    caps = [int(0.8 * max(after.peak_bytes_per_stage))] * 2
    s = roomy.model_copy(update={"mem_caps_bytes": caps})
    result = search.plan(profile, s, solver=solver, **EXACT)
    assert isinstance(result, search.PlanResult)
    assert result.cost.iteration_ms == pytest.approx(brute_optimum(profile, s), rel=1e-9)


def test_a_new_quantity_reaches_a_chunked_schedule(monkeypatch):
    profile = chain(8)
    s = setup(2, schedule="interleaved-1F1B", chunks=2)
    ranks = baselines.all_baselines(profile, s)[0].stages
    before = costmodel.evaluate(ranks, profile, s)
    with_a_workspace(monkeypatch)
    after = costmodel.evaluate(ranks, profile, s)
    # rank 0 holds stages 0 and 2, rank 1 stages 1 and 3: the workspace of each stage past the first
    assert [a.peak_bytes - b.peak_bytes for a, b in zip(after.stages, before.stages)] == [WORKSPACE_MIB * MIB,
                                                                                       2 * WORKSPACE_MIB * MIB]


@pytest.mark.parametrize("cuts, mask", [((2,), 0b00000), ((3,), 0b01010), ((1,), 0b11111), ((4,), 0b10001)])
def test_the_milps_rows_agree_with_the_accumulator(cuts, mask):
    """A plan fixed in the MILP (its prefix and option counts): every stage's memory row (held +
    k·kept + T_s, T_s at the least its own rows allow) is the stage's training peak under
    stage_cost (held + in-flight activations + transient), and its time row the stage's busy time."""
    profile, s = chain(), setup(2, microbatches=3)
    stages = costmodel.split_to_stages([0, *cuts], [mask >> i & 1 for i in range(5)], profile)
    cost = costmodel.evaluate(stages, profile, s)
    problem = milp.build_problem(profile, s, objective="memory")
    threads = highs.scheduler_threads(1)  # HiGHS runs only with the threads its first solve in the process asked
    values = milp.start_values(problem, stages, threads=threads)
    assert values is not None
    free = ("T_", "scale", "U_")
    for var in problem.lp.variables():  # fix the plan; the transients as low as their rows allow
        if not var.name.startswith(free):
            var.lowBound = var.upBound = values[var.name]
    problem.lp.setObjective(pulp.lpSum(var for var in problem.lp.variables() if var.name.startswith("T_")))
    problem.lp.solve(milp._HiGHS(msg=False, threads=threads))
    assert problem.lp.sol_status == pulp.LpSolutionOptimal
    rows = problem.lp.constraints
    for k, stage in enumerate(cost.stages):
        memory = rows[f"cap_{k}"]  # memory - cap·scale + margin <= 0
        value = sum(coef * var.varValue for var, coef in memory.items() if var.name != "scale") + memory.constant
        value -= costmodel.FIT_MARGIN_BYTES / MIB
        training = stage.static_bytes + stage.buffer_bytes + stage.activation_bytes + stage.transient_bytes
        assert value * MIB == pytest.approx(training, abs=2)
        busy = rows[f"bottleneck_{k}"]  # busy - tau <= 0
        assert sum(coef * var.varValue for var, coef in busy.items() if var.name != "tau") + busy.constant == \
            pytest.approx(stage.busy_ms, rel=1e-9)


LATE_GRADIENTS = dict(dp=2, zero=3, zero_gather="per-iteration", runtime="torchtitan", precision="bf16-mixed")


def with_logits(profile, output_mib=64):
    """The profile with a last layer whose output (the logits) is large: on the pipeline's last
    stage its gradient stays through a split backward's input pass (assembly.stage_sums)."""
    last = profile.layers[-1].model_copy(update={"output_bytes": output_mib * MIB})
    return profile.model_copy(update={"layers": [*profile.layers[:-1], last]})


@pytest.mark.parametrize("logits", [False, True], ids=["small-output", "large-logits"])
@pytest.mark.parametrize("late", [False, True], ids=["held", "late-gradients"])
@pytest.mark.parametrize("schedule", ["interleaved-1F1B", "ZBV"])
@pytest.mark.parametrize("cuts, mask", [((2, 3, 4), 0b000000), ((1, 3, 5), 0b101010), ((2, 4, 5), 0b111111)])
def test_the_milps_rank_rows_agree_with_the_evaluator(schedule, cuts, mask, late, logits):
    """A plan of P = 2 ranks x V = 2 chunks fixed in the MILP: over each rank's rows (held + its
    chunks' live bytes at every moment torch's order reaches, + the transient of the pass that
    starts there), the largest is the rank's training peak under evaluate (held + activations +
    transient): equal, whether the backward runs whole or splits (the input and weight passes'
    peaks exact: milp_ranks._input_pass_bound, _weight_pass_bound). With torchtitan's FSDP2
    (`late`), whose gradients exist from a chunk's first backward to its last, the rows hold the
    same peak: evaluate's (static less them, + those held at the peak's moment). Large logits: the
    last stage's input pass holds their gradient (the MILP missed it, 85 MB under on a ZBV rank)."""
    profile = with_logits(chain(6)) if logits else chain(6)
    s = setup(2, microbatches=4, schedule=schedule, chunks=2, **(LATE_GRADIENTS if late else {}))
    stages = costmodel.split_to_stages([0, *cuts], [mask >> i & 1 for i in range(6)], profile)
    ranks = costmodel.ranks_of(stages, s)
    cost = costmodel.evaluate(ranks, profile, s)
    problem = milp.build_problem(profile, s, objective="memory")
    threads = highs.scheduler_threads(1)
    values = milp.start_values(problem, stages, threads=threads)
    assert values is not None
    free = ("T_", "scale", "U_", "W_", "C_", "d_")  # the transients, pass bounds and carries at their least
    for var in problem.lp.variables():
        if not var.name.startswith(free):
            var.lowBound = var.upBound = values[var.name]
    problem.lp.setObjective(pulp.lpSum(var for var in problem.lp.variables() if var.name.startswith(free[:1] + free[2:])))
    problem.lp.solve(milp._HiGHS(msg=False, threads=threads))
    assert problem.lp.sol_status == pulp.LpSolutionOptimal
    for rank in range(len(cost.stages)):
        rows = [row for row in problem.lp.constraints()
                if row.name.startswith(f"live_{rank}_") or row.name.startswith(("pass_B_", "pass_I_", "pass_W_"))
                and row.name.split("_")[2] == str(rank)]
        largest = max(sum(coef * var.varValue for var, coef in row.items() if var.name != "scale") + row.constant
                      for row in rows) - costmodel.FIT_MARGIN_BYTES / MIB
        training = _training_peak(ranks, rank, profile, s)
        assert largest * MIB == pytest.approx(training, abs=2)


def _training_peak(ranks, rank, profile, setup_):
    """The rank's peak at its training moments under evaluate (score.rank_cost): held all iteration
    less the late gradients, + its live bytes, transient and late gradients at the peak's moment."""
    from planner.cost import schedules, score

    order = costmodel.schedule_of(setup_)
    chunks = score.placed_chunks(ranks, profile, order)
    view = costmodel.stages_view(setup_, order)
    sums = {k: costmodel.stage_sums(*chunks[k], stage=k, profile=profile, setup=view) for k in order.stages_of(rank)}
    stage = score.rank_cost(order, rank, chunks, sums, profile=profile, setup=setup_)
    lazy = score.late_gradients(order, rank, chunks, setup_)
    held = {k: score.chunk_bytes(chunks[k][0], sums[k], stage=k, order=order, training=setup_.training) for k in sums}
    held = {k: dataclasses.replace(held[k], late_grad=g) for k, g in zip(order.stages_of(rank), lazy)}
    peak = schedules.rank_peak(order, rank, stage_bytes=held)
    return stage.static_bytes + stage.buffer_bytes - sum(lazy) + peak.live
