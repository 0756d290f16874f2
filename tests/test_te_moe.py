"""A MoE block on Megatron-core's fused kernels (planner/profiler/te_moe.py, te_fused.te_time): the fused
router, permutations and weighted activation's bytes counted by hand on a tiny block, the q/k norms on TE's
RMSNorm, and the record an analytic profile's MoE blocks now carry (docs/framework-facts.md §94)."""

from __future__ import annotations

from planner.models import archs
from planner.profiler import analytic, analytic_time, te_fused, te_moe
from planner.profiler.analytic import Shape
from planner.profiler.roofline import roofline_ms
from planner.schema import FileRef

H100 = archs.gpu("h100")
REF = FileRef(file="arch:test", sha256="0" * 64)
# h 64, 4 heads of 16, 2 K/V heads; every layer MoE: 8 experts of width 32, top 2, no shared expert
TINY = archs.Arch(name="tiny-moe", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4, num_kv_heads=2,
                  vocab_size=128, tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
                  moe_intermediate_size=32)
SHAPE = Shape(seq_len=32, micro_batch_size=2)  # T 64 tokens, S 128 copies


def test_the_fused_routers_and_permutations_bytes_by_hand():
    T, h, E, S, f = 64, 64, 8, 128, 32
    TE, Th, Sh, Sf = T * E, T * h, S * h, S * f  # 512, 4096, 8192, 4096
    # TE v2.9's fused top-k (router.cpp 42-47, 77-78): logits read (2), probs (2), map (1) and the intermediate in
    # the logits' dtype (2) written; backward the map, the intermediate and the probs' gradient read, the logits'
    # gradient (the intermediate's dtype) written: 7 a (token, expert) each way, not fp32's 9
    router = (2 + 2 + 1 + 2) * TE
    permute_fwd = 5 * TE + 2 * Th + 2 * Sh + 2 * TE + 2 * S + 4 * TE  # row map made, rows, probs, row map read
    unpermute_fwd = 2 * Sh + 2 * Th + 4 * TE
    activation_fwd = 6 * Sf + 2 * S
    assert te_moe.routed_bytes(TINY, SHAPE)[0] == router + permute_fwd + activation_fwd + unpermute_fwd == 85504
    permute_bwd = 2 * Sh + 2 * Th + 4 * TE + 2 * S + 2 * TE
    unpermute_bwd = 2 * Th + 2 * Sh + 4 * TE
    activation_bwd = 10 * Sf + 4 * S
    assert te_moe.routed_bytes(TINY, SHAPE)[1] == router + permute_bwd + activation_bwd + unpermute_bwd == 99584


def test_expert_parallelism_adds_the_sort_by_local_expert():
    # EP 4: 2 local experts a rank, so the dispatcher sorts the received rows by expert and unsorts the output
    # (2 S h read and written, and the probabilities 2 S + 2 S, each, each way); EP 8: one local expert, no sort
    ep1, ep4 = te_moe.routed_bytes(TINY, SHAPE), te_moe.routed_bytes(TINY, Shape(seq_len=32, micro_batch_size=2, ep=4))
    sort = 2 * (4 * 128 * 64 + 4 * 128)
    assert (ep4[0] - ep1[0], ep4[1] - ep1[1]) == (sort, sort)
    assert te_moe.routed_bytes(TINY, Shape(seq_len=32, micro_batch_size=2, ep=8)) == ep1


def test_the_q_k_norms_on_tes_rmsnorm():
    qk = archs.Arch(**{**TINY.__dict__, "name": "tiny-moe-qk", "qk_norm": True})
    rotated = 64 * (64 + 32)  # Q's 4 heads and K's 2 of 16, over 64 tokens
    assert te_moe.qk_norm_bytes(qk, SHAPE, fused=False) == (36 * rotated, 96 * rotated)
    rows = rotated // 16  # one 1/rms (4 B) a token's head
    assert te_moe.qk_norm_bytes(qk, SHAPE, fused=True) == (4 * rotated + 4 * rows, 6 * rotated + 4 * rows)
    assert te_moe.qk_norm_bytes(TINY, SHAPE, fused=True) == (0, 0)


def test_the_moe_block_moves_the_eager_bytes_less_what_the_fused_kernels_save():
    passes = analytic_time.block_work(TINY, SHAPE, moe=True)
    timed = te_fused.te_time(TINY, SHAPE, H100, passes, moe=True)
    assert timed is not None and timed.float8 is not None  # TE's FP8 current scaling: tests/test_te_moe_float8.py
    eager = te_moe.eager_routed_bytes(TINY, SHAPE)
    mlp = analytic_time._mlp(TINY, SHAPE, True)
    assert eager == (sum(mlp[1].values()), sum(mlp[2].values()))  # no shared expert, no clamp: the MLP's bytes
    saved = te_moe.moe_saved(TINY, SHAPE)
    fused = te_moe.routed_bytes(TINY, SHAPE)
    assert saved == (eager[0] - fused[0], eager[1] - fused[1])
    assert timed.fwd_ms < roofline_ms(passes[0], H100) and timed.bwd_ms < roofline_ms(passes[1], H100)


def test_an_analytic_profiles_moe_blocks_carry_the_record():
    profile = analytic.analytic_profile(TINY, SHAPE, gpu=H100, model=REF)
    blocks = [layer for layer in profile.layers if layer.kind == "moe_block"]
    assert len(blocks) == 2 and all(layer.te_time is not None for layer in blocks)
    mla = archs.arch("deepseek-v2-lite")  # latent attention: its MoE record too, the latent parts te_mla.py's
    assert te_moe.counts_moe(mla, SHAPE) and te_moe.qk_norm_bytes(mla, SHAPE, fused=True) == (0, 0)


def test_the_reader_knows_the_moe_fusion_flags():
    # Megatron-Bridge's GB200 Qwen3-235B flags set both: the router's fusion was "unknown" to the reader
    from pathlib import Path

    from planner.models.configs import megatron

    job = megatron.read(Path(__file__).resolve().parent.parent / "configs/megatron-bridge/gb200_qwen3_235b_bf16.yaml")
    said = {setting.name: setting for setting in job.settings}
    for flag in ("--moe-router-fusion", "--moe-permute-fusion"):
        assert said[flag].status == "no effect" and "te_moe.py" in said[flag].what
