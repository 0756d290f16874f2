"""The data-parallel terms (planner/cost/dataparallel.py) against numbers worked out by hand, the
solver against evaluate() with them on, and the options' bad input in one sentence.

bf16-mixed Adam: weights 2, grads 2, optimizer state 12 (fp32 master + m + v) bytes per parameter.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from export_plans import llm_profile
from fixtures.cli import run_ok

from planner import io
from planner.cli import cli
from planner.cost import costmodel, dataparallel, links
from planner.models.synthetic import layer, profile_of
from planner.schema import TrainSetup
from planner.solve import search

MIB = 2**20
GB = 1e9


def setup(**fields) -> TrainSetup:
    base = dict(stages=1, microbatches=4, micro_batch_size=1, mem_caps_bytes=[2**50], precision="bf16-mixed")
    return TrainSetup(**(base | fields))


# ---------------------------------------------------------------- memory


@pytest.mark.parametrize("zero, group, offload, expected", [
    (0, None, False, 2 + 2 + 12),
    (1, 8, False, 2 + 2 + 12 / 8),  # 5.5
    (1, 4, False, 2 + 2 + 12 / 4),  # 7: sharded in groups of 4, replicated across 2
    (1, 2, False, 2 + 2 + 12 / 2),  # 10
    (2, 4, False, 2 + 2 / 4 + 2 / 4 + 12 / 4),  # 6: FSDP2 keeps its weight shard beside the gathered weights
    (3, 4, False, 2 / 4 + 2 / 4 + 12 / 4),  # 4
    (3, 8, False, 2 / 8 + 2 / 8 + 12 / 8),  # 2
    (1, 4, True, 2 + 2),  # optimizer state (and master) on the host
    (0, None, True, 2 + 2),
])
def test_bytes_per_param_for_each_zero_stage_and_shard_group(zero, group, offload, expected):
    s = setup(dp=8, zero=zero, shard_group=group, offload=offload)
    assert costmodel.bytes_per_param(s) == expected


@pytest.mark.parametrize("precision, optimizer, expected, host", [
    ("fp32", "adam", 4 + 4 + 8, 8 + 4 + 4),
    ("bf16", "adam", 2 + 2 + 4, 8 + 4 + 4),  # torch.optim keeps m and v in the parameter's bf16
    ("bf16", "sgd", 2 + 2 + 2, 4 + 4 + 4),
    ("bf16-mixed", "adam", 2 + 2 + 12, 8 + 4 + 4),
])
def test_bytes_per_param_by_precision_and_the_offloaded_host_bytes(precision, optimizer, expected, host):
    # ckplan's runtime trains a bf16 profile in bf16 throughout (the GPU check measured a LLaMA 3 8B
    # stage's static at +0.0% with this, where fp32's 16 B/param predicted twice the bytes);
    # an offloaded optimizer steps fp32 masters on the host whatever the device trains in
    assert costmodel.bytes_per_param(setup(precision=precision, optimizer=optimizer)) == expected
    offloaded = setup(precision=precision, optimizer=optimizer, offload=True)
    assert dataparallel.host_bytes_per_param(offloaded) == host


def test_unsharded_bytes_of_fsdp2_per_layer():
    # largest layer 1 Mi params, bf16 weights and gradients (2 B): ZeRO 3 holds the computing
    # layer's weights and the prefetched one's all-gather buffer (2 x 2 B), the unsharded gradient
    # and the previous layer's reduce-scatter input (2 x 2 B); ZeRO 2 two all-gather buffers in
    # the forward or two gradients in the backward (2 x 2 B)
    assert dataparallel.unsharded_bytes(MIB, setup(dp=4, zero=3)) == 8 * MIB
    assert dataparallel.unsharded_bytes(MIB, setup(dp=4, zero=2)) == 4 * MIB
    assert dataparallel.unsharded_bytes(MIB, setup(dp=4, zero=1)) == 0
    assert dataparallel.unsharded_bytes(MIB, setup(dp=4, zero=0)) == 0


def test_reduced_gradient_shards_only_for_hsdp_zero3_per_microbatch():
    # HSDP (groups of 2, 2 replicas): each reduced layer's 1/2 of its bf16 gradient, 1 B/param
    assert dataparallel.reduced_bytes_per_param(setup(dp=4, zero=3, shard_group=2)) == 1
    assert dataparallel.reduced_bytes_per_param(setup(dp=4, zero=3)) == 0  # one group: nothing all-reduced
    assert dataparallel.reduced_bytes_per_param(setup(dp=4, zero=2, shard_group=2)) == 0
    assert dataparallel.reduced_bytes_per_param(setup(dp=4, zero=3, shard_group=2, zero_gather="per-iteration")) == 0


def test_stage_static_and_buffers_by_hand():
    # three layers of 1, 2 and 1 Mi params on one stage, dp 4, ZeRO 3 in groups of 2 (HSDP):
    # static = 4 Mi x (2/2 + 2/2 + 12/2) = 32 MiB; no buffers (no pipeline buffers on a single stage, no batch
    # bytes); FSDP2's units per moment (fsdpunits.py), the largest the end of b's backward: b and a prefetched
    # (2 + 1) Mi x 2 B, c's reduce-scatter input and b's gradient (1 + 2) Mi x 2 B = 12 MiB, and under HSDP
    # c's reduced shard, kept for the all-reduce to the backward's end, 1 Mi x 2 B / 2 = 1 MiB
    p = profile_of([layer("a", "A", fwd_ms=1, act_mib=0, input_mib=0, param_count=MIB),
                    layer("b", "B", fwd_ms=1, act_mib=0, input_mib=0, param_count=2 * MIB),
                    layer("c", "C", fwd_ms=1, act_mib=0, input_mib=0, param_count=MIB)])
    stages = costmodel.split_to_stages([0], [False] * 3, p)
    cost = costmodel.evaluate(stages, p, setup(dp=4, zero=3, shard_group=2)).stages[0]
    assert cost.static_bytes == 32 * MIB
    assert (cost.buffer_bytes, cost.transient_bytes) == (0, 13 * MIB)
    # one shard group (no replicas): no reduced shards kept
    cost = costmodel.evaluate(stages, p, setup(dp=4, zero=3)).stages[0]
    assert (cost.buffer_bytes, cost.transient_bytes) == (0, 12 * MIB)


def test_host_bytes_per_node():
    # offload, bf16-mixed Adam: 12 (master, m, v) + 4 (fp32 grad) = 16 B per owned param; ZeRO 1
    # in groups of 4: 4 B per param. Busiest stage 10 Mi params, 8 ranks a node: 320 MiB
    s = setup(stages=2, mem_caps_bytes=[2**50] * 2, dp=8, zero=1, shard_group=4, offload=True, devices_per_node=8)
    assert dataparallel.host_bytes_per_param(s) == 4
    assert dataparallel.host_bytes_per_node(10 * MIB * dataparallel.host_bytes_per_param(s), s) == 320 * MIB
    # fp32 training keeps an fp32 copy of the weights on the host too: 8 + 4 + 4
    assert dataparallel.host_bytes_per_param(setup(offload=True, precision="fp32")) == 16


# ---------------------------------------------------------------- time

P = 250_000_000  # bf16: 0.5 GB of gradients, 0.5 GB of weights
LINKS = dict(shard_gb_per_s=100.0, replica_gb_per_s=25.0)


def test_zero0_all_reduce_by_hand():
    # all-reduce over 8: 2 x 7/8 x 0.5 GB / 100 GB/s = 8.75 ms; no gathers
    s = setup(dp=8, **LINKS)
    assert dataparallel.grad_reduce_ms(P, s) == pytest.approx(8.75)
    assert dataparallel.weight_gather_ms(P, s) == 0


def test_zero1_reduce_scatter_then_all_reduce_across_replicas_by_hand():
    # groups of 4, 2 replicas: RS 3/4 x 0.5 GB / 100 = 3.75 ms; AR of the 1/4 shard (0.125 GB)
    # over 2: 2 x 1/2 x 0.125 / 25 = 5 ms; once per iteration. AG weights 3/4 x 0.5 / 100 = 3.75
    s = setup(dp=8, zero=1, shard_group=4, **LINKS)
    assert dataparallel.grad_reduce_ms(P, s) == pytest.approx(8.75)
    assert dataparallel.weight_gather_ms(P, s) == pytest.approx(3.75)


def test_zero2_and_zero3_reduce_every_microbatch_zero3_gathers_twice_per_microbatch():
    # M = 4: ZeRO 2 reduces 4 x 8.75 = 35 ms and gathers once (3.75); ZeRO 3 gathers 2 x 4 x 3.75 = 30
    z2 = setup(dp=8, zero=2, shard_group=4, **LINKS)
    z3 = setup(dp=8, zero=3, shard_group=4, **LINKS)
    assert dataparallel.grad_reduce_ms(P, z2) == pytest.approx(35.0)
    assert dataparallel.weight_gather_ms(P, z2) == pytest.approx(3.75)
    assert dataparallel.grad_reduce_ms(P, z3) == pytest.approx(35.0)
    assert dataparallel.weight_gather_ms(P, z3) == pytest.approx(30.0)


def test_frameworks_hide_the_reduction_behind_the_backward_and_ckplans_zero_0_does_not():
    # ZeRO 0 over 8: the all-reduce takes 8.75 ms. ckplan's runtime reduces after the last
    # backward: all of it shows. A framework (DDP's buckets, Megatron's overlap-grad-reduce)
    # reduces each layer beside the backward before it: a 5 ms backward hides 5 ms, 3.75 show;
    # a 10 ms backward hides it all.
    ours, theirs = setup(dp=8, **LINKS), setup(dp=8, runtime="deepspeed", **LINKS)
    assert dataparallel.exposed_comm_ms(P, ours, fwd_ms=2.5, bwd_ms=5.0) == pytest.approx(8.75)
    assert dataparallel.exposed_comm_ms(P, theirs, fwd_ms=2.5, bwd_ms=5.0) == pytest.approx(3.75)
    assert dataparallel.exposed_comm_ms(P, theirs, fwd_ms=5.0, bwd_ms=10.0) == 0.0
    # Megatron-LM reduces its fp32 main_grad (grad_reduce_in_fp32): twice the bytes, 17.5 ms
    megatron = setup(dp=8, runtime="megatron", **LINKS)
    assert dataparallel.exposed_comm_ms(P, megatron, fwd_ms=2.5, bwd_ms=5.0) == pytest.approx(17.5 - 5.0)
    assert dataparallel.exposed_comm_ms(P, megatron, fwd_ms=10.0, bwd_ms=20.0) == 0.0
    # ZeRO 1 in groups of 4: the reduction (8.75) hides as above; the gather after the step
    # (3.75) waits for the step and always shows
    assert dataparallel.exposed_comm_ms(P, setup(dp=8, zero=1, shard_group=4, runtime="deepspeed", **LINKS),
                                        bwd_ms=5.0) == pytest.approx(3.75 + 3.75)


def test_fsdp_prefetches_zero3_gathers_and_reduces_each_microbatch_beside_its_backward():
    # ZeRO 3, groups of 4, M = 4: per microbatch a forward gather (3.75 ms) behind a 2 ms
    # forward shows 1.75; the backward gather and reduction (3.75 + 8.75) behind a 10 ms
    # backward show 2.5: 4 x (1.75 + 2.5) = 17 ms where serial was 30 + 35 = 65. FSDP2 does it
    # in ckplan's runtime too; kept whole through the iteration (per-iteration) it does not.
    z3 = setup(dp=8, zero=3, shard_group=4, **LINKS)
    assert dataparallel.exposed_comm_ms(P, z3, fwd_ms=2.0, bwd_ms=10.0) == pytest.approx(17.0)
    kept = setup(dp=8, zero=3, shard_group=4, zero_gather="per-iteration", **LINKS)
    assert dataparallel.exposed_comm_ms(P, kept, fwd_ms=2.0, bwd_ms=10.0) == pytest.approx(8.75 + 3.75)


def test_zero3_kept_whole_through_the_iteration_is_zero1_in_time_plus_the_weight_shard_in_memory():
    # torch.distributed.pipelining with FSDP2: no reshard, no gradient sync until the last
    # backward. Groups of 4: 2 + 2/4 + 2 + 12/4 = 7.5 B/param at the peak (the weights
    # gathered beside FSDP2's shard of them), nothing extra gathered, one reduction
    # (8.75 ms) and one gather (3.75 ms) per iteration
    kept = setup(dp=8, zero=3, shard_group=4, zero_gather="per-iteration", **LINKS)
    assert costmodel.bytes_per_param(kept) == 7.5
    assert dataparallel.unsharded_bytes(MIB, kept) == 0
    assert dataparallel.grad_reduce_ms(P, kept) == pytest.approx(8.75)
    assert dataparallel.weight_gather_ms(P, kept) == pytest.approx(3.75)
    assert dataparallel.communicated(kept) == "RS grads/4+AR/2, AG weights/4"


def offload_setup(overlap: bool) -> TrainSetup:
    # ZeRO 1 in groups of 4: the rank owns 62.5 M params. Host link 50 GB/s: 0.125 GB of bf16
    # grads down in 2.5 ms, weights back in 2.5 ms; host step 0.04 ns/param: 2.5 ms
    return setup(dp=8, zero=1, shard_group=4, offload=True, offload_overlap=overlap, host_gb_per_s=50.0,
                 host_step_ns_per_param=0.04, **LINKS)


def test_offload_serial_is_the_sum_of_copy_step_copy():
    assert dataparallel.offload_phases_ms(P, offload_setup(False)) == pytest.approx((2.5, 2.5, 2.5))
    assert dataparallel.offload_ms(P, offload_setup(False)) == pytest.approx(7.5)


def test_offload_overlapped_is_the_slowest_phase_plus_one_chunks_fill():
    # chunks of 2**22 params: fill = the first chunk's other two phases
    # = 2 x 2.5 ms x 4194304 / 62.5e6 = 0.33554432 ms; total 2.5 + 0.33554432
    assert dataparallel.offload_ms(P, offload_setup(True)) == pytest.approx(2.5 + 5 * 4194304 / 62.5e6)


def test_layer_step_term_adds_the_device_step_share_reduction_and_gathers():
    # device Adam step 8 ms for the layer, ZeRO 1 in groups of 4: 2 ms + 8.75 + 3.75 = 14.5 ms;
    # offloaded (serial): no device step, 7.5 ms of offload instead: 7.5 + 8.75 + 3.75 = 20 ms
    p = profile_of([layer("a", "A", fwd_ms=1, act_mib=0, input_mib=0, param_count=P, adam_step_ms=8.0)])
    (cost,) = costmodel.layer_costs(p)
    assert costmodel.layer_step_ms(cost, setup(dp=8, zero=1, shard_group=4, **LINKS)) == pytest.approx(14.5)
    assert costmodel.layer_step_ms(cost, offload_setup(False)) == pytest.approx(20.0)


def test_iteration_charges_the_step_term_once():
    # one stage, M = 4, fwd 1 + bwd 2 = 3 ms a microbatch: 4 x 3 + 14.5 = 26.5 ms
    p = profile_of([layer("a", "A", fwd_ms=1, act_mib=0, input_mib=0, param_count=P, adam_step_ms=8.0)])
    stages = costmodel.split_to_stages([0], [False], p)
    cost = costmodel.evaluate(stages, p, setup(dp=8, zero=1, shard_group=4, **LINKS))
    assert cost.iteration_ms == pytest.approx(26.5)


def test_old_setups_load_and_charge_no_traffic():
    s = TrainSetup.model_validate({"stages": 1, "microbatches": 2, "micro_batch_size": 1,
                                   "mem_caps_bytes": [MIB], "dp": 4, "zero": 1})
    assert s.data_parallel.shard_group is None and s.data_parallel.shard_gb_per_s is None
    assert dataparallel.grad_reduce_ms(P, s) == 0


# ---------------------------------------------------------------- the solver agrees


@pytest.mark.parametrize("zero, group, offload", [(0, None, False), (1, 2, True), (2, 4, False), (3, 2, True)])
def test_solver_and_evaluate_agree_with_dp_terms(zero, group, offload):
    profile = llm_profile(8)
    s = TrainSetup(stages=3, microbatches=6, micro_batch_size=1, mem_caps_bytes=[60 * MIB] * 3,
                   precision="bf16-mixed", dp=4, zero=zero, shard_group=group, offload=offload,
                   shard_gb_per_s=0.5, replica_gb_per_s=0.1, host_gb_per_s=0.2, host_step_ns_per_param=50.0)
    result = search.plan(profile, s, time_limit_s=30)
    assert isinstance(result, search.PlanResult)  # re-scored by evaluate(): a mismatch raises
    again = costmodel.evaluate(result.stages, profile, s)
    assert again.iteration_ms == pytest.approx(result.cost.iteration_ms, rel=1e-9)
    assert again.feasible
    # the other solver, with the same data-parallel terms, finds the same optimum
    other = search.plan(profile, s, time_limit_s=30, solver="milp", mip_gap=0.0)
    assert other.cost.iteration_ms == pytest.approx(result.cost.iteration_ms, rel=1e-6)


def test_zero1_whole_tensors_by_hand():
    # ZeroRedundancyOptimizer gives each rank whole tensors. Layers of 1 Mi params (one
    # tensor) and 1 Mi (largest 256 Ki), dp 4 in one group, bf16-mixed Adam (o = 12):
    # even share 2 Mi / 4 = 512 Ki, but a rank holds the 1 Mi tensor: 12 x 512 Ki = 6 MiB more
    # than static 2 Mi x (2 + 2 + 12/4) = 14 MiB. In groups of 2 the share is 1 Mi: nothing more
    p = profile_of([layer("a", "A", fwd_ms=1, act_mib=0, input_mib=0, param_count=MIB, largest_param_count=MIB),
                    layer("b", "B", fwd_ms=1, act_mib=0, input_mib=0, param_count=MIB,
                          largest_param_count=MIB // 4)])
    stages = costmodel.split_to_stages([0], [False, False], p)
    assert costmodel.evaluate(stages, p, setup(dp=4, zero=1)).stages[0].static_bytes == 20 * MIB
    assert costmodel.evaluate(stages, p, setup(dp=4, zero=1, shard_group=2)).stages[0].static_bytes == 20 * MIB
    assert dataparallel.zero_one_excess_bytes(2 * MIB, MIB, setup(dp=4, zero=1, shard_group=2)) == 0
    # FSDP2 (ZeRO 2/3) splits every tensor; unknown tensor sizes (analytic profiles) charge nothing
    assert dataparallel.zero_one_excess_bytes(2 * MIB, MIB, setup(dp=4, zero=2)) == 0
    assert dataparallel.zero_one_excess_bytes(2 * MIB, 0, setup(dp=4, zero=1)) == 0


@pytest.mark.parametrize("cap_mib", [42, 48, 60])
def test_solvers_and_evaluate_agree_with_zero1_whole_tensors(cap_mib):
    """A 1.2 M-parameter embedding and head (one tensor each) beside blocks of 200 k: with
    ZeRO 1 over 4 ranks the stage holding the head keeps its optimizer state whole on one
    rank, and both solvers see it as evaluate() does."""
    base = llm_profile(8)
    big = {"tok_embeddings", "output"}
    profile = base.model_copy(update={"layers": [
        item.model_copy(update={"param_count": 1_200_000, "largest_param_count": 1_200_000} if item.name in big
                        else {"largest_param_count": 50_000}) for item in base.layers]})
    s = TrainSetup(stages=3, microbatches=6, micro_batch_size=1, mem_caps_bytes=[cap_mib * MIB] * 3,
                   precision="bf16-mixed", dp=4, zero=1)
    result = search.plan(profile, s, time_limit_s=30)
    assert isinstance(result, search.PlanResult)
    again = costmodel.evaluate(result.stages, profile, s)
    assert again.iteration_ms == pytest.approx(result.cost.iteration_ms, rel=1e-9) and again.feasible
    by_name = {item.name: item for item in profile.layers}
    for stage, cost in zip(result.stages, again.stages, strict=True):
        params = sum(by_name[name].param_count for name in stage.layers)
        largest = max(by_name[name].largest_param_count for name in stage.layers)
        assert cost.static_bytes == round(params * (2 + 2 + 12 / 4) + 12 * max(0, largest - params / 4))
    other = search.plan(profile, s, time_limit_s=30, solver="milp", mip_gap=0.0)
    assert other.cost.iteration_ms == pytest.approx(result.cost.iteration_ms, rel=1e-6)


# ---------------------------------------------------------------- bad input


@pytest.fixture()
def profile_path(tmp_path):
    path = tmp_path / "llm.json"
    io.save_profile(llm_profile(8).model_copy(update={"host_step_ns_per_param": {"adam": 5.0, "sgd": 2.0}}), path)
    return path


@pytest.mark.parametrize("args, sentence", [
    (["--dp", "4", "--zero", "1", "--shard-group", "3"], "--shard-group 3 does not divide --dp 4; use one of 1, 2, 4"),
    (["--zero", "2"], "--zero 2 shards over data-parallel ranks and --dp is 1"),
    (["--dp", "4", "--shard-group", "2"], "--shard-group 2 needs --zero 1, 2 or 3"),
    (["--dp", "4", "--zero", "1", "--shard-group", "1"], "--shard-group 1 shards nothing"),
    # a profile with no offload option: nothing would go to the host
    (["--host-mem", "1GB"], "--host-mem caps what goes to the host"),
    (["--dp", "2", "--offload-optimizer", "--host-mem", "1MB"], "the offloaded optimizer needs"),
])
def test_bad_dp_options_get_one_sentence(profile_path, tmp_path, args, sentence):
    result = CliRunner().invoke(cli, ["solve", "--profile", str(profile_path), "--stages", "3", "--mem", "200MiB",
                                      "--out", str(tmp_path / "p.yaml"), *args])
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert sentence in result.output
    assert len(result.output.strip().splitlines()) <= 3  # the notes on stderr and one line of error


def test_offload_without_a_host_measurement_says_to_reprofile(tmp_path):
    path = tmp_path / "old.json"
    io.save_profile(llm_profile(8), path)
    result = CliRunner().invoke(cli, ["solve", "--profile", str(path), "--stages", "3", "--mem", "200MiB",
                                      "--offload-optimizer", "--out", str(tmp_path / "p.yaml")])
    assert result.exit_code == 1
    assert "re-run `ckplan profile`" in result.output


def test_evaluate_takes_the_dp_options(profile_path):
    result = CliRunner().invoke(cli, ["evaluate", "--profile", str(profile_path), "--mem", "80MiB",
                                      "--layers-per-stage", "3,3,2", "--ckpt-per-stage", "1,0,2", "--dp", "4",
                                      "--zero", "1", "--shard-bandwidth", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert '"iteration_ms"' in result.output


# ---------------------------------------------------------------- defaults


def gpu_profile(tp: int):
    p = llm_profile(8)
    return p.model_copy(update={"device": p.device.model_copy(update={"type": "cuda", "name": "h100 (analytic)"}),
                                "assumptions": {"gpu": "h100-sxm", "tp": tp}})


def test_default_links_follow_the_node_boundary():
    # H100 SXM, 8 GPUs a node. tp 1: a shard group of 8 stays in the node, its all-gathers and reduce-scatters at
    # nccl-tests' busbw on 8 H100 (354.9 GB/s, not NVLink's 450 one way), 16 replicas' all-reduce crosses nodes
    # (400 Gb/s = 50 GB/s per GPU, of which NCCL's busbw reaches 48: nccl-tests#119); host PCIe Gen5 64 GB/s
    chosen = links.default_links(gpu_profile(1), stages=4, dp=16, shard_group=8)
    assert (chosen.shard_gb_per_s, chosen.replica_gb_per_s, chosen.host_gb_per_s) == (354.9, 48.0, 64.0)
    assert chosen.devices_per_node == 8 and "measured busbw" in chosen.notes[0] and "nccl#1281" in chosen.notes[0]
    # tp 8 fills the node: every data-parallel group crosses nodes
    chosen = links.default_links(gpu_profile(8), stages=4, dp=8, shard_group=2)
    assert (chosen.shard_gb_per_s, chosen.replica_gb_per_s) == (48.0, 48.0)
    assert "h100-sxm" in chosen.notes[0]


def test_in_node_rings_run_at_the_measured_busbw_and_an_expert_all_to_all_at_the_link():
    # MI300X: rccl-tests' all-reduce busbw on 8 GPUs (316.55 GB/s) for a shard group of 8, where the datasheet's
    # Infinity Fabric gives 448 one way; an expert-parallel all-to-all has no busbw published: the link's 448
    mi300x = gpu_profile(1).model_copy(update={"assumptions": {"gpu": "mi300x", "tp": 1}})
    chosen = links.default_links(mi300x, stages=1, dp=8, shard_group=8, ep=8)
    assert (chosen.shard_gb_per_s, chosen.replica_gb_per_s, chosen.ep_gb_per_s) == (316.55, 316.55, 448.0)
    assert "rccl-tests" in chosen.notes[0]
    # a GPU with no measured busbw (H200's record) keeps the link's datasheet rate
    h200 = gpu_profile(1).model_copy(update={"assumptions": {"gpu": "h200", "tp": 1}})
    assert links.default_links(h200, stages=1, dp=8, shard_group=8).shard_gb_per_s == 450.0


def test_a_given_bandwidth_replaces_the_default_and_the_note_says_the_figure_used():
    # T24's Jean Zay: one 100 Gb/s Omni-Path port a data-parallel ring (--shard-bandwidth 12.5); the note
    # printed the DGX's 25 GB/s while the cost used 12.5
    chosen = links.default_links(gpu_profile(1), stages=4, dp=16, shard_group=16, given={"--shard-bandwidth": 12.5,
                                                                                        "--host-bandwidth": None})
    assert (chosen.shard_gb_per_s, chosen.replica_gb_per_s, chosen.host_gb_per_s) == (12.5, 48.0, 64.0)
    assert "shard group reduces at 12.5 GB/s (--shard-bandwidth)" in chosen.notes[0]
    assert "host copies at 64 GB/s (PCIe)" in chosen.notes[0]
    gb200 = gpu_profile(1).model_copy(update={"assumptions": {"gpu": "gb200", "tp": 1}})  # Grace's NVLink-C2C, not PCIe
    assert "host copies at 450 GB/s (NVLink-C2C)" in links.default_links(gb200, stages=1, dp=8, shard_group=8).notes[0]
    cpu = links.default_links(llm_profile(8), stages=2, dp=2, shard_group=2, given={"--replica-bandwidth": 3.0})
    assert (cpu.shard_gb_per_s, cpu.replica_gb_per_s) == (links.CPU_GLOO_GB_PER_S, 3.0)


def test_defaults_are_recorded_in_the_setup_and_options_override_them():
    from planner.commands.setup_options import DataParallelOptions, build_setup

    profile = gpu_profile(1).model_copy(update={"host_step_ns_per_param": {"adam": 3.0, "sgd": 1.0}})
    notes = []
    s = build_setup(profile, stages=2, mem="80GB", microbatches=None, schedule="1F1B", optimizer="adam",
                    precision="bf16-mixed", parallel_stages=None, say=notes.append,
                    data_parallel=DataParallelOptions(dp=16, zero=1, shard_group=8, offload_optimizer=True,
                                                      replica_bandwidth=20.0))
    assert (s.data_parallel.shard_gb_per_s, s.data_parallel.replica_gb_per_s, s.data_parallel.host_gb_per_s, s.data_parallel.host_step_ns_per_param) == (354.9, 20.0, 64.0, 3.0)
    assert s.data_parallel.dp_notes + s.comm.comm_notes == notes and len(notes) == 3 and "3 ns per parameter" in notes[1]
    assert "--host-step-ns" in notes[1]  # says how to give the training hosts' speed

    given = build_setup(profile, stages=2, mem="80GB", microbatches=None, schedule="1F1B", optimizer="adam",
                        precision="bf16-mixed", parallel_stages=None,
                        data_parallel=DataParallelOptions(dp=16, zero=1, shard_group=8, offload_optimizer=True,
                                                          host_step_ns=0.7))
    assert given.data_parallel.host_step_ns_per_param == 0.7
    assert given.data_parallel.dp_notes[-1] == "host adam step: 0.7 ns per parameter (--host-step-ns)"


def test_profile_arch_charges_the_published_host_adam_speed(tmp_path):
    """An analytic profile plans GPU servers: Adam's host step is the published server figure
    (not this machine's CPU), SGD at its ratio to Adam timed here."""
    from planner.models.archs import HOST_ADAM_NS_PER_PARAM

    out = tmp_path / "a.json"
    result = CliRunner().invoke(cli, ["profile", "--arch", "llama3-8b", "--seq-len", "1024", "--out", str(out)])
    assert result.exit_code == 0, result.output
    profile = io.load_profile(out)
    assert profile.host_step_ns_per_param["adam"] == HOST_ADAM_NS_PER_PARAM == 0.40
    assert 0 < profile.host_step_ns_per_param["sgd"] < HOST_ADAM_NS_PER_PARAM
    assert "numa-cpu-adam-bench" in profile.assumptions["host_step"]

    plan = tmp_path / "p.yaml"
    args = ["solve", "--profile", str(out), "--stages", "4", "--mem", "80GB", "--dp", "8", "--offload-optimizer",
            "--zero", "1", "--out", str(plan)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "host adam step: 0.4 ns per parameter, DeepSpeedCPUAdam on a GPU server" in result.output
    assert io.load_plan(plan).setup.data_parallel.host_step_ns_per_param == 0.4
    result = CliRunner().invoke(cli, [*args, "--host-step-ns", "3"])
    assert result.exit_code == 0, result.output
    assert io.load_plan(plan).setup.data_parallel.host_step_ns_per_param == 3.0


def test_scored_for_torchtitan_any_zero_stage_runs_as_fsdp2_kept_whole_beside_the_pipeline(tmp_path):
    # torchtitan's default reshard policy with PP keeps the weights after the forward, and
    # torch.distributed.pipelining syncs gradients at the last backward only
    # (torchtitan/distributed/fsdp.py, torch's stage.py): ZeRO 1 there is ZeRO 3 kept whole
    caps = [2**50] * 2
    s = setup(stages=2, mem_caps_bytes=caps, dp=4, zero=1, runtime="torchtitan")
    ran = dataparallel.as_torchtitan_runs(s)
    assert (ran.data_parallel.zero, ran.data_parallel.zero_gather) == (3, "per-iteration")
    plain = setup(stages=2, mem_caps_bytes=caps, dp=4)
    assert dataparallel.as_torchtitan_runs(plain) == plain  # nothing sharded
    # without a pipeline torchtitan's FSDP2 reshards after every forward (the published 8B runs)
    alone = dataparallel.as_torchtitan_runs(setup(stages=1, mem_caps_bytes=caps[:1], dp=8, zero=3,
                                                  runtime="torchtitan"))
    assert (alone.data_parallel.zero, alone.data_parallel.zero_gather) == (3, "per-microbatch")
    profile = tmp_path / "l8.json"
    run_ok("profile", "--arch", "llama3-8b", "--seq-len", "4096", "--out", profile)
    result = run_ok("solve", "--profile", profile, "--stages", "2", "--dp", "4", "--zero", "1", "--runtime",
                    "torchtitan", "--out", tmp_path / "p.yaml")
    assert "--runtime torchtitan: ZeRO-1 runs as FSDP2" in result.output
    plan = io.load_plan(tmp_path / "p.yaml")
    assert (plan.setup.data_parallel.zero, plan.setup.data_parallel.zero_gather) == (3, "per-iteration")
    assert "scored for torchtitan's runtime" in " ".join(result.output.split())


def test_solves_title_names_the_data_parallel_setup_as_evaluates_does(profile_path, tmp_path):
    # the plan's title said "3 stages, ..., scored for ckplan's runtime" with no word of --dp / --zero
    result = CliRunner().invoke(cli, ["solve", "--profile", str(profile_path), "--stages", "3", "--mem", "200MiB",
                                      "--dp", "4", "--zero", "1", "--out", str(tmp_path / "p.yaml")])
    assert result.exit_code == 0, result.output
    title = " ".join(result.output[result.output.index("ckplan plan:"):].split())
    assert title.startswith("ckplan plan: 3 stages,")
    assert ", dp 4, ZeRO-1 in shard groups of 4, scored for ckplan's runtime" in title
