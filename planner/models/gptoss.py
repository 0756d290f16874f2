"""GPT-OSS (OpenAI's gpt-oss-20b and gpt-oss-120b), what ckplan reads of it and from where.

The architecture, as transformers 5.24.0 `models/gpt_oss/modeling_gpt_oss.py` builds it and torchtitan
b5bcd76c `torchtitan/models/gpt_oss/{__init__,model,moe}.py` trains it:
- attention: GQA (64 query heads, 8 K/V heads of 64), biases on Q, K, V and the output projection
  (`attention_bias`; torchtitan's FusedQKVLinear and ScaledBiasRowwiseLinear with bias=True), and one learned
  sink logit per head (`sinks`, a parameter of num_attention_heads), which joins each row's softmax as one
  more column and is dropped after it (transformers' eager_attention_forward), or rescales flash's output by
  sigmoid(lse - sink) (torchtitan's apply_attention_sink_rescale, the same softmax);
- layers alternate a causal sliding window of 128 tokens (even layers) and full causal attention (odd layers):
  the config's `layer_types`; torchtitan's _build_gptoss_layers (`128 if layer_id % 2 == 0 else None`);
- rotary with YaRN (factor 32 over 4096 positions, theta 150000), which keeps nothing beyond the rotated Q, K;
- every layer a mixture of experts: a router (linear with bias, hidden -> experts), top-4 of 32 (20B) or of
  128 (120B) experts of width intermediate_size 2880; each expert a fused gate/up projection (2 x 2880 wide)
  and a down projection, both with biases, and the clamped SwiGLU between them
  (gate.clamp(max=7) * sigmoid(1.702 gate) * (up.clamp(-7, 7) + 1));
- RMSNorm, an untied LM head over 201088 tokens.

The 20B and 120B configs' values are those of openai/gpt-oss-20b and openai/gpt-oss-120b config.json, which
torchtitan's _20b and _120b flavors (b5bcd76c) and transformers' GptOssConfig defaults (the 120B's) repeat;
configs/hf/gpt-oss-20b.json holds the 20B's; the built-ins gpt-oss-20b and gpt-oss-120b are
planner/models/archs.py's _gpt_oss. The model card's "21B parameters, 3.6B active" (20B) and "117B,
5.1B active" (120B) are what planner/profiler/formulas.py's total_params / active_params count exactly
(tests/test_gptoss.py checks the count against transformers' own module under fake tensors).
"""

from __future__ import annotations

from dataclasses import replace

from planner.errors import UserError
from planner.models.archs import Arch

SLIDING, FULL = "sliding_attention", "full_attention"


def gpt_oss_fields(config: dict, where: str, arch: Arch) -> Arch:
    """A gpt_oss config.json's own fields on the MoE arch archconfig read from it: each layer's window
    (layer_types), the sinks, the output projection's and the experts' biases, the clamped SwiGLU."""
    if config.get("quantization_config") is not None:
        raise UserError(f"{where}: quantization_config (the released weights' MXFP4 storage) is not read; ckplan "
                        "plans training in bf16 as torchtitan runs GPT-OSS: remove it from the config")
    window = arch.sliding_window
    types = config.get("layer_types")
    if not isinstance(types, list) or len(types) != arch.num_layers or any(t not in (SLIDING, FULL) for t in types):
        raise UserError(f"{where}: layer_types must list {arch.num_layers} entries, each {SLIDING!r} or {FULL!r} "
                        f"(gpt-oss's config.json alternates them), got {types!r}")
    if SLIDING in types and window is None:
        raise UserError(f"{where}: layer_types has sliding_attention layers but the config gives no sliding_window")
    limit = config.get("swiglu_limit")
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0:
        raise UserError(f"{where}: swiglu_limit must be a positive number (gpt-oss's is 7.0), got {limit!r}")
    return replace(arch, sliding_window=None, layer_windows=tuple(window if t == SLIDING else None for t in types),
                   attention_sinks=True, o_bias=arch.qkv_bias, expert_bias=True, swiglu_limit=float(limit))


def window_pairs(seq_len: int, window: int | None) -> int:
    """The (query, key) pairs a causal attention over `seq_len` tokens computes, each query seeing itself and
    the window - 1 tokens before it (transformers' sliding_window_causal mask: kv_idx > q_idx - window;
    torchtitan's varlen window_size=(window - 1, 0)); None: the full causal triangle, s(s + 1)/2."""
    w = min(seq_len, window or seq_len)
    return w * (w + 1) // 2 + (seq_len - w) * w
