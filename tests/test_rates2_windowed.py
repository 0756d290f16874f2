"""A causal sliding window's attention kernel at cuDNN's published windowed rate (attention_published.py
CUDNN_SWA_*, attention_rates.windowed_efficiency), under Transformer Engine only; hand counts of the pairs."""

import dataclasses

import pytest

from planner.models import attention_published as pub
from planner.models.archs import GPUS
from planner.models.attention_rates import (
    attention_efficiency,
    te_attention_gpu,
    windowed_efficiency,
)
from planner.profiler.roofline import Kernel, kernel_ms


def test_the_windowed_rate_counts_the_exact_pairs_the_window_keeps():
    # window 128 over 4096 tokens: 128·129/2 + 3968·128 = 516,160 pairs; 4·64 FLOPs a pair a head, 128 heads,
    # batch 2: 33.82 GFLOP in 0.210 ms, 161 TFLOP/s, the benchmark's own tflops column
    assert pub.windowed_tflops(2, 128, 4096, 128, 64, 0.210, backward=False) == pytest.approx(
        4 * 516160 * 64 * 128 * 2 / 0.210e-3 / 1e12)
    assert round(pub.windowed_tflops(2, 128, 4096, 128, 64, 0.210, backward=False)) == 161
    assert round(pub.windowed_tflops(2, 128, 4096, 128, 64, 0.465, backward=True)) == 182
    # window 1024, 64 heads (GB200, cuDNN 9.19): the column's 574 / 617
    assert round(pub.windowed_tflops(2, 64, 4096, 1024, 64, 0.209, backward=False)) == 575
    assert round(pub.windowed_tflops(2, 64, 4096, 1024, 64, 0.487, backward=True)) == 617


def test_te_reads_the_windowed_figures_and_sdpa_keeps_the_full_kernels():
    gb200 = te_attention_gpu(GPUS["gb200"])
    fwd, bwd = attention_efficiency(gb200, 4096, 128)
    assert (fwd * 2500, bwd * 2500) == pytest.approx(
        (pub.windowed_tflops(2, 128, 4096, 128, 64, 0.210, backward=False),
         pub.windowed_tflops(2, 128, 4096, 128, 64, 0.465, backward=True)))
    assert attention_efficiency(gb200, 4096, 0) == gb200.te_attention_efficiency  # no window: the full kernel's
    assert attention_efficiency(gb200, 4096, 4096) == gb200.te_attention_efficiency  # a window masking nothing
    # torch's SDPA (no windowed figure published): the full kernel's rate
    assert attention_efficiency(GPUS["gb200"], 4096, 128) == attention_efficiency(GPUS["gb200"], 4096)
    # B200 reads GB200's fractions; the H100s the H200's window-1024 figures at a window of 128 (an upper bound)
    assert attention_efficiency(te_attention_gpu(GPUS["b200"]), 4096, 128) == (fwd, bwd)
    h100 = te_attention_gpu(GPUS["h100-sxm"])
    assert attention_efficiency(h100, 4096, 128) == attention_efficiency(h100, 4096, 1024)
    assert attention_efficiency(h100, 4096, 1024)[0] * 989.4 == pytest.approx(
        pub.windowed_tflops(2, 64, 4096, 1024, 64, 0.358, backward=False))


def test_windows_between_and_beyond_the_published_ones_are_log_linear():
    gpu = dataclasses.replace(GPUS["gb200"], attention_by_seq=(), attention_efficiency=(0.6, 0.5),
                              attention_windowed=((128, 1024, 0.1, 0.2), (512, 1024, 0.3, 0.4)))
    assert windowed_efficiency(gpu, 1024, 64) == (0.1, 0.2)  # below the smallest: the smallest's
    assert windowed_efficiency(gpu, 1024, 256) == pytest.approx((0.2, 0.3))  # halfway in log between 128 and 512
    # beyond 512: toward the full kernel's (0.6, 0.5) at a window of the whole 2048 tokens (1024: halfway in log)
    assert windowed_efficiency(gpu, 2048, 1024) == pytest.approx((0.45, 0.45))
    assert windowed_efficiency(gpu, 4096, 2048) == pytest.approx((0.3 + 0.3 * 2 / 3, 0.4 + 0.1 * 2 / 3))


def test_a_windowed_kernel_takes_its_time_at_the_windowed_rate():
    gb200 = te_attention_gpu(GPUS["gb200"])
    flops = 4 * 516160 * 64 * 128 * 2  # the benchmark's forward at window 128: 0.210 ms as published
    assert kernel_ms(Kernel("attention-fwd", flops, 1.0, 4096, 128), gb200) == pytest.approx(0.210)
    full = kernel_ms(Kernel("attention-fwd", flops, 1.0, 4096), gb200)
    assert full == pytest.approx(flops / (gb200.te_attention_efficiency[0] * 2500e12) * 1e3)


def test_the_analytic_profile_gives_gpt_oss_windowed_layers_their_window():
    from planner.models.archs import ARCHS
    from planner.profiler import analytic_time
    from planner.profiler.formulas import Shape

    arch = ARCHS["gpt-oss-120b"]
    shape = Shape(seq_len=4096, micro_batch_size=1)
    windowed, _, _ = analytic_time._attention(arch.layer(0), shape)
    full, _, _ = analytic_time._attention(arch.layer(1), shape)
    assert (windowed[0].window, full[0].window) == (128, 0)
    assert analytic_time._backward_kernels(windowed)[0].window == 128
