"""What GPT-OSS's blocks keep beyond a LLaMA-style MoE block, term by term, as torchtitan b5bcd76c runs them
(torchtitan/models/gpt_oss/model.py, moe.py) and transformers 5.24.0 (models/gpt_oss/modeling_gpt_oss.py).
planner/profiler/analytic_kept.py adds these to its gqa_terms and moe_terms (each as its Term: what, bytes,
source); planner/models/gptoss.py has the architecture and its sources.

- Sinks (flash attention, torchtitan's out_transform apply_attention_sink_rescale): the output is flash's O
  times sigmoid(lse - sink) per head and token. The product keeps both factors: O itself (flash keeps the
  same tensor for its own backward, so it is a tensor beside the output projection's input, the product) and
  the scale cast to the activation dtype; the sigmoid keeps its fp32 output. The lse is flash's, counted.
- The clamped SwiGLU over each routed token (torchtitan's swiglu; transformers' _apply_gate keeps the same
  sizes): both clamps keep their input, the fused gate/up projection's output with its bias (2f wide: the
  gate and up halves are strided views of it); sigmoid keeps its output; the gate's product keeps the clamped
  gate; addcmul (transformers: (up + 1) * glu) keeps its two factors, the gated half and the clamped up half;
  the down projection keeps its input. 7·f per routed token where SiLU's SwiGLU keeps 4·f. The biases' adds
  keep nothing.
"""

from __future__ import annotations

FP32 = 4
TORCHTITAN = "torchtitan b5bcd76c gpt_oss/model.py apply_attention_sink_rescale"
CLAMPED = "torchtitan b5bcd76c gpt_oss/moe.py swiglu (transformers 5.24.0 GptOssExperts._apply_gate)"


def sink_terms(tokens: int, heads: int, q_width: int, d: int) -> list[tuple[str, int, str]]:
    """The sinks' rescale of flash's output, for `heads` heads (q_width wide) over `tokens` tokens."""
    return [
        ("flash output O before the sinks' rescale (the product keeps it)", tokens * q_width * d, TORCHTITAN),
        ("sigmoid(lse - sink) output (fp32 per head and token)", FP32 * tokens * heads, TORCHTITAN),
        ("the sinks' scale in the activation dtype (the product's other factor)", d * tokens * heads, TORCHTITAN),
    ]


def clamped_swiglu_terms(tokens: int, width: int, d: int, which: str) -> list[tuple[str, int, str]]:
    """GPT-OSS's clamped SwiGLU of `width` (f, per device) over `tokens` routed tokens: 7·f each."""
    one = tokens * width * d
    return [
        (f"{which}gate/up projection output with its bias (both clamps' input, 2f)", 2 * one, CLAMPED),
        (f"{which}clamped gate (the gate product's first factor)", one, CLAMPED),
        (f"{which}sigmoid(1.702 gate) output", one, CLAMPED),
        (f"{which}gated half (addcmul's first factor)", one, CLAMPED),
        (f"{which}clamped up half (addcmul's second factor)", one, CLAMPED),
        (f"{which}product (down projection input)", one, CLAMPED),
    ]
