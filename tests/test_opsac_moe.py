"""torchtitan's op-level SAC on mixture-of-experts and latent-attention blocks (planner/profiler/opsac.py,
docs/framework-facts.md §74): which mm outputs the per-block counter saves, by hand on tiny blocks."""
from __future__ import annotations

import pytest

from planner.models import archs
from planner.profiler import analytic, analytic_time
from planner.profiler.analytic import Shape
from planner.profiler.membound import membound_ms
from planner.profiler.opsac import block_mms, offers_op_sac, op_sac_kept_bytes, rerun_kernels
from planner.profiler.roofline import kernel_ms
from planner.schema import FileRef

H100 = archs.gpu("h100")
REF = FileRef(file="arch:test", sha256="0" * 64)
SHAPE = Shape(seq_len=32, micro_batch_size=2)  # 64 tokens, bf16
T, D = 64, 2
COMMON = dict(hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4, vocab_size=128,
              tie_word_embeddings=False, max_position_embeddings=32)
# a 2-expert block, top 1, one shared expert of width 48; layer 0 dense
MOE = archs.Arch(name="tiny-moe2", num_kv_heads=2, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32,
                 num_shared_experts=1, shared_intermediate_size=48, dense_layers=(0,), **COMMON)
QWEN3ISH = archs.Arch(name="tiny-moe2-noshared", num_kv_heads=2, num_experts=2, num_experts_per_tok=1,
                      moe_intermediate_size=32, **COMMON)
# latent attention: 4 heads, q/k 16 nope + 8 rope, v 16, K/V latent 16, q latent 24 (DeepSeek-V3's shape) or none
MLA = archs.Arch(name="tiny-mla", num_kv_heads=4, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
                 qk_nope_head_dim=16, v_head_dim=16, **COMMON)
MLA_NO_Q = archs.Arch(name="tiny-mla-noq", num_kv_heads=4, kv_lora_rank=16, qk_rope_head_dim=8,
                      qk_nope_head_dim=16, v_head_dim=16, num_experts=2, num_experts_per_tok=1,
                      moe_intermediate_size=32, num_shared_experts=1, shared_intermediate_size=48, **COMMON)
BOUNDARY = T * 64 * D
ATTN = T * 64 * D + 4 * 4 * T  # the attention's output (4 heads x 16) and its fp32 logsumexp per head
TOPK = (4 + 8) * T * 1  # the router's top-1: fp32 value and int64 index per token


def _option(arch, index):
    layer = analytic.analytic_profile(arch, SHAPE, gpu=H100, model=REF).layers[1 + index]
    return layer, next(o for o in layer.recompute_options if o.name == "op-sac")


def test_a_moe_block_keeps_q_v_the_shared_experts_gate_and_output_and_the_top_k():
    """wq 1 saved, wk 2, wv 3 saved, wo 4; the router's gate forced to recompute and uncounted; the
    experts' grouped mms neither saved nor counted; shared w1 5 saved, w3 6, w2 7 saved."""
    assert [name for name, _, _ in block_mms(MOE, SHAPE, moe=True)] == ["wq", "wk", "wv", "wo", "w1", "w3", "w2"]
    expected = BOUNDARY + T * 64 * D + T * 32 * D + ATTN + T * 48 * D + T * 64 * D + TOPK
    assert op_sac_kept_bytes(MOE, SHAPE, BOUNDARY, moe=True) == expected
    layer, option = _option(MOE, 1)
    assert layer.kind == "moe_block" and option.kept_bytes == expected
    assert option.recompute_peak_bytes == layer.act_bytes - expected


def test_a_moe_block_without_shared_experts_keeps_only_q_and_v_of_its_mms():
    expected = BOUNDARY + T * 64 * D + T * 32 * D + ATTN + TOPK
    assert op_sac_kept_bytes(QWEN3ISH, SHAPE, BOUNDARY, moe=True) == expected
    assert _option(QWEN3ISH, 1)[1].kept_bytes == expected


def test_a_moe_block_reruns_wk_wo_the_shared_w3_the_router_and_every_expert_mm():
    kernels = sorted(k.flops for k in rerun_kernels(MOE, SHAPE, moe=True))
    tokens_per_expert = 64 * 1 // 2  # top 1 of 2 experts, perfect balance
    by_hand = [2 * T * 64 * 32, 2 * T * 64 * 64, 2 * T * 64 * 48,  # wk, wo, shared w3
               2 * T * 64 * 2,  # the router's gate: 64 -> 2 experts
               *[2 * tokens_per_expert * 64 * 32] * 6]  # w1, w3, w2 of each of the two experts
    assert kernels == sorted(by_hand)
    forward, _, _ = analytic_time.block_work(MOE, SHAPE, moe=True)
    moved = sum(membound_ms(num, H100, "eager", name) for name, num in forward.classed)
    assert _option(MOE, 1)[1].recompute_ms == pytest.approx(sum(kernel_ms(k, H100) for k in
                                                                 rerun_kernels(MOE, SHAPE, moe=True)) + moved)


def test_a_latent_attention_block_with_a_q_latent_keeps_wq_a_wkv_a_wo_and_w3():
    """wq_a 1 saved (24 wide), wq_b 2, wkv_a 3 saved (16 latent + 8 rope), wkv_b 4, wo 5 saved (64),
    w1 6, w3 7 saved (160), w2 8."""
    assert [name for name, _, _ in block_mms(MLA, SHAPE, moe=False)] == [
        "wq_a", "wq_b", "wkv_a", "wkv_b", "wo", "w1", "w3", "w2"]
    expected = BOUNDARY + T * (24 + 24 + 64 + 160) * D + ATTN
    assert op_sac_kept_bytes(MLA, SHAPE, BOUNDARY) == expected
    layer, option = _option(MLA, 1)
    assert option.kept_bytes == expected and option.recompute_peak_bytes == layer.act_bytes - expected
    assert sorted(k.flops for k in rerun_kernels(MLA, SHAPE, moe=False)) == sorted(
        [2 * T * 24 * 4 * 24, 2 * T * 16 * 4 * 32, 2 * T * 64 * 160, 2 * T * 160 * 64])  # wq_b, wkv_b, w1, w2


def test_a_latent_attention_moe_block_without_a_q_latent_keeps_wq_wkv_b_and_the_shared_w1_w2():
    """DeepSeek-V2-Lite's shape (torchtitan's deepseek_v3 16B): wq 1 saved (4 heads x 24), wkv_a 2,
    wkv_b 3 saved (4 heads x (16 nope + 16 v)), wo 4, shared w1 5 saved (48), w3 6, w2 7 saved (64)."""
    expected = BOUNDARY + T * (96 + 128 + 48 + 64) * D + ATTN + TOPK
    assert op_sac_kept_bytes(MLA_NO_Q, SHAPE, BOUNDARY, moe=True) == expected
    assert _option(MLA_NO_Q, 1)[1].kept_bytes == expected


def test_op_sac_is_offered_on_moe_and_latent_blocks_not_on_gpt_or_eager_ones():
    assert offers_op_sac(MOE, SHAPE, moe=True) and offers_op_sac(MLA, SHAPE, moe=False)
    assert not offers_op_sac(MOE, Shape(seq_len=32, micro_batch_size=2, attention="eager"), moe=True)
    assert not offers_op_sac(archs.arch("gpt3-175b"), SHAPE, moe=False)


def test_under_expert_parallelism_op_sac_keeps_or_reruns_the_dispatch_and_combine_by_their_op():
    """torchtitan saves _c10d_functional.all_to_all_single's outputs (planner/cost/opsacep.py): the
    exchanges of a compiled model, or of a version before spmd_types became the default, are kept
    (2 x a2a_bytes, 64 tokens x top-1 x 64 hidden x 2 B each); b5bcd76c's eager spmd_types exchange is
    no save op, so it is rerun: two more all-to-alls in the backward, as under full recompute. Nothing
    without ep, for another option or for a dense block."""
    from planner.cost.layers import layer_costs
    from planner.cost.opsacep import op_sac_ep_kept_bytes, op_sac_reruns_exchanges
    from planner.cost.rules import all_to_all_ms
    from planner.schema import TrainSetup

    costs = layer_costs(analytic.analytic_profile(MOE, SHAPE, gpu=H100, model=REF))
    moe, dense = costs[2], costs[1]
    op = next(i for i, o in enumerate(moe.options) if o.name == "op-sac")
    base = dict(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**50], precision="bf16-mixed",
                runtime="torchtitan", dp=2)
    link = dict(ep=2, ep_gb_per_s=450.0)
    eager, ep1 = TrainSetup(**base, **link), TrainSetup(**base, compile=True)
    compiled, older = TrainSetup(**base, **link, compile=True), TrainSetup(**base, **link, runtime_version="9dec370")
    assert moe.a2a_bytes == 64 * 1 * 64 * 2
    assert op_sac_ep_kept_bytes(moe, op, compiled) == op_sac_ep_kept_bytes(moe, op, older) == 2 * 64 * 64 * 2
    assert not op_sac_reruns_exchanges(moe, op, compiled) and not op_sac_reruns_exchanges(moe, op, older)
    assert op_sac_ep_kept_bytes(moe, op, eager) == 0 and op_sac_reruns_exchanges(moe, op, eager)
    assert all_to_all_ms(moe, op, compiled) > 0  # 4: the forward's two and their gradients'
    assert all_to_all_ms(moe, op, eager) == pytest.approx(all_to_all_ms(moe, 1, eager))  # 6, as full
    assert all_to_all_ms(moe, op, eager) == pytest.approx(1.5 * all_to_all_ms(moe, op, compiled))
    assert op_sac_ep_kept_bytes(moe, op, ep1) == 0 and all_to_all_ms(moe, op, ep1) == 0
    assert op_sac_ep_kept_bytes(moe, 0, compiled) == op_sac_ep_kept_bytes(moe, 1, compiled) == 0
    dense_op = next(i for i, o in enumerate(dense.options) if o.name == "op-sac")
    assert op_sac_ep_kept_bytes(dense, dense_op, compiled) == 0 and not op_sac_reruns_exchanges(dense, dense_op, eager)
