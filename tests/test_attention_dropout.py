"""The attention dropout's draws inside Transformer Engine's attention kernels (planner/cost/attention_dropout.py),
counted by hand on tiny blocks from the kernels' published times with and without dropout."""

from __future__ import annotations

import pytest

from planner.cost import attention_dropout
from planner.cost.layers import layer_costs
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef, TrainSetup

# TransformerEngine#3312 (H200 cuDNN; B300 cuDNN) and #3313 (GB200 FlashAttention-2): ms without, with dropout 0.1
HOPPER, BLACKWELL, FLASH2 = 0.614 / 0.594, 0.525 / 0.480, 0.728 / 0.695


def _setup(runtime="megatron", **training) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**40], precision="bf16-mixed",
                      runtime=runtime, dp=2, zero=1, **training)


def _gpt(**overrides) -> archs.Arch:
    return archs.Arch(**{**dict(name="tiny-gpt", style="gpt", hidden_size=256, intermediate_size=1024, num_layers=1,
                                num_heads=8, num_kv_heads=8, vocab_size=128, tie_word_embeddings=False,
                                max_position_embeddings=64), **overrides})


def _block(arch, gpu: str):
    profile = analytic.analytic_profile(arch, Shape(seq_len=64, micro_batch_size=4, tp=2), gpu=archs.gpu(gpu),
                                        model=FileRef(file="arch:test", sha256="0" * 64))
    return profile, next(layer for layer in layer_costs(profile) if layer.kind == "decoder_block")


# per device at TP 2: 4 heads, head dim 32, 64 tokens, 4 sequences, causal half
FORWARD = 4 * 64 * 64 * 32 * 4 * 4 / 2


def test_cudnn_on_hopper_pays_its_measured_share_of_its_attention_by_hand():
    profile, block = _block(_gpt(), "h100")
    # the profile's cuDNN 9.19 on H200 (1 x 64 heads, 8192 tokens, head dim 128): forward 1.708 ms, backward 5.083
    scale = FORWARD / (4 * 8192 * 8192 * 128 * 64 / 2)
    fwd, bwd = 1.708 * scale, 5.083 * scale
    for deterministic in (True, False):  # no deterministic backward published for sm90: the same kernel times
        setup = _setup(deterministic=deterministic)
        assert attention_dropout.attention_dropout_ms(block, 0, profile, setup) == pytest.approx(
            (HOPPER - 1) * (fwd + bwd), rel=1e-9)
        # a full recompute draws the forward's mask again
        assert attention_dropout.attention_dropout_ms(block, 1, profile, setup) == pytest.approx(
            (HOPPER - 1) * (2 * fwd + bwd), rel=1e-9)


def test_flash2_on_the_a100_pays_on_its_deterministic_split_backward_by_hand():
    profile, block = _block(_gpt(), "a100-80g")
    # FlashAttention-2 at 73% of 312 TFLOP/s forward, 63% backward; deterministic: 4 x 4 = 16 (batch, head) pairs split
    # ceil(108 / 16) = 7 ways: 112 blocks in 2 waves of 108
    fwd = FORWARD / (312e12 * 0.73) * 1e3
    bwd = 2.5 * FORWARD / (312e12 * 0.63) * 1e3
    assert attention_dropout.attention_dropout_ms(block, 0, profile, _setup(deterministic=True)) == pytest.approx(
        (FLASH2 - 1) * (fwd + bwd * 2 * 108 / 112), rel=1e-9)
    assert attention_dropout.attention_dropout_ms(block, 0, profile, _setup()) == pytest.approx(
        (FLASH2 - 1) * (fwd + bwd), rel=1e-9)


def test_gb200_pays_flash2s_share_under_determinism_and_cudnns_outside_it():
    profile, block = _block(_gpt(), "gb200")
    # outside deterministic mode TE keeps cuDNN on sm100 with dropout: cuDNN 9.22 on GB200 (2 x 64 heads, 8192
    # tokens): forward 1.397 ms, backward 4.127, at B300's measured share
    scale = FORWARD / (4 * 8192 * 8192 * 128 * 64 * 2 / 2)
    assert attention_dropout.attention_dropout_ms(block, 0, profile, _setup()) == pytest.approx(
        (BLACKWELL - 1) * (1.397 + 4.127) * scale, rel=1e-9)
    # under it FlashAttention-2: torch SDPA's flash backend on B200 at 512 tokens (1 x 128 heads: 0.115, 0.259 ms),
    # its backward split ceil(152 / 16) = 10 ways, 160 blocks in 2 waves of 152
    sdpa = FORWARD / (4 * 512 * 512 * 128 * 128 / 2) * 2250 / 2500
    assert attention_dropout.attention_dropout_ms(block, 0, profile, _setup(deterministic=True)) == pytest.approx(
        (FLASH2 - 1) * (0.115 + 0.259 * 2 * 152 / 160) * sdpa, rel=1e-9)


def test_nothing_where_the_attention_does_not_drop_or_the_layers_are_not_tes():
    profile, block = _block(_gpt(attention_dropout=False), "h100")
    assert attention_dropout.attention_dropout_ms(block, 0, profile, _setup(deterministic=True)) == 0.0
    profile, block = _block(_gpt(), "h100")
    assert attention_dropout.attention_dropout_ms(block, 0, profile, _setup(runtime="torchtitan")) == 0.0
    embedding = layer_costs(profile)[0]
    assert attention_dropout.attention_dropout_ms(embedding, 0, profile, _setup()) == 0.0
    # a LLaMA block says nothing of dropout: it does not drop
    llama = archs.Arch(name="tiny-llama", hidden_size=256, intermediate_size=640, num_layers=1, num_heads=8,
                       num_kv_heads=4, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=64)
    profile, block = _block(llama, "h100")
    assert attention_dropout.attention_dropout_ms(block, 0, profile, _setup()) == 0.0
    # a ROCm GPU: no TE kernel's share read
    assert attention_dropout.dropout_ratio(archs.gpu("mi300x"), "cudnn") == 1.0


def test_which_kernel_te_runs_where_the_attention_drops():
    a100, h100, gb200 = (archs.gpu(name) for name in ("a100-80g", "h100", "gb200"))
    assert [attention_dropout.te_kernel(gpu, deterministic=False) for gpu in (a100, h100, gb200)] == \
        ["flash2", "cudnn", "cudnn"]
    assert [attention_dropout.te_kernel(gpu, deterministic=True) for gpu in (a100, h100, gb200)] == \
        ["flash2", "cudnn", "flash2"]
