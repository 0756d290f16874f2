"""What each framework's export can say of a model whose layers differ or whose block has more than LLaMA's
two norms (Gemma 3, SmolLM3: planner/models/gemma3.py), read from each framework's code (framework-facts §424):

- Megatron-LM d98e8a64: `--no-rope-freq` (arguments.py 2428, `no_rope_freq_type` 304-315; TransformerConfig
  .no_rope_freq 291-296, expanded 3138-3152: N is RoPE skipped on every N-th layer, N dividing the depth, or a
  list with 1 where a layer skips it; attention.py 1322 reads it per layer) says SmolLM3's NoPE layers. Its
  TransformerLayer has no norm on the attention's or the MLP's output (TransformerLayerSubmodules: input_layernorm,
  pre_cross_attn_layernorm, pre_mlp_layernorm; transformer_layer.py 255-300) and its flags no tanh-GELU gated MLP
  (--swiglu is SiLU's, --quick-geglu x·sigmoid(1.702x); arguments.py 2450-2453): Gemma 3 is built by
  Megatron-Bridge 067f987d's own layer spec (gemma3_provider.py 143-170: TERowParallelLinearLayerNorm as the
  output projections, fast_gelu gated), not by Megatron-LM's arguments.
- torchtitan b5bcd76c: its models (torchtitan/models: llama3, qwen3, qwen3_5, deepseek_v3, gpt_oss, kimi_k2_7,
  flux, muse_glimmer) run rotary on every layer and have two norms a block; its transformers_modeling_backend
  experiment lists neither family among the models it tested (README.md).
"""

from __future__ import annotations

import shlex

from planner.errors import UserError

GEMMA3_MEGATRON = ("Megatron-LM's arguments cannot build this model: its TransformerLayer has no norm on the "
                   "attention's and the MLP's outputs (Gemma 3's post_attention_layernorm and "
                   "post_feedforward_layernorm) and its flags no tanh-GELU gated MLP (d98e8a64); Megatron-Bridge's "
                   "Gemma3ModelProvider builds it with a layer spec of its own")


def megatron_arguments(model) -> list[str]:
    """The flags for the model's per-layer kinds (planner/emit/facts.ModelFacts), or one sentence where
    Megatron-LM's flags cannot build the block."""
    if model.post_norms:
        raise UserError(GEMMA3_MEGATRON)
    if not model.layer_rotary or all(model.layer_rotary):
        return []
    skips = [0 if rotary else 1 for rotary in model.layer_rotary]
    for every in range(1, len(skips) + 1):  # the shortest period [0] * (N - 1) + [1] that repeats to the depth
        if len(skips) % every == 0 and skips == ([0] * (every - 1) + [1]) * (len(skips) // every):
            return [f"--no-rope-freq {every}"]
    return [f"--no-rope-freq {shlex.quote(str(skips).replace(' ', ''))}"]


def torchtitan_checked(known):
    """The profile's facts, where torchtitan builds the model; else one sentence naming what it lacks."""
    model = known.model
    if model is not None and (model.post_norms or not all(model.layer_rotary)):
        lacks = ("a norm on the attention's and the MLP's outputs (Gemma 3's post_attention_layernorm and "
                 "post_feedforward_layernorm)" if model.post_norms else
                 "layers without rotary (SmolLM3's NoPE layers: every torchtitan model rotates every layer)")
        raise UserError(f"torchtitan cannot train this model: none of its models (b5bcd76c's torchtitan/models) has "
                        f"{lacks}; export it to a framework that builds the model, or train it from its own code")
    return known
