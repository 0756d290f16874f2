"""A latent-attention block on Megatron-core's fused kernels (planner/profiler/te_mla.py, te_fused.te_time):
the fused MLA rotary's and the latent norms' bytes by hand on a tiny block, cuDNN's rate at the DeepSeek-V3
shape read from its published milliseconds, the shared experts' fused SwiGLU, and the record a dense and a
MoE latent-attention block now carry (docs/framework-facts.md §101)."""

from __future__ import annotations

import pytest

from planner.models import archs
from planner.models.attention_published import attention_tflops
from planner.models.attention_rates import attention_efficiency
from planner.profiler import analytic_time, hf_mla, te_fused, te_mla, te_moe
from planner.profiler.analytic import Shape
from planner.profiler.roofline import roofline_ms

GB200, H100 = archs.gpu("gb200"), archs.gpu("h100")
# h 64, 4 heads; q latent 24, kv latent 16, nope 8, rope 4, v 8; 8 experts of 32, top 2, one shared expert of 48
TINY = archs.Arch(name="tiny-mla", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4, num_kv_heads=4,
                  vocab_size=128, tie_word_embeddings=False, q_lora_rank=24, kv_lora_rank=16,
                  qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, head_dim=12, num_experts=8,
                  num_experts_per_tok=2, moe_intermediate_size=32, num_shared_experts=1, shared_intermediate_size=48)
SHAPE = Shape(seq_len=32, micro_batch_size=2)  # T 64 tokens


def test_the_fused_mla_rotary_and_latent_norms_bytes_by_hand():
    T, n = 64, 4
    q_rot = T * n * 4  # Q's rotary part, rotated in place: 2 B read + 2 B written an element
    split = T * (2 * n * (8 + 8) + 2 * n * (8 + 4 + 8) + 2 * 4)  # kv read; key and value written; k_pos_emb read
    assert te_mla.rope_fused_bytes(TINY, SHAPE) == (4 * q_rot + split, 4 * q_rot + split) == (23040, 23040)
    latents, rows = T * (24 + 16), T * 2
    assert te_mla.fused_bytes(TINY, SHAPE) == (4 * latents + 4 * rows + 23040, 6 * latents + 4 * rows + 23040)
    eager_rotated = T * (n * 4 + 4)  # the eager count: rotary on Q's rotary part and the shared key part
    copies = hf_mla.forward_bytes(TINY, SHAPE).total(), hf_mla.backward_bytes(TINY, SHAPE).total()  # transformers'
    assert te_mla.eager_bytes(TINY, SHAPE) == (36 * latents + 20 * eager_rotated + copies[0],
                                               96 * latents + 32 * eager_rotated + copies[1])


def test_cudnn_at_the_deepseek_v3_shape_is_read_from_its_milliseconds():
    # results/dsv3/gb200/dsv3_20260424_101009.csv: batch 2, 4096 tokens, 128 heads, d_qk 192, d_v 128, causal
    fwd = 2 * 128 * (2 * 4096**2 * 192 + 2 * 4096**2 * 128) / 2 / 0.977e-3 / 1e12  # the benchmark's own count
    assert attention_tflops(2, 128, 4096, 160, 0.977, causal=True, backward=False) == pytest.approx(fwd)
    mla_gpu = te_mla.attention_gpu(GB200)
    # the backward's own count at (192, 128): 2·s²·(3·192 + 2·128) a head, 2.6x the forward's (flash's 2.5x at equal dims)
    bwd = 2 * 128 * 2 * 4096**2 * (3 * 192 + 2 * 128) / 2 / 3.383e-3 / 1e12
    assert bwd == pytest.approx(2.6 * fwd * 0.977 / 3.383)
    assert attention_tflops(2, 128, 4096, 192, 3.383, causal=True, backward=True, v_head_dim=128) == pytest.approx(bwd)
    assert attention_efficiency(mla_gpu, 4096) == pytest.approx((fwd / 2500, bwd / 2500))
    assert 1406 <= fwd < 1407.5  # the file's tflops column, 1406 (its time rounded to the µs)
    # H100 has no MLA-shape record published beside a non-deterministic backward: TE's head-128 figures
    assert te_mla.attention_gpu(H100).attention_efficiency == H100.te_attention_efficiency


def test_the_shared_experts_swiglu_runs_fused():
    shared = 64 * 48  # T x the shared width
    assert te_moe.shared_swiglu_elements(TINY, SHAPE) == shared
    eager, fused = te_moe.eager_routed_bytes(TINY, SHAPE), te_moe.routed_bytes(TINY, SHAPE)
    assert te_moe.moe_saved(TINY, SHAPE) == (eager[0] - fused[0] + (10 - 6) * shared, eager[1] - fused[1] + (18 - 10) * shared)
    assert te_moe.moe_fused_bytes(TINY, SHAPE) == (fused[0] + 6 * shared, fused[1] + 10 * shared)


@pytest.mark.parametrize("moe", [False, True])
def test_a_latent_attention_block_gets_the_record(moe):
    passes = analytic_time.block_work(TINY, SHAPE, moe=moe)
    timed = te_fused.te_time(TINY, SHAPE, GB200, passes, moe=moe)
    assert timed is not None and timed.float8 is None  # no Float8 record for latent attention
    assert timed.fwd_ms < roofline_ms(passes[0], GB200) and timed.bwd_ms < roofline_ms(passes[1], GB200)


def test_the_deepseek_v3_block_on_gb200_by_part():
    # the attention core alone at D1's shape (4096 tokens, 128 heads, d_qk 192, d_v 128, one sequence): half the
    # benchmark's batch-2 milliseconds each way, the cuDNN figure te_mla reads
    arch = archs.arch("deepseek-v3")
    shape = Shape(seq_len=4096, micro_batch_size=1, ep=64)
    mla_gpu = te_mla.attention_gpu(GB200)
    core = analytic_time._attention(arch, shape)[0][0]
    from planner.profiler.roofline import kernel_ms
    assert kernel_ms(core, mla_gpu) == pytest.approx(0.977 / 2, rel=1e-3)
    bwd = analytic_time._backward_kernels([core], arch)[0]  # 2.6x the forward at (192, 128)
    assert kernel_ms(bwd, mla_gpu) == pytest.approx(3.383 / 2, rel=1e-3)


def test_a_gpt_style_latent_attention_block_gets_the_record_under_flash_only():
    # Megatron-LM's MLA functional test (row G6): LayerNorm, GELU, learned positions, no --qk-layernorm; it runs
    # --attention-backend unfused, so the reader gives eager attention and no record is made
    from pathlib import Path

    from planner.models.configs import megatron

    job = megatron.read(Path("configs/megatron-lm/gpt3_mcore_te_tp2_pp2_mla.yaml"))
    assert job.attention == "eager" and job.arch.style == "gpt" and job.arch.mla
    for attention, recorded in (("eager", False), ("flash", True)):
        shape = Shape(seq_len=job.seq_len, micro_batch_size=job.micro_batch_size, tp=job.tp, sp=job.sp,
                      attention=attention)
        passes = analytic_time.block_work(job.arch, shape)
        timed = te_fused.te_time(job.arch, shape, H100, passes, moe=False)
        assert (timed is not None) == recorded
        if recorded:  # GELU fused, the latent norms and MLA rotary on TE's and Megatron's kernels
            assert timed.fwd_ms < roofline_ms(passes[0], H100) and timed.float8 is None
