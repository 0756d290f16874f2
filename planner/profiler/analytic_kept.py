"""What a block keeps for backward, term by term, and the recompute options that keep less.

The derivations (Korthikanti et al. 2022 §4, the LLaMA-style variant, mixture of experts and
latent attention) are in planner/profiler/analytic.py's docstring; analytic.py builds the
layers and the profile from these terms.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from planner.models.archs import GPU, Arch
from planner.profiler import analytic_split, analytic_time, gptoss_kept, opsac
from planner.profiler.activations import ACTIVATIONS, freed_by_rerun
from planner.profiler.formulas import INDEX_BYTES, Shape, _is_moe, expert_tokens, kv_width, q_width
from planner.profiler.membound import membound_ms
from planner.schema import OPTION_OFFLOAD, RecomputeOption

FP32 = 4
MASK_BYTES = 1  # dropout masks are bool

KORTHIKANTI = "Korthikanti et al. 2022, §4"
FLASH = "Dao 2023 (FlashAttention-2)"
FUSED_NORM = "fused norm kernels (Apex, Transformer Engine): 1/std per token"


@dataclass(frozen=True)
class Term:
    what: str  # the tensor(s) counted
    num_bytes: int
    source: str


# ---------------------------------------------------------------- kept bytes


def _norm_terms(arch: Arch, shape: Shape, which: str) -> list[Term]:
    sb, d, r = shape.tokens, shape.d, shape.sp_div
    stats = 1 if arch.style == "llama" else 2  # RMSNorm: 1/rms; LayerNorm: mean and 1/std
    return [
        Term(f"{which} norm input", sb * arch.hidden_size * d // r, f"{KORTHIKANTI}: LayerNorm input 2sbh"),
        Term(f"{which} norm statistics (fp32 per token)", stats * FP32 * sb // r, FUSED_NORM),
    ]


def _post_norm_terms(arch: Arch, shape: Shape, which: str) -> list[Term]:
    """Gemma 3's norm on the attention's or the MLP's output before the residual add (Arch.post_norms): its input,
    the output projection's output, and 1/rms, as any fused norm keeps (the output goes to the add, which keeps
    nothing)."""
    if not arch.post_norms:
        return []
    return [Term(f"post-{term.what}", term.num_bytes, term.source) for term in _norm_terms(arch, shape, which)]


def _attention_core_terms(arch: Arch, shape: Shape, out_width: int) -> list[Term]:
    """What attention itself keeps beyond Q, K and V: scores (eager) or statistics (flash),
    and the output projection's input (`out_width` per token on this device)."""
    s, b, d, t = shape.seq_len, shape.micro_batch_size, shape.d, shape.tp
    heads, sb = arch.num_heads // t, shape.tokens  # under context parallelism the rank's s / cp tokens
    out = Term("attention output (output projection input)", sb * out_width * d,
               f"{KORTHIKANTI}: output projection input 2sbh")
    if shape.attention == "flash":
        return [Term("softmax statistics, logsumexp (fp32 per head and token)", FP32 * heads * sb, FLASH), out]
    terms = [Term("softmax output (attention scores)", d * heads * s * s * b, f"{KORTHIKANTI}: softmax output 2as²b")]
    if arch.drops_attention:
        terms += [
            Term("attention-score dropout mask", MASK_BYTES * heads * s * s * b, f"{KORTHIKANTI}: dropout mask as²b"),
            Term("attention-score dropout output", d * heads * s * s * b, f"{KORTHIKANTI}: dropout output 2as²b"),
        ]
    return terms + [out]


def gqa_terms(arch: Arch, shape: Shape) -> list[Term]:
    """Grouped-query attention after its norm: the shared Q/K/V input, Q at a·hd, K and V at
    kv·hd (Qwen3 first normalises each head's q and k: the norms keep their inputs and 1/rms)."""
    sb, d, r, h = shape.tokens, shape.d, shape.sp_div, arch.hidden_size
    q, kv = q_width(arch, shape), kv_width(arch, shape)
    return [
        Term("Q/K/V projection input (norm output)", sb * h * d // r, f"{KORTHIKANTI}: QKV input 2sbh"),
        *qk_norm_terms(arch, shape),
        Term("Q after rotary", sb * q * d, f"{KORTHIKANTI}: Q of QK^T 2sbh"),
        Term("K after rotary (K/V heads only)", sb * kv * d, f"{KORTHIKANTI}: K of QK^T 2sbh, GQA width"),
        Term("V (K/V heads only)", sb * kv * d, f"{KORTHIKANTI}: V 2sbh, GQA width"),
        *_attention_core_terms(arch, shape, q),
        *(Term(*term) for term in gptoss_kept.sink_terms(sb, arch.num_heads // shape.tp, q, d)
          if arch.attention_sinks and not arch.sinks_in_kernel and shape.attention == "flash"),
    ]


def qk_norm_terms(arch: Arch, shape: Shape) -> list[Term]:
    """Per-head q and k norms (Qwen3's q_norm / k_norm; Megatron-core's `q_layernorm` / `k_layernorm` under
    --qk-layernorm, TENorm on the TE spec): each keeps its input (a contiguous copy of the head's q or k, d
    bytes an element) and its statistics, fp32 per head and token: RMSNorm 1/rms, a GPT block's LayerNorm
    mean and 1/std (TransformerEngine v2.16 transformer_engine/pytorch/ops/basic/layer_norm.py 199-221:
    `x = input_.contiguous()`, `save_for_backward(x, means, rstdevs)`). Their outputs are the attention's Q
    and K, counted there."""
    if not arch.qk_norm or arch.mla:
        return []
    elements = shape.tokens * (q_width(arch, shape) + kv_width(arch, shape))
    stats = 1 if arch.style == "llama" else 2
    return [Term("q and k norm inputs (per-head norm)", elements * shape.d, FUSED_NORM),
            Term("q and k norm statistics (fp32 per head and token)",
                 stats * FP32 * elements // arch.head_size, FUSED_NORM)]


def mla_terms(arch: Arch, shape: Shape) -> list[Term]:
    """Multi-head latent attention (DeepSeek-V2 §2.1, as Hugging Face's DeepseekV2Attention and
    Megatron-LM's MLASelfAttention run it), term by term in the block accounting:
    - the down projections' shared input, the norm output (d·sbh, /t under SP);
    - each latent's RMSNorm keeps its input and 1/rms (d·sb·r + 4sb), its output is the up
      projection's input (d·sb·r): the query latent (q_lora_rank; none in V2-Lite, whose q is
      projected from the hidden state) and the K/V latent (kv_lora_rank). The down projections
      are replicated over the tensor-parallel group (Megatron-LM builds them 'duplicated'), so
      the latents are whole on every device;
    - Q: each head's up-projected nope part and its rotated rope part, concatenated
      (d·sb·a·(nope + rope)); K: the up-projected nope part and the one rotated rope part of the
      token copied to every head (the same width); V: d·sb·a·v_head_dim. Rotary keeps nothing
      beyond its output, as in the GQA block;
    - flash's logsumexp and the output O (a·v_head_dim wide), or eager's scores, as for GQA."""
    sb, d, r, h = shape.tokens, shape.d, shape.sp_div, arch.hidden_size
    heads = arch.num_heads // shape.tp
    qk = arch.qk_nope_head_dim + arch.qk_rope_head_dim
    source = "DeepSeek-V2 §2.1 (MLA); norms as " + FUSED_NORM
    latents = [arch.q_lora_rank, arch.kv_lora_rank] if arch.q_lora_rank else [arch.kv_lora_rank]
    return [
        Term("Q and K/V down-projection input (norm output)", sb * h * d // r, f"{KORTHIKANTI}: QKV input 2sbh"),
        *(term for rank in latents for term in (
            Term(f"latent of width {rank}: its norm's input", sb * rank * d, source),
            Term(f"latent of width {rank}: its norm's statistics (fp32 per token)", FP32 * sb, source),
            Term(f"latent of width {rank}: its norm's output (up-projection input)", sb * rank * d, source))),
        Term("Q: nope parts and rotated rope parts, all heads", sb * heads * qk * d, source),
        Term("K: up-projected nope parts and the token's rotated rope part per head", sb * heads * qk * d, source),
        Term("V", sb * heads * arch.v_head_dim * d, source),
        *_attention_core_terms(arch, shape, heads * arch.v_head_dim),
    ]


def _swiglu_terms(tokens: int, width: int, d: int, which: str) -> list[Term]:
    """A SwiGLU MLP of `width` over `tokens` tokens keeps four width-wide tensors: the gate output
    (SiLU's input), SiLU's output and the up output (the product's two factors) and the product
    (the down projection's input), where GELU's 4h MLP keeps two (Korthikanti's 8sbh each)."""
    swiglu = "SwiGLU for the paper's GELU 8sbh"
    return [
        Term(f"{which}gate projection output (SiLU input)", tokens * width * d, swiglu),
        Term(f"{which}SiLU output (first factor)", tokens * width * d, swiglu),
        Term(f"{which}up projection output (second factor)", tokens * width * d, swiglu),
        Term(f"{which}product (down projection input)", tokens * width * d,
             f"{KORTHIKANTI}: second linear input 8sbh, width f"),
    ]


def moe_terms(arch: Arch, shape: Shape) -> list[Term]:
    """A mixture of experts after its norm (whose output, the router's and the experts' shared
    input, the block counts once), for T tokens, E experts, top-k, C = expert_tokens per expert:
    - router: its logits feed a softmax (Mixtral, Qwen, DeepSeek-V2) or sigmoid (DeepSeek-V3)
      whose backward needs only its output, the fp32 probabilities (4·T·E; the logits' linear
      needs its input, counted, and its weight); top-k keeps the chosen experts' indices (int64,
      8·T·k) and the routing weights in fp32 (4·T·k), which the combine multiplies by;
    - dispatch: the tokens gathered for each expert, d·E·C·h (each expert's gate and up input),
      and their token index, one int64 per routed slot (the gather's and the combine's
      backward: 8·E·C);
    - each routed expert, its SwiGLU over its C tokens (4·d·C·f_e), as the dense MLP;
    - combine: each expert's output, scaled by the routing weights, keeps it for the weights'
      gradient (d·E·C·h); the scatter-add back to the tokens keeps only the indices (Megatron-LM's
      unpermute, torchtitan's MoE; Hugging Face's index_add_ keeps the scaled outputs once more,
      torch's index_add saving its source: d·E·C·h not charged here);
    - shared experts: one dense SwiGLU of their summed width over all T tokens (4·d·T·f_s);
      Qwen2-MoE's shared-expert gate keeps its sigmoid output (d·T) and the shared output it
      scales (d·T·h).
    Under TP the experts are tensor-parallel like the dense MLP (expert tensor parallelism = TP,
    no expert parallelism): widths /t, every device holds every routed token; the router's
    tensors are replicated (/t under SP, as the norms)."""
    sb, d, r, h, t = shape.tokens, shape.d, shape.sp_div, arch.hidden_size, shape.tp
    slots = arch.num_experts * expert_tokens(arch, shape)
    k, width = arch.num_experts_per_tok, arch.moe_intermediate_size // t
    shared = arch.num_shared_experts * arch.shared_intermediate_size // t
    router = "router: softmax/sigmoid backward needs its output; top-k its indices"
    experts = f"{slots // arch.num_experts} tokens per expert at capacity factor {shape.capacity_factor:g}"
    return [
        Term("router probabilities (fp32 per token and expert)", FP32 * sb * arch.num_experts // r, router),
        Term("top-k expert indices (int64)", INDEX_BYTES * sb * k // r, router),
        Term("top-k routing weights (fp32)", FP32 * sb * k // r, router),
        Term("dispatched tokens (each expert's gate and up input)", slots * h * d, experts),
        Term("dispatch and combine token indices (int64 per routed slot)", INDEX_BYTES * slots, experts),
        *((Term(*term) for term in gptoss_kept.clamped_swiglu_terms(slots, width, d, "routed experts' "))
          if arch.swiglu_limit else _swiglu_terms(slots, width, d, "routed experts' ")),
        Term("routed experts' outputs (the routing weights' product keeps them)", slots * h * d, experts),
        *(_swiglu_terms(sb, shared, d, "shared experts' ") if shared else []),
        *([Term("shared-expert gate sigmoid output", sb * d, "Qwen2-MoE shared_expert_gate"),
           Term("shared experts' output (the gate's product keeps it)", sb * h * d, "Qwen2-MoE shared_expert_gate")]
          if arch.shared_expert_gate else []),
    ]


def llama_block_terms(arch: Arch, shape: Shape, *, moe: bool | None = None) -> list[Term]:
    """Kept bytes of a LLaMA-style block, term by term (see analytic.py's docstring): GQA or
    latent attention, then a dense SwiGLU MLP or the mixture of experts."""
    sb, d, r, h = shape.tokens, shape.d, shape.sp_div, arch.hidden_size
    mlp = moe_terms(arch, shape) if _is_moe(arch, moe) else _swiglu_terms(sb, arch.intermediate_size // shape.tp, d, "")
    return [
        *_norm_terms(arch, shape, "attention"),
        *(mla_terms(arch, shape) if arch.mla else gqa_terms(arch, shape)),
        *_post_norm_terms(arch, shape, "attention"),
        *residual_dropout_terms(arch, shape, "attention"),
        *_norm_terms(arch, shape, "MLP"),
        Term("MLP input (norm output), shared by gate and up", sb * h * d // r, f"{KORTHIKANTI}: MLP input 2sbh"),
        *mlp,
        *_post_norm_terms(arch, shape, "MLP"),
        *residual_dropout_terms(arch, shape, "MLP"),
    ]


def gpt_block_terms(arch: Arch, shape: Shape) -> list[Term]:
    """Kept bytes of a GPT block, Korthikanti et al.'s terms one by one; with grouped-query
    attention (Megatron-LM's --group-query-attention on a GPT block) K and V at the K/V heads'
    width, as in the LLaMA-style block. Megatron-LM's Transformer Engine layers keep the same:
    LayerNormLinear saves its input, the norm's output, mu and rsigma (TransformerEngine f8a01cd5
    transformer_engine/pytorch/module/layernorm_linear.py 485-495), the fused bias-GeLU its input
    (Megatron-LM 6e091e1b megatron/core/fusions/fused_bias_gelu.py 40), the second linear its
    input, fused attention Q, K, V, O and its softmax statistics (its dropout in-kernel, no mask)."""
    sb, d, r, h, t = shape.tokens, shape.d, shape.sp_div, arch.hidden_size, shape.tp
    f = arch.intermediate_size // t
    q, kv = q_width(arch, shape), kv_width(arch, shape)
    return [
        *_norm_terms(arch, shape, "attention"),
        Term("Q/K/V projection input (norm output)", sb * h * d // r, f"{KORTHIKANTI}: QKV input 2sbh"),
        Term("Q", sb * q * d, f"{KORTHIKANTI}: Q of QK^T 2sbh"),
        Term("K (K/V heads only)", sb * kv * d, f"{KORTHIKANTI}: K of QK^T 2sbh, GQA width"),
        Term("V (K/V heads only)", sb * kv * d, f"{KORTHIKANTI}: V 2sbh, GQA width"),
        *qk_norm_terms(arch, shape),
        *_attention_core_terms(arch, shape, q_width(arch, shape)),
        *residual_dropout_terms(arch, shape, "attention"),
        *_norm_terms(arch, shape, "MLP"),
        Term("MLP input (norm output)", sb * h * d // r, f"{KORTHIKANTI}: first linear input 2sbh"),
        *_activation_terms(arch.mlp_act, sb * f * d),
        *residual_dropout_terms(arch, shape, "MLP"),
    ]


def _activation_terms(act: str, tensor_bytes: int) -> list[Term]:
    """What the MLP keeps between its linears (activations.py): GELU its input and its output
    (Korthikanti's two 8sbh), ReLU only its output, an eager GELU its ops' saved tensors too."""
    if act == "relu":
        return [Term("ReLU output (its own backward's and the second linear's input)", tensor_bytes,
                     f"{KORTHIKANTI}: second linear input 8sbh; ReLU needs only its output")]
    kept = ACTIVATIONS[act].kept
    terms = [Term("GELU output (second linear input)", tensor_bytes, f"{KORTHIKANTI}: second linear input 8sbh")]
    if act in ("gelu", "gelu_kernel"):
        return [Term("GELU input", tensor_bytes, f"{KORTHIKANTI}: GeLU input 8sbh"), *terms]
    return [*(Term(f"{act} as eager ops: saved tensor {i + 1} of {kept - 1}", tensor_bytes,
                   "planner/profiler/activations.py (transformers 5.24 activations.py, torch 2.13)")
              for i in range(kept - 1)), *terms]


def residual_dropout_terms(arch: Arch, shape: Shape, which: str) -> list[Term]:
    """The mask a residual dropout keeps (Korthikanti's sbh; /t under SP), where the model drops."""
    if not arch.drops_residual:
        return []
    return [Term(f"{which} dropout mask", MASK_BYTES * shape.tokens * arch.hidden_size // shape.sp_div,
                 f"{KORTHIKANTI}: dropout mask sbh")]


def block_terms(arch: Arch, shape: Shape, *, moe: bool | None = None) -> list[Term]:
    """`moe`: the block's MLP is the mixture of experts (None: where the model has experts)."""
    return gpt_block_terms(arch, shape) if arch.style == "gpt" else llama_block_terms(arch, shape, moe=moe)


def korthikanti_block_bytes(arch: Arch, shape: Shape) -> float:
    """The paper's closed formulas (16-bit, GELU 4h, dropout, eager), for checking."""
    s, b, h, a, t = shape.seq_len, shape.micro_batch_size, arch.hidden_size, arch.num_heads, shape.tp
    if shape.sp:
        return s * b * h * (34 / t + 5 * a * s / (h * t))
    return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))


def boundary_bytes(arch: Arch, shape: Shape) -> int:
    """A block's input or output (the residual stream): what full recompute keeps,
    Korthikanti's 2sbh (/t with SP)."""
    return shape.tokens * arch.hidden_size * shape.d // shape.sp_div



# ---------------------------------------------------------------- recompute options


def selective_options(arch: Arch, shape: Shape, gpu: GPU, mfu: float | None = None, *, moe: bool = False,
                      fwd_ms: float | None = None, bwd_ms: float | None = None,
                      none_split: tuple[float, float] | None = None) -> tuple[RecomputeOption, ...]:
    """A block's selective recompute options, from its terms: each part below, then every
    combination of them (they recompute at different points of the backward, so a combination's
    extra peak is the largest of its parts', a norm-out norm's output adding to its sub-block's part;
    `mlp` and `mlp-act` do not combine):
    - `core-attn`: the attention core recomputed (Korthikanti et al.'s selective recompute, Megatron-LM's
      --recompute-modules core_attn): its scores, softmax and dropout (eager) or flash's
      logsumexp are not kept; Q, K, V and the output stay (the projections' own tensors). It
      reruns QK^T and scores·V, 4·sb·w·a·hd FLOPs (sliding window w), and holds what it frees
      while it does. Offered where it frees something.
    - `attn`: the attention module checkpointed whole (ckplan's runtime and the fake profile's `attn`, a
      torchtitan export's `attention` submodule; Megatron-LM has no such module option): everything
      the module saves (Q, K, V, the core's tensors and output, Qwen3's q/k norms' inputs and
      statistics) but its input, the norm output, which the checkpoint keeps. It reruns what torch's
      early stop reruns (analytic_time.rerun_work): the projections but the output one, rotary, the core.
      Offered on a GQA block without attention sinks at TP 1 and CP 1 (offers_whole_attention).
    - `mla-up` (latent attention, Megatron-LM's mla_up_proj): the up-projected K and V (and Q
      where it comes from a latent) recomputed from the latents, which stay; under Megatron-core's
      Transformer Engine spec the latent norms run inside the up projections (TELayerNormColumnParallelLinear,
      q_layernorm / kv_layernorm IdentityOp), so the checkpoint frees their outputs and statistics too
      (mla_up_norm_bytes); it reruns the up projections, 2·sb·(r_q·a·(nope + rope) + r_kv·a·(nope + v))
      FLOPs, the latent norms and rotary.
    - `mlp-act`: the MLP's activation recomputed from the matmul outputs it keeps (Megatron-LM's
      activation recompute, moe_act on a MoE block's routed experts; torchtitan's op-level
      checkpointing of the MLP): SwiGLU keeps the gate and up outputs but not SiLU's output nor
      the product; GELU keeps its input, not its output. Memory-bound: its reads and writes
      (gate and up in, SiLU out and product; GELU in and out) over the HBM bandwidth. ReLU (OPT)
      needs its output for its own backward: no option.
    - `mlp` on a MoE block (Megatron-LM's moe): the whole mixture recomputed from its input (the
      MLP norm's output, which stays): router, dispatch, experts, combine and shared experts; it
      reruns their forward (mlp_flops). On a dense block (Megatron-LM's mlp, torchtitan's and
      ckplan's checkpoint of the MLP submodule): the MLP's own tensors (SwiGLU's four, GELU's
      input and output, ReLU's output), its input kept; it reruns its matmuls and activation.
      Megatron-LM's Transformer Engine layer fuses the MLP norm into linear_fc1, so its mlp
      also frees that norm's output and statistics: not counted here (the safe side).
    - `norm-out` (Megatron-LM's layernorm, Megatron-LM d98e8a64 transformer_layer.py 470-531,
      tensor_parallel/random.py CheckpointWithoutOutput): each norm that megatron-core's
      Transformer Engine layer builds as a module of its own runs under no_grad, its output is
      freed once the attention or MLP after it has run and recomputed from its input (kept, the
      residual stream) by a hook on that sub-block's output gradient: its output and statistics
      are not kept. Such a norm is the attention norm of a latent-attention block (unfused down
      projections, mla_down_proj_fusion's default) and the MLP norm of a MoE block
      (gpt_layer_specs.py 244-313); elsewhere the norms are inside LayerNormLinear and it frees
      nothing: offered where it frees something. Each norm's output and statistics are back from
      the start of its sub-block's backward to the norm's backward, while that sub-block's own
      recompute runs: its extra peak adds to theirs. It reruns the norms' forward.
    Each part's rerun is timed by the block's roofline (analytic_time.rerun_work). With `none_split`
    (option none's split backward: input pass, weight pass), each option torch's split can run records
    its own pair: its reruns once in I and once per parameter group inside in W (analytic_split)."""
    d, sb = shape.d, shape.tokens
    out_width = arch.num_heads // shape.tp * arch.v_head_dim if arch.mla else q_width(arch, shape)
    core = sum(term.num_bytes for term in _attention_core_terms(arch, shape, out_width)[:-1])
    terms = block_terms(arch, shape, moe=moe)
    kept = sum(term.num_bytes for term in terms)
    parts: dict[str, tuple[int, float]] = {}  # part: (bytes it frees, ms it adds)
    def rerun_ms(part: str, moe: bool = True) -> float:
        return analytic_time.times_ms((analytic_time.rerun_work(arch, shape, part, moe=moe),), gpu, mfu)[0]

    if core:
        parts["core-attn"] = (core, rerun_ms("core-attn"))
    if offers_whole_attention(arch, shape):
        parts["attn"] = (sum(term.num_bytes for term in gqa_terms(arch, shape)[1:]), rerun_ms("attn"))
    if arch.mla:
        heads, qk = arch.num_heads // shape.tp, arch.qk_nope_head_dim + arch.qk_rope_head_dim
        freed = sb * heads * (qk + arch.v_head_dim) * d + (sb * heads * qk * d if arch.q_lora_rank else 0)
        parts["mla-up"] = (freed + mla_up_norm_bytes(arch, shape), rerun_ms("mla-up"))
    if moe:
        tokens, f = arch.num_experts * expert_tokens(arch, shape), arch.moe_intermediate_size // shape.tp
    else:
        tokens, f = sb, arch.intermediate_size // shape.tp
    if arch.style == "llama":
        mlp_saved, mlp_moved = 2 * tokens * f * d, 4 * tokens * f * d  # SiLU output and product; g, u in, both out
    else:  # all the activation keeps but its input (activations.py), its ops rerun
        act = ACTIVATIONS[arch.mlp_act]
        mlp_saved, mlp_moved = freed_by_rerun(arch.mlp_act) * tokens * f * d, act.rerun_bytes * tokens * f * d // 2
    if mlp_saved:
        parts["mlp-act"] = (mlp_saved, membound_ms(mlp_moved, gpu, "eager", "activation"))
    if moe:
        parts["mlp"] = (sum(term.num_bytes for term in moe_terms(arch, shape)), rerun_ms("mlp"))
    else:  # SwiGLU's four tensors, GELU's input and output (an eager GELU's saved tensors too), ReLU's output
        width = 4 if arch.style == "llama" else ACTIVATIONS[arch.mlp_act].kept
        parts["mlp"] = (width * tokens * f * d, rerun_ms("mlp", moe=False))
    norms = norm_out_bytes(arch, shape, moe=moe)  # {"attn" / "mlp": the norm before that sub-block}
    if norms:
        parts["norm-out"] = (sum(norms.values()), len(norms) * rerun_ms("norm"))
    order = ("core-attn", "attn", "mla-up", "mlp", "mlp-act", "norm-out")  # how combinations are named (planner/emit/megatron.py)
    names = [name for name in order if name in parts]
    rerun_by_part = {name: analytic_split.torch_rerun_ms(arch, shape, gpu, mfu, name, ms, moe=moe)  # a split's reruns
                     for name, (_, ms) in parts.items()}
    found = []
    for size in range(1, len(names) + 1):
        for combo in combinations(names, size):
            if "mlp" in combo and "mlp-act" in combo or "attn" in combo and "core-attn" in combo:
                continue
            found.append(RecomputeOption(name=",".join(combo), kept_bytes=kept - sum(parts[p][0] for p in combo),
                                         recompute_ms=sum(parts[p][1] for p in combo),
                                         recompute_peak_bytes=_combined_peak(combo, parts, norms),
                                         **analytic_split.selective_split(arch, ",".join(combo), none_split,
                                                                          rerun_by_part, moe=moe)))
    boundary = boundary_bytes(arch, shape)
    if fwd_ms is None or bwd_ms is None:
        fwd_ms, bwd_ms, _ = analytic_time.times_ms(analytic_time.block_work(arch, shape, moe=moe), gpu, mfu)
    # torchtitan's op-level selective AC (planner/profiler/opsac.py)
    op_sac = (opsac.op_sac_option(arch, shape, gpu, mfu, boundary=boundary, kept_without=kept, moe=moe),) \
        if opsac.offers_op_sac(arch, shape, moe=moe) else ()
    return (*found, *op_sac, offload_option(boundary, kept - boundary, gpu, fwd_ms=fwd_ms, bwd_ms=bwd_ms,
                                            first_bytes=terms[-1].num_bytes))


def mla_up_norm_bytes(arch: Arch, shape: Shape) -> int:
    """What Megatron-LM's mla_up_proj frees beyond Q, K and V under the Transformer Engine spec: each latent
    norm's output and its fp32 statistics (mla_terms's), which the up projection's TELayerNormColumnParallelLinear
    computes inside the CheckpointWithoutOutput (megatron/core/transformer/multi_latent_attention.py 855-1003,
    gpt_layer_specs.py 244-318, Megatron-LM d98e8a64). The local spec's separate q/kv norms run before the
    checkpoint and keep theirs: not this count."""
    latents = [arch.q_lora_rank, arch.kv_lora_rank] if arch.q_lora_rank else [arch.kv_lora_rank]
    return sum(shape.tokens * rank * shape.d + FP32 * shape.tokens for rank in latents)


def offers_whole_attention(arch: Arch, shape: Shape) -> bool:
    """Whether a block offers `attn`, its attention module checkpointed whole: a GQA block (LLaMA
    style), at TP 1 and CP 1. Not a latent-attention block (its module's tensors are not counted
    region by region here), nor GPT-OSS's (its sinks), nor GPT's (GPT-2's attention module ends in its
    residual dropout, whose mask it saves last: another rerun); under TP or CP the module's rerun
    would run its all-gathers and ring exchange again, which rerun_work does not charge."""
    eager_sinks = arch.attention_sinks and not arch.sinks_in_kernel  # a kernel's own sinks: its attention as vanilla
    return arch.style == "llama" and not arch.mla and not eager_sinks and shape.tp == 1 and shape.cp == 1


def norm_out_bytes(arch: Arch, shape: Shape, *, moe: bool) -> dict[str, int]:
    """What `norm-out` frees per norm (its output and statistics), keyed by the sub-block after it:
    "attn" for a latent-attention block's attention norm, "mlp" for a MoE block's MLP norm, the
    norms megatron-core's Transformer Engine layer builds as modules of their own."""
    def one(which: str) -> int:
        return sum(term.num_bytes for term in _norm_terms(arch, shape, which)[1:]) + boundary_bytes(arch, shape)
    return {**({"attn": one("attention")} if arch.mla else {}), **({"mlp": one("MLP")} if moe else {})}


def _combined_peak(combo: tuple[str, ...], parts: dict[str, tuple[int, float]], norms: dict[str, int]) -> int:
    """A combination's extra peak: the largest of its parts' (they recompute at different points of the
    backward), where a norm's restored output adds to what its sub-block's recompute holds."""
    side = {"core-attn": "attn", "attn": "attn", "mla-up": "attn", "mlp": "mlp", "mlp-act": "mlp"}
    held = [parts[p][0] for p in combo if p != "norm-out"]
    if "norm-out" in combo:
        held += [norm + max([parts[p][0] for p in combo if side.get(p) == where], default=0)
                 for where, norm in norms.items()]
    return max(held)


def offload_option(input_bytes: int, moved: int, gpu: GPU, *, fwd_ms: float, bwd_ms: float,
                   first_bytes: int) -> RecomputeOption:
    """`offload`: the block keeps its input on the device and copies what else it saves (`moved`
    bytes) to the host in forward and back in backward (planner/recompute.offloaded_activations),
    each way over the GPU's host link (archs.GPU.host_link_gb_per_s: the PCIe datasheet figure per
    direction; one copy stream each way, PCIe being full duplex). The copies run beside the
    compute: out while the forward goes on, back from the start of the block's backward
    (Transformer Engine's and Megatron-LM's offloading overlap likewise). What they cannot hide
    is what they add: the backward's first op waits for the tensor it reads (`first_bytes`, the
    last one saved: the down projection's input); past it, the copies out and the rest back add
    what outlasts the forward and the backward, max(0, copy - forward) + max(0, rest - backward),
    the rate a chain of such blocks falls behind at. The block's copies are all back at the start
    of its backward: full's recompute peak. Not counted: PCIe or host memory bandwidth shared
    by the node's ranks."""
    per_ms = 1e3 / (gpu.host_link_gb_per_s * 1e9)
    added = max(0.0, moved * per_ms - fwd_ms) + first_bytes * per_ms + max(0.0, (moved - first_bytes) * per_ms - bwd_ms)
    return RecomputeOption(name=OPTION_OFFLOAD, kept_bytes=input_bytes, recompute_ms=added,
                           recompute_peak_bytes=moved, host_bytes=moved)
