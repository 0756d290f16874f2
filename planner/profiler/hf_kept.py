"""What Hugging Face transformers' eager modeling code keeps for backward beyond the analytic block terms
(planner/profiler/analytic_kept.py, which counts fused norms and rotary as Megatron-core and Transformer
Engine run them), term by term: the gap between a `--fake` profile of a Hugging Face config and the
`--arch-config` profile of the same config (scripts/analytic_vs_fake.py), traced tensor by tensor with
scripts/fake_saved_tensors.py. Read in transformers 5.24.0 (the installed one):

- RMSNorm (Qwen2RMSNorm, LlamaRMSNorm, DeepseekV3RMSNorm, Qwen3's q/k norms): `hidden_states.to(float32)`,
  then `pow(2)` saves that fp32 copy (4 B an element), `hidden_states * rsqrt(...)` the copy and 1/rms, and
  `self.weight * hidden_states.to(input_dtype)` the normalised bf16 tensor (2 B); the output is the next
  op's input, as in the analytic count. The fused kernel keeps the bf16 input (2 B) and 1/rms: +4 B an
  element of each norm (models/qwen2/modeling_qwen2.py Qwen2RMSNorm.forward; the same in llama, qwen3,
  deepseek_v3).
- rotary: `apply_rotary_pos_emb` multiplies by the cos and sin tables (cast to the activations' dtype), and
  the products save them: two bf16 tables of batch x seq x width per block (width: the head dim for
  llama-style models; DeepSeek-V3's `apply_rotary_pos_emb_interleave` multiplies by halves of its rope-wide
  tables, `torch.cat([q1 * cos - q2 * sin, ...])`, views that keep the whole tables); the analytic count keeps
  nothing of rotary (fused or in place).
- latent attention (DeepseekV3Attention.forward): `k_nope, value_states = torch.split(kv_b_proj(...), ...)`
  makes V a view of the up projection's whole output, so the attention kernel's saved V keeps the K nope
  part's storage too (+2 B x heads x qk_nope_head_dim a token); the query is a `torch.cat`, laid out
  (batch, heads, seq, dim), so the kernel's output is too (torch's alloc_with_matching_layout, cuDNN's and
  the efficient kernel's) and `attn_output.transpose(1, 2).reshape(...)` copies it for o_proj, which keeps
  the copy while the kernel keeps its output (+2 B x heads x v_head_dim a token); and the fused kernel's
  RNG seed and offset, two int64 scalars (16 B).
"""

from __future__ import annotations

from planner.models.archs import Arch
from planner.profiler.analytic_kept import Term
from planner.profiler.formulas import Shape, kv_width, q_width

TRANSFORMERS = "transformers 5.24.0"
EAGER_NORM_EXTRA = 4  # bytes an element: fp32 copy (4) and normalised bf16 (2) against the bf16 input (2)
# Gemma's norm (GemmaRMSNorm, Gemma3RMSNorm: `self._norm(x.float()) * (1.0 + self.weight.float())`, then
# `.type_as(x)`; models/gemma3/modeling_gemma3.py 125-133): the fp32 copy (4) and the fp32 normalised output the
# scale's product saves (4) against the bf16 input (2), and the product's other factor, 1 + weight in fp32
GEMMA_NORM_EXTRA, GEMMA_NORM_WEIGHT = 6, 4


def _norm_widths(arch: Arch, shape: Shape) -> list[tuple[str, int, int]]:
    """Each norm of a block: (name, elements a token, its weight's width)."""
    h = arch.hidden_size
    widths = [("attention norm", h, h), ("MLP norm", h, h)]
    if arch.post_norms:  # Gemma 3's post_attention_layernorm and post_feedforward_layernorm
        widths += [("post-attention norm", h, h), ("post-MLP norm", h, h)]
    if arch.mla:
        widths += [(f"latent norm of width {rank}", rank, rank) for rank in (arch.q_lora_rank, arch.kv_lora_rank) if rank]
    elif arch.qk_norm:
        widths += [("q norm", q_width(arch, shape), arch.head_size), ("k norm", kv_width(arch, shape), arch.head_size)]
    return widths


def _norm_term(arch: Arch, name: str, elements: int, width: int) -> Term:
    """One eager norm's bytes beyond the fused norm's input and statistics, over `elements` of `width` each."""
    if arch.fp32_norm_scale:
        return Term(f"{name}: eager fp32 copy, fp32 normalised output and 1 + weight",
                    GEMMA_NORM_EXTRA * elements + GEMMA_NORM_WEIGHT * width,
                    f"{TRANSFORMERS} Gemma3RMSNorm.forward: fp32 through the (1 + weight) scale")
    return Term(f"{name}: eager fp32 copy and normalised output", EAGER_NORM_EXTRA * elements,
                f"{TRANSFORMERS} RMSNorm.forward: fp32 copy and normalised bf16 kept, not the bf16 input")


def extra_terms(arch: Arch, shape: Shape) -> list[Term]:
    """What a transformers eager block keeps beyond analytic_kept.block_terms (the module docstring), bf16,
    no tensor parallelism."""
    tokens, d = shape.tokens, shape.d
    terms = [_norm_term(arch, name, tokens * width, weight) for name, width, weight in _norm_widths(arch, shape)]
    if arch.rotates or arch.mla:  # a NoPE layer (SmolLM3's) rotates nothing
        width = arch.qk_rope_head_dim if arch.mla else arch.head_size
        terms.append(Term("rotary cos and sin tables (the products save them)", 2 * tokens * width * d,
                          f"{TRANSFORMERS} apply_rotary_pos_emb"))
    if arch.mla:
        heads = arch.num_heads
        terms += [
            Term("K nope part of the up projection's output (V is a view of it)", tokens * heads * arch.qk_nope_head_dim * d,
                 f"{TRANSFORMERS} DeepseekV3Attention: torch.split of kv_b_proj's output"),
            Term("attention output copied for o_proj (the kernel keeps its own)", tokens * heads * arch.v_head_dim * d,
                 f"{TRANSFORMERS} DeepseekV3Attention: transpose(1, 2).reshape of a (b, h, s, d) output"),
            Term("fused kernel's RNG seed and offset", 16, "aten _scaled_dot_product_cudnn_attention's outputs"),
        ]
    return terms
