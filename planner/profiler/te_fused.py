"""A dense block's passes as Megatron-core runs them on Transformer Engine's layers: the same matmul
and attention kernels as the eager block (analytic_time.block_work), with the memory-bound ops that
Megatron-core and TE fuse moving what their fused kernels move.

Which ops are fused, and what each kernel reads and writes per element (bf16 activations):
- the norms: Megatron-core's TE layer spec has no separate norm module for the block's two norms
  (`input_layernorm` and `pre_mlp_layernorm` are IdentityOp; TELayerNormColumnParallelLinear runs the
  norm inside linear_qkv and linear_fc1: megatron/core/models/gpt/gpt_layer_specs.py, Megatron-LM
  6e091e1b). TE's LayerNormLinear normalises with one kernel (`apply_normalization`,
  transformer_engine/pytorch/module/layernorm_linear.py 208; rmsnorm_fwd_cuda_kernel.cu, TE v2.9):
  x read (2 B) and the normalised output written (2 B), plus 1/rms per token (4 B; LayerNorm also its
  mean: 8 B); backward one kernel (`tex.rmsnorm_bwd` / `tex.layernorm_bwd`, layernorm_linear.py
  955-966): grad and x read, dx written (6 B), the statistics read per token. Eager RMSNorm with its
  fp32 upcast moves 36 and 96 B (analytic_time.NORM_FWD, NORM_BWD);
- rotary: under `apply_rope_fusion` Megatron-core calls TE's fused_apply_rotary_pos_emb (megatron/core/
  models/common/embeddings/rope_utils.py 21, Megatron-LM d98e8a64; TE transformer_engine/common/
  fused_rope/fused_rope.cu): Q and K read and written once each way (4 B), the table read per token;
  eager rotary moves 20 and 32 B;
- SwiGLU: `bias_swiglu_impl` (megatron/core/fusions/fused_bias_swiglu.py, Megatron-LM 6e091e1b), whose
  functions are `jit_fuser` = torch.compile on torch >= 2.2 (megatron/core/jit.py): forward reads gate
  and up and writes the product (6 B per element of the width-f output), backward reads the gradient
  and both inputs and writes both gradients (10 B); eager SiLU and product move 10 and 18;
- GELU: `bias_gelu_impl` (megatron/core/fusions/fused_bias_gelu.py 15-52, 6e091e1b, jit_fuser as
  above): forward reads the fc1 output and writes the activation (4 B), backward reads the gradient and
  the input and writes the input's gradient (6 B); Hugging Face's gelu_new moves 36 and 56.
Attention runs TE's DotProductAttention, which picks cuDNN's fused attention (FusedAttention,
F16_arbitrary_seqlen) for causal bf16 attention on sm90 and later (transformer_engine/pytorch/attention/
dot_product_attention/utils.py get_attention_backend; common/fused_attn/fused_attn.cpp, TE v2.16): timed
at the GPU's published cuDNN figures (GPU.te_attention_efficiency; the H100's chip only), else at the
GPU's attention figures as the eager block. Under Megatron's --deterministic-mode TE disables
FusedAttention below sm90 and runs cuDNN's deterministic backward on sm90 and later (utils.py 1293-1356,
fused_attn.cpp 459-466, v2.16): no published figure for that backward, so it is timed as the
non-deterministic one (the config reader says so).
Unchanged: the residual adds and dropout (Megatron's fused bias-dropout-add moves what the eager add
does), the weight gradients' accumulation, and every matmul.

Where the recipe turns a fusion off (Megatron-LM `--no-bias-gelu-fusion`, `--no-bias-swiglu-fusion`,
`--no-rope-fusion`, `--transformer-impl local`) the config readers say it; this record is the fused
block. MoE, latent-attention and q/k-norm blocks get no record (their fused kernels were not read).
"""

from __future__ import annotations

import dataclasses

from planner.profiler import analytic_time, formulas
from planner.profiler.roofline import Work, roofline_ms
from planner.schema import CompiledTime, OPTION_FULL

# per element of the normalised tensor, and per token (the statistics), forward and backward
TE_NORM_FWD, TE_NORM_BWD = 4, 6
TE_RMSNORM_TOKEN = 4  # 1/rms (fp32)
ROPE_FUSED_FWD, ROPE_FUSED_BWD = 4, 4
SWIGLU_FUSED_FWD, SWIGLU_FUSED_BWD = 6, 10
GELU_FUSED_FWD, GELU_FUSED_BWD = 4, 6


def fused_bytes_saved(arch, shape) -> tuple[int, int] | None:
    """(forward, backward) bytes the fused kernels move less than the eager block's memory-bound ops
    (analytic_time.block_work); None for a block whose fused kernels were not read."""
    if arch.mla or arch.qk_norm or shape.attention != "flash":
        return None
    T, h = shape.tokens, arch.hidden_size
    rows = T // shape.sp_div
    f = arch.intermediate_size // shape.tp
    if arch.style == "gpt":
        if arch.mlp_act != "gelu":
            return None
        act_fwd, act_bwd = analytic_time.ACT_BYTES["gelu"]
        return (act_fwd - GELU_FUSED_FWD) * T * f, (act_bwd - GELU_FUSED_BWD) * T * f
    norm_fwd = 2 * ((analytic_time.NORM_FWD - TE_NORM_FWD) * rows * h
                    + (analytic_time.NORM_FWD_TOKEN - TE_RMSNORM_TOKEN) * rows)
    norm_bwd = 2 * ((analytic_time.NORM_BWD - TE_NORM_BWD) * rows * h
                    + (analytic_time.NORM_BWD_TOKEN - TE_RMSNORM_TOKEN) * rows)
    rotated = T * (formulas.q_width(arch, shape) + formulas.kv_width(arch, shape))
    rope = ((analytic_time.ROTARY_FWD - ROPE_FUSED_FWD) * rotated, (analytic_time.ROTARY_BWD - ROPE_FUSED_BWD) * rotated)
    swiglu = ((analytic_time.SWIGLU_FWD - SWIGLU_FUSED_FWD) * T * f, (analytic_time.SWIGLU_BWD - SWIGLU_FUSED_BWD) * T * f)
    return norm_fwd + rope[0] + swiglu[0], norm_bwd + rope[1] + swiglu[1]


def te_time(arch, shape, gpu, passes: tuple[Work, Work, Work], *, moe: bool) -> CompiledTime | None:
    """The block's forward, backward and full-recompute rerun (`passes`: analytic_time.block_work's)
    with the fused kernels' bytes and attention at TE's rate (te_attention_gpu); None where no record
    is made (MoE, see fused_bytes_saved)."""
    saved = None if moe else fused_bytes_saved(arch, shape)
    if saved is None:
        return None
    forward, backward, rerun = passes
    kernels_gpu = te_attention_gpu(gpu)

    def less(done: Work, num_bytes: int) -> float:
        return roofline_ms(Work(done.flops, max(done.bytes - num_bytes, 0), done.kernels), kernels_gpu)

    return CompiledTime(fwd_ms=less(forward, saved[0]), bwd_ms=less(backward, saved[1]),
                        recompute_ms={OPTION_FULL: less(rerun, saved[0])})


def te_attention_gpu(gpu):
    """The GPU as TE's attention runs on it: its cuDNN figures in place of its attention figures where
    published (GPU.te_attention_efficiency), else the GPU as it is."""
    if not gpu.te_attention_efficiency:
        return gpu
    return dataclasses.replace(gpu, attention_efficiency=gpu.te_attention_efficiency, attention_by_seq=())
