"""The TE block's eager rest keeps its op classes on the MoE, latent-attention and selective-rerun paths
(planner/profiler/te_fused.py moe_classes / fused_classes, te_rerun.py): every eager byte the fused kernels leave
is in a class, each class the eager pass's less the bytes of the ops the fused kernels replace, counted by hand."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from planner.models import archs
from planner.profiler import analytic_time, te_fused, te_moe, te_moe_eager, te_rerun
from planner.profiler.analytic import Shape

H100 = archs.gpu("h100")
# h 64, 4 heads of 16, 2 K/V heads; 8 experts of width 32, top 2, no shared expert
MOE = archs.Arch(name="tiny-moe-cls", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4, num_kv_heads=2,
                 vocab_size=128, tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
# h 64, 4 heads; q latent 24, kv latent 16, nope 8, rope 4, v 8; 8 experts of 32, top 2, one shared expert of 48
MLA = archs.Arch(name="tiny-mla-cls", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4, num_kv_heads=4,
                 vocab_size=128, tie_word_embeddings=False, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8,
                 qk_rope_head_dim=4, v_head_dim=8, head_dim=12, num_experts=8, num_experts_per_tok=2,
                 moe_intermediate_size=32, num_shared_experts=1, shared_intermediate_size=48)
SHAPE = Shape(seq_len=32, micro_batch_size=2)  # T 64 tokens, S 128 routed copies
OSS = dataclasses.replace(MOE, name="tiny-oss-cls", swiglu_limit=7.0, expert_bias=True, rope_scaling=("yarn", 32.0))
QK = dataclasses.replace(MOE, name="tiny-qk-cls", qk_norm=True)


def _classes(done) -> Counter:
    return Counter(dict(done.classed))


def test_a_moe_blocks_eager_rest_by_hand():
    # T 64, h 64: left in the forward the two residual adds (6 B an element, elementwise) and rotary's cos/sin
    # table (8 B a token and head dim 16, attention); everything else (the two RMSNorms, rotary on Q and K, the
    # router, dispatch, experts' SwiGLU and combine) is what TE's and Megatron's fused kernels replace
    T, h = 64, 64
    fwd, bwd, rerun = te_fused.moe_passes(MOE, SHAPE, analytic_time.block_work(MOE, SHAPE, moe=True))
    assert _classes(fwd) == Counter(elementwise=2 * 6 * T * h, attention=8 * T * 16)
    assert fwd.unclassed_bytes == 0
    # the rerun: torch's checkpoint reruns the whole forward (the experts' down projections are not the last kernel
    # a single stop can skip: analytic_time._recompute), so the same eager rest
    assert _classes(rerun) == _classes(fwd)
    # backward: the residual gradients' sums (in the norms' backward, class norm), Q/K/V's input gradients summed
    # (2 adds), the table, the weight gradients' accumulation (3 x 2 B a held parameter, bf16 gradients)
    params = 64 * (64 + 2 * 32) + 64 * 64 + 64 * 8 + 8 * 3 * 64 * 32 + 2 * 64  # qkv, o, router, experts, norms
    assert _classes(bwd) == Counter(norm=2 * 6 * T * h, elementwise=2 * 6 * T * h + 3 * 2 * params, attention=8 * T * 16)
    assert bwd.unclassed_bytes == 0


@pytest.mark.parametrize("arch", [MOE, MLA, QK, OSS], ids=lambda arch: arch.name)
def test_every_moe_byte_the_fused_kernels_leave_keeps_a_class(arch):
    passes = analytic_time.block_work(arch, SHAPE, moe=True)
    replaced = te_fused.moe_classes(arch, SHAPE)
    for eager, done, gone in zip(passes, te_fused.moe_passes(arch, SHAPE, passes), (replaced[0], replaced[1], replaced[0])):
        assert done.unclassed_bytes == 0
        # the split by class agrees with the record's cut and fused bytes: the eager bytes left are the eager
        # pass's less the replaced ops' (no byte made or lost by the split)
        assert done.bytes - done.fused_bytes == eager.bytes - sum(gone.values())
        # each class is the eager pass's less what the fused kernels replace (a negative: more kept than cut)
        left = _classes(eager)
        left.subtract(gone)
        assert _classes(done) == +left


def test_gpt_osss_kept_clamp_and_bias_and_yarn_rotary_by_class():
    # S 128 copies, f 32, h 64, Q + K widths 64 + 32 over T 64: Megatron's eager clamp 16 / 30 B an element of S·f
    # (activation), its weighted fc2 bias 12 / 16 B of S·h (elementwise), and its unfused YaRN rotary 24 / 28 B
    # of Q and K where the eager count has 20 / 32 (attention): each kept as an eager op of its class
    S, f, h, rotated = 128, 32, 64, 64 * 96
    plain, oss = te_fused.moe_classes(MOE, SHAPE), te_fused.moe_classes(OSS, SHAPE)
    routed_gap = [te_moe.eager_routed_classes(OSS, SHAPE)[i] for i in (0, 1)]
    for i, (clamp, bias, yarn, eager_rope) in enumerate(((16, 12, 24, 20), (30, 16, 28, 32))):
        assert oss[i]["activation"] == routed_gap[i]["activation"] - clamp * S * f
        expert_bias = te_moe_eager.eager_expert_bias_bytes(OSS, SHAPE)[i]
        assert oss[i]["elementwise"] == routed_gap[i]["elementwise"] + expert_bias - bias * S * h
        assert oss[i]["attention"] == (eager_rope - yarn) * rotated
        assert plain[i]["attention"] == eager_rope * rotated


def test_a_latent_attention_blocks_classes_replaced_by_hand():
    # dense MLA block, T 64: the latent norms (24 + 16 wide) at 36 / 96 B an element (norm), rotary on Q's 4 heads x
    # 4 and the shared 4 at 20 / 32 B (attention), with transformers' copies (hf_mla's classes), plus the block's
    # two RMSNorms and SwiGLU as a dense block's
    dense = dataclasses.replace(MLA, num_experts=0, name="tiny-mla-dense-cls")
    T, h, f = 64, 64, 160
    fwd, bwd = te_fused.fused_classes(dense, SHAPE)
    latents, rotated = T * (24 + 16), T * (4 * 4 + 4)
    up = 4 * T * 4 * 12 * 2  # the query cat and key build, 4 B an element each (hf_mla.up_bytes)
    assert fwd == Counter(norm=36 * latents + 2 * (36 * T * h + 28 * T), activation=10 * T * f,
                          attention=20 * rotated + up + 4 * T * 4 * 8)
    assert bwd["norm"] == 96 * latents + 2 * (96 * T * h + 44 * T)
    assert sum(fwd.values()) == te_fused.fused_bytes_saved(dense, SHAPE)[0] + te_fused.fused_kernel_bytes(dense, SHAPE)[0]
    assert sum(bwd.values()) == te_fused.fused_bytes_saved(dense, SHAPE)[1] + te_fused.fused_kernel_bytes(dense, SHAPE)[1]


def test_the_reruns_eager_rest_keeps_its_class():
    gelu = archs.Arch(name="tiny-gpt-cls", hidden_size=64, intermediate_size=256, num_layers=2, num_heads=4,
                      num_kv_heads=4, vocab_size=128, tie_word_embeddings=False, style="gpt", mlp_act="gelu")
    # a GPT block's mlp rerun: the fused bias-GELU (4 B an element of T·f) and LayerNormLinear's LayerNorm at the
    # eager count (4 B an element of T·h, layer_norm)
    T, h, f = 64, 64, 256
    works = te_rerun.part_works(gelu, SHAPE, moe=False, fused_gemms=te_fused._fused_gemms)
    assert (works["mlp"].bytes, works["mlp"].fused_bytes, works["mlp"].classed) == (4 * T * f + 4 * T * h, 4 * T * f,
                                                                                    (("layer_norm", 4 * T * h),))
    # a MoE mlp rerun with a shared expert: the shared output's add (6 B an element of T·h) stays elementwise
    works = te_rerun.part_works(MLA, SHAPE, moe=True, fused_gemms=te_fused._fused_gemms)
    assert works["mlp"].classed == (("elementwise", 6 * T * h),)
    assert works["mlp"].unclassed_bytes == 0
    # the latent up projections' rerun: every eager byte replaced (the latent norms, rotary, the query cat and key
    # build: the fused rotary and TE's norms)
    assert works["mla-up"].unclassed_bytes == 0 and works["mla-up"].classed == ()
    # GPT-OSS's moe_act rerun: the eager clamp, 16 B an element of S·f, activation
    works = te_rerun.part_works(OSS, SHAPE, moe=True, fused_gemms=te_fused._fused_gemms)
    assert works["mlp-act"].classed == (("activation", 16 * 128 * 32),)
    assert works["mlp-act"].bytes - works["mlp-act"].fused_bytes == 16 * 128 * 32


@pytest.mark.parametrize("arch", [MOE, MLA, QK, OSS, dataclasses.replace(MLA, num_experts=0, name="tiny-mla-dense-cls")],
                         ids=lambda arch: arch.name)
def test_no_rerun_part_leaves_an_unclassed_eager_byte(arch):
    moe = bool(arch.num_experts)
    for name, done in te_rerun.part_works(arch, SHAPE, moe=moe, fused_gemms=te_fused._fused_gemms).items():
        assert done.unclassed_bytes == 0, name
