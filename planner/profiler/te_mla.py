"""A latent-attention (MLA) block's memory-bound bytes and attention rate as Megatron-core runs it on
Transformer Engine (te_fused.te_time's record for an MLA block, dense or MoE). Read at Megatron-LM d98e8a64
(docs/framework-facts.md §101):

- the TE layer spec without `mla_down_proj_fusion` (megatron/core/models/gpt/gpt_layer_specs.py 244-318):
  `input_layernorm` is TE's norm (`backend.layer_norm`, one kernel each way), linear_q_down_proj and
  linear_kv_down_proj are TELinear (two GEMMs, no norm), linear_q_up_proj and linear_kv_up_proj are
  TELayerNormColumnParallelLinear under --qk-layernorm (the latent norms run inside them, TE's fused
  RMSNorm: `q_layernorm` / `kv_layernorm` are IdentityOp), the core is TEDotProductAttention, linear_proj
  TERowParallelLinear; a MoE block's `pre_mlp_layernorm` is TE's norm, a dense block's is fused into
  linear_fc1. So every norm of the block moves TE's 4 / 6 B an element and 1/rms per row (te_bytes), where
  the eager count is 36 / 96 B and 28 / 44 B a row (analytic_time.NORM_*).
- rotary under `--apply-rope-fusion` (multi_latent_attention.py 706-716, 888-912; megatron/core/fusions/
  fused_mla_yarn_rope_apply.py): `fused_apply_mla_rope_for_q` rotates the trailing qk_pos_emb_head_dim of
  each query head in place (read and write 2 + 2 B an element of Q's rotary part, each way: the backward
  kernel rotates the gradient in place, `_mla_rope_bwd_inplace_kernel`); `fused_apply_mla_rope_for_kv`
  (`_mla_rope_fwd_kv_split_kernel`) reads linear_kv_up_proj's output (heads x (qk_head_dim + v_head_dim))
  and the shared k_pos_emb (qk_pos_emb_head_dim), writes the key (heads x (qk_head_dim + qk_pos_emb_head_dim),
  the rotated k_pos_emb broadcast to every head) and the value (heads x v_head_dim); its backward
  (`_mla_rope_bwd_kv_split_kernel`) reads dK and dV and writes dKV and dk_pos_emb. The eager count
  (analytic_time._projections) charges rotary's 20 / 32 B on Q's and the shared K's rotary parts and
  transformers' query cat, key build and output copy (hf_mla.py), which these kernels replace.
- the core runs cuDNN's fused attention (TE picks FusedAttention F16_arbitrary_seqlen where q/k and v head
  dims differ: FlashAttention-2 requires them equal): timed at the GPU's published cuDNN figures at that
  shape where published (GPU.te_mla_attention_by_seq: NVIDIA/cudnn-frontend's DeepSeek-V3 configuration),
  else at its head-128 cuDNN figures (te_fused.te_attention_gpu), else its attention figures.
Unchanged: the GEMMs (each latent projection its own kernel, as the eager count has them), the gradient sum
at the block input where the two down projections meet, the residual adds.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from planner.models.attention_rates import te_attention_gpu
from planner.profiler import analytic_time, hf_mla, te_bytes
from planner.profiler.norm_bytes import rms_norm


def _rope_elements(arch, shape) -> tuple[int, int]:
    """(Q's rotary elements, the key/value split's per-token widths read and written) on the device."""
    heads = arch.num_heads // shape.tp
    return shape.tokens * heads * arch.qk_rope_head_dim, heads


def rope_fused_bytes(arch, shape) -> tuple[int, int]:
    """(forward, backward) bytes of Megatron's fused MLA rotary kernels (the module docstring): Q's rotary
    part in place (4 B an element each way), the key/value split (kv read, key and value written, k_pos_emb
    read; backward dK and dV read, dKV and dk_pos_emb written: the same count), bf16."""
    q_rot, heads = _rope_elements(arch, shape)
    nope, rope, v = arch.qk_nope_head_dim, arch.qk_rope_head_dim, arch.v_head_dim
    per_token = 2 * heads * (nope + v) + 2 * heads * (nope + rope + v) + 2 * rope
    split = shape.tokens * per_token
    return 4 * q_rot + split, 4 * q_rot + split


def latent_norm_elements(arch, shape) -> tuple[int, int]:
    """(elements, rows) of the latent norms (the q latent's where there is one, the kv latent's)."""
    T = shape.tokens
    return T * (arch.q_lora_rank + arch.kv_lora_rank), T * (1 + bool(arch.q_lora_rank))


def eager_classes(arch, shape) -> tuple[Counter, Counter]:
    """(forward, backward) bytes by op class (membound.OP_CLASSES) the eager count gives what these kernels
    replace, as analytic_time._projections classes them: the latent norms (norm) and rotary (attention), and
    transformers' query cat, key build and output copy with their gradients' copies (hf_mla.py's classes: the
    fused rotary writes the key and value and rotates the query in place; TE's attention takes and gives sbhd
    tensors)."""
    elements, _ = latent_norm_elements(arch, shape)
    rotated = shape.tokens * (arch.num_heads // shape.tp * arch.qk_rope_head_dim + arch.qk_rope_head_dim)
    norm = rms_norm(arch)
    return (Counter(norm=norm.fwd * elements, attention=analytic_time.ROTARY_FWD * rotated)
            + hf_mla.forward_bytes(arch, shape),
            Counter(norm=norm.bwd * elements, attention=analytic_time.ROTARY_BWD * rotated)
            + hf_mla.backward_bytes(arch, shape))


def eager_bytes(arch, shape) -> tuple[int, int]:
    """(forward, backward) bytes the eager count gives what these kernels replace (eager_classes' sums)."""
    fwd, bwd = eager_classes(arch, shape)
    return sum(fwd.values()), sum(bwd.values())


def fused_bytes(arch, shape) -> tuple[int, int]:
    """(forward, backward) bytes of the latent norms on TE's fused RMSNorm and the fused MLA rotary."""
    elements, rows = latent_norm_elements(arch, shape)
    rope = rope_fused_bytes(arch, shape)
    stats = te_bytes.TE_RMSNORM_TOKEN * rows
    return (te_bytes.TE_NORM_FWD * elements + stats + rope[0], te_bytes.TE_NORM_BWD * elements + stats + rope[1])


def saved_bytes(arch, shape) -> tuple[int, int]:
    """(forward, backward) bytes the fused latent norms and rotary move less than the eager count (negative
    where they move more: the key/value split the eager count leaves out)."""
    eager, fused = eager_bytes(arch, shape), fused_bytes(arch, shape)
    return eager[0] - fused[0], eager[1] - fused[1]


def attention_gpu(gpu):
    """The GPU as TE's attention runs a latent attention on it: its cuDNN figures at the MLA shape by length
    where published, else te_fused.te_attention_gpu's."""

    if not gpu.te_mla_attention_by_seq:
        return te_attention_gpu(gpu)
    points = gpu.te_mla_attention_by_seq
    near = min(points, key=lambda point: abs(point[0] - 8192))  # the one-figure fallback: the 8192-token point
    return dataclasses.replace(gpu, attention_efficiency=near[1:], attention_by_seq=points)
