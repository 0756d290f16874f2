"""Published attention-kernel timings, as fractions of each GPU's dense BF16 peak: torch's SDPA flash
backend (pytorch/benchmark; the cudnn-frontend benchmark's torch rows on B200), cuDNN's fused attention
(NVIDIA/cudnn-frontend's training benchmark) and FlashAttention-2 on MI300X, each with its source. The GPU
records (planner/models/gpus.py) read them; attention_rates.py interpolates them by sequence length."""

from __future__ import annotations


def attention_tflops(batch: int, heads: int, seq_len: int, head_dim: int, latency_ms: float, *, causal: bool,
                     backward: bool, v_head_dim: int | None = None) -> float:
    """A published attention timing as TFLOP/s, counted as FlashAttention's and tritonbench's benchmarks
    count it: 4·s²·d·heads·batch forward, halved under a causal mask (the kernel skips the masked
    blocks), x2.5 for the backward (five matmuls to the forward's two). With a value head dim of its own
    (a latent attention's), each GEMM at its own width, as torch's flop counter and the analytic profile
    count them (formulas.attention_bwd_flops): forward 2·s²·(d + d_v), backward 2·s²·(3·d + 2·d_v)."""
    d_v = head_dim if v_head_dim is None else v_head_dim
    per_pair = 2 * (3 * head_dim + 2 * d_v) if backward else 2 * (head_dim + d_v)
    flops = seq_len**2 * per_pair * heads * batch / (2 if causal else 1)
    return flops / (latency_ms * 1e-3) / 1e12


# torch's scaled_dot_product_attention on H100, flash backend (FlashAttention-2 as vendored in torch),
# (batch 2, 16 heads, 8192 tokens, head dim 128), causal, BF16: forward 1.84317 ms, backward 5.28237 ms
# (pytorch/benchmark c0409aaf, 2024-08-28, PR #2443 "Add FlexAttention", the `sdpa` rows, which run
# `sdpa_kernel([SDPBackend.FLASH_ATTENTION])`; the GPU is not named there: the FlashAttention-2 package
# in the same rows reaches 322 TFLOP/s, above any A100's 312 peak, and the operator is the H100 one of
# 5cc1d010). Flash is first in torch's default order (ATen/Context.h 481-486, torch 2.13.0 as
# installed); cuDNN attention is moved first only with a runtime cuDNN newer than 9.15 on sm_90/sm_100
# (sdp_utils.cpp check_prefer_cudnn_attention, pytorch/pytorch 001f694)
SDPA_H100_TFLOPS = (attention_tflops(2, 16, 8192, 128, 1.84317, causal=True, backward=False),
                    attention_tflops(2, 16, 8192, 128, 5.28237, causal=True, backward=True))
SDPA_H100 = (SDPA_H100_TFLOPS[0] / 989.4, SDPA_H100_TFLOPS[1] / 989.4)
# the same commit's other lengths (16384 tokens a batch, 16 heads, head dim 128, causal): forward and
# backward ms at 512, 1024, 2048, 4096, 8192, 16384 tokens
_SDPA_H100_MS = ((512, 0.199136, 1.14022), (1024, 0.298208, 1.41398), (2048, 0.51504, 1.97437),
                 (4096, 0.9584, 3.08925), (8192, 1.84317, 5.28237), (16384, 3.62157, 9.27056))
SDPA_H100_BY_SEQ = tuple(
    (seq, attention_tflops(16384 // seq, 16, seq, 128, fwd, causal=True, backward=False) / 989.4,
     attention_tflops(16384 // seq, 16, seq, 128, bwd, causal=True, backward=True) / 989.4)
    for seq, fwd, bwd in _SDPA_H100_MS)
SDPA_HOPPER = ("torch SDPA flash backend on H100, causal, 8192 tokens, head dim 128: forward "
                f"{SDPA_H100_TFLOPS[0]:.1f}, backward {SDPA_H100_TFLOPS[1]:.1f} TFLOP/s (pytorch/benchmark c0409aaf)")
# FlashAttention-2 on MI300X (ROCm's CK port, ROCm 6.3.2), non-causal, batch 1, 16384 tokens, head dim
# 128: forward 353.22, backward 194.43 TFLOP/s (ROCm/flash-attention#142, 2025-05-18). torch's SDPA on
# ROCm runs AOTriton's kernels instead, whose backward pytorch/pytorch#135431 measured at 19.9 TFLOP/s
# on LLaMA 3 8B's shapes (torch 2.5.0.dev20240907+rocm6.2); no later absolute AOTriton figure was found
# (ROCm/aotriton 0.9b and 0.10b release PRs #76, #97 give relative changes only): at 19.9 TFLOP/s the
# M12/T5 step would take 2.94 s against 1.524 s published, at CK's 0.96 s (docs/published-runs.md §11.rocm).
# M12's torch (2.9.0.dev20250811+rocm6.4) bundled AOTriton 0.10b (pytorch#156499, 2025-06-20, to #161754, 2025-08-29,
# which moved to 0.11b and AITER's assembly kernels), AOTriton being ROCm's default SDPA library (torch/backends/cuda
# preferred_rocm_fa_library: "Currently AOTriton"; CK only under TORCH_ROCM_FA_PREFER_CK=1, which neither torchtitan
# 2c8b5947's run_train.sh nor torchao 853f87d1's llama3.sh sets); no absolute 0.10b figure on gfx942 was found
MI300X_FLASH_TFLOPS = (353.22, 194.43)
# That CK figure is non-causal; the rows' kernel (and every other GPU record's figure) causal. AMD's only published
# causal / non-causal pairs on MI300X at 8,192 tokens and head dim 128 are AITER's (ROCm/aiter op_tests/cpp/mha/
# README.md 0403bcdf, "More performance test results", BF16, BSHD, batch mode; another kernel, its assembly v3): nine
# shapes, each run with and without the mask. Rows: (batch, query heads, K/V heads, forward non-causal, causal,
# backward with fp32 dQ accumulation (a32, as CK's FlashAttention-2 accumulates dQ) non-causal, causal) TFLOP/s
AITER_MI300X_8192 = ((1, 32, 8, 558.17, 522.68, 481.28, 388.235), (4, 32, 8, 574.62, 547.09, 458.72, 422.835),
                     (8, 32, 8, 585.29, 537.36, 475.56, 441.4), (1, 64, 8, 591.37, 518.29, 441.82, 433.285),
                     (4, 64, 8, 592.16, 540.515, 468.71, 434.645), (8, 64, 8, 577.45, 550.67, 475.07, 432.715),
                     (1, 64, 4, 591.77, 519.32, 439.94, 442.955), (4, 64, 4, 590.93, 540.935, 469.72, 430.95),
                     (8, 64, 4, 583.23, 552.78, 475.68, 434.51))


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


# The mask's cost as the median of the nine pairs' ratios (forward 0.876-0.954, backward 0.807-1.007: one shape's
# pair would pick a point of that spread; the rows' own call, 32 heads with K/V repeated to 32, is none of the nine)
MI300X_CAUSAL_RATIO = (_median([c / n for *_, n, c, _, _ in AITER_MI300X_8192]),
                       _median([c / n for *_, n, c in AITER_MI300X_8192]))
MI300X_FLASH_CAUSAL_TFLOPS = (MI300X_FLASH_TFLOPS[0] * MI300X_CAUSAL_RATIO[0],
                              MI300X_FLASH_TFLOPS[1] * MI300X_CAUSAL_RATIO[1])
MI300X_FLASH_SOURCE = (
    f"FlashAttention-2 (CK) on MI300X, ROCm 6.3.2, non-causal, 16384 tokens, head dim 128: forward 353.22, backward "
    f"194.43 TFLOP/s (ROCm/flash-attention#142), x the causal mask's cost on MI300X at 8192 tokens, head dim 128 "
    f"(AITER's nine pairs' median, ROCm/aiter 0403bcdf op_tests/cpp/mha/README.md: forward "
    f"{MI300X_CAUSAL_RATIO[0]:.4f}, backward {MI300X_CAUSAL_RATIO[1]:.4f}) = {MI300X_FLASH_CAUSAL_TFLOPS[0]:.2f} / "
    f"{MI300X_FLASH_CAUSAL_TFLOPS[1]:.2f}; torch's SDPA runs AOTriton there (0.10b in 2025-08 nightlies), no absolute "
    f"figure published for it")
# FlashAttention-2 and FlashAttention (1) on A100 80GB SXM4, fractions of its 312 TFLOP/s BF16 peak (Dao 2023,
# FlashAttention-2, arXiv 2307.08691 §1, summarising its Figs. 5-6: batch x tokens = 16k, hidden 2048, head dim 64 and
# 128, with and without a causal mask, FLOPs counted as attention_tflops counts them): FlashAttention-2 "reaching up to
# 73% of the theoretical max throughput in the forward pass, and up to 63% of the theoretical max throughput in the
# backward pass"; FlashAttention "the forward pass only reaches 30-50% of the theoretical maximum FLOPs/s of the
# device, while the backward pass is even more challenging, reaching only 25-35%". Each kernel read at the top of its
# range, its best case, as the rows' long sequences are (no figure by length is published as text). FlashAttention (1)'s
# rate is read by length from the repository's figures below (FA1_FWD_BWD_TFLOPS); FA1_AMPERE gives its split only
FA2_AMPERE = (0.73, 0.63)
FA1_AMPERE = (0.50, 0.35)
FA2_AMPERE_SOURCE = ("FlashAttention-2 on A100: forward up to 73%, backward up to 63% of the 312 TFLOP/s peak (Dao "
                     "2023, FlashAttention-2, arXiv 2307.08691 §1, its Figs. 5-6)")
# FlashAttention (1) by length, causal, head dim 128, as the FlashAttention-2 release's own figures time it beside
# FlashAttention-2 (Dao-AILab/flash-attention 4f285b35, 2023-07-17, README "Performance": "Head dimension 64 or 128,
# hidden dimension 2048 (i.e. either 32 or 16 heads) ... Batch size set to 16k / seqlen"; assets/
# flash2_a100_fwd_bwd_benchmark.png (A100 80GB SXM4) and flash2_h100_fwd_bwd_benchmark.png (H100 80GB SXM5), panel
# (d) "With causal mask, head dimension 128", the "FlashAttention" bars): forward + backward TFLOP/s at 512 ... 16,384
# tokens, FLOPs counted as the repository's benchmark counts them (benchmarks/benchmark_flash_attention.py 60499abc
# `flops`: 4·s²·heads·d·batch, halved causal, x3.5 forward + backward, over the two passes' time). The same panels'
# FlashAttention-2 bars: A100 99 ... 189, H100 163, 221, 265, 294, 308, 328.
FA1_FWD_BWD_TFLOPS = {
    "a100": ((512, 55.0), (1024, 62.0), (2048, 69.0), (4096, 76.0), (8192, 80.0), (16384, 83.0)),
    "h100": ((512, 98.0), (1024, 109.0), (2048, 108.0), (4096, 126.0), (8192, 135.0), (16384, 137.0)),
}
FA1_FIGURES = ("Dao-AILab/flash-attention 4f285b35 (FlashAttention-2 release) README figures, causal, head dim 128, "
               "the FlashAttention bars")
# FlashAttention (1)'s forward runs faster than its backward: the FlashAttention-2 paper's ranges on A100 (§1, above),
# forward 30-50% and backward 25-35%, read at their tops as FA1_AMPERE is (the published figures are forward +
# backward only; the split is the one the paper states)
FA1_FWD_OVER_BWD = FA1_AMPERE[0] / FA1_AMPERE[1]


def split_fwd_bwd(fwd_bwd_tflops: float, fwd_over_bwd: float) -> tuple[float, float]:
    """(forward, backward) TFLOP/s of a kernel whose forward + backward rate is `fwd_bwd_tflops` (3.5 forward FLOPs over
    the two passes' time, as FlashAttention's benchmark counts it) and whose forward runs `fwd_over_bwd` times its
    backward's rate: 3.5 / R = 1 / F + 2.5 / B with F = rho·B gives F = R (1 + 2.5 rho) / 3.5, B = F / rho."""
    fwd = fwd_bwd_tflops * (1 + 2.5 * fwd_over_bwd) / 3.5
    return fwd, fwd / fwd_over_bwd


def fa1_by_seq(gpu: str, peak_tflops: float) -> tuple[tuple[int, float, float], ...]:
    """FlashAttention (1)'s (tokens, forward, backward) fractions of `peak_tflops` on `gpu` ("a100", "h100") by length
    (FA1_FWD_BWD_TFLOPS split by FA1_FWD_OVER_BWD), as GPU.attention_by_seq holds them."""
    return tuple((seq, *(rate / peak_tflops for rate in split_fwd_bwd(combined, FA1_FWD_OVER_BWD)))
                 for seq, combined in FA1_FWD_BWD_TFLOPS[gpu])


# cuDNN's fused attention as NVIDIA's cudnn-frontend training benchmark times it (benchmark/sdpa_benchmark_training,
# NVIDIA/cudnn-frontend): BF16, head dim 128, 8 K/V heads, 8192 tokens, causal (top_left), ms forward / backward:
# - H200 (the H100's chip), cuDNN 9.19, 64 query heads, batch 1: 1.708 / 5.083 (results/h200_919_only_cudnn/
#   llama3.1_20260227_034703.csv, df73764, 2026-03-09);
# - GB200, cuDNN 9.22.0 (frontend 1.21.1), 64 query heads, batch 2: 1.397 / 4.127, the deterministic backward 4.754
#   (results/llama3.1/gb200/llama3.1_20260424_100750.csv, fb682ce, 2026-04-29); its cuDNN 9.19 run (batch 1, df73764)
#   reads 1,598 / 1,311 TFLOP/s, within 2%;
# - B200, cuDNN 9.13.1 through torch 2.9.0's cuDNN backend (NGC 25.09), 128 query heads, batch 1: 1.877 / 5.833
#   (artifacts/sdpa_bf16_benchmark_results_NVIDIA_B200.csv, 0b1577c, 2025-10-10).
# The FlashAttention-3 paper's earlier H100 figures (529 causal forward, 518 no-mask backward, arXiv 2407.08608
# Fig. 5-6) are an older cuDNN's and have no causal backward (docs/gpus.md §3).
_CUDNN_FRONTEND = "NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training"
CUDNN_H100_TFLOPS = (attention_tflops(1, 64, 8192, 128, 1.708, causal=True, backward=False),
                     attention_tflops(1, 64, 8192, 128, 5.083, causal=True, backward=True))
_CUDNN_H100 = (CUDNN_H100_TFLOPS[0] / 989.4, CUDNN_H100_TFLOPS[1] / 989.4)
_CUDNN_HOPPER = (f"cuDNN 9.19 fused attention on H200 (the H100's chip), causal, 8192 tokens, head dim 128: forward "
                 f"{CUDNN_H100_TFLOPS[0]:.1f}, backward {CUDNN_H100_TFLOPS[1]:.1f} TFLOP/s ({_CUDNN_FRONTEND}, "
                 f"results/h200_919_only_cudnn, df73764); no deterministic backward published for sm90")
CUDNN_HOPPER_CHIP = dict(te_attention_efficiency=_CUDNN_H100, te_attention_source=_CUDNN_HOPPER)
CUDNN_GB200_TFLOPS = (attention_tflops(2, 64, 8192, 128, 1.397, causal=True, backward=False),
                      attention_tflops(2, 64, 8192, 128, 4.127, causal=True, backward=True),
                      attention_tflops(2, 64, 8192, 128, 4.754, causal=True, backward=True))
# cuDNN's fused attention at DeepSeek-V3's latent-attention shape (q/k head dim 192, v head dim 128, 128 query and 128
# K/V heads, batch 2, causal top_left, BF16, non-deterministic backward) on GB200, cuDNN 9.22.0 (frontend 1.21.1):
# forward / backward ms at 2048 to 32768 tokens (the same benchmark, configs/dsv3.py; results/dsv3/gb200/
# dsv3_20260424_101009.csv, 60e572b, the run beside the head-128 figures above). Counted as attention_tflops
# counts them with each head dim its own (forward 2·s²·(192 + 128)·heads·batch, halved causal: the benchmark's own
# forward count, its tflops column; backward 2·s²·(3·192 + 2·128), torch's sdpa_backward_flop_count, 2.6x the
# forward, not flash's 2.5x), which is how the analytic profile counts a latent attention's FLOPs
# (analytic_time._attention, formulas.attention_bwd_flops): the rates are the kernel's time per pass, each pass's
# own (forward alone, backward alone), so a kernel so counted runs in the published milliseconds
_CUDNN_GB200_MLA_MS = ((2048, 0.321, 1.056), (4096, 0.977, 3.383), (8192, 3.470, 11.984), (16384, 13.103, 50.424),
                       (32768, 50.456, 212.546))
CUDNN_GB200_MLA_BY_SEQ = tuple(
    (seq, attention_tflops(2, 128, seq, 192, fwd, causal=True, backward=False, v_head_dim=128) / 2500.0,
     attention_tflops(2, 128, seq, 192, bwd, causal=True, backward=True, v_head_dim=128) / 2500.0)
    for seq, fwd, bwd in _CUDNN_GB200_MLA_MS)
CUDNN_GB200 = dict(
    te_attention_efficiency=(CUDNN_GB200_TFLOPS[0] / 2500.0, CUDNN_GB200_TFLOPS[1] / 2500.0),
    te_attention_deterministic_bwd=CUDNN_GB200_TFLOPS[2] / 2500.0,
    te_attention_source=(f"cuDNN 9.22 fused attention on GB200, causal, 8192 tokens, head dim 128: forward "
                         f"{CUDNN_GB200_TFLOPS[0]:.0f}, backward {CUDNN_GB200_TFLOPS[1]:.0f}, deterministic backward "
                         f"{CUDNN_GB200_TFLOPS[2]:.0f} TFLOP/s ({_CUDNN_FRONTEND}, results/llama3.1/gb200, fb682ce)"),
    te_mla_attention_by_seq=CUDNN_GB200_MLA_BY_SEQ,
    te_mla_attention_source=(f"cuDNN 9.22 fused attention on GB200 at DeepSeek-V3's shape (q/k head 192, v head 128, 128 "
                             f"heads), causal, 2048-32768 tokens: at 4096 forward {CUDNN_GB200_MLA_BY_SEQ[1][1] * 2500:.0f}, "
                             f"backward {CUDNN_GB200_MLA_BY_SEQ[1][2] * 2500:.0f} TFLOP/s ({_CUDNN_FRONTEND}, "
                             f"results/dsv3/gb200/dsv3_20260424_101009.csv, 60e572b)"))
CUDNN_B200_TFLOPS = (attention_tflops(1, 128, 8192, 128, 1.877, causal=True, backward=False),
                     attention_tflops(1, 128, 8192, 128, 5.833, causal=True, backward=True))
CUDNN_B200 = dict(
    te_attention_efficiency=(CUDNN_B200_TFLOPS[0] / 2250.0, CUDNN_B200_TFLOPS[1] / 2250.0),
    te_attention_source=(f"cuDNN 9.13.1 fused attention (torch 2.9.0's cuDNN backend) on B200, causal, 8192 tokens, "
                         f"head dim 128: forward {CUDNN_B200_TFLOPS[0]:.0f}, backward {CUDNN_B200_TFLOPS[1]:.0f} TFLOP/s "
                         f"({_CUDNN_FRONTEND}, artifacts/sdpa_bf16_benchmark_results_NVIDIA_B200.csv, 0b1577c); no "
                         f"deterministic backward published for B200"))
# torch's SDPA flash backend on B200 (the same B200 file's pyt_flash_attention rows, torch 2.9.0, 128 query heads,
# 8 K/V heads, head dim 128, batch 1, causal): forward and backward ms at 512 to 16384 tokens
_SDPA_B200_MS = ((512, 0.115, 0.259), (1024, 0.208, 0.798), (2048, 0.567, 1.844), (4096, 1.692, 5.360),
                 (8192, 5.889, 18.395), (16384, 22.297, 68.724))
SDPA_B200_BY_SEQ = tuple(
    (seq, attention_tflops(1, 128, seq, 128, fwd, causal=True, backward=False) / 2250.0,
     attention_tflops(1, 128, seq, 128, bwd, causal=True, backward=True) / 2250.0)
    for seq, fwd, bwd in _SDPA_B200_MS)
SDPA_B200 = next((fwd, bwd) for seq, fwd, bwd in SDPA_B200_BY_SEQ if seq == 8192)
SDPA_BLACKWELL = (f"torch 2.9.0 SDPA flash backend on B200, causal, 8192 tokens, head dim 128: forward "
                   f"{SDPA_B200[0] * 2250:.1f}, backward {SDPA_B200[1] * 2250:.1f} TFLOP/s ({_CUDNN_FRONTEND}, "
                   f"artifacts/sdpa_bf16_benchmark_results_NVIDIA_B200.csv, 0b1577c)")


# cuDNN's sliding-window attention (the kernel Transformer Engine's FusedAttention runs for a window, GPT-OSS's
# 128 tokens and others) as the same cudnn-frontend benchmark times it (configs/gpt_oss.py): BF16, head dim 64,
# causal top_left with `sliding_window_size` w (each query sees itself and the w - 1 tokens before it), batch 2,
# forward / backward ms at 2048 to 32768 tokens. The benchmark counts FLOPs over the exact pairs the window keeps
# (its tflops column equals windowed_tflops below at every row), so each rate is a fraction of the kernel's own work:
# a windowed kernel runs at about a tenth of the full causal kernel's rate at w 128 (a query block meets one or two
# key blocks, half masked, and the per-block work outside the matmuls dominates).
def windowed_tflops(batch: int, heads: int, seq_len: int, window: int, head_dim: int, latency_ms: float, *,
                    backward: bool) -> float:
    """A published sliding-window timing as TFLOP/s over the exact (query, key) pairs the causal window keeps
    (gptoss.window_pairs: w(w + 1)/2 + (s - w)·w): 4·pairs·d·heads·batch forward, x2.5 backward, as
    attention_tflops counts the full causal kernel."""
    w = min(seq_len, window)
    pairs = w * (w + 1) // 2 + (seq_len - w) * w
    return 4 * pairs * head_dim * heads * batch * (2.5 if backward else 1.0) / (latency_ms * 1e-3) / 1e12


def _windowed(window: int, heads: int, peak: float, rows) -> tuple[tuple[int, int, float, float], ...]:
    return tuple((window, seq, windowed_tflops(2, heads, seq, window, 64, fwd, backward=False) / peak,
                  windowed_tflops(2, heads, seq, window, 64, bwd, backward=True) / peak) for seq, fwd, bwd in rows)


# GB200, window 128 (GPT-OSS's), 128 query and 128 K/V heads, cuDNN 9.22.0 (frontend 1.21.1): results/gpt_oss/gb200/
# gpt_oss_20260424_100011.csv (60e572b, the run beside the head-128 figures above); 32768's forward (104 TFLOP/s) as
# published
_SWA128_GB200_MS = ((2048, 0.109, 0.237), (4096, 0.210, 0.465), (8192, 0.414, 0.911), (16384, 0.822, 1.818),
                    (32768, 2.634, 3.692))
# GB200, window 1024, GPT-OSS's 64 query and 8 K/V heads, cuDNN 9.19: results/gb200_919_only_cudnn/
# gpt_oss_20260226_175022.csv (afa9f7c)
_SWA1024_GB200_MS = ((2048, 0.104, 0.230), (4096, 0.209, 0.487), (8192, 0.423, 0.998), (16384, 0.853, 2.024),
                     (32768, 1.711, 4.099))
# H200 (the H100's chip), window 1024, 64 query and 8 K/V heads, cuDNN 9.19: results/h200_919_only_cudnn/
# gpt_oss_20260227_034819.csv (afa9f7c); no window-128 run published for sm90
_SWA1024_H200_MS = ((2048, 0.166, 0.488), (4096, 0.358, 1.042), (8192, 0.738, 2.149), (16384, 1.499, 4.392),
                    (32768, 3.021, 9.045))
CUDNN_SWA_GB200 = _windowed(128, 128, 2500.0, _SWA128_GB200_MS) + _windowed(1024, 64, 2500.0, _SWA1024_GB200_MS)
CUDNN_SWA_H200 = _windowed(1024, 64, 989.4, _SWA1024_H200_MS)
_SWA_GB200_SOURCE = (f"cuDNN's sliding-window attention on GB200, head dim 64: window 128 (cuDNN 9.22) at 4096 tokens "
                     f"forward {CUDNN_SWA_GB200[1][2] * 2500:.0f}, backward {CUDNN_SWA_GB200[1][3] * 2500:.0f} TFLOP/s "
                     f"(results/gpt_oss/gb200/gpt_oss_20260424_100011.csv, 60e572b); window 1024 (cuDNN 9.19) "
                     f"{CUDNN_SWA_GB200[6][2] * 2500:.0f} / {CUDNN_SWA_GB200[6][3] * 2500:.0f} "
                     f"(results/gb200_919_only_cudnn/gpt_oss_20260226_175022.csv, afa9f7c) ({_CUDNN_FRONTEND})")
CUDNN_SWA_HOPPER = dict(
    te_attention_windowed=CUDNN_SWA_H200,
    te_attention_windowed_source=(
        f"cuDNN 9.19's sliding-window attention on H200 (the H100's chip), window 1024, head dim 64, at 4096 tokens "
        f"forward {CUDNN_SWA_H200[1][2] * 989.4:.0f}, backward {CUDNN_SWA_H200[1][3] * 989.4:.0f} TFLOP/s "
        f"({_CUDNN_FRONTEND}, results/h200_919_only_cudnn/gpt_oss_20260227_034819.csv, afa9f7c); no smaller window "
        f"published for sm90: a smaller window read at 1024's rate, an upper bound (GB200's 128 runs at "
        f"{CUDNN_SWA_GB200[1][2] / CUDNN_SWA_GB200[6][2]:.2f}x its 1024's forward rate)"))
CUDNN_SWA_GB200_CHIP = dict(te_attention_windowed=CUDNN_SWA_GB200, te_attention_windowed_source=_SWA_GB200_SOURCE)
CUDNN_SWA_B200_CHIP = dict(
    te_attention_windowed=CUDNN_SWA_GB200,
    te_attention_windowed_source=f"GB200's fractions of peak, the same Blackwell chip; none published for B200: "
                                 f"{_SWA_GB200_SOURCE}")
# the GPU records take these with the chip's other cuDNN figures
CUDNN_HOPPER_CHIP = {**CUDNN_HOPPER_CHIP, **CUDNN_SWA_HOPPER}
CUDNN_GB200 = {**CUDNN_GB200, **CUDNN_SWA_GB200_CHIP}
CUDNN_B200 = {**CUDNN_B200, **CUDNN_SWA_B200_CHIP}
