"""Selective recompute's reruns under Transformer Engine's FP8 current scaling (planner/profiler/te_rerun.py
float8_parts, planner/cost/fusedkernels.py float8_options; docs/framework-facts.md §113): a dense block's `mlp`
rerun with its linears in FP8 and their inputs quantized again (the Hopper transpose with them), a MoE block's
experts the same and its `mlp-act` with linear_fc2's input quantized again in the backward, a combination the sum
of its parts', and the options that rerun no FP8 linear left at their bf16 reruns."""

from __future__ import annotations

import dataclasses

import pytest

from planner.cost import runtimes
from planner.cost.float8 import float8_profile
from planner.cost.fusedkernels import fused_profile, rerun_on_te
from planner.models import archs
from planner.profiler import analytic, analytic_time, te_fused
from planner.profiler.analytic import Shape
from planner.profiler.membound import membound_ms
from planner.profiler.roofline import Kernel, roofline_ms, work
from planner.schema import FileRef, TrainSetup

H100, B200 = archs.gpu("h100"), archs.gpu("b200")
TINY = archs.Arch(name="tiny-llama", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                  num_kv_heads=2, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=1024)
# every layer MoE: 8 experts of width 16, top 2 (tests/test_te_moe_float8.py's)
TINY_MOE = dataclasses.replace(TINY, name="tiny-moe-fp8", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16)
REF = FileRef(file="arch:test", sha256="0" * 64)
SHAPE = Shape(seq_len=128, micro_batch_size=2)  # 256 tokens


def _record(arch, gpu, moe=False):
    return te_fused.te_time(arch, SHAPE, gpu, analytic_time.block_work(arch, SHAPE, moe=moe), moe=moe)


def test_a_dense_mlp_reruns_its_linears_in_fp8_with_their_quantizes_by_hand():
    T, h, f = 256, 64, 160
    for gpu, transpose in ((H100, 1), (B200, 0)):
        timed = _record(TINY, gpu)
        te_gpu = te_fused.te_attention_gpu(gpu)
        # the bf16 rerun (test_te_rerun.py's): linear_fc1's norm (4 B + 1/rms), the fused SwiGLU (6 B), the GEMMs
        fused = 4 * T * h + 4 * T + 6 * T * f
        # under FP8: linear_fc1's input quantized from the norm's amax (3 B) and linear_fc2's (amax 2 + cast 3), each
        # with its Hopper transpose (the rerun runs under grad); gate and up one FP8 GEMM, linear_fc2 another
        casts = (3 + transpose) * T * h + (5 + transpose) * T * f
        assert casts == {H100: 311_296, B200: 253_952}[gpu]
        fp8 = work(2 * T * h * f * 3, fused + casts, [Kernel("matmul-fp8", 2 * T * h * f), Kernel("matmul-fp8", 4 * T * h * f)],
                   fused_bytes=fused + casts)
        assert timed.float8.recompute_ms["mlp"] == pytest.approx(roofline_ms(fp8, te_gpu), rel=1e-12)
        # the weights' FP8 copies the rerun reads: linear_fc1's and linear_fc2's (cast once a step under TE)
        assert timed.float8.rerun_weight_cast_ms["mlp"] == pytest.approx(
            membound_ms(5 * (h * 2 * f + f * h), te_gpu, "fused"), rel=1e-12)
        # no FP8 linear in core-attn's or mlp-act's rerun: not in the Float8 record (their bf16 reruns stand)
        assert set(timed.float8.recompute_ms) == {"full", "mlp"}


def test_a_moe_blocks_mlp_and_mlp_act_under_fp8_by_hand():
    h, S, f = 64, 512, 16  # S: 256 tokens x top 2; 8 local experts of 64 rows
    for gpu, transpose in ((H100, 1), (B200, 0)):
        timed = _record(TINY_MOE, gpu, moe=True)
        te_gpu = te_fused.te_attention_gpu(gpu)
        # mlp-act: the weighted GLU's rerun, then linear_fc2's bf16 input (save_original_input) quantized again in
        # its backward, row-wise and column-wise: amax 2 + cast 3 (+ 1 Hopper) a GLU output element, S x f
        act = 6 * S * f + 2 * S  # te_moe's WEIGHTED_GLU_FWD and WEIGHT_FWD (the routing weight read)
        assert timed.recompute_ms["mlp-act"] == pytest.approx(membound_ms(act, te_gpu, "fused"), rel=1e-12)
        assert timed.float8.recompute_ms["mlp-act"] == pytest.approx(
            membound_ms(act + (5 + transpose) * S * f, te_gpu, "fused"), rel=1e-12)
        # mlp: the bf16 MoE rerun with each expert's linear_fc1 (64 rows x 64 -> 32) and linear_fc2 (16 -> 64) in
        # FP8, every split's input quantized: (5 + t) B x S x (h + f) more bytes
        # the record's bf16 work is not kept: the difference by the GEMMs' times and the quantizes' bytes
        gemm8 = 8 * (roofline_ms(work(0, 0, [Kernel("matmul", 2 * 64 * h * 2 * f)]), te_gpu)
                     - roofline_ms(work(0, 0, [Kernel("matmul-fp8", 2 * 64 * h * 2 * f)]), te_gpu)
                     + roofline_ms(work(0, 0, [Kernel("matmul", 2 * 64 * f * h)]), te_gpu)
                     - roofline_ms(work(0, 0, [Kernel("matmul-fp8", 2 * 64 * f * h)]), te_gpu))
        quantize = membound_ms((5 + transpose) * S * (h + f), te_gpu, "fused")
        assert timed.float8.recompute_ms["mlp"] == pytest.approx(timed.recompute_ms["mlp"] - gemm8 + quantize, rel=1e-9)


def _setup(**fields) -> TrainSetup:
    base = dict(stages=1, microbatches=1, micro_batch_size=2, mem_caps_bytes=[2**50], precision="bf16-mixed",
                runtime="megatron", float8=True)
    return TrainSetup(**(base | fields))


def test_selective_options_under_megatrons_fp8_are_the_sum_of_their_parts():
    profile = analytic.analytic_profile(TINY, SHAPE, gpu=H100, model=REF)
    block = profile.layers[1]
    assert runtimes.facts("megatron").float8 == "transformer-engine"
    timed, fp8 = block.te_time, block.te_time.float8
    charged = {option.name: option.recompute_ms for option in float8_profile(profile, _setup()).layers[1].recompute_options}
    bf16 = {option.name: option.recompute_ms
            for option in fused_profile(profile, "transformer-engine").layers[1].recompute_options}
    assert {"mlp", "core-attn", "core-attn,mlp", "mlp-act"} <= set(charged)
    # TE casts its weights once a step (the step time), so no rerun weight cast is added
    assert charged["mlp"] == pytest.approx(fp8.recompute_ms["mlp"], rel=1e-12)
    assert charged["core-attn,mlp"] == pytest.approx(timed.recompute_ms["core-attn"] + fp8.recompute_ms["mlp"], rel=1e-12)
    assert charged["core-attn"] == bf16["core-attn"] and charged["mlp-act"] == bf16["mlp-act"]  # no FP8 linear rerun
    assert charged["full"] == pytest.approx(fp8.recompute_ms["full"], rel=1e-12)
    for name, ms in charged.items():  # every option with mlp in it moves, no other (but those a part of which has no
        # rerun on TE's kernels, whole-attention `attn`, offload, op-level AC: they keep their own, as in bf16)
        moves = name == "full" or "mlp" in name.split(",") and rerun_on_te(name, timed.recompute_ms) is not None
        assert (ms != bf16[name]) == moves, name


def test_selective_options_keep_the_fp8_inputs_outside_their_rerun_by_hand():
    # TINY on H100, no TP: T 256, h 64, q 64, f 160. Without recompute TE keeps linear_qkv's and linear_fc1's norm
    # outputs at 1 B (bf16 2: -16,384 each), linear_proj's FP8 input beside the bf16 attention output (+16,384) and
    # linear_fc2's at 1 B (-40,960): -57,344 (te_kept's)
    T, h, q, f = 256, 64, 64, 160
    profile = analytic.analytic_profile(TINY, SHAPE, gpu=H100, model=REF)
    bf16 = {option.name: option.kept_bytes
            for option in float8_profile(profile, _setup(float8=False)).layers[1].recompute_options}
    fp8 = {option.name: option.kept_bytes for option in float8_profile(profile, _setup()).layers[1].recompute_options}
    norm = T * h - 2 * T * h
    assert fp8["none"] - bf16["none"] == 2 * norm + T * q - T * f == -57_344
    # core-attn: the core saves nothing, so the bf16 attention output is kept by nothing: linear_proj's FP8 copy
    # (1 B) in its place (2 B); the MLP's inputs as without recompute
    assert fp8["core-attn"] - bf16["core-attn"] == 2 * norm + (T * q - 2 * T * q) - T * f == -90_112
    # mlp: linear_fc1's and linear_fc2's inputs rerun: only the attention's FP8 inputs differ
    assert fp8["mlp"] - bf16["mlp"] == norm + T * q == 0
    assert fp8["core-attn,mlp"] - bf16["core-attn,mlp"] == norm - T * q == -32_768
    for name in ("full", "attn", "mlp-act", "attn,mlp", "core-attn,mlp-act", "offload", "op-sac"):
        assert fp8[name] == bf16[name], name  # not read here: the bf16 count (the safe side)


def test_a_moe_blocks_selective_options_keep_their_fp8_inputs_by_hand():
    from planner.cost import te_float8_kept

    # te_moe_float8.saved_inputs' tensors at tests/test_te_moe_float8.py's shape: T 64, h 64, q 64, S 128, f 16
    T, h, q, S, f = 64, 64, 64, 128, 16
    tensors = {"norm_bf16": 2 * T * h, "norm": T * h, "attn_out": 2 * T * q, "proj": T * q, "fc1_bf16": 2 * S * h,
               "fc1": S * h, "fc2_bf16": 2 * S * f, "fc2": S * f}
    none = -T * h + T * q - S * h - S * f
    assert te_float8_kept.moe_delta("norm-out", tensors) == none == -10_240  # test_te_moe_float8's count
    assert te_float8_kept.moe_delta("core-attn", tensors) == none - 2 * T * q
    assert te_float8_kept.moe_delta("mlp", tensors) == -T * h + T * q == 0  # the experts' inputs rerun
    assert te_float8_kept.moe_delta("mlp-act", tensors) == -T * h + T * q - S * h  # fc2 saves its bf16 input, discarded
    assert te_float8_kept.moe_delta("core-attn,mlp-act,norm-out", tensors) == -T * h - T * q - S * h
    assert te_float8_kept.moe_delta("mla-up", tensors) is None and te_float8_kept.dense_delta("mlp-act", tensors) is None
