"""Memory-bound kernels' achieved bandwidth per GPU architecture, each from a published benchmark (the GPU
records in gpus.py read them; planner/profiler/membound.py times memory-bound ops by them)."""

from __future__ import annotations

# Memory-bound kernels' achieved bandwidth as fractions of the datasheet's (eager, fused), derived by
# scripts/membound_rates.py from Liger-Kernel's published benchmark medians (docs/gpus.md "Memory-bound
# kernels"): per architecture, the harmonic mean over its benchmark sweeps of the forward+backward rate between
# the two largest sizes, over each row's own GPU's datasheet bandwidth. Eager: Hugging Face's RMSNorm, torch's
# LayerNorm and cross entropy, HF's rotary, eager SwiGLU, counted by the fake profiler (H100 NVL and SXM: 0.633,
# 0.422, 0.464, 0.391, 0.429, 0.633; A100 SXM and PCIe: 0.733, 0.416, 0.583, 0.426, 0.757, 0.432, 0.589, 0.446).
# Fused: the same ops under torch.compile, counted by inductor (H100 NVL: 0.426, 0.598, 0.400, 0.418; A100 PCIe:
# 0.433, 0.536, 0.502, 0.344); Transformer Engine's kernels are not in the data and take this rate (assumed)
MEMBOUND_H100 = (0.477, 0.449)
MEMBOUND_A100 = (0.519, 0.441)
# The eager fraction per op class (planner/profiler/membound.py OP_CLASSES), each the harmonic mean of that
# class's own full sweeps as above (scripts/membound_rates.py's per-class summary): norm Hugging Face's
# RMSNorm; layer_norm torch's LayerNorm; attention HF's rotary; activation eager SwiGLU (`megatron_swiglu`'s
# torch row, H100 SXM); loss cross entropy; elementwise torch's relu then square (`relu_squared`'s torch row,
# H100 SXM, all_benchmark_data.csv at 2120862b: 28 B an element, 0.940 GB more at 16,384 columns than at 8,192
# in 0.304 ms). A class the architecture has no sweep of (the A100's activation and elementwise) reads the
# eager mean above.
MEMBOUND_CLASSES_H100 = (("activation", 0.633), ("attention", 0.464), ("elementwise", 0.922), ("layer_norm", 0.425),
                         ("loss", 0.391), ("norm", 0.633))
MEMBOUND_CLASSES_A100 = (("attention", 0.586), ("layer_norm", 0.424), ("loss", 0.436), ("norm", 0.745))
# B200: Liger-Kernel's all_benchmark_data_cutile.csv and _cutedsl.csv at 7a12e092 (benchmark/scripts at that
# commit: a LLaMA-3-8B-wide op over 1,024-8,192 tokens), of the HGX B200's 8 TB/s, the same way: torch's LayerNorm
# (bf16) 0.165, HF's rotary 0.224, cross entropy 0.557 / 0.555 (the two files), the benchmark's NaiveAddRMSNorm
# (an fp32 residual add, then HF's RMSNorm chain) 0.471 for norm, and TorchDyT (gamma * tanh(alpha * x) [+ beta],
# without and with beta) 0.454 / 0.453 for elementwise, read for its class only as relu_squared is; no SwiGLU
# alone (activation reads the eager mean) and no torch.compile row of an op ckplan counts (fused: the H100's,
# assumed)
MEMBOUND_B200 = (0.308, MEMBOUND_H100[1])
MEMBOUND_CLASSES_B200 = (("attention", 0.224), ("elementwise", 0.453), ("layer_norm", 0.165), ("loss", 0.556),
                         ("norm", 0.471))
# MI300X: Liger-Kernel's all_benchmark_data.csv at a054fafd (2024-10-27, "add MI300X benchmark data",
# liger 0.3.1; a commit of pull request #326's branch, never in main's file), of the MI300X's 5.3 TB/s, the
# same way: HF's RMSNorm 0.478, torch's LayerNorm (fp32) 0.251, HF's rotary 0.475, cross entropy 0.330
# (scripts/membound_rates.py --eager-only); no SwiGLU alone (its `swiglu` rows time LLaMA's whole MLP,
# matmuls included: activation reads the eager mean), no torch.compile row of an op ckplan counts (fused:
# the H100's, assumed). No elementwise row either: that class reads BabelStream's Add on MI300X (a[i] =
# b[i] + c[i], HIP, 2^28 doubles: 3,956,389.991 MB/s; AMD's acceptance guide, ROCm/system-acceptance-docs
# b754ce72 docs/mi300x/performance-bench.rst, its expected output), a HIP kernel taken for torch's
# elementwise ops (assumed), for its class only as relu_squared is on the H100
MEMBOUND_MI300X = (0.357, MEMBOUND_H100[1])
BABELSTREAM_ADD_MI300X_TBPS = 3.956389991
MEMBOUND_CLASSES_MI300X = (("attention", 0.475), ("elementwise", round(BABELSTREAM_ADD_MI300X_TBPS / 5.3, 3)),
                           ("layer_norm", 0.251), ("loss", 0.330), ("norm", 0.478))
# Megatron-LM's own cross-entropy chains, timed whole: Liger-Kernel's benchmark_megatron_cross_entropy.py (added in
# 0400d313 / 80f19ad7, 2026-06) calls megatron-core's vocab_parallel_cross_entropy (unfused) and
# fused_vocab_parallel_cross_entropy (--cross-entropy-loss-fusion's native path) on bf16 logits (S 2048, B 4, V), TP 1,
# forward and backward ("full"), and all_benchmark_data.csv at 2120862b holds the medians on "NVIDIA H100 80GB HBM3":
# unfused 10.667474746704102 ms at V 65,536 and 21.245800018310547 at 131,072 (lines 2334-2335), fused
# 8.980452537536621 and 18.230487823486328 (lines 2316-2317). The rate between the two largest (the
# fixed part cancels: 536,870,912 logits more) for the bytes ckplan's records count a bf16 logit (runtime_megatron's
# vocab_parallel_ce_bytes 52, fused_ce_bytes 40: planner/cost/megatron_loss.py), over the SXM's 3.35 TB/s:
# 52 x 536,870,912 B in 10.578 ms = 2.639 TB/s (0.788), 40 x 536,870,912 B in 9.250 ms = 2.322 TB/s (0.693). The
# fractions hold for those byte counts only (tests/test_gpair.py rebuilds the published times from them)
MEGATRON_CE_H100 = (("fused", 0.693), ("unfused", 0.788))
LIGER = "Liger-Kernel benchmark/data (3534d44 h100_/a100_all_benchmark_data.csv, 2120862 all_benchmark_data.csv)"
LIGER_MI300X = ("Liger-Kernel benchmark/data/all_benchmark_data.csv at a054fafd (pull request #326's branch: the AMD "
                 "Instinct MI300X rows, liger 0.3.1)")
LIGER_B200 = "Liger-Kernel benchmark/data at 7a12e092 (all_benchmark_data_cutile.csv, all_benchmark_data_cutedsl.csv)"
