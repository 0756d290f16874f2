"""What the analytic profile records of a mixture-of-experts or latent-attention model among its assumptions
(analytic.assumptions): how the experts are charged and split, and what the profile leaves out."""

from __future__ import annotations

from planner.profiler import analytic_mtp
from planner.profiler.formulas import Shape, expert_gemm_shape, expert_tokens


def moe_assumptions(arch, shape: Shape) -> dict:
    """A MoE model's entries of the analytic profile's assumptions (analytic.assumptions)."""
    if not arch.num_experts:
        return {}
    worst = arch.num_experts / arch.num_experts_per_tok
    return {
        "capacity_factor": shape.capacity_factor,
        "expert_tokens": expert_tokens(arch, shape),
        "moe": f"{arch.num_moe_layers} of {arch.num_layers} layers route each token to {arch.num_experts_per_tok} of "
               f"{arch.num_experts} experts (width {arch.moe_intermediate_size})"
               + (f" beside {arch.num_shared_experts} shared (width {arch.shared_intermediate_size})"
                  if arch.num_shared_experts else "")
               + f"; dense layers: {list(arch.dense_layers) or 'none'}",
        "load_balance": f"routing is data-dependent: each expert is charged capacity_factor x tokens x top_k / experts "
                        f"= {expert_tokens(arch, shape)} tokens per microbatch (capacity_factor "
                        f"{shape.capacity_factor:g}; 1 = perfectly balanced, the mean; {worst:g} = experts / top_k, the "
                        "worst case, every token on one expert), all experts at that capacity as capacity-padded "
                        "dispatch allocates; FLOPs the same",
        "moe_parallelism": "experts tensor-parallel like the dense MLP (expert widths /t, every routed token on every "
                           "device), router replicated; "
                           + ("no expert parallelism in these per-layer numbers" if shape.ep == 1 else
                              f"expert parallelism {shape.ep} in these per-layer numbers only as the rank runs its "
                              f"GEMMs ({expert_gemm_shape(arch, shape)[0]} local experts of "
                              f"{expert_gemm_shape(arch, shape)[1]} tokens each) and accumulates its experts' gradients")
                           + ": `solve --ep E` "
                           "splits the routed experts' parameters (expert_param_count) over E data-parallel ranks and "
                           "charges the tokens' all-to-all (a2a_bytes per dispatch: routed token copies x hidden x "
                           "dtype bytes); each rank's kept activations and FLOPs stay these (its E ranks' tokens reach "
                           "its experts / E experts: experts x capacity tokens either way)",
        "moe_activations": "router: fp32 probabilities, top-k indices and weights; dispatched tokens, each expert's "
                           "SwiGLU over its tokens, the experts' outputs the routing weights multiply, int64 token "
                           "indices; shared experts as one dense SwiGLU (planner/profiler/analytic.py moe_terms)",
        **({"mtp": analytic_mtp.assumption(shape.mtp)} if shape.mtp else
           {"mtp": f"{arch.num_mtp_layers} multi-token-prediction module(s) in the config are not planned (Hugging "
                   "Face's model does not build them; training with them adds a MoE block and a 2h x h projection "
                   "per module beside the head)"} if arch.num_mtp_layers else {}),
    }


def mla_assumptions(arch) -> dict:
    """A latent-attention model's entry of the analytic profile's assumptions."""
    if not arch.mla:
        return {}
    return {"attention_kind": "multi-head latent attention (DeepSeek-V2 §2.1): latents whole on every device, "
                              "up-projected Q, K, V per head (planner/profiler/analytic.py mla_terms)"}
