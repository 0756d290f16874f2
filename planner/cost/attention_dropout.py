"""What attention dropout costs inside Transformer Engine's attention kernels (issue 35; docs/framework-facts.md
§72): the draw of the dropout mask, which the profile's attention rates (published without dropout) leave out.

Megatron-LM drops the attention probabilities at 0.1 unless told (TransformerConfig.attention_dropout) and
TE's DotProductAttention hands the probability to the kernel it runs. Neither kernel keeps an s x s mask:
FlashAttention-2 draws a Philox number per score element inside its forward (flash::Dropout::apply_dropout,
csrc/flash_attn/src/dropout.h: one philox() call, 16 bytes, for 16 elements) and draws the same numbers again
in its backward from the saved seed and offset (flash_api.cpp's rng_state); cuDNN's SDPA likewise keeps only
its seed and offset (TE attention.cpp's rng_state; fused_attn_f16_arbitrary_seqlen.cu). So dropout adds ALU
work per score element to both passes and no bytes. Its cost is read off each kernel's own measurements with
and without dropout, forward + backward of one attention call (p = 0.1, bf16, head dim 128):

- cuDNN's fused attention on sm90 (TE's choice on Hopper, deterministic or not): H200, TE 2.15.0, sbhd,
  4 sequences of 1,024 tokens, 16 heads, 0.594 ms without, 0.614 with (NVIDIA/TransformerEngine#3312);
- cuDNN's on sm100 and later: B300 (sm103), TE 2.14.1, the same shape, 0.480 and 0.525 ms (the same issue);
- FlashAttention-2: GB200, TE 2.17, cuDNN 9.24, flash-attn 2.7.4, the same shape packed (thd), 0.695 and
  0.728 ms (NVIDIA/TransformerEngine#3313, a TE maintainer's measurement). Not published on the A100: the
  same kernels (flash-attn builds its sm80 kernels for every GPU from sm80 on) are assumed to pay the same
  share there.

The ratio (with / without) multiplies the attention the block is charged, forward and backward alike (only
their sum is published): the kernel TE runs for the job (jobsettings.deterministic_attention_kernel under
deterministic mode; else FlashAttention-2 below sm90, cuDNN from sm90) at the rates the cost model times it
(jobsettings.te_attention_ms). The part beyond the kernel is charged: (ratio - 1) x that time, a full
recompute's rerun forward again. A ROCm GPU, a runtime whose layers are not TE's, a model that does not drop
its attention probabilities: nothing.
"""

from __future__ import annotations

from planner.cost import jobsettings, runtimes
from planner.cost.layers import LayerCost
from planner.schema import OPTION_FULL, Profile, TrainSetup

# each kernel's time with attention dropout over its time without, forward + backward (the module's docstring)
CUDNN_SM90_DROPOUT = 0.614 / 0.594  # H200, TE 2.15.0, sbhd (TransformerEngine#3312)
CUDNN_SM100_DROPOUT = 0.525 / 0.480  # B300, TE 2.14.1, sbhd (TransformerEngine#3312)
FLASH2_DROPOUT = 0.728 / 0.695  # GB200, flash-attn 2.7.4 under TE 2.17 (TransformerEngine#3313)


def dropout_ratio(gpu, kernel: str) -> float:
    """The kernel's time with attention dropout over its time without on `gpu` (1: none read)."""
    if gpu.rocm:
        return 1.0
    if kernel == "flash2":
        return FLASH2_DROPOUT
    return CUDNN_SM100_DROPOUT if gpu.cuda_arch >= 100 else CUDNN_SM90_DROPOUT


def te_kernel(gpu, *, deterministic: bool) -> str:
    """The attention TE runs for a training step whose attention drops: under deterministic mode
    jobsettings.deterministic_attention_kernel's; else FlashAttention-2 below sm90 (TE prefers it to
    FusedAttention there) and cuDNN's from sm90 ("Select FusedAttention for performance", dot_product_
    attention/utils.py 1411-1420, TE e7c550c5; a Hopper record reads cuda_arch 0)."""
    if deterministic:
        return jobsettings.deterministic_attention_kernel(gpu, drops_attention=True)
    return "flash2" if 0 < gpu.cuda_arch < 90 else "cudnn"


def attention_dropout_ms(layer: LayerCost, ckpt, profile: Profile, setup: TrainSetup) -> float:
    """ms per microbatch the attention dropout's draws add to a dense block's attention kernels (the module's
    docstring); 0 where the block's attention does not drop, the runtime's layers are not Transformer
    Engine's, or the profile does not describe its model."""
    training = setup.training
    if runtimes.of(training).fused_kernels != "transformer-engine":
        return 0.0
    found = jobsettings.te_attention(profile, layer)
    if found is None or not found[1]:
        return 0.0
    gpu = found[0]
    kernel = te_kernel(gpu, deterministic=training.deterministic)
    ratio = dropout_ratio(gpu, kernel)
    if ratio == 1.0:
        return 0.0
    fwd_ms, bwd_ms = jobsettings.te_attention_ms(profile, gpu, kernel, deterministic=training.deterministic)
    reruns = 1 if layer.options[int(ckpt)].name == OPTION_FULL else 0
    return (ratio - 1) * (fwd_ms * (1 + reruns) + bwd_ms)
