"""Expert parallelism (--ep E): the routed experts' weights, gradients and optimizer state split
over E data-parallel ranks and ZeRO-sharded over the dp / E ranks of their expert-data-parallel
group, their gradient reduction in that group, the tokens' all-to-all on the critical path; and
the Megatron-LM and torchtitan exports that carry it. Every figure by hand."""

from __future__ import annotations

import re

import pytest
import torch

from planner.cost import costmodel, dataparallel
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef, TrainSetup

H100 = archs.GPUS["h100-sxm"]
REF = FileRef(file="arch:tiny-ep", sha256="0" * 64)
# a LLaMA-style model: layer 0 dense, layers 1-2 of 8 routed experts top 2 (width 32) and one
# shared expert (width 48)
TINY = archs.Arch(name="tiny-ep", hidden_size=64, intermediate_size=160, num_layers=3, num_heads=4, num_kv_heads=2,
                  vocab_size=256, tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
                  moe_intermediate_size=32, num_shared_experts=1, shared_intermediate_size=48, dense_layers=(0,))
SHAPE = Shape(seq_len=16, micro_batch_size=2)  # 32 tokens, bf16
EXPERTS = 8 * 3 * 64 * 32  # routed experts' parameters of one MoE block
A2A = 8 * (32 * 2 // 8) * 64 * 2  # 8 experts x 8 tokens each x hidden 64 x 2 bytes


def _profile():
    return analytic.analytic_profile(TINY, SHAPE, gpu=H100, model=REF)


def _setup(*, ep: int, dp: int = 8, zero: int = 1, **more) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=1, micro_batch_size=2, mem_caps_bytes=[2**40], precision="bf16-mixed",
                      dp=dp, zero=zero, ep=ep, shard_gb_per_s=100.0, replica_gb_per_s=100.0, **more)


def _moe_block():
    return next(layer for layer in costmodel.layer_costs(_profile()) if layer.kind == "moe_block")


def test_profile_records_each_moe_blocks_expert_parameters_and_dispatch_bytes():
    layers = {layer.name: layer for layer in _profile().layers}
    assert layers["layers.1"].expert_param_count == EXPERTS == analytic.expert_params(TINY, SHAPE)
    assert layers["layers.1"].a2a_bytes == A2A == 8_192
    # the router (h x E), the shared expert and attention are dense: not among the expert parameters
    assert layers["layers.1"].param_count - EXPERTS == (analytic.attention_params(TINY, SHAPE) + 64 * 8
                                                        + 3 * 64 * 48 + 2 * 64)
    assert (layers["layers.0"].expert_param_count, layers["layers.0"].a2a_bytes) == (0, 0)
    assert layers["tok_embeddings"].expert_param_count == 0
    # a capacity factor of 2 doubles each expert's tokens, so the dispatch
    doubled = analytic.analytic_profile(TINY, Shape(seq_len=16, micro_batch_size=2, capacity_factor=2.0), gpu=H100,
                                        model=REF)
    assert doubled.layers[2].a2a_bytes == 2 * A2A


@pytest.mark.parametrize("ep, expert_bytes_per_param", [
    (1, 2 + 2 + 12 / 8),  # no expert parallelism: every expert on every rank, ZeRO over all 8
    (2, 2 + 2 + 12 / 4),  # 1/2 of the experts a rank, their state over the 4 ranks holding the same ones
    (8, 2 + 2 + 12 / 1),  # one expert a rank, held by no other rank: nothing to shard
])
def test_static_bytes_of_a_moe_block_by_hand(ep, expert_bytes_per_param):
    """bf16-mixed Adam (2 + 2 + 12 bytes a parameter), ZeRO 1, dp 8: the dense parameters'
    optimizer state over 8 ranks, the rank's 1/E of the experts' over dp / E."""
    layer = _moe_block()
    dense = layer.param_count - EXPERTS
    want = dense * (2 + 2 + 12 / 8) + EXPERTS / ep * expert_bytes_per_param
    assert costmodel.static_bytes(layer, _setup(ep=ep)) == pytest.approx(want, rel=1e-12)
    # the stage adds them up with the dense layers' and the embedding's, dense everywhere
    profile = _profile()
    layers = costmodel.layer_costs(profile)
    stage = costmodel.stage_cost(layers, [0] * len(layers), stage=0, profile=profile, setup=_setup(ep=ep))
    dense_total = sum(item.param_count for item in layers) - 2 * EXPERTS
    assert stage.static_bytes == round(dense_total * (2 + 2 + 12 / 8) + 2 * EXPERTS / ep * expert_bytes_per_param)


def test_ep_1_leaves_every_term_as_it_was():
    layer, setup = _moe_block(), _setup(ep=1)
    assert costmodel.static_bytes(layer, setup) == layer.param_count * dataparallel.bytes_per_param(setup)
    assert costmodel.all_to_all_ms(layer, 0, setup) == 0.0
    assert dataparallel.expert_setup(setup) is setup


def test_all_to_all_ms_for_one_layer_by_hand():
    """ep 4 at 100 GB/s: each all-to-all sends 3/4 of the dispatched 8,192 bytes; two in forward,
    two in backward, two more where the layer's forward is recomputed."""
    profile, layer = _profile(), _moe_block()
    one = A2A * 3 / 4 / 100e9 * 1e3
    setup = _setup(ep=4, ep_gb_per_s=100.0)
    assert costmodel.all_to_all_ms(layer, 0, setup) == pytest.approx(4 * one)
    assert costmodel.all_to_all_ms(layer, 1, setup) == pytest.approx(6 * one)
    # a time term of the layer: what the solvers and evaluate() read, on top of its compute
    ctx, plain = costmodel.Context(profile, setup), costmodel.Context(profile, _setup(ep=1))
    for option in (0, 1):
        added = costmodel.layer_value("time", layer, option, ctx) - costmodel.layer_value("time", layer, option, plain)
        assert added == pytest.approx((4 + 2 * option) * one)
    dense = next(item for item in costmodel.layer_costs(profile) if item.kind == "decoder_block")
    assert costmodel.all_to_all_ms(dense, 0, setup) == 0.0


def test_expert_gradients_reduce_over_dp_over_ep_ranks():
    """ZeRO 0 on ckplan's runtime (reduced after the last backward, not overlapped): the dense
    gradients all-reduced over the 8 ranks, the rank's 1/2 of the experts' over the 4 holding them."""
    layer, setup = _moe_block(), _setup(ep=2, zero=0)
    dense = layer.param_count - EXPERTS
    ring = lambda num_bytes, n: 2 * (n - 1) / n * num_bytes / 100e9 * 1e3  # noqa: E731
    want = ring(dense * 2, 8) + ring(EXPERTS / 2 * 2, 4)
    assert dataparallel.exposed_comm_ms(layer.param_count, setup, expert_count=EXPERTS) == pytest.approx(want)
    # the device step: the layer's step time per parameter, for the parameters the rank holds
    step = dict(layer.step_ms)["adam"]
    held_step = step * (dense + EXPERTS / 2) / layer.param_count
    assert dataparallel.step_term_ms(layer.param_count, step, setup, expert_count=EXPERTS) == pytest.approx(
        held_step + want)


def test_zero_1_shards_expert_state_over_expert_data_parallel_ranks_under_hsdp():
    """Shard groups of 4 with ep 2: the dense state over 4 ranks, the experts' over 4 / 2."""
    layer = _moe_block()
    setup = _setup(ep=2, shard_group=4)
    dense = layer.param_count - EXPERTS
    want = dense * (2 + 2 + 12 / 4) + EXPERTS / 2 * (2 + 2 + 12 / 2)
    assert costmodel.static_bytes(layer, setup) == pytest.approx(want)


# ---------------------------------------------------------------- the command line


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    from fixtures.cli import run_ok

    where = tmp_path_factory.mktemp("mixtral")
    run_ok("profile", "--arch", "mixtral-8x7b", "--seq-len", "4096", "--micro-batch-size", "1", "--ep", "8", "--out",
           where / "p.json")
    return where


@pytest.mark.parametrize("args, message", [
    (["--dp", "8", "--ep", "3"], "--ep 3 does not divide --dp 8"),
    (["--dp", "16", "--ep", "16"], "--ep 16 does not divide the model's 8 routed experts"),
    (["--dp", "8", "--ep-bandwidth", "100"], "--ep-bandwidth is the experts' all-to-all bandwidth"),
    (["--dp", "8", "--ep", "8", "--zero", "1", "--shard-group", "4"], "--ep 8 does not divide --shard-group 4"),
])
def test_ep_refusals_are_one_sentence(mixtral, args, message):
    from fixtures.cli import run

    result = run("solve", "--profile", mixtral / "p.json", "--stages", "4", "--precision", "bf16-mixed", *args,
                 "--out", mixtral / "refused.yaml")
    assert result.exit_code != 0 and message in result.output and "Traceback" not in result.output


def test_ep_on_a_profile_without_experts_is_refused(tmp_path):
    from fixtures.cli import run, run_ok

    run_ok("profile", "--arch", "llama3-8b", "--seq-len", "1024", "--out", tmp_path / "p.json")
    result = run("solve", "--profile", tmp_path / "p.json", "--stages", "2", "--dp", "2", "--ep", "2",
                 "--out", tmp_path / "plan.yaml")
    assert result.exit_code != 0 and "this profile has none" in result.output and "Traceback" not in result.output


def _megatron_flags(text: str) -> dict[str, str | None]:
    return {flag: value for flag, value in re.findall(r"^\s+(--[\w-]+)(?: (.+))?$", text, flags=re.M)}


def test_profile_solve_ep_8_export_megatron_writes_the_expert_flags(mixtral):
    """The issue's done-when: profile --arch mixtral-8x7b, solve --ep 8 --dp 8, export --to megatron."""
    from fixtures.cli import run_ok

    from planner import io

    run_ok("solve", "--profile", mixtral / "p.json", "--stages", "4", "--dp", "8", "--ep", "8", "--zero", "1",
           "--precision", "bf16-mixed", "--runtime", "megatron", "--out", mixtral / "plan.yaml")
    plan = io.load_plan(mixtral / "plan.yaml")
    assert plan.setup.data_parallel.ep == 8 and plan.setup.data_parallel.ep_gb_per_s == 370.8  # NCCL's NVLink rate, in a node
    run_ok("export", mixtral / "plan.yaml", "--to", "megatron", "--out", mixtral / "plan.sh")
    flags = _megatron_flags((mixtral / "plan.sh").read_text())
    assert flags["--num-experts"] == "8" and flags["--moe-router-topk"] == "2"
    assert flags["--expert-model-parallel-size"] == "8" and flags["--moe-ffn-hidden-size"] == "14336"
    assert "--moe-grouped-gemm" in flags and flags["--moe-token-dispatcher-type"] == "alltoall"
    # --moe-grouped-gemm on TE's layers allocates TE's grouped-GEMM workspaces: the plan, scored without, is
    # re-scored with them and the export says so; a plan scored with them (--te-grouped-gemm) is exported as it is
    grouped = "Rounded: --moe-grouped-gemm runs Transformer Engine's grouped GEMM over the experts"
    assert grouped in (mixtral / "plan.sh").read_text()
    run_ok("solve", "--profile", mixtral / "p.json", "--stages", "4", "--dp", "8", "--ep", "8", "--zero", "1",
           "--precision", "bf16-mixed", "--runtime", "megatron", "--te-grouped-gemm", "--out", mixtral / "gg.yaml")
    run_ok("export", mixtral / "gg.yaml", "--to", "megatron", "--out", mixtral / "gg.sh")
    assert grouped not in (mixtral / "gg.sh").read_text() and "--moe-grouped-gemm" in _megatron_flags(
        (mixtral / "gg.sh").read_text())
    assert "--moe-layer-freq" not in flags and "--multi-latent-attention" not in flags  # every layer MoE, GQA
    # ep 8 keeps one expert a rank: each MoE block's static bytes far below ep 1's
    profile = io.load_profile(mixtral / "p.json")
    layer = next(item for item in costmodel.layer_costs(profile) if item.kind == "moe_block")
    assert costmodel.static_bytes(layer, plan.setup) < costmodel.static_bytes(
        layer, plan.setup.model_copy(update={"ep": 1})) / 2


def test_megatron_core_takes_the_exported_moe_and_mla_config(tmp_path):
    """DeepSeek-V3's flags (dense-first layers, a shared expert, latent attention) as megatron-core
    0.16's MLATransformerConfig takes them; its expert parameters match the profile's. On H200s
    (141 GB): every stage fits without recompute, so the solve is one search (6.6 CPU-s here);
    on H100s it searched the replayed reserve's caps over 13 solves (25.6 CPU-s, most of the
    test's), for recompute flags this config never reads (docs/testing.md, session 66)."""
    pytest.importorskip("megatron.core")
    from fixtures.cli import run_ok
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    run_ok("profile", "--arch", "deepseek-v3", "--gpu", "h200", "--seq-len", "4096", "--micro-batch-size", "1",
           "--ep", "64", "--out", tmp_path / "p.json")
    run_ok("solve", "--profile", tmp_path / "p.json", "--stages", "16", "--dp", "128", "--ep", "64", "--zero", "1",
           "--precision", "bf16-mixed", "--runtime", "megatron", "--microbatches", "32", "--out",
           tmp_path / "plan.yaml")
    run_ok("export", tmp_path / "plan.yaml", "--to", "megatron", "--out", tmp_path / "plan.sh")
    flags = _megatron_flags((tmp_path / "plan.sh").read_text())
    layer_freq = eval(flags["--moe-layer-freq"].strip('"'))  # Megatron-LM evaluates the list expression too
    assert layer_freq == [0] * 3 + [1] * 58
    config = MLATransformerConfig(
        num_layers=int(flags["--num-layers"]), hidden_size=int(flags["--hidden-size"]),
        ffn_hidden_size=int(flags["--ffn-hidden-size"]), num_attention_heads=int(flags["--num-attention-heads"]),
        gated_linear_unit=True, add_bias_linear=False, normalization=flags["--normalization"],
        num_moe_experts=int(flags["--num-experts"]), moe_router_topk=int(flags["--moe-router-topk"]),
        moe_ffn_hidden_size=int(flags["--moe-ffn-hidden-size"]), moe_grouped_gemm="--moe-grouped-gemm" in flags,
        moe_shared_expert_intermediate_size=int(flags["--moe-shared-expert-intermediate-size"]),
        moe_layer_freq=layer_freq, moe_token_dispatcher_type=flags["--moe-token-dispatcher-type"],
        expert_model_parallel_size=int(flags["--expert-model-parallel-size"]),
        pipeline_model_parallel_size=int(flags["--pipeline-model-parallel-size"]), pipeline_dtype=torch.bfloat16,
        q_lora_rank=int(flags["--q-lora-rank"]), kv_lora_rank=int(flags["--kv-lora-rank"]),
        qk_head_dim=int(flags["--qk-head-dim"]), qk_pos_emb_head_dim=int(flags["--qk-pos-emb-head-dim"]),
        v_head_dim=int(flags["--v-head-dim"]),
    )
    assert config.expert_model_parallel_size == 64 and config.num_moe_experts == 256
    # megatron-core's grouped experts: fc1 (gate and up) h x 2f and fc2 f x h per expert
    experts = config.num_moe_experts * (config.hidden_size * 2 * config.moe_ffn_hidden_size
                                        + config.moe_ffn_hidden_size * config.hidden_size)
    from planner import io

    moe = next(layer for layer in io.load_profile(tmp_path / "p.json").layers if layer.kind == "moe_block")
    assert moe.expert_param_count == experts


def test_torchtitan_export_sets_expert_parallel_degree(tmp_path):
    """torchtitan 0.3.0's DeepSeek-V3 config with the plan's split and EP: its ParallelismConfig
    takes expert_parallel_degree; ZeRO 0 (no FSDP ranks for EP to borrow) is refused."""
    from fixtures.cli import run, run_ok

    run_ok("profile", "--arch", "qwen3-30b-a3b", "--seq-len", "4096", "--micro-batch-size", "1", "--ep", "8", "--out",
           tmp_path / "p.json")
    solve = ["solve", "--profile", tmp_path / "p.json", "--stages", "2", "--dp", "8", "--ep", "8",
             "--precision", "bf16-mixed", "--runtime", "torchtitan"]
    run_ok(*solve, "--zero", "1", "--out", tmp_path / "plan.yaml")
    run_ok("export", tmp_path / "plan.yaml", "--to", "torchtitan", "--out", tmp_path / "ckplan_titan_ep.py")
    text = (tmp_path / "ckplan_titan_ep.py").read_text()
    assert "config.parallelism.expert_parallel_degree = 8" in text
    assert "torchtitan.models.qwen3.config_registry import qwen3_30b_a3b" in text
    compile(text, "ckplan_titan_ep.py", "exec")
    run_ok(*solve, "--out", tmp_path / "plain.yaml")
    refused = run("export", tmp_path / "plain.yaml", "--to", "torchtitan", "--out", tmp_path / "x.py")
    assert refused.exit_code != 0 and "must divide its FSDP shard degree" in refused.output
    pytest.importorskip("torchtitan")
    from torchtitan.config import ParallelismConfig

    degree = int(re.search(r"expert_parallel_degree = (\d+)", text).group(1))
    assert ParallelismConfig(expert_parallel_degree=degree, data_parallel_shard_degree=8).expert_parallel_degree == 8


def test_torchtitan_export_of_deepseek_v2_lite_refines_torchtitans_16b_config(tmp_path):
    """torchtitan's deepseek_v3 "16B" flavor has DeepSeek-V2-Lite's dimensions (deepseek_v3/__init__.py
    _16b at b5bcd76c and in the 0.3.0 release: 27 layers, 1 dense, 64 experts top 6, kv_lora_rank 512), and
    deepseek_v3_16b is its config function: the export names it rather than asking for --torchtitan-base."""
    from fixtures.cli import run_ok

    run_ok("profile", "--arch", "deepseek-v2-lite", "--seq-len", "1024", "--micro-batch-size", "1", "--ep", "8",
           "--out", tmp_path / "p.json")
    run_ok("solve", "--profile", tmp_path / "p.json", "--stages", "1", "--dp", "8", "--ep", "8", "--zero", "3",
           "--microbatches", "2", "--precision", "bf16-mixed", "--runtime", "torchtitan", "--out", tmp_path / "plan.yaml")
    run_ok("export", tmp_path / "plan.yaml", "--to", "torchtitan", "--out", tmp_path / "titan.py")
    text = (tmp_path / "titan.py").read_text()
    assert "from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_16b as base_config" in text
    assert "this ckplan plan is for 27 decoder layers" in text
    assert "config.parallelism.expert_parallel_degree = 8" in text
    compile(text, "titan.py", "exec")


def test_ep_on_a_fake_profile_without_experts_says_what_it_lacks():
    """A --fake profile records the experts that follow routing.py's contract (tests/test_fake_moe.py); one
    without any (a dense model, other experts, or made before) is refused naming those causes, not as if
    only a dense model could lack them."""
    from pathlib import Path

    from planner import io
    from planner.commands.expert_options import check_ep
    from planner.errors import UserError

    measured = io.load_profile(Path(__file__).parent / "fixtures" / "chunked-milp-profile.json")
    assert not any(layer.expert_param_count for layer in measured.layers)
    with pytest.raises(UserError, match="a dense model, or a profile made before experts were recorded"):
        check_ep(measured, ep=2, dp=2, shard_group=None, ep_bandwidth=None)
    fake = measured.model_copy(update={"source": "fake"})
    with pytest.raises(UserError, match="this --fake profile records none: a dense model, experts outside "
                                        "planner/runtime/routing.py's contract .* or a profile made before"):
        check_ep(fake, ep=2, dp=2, shard_group=None, ep_bandwidth=None)
