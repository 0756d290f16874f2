"""The analytic profile's Mixtral mixture, Qwen2's bias gradients and OPT's / StarCoder2's attention groups
against the fake profile's count of transformers' own code on tiny blocks (analytic_moe.py, analytic_time.py,
analytic_split.py; docs/framework-facts.md §82)."""

import pytest
import torch
from test_analytic_split import SEQ, _config, _first_block

from planner.models import hfmodels
from planner.models.archconfig import from_hf_config
from planner.profiler import analytic_moe, analytic_split, analytic_time
from planner.profiler.fake import counting
from planner.profiler.fake_split import split_work, torch_param_groups
from planner.profiler.formulas import Shape
from planner.runtime.recompute import layer_runner

MIXTRAL = ("mixtral-8x7b", ("num_local_experts=4", "num_experts_per_tok=2"))
QWEN3_MOE = ("qwen3-30b-a3b", ("num_experts=4", "num_experts_per_tok=2", "moe_intermediate_size=32"))
SHAPE = Shape(seq_len=SEQ, micro_batch_size=1)


def _split(config: dict, option: str):
    block, x = _first_block(config)
    x = x.requires_grad_(True)
    grad = torch.zeros_like(block(x))
    return split_work(layer_runner(block, option), block, x, grad, counting)


def test_mixture_bytes_by_hand():
    """Mixtral's (fp32 weights, renormalized): T = 16 tokens, k = 2 (S = 32 copies), E = 4, h = 64, f = 128: the router's forward 2,304 B (6·64 +
    8·64 + 4·64 + 12·32 + 4·32 + 4·16 + 8·32 + 8·32 + 4·16), the experts' 98,480 (20 S h + 10 S f + 12 T h
    + 132 S + 12 E: the inverse permutation's empty_like writes nothing, fake.NO_TRAFFIC); backward 247,936 (the experts' 12 T h + 60 S h + 26 S f + 52 S, the router's 76 S + 16 T +
    30 T E) and the inputs' add 6 T h."""
    fwd, bwd = analytic_moe.mixture_bytes(16, 64, 128, 4, 2)
    assert fwd == {"elementwise": 2304, "activation": 20 * 32 * 64 + 10 * 32 * 128 + 12 * 16 * 64 + 132 * 32 + 12 * 4}
    assert fwd["activation"] == 98480
    assert bwd == {"activation": 247936, "elementwise": 6 * 16 * 64}
    assert 12 * 16 * 64 + 60 * 32 * 64 + 26 * 32 * 128 + 52 * 32 + 76 * 32 + 16 * 16 + 30 * 16 * 4 == 247936


@pytest.mark.parametrize("case", [MIXTRAL, QWEN3_MOE], ids=["mixtral", "qwen3_moe"])
def test_a_moe_blocks_work_is_the_fake_count_of_transformers_code(case):
    """A tiny Mixtral block (4 experts, top-2): forward and backward FLOPs, the kernels (gate_up fused:
    one GEMM per expert of 2f, then down) and the mixture's bytes (`activation`: the experts' module and
    the router's backward) are the fake profile's count of transformers 5.24's code, to the byte; the
    split's W to the byte, and I's mixture bytes. Qwen3-MoE (bf16 weights, renormalized: norm_topk_prob) alike."""
    config = _config(*case)
    arch = from_hf_config(config, where=case[0], name=case[0])
    assert analytic_moe.counts_mixture(arch)
    fwd, _, _ = analytic_time.block_work(arch, SHAPE, moe=True)
    block, x = _first_block(config)
    with counting() as done:
        block(x.requires_grad_(True))
        fake_fwd = done()
    assert fwd.flops == fake_fwd.flops and dict(fwd.kernels) == dict(fake_fwd.kernels)
    assert dict(fwd.classed)["activation"] == dict(fake_fwd.classed)["activation"]
    none_input, none_weight, _ = _split(config, "none")
    weight = analytic_time.block_weight_grad_work(arch, SHAPE, moe=True)
    _, bwd, _ = analytic_time.block_work(arch, SHAPE, moe=True)
    assert (weight.flops, weight.bytes) == (none_weight.flops, none_weight.bytes)
    assert dict(bwd.classed)["activation"] == dict(none_input.classed)["activation"]  # W has none


@pytest.mark.parametrize("case", [MIXTRAL, QWEN3_MOE], ids=["mixtral", "qwen3_moe"])
def test_torchs_rerun_of_a_mixture_stops_after_the_weighting(case):
    """Full: the rerun in I is the forward but the mixture's reorder, sum and cast (early_stop_bytes: 35,072 B
    here) and the residual add; mlp: the mixture but its tail, once in I and in W once per group (router,
    gate_up_proj, down_proj). Qwen3-MoE's bf16 rows: 4 S h + 8 S + 2 S h + 2 T h."""
    config = _config(*case)
    arch = from_hf_config(config, where=case[0], name=case[0])
    none_input, none_weight, _ = _split(config, "none")
    full_input, _, _ = _split(config, "full")
    _, _, rerun = analytic_time.block_work(arch, SHAPE, moe=True)
    rerun_fake = full_input - none_input
    assert analytic_moe.early_stop_bytes(arch, SHAPE) == {
        "mixtral-8x7b": 8 * 32 * 64 + 8 * 32 + 4 * 32 * 64 + 10 * 16 * 64,
        "qwen3-30b-a3b": 4 * 32 * 64 + 8 * 32 + 2 * 32 * 64 + 2 * 16 * 64}[case[0]]
    assert (rerun.flops, dict(rerun.classed)["activation"]) == (rerun_fake.flops, dict(rerun_fake.classed)["activation"])
    if case is QWEN3_MOE:  # the runtime's `mlp` takes Qwen3MoeDecoderLayer for an MLP ("moe" in its class name)
        return
    mlp_input, mlp_weight, _ = _split(config, "mlp")
    in_input, in_weight = mlp_input - none_input, mlp_weight - none_weight
    mixture = analytic_time.rerun_work(arch, SHAPE, "mlp", moe=True)
    tail = analytic_moe.early_stop_bytes(arch, SHAPE)
    assert (in_input.flops, in_input.bytes) == (mixture.flops, mixture.bytes - tail)
    groups = analytic_split.region_groups(arch, "mlp", moe=True)
    assert groups == 3 and (in_weight.flops, in_weight.bytes) == (3 * in_input.flops, 3 * in_input.bytes)


def test_qwen2_bias_gradients_are_ws():
    """Qwen2's q, k and v biases (64 + 2·32 wide): their gradients' sums over 16 tokens (2 B an element read)
    and writes (2 B) are W's, to the byte of the fake's count."""
    config = _config("qwen2-1.5b")
    arch = from_hf_config(config, where="qwen2", name="qwen2")
    assert analytic_time.linear_bias_grad_bytes(arch, SHAPE) == (2 * 16 + 2) * 128
    _, none_weight, _ = _split(config, "none")
    weight = analytic_time.block_weight_grad_work(arch, SHAPE)
    assert (weight.flops, weight.bytes) == (none_weight.flops, none_weight.bytes)


def test_starcoder2_attention_has_four_groups_as_torch_makes_them():
    """StarCoder2 (transformers' Starcoder2Attention: q_proj, k_proj, v_proj, o_proj, each with its bias):
    4 attention groups, 8 in the block, as torch's stage_backward_input groups them; GPT-2's fused c_attn 2."""
    config = hfmodels.with_settings(
        {"model_type": "starcoder2", "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64,
         "use_bias": True, "norm_epsilon": 1e-5, "hidden_act": "gelu_pytorch_tanh"}, ())
    block, x = _first_block(config)
    arch = from_hf_config(config, where="starcoder2", name="starcoder2")
    counted = analytic_split.block_param_groups(arch, moe=False)
    assert counted == {"attention": 4, "mlp": 2, "norms": 2}
    assert len(torch_param_groups(block, x)) == sum(counted.values()) == 8
    gpt2 = from_hf_config(_config("gpt2-medium", ("n_embd=64", "n_inner=256", "n_head=4")), where="g", name="g")
    assert analytic_split.attention_groups(gpt2) == 2
