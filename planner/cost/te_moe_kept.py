"""What a Megatron-core MoE layer keeps for the backward where it differs from the analytic profile's mixture
(planner/profiler/analytic_kept.py moe_terms, which counts what eager PyTorch's gather / SwiGLU / weighted
scatter keep), a fact of the runtime record (RuntimeFacts.te_moe_experts_kept; docs/framework-facts.md §95),
Megatron-LM d98e8a64 (the nearest stored to Megatron-Bridge 00b7660b's pin):

- router (moe_router_fusion, Transformer Engine's fused_topk_with_score_function): the autograd function saves
  the routing map (bool, T x E) and its intermediate output (the scores, T x E), no top-k indices or
  weights of their own (transformer_engine/pytorch/router.py FusedTopkScoreFunction.forward); the intermediate is
  in the logits' dtype (the input's, bf16; fp32 under --moe-router-dtype fp32, Arch.router_dtype_bytes: framework-facts
  §588) up to TE v2.12, fp32 from v2.13 (the record's te_router_scores; router.cpp 42-47 at v2.9, 66 at 4329ff84:
  framework-facts §543);
- the auxiliary load-balancing loss (`router_aux_loss`, Megatron's aux_loss under the fusion: router.py 270-296 at
  92c8482e): FusedComputeScoresForMoEAuxLoss saves its intermediate (T x E, the same dtype as the top-k's),
  FusedAuxLoss the counts `routing_map.sum(dim=0)` (E int64) and an fp32 scalar, MoEAuxLossAutoScaler the loss
  (a scalar); its scores and routing map are freed once the loss is made (TE router.py 152, 230 at v2.9: §544).
  The two scalars are not counted;
- the alltoall dispatcher (moe_permute_fusion): permute, the all-to-all and sort_chunks_by_idxs keep no tokens
  (their backward is the inverse permutation, by an int32 map; token_dispatcher.py 660-800, moe_utils.py
  permute / sort_chunks_by_idxs); the permuted probs reach the experts (one per routed copy, in the logits' dtype:
  TE's permute, the all-to-all and the sort keep it, and WeightedSwiGLUFunction saves them as they come,
  fusions/fused_bias_swiglu.py 194-199 at 92c8482e: bf16, fp32 under --moe-router-dtype fp32; framework-facts §588);
- TEGroupedMLP.forward (experts.py 840-1046): linear_fc1 (TE GroupedLinear) saves its input, the permuted tokens
  (S x h); the fused weighted GLU (bias_activation_fusion: weighted_bias_swiglu_impl /
  weighted_bias_quick_geglu_impl, fusions/fused_bias_geglu.py 350-445) saves its input, linear_fc1's 2f-wide
  output, and the probs; linear_fc2 saves its input, the activation's f-wide output; GPT-OSS's clamp
  (--activation-func-clamp-value) clamps the two halves and cats them before the function (fused_bias_geglu.py
  422-430): the clamps keep views of linear_fc1's output, the function the cat, 2f more;
- the combine (unsort, all-to-all, unpermute without probs: the probs were applied in the activation) keeps no
  tokens: no copy of the experts' output is kept (the profile's "routed experts' outputs").
- --recompute-modules moe_act (experts.py 1019-1030, CheckpointWithoutOutput): the activation runs without
  autograd, its output (linear_fc2's saved input) is discarded once linear_fc2 has run and recomputed from
  linear_fc1's output, which the checkpoint keeps: it frees the f-wide output and the clamp's cat.

The int32 maps (permute's row_id_map, the sort's) are not charged: a few bytes a token (E3: about 17 MB a layer
beside 1.6 GB). Applied to an analytic profile's MoE blocks, with their shared experts (shared_mcore: Megatron's
SharedExpertMLP) and whatever their attention (the mixture's tensors are the MLP's alone); not to a shared-expert
gate (Qwen2-MoE's: its saved tensors not read). Their options' kept bytes and none's allocation record.
"""

from __future__ import annotations

import math

from planner.cost import te_kept
from planner.schema import LayerProfile, Profile

FP32, INDEX, BOOL = 4, 8, 1


def mixtures(profile: Profile, record=None) -> dict | None:
    """The profile's MoE block mixture as the analytic profile keeps it (`generic`: each tensor's bytes in
    analytic_kept.moe_terms's order) and as Megatron-core keeps it under `record`'s TE (`mcore`, without moe_act;
    no record: TE v2.13 on's fp32 intermediates), and what the activation's recompute frees in each
    (`act_generic`: the SiLU output and the product; `act_mcore`: linear_fc2's input, and the clamp's cat), and
    linear_fc1's input (`fc1_in`) and how many router tensors come before it (`router`); None where the profile is not analytic, has no MoE blocks, or their shared
    experts are gated (not read). Shared experts follow the routed ones in both runs."""
    dims = te_kept._dims(profile)
    if dims is None:
        return None
    shape, model = dims
    if not model.get("num_experts") or model.get("shared_expert_gate") or model.get("style", "llama") != "llama":
        return None
    tp, cp, d = shape.get("tp", 1), shape.get("cp", 1), 2
    r = tp if shape.get("sp", False) else 1
    T = shape["seq_len"] // cp * shape["micro_batch_size"]
    E, k, h = model["num_experts"], model["num_experts_per_tok"], model["hidden_size"]
    f = model["moe_intermediate_size"] // tp
    routed = shape.get("capacity_factor", 1.0) * T * k / E  # formulas.expert_tokens
    S = E * math.ceil(round(routed, 6))
    clamped = bool(model.get("swiglu_limit"))
    act = [2 * S * f * d] + [S * f * d] * 5 if clamped else [S * f * d] * 4
    generic = [FP32 * T * E // r, INDEX * T * k // r, FP32 * T * k // r, S * h * d, INDEX * S, *act, S * h * d]
    logits = model.get("router_dtype_bytes") or d  # --moe-router-dtype fp32: 4 (Arch.router_dtype_bytes)
    scores = logits if record is not None and record.te_router_scores == "logits" else FP32  # the logits' dtype
    aux = [scores * T * E // r, INDEX * E] if model.get("router_aux_loss") else []
    mcore = [scores * T * E // r, BOOL * T * E // r, *aux, logits * S, S * h * d, 2 * S * f * d,
             *([2 * S * f * d] if clamped else []), S * f * d]
    shared = model.get("num_shared_experts", 0) * model.get("shared_intermediate_size", 0) // tp
    if shared:  # the shared experts after the routed ones, as analytic_kept.moe_terms counts them
        generic += shared_generic(T, shared, d)
        mcore += shared_mcore(T, shared, d)
    return {"generic": generic, "mcore": mcore, "act_generic": 2 * S * f * d,
            "act_mcore": S * f * d + (2 * S * f * d if clamped else 0), "fc1_in": S * h * d, "router": 3 + len(aux)}


def shared_generic(tokens: int, width: int, d: int) -> list[int]:
    """The shared experts' SwiGLU as the analytic profile keeps it (analytic_kept._swiglu_terms): the gate output,
    SiLU's output, the up output and the product, each tokens x width."""
    return [tokens * width * d] * 4


def shared_mcore(tokens: int, width: int, d: int) -> list[int]:
    """The shared experts as Megatron-core keeps them (framework-facts §101): SharedExpertMLP is an MLP
    (moe/shared_experts.py 102-206, d98e8a64) whose linear_fc1 saves its input (the MLP norm's output, which the
    block counts once), whose fused SwiGLU (`bias_swiglu_impl`, mlp.py 275-309) saves linear_fc1's 2·width output,
    and whose linear_fc2 saves its input, the SwiGLU's width output. MLP has no activation recompute of its own
    (moe_act is the routed experts'), so every option that keeps the mixture keeps these."""
    return [2 * tokens * width * d, tokens * width * d]


def megatron_moe_profile(profile: Profile, record) -> Profile:
    """The profile with its MoE blocks keeping what Megatron-core's keep (the module's docstring); as it is
    where the record does not say so or mixtures() finds none."""
    found = mixtures(profile, record) if getattr(record, "te_moe_experts_kept", False) else None
    if found is None:
        return profile
    layers = [_megatron_layer(layer, found) if layer.kind == "moe_block" else layer for layer in profile.layers]
    return profile.model_copy(update={"layers": layers})


def option_delta(name: str, found: dict) -> int:
    """Kept bytes Megatron-core's MoE layer holds beyond the profile's under option `name`: the mixture's
    difference where the option keeps it (none, norm-out, core-attn...), less what moe_act frees beyond the
    profile's mlp-act; 0 where the whole mixture is recomputed (mlp, full) or the block offloaded whole."""
    parts = name.split(",")
    if name in ("full", "offload") or "mlp" in parts or "op-sac" in name:
        return 0
    delta = sum(found["mcore"]) - sum(found["generic"])
    if "mlp-act" in parts:
        delta += found["act_generic"] - found["act_mcore"]
    return delta


def _megatron_layer(layer: LayerProfile, found: dict) -> LayerProfile:
    options = [option.model_copy(update={"kept_bytes": option.kept_bytes + option_delta(option.name, found)})
               for option in layer.recompute_options]
    records = {name: _megatron_record(record, found) if name == "none" else record
               for name, record in layer.alloc_records.items()}
    return layer.model_copy(update={"act_bytes": layer.act_bytes + option_delta("none", found),
                                    "recompute_options": options, "alloc_records": records})


def _megatron_record(record, found: dict):
    """none's record with the mixture's run of tensors (found["generic"], in order) made Megatron-core's; as it is
    where the record holds no such run."""
    sizes = [code for code in record.forward if code > 0]
    generic = [size for size in found["generic"] if size > 0]
    for at in range(len(sizes) - len(generic) + 1):
        if sizes[at:at + len(generic)] == generic:
            edits = {at + 1: ([size for size in found["mcore"] if size > 0], 0)}
            edits.update({at + 1 + i: ([], 0) for i in range(1, len(generic))})
            return te_kept._rewritten(record, edits)
    return record
