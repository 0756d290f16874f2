"""Each selective recompute part's rerun on Transformer Engine's fused kernels, as Megatron-core reruns the
module (te_fused.te_time's record carries them beside the full rerun; planner/cost/fusedkernels.py puts
them in place of the eager reruns analytic_kept.selective_options records, a combination's being the sum of
its parts' as there).

What each of ckplan's parts reruns under Megatron-LM's `--recompute-modules` (Megatron-LM d98e8a64,
docs/framework-facts.md §33, §104), on the kernels te_fused.py and te_moe.py / te_mla.py count:
- `core-attn` (core_attn, a normal checkpoint of `core_attention`): the attention forward, at the rate TE's
  DotProductAttention runs it (cuDNN's fused attention: te_attention_gpu, te_mla.attention_gpu);
- `mla-up` (mla_up_proj, `qkv_up_proj_and_rope_apply` in a CheckpointWithoutOutput): the up projections
  with the latent norms inside them (TE's RMSNorm) and Megatron's fused MLA rotary (te_mla.fused_bytes);
- `mlp` on a dense block (mlp, a normal checkpoint of `self.mlp` from the MLP norm's output): linear_fc1,
  a TELayerNormColumnParallelLinear under the TE spec, so the MLP norm on TE's kernel (a GPT block's
  LayerNorm at the eager count te_fused keeps for it), gate and up as one GEMM, the fused bias-SwiGLU /
  bias-GELU, linear_fc2;
- `mlp` on a MoE block (moe, the MoELayer checkpointed from its input): the router, permutations and the
  experts' weighted activation as te_moe.routed_bytes fused, each local expert's linear_fc1 as one GEMM,
  the shared experts' fused SwiGLU;
- `mlp-act`: the activation alone (moe_act on a MoE block's experts: Megatron's weighted GLU, te_moe's
  WEIGHTED_GLU_FWD and the routing weight; on a dense block, which Megatron cannot express, the same fused
  kernel as its forward runs);
- `norm-out` (layernorm: the norms that are modules of their own, a latent-attention block's
  input_layernorm and a MoE block's pre_mlp_layernorm, TENorm): each norm's forward on TE's kernel.
Whole-attention `attn` (no Megatron module) keeps its eager rerun. The bytes no fused kernel moves stay
at the eager count, each in its op class (membound.OP_CLASSES) as the eager rerun has it less the classes' bytes
the fused kernels replace, as te_fused.te_time's passes keep theirs: a MoE rerun's shared-experts' add
(elementwise), a GPT block's LayerNormLinear LayerNorm (layer_norm), GPT-OSS's eager clamp in a moe_act rerun
(activation, te_moe_eager's class). Before, each rebuilt rerun dropped its classes and ran at the eager mean.

Under FP8 (Transformer Engine's current scaling, Megatron-Bridge 25.11's FP8-CS; TE v2.9, megatron-core 92c8482e,
docs/framework-facts.md §113) `float8_parts` gives the block's Float8 record each part's FP8 rerun beside `full`'s:
- `mlp` (dense: `te_checkpoint(self.mlp, ...)`, transformer_layer.py 648-663; MoE: the MoE layer's `te_checkpoint`,
  §104): TE's `checkpoint` (reentrant by default) runs the module's first forward under `torch.no_grad()` and
  reruns it whole in the backward under `torch.enable_grad()` and `autocast(enabled=ctx.fp8, recipe=ctx.fp8_recipe)`
  (transformer_engine/pytorch/distributed.py 316-430 at v2.9): the rerun's linears are FP8 GEMMs, each input
  quantized again with its column-wise usage (grad on: the Hopper transpose, float8.te_input_bytes); the weights'
  FP8 copies are the step's cached workspace (`get_weight_workspace`, not cast again: the record's weight cast is
  once a step under TE). Dense: linear_fc1 (its norm with the amax) and linear_fc2; MoE: each local expert's
  linear_fc1 and linear_fc2 (the router's gating linear and the shared experts stay bf16, as the record's forward);
- `mlp-act` on a MoE block (moe_act): the weighted GLU rerun in a `CheckpointWithoutOutput(fp8=...)`, and under FP8
  Megatron sets `set_save_original_input(linear_fc2)` (experts.py 99-105), so linear_fc2 saves its bf16 input (the
  GLU's output, the checkpoint's discarded output) and its backward quantizes it again, row-wise and column-wise
  (grouped_linear.py 392-407: `split_quantize` with `set_usage(rowwise=True, columnwise=True)` for current
  scaling): 5 B (+1 B Hopper) an element of S x f, after the rerun;
- `core-attn`, `norm-out` and a dense `mlp-act` rerun no FP8 linear: their bf16 reruns stand. (layernorm under FP8
  sets `save_original_input` on a MoE block's shared experts' linear_fc1, which the record does not run in FP8.)
Not charged: the first forward of a checkpointed module runs under no_grad, so its quantizes write no column-wise
copy (the Hopper transpose, 1 B an element of the module's inputs, not written in the forward; as for `full`).
"""

from __future__ import annotations

from collections import Counter

from planner.profiler import analytic_time, float8, te_mla, te_moe, te_moe_eager, te_moe_float8
from planner.profiler.roofline import Work, roofline_ms, work
from planner.profiler.te_bytes import (
    GELU_FUSED_FWD,
    SWIGLU_FUSED_FWD,
    TE_NORM_FWD,
    TE_RMSNORM_TOKEN,
)

PARTS = ("core-attn", "mla-up", "mlp", "mlp-act", "norm-out")


def _replaced(done: Work, replaced: Counter, fused: int) -> Work:
    """`done` with the eager ops' bytes `replaced` (by op class) moved as `fused` bytes by fused kernels; the eager
    bytes left keep their classes, less those `replaced` (te_fused._on_fused's way)."""
    moved = max(done.bytes - sum(replaced.values()), 0) + fused
    classes = Counter(dict(done.classed))
    classes.subtract(replaced)
    return work(done.flops, moved, list(Counter(dict(done.kernels)).elements()), fused_bytes=min(fused, moved),
                classed=+classes)


def te_norm_fwd_bytes(arch, shape) -> int:
    """One of the block's norms forward on TE's RMSNorm: x read, y written, 1/rms per row (te_bytes)."""
    rows = shape.tokens // shape.sp_div
    return TE_NORM_FWD * rows * arch.hidden_size + TE_RMSNORM_TOKEN * rows


def part_works(arch, shape, *, moe: bool, fused_gemms) -> dict[str, Work]:
    """Each part's rerun Work on TE's kernels (the module docstring); `fused_gemms(work, arch, shape, times)`
    is te_fused's merging of Q/K/V and gate/up into one GEMM each."""
    T, f = shape.tokens, arch.intermediate_size // shape.tp
    works = {"core-attn": analytic_time.rerun_work(arch, shape, "core-attn")}
    if arch.mla:
        up = analytic_time.rerun_work(arch, shape, "mla-up")
        works["mla-up"] = _replaced(up, te_mla.eager_classes(arch, shape)[0], te_mla.fused_bytes(arch, shape)[0])
    if moe:
        mixture = analytic_time.rerun_work(arch, shape, "mlp", moe=True)
        shared = te_moe.shared_swiglu_elements(arch, shape)
        eager = te_moe.eager_routed_classes(arch, shape)[0] + Counter(activation=analytic_time.SWIGLU_FWD * shared)
        fused = te_moe.routed_bytes(arch, shape)[0] + SWIGLU_FUSED_FWD * shared
        works["mlp"] = te_moe_float8.grouped_fc1(fused_gemms(_replaced(mixture, eager, fused), arch, shape, 1),
                                                 arch, shape, 1)
        S, width = T * arch.num_experts_per_tok, arch.moe_intermediate_size // shape.tp
        act = te_moe.WEIGHTED_GLU_FWD * S * width + te_moe.weight_bytes(arch)[0] * S
        clamp = te_moe_eager.act_rerun_bytes(arch, shape)  # the eager clamp (te_moe_eager's class: activation)
        works["mlp-act"] = work(0, act + clamp, [], fused_bytes=act, classed={"activation": clamp})
    else:
        dense = analytic_time.rerun_work(arch, shape, "mlp", moe=False)
        if arch.style == "gpt":  # the fused bias-GELU; LayerNormLinear's LayerNorm as te_fused counts it (eager)
            eager, act = Counter(activation=analytic_time.ACT_BYTES[arch.mlp_act][0] * T * f), GELU_FUSED_FWD * T * f
            works["mlp"] = _replaced(dense, eager, act) + analytic_time.rerun_work(arch, shape, "norm")  # layer_norm
        else:
            eager, act = Counter(activation=analytic_time.SWIGLU_FWD * T * f), SWIGLU_FUSED_FWD * T * f
            norm = te_norm_fwd_bytes(arch, shape)
            works["mlp"] = fused_gemms(_replaced(dense, eager, act + norm), arch, shape, 1)
        works["mlp-act"] = Work(0, act, (), act)
    norms = int(arch.mla) + int(moe)  # analytic_kept.norm_out_bytes's: the norms that are modules of their own
    if norms:
        works["norm-out"] = Work(0, norms * te_norm_fwd_bytes(arch, shape), (), norms * te_norm_fwd_bytes(arch, shape))
    return works


def part_reruns(arch, shape, kernels_gpu, *, moe: bool, fused_gemms) -> dict[str, float]:
    """Each part's rerun in ms on `kernels_gpu` (the GPU as TE's attention runs on it), by part name."""
    return {name: roofline_ms(done, kernels_gpu) for name, done in part_works(arch, shape, moe=moe, fused_gemms=fused_gemms).items()}


def float8_parts(arch, shape, kernels_gpu, *, moe: bool, fused_gemms, prefix: str,
                 delayed: bool = False) -> tuple[dict[str, float], dict[str, float]]:
    """Under TE's FP8 current scaling (`delayed`: delayed scaling, a dense block's), each part whose rerun runs FP8
    linears or quantizes (the module's docstring), in ms: (the rerun, its weights' cast as the record's
    rerun_weight_cast_ms has it), by part name."""
    works = part_works(arch, shape, moe=moe, fused_gemms=fused_gemms)
    reruns, casts = {}, {}
    if "mlp" in works:
        linears = te_moe_float8.expert_linears(arch, shape, prefix) if moe else \
            float8.converted(float8.te_linears(arch, shape, prefix))[2:]  # linear_fc1, linear_fc2
        rerun, weights = float8.te_forward(works["mlp"], linears, kernels_gpu, delayed=delayed)
        if weights:
            reruns["mlp"] = roofline_ms(rerun, kernels_gpu)
            casts["mlp"] = float8._bytes_ms(float8.weight_cast_bytes(weights, delayed=delayed), kernels_gpu)
    if moe and "mlp-act" in works:  # linear_fc2's bf16 input quantized again in its backward (save_original_input)
        fc2 = [linear for linear in te_moe_float8.expert_linears(arch, shape, prefix) if ".linear_fc2." in linear.fqn]
        quantize = sum(float8.te_input_bytes(linear, kernels_gpu) for linear in fc2)
        act = works["mlp-act"]
        reruns["mlp-act"] = roofline_ms(Work(act.flops, act.bytes + quantize, act.kernels, act.fused_bytes + quantize,
                                             act.classed), kernels_gpu)
        casts["mlp-act"] = 0.0
    return reruns, casts


def with_float8_parts(record, arch, shape, kernels_gpu, *, moe: bool, fused_gemms, prefix: str,
                      delayed: bool = False):
    """The block's Float8 record (float8.record's, te_moe_float8.record's) with float8_parts' reruns beside its full
    one; None stays None."""
    if record is None:
        return None
    reruns, casts = float8_parts(arch, shape, kernels_gpu, moe=moe, fused_gemms=fused_gemms, prefix=prefix,
                                 delayed=delayed)
    return record.model_copy(update={"recompute_ms": {**record.recompute_ms, **reruns},
                                     "rerun_weight_cast_ms": {**record.rerun_weight_cast_ms, **casts}})
