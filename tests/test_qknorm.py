"""Megatron-core's per-head q and k norms (`--qk-layernorm`: `q_layernorm` / `k_layernorm`, TENorm on the TE
spec) on a GPT block, by hand on a tiny block: the parameters each norm holds (LayerNorm: weight and bias, head_dim
each, whole on every TP rank) and what each keeps for backward (TE's LayerNorm op: a contiguous copy of its input,
fp32 mean and 1/std per head and token); a LLaMA-style (Qwen3) block's RMSNorm keeps 1/rms alone."""

from __future__ import annotations

import dataclasses

from planner.models import archs
from planner.profiler.analytic import Shape
from planner.profiler.analytic_kept import gpt_block_terms, llama_block_terms
from planner.profiler.formulas import block_params

# h 64, 4 heads of 16 (no GQA, as G14's config), 4h GELU MLP
GPT = archs.Arch(name="tiny-gpt-qk", hidden_size=64, intermediate_size=256, num_layers=2, num_heads=4,
                 num_kv_heads=4, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=1024,
                 style="gpt", mlp_act="gelu_kernel")
QK = dataclasses.replace(GPT, qk_norm=True)
SHAPE = Shape(seq_len=128, micro_batch_size=2)  # 256 tokens


def _kept(arch, shape, terms=gpt_block_terms) -> int:
    return sum(term.num_bytes for term in terms(arch, shape))


def test_a_gpt_blocks_q_and_k_layernorms_keep_their_inputs_and_two_fp32_statistics_a_head():
    # Q and K: 256 tokens x 4 heads x 16 = 16,384 elements each; the inputs' copies 2 x 16,384 x 2 B = 65,536;
    # mean and 1/std, fp32, per head and token: 2 x (256 x 4) rows x 2 x 4 B = 16,384
    assert _kept(QK, SHAPE) - _kept(GPT, SHAPE) == 65_536 + 16_384
    # TP 2: two heads a rank
    tp2 = dataclasses.replace(SHAPE, tp=2)
    assert _kept(QK, tp2) - _kept(GPT, tp2) == 32_768 + 8_192


def test_a_gpt_blocks_q_and_k_layernorms_hold_a_weight_and_a_bias_of_head_dim_each_whole_on_every_rank():
    for tp in (1, 2):
        shape = dataclasses.replace(SHAPE, tp=tp)
        assert block_params(QK, shape) - block_params(GPT, shape) == 2 * 2 * 16


def test_a_llama_blocks_q_and_k_rmsnorms_keep_one_statistic_a_head():
    llama = dataclasses.replace(GPT, name="tiny-llama-qk", style="llama", mlp_act="silu", intermediate_size=160)
    qwen = dataclasses.replace(llama, qk_norm=True)
    # the inputs 65,536 B as above; 1/rms, fp32: 2 x 1,024 rows x 4 B = 8,192
    assert _kept(qwen, SHAPE, llama_block_terms) - _kept(llama, SHAPE, llama_block_terms) == 65_536 + 8_192


def test_a_gpt_blocks_q_and_k_layernorms_run_on_tes_norm_kernels_in_the_fused_record():
    from planner.models import archs as models
    from planner.profiler import analytic_time, te_fused

    # 32,768 elements of Q and K; eager, the RMSNorm chain's 36 / 96 B an element (analytic_time.NORM_FWD, NORM_BWD);
    # TE's LayerNorm 4 / 6 B an element and mean + 1/std, 8 B, a row of 16 (2,048 rows)
    eager, fused = (36 * 32_768, 96 * 32_768), (4 * 32_768 + 8 * 2_048, 6 * 32_768 + 8 * 2_048)
    plain, qk = analytic_time.block_work(GPT, SHAPE), analytic_time.block_work(QK, SHAPE)
    # backward also accumulates the norms' 64 weight and bias gradients (analytic_time.accumulate_bytes: 6 B each)
    assert (qk[0].bytes - plain[0].bytes, qk[1].bytes - plain[1].bytes) == (eager[0], eager[1] + 6 * 64)
    saved, saved_plain = te_fused.fused_bytes_saved(QK, SHAPE), te_fused.fused_bytes_saved(GPT, SHAPE)
    assert (saved[0] - saved_plain[0], saved[1] - saved_plain[1]) == (eager[0] - fused[0], eager[1] - fused[1])
    moved, moved_plain = te_fused.fused_kernel_bytes(QK, SHAPE), te_fused.fused_kernel_bytes(GPT, SHAPE)
    assert (moved[0] - moved_plain[0], moved[1] - moved_plain[1]) == fused == (147_456, 212_992)
    h100 = models.gpu("h100")
    record = te_fused.te_time(QK, SHAPE, h100, qk, moe=False)
    assert record is not None and record.fwd_ms > te_fused.te_time(GPT, SHAPE, h100, plain, moe=False).fwd_ms
