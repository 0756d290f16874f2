"""The memory-bound bytes GPT-OSS's blocks move beyond a LLaMA-style MoE block's (planner/profiler/analytic_time.py
block_work adds them, by op class), per pass, as eager PyTorch runs torchtitan b5bcd76c's code:
- the experts' clamped SwiGLU (gpt_oss/moe.py swiglu: two strided slices, two clamps, sigmoid, product, addcmul):
  30 B forward and 100 B backward per element of each routed token's f-wide output, where SiLU's SwiGLU moves 10
  and 18 (analytic_time's SWIGLU_FWD, SWIGLU_BWD, which the block already charges: the difference is added);
- each expert's two biases, repeated per routed row and added (GptOssGroupedExperts.forward's b1_RG, b2_RD):
  8 B forward and 14 B backward per element of the biased output (2f and h per routed token);
- the sinks' rescale of flash's output (gpt_oss/model.py apply_attention_sink_rescale: sigmoid(lse - sink) in
  fp32, cast, product): 280 B forward and 802 B backward per token and head at head_dim 64 (GPT-OSS's);
- the attention linears' and the router's biases: their gradient summed over the tokens in backward (aten.sum
  over rows: the gradient read once, 2 B per element, analytic_time's BIAS_SUM); added in the forward inside the
  matmul (addmm), nothing more.
Each figure counted op by op by ckplan's fake profiler (planner/profiler/fake.py OpBytes) on that code:
`PYTHONPATH=$PWD python scripts/gptoss_opbytes.py` prints them (the SiLU SwiGLU's 10 and 18 beside, as a check).
"""

from __future__ import annotations

from collections import Counter

from planner.models.archs import Arch
from planner.profiler import formulas

CLAMPED_SWIGLU_FWD, CLAMPED_SWIGLU_BWD = 30, 100
SILU_SWIGLU_FWD, SILU_SWIGLU_BWD = 10, 18  # what analytic_time already charges each routed token's f
EXPERT_BIAS_FWD, EXPERT_BIAS_BWD = 8, 14
SINKS_FWD, SINKS_BWD = 280, 802  # per token and head, head_dim 64
BIAS_GRAD_SUM = 2


def extra_bytes(arch: Arch, shape: formulas.Shape, *, moe: bool) -> tuple[Counter, Counter]:
    """(forward, backward) bytes by op class that a GPT-OSS block moves beyond a LLaMA-style MoE block; none
    for another model."""
    fwd, bwd = Counter(), Counter()
    T, h = shape.tokens, arch.hidden_size
    if arch.attention_sinks and not arch.sinks_in_kernel and shape.attention == "flash":  # torchtitan's eager rescale
        heads = arch.num_heads // shape.tp
        fwd["attention"] += SINKS_FWD * T * heads
        bwd["attention"] += SINKS_BWD * T * heads
    if arch.qkv_bias or arch.o_bias:
        widths = formulas.q_width(arch, shape) + 2 * formulas.kv_width(arch, shape) if arch.qkv_bias else 0
        bwd["elementwise"] += BIAS_GRAD_SUM * T * (widths + (h if arch.o_bias else 0))
    if moe and arch.num_experts and (arch.swiglu_limit or arch.expert_bias):
        slots = arch.num_experts * formulas.expert_tokens(arch, shape)
        f = arch.moe_intermediate_size // shape.tp
        if arch.swiglu_limit:
            fwd["activation"] += (CLAMPED_SWIGLU_FWD - SILU_SWIGLU_FWD) * slots * f
            bwd["activation"] += (CLAMPED_SWIGLU_BWD - SILU_SWIGLU_BWD) * slots * f
        if arch.expert_bias:
            fwd["elementwise"] += EXPERT_BIAS_FWD * slots * (2 * f + h)
            bwd["elementwise"] += EXPERT_BIAS_BWD * slots * (2 * f + h) + BIAS_GRAD_SUM * T * arch.num_experts
    return +fwd, +bwd
