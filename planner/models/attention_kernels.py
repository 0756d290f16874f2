"""The flash kernel a job's attention ran, where it is not the one the GPU's attention figures are for.

A GPU's record (planner/models/gpus.py GPU.attention_efficiency, attention_by_seq) holds the rate of the flash kernel
torch's SDPA runs on it (FlashAttention-2 as torch vendors it, or the FlashAttention-2 paper's own figures on A100).
Some jobs ran an older kernel: llm-foundry v0.3.0's MPT under `attn_impl: triton` (its default, and what
scripts/train/benchmarking/submit_benchmarks.py at b2a43a147 ran every published throughput row with) calls
`llmfoundry/models/layers/flash_attn_triton.py`, FlashAttention's Triton port (HazyResearch flash-attention
eff9fe6b's flash_attn_triton.py on triton-pre-mlir, the Triton of 2022-12-02), whose docstring puts it beside
FlashAttention's own CUDA kernel of that day ("Triton forward is generally faster than CUDA forward, while Triton
backward is generally slower ... Overall Triton forward + backward is slightly slower"), and llm-foundry's TUTORIAL.md
at v0.3.0 beside flash-attn 1.0.9 ("`triton` is slightly faster than `flash`"): a FlashAttention-1-class kernel.
It skips the blocks a causal mask hides, as FlashAttention-2 does (the forward's key loop ends at the query block's
diagonal, `end_n`; the backward's query loop starts at the key block's, `begin_m`): the FLOPs are the same causal
half, only the rate differs.

`kernel_gpu` gives the GPU as that kernel runs on it: the kernel's published rate where one is published for the
GPU, else the GPU as it is, with a sentence saying what was not modelled.
"""

from __future__ import annotations

import dataclasses

from planner.models.attention_published import FA1_FIGURES, FA1_FWD_OVER_BWD, fa1_by_seq
from planner.models.gpus import GPU

FLASH2, FLASH1 = "flash2", "flash1"
KERNELS = (FLASH2, FLASH1)
KERNEL_HELP = {
    FLASH2: "FlashAttention-2 (torch's SDPA flash backend, flash-attn 2.x): the GPU's own attention figures",
    FLASH1: "FlashAttention (1): flash-attn 1.x or its Triton port (llm-foundry's attn_impl: triton or flash at "
            "v0.3.0), at FlashAttention's published figures by length where published (A100, H100 SXM)",
}
# the GPUs FlashAttention (1) is published for: the FlashAttention-2 release's A100 80GB SXM4 and H100 80GB SXM5 figures
# (attention_published.FA1_FWD_BWD_TFLOPS), each GPU's record by the figure's chip, at that record's BF16 peak
_FA1_CHIP = {"a100-40g": "a100", "a100-80g": "a100", "h100-sxm": "h100"}


def _flash1(gpu: GPU) -> GPU | None:
    chip = _FA1_CHIP.get(gpu.name)
    if chip is None:
        return None
    by_seq = fa1_by_seq(chip, gpu.bf16_tflops)
    source = (f"FlashAttention (1) on {chip.upper()}: {FA1_FIGURES}, forward + backward at 512-16,384 tokens, split "
              f"forward {FA1_FWD_OVER_BWD:.3f}x the backward's rate (the FlashAttention-2 paper's tops of its "
              "forward 30-50% and backward 25-35% on A100)")
    return dataclasses.replace(gpu, attention_efficiency=by_seq[-1][1:], attention_by_seq=by_seq,
                               attention_windowed=(), attention_source=source)


def kernel_gpu(gpu: GPU, kernel: str) -> tuple[GPU, str]:
    """The GPU as `kernel` runs attention on it, and a sentence where its rate is not published for this GPU (the
    GPU's own figures kept: '' when modelled). FLASH2 is the GPU's own figures."""
    if kernel == FLASH2:
        return gpu, ""
    published = _flash1(gpu)
    if published is None:
        return gpu, (f"--attention-kernel {kernel}: no published rate for {gpu.name}; its FlashAttention-2 figures "
                     f"charged ({gpu.attention_source})")
    return published, ""
