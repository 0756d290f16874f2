"""Which kernel torch's CUDA dispatcher runs for `F.scaled_dot_product_attention` on a GPU, from the call's
shapes alone: a fake profile runs torch's CPU kernels (planner/profiler/fake.py), whose dispatcher decides
otherwise (the CPU's flash kernel wants one head dim for Q, K and V; a latent attention's V is narrower, and
the CPU takes its math path, which keeps the s x s scores), so a profile made for a GPU asks here what the
GPU would run (planner/profiler/device_attention.py runs that kernel's op).

Read from aten/src/ATen/native/transformers/cuda/sdp_utils.cpp (pytorch/pytorch 001f694a, the public
index's copy, whose default order matches torch 2.13.0's ATen/Context.h `sdp_priority_order`: flash,
efficient, math, cuDNN), `select_sdp_backend`, dense bf16/fp16 inputs:

- order: cuDNN first where `check_prefer_cudnn_attention()`: runtime cuDNN > 9.15.0 on compute capability
  9.x or 10.x (built with CUDA >= 13; below 13 only minor 0 or 3); else flash, efficient, math, cuDNN. torch
  2.13.0's PyPI wheel is built on CUDA 13.0.3 and requires nvidia-cudnn-cu13==9.20.0.48 (its requires_dist),
  so on an H100/H200/GH200 (9.0) or B200/GB200 (10.0) cuDNN is tried first. (cuDNN went first on sm90 and
  sm100 in torch 2.9, pytorch#162073; the cuDNN > 9.15 gate came with pytorch#171627.)
- cuDNN (`can_use_cudnn_attention`): capability 8.0-12.1, fp16/bf16, dropout a multiple of 1/16, no
  deterministic mode; `check_cudnn_tensor_shapes`: head dims (d_qk, d_v) at most 128, or at most 192 where
  d_qk = 192 and d_v = 128 on 9.0/10.x with cuDNN >= 9.11 (DeepSeek-V3's latent attention), at most 256 with
  cuDNN > 9.22 and a frontend >= 1.24; both multiples of 8; key length not 1; GQA and MQA accepted;
  `check_cudnn_d256_bprop_head_dim` (cuDNN > 9.22 only) limits the backward to (<=128, <=128), (192, 128),
  (256, 256).
- flash (`can_use_flash_attention`): no attention mask; Q, K and V of one head dim, at most 256;
  capability 8.0-12.1; on 8.6-8.9 and 12.x with a gradient, head dim at most 192 or (no dropout) above 224;
  causal only with as many queries as keys; fp16/bf16; GQA accepted.
- efficient (`can_use_mem_efficient_attention`): capability 5.0-12.1; Q and K of one head dim, V's may
  differ; both multiples of the GEMM alignment (8 for fp16/bf16 on 8.0+); a mask allowed; GQA accepted since
  pytorch#191085 (2026-07-25), whose presence in 2.13.0 is not checked here: without it a grouped call this
  kernel would take (a mask, or V's head dim differing, with fewer K/V heads) falls to math. No model profiled
  here takes that path (transformers passes enable_gqa only with no mask and equal head dims).
- math otherwise: the s x s scores, as the CPU's math path.
"""

from __future__ import annotations

from dataclasses import dataclass

FLASH, EFFICIENT, CUDNN, MATH = "flash", "efficient", "cudnn", "math"
SDP_UTILS = "aten/src/ATen/native/transformers/cuda/sdp_utils.cpp select_sdp_backend (pytorch 001f694a)"
# torch 2.13.0's PyPI wheel (CUDA 13.0.3) requires nvidia-cudnn-cu13==9.20.0.48: cuDNN's runtime version as
# versionRuntimeCuDNN() reports it (major * 10000 + minor * 100 + patch)
TORCH_CUDNN = 92000
CUDNN_FRONTEND_D256 = False  # kCuDNNFrontendSupportsD256 needs cuDNN > 9.22 at run time anyway: off at 9.20

# compute capability x 10 of ckplan's NVIDIA GPUs where gpus.GPU.cuda_arch leaves it 0 (NVIDIA's CUDA GPUs
# table: H100, H200, GH200 9.0; L4 8.9); AMD's run ROCm's dispatcher, not this one (None)
_CAPABILITY = {"h100": 90, "h200": 90, "gh200": 90, "l4": 89, "a100": 80, "b200": 100, "gb200": 100}


@dataclass(frozen=True)
class Call:
    """What select_sdp_backend reads of one call: shapes (batch, heads, length, head dim), dtype name."""

    query: tuple[int, int, int, int]
    key: tuple[int, int, int, int]
    value: tuple[int, int, int, int]
    dtype: str = "bfloat16"
    has_mask: bool = False
    dropout: float = 0.0
    is_causal: bool = False
    requires_grad: bool = True


def capability(gpu) -> int | None:
    """The GPU's compute capability x 10, None for a GPU that does not run CUDA (mi300x)."""
    if getattr(gpu, "cuda_arch", 0):
        return gpu.cuda_arch
    return next((cc for prefix, cc in _CAPABILITY.items() if gpu.name.startswith(prefix)), None)


def prefers_cudnn(cc: int, cudnn: int = TORCH_CUDNN) -> bool:
    """check_prefer_cudnn_attention on a CUDA 13 build."""
    return cudnn > 91500 and cc // 10 in (9, 10)


def order(cc: int, cudnn: int = TORCH_CUDNN) -> tuple[str, ...]:
    return (CUDNN, FLASH, EFFICIENT, MATH) if prefers_cudnn(cc, cudnn) else (FLASH, EFFICIENT, MATH, CUDNN)


def _half(call: Call) -> bool:
    return call.dtype in ("bfloat16", "float16")


def _gqa_ok(call: Call) -> bool:
    heads, kv_heads = call.query[1], call.key[1]
    return kv_heads == call.value[1] and kv_heads > 0 and heads % kv_heads == 0


def can_cudnn(call: Call, cc: int, cudnn: int = TORCH_CUDNN) -> bool:
    if not (80 <= cc <= 121 and _half(call) and call.dropout * 16 == int(call.dropout * 16) and _gqa_ok(call)):
        return False
    d_qk, d_v, sm90_10x = call.query[3], call.value[3], cc == 90 or cc // 10 == 10
    limit = 128
    if sm90_10x and cudnn > 92200 and CUDNN_FRONTEND_D256:
        limit = 256
    elif sm90_10x and cudnn >= 91100 and (d_qk, d_v) == (192, 128):
        limit = 192
    if d_qk > limit or d_v > limit or d_qk % 8 or d_v % 8 or call.key[2] == 1:
        return False
    return True


def can_flash(call: Call, cc: int) -> bool:
    d_q, d_k, d_v = call.query[3], call.key[3], call.value[3]
    if call.has_mask or not (d_q == d_k == d_v <= 256) or not 80 <= cc <= 121 or not _half(call):
        return False
    if call.requires_grad and (86 <= cc <= 89 or 120 <= cc <= 121):
        if not (d_q <= 192 or (call.dropout == 0 and d_q > 224)):
            return False
    if call.is_causal and call.query[2] != call.key[2]:
        return False
    return _gqa_ok(call)


def can_efficient(call: Call, cc: int) -> bool:
    d_q, d_k, d_v = call.query[3], call.key[3], call.value[3]
    align = 8 if _half(call) and cc >= 80 else 4
    return 50 <= cc <= 121 and d_q == d_k and d_q % align == 0 and d_v % align == 0 and d_q > 0 and d_v > 0 \
        and _gqa_ok(call)


def backend(call: Call, cc: int, cudnn: int = TORCH_CUDNN) -> str:
    """The kernel select_sdp_backend returns for `call` on compute capability `cc`."""
    checks = {CUDNN: lambda: can_cudnn(call, cc, cudnn), FLASH: lambda: can_flash(call, cc),
              EFFICIENT: lambda: can_efficient(call, cc), MATH: lambda: True}
    return next(name for name in order(cc, cudnn) if checks[name]())
