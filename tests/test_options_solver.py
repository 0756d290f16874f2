"""Recompute options in the solvers: the DP and the MILP pick one option per layer, jointly with
the stage split, and both equal brute force over every split and every option vector; the
plan with options is never slower than whole-layer recompute and faster where a cheaper
option fits."""

import itertools
import re

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from planner.cost import costmodel
from planner.errors import UserError
from planner.models.synthetic import layer, profile_of, uniform_blocks
from planner.schema import RecomputeOption, TrainSetup
from planner.solve import search

MIB = 2**20
HUGE = 2**50
EXACT = dict(mip_gap=0.0, threads=1)
MARGIN = costmodel.FIT_MARGIN_BYTES
NEAR_EDGE = 8192


def with_options(item, options):
    """A synthetic layer with selective options: (name, kept MiB, recompute ms, peak MiB[, host MiB])."""
    listed = [RecomputeOption(name="none", kept_bytes=item.act_bytes),
              RecomputeOption(name="full", kept_bytes=item.input_bytes, recompute_ms=item.recompute_ms or item.fwd_ms,
                              recompute_peak_bytes=max(item.act_bytes - item.input_bytes, 0)),
              *(RecomputeOption(name=name, kept_bytes=int(kept * MIB), recompute_ms=ms,
                                recompute_peak_bytes=int(peak * MIB), host_bytes=int(host * MIB))
                for name, kept, ms, peak, *more in options for host in [more[0] if more else 0])]
    return item.model_copy(update={"recompute_options": listed, "recompute_ms": item.recompute_ms or item.fwd_ms})


def setup(stages, microbatches, caps, **fields):
    return TrainSetup(stages=stages, microbatches=microbatches, micro_batch_size=1, mem_caps_bytes=list(caps), **fields)


def all_plans(profile, setup_):
    """(stages, peaks, ms) for every contiguous split and every option vector."""
    layers = costmodel.layer_costs(profile)
    n, P = len(layers), setup_.pipeline.stages
    for cuts in itertools.combinations(range(1, n), P - 1):
        for choice in itertools.product(*(range(len(item.options)) for item in layers)):
            stages = costmodel.split_to_stages([0, *cuts], list(choice), profile)
            cost = costmodel.evaluate(stages, profile, setup_)
            yield stages, cost.peak_bytes_per_stage, cost.iteration_ms


def fits(peaks, caps):
    return all(p + MARGIN <= c for p, c in zip(peaks, caps))


OPTION_SETS = [
    [],
    [("attn", 6, 0.3, 3)],
    [("attn", 6, 0.3, 3), ("mlp-act", 9, 0.1, 1)],
    [("mlp-act", 9, 0.1, 1), ("save-matmuls", 4, 0.6, 6), ("worse", 12, 2.0, 9)],  # "worse" is dominated
    [("mlp-act", 9, 0.1, 1), ("offload", 1, 0.2, 11, 11)],  # full's bytes on the device, 11 MiB on the host
]


@st.composite
def cases(draw, offload: bool = False):
    """A profile of 1-4 layers with option sets drawn per kind (offload: every layer offloads),
    a roomy setup and a cap fraction per stage."""
    n = draw(st.integers(1, 4))
    stages = draw(st.integers(1, min(2, n)))
    kinds = draw(st.lists(st.sampled_from("AAB "), min_size=n, max_size=n))
    option_of = {kind: len(OPTION_SETS) - 1 if offload else draw(st.sampled_from(range(len(OPTION_SETS))))
                 for kind in "AB "}
    layers = []
    for i, kind in enumerate(kinds):
        name = kind if kind != " " else f"solo{i}"
        base = layer(f"l{i}", name, fwd_ms=draw(st.sampled_from([1.0, 2.0])), act_mib=12,
                     input_mib=draw(st.sampled_from([1, 2])), output_mib=1, param_count=65536,
                     transient_mib=draw(st.sampled_from([0, 2])), recompute_ms=draw(st.sampled_from([None, 0.8])))
        which = option_of[kind] if kind != " " or offload else draw(st.sampled_from(range(len(OPTION_SETS))))
        layers.append(with_options(base, OPTION_SETS[which]))
    profile = profile_of(layers).model_copy(update={"loss_transient_bytes": draw(st.sampled_from([0, 3 * MIB]))})
    micro = draw(st.integers(1, 4))
    fractions = [(step + 0.5) / 12 for step in draw(st.lists(st.integers(0, 11), min_size=stages, max_size=stages))]
    return profile, setup(stages, micro, [HUGE] * stages, schedule=draw(st.sampled_from(["1F1B", "GPipe"]))), fractions


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_both_solvers_equal_brute_force_over_every_option_vector(case):
    profile, roomy, fractions = case
    plans = list(all_plans(profile, roomy))
    P = roomy.pipeline.stages
    lo = [min(p[s] for _, p, _ in plans) for s in range(P)]
    hi = [max(p[s] for _, p, _ in plans) for s in range(P)]
    caps = [int(a + f * (b - a)) + MARGIN for a, b, f in zip(lo, hi, fractions)]
    assume(not any(abs(c - MARGIN - p) < NEAR_EDGE for _, peaks, _ in plans for p, c in zip(peaks, caps)))
    s = roomy.model_copy(update={"mem_caps_bytes": caps})
    feasible = [ms for _, peaks, ms in plans if fits(peaks, caps)]
    for method in ("dp", "milp"):
        result = search.plan(profile, s, solver=method, **EXACT)
        if not feasible:
            assert isinstance(result, search.NoFit), method
            continue
        assert isinstance(result, search.PlanResult), (method, result)
        assert result.cost.iteration_ms == pytest.approx(min(feasible), rel=1e-6), method
        assert costmodel.evaluate(result.stages, profile, s).feasible


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(cases(offload=True), st.integers(0, 11))
def test_the_milp_keeps_offloaded_activations_within_the_host_cap(case, step):
    """With --host-mem, the MILP's plan equals brute force over the plans that fit both the
    device caps and every rank's host share (k_s in-flight microbatches of each offloaded
    layer's host bytes); auto picks the MILP, and the DP, asked for, refuses in one sentence."""
    profile, roomy, fractions = case
    plans = [(stages, costmodel.evaluate(stages, profile, roomy)) for stages, _, _ in all_plans(profile, roomy)]
    P = roomy.pipeline.stages
    lo = [min(c.peak_bytes_per_stage[s] for _, c in plans) for s in range(P)]
    hi = [max(c.peak_bytes_per_stage[s] for _, c in plans) for s in range(P)]
    caps = [int(a + f * (b - a)) + MARGIN for a, b, f in zip(lo, hi, fractions)]
    most_host = max(max(stage.host_bytes for stage in c.stages) for _, c in plans)
    host = int((step + 0.5) / 12 * most_host) + MARGIN  # one rank a node: the rank's share is all of it
    capped = roomy.model_copy(update={"mem_caps_bytes": caps, "host_mem_bytes": host})
    again = [costmodel.evaluate(stages, profile, capped) for stages, _ in plans]
    assume(not any(abs(c - MARGIN - p) < NEAR_EDGE for cost in again for p, c in zip(cost.peak_bytes_per_stage, caps)))
    assume(not any(abs(host - MARGIN - stage.host_bytes) < NEAR_EDGE for cost in again for stage in cost.stages))
    feasible = [cost.iteration_ms for cost in again if cost.feasible]
    assert search.pick_solver(capped, "auto", profile) == "milp"
    with pytest.raises(UserError, match="--solver dp cannot weigh activations offloaded to the host"):
        search.plan(profile, capped, solver="dp")
    result = search.plan(profile, capped, **EXACT)
    if not feasible:
        assert isinstance(result, search.NoFit)
        return
    assert result.cost.iteration_ms == pytest.approx(min(feasible), rel=1e-6)
    assert costmodel.evaluate(result.stages, profile, capped).feasible


def test_a_stage_holds_its_in_flight_microbatches_of_offloaded_activations_on_the_host():
    """host_s = k_s x the offloaded layers' host bytes: 1F1B over 2 stages and 4 microbatches
    keeps 2 in flight on stage 0, 1 on stage 1; a layer not offloaded adds nothing."""
    blocks = [with_options(layer(f"l{i}", "A", fwd_ms=1.0, act_mib=12, input_mib=1, output_mib=1, param_count=64),
                           [("offload", 1, 0.2, 11, 11)]) for i in range(4)]
    profile = profile_of(blocks)
    stages = costmodel.split_to_stages([0, 2], [2, 0, 2, 2], profile)
    assert [stage.recompute for stage in stages] == [{"l0": "offload"}, {"l2": "offload", "l3": "offload"}]
    cost = costmodel.evaluate(stages, profile, setup(2, 4, [HUGE] * 2))
    assert [stage.host_bytes for stage in cost.stages] == [2 * 11 * MIB, 1 * 2 * 11 * MIB]
    assert all(stage.host_cap_bytes is None for stage in cost.stages)


def _blocks_with_options(n):
    """uniform_blocks' transformer-like profile, each block with the selective options a
    LLaMA block has: attention (a little recompute, much freed) and the MLP's activation."""
    profile = uniform_blocks(n, noise=0.0)
    layers = [item if item.kind != "Block" else
              with_options(item, [("attn", 96, 1.0, 40), ("mlp-act", 106, 0.3, 30), ("attn,mlp-act", 66, 1.3, 40)])
              for item in profile.layers]
    return profile.model_copy(update={"layers": layers})


@pytest.mark.parametrize("fraction", [0.15, 0.4, 0.7])
def test_options_are_never_slower_than_whole_layers_and_faster_where_cheaper_ones_fit(fraction):
    profile = _blocks_with_options(8)
    roomy = setup(2, 4, [HUGE] * 2)
    whole = roomy.model_copy(update={"recompute": "whole-layer"})
    full = costmodel.evaluate(costmodel.split_to_stages([0, 5], [0, *[1] * 8, 0], profile), profile, roomy)
    plain = costmodel.evaluate(costmodel.split_to_stages([0, 5], [0] * 10, profile), profile, roomy)
    caps = [int(a + fraction * (b - a)) for a, b in zip(full.peak_bytes_per_stage, plain.peak_bytes_per_stage)]
    options = search.plan(profile, roomy.model_copy(update={"mem_caps_bytes": caps}), **EXACT)
    layers_only = search.plan(profile, whole.model_copy(update={"mem_caps_bytes": caps}), **EXACT)
    assert options.cost.iteration_ms <= layers_only.cost.iteration_ms * (1 + 1e-12)
    chosen = {o for stage in options.stages for o in stage.recompute.values()}
    assert chosen - {"full"}, chosen  # a selective option fits somewhere
    assert options.cost.iteration_ms < layers_only.cost.iteration_ms
    assert all(set(stage.recompute.values()) <= {"full"} for stage in layers_only.stages)
    milp = search.plan(profile, roomy.model_copy(update={"mem_caps_bytes": caps}), solver="milp", **EXACT)
    assert milp.cost.iteration_ms == pytest.approx(options.cost.iteration_ms, rel=1e-6)


def test_a_plan_names_each_layers_option_and_evaluate_refuses_one_the_layer_lacks():
    profile = _blocks_with_options(2)
    stages = costmodel.split_to_stages([0, 2], [0, 2, 3, 0], profile)
    assert [stage.recompute for stage in stages] == [{"blocks.0": "attn"}, {"blocks.1": "mlp-act"}]
    assert [stage.checkpointed for stage in stages] == [[], []]
    bad = [stages[0], stages[1].with_recompute({"head": "attn"})]
    with pytest.raises(ValueError, match="has no recompute option 'attn'"):
        costmodel.evaluate(bad, profile, setup(2, 4, [HUGE] * 2))


def test_analytic_blocks_carry_the_selective_options_of_their_terms():
    """LLaMA 3 8B at 1024 tokens, eager attention: `core-attn` frees the softmax output, 32 heads x
    1024² x 2 bytes, and reruns QK^T and scores·V (4·s²·h FLOPs); `mlp-act` frees SiLU's output
    and the product, 2 x 1024 x 14336 x 2 bytes; a MoE block has its own (tests/test_moe_arch.py):
    the whole mixture, the routed experts' activation, and their combinations with core-attn and attn
    (the attention module whole: tests/test_core_attn_names.py); every block offload."""
    from planner.models import archs
    from planner.profiler import analytic

    gpu = archs.gpu("h100")
    shape = analytic.Shape(seq_len=1024, micro_batch_size=1, attention="eager")
    block = analytic.block_layer(0, archs.arch("llama3-8b"), shape, gpu, 0.4)
    options = {o.name: o for o in block.recompute_options}
    # mlp: the whole SwiGLU (gate, SiLU and up outputs, product), 4 x 1024 x 14336 x 2 bytes
    assert list(options) == ["none", "full", "core-attn", "attn", "mlp", "mlp-act", "core-attn,mlp", "core-attn,mlp-act",
                             "attn,mlp", "attn,mlp-act", "offload"]
    assert block.act_bytes - options["mlp"].kept_bytes == 4 * 1024 * 14336 * 2 == options["mlp"].recompute_peak_bytes
    assert block.act_bytes - options["core-attn"].kept_bytes == 32 * 1024 * 1024 * 2 == options["core-attn"].recompute_peak_bytes
    assert block.act_bytes - options["mlp-act"].kept_bytes == 2 * 1024 * 14336 * 2
    assert options["core-attn"].recompute_ms == pytest.approx(analytic.flops_ms(4 * 1024 * 1024 * 4096, gpu, 0.4))
    # SiLU and the product rerun: the activation class's measured rate (planner/profiler/membound.py)
    assert options["mlp-act"].recompute_ms == pytest.approx(
        4 * 1024 * 14336 * 2 / (gpu.hbm_tbps * dict(gpu.membound_class_efficiency)["activation"] * 1e12) * 1e3)
    both = options["core-attn,mlp-act"]
    assert both.kept_bytes == block.act_bytes - 32 * 1024 * 1024 * 2 - 2 * 1024 * 14336 * 2
    # offload keeps the block's input (1024 x 4096 bf16) and copies the rest out and back over
    # PCIe (64 GB/s a direction) beside the compute: the backward first waits for the down
    # projection's input (1024 x 14336 bf16), then what the forward and the backward (twice as
    # long) cannot hide is added; here the copies outlast both
    offload = options["offload"]
    assert offload.kept_bytes == options["full"].kept_bytes == 1024 * 4096 * 2
    assert offload.host_bytes == block.act_bytes - 1024 * 4096 * 2 == offload.recompute_peak_bytes
    copy_ms, first_ms = offload.host_bytes / 64e9 * 1e3, 1024 * 14336 * 2 / 64e9 * 1e3
    assert copy_ms - first_ms > block.bwd_ms == 2 * block.fwd_ms
    assert offload.recompute_ms == pytest.approx((copy_ms - block.fwd_ms) + first_ms + (copy_ms - first_ms - block.bwd_ms))
    moe = analytic.block_layer(0, archs.arch("mixtral-8x7b"), shape, gpu, 0.4)
    # and norm-out, its MLP norm's output (the one megatron-core's TE layer builds as a module of its own)
    assert [o.name for o in moe.recompute_options] == [
        "none", "full", "core-attn", "attn", "mlp", "mlp-act", "norm-out", "core-attn,mlp", "core-attn,mlp-act",
        "core-attn,norm-out", "attn,mlp", "attn,mlp-act", "attn,norm-out", "mlp,norm-out", "mlp-act,norm-out",
        "core-attn,mlp,norm-out", "core-attn,mlp-act,norm-out", "attn,mlp,norm-out", "attn,mlp-act,norm-out", "offload"]


def test_a_plan_with_selective_options_is_exported_as_whole_layers_and_rescored(tmp_path):
    from fixtures.cli import run_ok

    from planner import io

    run_ok("profile", "--arch", "llama3-70b", "--seq-len", "8192", "--tp", "8", "--sp", "--gpu", "h100",
           "--out", tmp_path / "p.json")
    # a cap under which the optimum mixes whole-layer and SwiGLU-only recompute (at 60 GB, with memory-bound
    # bytes at their measured rate, recomputing the SwiGLU costs what whole layers do and none is chosen)
    run_ok("solve", "--profile", tmp_path / "p.json", "--stages", "4", "--mem", "62GB", "--microbatches", "16",
           "--precision", "bf16-mixed", "--out", tmp_path / "plan.yaml")
    plan = io.load_plan(tmp_path / "plan.yaml")
    assert "mlp-act" in {o for stage in plan.stages for o in stage.recompute.values()}
    result = run_ok("export", tmp_path / "plan.yaml", "--to", "colossalai")
    said = " ".join(result.output.split())
    assert re.search(r"recomputes selectively \([a-z, -]*mlp-act[a-z, -]*\) recompute whole layers", said), said
    assert "iteration: plan" in result.output


def test_llama_70b_offloads_where_the_host_has_room_and_recomputes_where_it_has_not(tmp_path):
    """The analytic LLaMA 3 70B at 8192 tokens, TP 8 + SP, 4 stages at 56 GB: with the node's
    host memory (DGX H100: 2 TB) the rows admit blocks offloaded, cheaper than recomputing them whole, which
    the allocator replay puts over; with 1 GB of it none can offload, and the plan recomputes instead, no
    faster. The DP, asked for, refuses a host cap it cannot weigh; a host cap on whole layers only is refused as
    meaningless."""
    from fixtures.cli import run, run_ok

    from planner import io

    # --mfu 0.4: blocks slow enough that the copies hide behind them (at the roofline's faster
    # times, implied MFU ~0.55, recomputing a block beats copying it over PCIe, and nothing offloads)
    run_ok("profile", "--arch", "llama3-70b", "--seq-len", "8192", "--micro-batch-size", "1", "--tp", "8", "--sp",
           "--gpu", "h100", "--mfu", "0.4", "--out", tmp_path / "p.json")
    args = ("solve", "--profile", tmp_path / "p.json", "--stages", "4", "--mem", "56GB", "--microbatches", "16",
            "--precision", "bf16-mixed")
    # time for the cuts to close on a loaded host (each HiGHS solve ~15 s alone)
    roomy = run_ok(*args, "--host-mem", "2TB", "--time-limit", "600", "--out", tmp_path / "roomy.yaml")
    tight = run_ok(*args, "--host-mem", "1GB", "--out", tmp_path / "tight.yaml")
    plans = [io.load_plan(tmp_path / name) for name in ("roomy.yaml", "tight.yaml")]
    chosen = [{o for stage in plan.stages for o in stage.recompute.values()} for plan in plans]
    assert "offload" not in chosen[1]
    # with room on the host the relaxed rows' plan offloaded, and the replay put it over; the MILP's lazy cuts
    # (planner/solve/replaycuts.py) excluded each such stage until none faster than the tight plan may fit (the
    # search over caps gave an offloading plan "feasible", 7,275.16 against the tight 7,273.10 ms). Since
    # §45.boundgrad3 (a stage before the last charges its output's gradient once) the relaxed rows' first plan fits
    # the replay as it is: proven without a cut. Either way the roomy answer is proven, and never slower than the
    # tight one, which fits there too
    assert plans[0].solver.status == "optimal" and plans[0].solver.replay == "relaxed"
    assert plans[0].predicted.iteration_ms <= plans[1].predicted.iteration_ms
    assert "solver: milp" in roomy.output
    assert "host memory per rank by stage" not in tight.output
    refused = run(*args, "--host-mem", "2TB", "--solver", "dp", "--out", tmp_path / "dp.yaml")
    assert refused.exit_code == 1 and "use --solver milp or auto" in refused.output
    assert not (tmp_path / "dp.yaml").exists()
    # whole layers only: nothing could go to the host, so a host cap would be read by nothing
    unread = run(*args, "--host-mem", "2TB", "--recompute", "whole-layer", "--out", tmp_path / "whole.yaml")
    assert unread.exit_code == 1 and "--host-mem caps what goes to the host" in unread.output
    assert not (tmp_path / "whole.yaml").exists()


def test_a_chunked_plan_that_offloads_is_refused_not_misscored():
    """Chunked schedules do not model offloaded activations yet: the solver never offers them
    offload (useful_options), and a plan that offloads anyway is refused in one sentence."""
    blocks = [with_options(layer(f"l{i}", "A", fwd_ms=1.0, act_mib=12, input_mib=1, output_mib=1, param_count=64),
                           [("offload", 1, 0.2, 11, 11)]) for i in range(4)]
    profile = profile_of(blocks)
    chunked = setup(2, 4, [HUGE] * 2, schedule="interleaved-1F1B", chunks=2)
    pipeline = costmodel.split_to_stages([0, 1, 2, 3], [2, 0, 0, 0], profile)
    with pytest.raises(ValueError, match="rank 0's layer l0 offloads its activations"):
        costmodel.evaluate(costmodel.ranks_of(pipeline, chunked), profile, chunked)
    stage = costmodel.Context(profile, costmodel.stages_view(chunked, costmodel.schedule_of(chunked)))
    assert all(not layer.options[o].host_bytes for layer in costmodel.layer_costs(profile)
               for o in costmodel.useful_options(layer, stage))
