"""The cost model described once (costmodel.TERMS): every consumer reads the same rows, so
a new row changes evaluate(), the DP and the MILP alike; host memory under offload is such a
row, respected by every solver; `--solver` picks the DP or the MILP, which agree."""

import itertools
import json

import pytest
import yaml
from fixtures.cli import run, run_ok
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner import io
from planner.cost import costmodel, dataparallel, terms
from planner.models import synthetic
from planner.schema import TrainSetup
from planner.solve import baselines, search

MIB = 2**20
HUGE = 2**50
EXACT = dict(mip_gap=0.0, threads=1)


def setup(stages, caps=None, microbatches=4, **changes):
    return TrainSetup(stages=stages, microbatches=microbatches, micro_batch_size=1,
                      mem_caps_bytes=caps or [HUGE] * stages, **changes)


def chain(n=5):
    """Layers of growing parameters, so where the cuts fall moves every per-layer sum."""
    return synthetic.profile_of([
        synthetic.layer(f"l{i}", f"K{i}", fwd_ms=1 + i % 2, act_mib=4 + 2 * i, input_mib=1, param_count=65536 * (i + 1),
                        transient_mib=i % 3)
        for i in range(n)
    ])


def brute_optimum(profile, setup_):
    """The fastest plan by evaluate() over every contiguous split and checkpoint subset."""
    n, best = len(profile.layers), None
    for cuts in itertools.combinations(range(1, n), setup_.pipeline.stages - 1):
        for mask in range(2**n):
            stages = costmodel.split_to_stages([0, *cuts], [bool(mask >> i & 1) for i in range(n)], profile)
            cost = costmodel.evaluate(stages, profile, setup_)
            if cost.feasible and (best is None or cost.iteration_ms < best):
                best = cost.iteration_ms
    return best


# ---------------------------------------------------------------- the description


def test_every_term_names_its_quantity_place_and_source():
    assert {term.quantity for term in costmodel.TERMS} == set(costmodel.QUANTITIES)
    for term in costmodel.TERMS:
        assert term.where in ("layer", "open", "close", "stage")
        assert term.source.strip(), term.name
    with pytest.raises(ValueError, match="unknown quantity"):
        costmodel.index_terms([costmodel.Term("typo", "statik", "layer", lambda *a: 0, "none")])


def test_stage_cost_is_the_sum_of_the_rows():
    """Each quantity of a stage, recomputed from the rows by hand: static, buffers, time, comm."""
    profile, s = chain(), setup(2, microbatches=3, send_latency_ms=0.25, action_overhead_ms=0.5)
    ctx = costmodel.Context(profile, s)
    layers = costmodel.layer_costs(profile)[2:]
    cost = costmodel.stage_cost(layers, [False, True, False], stage=1, profile=profile, setup=s)
    # adam fp32: 16 B/param; params 3, 4, 5 x 65536
    assert cost.static_bytes == 16 * 65536 * (3 + 4 + 5)
    # last stage: (M + 1) receive buffers of the input (1 MiB), nothing sent forward; and the loss values torch keeps
    # with the seed (lossvalues.held_values): 1F1B's k = 1, M - k + 2 = 3 - 1 + 2 = 4 of 4 B = 16 B
    assert cost.buffer_bytes == 4 * MIB + (3 - 1 + 2) * 4
    # fwd 1, 2, 1 ms; bwd 2 x fwd; the checkpointed l3 recomputes one forward (2 ms)
    assert cost.time_ms == pytest.approx(3 * (1 + 2 + 1) + 2)
    # the input gradient sent back (0.25 ms, bytes not charged) and two actions
    assert cost.comm_ms == pytest.approx(0.25 + 2 * 0.5)
    assert cost.time_ms == pytest.approx(sum(costmodel.layer_value("time", layer, ckpt, ctx)
                                             for layer, ckpt in zip(layers, [False, True, False])))


EXTRA_MIB = 3


def with_a_new_term(monkeypatch):
    """One row more, nothing else: 3 MiB held per layer whose parameters pass 200k."""
    term = costmodel.Term("a new held term", "static", "layer",
                          lambda layer, ckpt, ctx: EXTRA_MIB * MIB if layer.param_count > 200_000 else 0, "a test")
    rows = (*costmodel.TERMS, term)
    monkeypatch.setattr(terms, "TERMS", rows)
    monkeypatch.setattr(terms, "_BY_PLACE", costmodel.index_terms(rows))


@pytest.mark.parametrize("solver", ["dp", "milp"])
def test_a_new_row_reaches_every_solver(monkeypatch, solver):
    profile = chain()
    roomy = setup(2)
    before = costmodel.evaluate(baselines.no_checkpointing(profile, roomy), profile, roomy)
    with_a_new_term(monkeypatch)
    after = costmodel.evaluate(baselines.no_checkpointing(profile, roomy), profile, roomy)
    # the even split puts l0-l1 (params 1, 2 x 65536) and l2-l4 (3, 4, 5): two pass 200k
    added = [a.static_bytes - b.static_bytes for a, b in zip(after.stages, before.stages)]
    assert added == [0, 2 * EXTRA_MIB * MIB]  # l3, l4
    # a cap between the two: the solvers must see the row to find the brute-force optimum
    caps = [int(0.8 * max(after.peak_bytes_per_stage))] * 2
    s = roomy.model_copy(update={"mem_caps_bytes": caps})
    optimum = brute_optimum(profile, s)
    result = search.plan(profile, s, solver=solver, **EXACT)
    assert isinstance(result, search.PlanResult)
    assert result.cost.iteration_ms == pytest.approx(optimum, rel=1e-9)


# ---------------------------------------------------------------- host memory, a row every solver respects


def offload(stages, host_mem_bytes=None, caps=None, **changes):
    return setup(stages, caps, offload=True, host_mem_bytes=host_mem_bytes, **changes)


def test_host_bytes_per_stage_and_the_ranks_share():
    profile = chain()
    # fp32 adam offloaded: 8 optimizer + 4 master + 4 gradient = 16 B per parameter on the host
    s = offload(2, host_mem_bytes=40 * MIB, dp=2, devices_per_node=4)
    assert dataparallel.host_bytes_per_param(s) == 16
    assert costmodel.host_cap_bytes(s.data_parallel, pipeline=s.pipeline) == 10 * MIB  # 4 ranks share the node
    cost = costmodel.evaluate(costmodel.split_to_stages([0, 3], [False] * 5, profile), profile, s)
    assert [c.host_bytes for c in cost.stages] == [16 * 65536 * 6, 16 * 65536 * 9]  # 6 MiB, 9 MiB
    assert [c.fits_host for c in cost.stages] == [True, True] and cost.feasible
    tight = costmodel.evaluate(costmodel.split_to_stages([0, 2], [False] * 5, profile), profile, s)
    assert [c.host_bytes for c in tight.stages] == [3 * MIB, 12 * MIB]
    assert not tight.stages[1].fits_host and tight.stages[1].fits_device and not tight.feasible
    assert costmodel.host_cap_bytes(offload(2).data_parallel, pipeline=offload(2).pipeline) is None  # no --host-mem: not capped


@pytest.mark.parametrize("solver", ["dp", "milp"])
def test_the_solvers_cut_where_the_host_allows(solver):
    """The optimizer's host bytes per layer are 1, 2, 3, 4, 5 MiB (16 B x 65536 x (i + 1)): a
    rank's share of 9 MiB allows only the cut l0-l2 | l3-l4, 8 MiB none at all."""
    profile = chain()
    capped = offload(2, host_mem_bytes=9 * MIB + costmodel.FIT_MARGIN_BYTES)
    result = search.plan(profile, capped, solver=solver, **EXACT)
    assert isinstance(result, search.PlanResult)
    assert [len(s.layers) for s in result.stages] == [3, 2]
    assert [c.host_bytes for c in result.cost.stages] == [6 * MIB, 9 * MIB]
    assert result.cost.iteration_ms == pytest.approx(brute_optimum(profile, capped), rel=1e-9)
    none = search.plan(profile, offload(2, host_mem_bytes=8 * MIB), solver=solver, **EXACT)
    assert isinstance(none, search.NoFit) and none.status == "infeasible"
    why = search.why_not(profile, offload(2, host_mem_bytes=8 * MIB), deadline=search.Deadline(None))
    assert [(w.resource, w.need_bytes) for w in why] == [("host", 9 * MIB + costmodel.FIT_MARGIN_BYTES)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 5), st.integers(1, 3), st.floats(0.4, 1.2), st.sampled_from(["dp", "milp"]))
def test_host_capped_optimum_equals_brute_force(n, stages, fraction, solver):
    profile = chain(n)
    stages = min(stages, n)
    whole = sum(layer.param_count for layer in profile.layers) * 16
    s = offload(stages, host_mem_bytes=int(fraction * whole))
    optimum = brute_optimum(profile, s)
    result = search.plan(profile, s, solver=solver, **EXACT)
    if optimum is None:
        assert isinstance(result, search.NoFit)
    else:
        assert result.cost.iteration_ms == pytest.approx(optimum, rel=1e-9)


# ---------------------------------------------------------------- the CLI: --solver, host memory


@pytest.fixture()
def profile_path(tmp_path):
    from export_plans import llm_profile

    path = tmp_path / "llm.json"
    io.save_profile(llm_profile(8).model_copy(update={"host_step_ns_per_param": {"adam": 5.0, "sgd": 2.0}}), path)
    return path


def test_solve_with_either_solver_and_evaluate_agree(profile_path, tmp_path):
    """The same optimum from the DP and the MILP, the plan saying which ran, and evaluate of the
    plan's layers and checkpoints scoring it the same, stage by stage."""
    args = ["--profile", str(profile_path), "--stages", "3", "--mem", "120MiB", "--microbatches", "6"]
    found = {}
    for solver in ("dp", "milp"):
        out = tmp_path / f"{solver}.yaml"
        found[solver] = json.loads(run_ok("solve", *args, "--solver", solver, "--out", str(out), "--json").stdout)
        assert found[solver]["solver"] == solver and found[solver]["status"] == "optimal"
        assert yaml.safe_load(out.read_text())["solver"]["name"] == solver
    dp, milp = found["dp"]["iteration_ms"], found["milp"]["iteration_ms"]
    assert abs(dp - milp) <= 1e-6 * dp
    stages = found["dp"]["stages"]
    counts = ",".join(str(len(s["layers"])) for s in stages)
    names = ",".join(name for s in stages for name in s["checkpointed"])
    hand = json.loads(run_ok("evaluate", *args[:2], "--mem", "120MiB", "--microbatches", "6",
                             "--layers-per-stage", counts, "--checkpoint", names, "--json").stdout)
    assert [s["checkpointed"] for s in hand["hand"]["stages"]] == [s["checkpointed"] for s in stages]
    assert hand["hand"]["iteration_ms"] == pytest.approx(dp, rel=1e-9)
    assert [s["peak_bytes"] for s in hand["hand"]["stages"]] == [s["peak_bytes"] for s in stages]


@pytest.mark.parametrize("extra, sentence", [
    ([], "give the checkpointed layers either as counts"),
    (["--ckpt-per-stage", "0,0", "--checkpoint", "layers.0"], "one of the two"),
    (["--checkpoint", "layers.0,nope"], "--checkpoint names 'nope', not a layer of the profile"),
])
def test_evaluate_checkpoints_by_count_or_by_name(profile_path, extra, sentence):
    result = run("evaluate", "--profile", str(profile_path), "--mem", "1GiB", "--layers-per-stage", "5,5", *extra)
    assert result.exit_code == 1 and sentence in result.output and "Traceback" not in result.output


def test_solve_respects_host_memory_and_says_when_it_rules_out_every_plan(profile_path, tmp_path):
    base = ["solve", "--profile", str(profile_path), "--stages", "3", "--mem", "1GiB", "--offload-optimizer"]
    out = tmp_path / "plan.yaml"
    result = run(*base, "--host-mem", "1MB", "--out", str(out))
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "no plan fits the host memory" in result.output and "--host-mem" in result.output
    assert not out.exists()
    run_ok(*base, "--host-mem", "36MiB", "--out", str(out), "--json")
    plan = io.load_plan(out)
    counts = {layer.name: layer.param_count for layer in io.load_profile(profile_path).layers}
    # fp32 adam offloaded: 16 host bytes per parameter; on cpu the 3 ranks share one host
    assert plan.setup.data_parallel.devices_per_node == 3
    assert max(sum(counts[n] for n in s.layers) for s in plan.stages) * 16 <= 12 * MIB


# ---------------------------------------------------------------- one planning path, calibration included


def test_solve_evaluate_and_auto_dp_predict_alike_on_a_calibrated_profile(profile_path, tmp_path, monkeypatch):
    """Calibration reaches every command that plans: the same setup gives the same prediction
    from solve, evaluate and --auto-dp, and not the uncalibrated one."""
    from planner.commands.calibration import calibration_path
    from planner.schema import Calibration, FileRef, PlacementFit

    monkeypatch.setattr("os.cpu_count", lambda: 8)  # every rank gets the profile's one thread
    args = ["--profile", str(profile_path), "--stages", "2", "--mem", "200MiB", "--microbatches", "4"]

    def solved(*extra):
        return json.loads(run_ok("solve", *args, *extra, "--out", str(tmp_path / "p.yaml"), "--json").stdout)

    uncalibrated = solved()["iteration_ms"]
    placements = [PlacementFit(ranks=ranks, threads=1, cores=8, compute_scale=1.5, plan="p.yaml",
                               measured_iteration_ms=1, predicted_before_ms=1, predicted_after_ms=1)
                  for ranks in (2, 4)]
    calibration = Calibration(created_at="2026-01-01T00:00:00+00:00",
                              profile=FileRef(file=str(profile_path), sha256=io.sha256_file(profile_path)),
                              backend="gloo", device_type="cpu", send_latency_ms=0.2, send_gb_per_s=1.5,
                              action_overhead_ms=0.3, placements=placements)
    calibration_path(profile_path).write_text(calibration.model_dump_json())
    plan = solved()
    assert plan["iteration_ms"] > 1.4 * uncalibrated
    counts = ",".join(str(len(s["layers"])) for s in plan["stages"])
    ckpts = ",".join(str(len(s["checkpointed"])) for s in plan["stages"])
    scored = json.loads(run_ok("evaluate", *args, "--layers-per-stage", counts, "--ckpt-per-stage", ckpts,
                               "--json").stdout)
    assert scored["hand"]["iteration_ms"] == pytest.approx(plan["iteration_ms"], rel=1e-12)
    assert scored["ckplan"]["iteration_ms"] == pytest.approx(plan["iteration_ms"], rel=1e-12)
    with_dp = solved("--dp", "2")["iteration_ms"]
    trials = json.loads(run_ok("solve", *args, "--dp", "2", "--auto-dp", "--out", str(tmp_path / "a.yaml"),
                               "--json").stdout)["combinations"]
    zero0 = next(t for t in trials if t["zero"] == 0 and not t["offload"])
    assert zero0["iteration_ms"] == pytest.approx(with_dp, rel=1e-12)
    assert all(len(t["reserved_bytes_per_stage"]) == len(t["static_bytes_per_stage"]) for t in trials if t["fits"])


def test_milp_json_on_stdout_is_json_alone(profile_path, tmp_path):
    """HiGHS prints a banner on the process's stdout when it first starts; --json keeps stdout for
    the JSON (a fresh process: the banner shows once per process)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "planner.cli", "solve", "--profile", str(profile_path), "--stages",
                           "2", "--mem", "1GiB", "--solver", "milp", "--out", str(tmp_path / "p.yaml"), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["solver"] == "milp"
