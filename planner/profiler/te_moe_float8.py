"""A Megatron-core MoE block's passes under Transformer Engine's FP8 current scaling (Megatron-Bridge 25.11's
FP8-CS: `fp8_recipe="tensorwise"`, TE v2.9, megatron-core 92c8482e; docs/framework-facts.md §99): the Float8
record te_fused.te_time gives a MoE block (te_fused._moe_time), on the block's TE-fused passes.

Which linears run in FP8 (TE modules under `fp8_autocast`): the attention's linear_qkv (TE LayerNormLinear: the
input norm's kernel writes its output with its amax, then one quantize) and linear_proj (TE Linear), and the
experts' linear_fc1 and linear_fc2 (TE GroupedLinear over the rank's E / ep local experts: one GEMM an expert
over its rows, linear_fc1 gate and up in one 2f-wide weight). The router's gating linear is a torch linear
(megatron/core/transformer/moe/router.py `router_gating_linear`) and the pre-MLP norm a TENorm (the MoE spec does
not fuse it, gpt_layer_specs.py `fuse_pre_mlp_layernorm = False` for experts): both stay bf16.

What each FP8 GEMM costs beyond its matmul at the FP8 rate (roofline "matmul-fp8"):
- a GroupedLinear's input: `tex.split_quantize(inp, m_splits, input_quantizers)` (grouped_linear.py 127 at
  v2.9), which for current-scaling quantizers quantizes split by split (cast.cpp `multi_tensor_quantize_impl`:
  the fused multi cast-transpose is for delayed scaling only), each `Float8CurrentScalingQuantizer::quantize_impl`
  (quantizer.cpp 497-536): `nvte_compute_amax` (the bf16 input read, 2 B), the scale from the amax, then
  `nvte_quantize_v2` (read 2 B, the row-wise FP8 written 1 B and, where the column-wise usage is asked for and the
  GPU runs only TN FP8 GEMMs (Hopper), the transpose written 1 B): 5 B an element, 6 B on Hopper. The input asks
  for column-wise usage where the weight needs a gradient (`columnwise=is_grad_enabled and weight_requires_grad`,
  grouped_linear.py 96-104): every training forward;
- linear_proj's input the same; linear_qkv's from the norm with its amax: 3 B (+1 B the Hopper transpose);
- each linear's grad_output in the backward: `split_quantize` (GroupedLinear, no bias: grouped_linear.py 316-326)
  or the Linear's quantize, row-wise for the dgrad GEMM and column-wise for the wgrad GEMM: 5 B, 6 B on Hopper;
- the saved FP8 inputs are used as they are in the backward (no recast): the forward keeps the column-wise copy
  (`inputmat.update_usage(rowwise_usage=False, columnwise_usage=True)`, grouped_linear.py 199-204).
Megatron pads each expert's rows to a multiple of 16 under FP8 (experts.py 860-866, TE Fp8Padding) and unpads
linear_fc2's output: Fp8Padding returns its input only where every split is aligned already (fp8_padding.py
121-122), which the rows' random routing (--moe-router-force-load-balancing: RandomSTE) almost never gives: the
copies charged each way (te_moe_eager.fp8_padding_bytes, at the fused rate).
The weights: under `--fp8-param-gather` they are FP8 already (no cast, the cost model's weight_cast_ms is not
charged, planner/cost/float8.py); else TE caches each weight's cast once a step (`get_weight_workspace`,
grouped_linear.py 131-145), weight_cast_ms over the rank's held weights (the attention's and its local experts').

Not charged: the amax's scale kernels and the per-split launches' host time (16 local experts: three kernels each
way each, which the host replica of hosttime.py did not time), the router's aux-loss scores.
"""

from __future__ import annotations

from collections import Counter

from planner.profiler import float8, formulas, te_moe_eager
from planner.profiler.roofline import Kernel, Work, roofline_ms, work
from planner.schema import Float8Linears

# the Hopper transpose and the quantizes' bytes are the dense TE record's (planner/profiler/float8.py: one count for
# both records): TN_ONLY_GPUS, transpose_bytes, te_input_bytes, te_grad_bytes, te_forward, te_backward
TN_ONLY_GPUS, transpose_bytes = float8.TN_ONLY_GPUS, float8.transpose_bytes


def expert_linears(arch, shape, prefix: str) -> list[float8.Linear]:
    """The rank's local experts' GEMMs as TE's GroupedLinear runs them: per local expert, linear_fc1 (its rows x
    h -> 2f: gate and up in one weight) and linear_fc2 (f -> h), f the experts' width / TP."""
    local, rows = formulas.expert_gemm_shape(arch, shape)
    h, f, full_f = arch.hidden_size, arch.moe_intermediate_size // shape.tp, arch.moe_intermediate_size
    linears = []
    for index in range(local):
        linears.append(float8.Linear(f"{prefix}.mlp.experts.linear_fc1.{index}", rows, h, 2 * f, h, 2 * full_f))
        linears.append(float8.Linear(f"{prefix}.mlp.experts.linear_fc2.{index}", rows, f, h, full_f, h))
    return linears


def grouped_fc1(done: Work, arch, shape, times: int) -> Work:
    """`done` with each local expert's gate and up GEMMs as linear_fc1's one GEMM of width 2f (`times` each: 1
    forward, 2 backward); as it is where the pass does not run them."""
    local, rows = formulas.expert_gemm_shape(arch, shape)
    part = Kernel("matmul", 2 * rows * arch.hidden_size * (arch.moe_intermediate_size // shape.tp))
    kernels = Counter(dict(done.kernels))
    # each expert runs gate, up and down, all three of the same FLOPs: 3 x local of them, 2 x local merged
    if kernels[part] < 3 * local * times:
        return done
    kernels[part] -= 2 * local * times
    kernels[Kernel("matmul", 2 * part.flops)] += local * times
    return work(done.flops, done.bytes, list((+kernels).elements()), fused_bytes=done.fused_bytes,
                classed=done.classed)


def moe_linears(arch, shape, prefix: str) -> list[float8.Linear]:
    """The block's FP8 linears in the order it runs them: linear_qkv, linear_proj, then the experts'."""
    return float8.te_linears(arch, shape, prefix)[:2] + expert_linears(arch, shape, prefix)


def forward_work(done: Work, linears: list[float8.Linear], gpu) -> tuple[Work, int]:
    """A forward (or rerun): each linear's GEMM in FP8 and its input quantized (each expert's split its own rows:
    float8.te_input_bytes, linear_qkv's from the norm's amax); the weight elements of the linears it runs."""
    return float8.te_forward(done, linears, gpu)


def backward_work(done: Work, linears: list[float8.Linear], gpu) -> Work:
    """A backward: each linear's dgrad and wgrad GEMMs in FP8 and its grad_output quantized once for both
    (float8.te_grad_bytes); the saved FP8 input used as it is."""
    return float8.te_backward(done, linears, gpu)


def record(arch, shape, gpu, fwd: Work, bwd: Work, rerun: Work, *, prefix: str) -> Float8Linears | None:
    """The block's Float8 record on its TE-fused passes (`fwd`, `bwd`, `rerun`: te_fused._moe_time's, the experts'
    gate and up already one GEMM, grouped_fc1): the linears' GEMMs at the FP8 rate, their inputs' and output
    gradients' quantizes at the fused rate (the module's docstring). None where the GPU has no FP8 tensor cores
    or a linear's dims are not multiples of 16 (TE's FP8 GEMMs need them)."""
    linears = moe_linears(arch, shape, prefix)
    if not gpu.fp8_tflops or len(float8.converted(linears, ())) < len(linears):
        return None
    (fwd8, weights), (rerun8, rerun_weights) = forward_work(fwd, linears, gpu), forward_work(rerun, linears, gpu)
    bwd8 = backward_work(bwd, linears, gpu)
    pad = te_moe_eager.fp8_padding_bytes(arch, shape)  # TE's row padding around the grouped GEMMs
    fwd8, bwd8, rerun8 = _with_fused(fwd8, pad[0]), _with_fused(bwd8, pad[1]), _with_fused(rerun8, pad[0])
    attention = linears[:2]
    return Float8Linears(
        # the dense (non-expert) FP8 weights: the cost model holds the experts' apart (expert_param_count)
        param_count=sum(linear.weight_elements for linear in attention),
        fwd_ms=roofline_ms(fwd8, gpu), bwd_ms=roofline_ms(bwd8, gpu), bwd_input_recast_ms=0.0,
        recompute_ms={"full": roofline_ms(rerun8, gpu)} if rerun_weights else {},
        weight_cast_ms=float8._bytes_ms(float8.weight_cast_bytes(weights), gpu),
        rerun_weight_cast_ms={"full": float8._bytes_ms(float8.weight_cast_bytes(rerun_weights), gpu)}
        if rerun_weights else {},
        transient_bytes=grad_output_copies(arch, shape, gpu, attention))


def _with_fused(done: Work, extra: int) -> Work:
    """`done` with `extra` bytes more moved by fused (TE) kernels."""
    return work(done.flops, done.bytes + extra, list(Counter(dict(done.kernels)).elements()),
                fused_bytes=done.fused_bytes + extra, classed=done.classed)


def grad_output_copies(arch, shape, gpu, attention: list[float8.Linear]) -> int:
    """The FP8 copies of a grad_output alive at once in the backward beyond the bf16 block's: the largest of the
    attention linears' and the experts' linear_fc1's (all local experts' splits, S x 2f), row-wise and, on Hopper,
    column-wise."""
    local, rows = formulas.expert_gemm_shape(arch, shape)
    copies = 1 + transpose_bytes(gpu)
    fc1 = local * rows * 2 * (arch.moe_intermediate_size // shape.tp)
    return copies * max([fc1] + [linear.tokens * linear.n for linear in attention])
