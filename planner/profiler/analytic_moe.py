"""A Mixtral (or Qwen3-MoE) block's mixture as transformers 5.24 runs it, op by op: the router (MixtralTopKRouter) and the
routed experts through `grouped_mm_experts_forward` (transformers/integrations/moe.py 424-537, the experts
implementation the fake profile runs), their memory-bound bytes forward and backward as the fake profile
counts them (fake.OpBytes: every tensor an op reads and writes, whole; docs/framework-facts.md §82). DeepSeek-V3's
experts run the same path (experts_bytes; its router: hf_moe.py, §120).

Symbols: T tokens, k top-k, S = T·k token copies (the dropless experts compute every copy), E experts,
h hidden, f the experts' width (/TP); bf16 activations (2 B), int64 indices (8 B), fp32 routing weights (4 B:
Mixtral's router renormalizes its fp32 top-k probabilities and returns them as they are,
modeling_mixtral.py 104-111, so `proj_out * sample_weights_g` is fp32, and the reorder and the sum over the
k copies with it; the sum's result cast back to bf16).

Forward, the router (its module's ops: `elementwise`): logits to fp32 (6 TE), softmax (8 TE), topk (4 TE read,
values 4 S and indices 8 S), the top-k's sum (4 S + 4 T), the in-place divide's clone and divide (8 S,
8 S + 4 T). The experts (`activation`, the Experts module's class): sort of the S expert ids (24 S), the
token index `perm // k` (16 S), the hidden rows gathered (the whole input read, 2 T h, the index 8 S, 2 S h
written), the weights gathered (16 S), histc's float input (12 S), histc (4 S + 4 E) and the offsets' cumsum
(8 E); SiLU and the product (4 S f + 6 S f); the weighting (2 S h + 4 S read, 4 S h written), the inverse
permutation (arange 8 S, index_put_ 32 S; its empty_like writes nothing: fake.NO_TRAFFIC), the fp32 rows
reordered (8 S h + 8 S), summed over k (4 S h + 4 T h) and cast (6 T h).

Backward, the experts (`activation`): the cast's (6 T h), the sum's expand cloned (8 S h), the reorder's
index backward into zeros (new_zeros 8 S h, index_put 12 S h + 8 S), the weighting's two gradients (10 S h;
8 S h + 4 S) and the rows' cast (6 S h), the weights' sum over h (4 S h + 4 S); SwiGLU's (two products
12 S f, silu_backward 6 S f) and the chunk's cat of the gate's and up's gradients (8 S f: the fused
gate_up_proj has no gradient sum of its own); the weights' gather backward (new_zeros 8 S, index_put 20 S);
the rows' gather backward into the input's gradient (new_zeros 2 S h + 2 T h, index_put 4 T h + 2 S h + 8 S).
The router's backward runs while torch's ModuleTracker still holds the experts as innermost (their input
`top_k_weights` is the router's output), so the fake profile classes it `activation` too: the
renormalization's (three divides 24 S + 12 T, neg 8 S, product 12 S, sum 4 S + 4 T, the two paths' add
12 S), topk's scatter into zeros (new_zeros 4 S + 4 T E, scatter 8 T E + 12 S), softmax's (12 T E) and the
cast back (6 T E). Where the router's and the experts' input gradients meet: one add (6 T h, `elementwise`).
"""

from __future__ import annotations

from collections import Counter

from planner.profiler.formulas import Shape
from planner.profiler.roofline import Kernel


def mixture_bytes(tokens: int, hidden: int, width: int, experts: int, top_k: int, *, weight_bytes: int = 4,
                  renormalizes: bool = True) -> tuple[Counter, Counter]:
    """(forward, backward) bytes by op class (membound.OP_CLASSES) of the router and routed experts of
    one block over `tokens` tokens (the module docstring has each term for Mixtral's fp32 weights, w = 4;
    under bf16 weights, w = 2, Qwen3-MoE's, the router adds the cast (6 S each way), the weighted rows stay
    bf16, o = 2, and the final cast is gone); `renormalizes`: the top-k weights divided by their sum; the
    matmuls are kernels (expert_kernels)."""
    T, h, E, w = tokens, hidden, experts, weight_bytes
    S = T * top_k
    norm_fwd = (4 * S + 4 * T) + 8 * S + (8 * S + 4 * T) if renormalizes else 0
    norm_bwd = (24 * S + 12 * T) + 8 * S + 12 * S + (4 * S + 4 * T) + 12 * S if renormalizes else 0
    cast_weights = 6 * S if w == 2 else 0
    router_fwd = 6 * T * E + 8 * T * E + (4 * T * E + 12 * S) + norm_fwd + cast_weights
    experts_fwd, experts_bwd = experts_bytes(tokens, hidden, width, experts, top_k, weight_bytes=w)
    router_bwd = cast_weights + norm_bwd + (4 * S + 4 * T * E) + (8 * T * E + 12 * S) + 12 * T * E + 6 * T * E
    return (Counter(elementwise=router_fwd, activation=experts_fwd),
            Counter(activation=experts_bwd + router_bwd, elementwise=6 * T * h))


def experts_bytes(tokens: int, hidden: int, width: int, experts: int, top_k: int, *,
                  weight_bytes: int = 4) -> tuple[int, int]:
    """(forward, backward) bytes of `grouped_mm_experts_forward` over `tokens` tokens given the router's top-k
    (the module docstring's experts' terms; `weight_bytes` the top-k weights' element size as the router returns
    them: 4 for fp32, Mixtral's and DeepSeek's, 2 for Qwen3-MoE's). The router's backward, which the fake
    profile classes by the module it runs under, is not in it (mixture_bytes, hf_moe.py)."""
    T, h, f, E, w = tokens, hidden, width, experts, weight_bytes
    S = T * top_k
    o = 4 if w == 4 else 2  # the weighted rows' element size: bf16 x fp32 promotes
    cast_out = 6 * T * h if o == 4 else 0  # the sum's fp32 result cast back to bf16
    forward = (24 * S + 16 * S + (2 * T * h + 8 * S + 2 * S * h) + (2 * w + 8) * S + 12 * S + (4 * S + 4 * E)
               + 8 * E + 10 * S * f + (2 * S * h + w * S + o * S * h) + (8 * S + 32 * S)
               + (2 * o * S * h + 8 * S) + (o * S * h + o * T * h) + cast_out)
    backward = (cast_out + 2 * o * S * h + (2 * o * S * h + 3 * o * S * h + 8 * S) + (2 * o + 2) * S * h
                + (2 * o * S * h + w * S) + (6 * S * h if o == 4 else 0) + (o * S * h + o * S) + 26 * S * f
                + (2 * w * S + (3 * w + 8) * S) + (2 * S * h + 2 * T * h) + (4 * T * h + 2 * S * h + 8 * S))
    return forward, backward


def counts_mixture(arch) -> bool:
    """Whether a MoE block's mixture is counted op by op here: Mixtral's and Qwen3-MoE's
    (Arch.routing_weight_bytes; no shared expert, no expert bias, no latent attention)."""
    return bool(arch.routing_weight_bytes) and not (arch.num_shared_experts or arch.expert_bias or arch.mla)


def block_mixture_bytes(arch, shape: Shape) -> tuple[Counter, Counter]:
    """mixture_bytes of a block at `shape`: the router and the experts over the device's tokens, the
    experts' width split by TP."""
    return mixture_bytes(shape.tokens, arch.hidden_size, arch.moe_intermediate_size // shape.tp, arch.num_experts,
                         arch.num_experts_per_tok, weight_bytes=arch.routing_weight_bytes,
                         renormalizes=arch.renormalizes_top_k)


def expert_kernels(tokens: int, hidden: int, width: int) -> list[Kernel]:
    """One routed expert's matmuls over its `tokens`: MixtralExperts holds gate and up as one tensor,
    gate_up_proj (experts x 2f x h, modeling_mixtral.py 65), and runs them as one GEMM (87; the grouped path
    one group of _grouped_linear, integrations/moe.py 490), then down (89; 511): two kernels, not SwiGLU's three."""
    return [Kernel("matmul", 2 * tokens * hidden * 2 * width), Kernel("matmul", 2 * tokens * width * hidden)]


def early_stop_bytes(arch, shape: Shape) -> int:
    """What torch's non-reentrant checkpoint does not rerun of a mixture (`activation` bytes): the
    rerun stops once the last tensor the forward saved is packed again, the weighting's (`proj_out *
    sample_weights_g` saves both), so the fp32 rows' reorder (8 S h + 8 S), their sum over k (4 S h + 4 T h)
    and its cast (6 T h; under bf16 weights the rows are bf16: 4 S h + 8 S, 2 S h + 2 T h, no cast) are not rerun (counted on a tiny block by tests/test_analytic_moe.py)."""
    T, h = shape.tokens, arch.hidden_size
    S = T * arch.num_experts_per_tok
    o = 4 if arch.routing_weight_bytes == 4 else 2
    return 2 * o * S * h + 8 * S + o * S * h + o * T * h + (6 * T * h if o == 4 else 0)
