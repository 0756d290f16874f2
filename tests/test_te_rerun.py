"""Selective recompute's reruns on Transformer Engine's fused kernels (planner/profiler/te_rerun.py,
planner/cost/fusedkernels.py): each part's rerun counted by hand on a tiny block, a combination the sum of
its parts', the options Megatron-LM has no module for left as they were, and a DeepSeek-V2-Lite layer whose
selective reruns no longer cost more than its whole-layer rerun under --runtime megatron."""

from __future__ import annotations

import dataclasses

import pytest

from planner.cost.fusedkernels import fused_profile, rerun_on_te
from planner.models import archs
from planner.profiler import analytic, analytic_time, te_fused, te_mla
from planner.profiler.analytic import Shape
from planner.profiler.membound import membound_ms
from planner.profiler.roofline import Kernel, Work, roofline_ms
from planner.schema import FileRef

H100 = archs.gpu("h100")
TINY = archs.Arch(name="tiny-llama", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                  num_kv_heads=2, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=1024)
TINY_GPT = dataclasses.replace(TINY, name="tiny-gpt", style="gpt", intermediate_size=256, mlp_act="gelu")
REF = FileRef(file="arch:test", sha256="0" * 64)
SHAPE = Shape(seq_len=128, micro_batch_size=2)  # 256 tokens


def _record(arch, gpu=H100, moe=False):
    return te_fused.te_time(arch, SHAPE, gpu, analytic_time.block_work(arch, SHAPE, moe=moe), moe=moe).recompute_ms


def test_a_llama_blocks_parts_rerun_on_te_kernels_by_hand():
    T, h, f = 256, 64, 160
    te_gpu = te_fused.te_attention_gpu(H100)
    reruns = _record(TINY)
    assert set(reruns) == {"full", "core-attn", "mlp", "mlp-act"}  # no latent attention, no norm of its own
    # mlp: linear_fc1 (the MLP norm inside it, TE's 4 B an element and 1/rms a token; gate and up one GEMM),
    # the fused SwiGLU (6 B an element of the product), linear_fc2
    fused = 4 * T * h + 4 * T + 6 * T * f
    mlp = Work(2 * T * h * f * 3, fused, ((Kernel("matmul", 2 * T * h * f), 1), (Kernel("matmul", 4 * T * h * f), 1)),
               fused)
    assert reruns["mlp"] == pytest.approx(roofline_ms(mlp, te_gpu), rel=1e-12)
    assert reruns["mlp-act"] == pytest.approx(membound_ms(6 * T * f, H100, "fused"), rel=1e-12)
    # core-attn: the attention forward alone, at TE's (cuDNN's) rate, not the eager GPU's
    core = analytic_time.rerun_work(TINY, SHAPE, "core-attn")
    assert reruns["core-attn"] == pytest.approx(roofline_ms(core, te_gpu), rel=1e-12)


def test_a_gpt_blocks_mlp_reruns_the_fused_bias_gelu_and_its_layernorm():
    T, h, f = 256, 64, 256
    reruns = _record(TINY_GPT)
    norm = analytic_time.rerun_work(TINY_GPT, SHAPE, "norm").bytes  # the record's LayerNorm count (eager)
    mlp = Work(2 * (2 * T * h * f), norm + 4 * T * f,  # the LayerNorm at its class's rate (tests/test_teclasses.py)
               ((Kernel("matmul", 2 * T * h * f), 2),), 4 * T * f, (("layer_norm", norm),))
    assert reruns["mlp"] == pytest.approx(roofline_ms(mlp, te_fused.te_attention_gpu(H100)), rel=1e-12)
    assert reruns["mlp-act"] == pytest.approx(membound_ms(4 * T * f, H100, "fused"), rel=1e-12)


def test_latent_attentions_up_projections_and_norms_rerun_fused():
    v2 = archs.arch("deepseek-v2-lite")
    arch = dataclasses.replace(v2, num_layers=2, num_experts=0, dense_layers=())  # a dense latent-attention block
    reruns = _record(arch)
    assert {"mla-up", "norm-out"} <= set(reruns)
    T, h = SHAPE.tokens, arch.hidden_size
    # norm-out: the attention norm (input_layernorm, a TENorm of its own) forward
    assert reruns["norm-out"] == pytest.approx(membound_ms(4 * T * h + 4 * T, H100, "fused"), rel=1e-12)
    up = analytic_time.rerun_work(arch, SHAPE, "mla-up")  # the up GEMMs, latent norms and rotary fused
    fused = te_mla.fused_bytes(arch, SHAPE)[0]
    assert reruns["mla-up"] == pytest.approx(roofline_ms(Work(up.flops, fused, up.kernels, fused),
                                                         te_mla.attention_gpu(H100)), rel=1e-12)


def test_a_combination_is_the_sum_of_its_parts_and_other_options_keep_theirs():
    reruns = {"full": 5.0, "core-attn": 1.0, "mlp": 2.0, "norm-out": 0.25}
    assert rerun_on_te("core-attn,mlp,norm-out", reruns) == 3.25
    assert rerun_on_te("full", reruns) == 5.0
    assert rerun_on_te("attn", reruns) is None and rerun_on_te("offload", reruns) is None
    assert rerun_on_te("core-attn,mlp-act", reruns) is None  # a part the record lacks: the option keeps its own
    profile = analytic.analytic_profile(TINY, SHAPE, gpu=H100, model=REF)
    block = profile.layers[1]
    timed = {option.name: option for option in fused_profile(profile, "transformer-engine").layers[1].recompute_options}
    record = block.te_time.recompute_ms
    for option in block.recompute_options:
        mine = timed[option.name].recompute_ms
        if option.name in ("offload", "op-sac", "none") or "attn" in option.name.split(","):
            assert mine == option.recompute_ms  # no Megatron module, or not a rerun
        else:
            assert mine == pytest.approx(sum(record[part] for part in option.name.split(",")), rel=1e-12)
        assert timed[option.name].kept_bytes == option.kept_bytes


def test_deepseek_v2_lites_selective_list_reruns_less_than_the_whole_layer_under_megatron():
    """The list the Megatron export test picks (mla-up,mlp,norm-out) reran eager kernels against the record's
    fused full rerun, so it cost more than whole-layer recompute; on TE's kernels it costs less, as its
    parts are a subset of the layer's forward."""
    arch = dataclasses.replace(archs.arch("deepseek-v2-lite"), num_layers=3)
    profile = analytic.analytic_profile(arch, Shape(seq_len=4096, micro_batch_size=1), gpu=H100, model=REF)
    timed = fused_profile(profile, "transformer-engine")
    blocks = [layer for layer in timed.layers if layer.kind in ("decoder_block", "moe_block")]
    assert {layer.kind for layer in blocks} == {"decoder_block", "moe_block"}
    for layer in blocks:
        option = next(o for o in layer.recompute_options if o.name == "mla-up,mlp,norm-out")
        assert option.recompute_ms < layer.recompute_ms < layer.fwd_ms
