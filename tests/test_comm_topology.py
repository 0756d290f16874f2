"""Communication from bytes over the topology (planner/cost/comm.py): each collective's bytes and
time by hand, the link a group crosses, what the runtimes hide, the per-layer tensor-parallel
collectives the analytic profile records, and the MFU / tokens-per-second figures the commands
print (planner/profiler/throughput.py)."""

import json

import pytest
from click.testing import CliRunner

from planner.cli import cli
from planner.cost import comm, costmodel, runtimes
from planner.models import archs
from planner.models.synthetic import layer, profile_of
from planner.profiler import analytic_comm
from planner.profiler.formulas import Shape
from planner.profiler.throughput import (
    megatron_flops_per_token,
    torchtitan_flops_per_token,
    total_params,
)
from planner.schema import LayerCollective, StagePlan, TrainSetup

LINK = comm.Link(gb_per_s=100.0, step_latency_ms=0.001, base_latency_ms=0.01)
GB = 10**9


def test_each_collective_by_hand():
    # 1 GB over 8 ranks at 100 GB/s: 7/8 of it moved per rank (ring), 7 steps of 1 µs, 10 µs base
    assert comm.all_gather_ms(GB, 8, LINK) == pytest.approx(0.01 + 7 * 0.001 + 8.75)
    assert comm.reduce_scatter_ms(GB, 8, LINK) == pytest.approx(0.01 + 7 * 0.001 + 8.75)
    assert comm.all_reduce_ms(GB, 8, LINK) == pytest.approx(0.01 + 14 * 0.001 + 17.5)  # 2(n-1)/n
    assert comm.all_to_all_ms(GB, 4, LINK) == pytest.approx(0.01 + 3 * 0.001 + 7.5)
    assert comm.send_ms(GB, LINK) == pytest.approx(0.01 + 0.001 + 10.0)
    assert comm.all_reduce_ms(GB, 1, LINK) == 0.0 and comm.all_gather_ms(0, 8, LINK) == 0.0


def test_a_group_inside_a_node_uses_nvlink_and_one_spanning_nodes_the_network():
    inside, between = comm.node_link(450.0), comm.network_link(50.0, 1)
    assert comm.group_link(8, 1, 8, inside, between) is inside
    across = comm.group_link(16, 1, 8, inside, between)  # the network's, on 2 nodes, NVLink's step inside each
    assert (across.gb_per_s, across.where, across.nodes, across.node_step_latency_ms) == (50.0, "network", 2, 3.4e-3)
    assert comm.group_link(2, 4, 8, inside, between) is inside  # two stages of tp 2 x dp 2 in one node
    assert comm.group_link(2, 8, 8, inside, between).where == "network"  # stage neighbours 8 ranks apart
    assert comm.network_link(50.0, 2).gb_per_s == 100.0  # two NICs a GPU
    assert inside.step_latency_ms == pytest.approx(3.4e-3) and between.step_latency_ms == pytest.approx(14.0e-3)
    assert comm.node_link(64.0, pcie=True).step_latency_ms == pytest.approx(5.7e-3)


def _tp_profile(tmp_path, tp: int, *, sp: bool = True, name: str = "p.json"):
    out = tmp_path / name
    args = ["profile", "--arch", "llama3-8b", "--seq-len", "1024", "--micro-batch-size", "1", "--tp", str(tp),
            "--gpu", "h100", "--out", str(out)] + (["--sp"] if sp else [])
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    return out


def _evaluate(profile, *extra):
    result = CliRunner().invoke(cli, ["evaluate", "--profile", str(profile), "--layers-per-stage", "34",
                                      "--ckpt-per-stage", "0", "--microbatches", "2", "--precision", "bf16-mixed",
                                      "--json", "--time-limit", "10", *extra])
    return result


def test_the_analytic_profile_records_each_layers_collectives(tmp_path):
    shape = Shape(seq_len=1024, micro_batch_size=2, tp=4, sp=True)
    whole = 2048 * 4096 * 2
    # under SP one entry per collective: the forward's gather, scatter, gather, scatter (rerun by a
    # full recompute), then the backward's mirror
    forward = LayerCollective(kind="all-gather", tensor_bytes=whole, fwd=1, recompute=1)
    backward = LayerCollective(kind="all-gather", tensor_bytes=whole, bwd=1)
    scatter = {"kind": "reduce-scatter"}
    assert analytic_comm.block_collectives(4096, shape) == [
        forward, forward.model_copy(update=scatter), forward, forward.model_copy(update=scatter),
        backward, backward.model_copy(update=scatter), backward, backward.model_copy(update=scatter)]
    plain = Shape(seq_len=1024, micro_batch_size=2, tp=4)
    assert analytic_comm.block_collectives(4096, plain) == [
        LayerCollective(kind="all-reduce", tensor_bytes=whole, fwd=2, bwd=2, recompute=2)]
    assert analytic_comm.block_collectives(4096, Shape(seq_len=1024, micro_batch_size=2)) == []
    from planner import io

    loaded = io.load_profile(_tp_profile(tmp_path, 2))
    block = next(layer for layer in loaded.layers if layer.kind == "decoder_block")
    assert [c.kind for c in block.collectives] == ["all-gather", "reduce-scatter"] * 4
    assert block.collectives[0].tensor_bytes == 1024 * 4096 * 2


def test_the_tensor_parallel_collectives_are_charged_per_layer_by_hand(tmp_path):
    from planner import io

    path = _tp_profile(tmp_path, 2)
    charged = _evaluate(path, "--mem", "80GB")
    assert charged.exit_code == 0, charged.output
    profile = io.load_profile(path)
    # 2 ranks on NVLink: per collective 8.4 µs + 1 step x 3.4 µs + 1/2 x 8 MiB / 450 GB/s
    one = 8.4e-3 + 3.4e-3 + 0.5 * 1024 * 4096 * 2 / 450e9 * 1e3
    block = next(layer for layer in costmodel.layer_costs(profile) if layer.kind == "decoder_block")
    setup = TrainSetup(stages=1, microbatches=2, micro_batch_size=1, mem_caps_bytes=[2**40],
                       comm={"tp": 2, "tp_gb_per_s": 450.0, "tp_step_latency_ms": 3.4e-3,
                             "collective_latency_ms": 8.4e-3})
    assert comm.layer_comm_ms(block, 0, setup) == pytest.approx(8 * one)  # 4 forward, 4 backward
    assert comm.layer_comm_ms(block, 1, setup) == pytest.approx(12 * one)  # and the recompute's 4
    # the embedding (reduce-scatter forward, all-gather backward) and the head (the mirror): 2 each
    per_microbatch = 32 * 8 * one + 2 * 2 * one
    base = dict(stages=1, microbatches=2, micro_batch_size=1, mem_caps_bytes=[2**40])
    stage = [StagePlan(index=0, layers=[layer.name for layer in profile.layers], recompute={})]
    with_comm = costmodel.evaluate(stage, profile, TrainSetup(**base, comm=setup.comm))
    without = costmodel.evaluate(stage, profile, TrainSetup(**base))
    assert with_comm.iteration_ms - without.iteration_ms == pytest.approx(2 * per_microbatch)


def _overlapped(runtime: str, overlap: str) -> float:
    one = layer("block", "block", fwd_ms=1.0, act_mib=1, input_mib=1, param_count=10)
    one = one.model_copy(update={"collectives": [LayerCollective(kind="all-gather", tensor_bytes=5 * 10**8,
                                                                 fwd=1, bwd=1)]})
    cost = costmodel.layer_costs(profile_of([one]))[0]
    setup = TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**40], runtime=runtime,
                       comm={"tp": 2, "tp_gb_per_s": 50.0, "tp_overlap": overlap})
    return comm.layer_comm_ms(cost, 0, setup)


def test_an_overlapped_collective_is_hidden_only_under_the_runtime_setting_that_overlaps_it():
    # each pass's all-gather: 1/2 x 0.5 GB / 50 GB/s = 5 ms; forward 1 ms, backward 2 ms of compute
    assert _overlapped("torchtitan", "none") == pytest.approx(10.0)
    # AsyncTP overlaps only what torch fuses with a matmul (tests/test_asynctp.py); this one names none
    assert _overlapped("torchtitan", "async-tp") == pytest.approx(10.0)
    assert _overlapped("megatron", "async-tp") == pytest.approx(10.0)  # not Megatron-LM's setting
    assert _overlapped("megatron", "tp-comm-overlap") == pytest.approx(7.0)
    assert _overlapped("ckplan", "tp-comm-overlap") == pytest.approx(10.0)
    assert all(runtimes.facts(r).sources["tp_overlap"] for r in runtimes.VERSIONS)  # each with its source


def test_an_overlap_the_runtime_does_not_have_is_refused_in_one_sentence(tmp_path):
    path = _tp_profile(tmp_path, 2)
    result = _evaluate(path, "--mem", "80GB", "--runtime", "megatron", "--tp-overlap", "async-tp")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "--tp-overlap async-tp is a setting of torchtitan's runtime" in " ".join(result.output.split())
    flat = _tp_profile(tmp_path, 1, sp=False, name="flat.json")
    result = _evaluate(flat, "--mem", "80GB", "--runtime", "torchtitan", "--tp-overlap", "async-tp")
    assert result.exit_code == 1 and "without tensor parallelism" in " ".join(result.output.split())


def test_gpus_per_node_moves_the_pipeline_sends_onto_the_network(tmp_path):
    path = _tp_profile(tmp_path, 4)
    args = ["evaluate", "--profile", str(path), "--layers-per-stage", "17,17", "--ckpt-per-stage", "0,0",
            "--microbatches", "2", "--mem", "80GB", "--precision", "bf16-mixed", "--time-limit", "10"]
    inside = CliRunner().invoke(cli, args)
    across = CliRunner().invoke(cli, args + ["--gpus-per-node", "4"])
    assert inside.exit_code == 0 and across.exit_code == 0, inside.output + across.output
    said_inside, said_across = " ".join(inside.output.split()), " ".join(across.output.split())
    assert "pipeline sends at 370.8 GB/s (in-node, NCCL's effective NVLink rate), tensor-parallel 4" in said_inside
    assert "pipeline ranks" not in said_inside and "network" not in said_inside  # 2 stages of TP 4 in a node of 8
    assert ("at 50 GB/s (network) where they lie in two (pipeline ranks 0→1, ranks placed tp, cp, dp, pp)"
            in said_across)


def test_the_frameworks_flop_counts_by_hand():
    arch = archs.arch("llama3-8b")
    params, embedding = total_params(arch)
    assert (params, embedding) == (8_030_261_248, 128_256 * 4096)  # LLaMA 3 8B's published count
    assert torchtitan_flops_per_token(arch, 8192) == 6 * (params - embedding) + 12 * 32 * 32 * 128 * 8192
    h, q, kv, f, v = 4096, 4096, 1024, 14336, 128_256
    per_layer = h * (q + 2 * kv) + q * 8192 + q * h + 3 * h * f
    assert megatron_flops_per_token(arch, 8192) == 6 * (32 * per_layer + h * v)


def test_mfu_and_tokens_per_second_are_printed_and_in_json(tmp_path):
    path = _tp_profile(tmp_path, 1, sp=False)
    result = _evaluate(path, "--mem", "80GB", "--dp", "4")
    assert result.exit_code == 0, result.output
    hand = json.loads(result.stdout)["hand"]
    found = hand["throughput"]
    tokens = 2 * 1 * 1024 * 4  # microbatches x micro-batch x seq_len x dp
    assert found["gpus"] == 4
    assert found["tokens_per_s_per_gpu"] == pytest.approx(tokens / (hand["iteration_ms"] / 1e3 * 4))
    flops = torchtitan_flops_per_token(archs.arch("llama3-8b"), 1024)
    assert found["mfu_torchtitan"] == pytest.approx(flops * found["tokens_per_s_per_gpu"] / 989.4e12)
    printed = CliRunner().invoke(cli, ["evaluate", "--profile", str(path), "--layers-per-stage", "34",
                                       "--ckpt-per-stage", "0", "--microbatches", "2", "--mem", "80GB", "--dp", "4",
                                       "--precision", "bf16-mixed", "--time-limit", "10"])
    words = " ".join(printed.output.split())
    assert f"{found['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, torchtitan mfu {found['mfu_torchtitan']:.1%}" \
        in words


@pytest.mark.parametrize("solver", ["dp", "milp"])
def test_both_solvers_charge_the_collectives_and_sends_as_the_evaluator_does(tmp_path, solver):
    """A plan's objective is re-evaluated after the solve (search._checked): a solver that left
    out the tensor-parallel term or the sends would be refused there."""
    path = _tp_profile(tmp_path, 2)
    out = tmp_path / "plan.yaml"
    result = CliRunner().invoke(cli, ["solve", "--profile", str(path), "--stages", "2", "--microbatches", "4",
                                      "--mem", "80GB", "--precision", "bf16-mixed", "--solver", solver,
                                      "--time-limit", "30", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["throughput"]["gpus"] == 4  # 2 stages x tp 2
    from planner import io

    plan = io.load_plan(out)
    # tensor parallelism at nccl-tests' measured all-gather / reduce-scatter busbw on H100 (NVIDIA/nccl#1281), the
    # sends at NCCL's effective NVLink rate (18 x SM90_NVLINK_BW 20.6)
    assert plan.setup.comm.tp == 2 and plan.setup.comm.tp_gb_per_s == 354.9 and plan.setup.comm.pp_gb_per_s == 370.8


def test_a_fake_hf_profile_records_its_sequence_length_so_plans_report_tokens_per_second(tmp_path):
    pytest.importorskip("transformers")
    config = tmp_path / "tiny" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                                  "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
                                  "vocab_size": 256, "max_position_embeddings": 128}))
    out = tmp_path / "f.json"  # one decoder layer: the fake profile's time is its every recompute option's
    made = CliRunner().invoke(cli, ["profile", "--hf-config", str(config.parent), "--fake", "--seq-len", "32",
                                    "--micro-batch-size", "2", "--out", str(out)])
    assert made.exit_code == 0, made.output
    result = CliRunner().invoke(cli, ["evaluate", "--profile", str(out), "--layers-per-stage", "3",
                                      "--ckpt-per-stage", "0", "--microbatches", "3", "--mem", "80GB", "--json",
                                      "--time-limit", "10"])
    assert result.exit_code == 0, result.output
    hand = json.loads(result.stdout)["hand"]
    assert hand["throughput"]["tokens_per_s_per_gpu"] == pytest.approx(3 * 2 * 32 / (hand["iteration_ms"] / 1e3))
    assert hand["throughput"]["mfu_torchtitan"] is not None  # the config's dimensions were recorded


def test_a_measured_collective_figure_applies_inside_a_node_and_the_network_across(tmp_path):
    from planner import io
    from planner.commands.comm_setup import comm_fields
    from planner.commands.setup_options import DataParallelOptions

    profile = io.load_profile(_tp_profile(tmp_path, 2))
    inside = comm_fields(profile, DataParallelOptions(), runtime="torchtitan")
    across = comm_fields(profile, DataParallelOptions(gpus_per_node=1), runtime="torchtitan")
    assert (inside["tp_gb_per_s"], inside["tp_step_latency_ms"]) == (354.9, pytest.approx(3.4e-3))
    # a collective across nodes at NCCL's busbw over the 400 Gb/s NIC: 48 GB/s (nccl-tests#119), not the line's 50
    assert (across["tp_gb_per_s"], across["tp_step_latency_ms"]) == (48.0, pytest.approx(14.0e-3))
    assert "NVIDIA/nccl#1281" in inside["comm_notes"][0]


def test_gb200s_tensor_parallel_all_reduce_runs_at_its_measured_ring_busbw_by_hand():
    # T20's TP 4 all-reduce (no SP): 2 x 8192 tokens x 4096 x 2 B inside one GB200 host's 4 GPUs, NCCL's Ring
    # (the harness's NCCL_ALGO): the 679.6 GB/s nccl-tests measured there, not NVLink's datasheet 900
    gb200 = archs.gpu("gb200")
    link = comm.job_links(gb200, tp=4, cp=1, pp_stride=8, gpus_per_node=4, nics_per_gpu=1)["tp"]
    assert link.gb_per_s == 679.6 and "Azure/AI-benchmarking-guide" in link.where
    tensor = 2 * 8192 * 4096 * 2
    # NCCL's 8.4 µs a collective and 3.4 µs a ring step (2 x 3 steps), 2 x 3/4 of the tensor over the link
    assert comm.all_reduce_ms(tensor, 4, link) == pytest.approx((8.4 + 6 * 3.4) * 1e-3 + 1.5 * tensor / 679.6e9 * 1e3)


def _float8_block(collectives, *, converted: bool):
    from planner.schema import Float8Linears

    one = layer("block", "block", fwd_ms=1.0, act_mib=1, input_mib=1, param_count=10)
    record = Float8Linears(param_count=10, fwd_ms=1.0, bwd_ms=2.0) if converted else None
    one = one.model_copy(update={"collectives": collectives, "bwd_ms": 2.0, "float8": record})
    return costmodel.layer_costs(profile_of([one]))[0]


def test_under_float8_the_tensor_parallel_all_gathers_move_float8_and_the_reduce_scatters_bf16():
    gather = LayerCollective(kind="all-gather", tensor_bytes=5 * 10**8, fwd=1, bwd=1, recompute=1)
    scatter = LayerCollective(kind="reduce-scatter", tensor_bytes=5 * 10**8, fwd=1, bwd=1, recompute=1)
    block = _float8_block([gather, scatter], converted=True)

    def charged(runtime, **training):
        return comm.layer_comm_ms(block, 1, TrainSetup(
            stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**40], runtime=runtime,
            precision="bf16-mixed", comm={"tp": 2, "tp_gb_per_s": 50.0}, **training))

    # 1/2 x 0.5 GB / 50 GB/s = 5 ms each in bf16, three passes (forward, backward, the full recompute)
    assert charged("torchtitan") == pytest.approx(3 * (5.0 + 5.0))
    # torchao's Float8 TP plan casts before each all-gather (forward's input shard, backward's output
    # gradient shard): 1 B an element, 2.5 ms; the reduce-scatters move the bf16 matmul outputs
    assert charged("torchtitan", float8=True) == pytest.approx(3 * (2.5 + 5.0))
    # Transformer Engine's LayerNormLinear and row-parallel Linear quantize the shard before the all-gather too
    # (docs/framework-facts.md §301-§302): FP8 gathers under Megatron-LM
    assert runtimes.facts("megatron").tp_gathers_float8
    assert charged("megatron", float8=True) == pytest.approx(3 * (2.5 + 5.0))
    # a runtime whose TP linears quantize nothing before gathering (the record's tp_gathers_float8 is False)
    assert not runtimes.facts("deepspeed").tp_gathers_float8
    # a layer without a Float8 record (the LM head, an embedding) gathers bf16 under --float8 too
    plain = _float8_block([gather, scatter], converted=False)
    setup = TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**40], runtime="torchtitan",
                       precision="bf16-mixed", float8=True, comm={"tp": 2, "tp_gb_per_s": 50.0})
    assert comm.layer_comm_ms(plain, 1, setup) == pytest.approx(3 * (5.0 + 5.0))


def test_a_pipeline_send_crosses_nodes_where_its_two_ranks_lie_in_two():
    # the pipeline outermost: pipeline rank r holds ranks r·stride .. (r+1)·stride - 1 (Megatron-LM's tp-cp-ep-dp-pp)
    crosses = [comm.edge_crosses_nodes(r, to, stride=2, gpus_per_node=4) for r, to in [(0, 1), (1, 2), (2, 3), (3, 0)]]
    assert crosses == [False, True, False, True]  # tp 1 x dp 2 a stage, 2 nodes of 4: the Megatron GB200 test
    assert not any(comm.edge_crosses_nodes(r, r + 1, stride=2, gpus_per_node=8) for r in range(3))  # one node of 8
    assert all(comm.edge_crosses_nodes(r, r + 1, stride=8, gpus_per_node=8) for r in range(3))  # a stage a node
    assert comm.edge_crosses_nodes(0, 1, stride=3, gpus_per_node=4)  # ranks 2 → 5: one pair crosses


def _sends_setup(schedule: str, chunks: int, **comm_fields) -> TrainSetup:
    stages = 4 * chunks  # a stage's terms see the P·V stages (chunked.stages_view)
    return TrainSetup(stages=stages, chunks=chunks, schedule=schedule, microbatches=4, micro_batch_size=1,
                      mem_caps_bytes=[2**40] * stages,
                      comm={"pp_gb_per_s": 900.0, "pp_latency_ms": 0.0118, "gpus_per_node": 4, **comm_fields})


def test_each_send_is_timed_over_its_own_edges_link():
    network = {"pp_stride": 2, "pp_network_gb_per_s": 50.0, "pp_network_latency_ms": 0.0224}
    nvlink, ib = 0.0118 + GB / 900e9 * 1e3, 0.0224 + GB / 50e9 * 1e3  # 1 GB: one step of each link's latency
    setup = _sends_setup("1F1B", 1, **network)
    assert [comm.stage_send_ms(GB, setup, stage=s, to=s + 1) for s in range(3)] == \
        pytest.approx([nvlink, ib, nvlink])
    assert comm.stage_send_ms(GB, setup, stage=2, to=1) == pytest.approx(ib)  # the gradient back over the same edge
    # interleaved, 2 chunks: stages 0-7 on ranks 0,1,2,3,0,1,2,3; stage 3 → 4 is rank 3 → 0, over the network
    looped = _sends_setup("interleaved-1F1B", 2, **network)
    assert [comm.stage_crosses_nodes(s, s + 1, looped) for s in range(7)] == [False, True, False, True, False, True,
                                                                              False]
    # no stride (a plan made before), or no stage named: the one link for every send
    assert comm.stage_send_ms(GB, _sends_setup("1F1B", 1), stage=1, to=2) == pytest.approx(nvlink)
    assert comm.stage_send_ms(GB, setup) == pytest.approx(nvlink)


def test_evaluate_sends_the_stages_that_cross_nodes_over_the_network(tmp_path):
    from planner import io

    path = _tp_profile(tmp_path, 1, sp=False)
    args = ["evaluate", "--profile", str(path), "--layers-per-stage", "9,8,8,9", "--ckpt-per-stage", "0,0,0,0",
            "--microbatches", "4", "--mem", "80GB", "--dp", "2", "--zero", "1", "--precision", "bf16-mixed", "--json",
            "--time-limit", "10", "--gpus-per-node", "4"]
    said = CliRunner().invoke(cli, args)
    assert said.exit_code == 0, said.output
    assert "pipeline ranks 1→2, ranks placed tp, cp, dp, pp" in said.output
    profile = io.load_profile(path)
    names = [layer.name for layer in profile.layers]
    stages = [StagePlan(index=k, layers=names[a:b], recompute={}) for k, (a, b) in
              enumerate([(0, 9), (9, 17), (17, 25), (25, 34)])]
    links = {"pp_gb_per_s": 450.0, "pp_latency_ms": 0.0118, "gpus_per_node": 4}
    base = dict(stages=4, microbatches=4, micro_batch_size=1, mem_caps_bytes=[2**40] * 4)
    inside = costmodel.evaluate(stages, profile, TrainSetup(**base, comm=links))
    crossing = costmodel.evaluate(stages, profile, TrainSetup(**base, comm={
        **links, "pp_stride": 2, "pp_network_gb_per_s": 50.0, "pp_network_latency_ms": 0.0224}))
    # stage 1's output and stage 2's input gradient cross: each microbatch's 1024 x 4096 bf16 at 50 GB/s + NCCL's
    # network latency (8.4 + 14.0 µs) in place of NVLink's 450 GB/s (8.4 + 3.4 µs)
    one = 1024 * 4096 * 2
    extra = (0.0224 + one / 50e9 * 1e3) - (0.0118 + one / 450e9 * 1e3)
    moved = [c.comm_ms - i.comm_ms for c, i in zip(crossing.stages, inside.stages)]
    assert moved == pytest.approx([0.0, extra, extra, 0.0])
