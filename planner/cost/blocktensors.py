"""The parameter tensors a decoder block holds as Megatron-core's TE layer spec builds it (Megatron-LM d98e8a64,
megatron/core/models/gpt/gpt_layer_specs.py get_gpt_layer_with_transformer_engine_submodules): what the DDP's backward
post-hook runs once a tensor for, and the optimizer's loops once a tensor (planner/cost/hosttime.py).

The attention half:
- standard attention: linear_qkv, TE's LayerNormColumnParallelLinear (the input norm's weight, a LayerNorm's bias
  too, and the weight; GPT style all biases, else a q/k/v bias where the model has one), linear_proj (its bias under
  GPT style or an output bias), and under qk_layernorm the q and k norms (a LayerNorm's two tensors each);
- latent attention (MLASelfAttention, the unfused spec, mla_down_proj_fusion off): input_layernorm a TENorm of its
  own, linear_q_down_proj and linear_q_up_proj (or linear_q_proj without a q rank), linear_kv_down_proj,
  linear_kv_up_proj, linear_proj; under qk_layernorm, which Megatron-Bridge's DeepSeek bridges set
  (models/deepseek/deepseek_v2_bridge.py 53, deepseek_v3_bridge.py 62 at 067f987d: `provider.qk_layernorm = True`)
  for DeepSeek's q_a_layernorm and kv_a_layernorm, the up projections are LayerNormColumnParallelLinears, each
  holding its norm's weight.
The MLP half:
- a dense MLP (no experts: pre_mlp_layernorm an IdentityOp): linear_fc1, a LayerNormColumnParallelLinear (the norm's
  weight, a LayerNorm's bias, the weight, GPT style its bias), linear_fc2 (GPT style its bias);
- a MoE layer: pre_mlp_layernorm a TENorm; the router's weight (router.py TopKRouter, an fp32 Parameter; its bias
  under add_bias_linear; the expert bias is a buffer); the rank's local experts (num_experts / ep), each its own fc1
  and fc2 weight: TE's GroupedLinear registers weight0..weight{n-1} (moe_single_grouped_weight off, its default,
  transformer_config.py), SequentialMLP an MLP an expert, with biases under add_bias_linear; the shared experts one
  SharedExpertMLP (linear_fc1, linear_fc2) and its gate_weight under the shared-expert gate (shared_experts.py).

`gemm_weights` are those of them whose gradient a TE GEMM accumulates into main_grad under gradient-accumulation
fusion (fuse_wgrad_accumulation=config.gradient_accumulation_fusion in every TE linear and grouped linear,
extensions/transformer_engine.py): every linear's weight; not the router's (torch's own linear) nor the gate's.
"""

from __future__ import annotations


def _attention(model: dict) -> tuple[int, int]:
    """(tensors, GEMM weights) of the attention half."""
    gpt = model.get("style") == "gpt"
    norm = 2 if gpt else 1
    if model.get("kv_lora_rank"):
        linears = 5 if model.get("q_lora_rank") else 4
        latent_norms = 2 if model.get("q_lora_rank") else 1
        return 1 + linears + latent_norms, linears
    biases = 2 if gpt else (1 if model.get("qkv_bias") else 0) + (1 if model.get("o_bias") else 0)
    return norm + 2 + biases + (2 * norm if model.get("qk_norm") else 0), 2


def _mlp(model: dict, moe: bool, ep: int) -> tuple[int, int]:
    """(tensors, GEMM weights) of the MLP half: dense, or a MoE layer with the rank's local experts."""
    gpt = model.get("style") == "gpt"
    if not moe:
        return (2 if gpt else 1) + 2 + (2 if gpt else 0), 2
    biased = gpt or bool(model.get("expert_bias"))
    local = int(model.get("num_experts") or 0) // max(1, ep)
    experts = 2 * local
    shared = 2 if model.get("num_shared_experts") else 0
    tensors = (2 if gpt else 1) + (2 if biased else 1) + experts * (2 if biased else 1) + shared \
        + (1 if shared and model.get("shared_expert_gate") else 0)
    return tensors, experts + shared


def block_tensors(model: dict, *, moe: bool, ep: int = 1) -> tuple[int, int]:
    """(parameter tensors, of them GEMM weights) one decoder block holds on a rank, as the module docstring counts
    them: `model` the profile's model facts (planner/models/archs.py Arch.facts), `moe` whether its MLP is the
    experts', `ep` the expert-parallel size that divides them."""
    attention, attention_gemms = _attention(model)
    mlp, mlp_gemms = _mlp(model, moe, ep)
    return attention + mlp, attention_gemms + mlp_gemms
