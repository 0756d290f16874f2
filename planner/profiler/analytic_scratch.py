"""The analytic block's backward scratch, tensor by tensor: the widest gradients its backward holds at once
(beyond the gradient of its output, which it receives), each its own request, in the order torch's autograd
makes them, and which of them it frees before the rest (framework-facts §63, §71)."""

from __future__ import annotations

from dataclasses import dataclass

from planner.models.archs import Arch
from planner.profiler.analytic_kept import boundary_bytes
from planner.profiler.formulas import Shape, _is_moe, expert_tokens


@dataclass(frozen=True)
class Scratch:
    """`terms`: the tensors, in the order the backward makes them; `freed_early`: how many of the first ones it
    frees once the rest are made (before the block's input gradient), the others freed last first at its end."""

    terms: tuple[int, ...]
    freed_early: int = 0


def block_scratch(arch: Arch, shape: Shape, *, moe: bool | None = None) -> Scratch:
    """The widest moment of the block's backward beyond its output's gradient:
    - a gated MLP (style "llama": SwiGLU, GeGLU; torchtitan's `w2(F.silu(w1(x)) * w3(x))`, a MoE's grouped
      experts alike): w2's input gradient (the product's, [tokens, f/t]) is alive while the `mul`'s backward makes
      its two operands' gradients (`tools/autograd/derivatives.yaml` mul.Tensor: `self` and `other`, both
      [tokens, f/t]): three f-wide tensors at once; the product's is freed when the node returns (§71). In a MoE
      block the routed experts' (every one's, a grouped matmul building them at once) or the shared experts',
      whichever is wider. Megatron-LM's fused SwiGLU (`fused_bias_swiglu.swiglu_back`: one [tokens, 2f/t]
      `torch.cat` made while `g` [tokens, f/t] is alive) holds the same bytes;
    - a GELU MLP (style "gpt"): fc2's input gradient and GELU's backward output, two [tokens, f/t];
    - eager attention, where wider: the scores' gradient and softmax's input gradient, two [b, heads/t, s, s]."""
    s, b, d, t = shape.seq_len, shape.micro_batch_size, shape.d, shape.tp
    gated = arch.style == "llama"
    if _is_moe(arch, moe) and gated:
        routed = arch.num_experts * expert_tokens(arch, shape) * (arch.moe_intermediate_size // t)
        shared = shape.tokens * (arch.num_shared_experts * arch.shared_intermediate_size // t)
        wide = max(routed, shared) * d
    else:
        wide = shape.tokens * (arch.intermediate_size // t) * d
    mlp = Scratch((wide, wide, wide), freed_early=1) if gated else Scratch((wide, wide))
    if shape.attention == "eager":
        scores = d * (arch.num_heads // t) * s * s * b
        if 2 * scores > sum(mlp.terms):
            return Scratch((scores, scores))
    return mlp


def block_transient_bytes(arch: Arch, shape: Shape, *, moe: bool | None = None) -> int:
    """An estimate, not from the paper: during the block's backward, the gradient of its output plus the widest
    gradients built at once (block_scratch)."""
    return boundary_bytes(arch, shape) + sum(block_scratch(arch, shape, moe=moe).terms)


def block_scratch_terms(arch: Arch, shape: Shape, *, moe: bool | None = None) -> list[int]:
    """The block's backward scratch as the tensors block_transient_bytes counts, in the order it makes them."""
    return list(block_scratch(arch, shape, moe=moe).terms)
