"""The analytic profiler's formulas: a microbatch's shape on one device, and each block's
parameters, FLOPs and widths from an architecture (planner/models/archs.py). The analytic
profile (analytic.py) and its time model (analytic_time.py) both read them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from planner.models.archs import GPU, Arch
from planner.units import DTYPE_BYTES

Attention = Literal["flash", "eager"]




INDEX_BYTES = 8  # token ids are int64


@dataclass(frozen=True)
class Shape:
    """How one microbatch runs on one device."""

    seq_len: int
    micro_batch_size: int
    tp: int = 1
    sp: bool = False
    attention: Attention = "flash"
    dtype: str = "bfloat16"
    # Mixture of experts: tokens each expert holds = capacity_factor x tokens x top_k / experts.
    # Routing is data-dependent; 1.0 charges the mean (perfect balance), experts / top_k the worst
    # case (every token to one expert, which then holds them all), every expert at that capacity
    # as capacity-padded dispatch allocates (GShard; Megatron-LM's --moe-expert-capacity-factor
    # with --moe-pad-expert-input-to-capacity)
    capacity_factor: float = 1.0
    # context parallelism: the sequence split over `cp` ranks, each holding seq_len / cp tokens
    # (two chunks of seq_len / 2cp under the load balancer, Megatron-LM's and torch's); attention
    # reads the whole sequence's K and V through the ring (planner/profiler/analytic_cp.py)
    cp: int = 1
    # expert parallelism: the rank holds experts / ep of the routed experts, and the all-to-all brings
    # each of them its tokens from all ep ranks, ep x capacity tokens an expert (Megatron-LM's
    # MoEAlltoAllTokenDispatcher: num_local_experts = experts / ep, the grouped GEMM over what the
    # rank received; torchtitan's the same). Only the time model reads it (expert_gemm_shape): the
    # FLOPs, the per-token bytes and the kept activations are the same under any ep, and the cost
    # model splits the routed experts' parameters itself (layers.py expert_param_count)
    ep: int = 1
    # Megatron-core's multi-token-prediction layers (--mtp-num-layers): the profile builds them as layers
    # `mtp.N` on the last stage (planner/profiler/analytic_mtp.py); 0 for every other source, which plans
    # the main model only (a Hugging Face config's num_nextn_predict_layers is not built by transformers)
    mtp: int = 0
    # eager attention's softmax as Megatron's FusedScaleMaskSoftmax runs it under a causal mask (one
    # ScaledUpperTriangMaskedSoftmax kernel, then torch's dropout; analytic_time.FUSED_SCORES_*), not Hugging
    # Face's op-by-op softmax; only the time model reads it
    fused_softmax: bool = False

    @property
    def d(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def tokens(self) -> int:
        """The tokens of one microbatch on this device: seq_len / cp of each sequence."""
        return self.seq_len // self.cp * self.micro_batch_size

    @property
    def sp_div(self) -> int:
        """What splits the replicated tensors (norm inputs and outputs): t under SP."""
        return self.tp if self.sp else 1


def q_width(arch: Arch, shape: Shape) -> int:
    return arch.num_heads // shape.tp * arch.head_size


def kv_width(arch: Arch, shape: Shape) -> int:
    """K (or V) width per device: K/V heads are split /t, or replicated when t > kv."""
    return max(arch.num_kv_heads // shape.tp, 1) * arch.head_size


def vocab_per_device(arch: Arch, shape: Shape) -> int:
    """Vocab-parallel embedding and head: the vocabulary split /t, the last shard rounded up
    (Megatron pads it to a multiple of 128·t; torchtitan needs it to divide)."""
    return -(-arch.vocab_size // shape.tp)


def expert_tokens(arch: Arch, shape: Shape) -> int:
    """Tokens each routed expert holds per microbatch, C = capacity_factor · tokens · top_k /
    experts, rounded up: the tokens·top_k routed copies spread over the experts (Shape.capacity_factor)."""
    routed = shape.capacity_factor * shape.tokens * arch.num_experts_per_tok / arch.num_experts
    return math.ceil(round(routed, 6))  # round first: 1.0 x 64 x 6 / 64 is 6, not 6.000000000000001


def expert_gemm_shape(arch: Arch, shape: Shape) -> tuple[int, int]:
    """(experts, tokens each) of a MoE block's grouped GEMM on one rank: experts / ep local experts, each
    over ep x expert_tokens rows (dispatch brings every ep rank's copies for them); experts x tokens
    either way, but fewer, larger GEMMs, each at the efficiency its size reaches (roofline.py)."""
    if arch.num_experts % shape.ep:
        raise ValueError(f"expert parallelism {shape.ep} does not divide the {arch.num_experts} routed experts")
    return arch.num_experts // shape.ep, expert_tokens(arch, shape) * shape.ep


def _is_moe(arch: Arch, moe: bool | None) -> bool:
    """A block's MLP: the experts where asked, or (None) where the model has experts at all."""
    return arch.num_experts > 0 if moe is None else moe


def block_params(arch: Arch, shape: Shape, *, moe: bool | None = None) -> int:
    """Weights of one block on one device: matrices and column-parallel biases split /t,
    norms and row-parallel biases replicated."""
    h, f = arch.hidden_size, arch.intermediate_size // shape.tp
    if arch.style == "gpt":  # biases: Q/K/V and fc1 split, output and fc2 replicated; LayerNorm weight + bias
        qkv_out = q_width(arch, shape) + 2 * kv_width(arch, shape)
        qk_norm = 2 * 2 * arch.head_size if arch.qk_norm else 0  # q and k LayerNorms (TENorm): weight + bias each
        return h * qkv_out + q_width(arch, shape) * h + 2 * h * f + qkv_out + f + 2 * h + 2 * 2 * h + qk_norm
    return attention_params(arch, shape) + mlp_params(arch, shape, moe=moe) + block_norms(arch) * h  # RMSNorm weights


def block_norms(arch: Arch) -> int:
    """A LLaMA-style block's RMSNorms over the hidden state: before attention and before the MLP, and Gemma 3's
    two more on their outputs (Arch.post_norms: post_attention_layernorm, post_feedforward_layernorm)."""
    return 4 if arch.post_norms else 2


def attention_params(arch: Arch, shape: Shape) -> int:
    """GQA: Q and output projections a·hd wide, K and V kv·hd (optional Q/K/V biases, Qwen3's
    per-head q and k norm weights, hd each, replicated). MLA (DeepSeek-V2 §2.1): replicated, the
    down projections h·q_lora_rank (none without q compression) and h·(kv_lora_rank + rope) with
    the latents' norm weights; split /t, the up projections q_lora_rank·a·(nope + rope) (or
    h·a·(nope + rope) straight from the hidden state), kv_lora_rank·a·(nope + v), and the output
    a·v·h."""
    h = arch.hidden_size
    if arch.mla:
        heads, rope, nope = arch.num_heads // shape.tp, arch.qk_rope_head_dim, arch.qk_nope_head_dim
        q_rank, kv_rank = arch.q_lora_rank, arch.kv_lora_rank
        q = h * q_rank + q_rank + q_rank * heads * (nope + rope) if q_rank else h * heads * (nope + rope)
        kv = h * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + arch.v_head_dim)
        return q + kv + heads * arch.v_head_dim * h
    qkv_out = q_width(arch, shape) + 2 * kv_width(arch, shape)
    bias = qkv_out if arch.qkv_bias else 0
    qk_norm = 2 * arch.head_size if arch.qk_norm else 0
    # GPT-OSS: the output projection's bias (row-parallel: replicated) and one sink per head (split with them)
    extra = (h if arch.o_bias else 0) + (arch.num_heads // shape.tp if arch.attention_sinks else 0)
    return h * qkv_out + q_width(arch, shape) * h + bias + qk_norm + extra


def mlp_params(arch: Arch, shape: Shape, *, moe: bool | None = None) -> int:
    """Dense: gate, up and down, 3·h·f/t. Experts: the router h·E (replicated), E routed
    experts of 3·h·f_e/t, the shared experts as one SwiGLU of 3·h·f_s/t, and Qwen2-MoE's
    shared-expert gate h (replicated)."""
    h, t = arch.hidden_size, shape.tp
    if not _is_moe(arch, moe):
        return 3 * h * (arch.intermediate_size // t)
    shared = arch.num_shared_experts * arch.shared_intermediate_size // t
    gate = h if arch.shared_expert_gate else 0
    router = h * arch.num_experts + (arch.num_experts if arch.expert_bias else 0)  # GPT-OSS's router has a bias
    return router + arch.num_experts * expert_width_params(arch, shape) + 3 * h * shared + gate


def expert_width_params(arch: Arch, shape: Shape) -> int:
    """One routed expert on one device: gate, up and down, 3·h·f_e/t; GPT-OSS's biases beside them, the fused
    gate/up projection's 2·f_e/t (split with it) and the down projection's h (replicated: torchtitan's
    ScaleBiasForward divides it by t in the forward, gpt_oss/moe.py at b5bcd76c)."""
    f = arch.moe_intermediate_size // shape.tp
    return 3 * arch.hidden_size * f + (2 * f + arch.hidden_size if arch.expert_bias else 0)


def embedding_params(arch: Arch, shape: Shape) -> int:
    """The vocab-parallel token embedding; GPT's learned positions are replicated."""
    positions = (arch.max_position_embeddings or 0) * arch.hidden_size if arch.style == "gpt" else 0
    return vocab_per_device(arch, shape) * arch.hidden_size + positions


def head_params(arch: Arch, shape: Shape) -> int:
    """Final norm + LM head. With tied embeddings the last stage still holds a copy of the
    embedding for the head (Megatron keeps one there and all-reduces its gradient)."""
    norm = 2 * arch.hidden_size if arch.style == "gpt" else arch.hidden_size
    return norm + vocab_per_device(arch, shape) * arch.hidden_size


def block_flops(arch: Arch, shape: Shape, *, moe: bool | None = None) -> int:
    """Narayanan et al. 2021 §5.1 for GPT (24bsh²(1 + s/6h) at t = 1); the LLaMA variant
    with GQA-width K/V (or latent attention) and three SwiGLU matrices (or the experts).
    Matmuls only, split /t."""
    if arch.style == "gpt":  # the attention of attention_flops, two MLP matrices
        return attention_flops(arch, shape) + 2 * shape.tokens * arch.hidden_size * 2 * (arch.intermediate_size // shape.tp)
    return attention_flops(arch, shape) + mlp_flops(arch, shape, moe=moe)


def attention_flops(arch: Arch, shape: Shape) -> int:
    """GQA: projections 2·sb·h·(2·a·hd + 2·kv·hd); QK^T and scores·V over the full s² (as MFU
    counts them), or s·w within a sliding window: 4·sb·s·a·hd. MLA, each weight of
    attention_params once per token (2 FLOPs per multiply-add), the replicated down projections
    on the device's own tokens (/t under SP); QK^T over nope + rope, scores·V over v_head_dim:
    2·sb·s·a·(nope + rope + v)."""
    sb, s, h = shape.tokens, shape.seq_len, arch.hidden_size
    window = min(s, arch.sliding_window or s)
    if not arch.mla:
        q, kv = q_width(arch, shape), kv_width(arch, shape)
        return 2 * sb * h * (2 * q + 2 * kv) + 4 * sb * window * q
    heads, rope, nope, v = arch.num_heads // shape.tp, arch.qk_rope_head_dim, arch.qk_nope_head_dim, arch.v_head_dim
    q_rank, kv_rank, own = arch.q_lora_rank, arch.kv_lora_rank, sb // shape.sp_div
    down = 2 * own * h * (q_rank + kv_rank + rope)
    q_up = 2 * sb * (q_rank if q_rank else h) * heads * (nope + rope)
    up = q_up + 2 * sb * kv_rank * heads * (nope + v) + 2 * sb * heads * v * h
    return down + up + 2 * sb * window * heads * (nope + rope + v)


def attention_bwd_flops(arch: Arch, forward: int) -> int:
    """The attention core's backward FLOPs from its forward's, as torch's flop counter counts an SDPA call and
    its backward (torch/utils/flop_counter.py sdpa_flop_count, sdpa_backward_flop_count, torch 2.13.0): forward
    S = QKᵀ over the q/k head dim and O = PV over the value's, 2·s²·(d_qk + d_v) a head; backward S recomputed
    (d_qk), dP = dO·Vᵀ and dV = Pᵀ·dO (d_v each), dQ = dS·K and dK = dSᵀ·Q (d_qk each): 2·s²·(3·d_qk + 2·d_v).
    Equal head dims: 2.5x the forward; a latent attention's (q/k nope + rope, v): (3·d_qk + 2·d_v) / (d_qk + d_v),
    2.6x at DeepSeek-V3's (192, 128). FlashAttention-2's and cuDNN's backward kernels run these five GEMMs."""
    if not arch.mla:
        return forward * 5 // 2
    d_qk, d_v = arch.qk_nope_head_dim + arch.qk_rope_head_dim, arch.v_head_dim
    return forward * (3 * d_qk + 2 * d_v) // (d_qk + d_v)


def mlp_flops(arch: Arch, shape: Shape, *, moe: bool | None = None) -> int:
    """Dense: 2·sb·h·3f. Experts: the router 2·sb·h·E (replicated, /t under SP); the routed
    experts over their E·C dispatched tokens, 2·E·C·h·3f_e: top-k copies of each token at a
    capacity factor of 1, not every expert on every token; the shared experts 2·sb·h·3f_s and
    Qwen2-MoE's gate 2·sb·h."""
    sb, h, t = shape.tokens, arch.hidden_size, shape.tp
    if not _is_moe(arch, moe):
        return 2 * sb * h * 3 * (arch.intermediate_size // t)
    router = 2 * (sb // shape.sp_div) * h * arch.num_experts
    routed = 2 * arch.num_experts * expert_tokens(arch, shape) * h * 3 * (arch.moe_intermediate_size // t)
    shared = 2 * sb * h * 3 * (arch.num_shared_experts * arch.shared_intermediate_size // t)
    return router + routed + shared + (2 * sb * h if arch.shared_expert_gate else 0)


def block_recompute_flops(arch: Arch, shape: Shape, *, moe: bool | None = None) -> int:
    """What torch's non-reentrant checkpoint reruns of a block: ops up to the last tensor the
    backward needs, so a LLaMA block's forward but its down projection (its output feeds only
    the residual add, which saves nothing), and a GPT block's but its second linear; a dropout
    after the last linear (Arch.drops_residual) keeps a mask, so all of it. Measured by the fake profiler (0.74-0.80 of a LLaMA forward). In a
    MoE block the routed experts' outputs are kept (the routing weights multiply them), so the
    rerun goes past them; it stops before the shared experts' down projection where the shared
    output is added last (Hugging Face's DeepseekV2Moe/DeepseekV3MoE), and reruns everything
    where no shared expert follows (Mixtral, Qwen3-MoE) or a gate's product keeps the shared
    output (Qwen2-MoE)."""
    if arch.drops_residual or arch.post_norms:  # Gemma 3's post-MLP norm keeps the down projection's output
        return block_flops(arch, shape)
    sb, h, t = shape.tokens, arch.hidden_size, shape.tp
    if not _is_moe(arch, moe):
        last = 2 * sb * (arch.intermediate_size // t) * h
    elif arch.num_shared_experts and not arch.shared_expert_gate:
        last = 2 * sb * (arch.num_shared_experts * arch.shared_intermediate_size // t) * h
    else:
        last = 0
    return block_flops(arch, shape, moe=moe) - last


def head_flops(arch: Arch, shape: Shape) -> int:
    return 2 * shape.tokens * arch.hidden_size * vocab_per_device(arch, shape)


def flops_ms(flops: float, gpu: GPU, mfu: float) -> float:
    """FLOPs at the BF16 peak x an explicit MFU (--mfu, the roofline's override)."""
    return flops / (gpu.bf16_tflops * 1e12 * mfu) * 1e3


def total_params(arch: Arch) -> int:
    """The model's parameter count as published (tied embeddings counted once)."""
    one = Shape(seq_len=1, micro_batch_size=1)
    head = head_params(arch, one) - (arch.vocab_size * arch.hidden_size if arch.tie_word_embeddings else 0)
    blocks = sum(block_params(arch, one, moe=arch.is_moe_layer(i)) for i in range(arch.num_layers))
    return embedding_params(arch, one) + blocks + head


def active_params(arch: Arch, *, input_embedding: bool = True) -> int:
    """The parameters one token's forward uses: all but the routed experts it does not reach,
    (experts − top-k)·3·h·f_e in every MoE layer. The token embedding counts whole, as in
    total_params (how Mistral and Qwen count active parameters); input_embedding=False leaves it
    out (a lookup reads one row of it), as DeepSeek counts its activated parameters."""
    idle = arch.num_moe_layers * (arch.num_experts - arch.num_experts_per_tok) * \
        expert_width_params(arch, Shape(seq_len=1, micro_batch_size=1))
    embedding = 0 if input_embedding else embedding_params(arch, Shape(seq_len=1, micro_batch_size=1))
    return total_params(arch) - idle - embedding
