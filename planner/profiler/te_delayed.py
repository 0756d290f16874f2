"""A Megatron-core TE block's Float8 passes under Transformer Engine's delayed scaling (TE v2.9 `DelayedScaling`,
Megatron-LM's `--fp8-recipe delayed`, its default; docs/framework-facts.md §235-§238): the record's
Float8Delayed, beside the tensorwise current-scaling record (planner/profiler/float8.py te_forward, te_backward).

What a quantize moves, per element (the GEMMs are the same FP8 GEMMs either way):
- a Linear's input, a grad_output, a weight: `Float8Quantizer::quantize` (csrc/quantizer.cpp 276-288) runs one
  `nvte_quantize_v2` with the scale the amax history gave; the kernel writes the tensor's amax as it casts (no
  amax pass): the bf16 read (2 B) and the FP8 write (1 B), float8.DELAYED_CAST_BYTES = 3, and on Hopper, where the
  column-wise usage is asked for, the transpose written by the same cast-transpose (1 B, float8.transpose_bytes);
- a LayerNormLinear's input: the norm runs FULLY_FUSED for Float8Quantizers (csrc/extensions/normalization.cpp
  107-109, 331-333): the norm kernel writes FP8 itself, 1 B an element where the bf16 block's norm (which the
  profile's passes already count) writes 2: float8.DELAYED_NORM_BYTES = -1; where the FP8 output has column-wise data
  (Hopper, under grad) `nvte_rmsnorm_fwd` / `nvte_layernorm_fwd` then run `nvte_transpose` over it
  (common/normalization/rmsnorm/rmsnorm_api.cpp 96-103, layernorm/ln_api.cpp alike): read 1 B, write 1 B,
  float8.DELAYED_NORM_TRANSPOSE_BYTES = 2 (float8.te_input_bytes under `delayed`). (Under current scaling the norm
  writes bf16 and its amax, then `quantize_with_amax` reads it: float8.TE_NORM_CAST_BYTES.)

The block's TE modules under the autocast, each by its num_gemms (its meta buffers: module/base.py 765-775, three
forward and two backward quantizers a GEMM): linear_qkv and linear_fc1 (LayerNormLinear, 1), linear_proj and
linear_fc2 (Linear, 1), and core_attention (TE DotProductAttention: `prepare_forward(..., num_gemms=3)`,
dot_product_attention.py 978-980, which allocates its delayed-scaling state whether or not it runs in FP8, 756-776).
A MoE block's record (te_moe_float8.py) has no delayed record: its experts' `split_quantize` runs TE's fused multi
cast-transpose under delayed scaling (cast.cpp 103-150), not read here; the cost model charges it as tensorwise and
says so (planner/cost/te_delayed.py).
"""

from __future__ import annotations

from planner.profiler import float8
from planner.schema import Float8Delayed

# a dense block's TE modules, by num_gemms, in the order they run: linear_qkv, core_attention, linear_proj,
# linear_fc1, linear_fc2 (the module's docstring)
DENSE_MODULE_GEMMS = (1, 3, 1, 1, 1)


def delayed_record(linears: list[float8.Linear], gpu, fwd, bwd, reruns: dict, *,
                   parts: tuple[dict[str, float], dict[str, float]]) -> Float8Delayed | None:
    """The block's Float8Delayed from its TE passes (`fwd`, `bwd`, the reruns by option) with its converted TE
    `linears` (float8.te_linears), and `parts` (te_rerun.float8_parts under delayed scaling: the selective parts'
    reruns and their weights' casts); None where no linear converts or the GPU has no FP8 tensor cores."""
    made = float8.record(linears, gpu, fwd, bwd, reruns, te=True, delayed=True)
    if made is None:
        return None
    return Float8Delayed(fwd_ms=made.fwd_ms, bwd_ms=made.bwd_ms, recompute_ms={**made.recompute_ms, **parts[0]},
                         weight_cast_ms=made.weight_cast_ms,
                         rerun_weight_cast_ms={**made.rerun_weight_cast_ms, **parts[1]},
                         module_gemms=list(DENSE_MODULE_GEMMS))
