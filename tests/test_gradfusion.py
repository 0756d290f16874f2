"""Megatron's gradient-accumulation fusion on the TE record (planner/profiler/te_fused.py fused_accumulation,
planner/cost/fusedkernels.py): the record's backward holds no eager .grad accumulation (the wgrad GEMM writes into
main_grad); --no-gradient-accumulation-fusion puts the eager pass back. Bytes counted by hand on tiny blocks."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from planner.cost.float8 import float8_profile
from planner.models import archs
from planner.profiler import analytic, analytic_time, te_fused
from planner.profiler.analytic import Shape
from planner.profiler.membound import membound_ms
from planner.profiler.roofline import roofline_ms
from planner.schema import FileRef, TrainSetup

H100 = archs.gpu("h100")
GPU = te_fused.te_attention_gpu(H100)
# h 64, 4 query heads and 2 K/V heads of 16, SwiGLU width 160, no biases
TINY = archs.Arch(name="tiny-llama-gf", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                  num_kv_heads=2, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=1024)
# the same attention, 8 experts of width 32, top 2
MOE = archs.Arch(name="tiny-moe-gf", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4, num_kv_heads=2,
                 vocab_size=128, tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
SHAPE = Shape(seq_len=128, micro_batch_size=2)  # 256 tokens
REF = FileRef(file="arch:test", sha256="0" * 64)
DENSE_PARAMS = 64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 160 + 2 * 64  # qkv, o, gate/up/down, two norms


def _classes(done) -> Counter:
    return Counter(dict(done.classed))


def test_the_fused_backward_drops_exactly_six_bytes_a_parameter():
    assert analytic_time.accumulate_bytes(TINY, SHAPE) == 6 * DENSE_PARAMS == 6 * 43_136
    bwd = analytic_time.block_work(TINY, SHAPE)[1]
    fused, gone = te_fused.fused_accumulation(bwd, TINY, SHAPE, moe=False)
    assert gone == 6 * DENSE_PARAMS
    assert bwd.bytes - fused.bytes == 6 * DENSE_PARAMS
    left = _classes(bwd)
    left["elementwise"] -= 6 * DENSE_PARAMS
    assert _classes(fused) == +left and fused.unclassed_bytes == bwd.unclassed_bytes
    assert (fused.flops, fused.kernels, fused.fused_bytes) == (bwd.flops, bwd.kernels, bwd.fused_bytes)
    # the roofline is additive by class: the time dropped is those bytes at the elementwise class's rate
    assert roofline_ms(bwd, GPU) - roofline_ms(fused, GPU) == pytest.approx(
        membound_ms(6 * DENSE_PARAMS, GPU, "eager", "elementwise"), rel=1e-9)


def test_a_moe_block_drops_only_the_held_experts_gradients():
    shape = dataclasses.replace(SHAPE, ep=4)  # 2 of the 8 experts held
    held = 64 * (64 + 2 * 32) + 64 * 64 + 64 * 8 + 2 * 3 * 64 * 32 + 2 * 64  # qkv, o, router, 2 experts, norms
    assert analytic_time.accumulate_bytes(MOE, shape, moe=True) == 6 * held
    bwd = te_fused.moe_passes(MOE, shape, analytic_time.block_work(MOE, shape, moe=True))[1]
    fused, gone = te_fused.fused_accumulation(bwd, MOE, shape, moe=True)
    assert gone == 6 * held and bwd.bytes - fused.bytes == 6 * held
    record = te_fused.te_time(MOE, shape, H100, analytic_time.block_work(MOE, shape, moe=True), moe=True)
    assert record.accumulate_ms == pytest.approx(membound_ms(6 * held, GPU, "eager", "elementwise"), rel=1e-12)
    assert record.bwd_ms == pytest.approx(roofline_ms(fused, GPU), rel=1e-12)


def _setup(**fields) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=1, micro_batch_size=2, mem_caps_bytes=[2**50], precision="bf16-mixed",
                      runtime="megatron", **fields)


def test_the_unfused_setting_puts_the_eager_pass_back_on_the_record():
    profile = analytic.analytic_profile(TINY, SHAPE, gpu=H100, model=REF)
    record = profile.layers[1].te_time
    eager_pass = membound_ms(6 * DENSE_PARAMS, GPU, "eager", "elementwise")
    assert record.accumulate_ms == pytest.approx(eager_pass, rel=1e-12) and eager_pass > 0
    fused = float8_profile(profile, _setup()).layers[1]
    unfused = float8_profile(profile, _setup(unfused_grad_accumulation=True)).layers[1]
    assert fused.bwd_ms == record.bwd_ms
    assert unfused.bwd_ms == pytest.approx(record.bwd_ms + eager_pass, rel=1e-12)
    assert (unfused.fwd_ms, unfused.recompute_ms) == (fused.fwd_ms, fused.recompute_ms)  # the backward's alone


def test_the_float8_record_moves_by_the_same_pass():
    mid = dataclasses.replace(TINY, hidden_size=2048, intermediate_size=8192, num_heads=16, num_kv_heads=8,
                              vocab_size=1024)
    profile = analytic.analytic_profile(mid, Shape(seq_len=1024, micro_batch_size=8), gpu=H100, model=REF)
    record = profile.layers[1].te_time
    fused = float8_profile(profile, _setup(float8=True)).layers[1].float8
    unfused = float8_profile(profile, _setup(float8=True, unfused_grad_accumulation=True)).layers[1].float8
    assert unfused.bwd_ms == pytest.approx(fused.bwd_ms + record.accumulate_ms, rel=1e-12)
    assert unfused.fwd_ms == fused.fwd_ms
