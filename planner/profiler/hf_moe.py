"""A DeepSeek-V3 block's mixture as transformers 5.24 runs it, op by op: DeepseekV3TopkRouter
(models/deepseek_v3/modeling_deepseek_v3.py 120-158) and the routed experts, DeepseekV3Experts under
`@use_experts_implementation` (161), i.e. the grouped path `grouped_mm_experts_forward` (integrations/moe.py
424-537) that analytic_moe.experts_bytes counts for Mixtral. Bytes as the fake profile counts them
(fake.OpBytes: every tensor an op reads and writes, whole; views and bare allocations nothing). The shared
experts (DeepseekV3MLP, 104-117) are a SwiGLU of their own (analytic_time._swiglu).

Symbols: T tokens, k top-k, S = T·k, E routed experts, h hidden, g = n_group, t = topk_group. The router's
weight and e_score_correction_bias are bf16 under a bf16 model (`model.to(bfloat16)`, as the fake profile
builds it), so `self.weight.type(torch.float32)` is a cast too; the scores are fp32.

Forward (the router's module: `elementwise`): the hidden rows and the weight cast to fp32 (6 T h + 6 E h),
sigmoid (8 T E), the correction bias added (8 T E + 2 E), the group scores: top-2 over each group's
experts (4 T E read, values 8 T g and indices 16 T g written) summed (8 T g + 4 T g), the groups' top-t
(4 T g; 12 T t), zeros_like (8 T g: the fake reads its input), scatter_ (8 T g + 8 T t); the mask's
reshape of the expanded group mask a copy only where g > 1 (8 T E); its bool cast (5 T E) and ~ (2 T E),
masked_fill (9 T E), the top-k (4 T E; 12 S), the weights gathered from the scores (4 T E + 8 S; 4 S);
under norm_topk_prob the sum (4 S + 4 T), the + 1e-20 (8 T), the in-place divide's clone (8 S: the
gather's output is saved for backward) and divide (8 S + 4 T); routed_scaling_factor's product (8 S).
The experts: analytic_moe.experts_bytes at fp32 weights (w = 4: the sigmoid scores are fp32).

Backward: the experts' (`activation`), and where the experts' input gradient meets the router's, one add
(6 T h), which torch's ModuleTracker runs under the experts: `activation`. The router's (`elementwise`:
the tracker holds the shared experts then): the scale's product (8 S); the renormalization's three divides
(24 S + 12 T), neg (8 S), product (12 S), sum (4 S + 4 T), the two paths' add (12 S); the gather's
backward (new_zeros 4 S + 4 T E, scatter_add 8 T E + 12 S), sigmoid_backward (12 T E), and the linear's
fp32 gradients cast back: the input's (6 T h) and the weight's (6 E h). The correction bias and the group
mask choose indices only: no gradient.
"""

from __future__ import annotations

from collections import Counter

from planner.profiler import analytic_moe
from planner.profiler.formulas import Shape

ADD = 6  # a + b in 16 bits (analytic_time.ADD)


def router_bytes(tokens: int, hidden: int, experts: int, top_k: int, *, groups: int = 1, topk_groups: int = 1,
                 renormalizes: bool = True) -> tuple[int, int]:
    """(forward, backward) bytes of DeepseekV3TopkRouter over `tokens` tokens (the module docstring)."""
    T, h, E, g, t = tokens, hidden, experts, groups, topk_groups
    S = T * top_k
    group = (4 * T * E + 24 * T * g) + 12 * T * g + (4 * T * g + 12 * T * t) + 8 * T * g + (8 * T * g + 8 * T * t)
    mask = (8 * T * E if g > 1 else 0) + 5 * T * E + 2 * T * E + 9 * T * E
    norm_fwd = (4 * S + 4 * T) + 8 * T + 8 * S + (8 * S + 4 * T) if renormalizes else 0
    norm_bwd = (24 * S + 12 * T) + 8 * S + 12 * S + (4 * S + 4 * T) + 12 * S if renormalizes else 0
    forward = (6 * T * h + 6 * E * h + 8 * T * E + (8 * T * E + 2 * E) + group + mask + (4 * T * E + 12 * S)
               + (4 * T * E + 12 * S) + norm_fwd + 8 * S)
    backward = 8 * S + norm_bwd + (4 * S + 4 * T * E) + (8 * T * E + 12 * S) + 12 * T * E + 6 * T * h + 6 * E * h
    return forward, backward


def counts_deepseek(arch) -> bool:
    """Whether a MoE block's mixture is DeepSeek's (a latent-attention model's: the Arch records no
    model_type, and DeepSeek-V2's router differs: docs/published-runs.md 27.mlamoe)."""
    return bool(arch.mla and arch.num_experts)


def mixture_bytes(arch, shape: Shape) -> tuple[Counter, Counter]:
    """(forward, backward) bytes by op class of a DeepSeek-V3 block's router and routed experts on this
    device's tokens, the experts' width split by TP; Moonlight's n_group = topk_group = 1 and
    norm_topk_prob (the Arch carries neither; DeepseekV3Config's default renormalizes)."""
    T, h, E, k = shape.tokens, arch.hidden_size, arch.num_experts, arch.num_experts_per_tok
    router_fwd, router_bwd = router_bytes(T, h, E, k)
    experts_fwd, experts_bwd = analytic_moe.experts_bytes(T, h, arch.moe_intermediate_size // shape.tp, E, k)
    return (Counter(elementwise=router_fwd, activation=experts_fwd),
            Counter(elementwise=router_bwd, activation=experts_bwd + ADD * T * h))
