"""A dense block's passes as Megatron-core runs them on Transformer Engine's layers: the same matmul
and attention kernels as the eager block (analytic_time.block_work), with the memory-bound ops that
Megatron-core and TE fuse moving what their fused kernels move.

Which ops are fused, and what each kernel reads and writes per element (bf16 activations):
- the norms: Megatron-core's TE layer spec has no separate norm module for the block's two norms
  (`input_layernorm` and `pre_mlp_layernorm` are IdentityOp; TELayerNormColumnParallelLinear runs the
  norm inside linear_qkv and linear_fc1: megatron/core/models/gpt/gpt_layer_specs.py, Megatron-LM
  6e091e1b). TE's LayerNormLinear normalises with one kernel (`apply_normalization`,
  transformer_engine/pytorch/module/layernorm_linear.py 208; rmsnorm_fwd_cuda_kernel.cu, TE v2.9):
  x read (2 B) and the normalised output written (2 B), plus 1/rms per token (4 B; LayerNorm also its
  mean: 8 B); backward one kernel (`tex.rmsnorm_bwd` / `tex.layernorm_bwd`, layernorm_linear.py
  955-966): grad and x read, dx written (6 B), the statistics read per token. Eager RMSNorm with its
  fp32 upcast moves 36 and 96 B (LLaMA's; each architecture's own: norm_bytes.rms_norm);
- rotary: under `apply_rope_fusion` Megatron-core calls TE's fused_apply_rotary_pos_emb (megatron/core/
  models/common/embeddings/rope_utils.py 21, Megatron-LM d98e8a64; TE transformer_engine/common/
  fused_rope/fused_rope.cu): Q and K read and written once each way (4 B), the table read per token;
  eager rotary moves 20 and 32 B;
- SwiGLU: `bias_swiglu_impl` (megatron/core/fusions/fused_bias_swiglu.py, Megatron-LM 6e091e1b), whose
  functions are `jit_fuser` = torch.compile on torch >= 2.2 (megatron/core/jit.py): forward reads gate
  and up and writes the product (6 B per element of the width-f output), backward reads the gradient
  and both inputs and writes both gradients (10 B); eager SiLU and product move 10 and 18;
- GELU: `bias_gelu_impl` (megatron/core/fusions/fused_bias_gelu.py 15-52, 6e091e1b, jit_fuser as
  above): forward reads the fc1 output and writes the activation (4 B), backward reads the gradient and
  the input and writes the input's gradient (6 B); Hugging Face's gelu_new moves 36 and 56.
Attention runs TE's DotProductAttention, which picks cuDNN's fused attention (FusedAttention,
F16_arbitrary_seqlen) for causal bf16 attention on sm90 and later (transformer_engine/pytorch/attention/
dot_product_attention/utils.py get_attention_backend; common/fused_attn/fused_attn.cpp, TE v2.16): timed
at the GPU's published cuDNN figures (GPU.te_attention_efficiency: NVIDIA/cudnn-frontend's training SDPA
benchmark on H200 for the H100's chip, on GB200 and on B200), else at the GPU's attention figures as the
eager block (A100, where TE under deterministic mode runs FlashAttention-2). Under Megatron's
--deterministic-mode TE disables FusedAttention below sm90, runs cuDNN's deterministic backward on sm90
(utils.py 1293-1356, fused_attn.cpp 459-466, v2.16) and on sm100+ without attention dropout, and
FlashAttention-2 on sm100+ under dropout (fused_attn.cpp 461-470, v2.18): this record times the
non-deterministic kernels above; the cost model adds what the deterministic kernel TE picks takes beyond them
(planner/cost/jobsettings.py deterministic_attention_ms; the config reader says where no rate is published).
The linears: Megatron-core's TE spec builds one linear_qkv (Q, K and V in one weight) and, under
SwiGLU, one linear_fc1 (gate and up, 2 x ffn_hidden_size wide; megatron/core/transformer/attention.py
1406-1409, mlp.py 198-204, 6e091e1b): one GEMM each where the eager LLaMA block runs three and two,
and under FP8 one input cast each, TE's way (float8.te_linears; float8.te_forward, te_backward). A GPT block's
Q/K/V and fc are one linear already.
Unchanged: the residual adds and dropout, the weight gradients' accumulation, and the matmuls' FLOPs.
Megatron's fused bias-dropout-add (torch.compile'd) moves 7 B an element forward where the eager add and
dropout move 11 (it keeps a bool mask), but draws a 10-round Philox per element, which on sm80 / sm90 takes
about as long as the eager bytes (docs/framework-facts.md §72): left at the eager count, no measurement read.

Where the recipe turns a fusion off (Megatron-LM `--no-bias-gelu-fusion`, `--no-bias-swiglu-fusion`,
`--no-rope-fusion`, `--transformer-impl local`) the config readers say it; this record is the fused
block. A MoE block's record (gated experts, flash attention) adds Megatron's fused router, permutations,
weighted activation and TE's q/k norms (planner/profiler/te_moe.py); a latent-attention block (dense or MoE)
has its latent norms, fused MLA rotary and its attention at cuDNN's rate at that shape (te_mla.py). A dense
block's per-head q/k norms (`--qk-layernorm`: Megatron-core's `q_layernorm` / `k_layernorm`, TENorm on the TE
spec, megatron/core/transformer/attention.py 1712-1750, 1932-1936, d98e8a64) run on TE's norm kernels as a
MoE block's do (te_moe.qk_norm_bytes).
"""

from __future__ import annotations

from collections import Counter

from planner.models.attention_rates import te_attention_gpu
from planner.profiler import analytic_time, float8, formulas, te_delayed, te_mla, te_moe, te_rerun
from planner.profiler.membound import membound_ms
from planner.profiler.norm_bytes import rms_norm
from planner.profiler.roofline import Kernel, Work, roofline_ms, work
from planner.profiler.te_bytes import (
    GELU_FUSED_BWD,
    GELU_FUSED_FWD,
    ROPE_FUSED_BWD,
    ROPE_FUSED_FWD,
    SWIGLU_FUSED_BWD,
    SWIGLU_FUSED_FWD,
    TE_NORM_BWD,
    TE_NORM_FWD,
    TE_RMSNORM_TOKEN,
)
from planner.schema import OPTION_FULL, FusedKernelTime


def fused_bytes_saved(arch, shape) -> tuple[int, int] | None:
    """(forward, backward) bytes the fused kernels move less than the eager block's memory-bound ops
    (analytic_time.block_work); None for a block whose fused kernels were not read."""
    if shape.attention != "flash":
        return None
    T, h = shape.tokens, arch.hidden_size
    rows = T // shape.sp_div
    f = arch.intermediate_size // shape.tp
    qk = _qk_saved(arch, shape)
    if arch.style == "gpt":
        if arch.mlp_act == "relu":  # Megatron-core's fused bias-activations are GELU's and SwiGLU's
            return None
        act_fwd, act_bwd = analytic_time.ACT_BYTES[arch.mlp_act]
        rope = te_mla.saved_bytes(arch, shape) if arch.mla else _rope_saved(arch, shape)
        return ((act_fwd - GELU_FUSED_FWD) * T * f + rope[0] + qk[0],
                (act_bwd - GELU_FUSED_BWD) * T * f + rope[1] + qk[1])
    norm_fwd, norm_bwd = _norms_saved(arch, rows, h)
    rope = te_mla.saved_bytes(arch, shape) if arch.mla else _rope_saved(arch, shape)
    swiglu = ((analytic_time.SWIGLU_FWD - SWIGLU_FUSED_FWD) * T * f, (analytic_time.SWIGLU_BWD - SWIGLU_FUSED_BWD) * T * f)
    return norm_fwd + rope[0] + swiglu[0] + qk[0], norm_bwd + rope[1] + swiglu[1] + qk[1]


def _norms_saved(arch, rows: int, h: int) -> tuple[int, int]:
    """(forward, backward) bytes TE's norm inside linear_qkv and linear_fc1 moves less than the block's two eager
    norms as the architecture's code runs them (norm_bytes.rms_norm)."""
    norm = rms_norm(arch)
    return (2 * ((norm.fwd - TE_NORM_FWD) * rows * h + (norm.fwd_row - TE_RMSNORM_TOKEN) * rows),
            2 * ((norm.bwd - TE_NORM_BWD) * rows * h + (norm.bwd_row - TE_RMSNORM_TOKEN) * rows))


def _qk_saved(arch, shape) -> tuple[int, int]:
    """(forward, backward) bytes TE's per-head q/k norms move less than their eager count (none without them)."""
    eager, fused = te_moe.qk_norm_bytes(arch, shape, fused=False), te_moe.qk_norm_bytes(arch, shape, fused=True)
    return eager[0] - fused[0], eager[1] - fused[1]


def _rope_saved(arch, shape) -> tuple[int, int]:
    """(forward, backward) bytes TE's fused rotary moves less than the eager rotation of Q and K (none
    where the model has no rotary positions)."""
    if not arch.rotates:
        return 0, 0
    rotated = shape.tokens * (formulas.q_width(arch, shape) + formulas.kv_width(arch, shape))
    return ((analytic_time.ROTARY_FWD - ROPE_FUSED_FWD) * rotated, (analytic_time.ROTARY_BWD - ROPE_FUSED_BWD) * rotated)


def fused_kernel_bytes(arch, shape) -> tuple[int, int]:
    """(forward, backward) bytes the fused kernels themselves move (the norms, rotary and the
    activation: the module's docstring), for the roofline's fused rate (Work.fused_bytes); the rest of
    the block's memory-bound bytes are eager ops'. Only where fused_bytes_saved gives a record."""
    T, h = shape.tokens, arch.hidden_size
    rows, f = T // shape.sp_div, arch.intermediate_size // shape.tp
    rotated = T * (formulas.q_width(arch, shape) + formulas.kv_width(arch, shape)) if arch.rotates else 0
    rope = ROPE_FUSED_FWD * rotated, ROPE_FUSED_BWD * rotated
    if arch.mla:  # the latent norms on TE's RMSNorm and Megatron's fused MLA rotary (te_mla.py)
        rope = te_mla.fused_bytes(arch, shape)
    qk = te_moe.qk_norm_bytes(arch, shape, fused=True)  # the per-head q/k norms (none without them)
    rope = rope[0] + qk[0], rope[1] + qk[1]
    if arch.style == "gpt":
        return GELU_FUSED_FWD * T * f + rope[0], GELU_FUSED_BWD * T * f + rope[1]
    norm_fwd = 2 * (TE_NORM_FWD * rows * h + TE_RMSNORM_TOKEN * rows)
    norm_bwd = 2 * (TE_NORM_BWD * rows * h + TE_RMSNORM_TOKEN * rows)
    return (norm_fwd + rope[0] + SWIGLU_FUSED_FWD * T * f,
            norm_bwd + rope[1] + SWIGLU_FUSED_BWD * T * f)


def te_time(arch, shape, gpu, passes: tuple[Work, Work, Work], *, moe: bool,
            prefix: str = "layers.0") -> FusedKernelTime | None:
    """The block's forward, backward and full-recompute rerun (`passes`: analytic_time.block_work's), and
    each selective recompute part's rerun by part name (te_rerun.part_reruns),
    with the fused kernels' bytes, TE's fused linears (float8.te_linears) and attention at TE's rate
    (te_attention_gpu), and its Float8 record on those linears (planner/profiler/float8.py's, with TE's
    linears: one input cast per fused linear); None where no record is made (fused_bytes_saved, te_moe.counts_moe)."""
    if moe:
        return _moe_time(arch, shape, gpu, passes, prefix)
    saved = fused_bytes_saved(arch, shape)
    if saved is None:
        return None
    kernels_gpu = te_mla.attention_gpu(gpu) if arch.mla else te_attention_gpu(gpu)
    fused = fused_kernel_bytes(arch, shape)
    replaced = fused_classes(arch, shape)
    fwd, bwd, rerun = (_fused_gemms(_on_fused(done, cut, moved, gone), arch, shape, times)
                       for done, cut, moved, gone, times in zip(passes, (saved[0], saved[1], saved[0]),
                                                                (fused[0], fused[1], fused[0]),
                                                                (replaced[0], replaced[1], replaced[0]), (1, 2, 1)))
    bwd, accumulate = fused_accumulation(bwd, arch, shape, moe=False)
    linears = float8.converted(float8.te_linears(arch, shape, prefix))
    fp8 = None if arch.mla else float8.record(linears, kernels_gpu, fwd, bwd, {OPTION_FULL: rerun},
                                              te=True)  # an MLA block has no Float8 record
    fp8 = te_rerun.with_float8_parts(fp8, arch, shape, kernels_gpu, moe=False, fused_gemms=_fused_gemms, prefix=prefix)
    if fp8 is not None:  # the same passes under delayed scaling (te_delayed.py)
        parts = te_rerun.float8_parts(arch, shape, kernels_gpu, moe=False, fused_gemms=_fused_gemms, prefix=prefix,
                                      delayed=True)
        fp8 = fp8.model_copy(update={"delayed": te_delayed.delayed_record(linears, kernels_gpu, fwd, bwd,
                                                                          {OPTION_FULL: rerun}, parts=parts)})
    return FusedKernelTime(fwd_ms=roofline_ms(fwd, kernels_gpu), bwd_ms=roofline_ms(bwd, kernels_gpu),
                           recompute_ms={OPTION_FULL: roofline_ms(rerun, kernels_gpu),
                                         **te_rerun.part_reruns(arch, shape, kernels_gpu, moe=False,
                                                                fused_gemms=_fused_gemms)}, float8=fp8,
                           accumulate_ms=membound_ms(accumulate, kernels_gpu, "eager", "elementwise"))


def fused_classes(arch, shape) -> tuple[Counter, Counter]:
    """(forward, backward) eager bytes by op class (membound.OP_CLASSES) that the fused kernels replace in a dense
    block: the eager RMSNorms (class norm), rotary (attention) and SwiGLU or GELU (activation), each the fused
    kernel's bytes plus what fused_bytes_saved cuts; a latent-attention block's latent norms, rotary and
    transformers' copies in their eager classes (te_mla.eager_classes) in place of rotary's."""
    T, h = shape.tokens, arch.hidden_size
    rows, f = T // shape.sp_div, arch.intermediate_size // shape.tp
    rotary = tuple(Counter(part) for part in _rope_classes(arch, shape))  # a latent attention's may be negative
    for part, qk in zip(rotary, te_moe.qk_norm_bytes(arch, shape, fused=False)):  # the eager q/k norms (class norm)
        if qk:
            part.update(norm=qk)
    if arch.style == "gpt":
        act_fwd, act_bwd = analytic_time.ACT_BYTES[arch.mlp_act]
        return rotary[0] + Counter(activation=act_fwd * T * f), rotary[1] + Counter(activation=act_bwd * T * f)
    norms = _norm_classes(arch, rows, h)
    return (rotary[0] + norms[0] + Counter(activation=analytic_time.SWIGLU_FWD * T * f),
            rotary[1] + norms[1] + Counter(activation=analytic_time.SWIGLU_BWD * T * f))


def _rope_classes(arch, shape) -> tuple[Counter, Counter]:
    """(forward, backward) eager bytes by class of what TE's fused rotary replaces: the rotation of Q and K
    (attention), or a latent attention's norms, rotary and copies (te_mla.eager_classes)."""
    if arch.mla:
        return te_mla.eager_classes(arch, shape)
    rotated = shape.tokens * (formulas.q_width(arch, shape) + formulas.kv_width(arch, shape)) if arch.rotates else 0
    return +Counter(attention=analytic_time.ROTARY_FWD * rotated), +Counter(attention=analytic_time.ROTARY_BWD * rotated)


def _norm_classes(arch, rows: int, h: int) -> tuple[Counter, Counter]:
    """(forward, backward) eager bytes (class norm) of the block's two RMSNorms (the architecture's own:
    norm_bytes.rms_norm), which TE's norm replaces."""
    norm = rms_norm(arch)
    return Counter(norm=2 * norm.forward(rows * h, rows)), Counter(norm=2 * norm.backward(rows * h, rows))


def moe_classes(arch, shape) -> tuple[Counter, Counter]:
    """(forward, backward) eager bytes by op class that a MoE block's fused kernels replace (_moe_time's cut and
    fused bytes, split): the two norms (norm), rotary as _rope_classes (or, under YaRN's unfused rotary, the eager
    rotation less Megatron's own eager one: attention, negative where Megatron's moves more), and te_moe.moe_classes'
    router, permutations, activations and q/k norms. A class may be negative (Counter.update keeps it)."""
    from planner.profiler import te_moe, te_moe_eager

    rows = shape.tokens // shape.sp_div
    if te_moe_eager.unfused_rotary(arch):
        rotated = shape.tokens * (formulas.q_width(arch, shape) + formulas.kv_width(arch, shape))
        rope = (Counter(attention=(analytic_time.ROTARY_FWD - te_moe_eager.UNFUSED_ROPE_FWD) * rotated),
                Counter(attention=(analytic_time.ROTARY_BWD - te_moe_eager.UNFUSED_ROPE_BWD) * rotated))
    else:
        rope = _rope_classes(arch, shape)
    classes = []
    for parts in zip(_norm_classes(arch, rows, arch.hidden_size), rope, te_moe.moe_classes(arch, shape)):
        replaced = Counter()
        for part in parts:
            replaced.update(part)
        classes.append(replaced)
    return classes[0], classes[1]


def fused_accumulation(bwd: Work, arch, shape, *, moe: bool) -> tuple[Work, int]:
    """The backward under Megatron's gradient-accumulation fusion (`--gradient-accumulation-fusion`, on by default:
    Megatron-LM arguments.py, d98e8a64), and the eager bytes it takes out. Megatron-core builds its TE linears with
    `fuse_wgrad_accumulation=config.gradient_accumulation_fusion` (megatron/core/extensions/transformer_engine.py),
    and TE's wgrad GEMM then writes into the parameter's fp32 main_grad with accumulate=True (cuBLAS beta = 1:
    transformer_engine/pytorch/module/linear.py's wgrad general_gemm, out=main_grad; grouped_linear.py the same for
    the experts): the accumulation is the GEMM's epilogue reading C once more, inside a kernel ckplan times by its
    FLOPs (no GEMM's operand or output bytes are charged: roofline.kernel_ms), and no eager pass runs. So the
    eager .grad accumulation (analytic_time.accumulate_bytes, class elementwise) leaves the backward; where a
    setup turns the fusion off (--no-gradient-accumulation-fusion) the cost model adds the pass back
    (FusedKernelTime.accumulate_ms, planner/cost/fusedkernels.py) and jobsettings its fp32 bytes beyond it."""
    accumulate = min(analytic_time.accumulate_bytes(arch, shape, moe=moe), dict(bwd.classed).get("elementwise", 0))
    classes = Counter(dict(bwd.classed))
    classes["elementwise"] -= accumulate
    return (work(bwd.flops, bwd.bytes - accumulate, list(Counter(dict(bwd.kernels)).elements()),
                 fused_bytes=min(bwd.fused_bytes, bwd.bytes - accumulate), classed=+classes), accumulate)


def _on_fused(done: Work, cut: int, moved: int, replaced: Counter) -> Work:
    """`done` with the fused kernels' `cut` bytes gone and their `moved` bytes fused; the eager bytes left (the
    residual adds and their gradients' sums, the weight gradients' accumulation, what no fused kernel runs) keep
    their op classes, less the classes' bytes the fused kernels `replaced`, so that each is timed at its class's
    measured rate as in the eager block (membound.fraction); before, the rebuilt pass dropped its classes and the
    eager rest ran at the eager mean."""
    left = max(done.bytes - cut, 0)
    classes = Counter(dict(done.classed))
    classes.subtract(replaced)
    return work(done.flops, left, list(Counter(dict(done.kernels)).elements()), fused_bytes=min(moved, left),
                classed=+classes)


def _moe_time(arch, shape, gpu, passes: tuple[Work, Work, Work], prefix: str) -> FusedKernelTime | None:
    """A MoE block's passes on Megatron-core's fused kernels: the two norms and rotary as a dense block's
    (fused_bytes_saved's LLaMA terms, the MLP's SwiGLU left out), the router, permutations, experts'
    activation and q/k norms as te_moe.py counts them; Q/K/V as one GEMM, each local expert's gate and up as
    linear_fc1's one GEMM (TE GroupedLinear); its Float8 record under TE's current scaling (te_moe_float8.py). The
    eager rest keeps its op classes less those the fused kernels replace (moe_classes), as a dense block's."""
    from planner.profiler import te_moe, te_moe_float8

    if not te_moe.counts_moe(arch, shape):
        return None
    fwd, bwd, rerun = moe_passes(arch, shape, passes)
    bwd, accumulate = fused_accumulation(bwd, arch, shape, moe=True)
    kernels_gpu = te_mla.attention_gpu(gpu) if arch.mla else te_attention_gpu(gpu)
    fp8 = None if arch.mla else te_moe_float8.record(arch, shape, kernels_gpu, fwd, bwd, rerun, prefix=prefix)
    fp8 = te_rerun.with_float8_parts(fp8, arch, shape, kernels_gpu, moe=True, fused_gemms=_fused_gemms, prefix=prefix)
    scores = te_moe.fp32_scores_bytes(arch, shape)  # TE v2.13 on's fp32 intermediates, beyond v2.9's
    return FusedKernelTime(fwd_ms=roofline_ms(fwd, kernels_gpu), bwd_ms=roofline_ms(bwd, kernels_gpu),
                           recompute_ms={OPTION_FULL: roofline_ms(rerun, kernels_gpu),
                                         **te_rerun.part_reruns(arch, shape, kernels_gpu, moe=True,
                                                                fused_gemms=_fused_gemms)}, float8=fp8,
                           accumulate_ms=membound_ms(accumulate, kernels_gpu, "eager", "elementwise"),
                           fp32_scores_fwd_ms=membound_ms(scores[0], kernels_gpu, "fused"),
                           fp32_scores_bwd_ms=membound_ms(scores[1], kernels_gpu, "fused"))


def moe_passes(arch, shape, passes: tuple[Work, Work, Work]) -> tuple[Work, Work, Work]:
    """A MoE block's (forward, backward, full rerun) on Megatron-core's fused kernels (_moe_time's), before FP8."""
    from planner.profiler import te_moe, te_moe_eager, te_moe_float8

    rows, h = shape.tokens // shape.sp_div, arch.hidden_size
    norm_saved = _norms_saved(arch, rows, h)
    norm_fused = 2 * (TE_NORM_FWD * rows * h + TE_RMSNORM_TOKEN * rows), 2 * (TE_NORM_BWD * rows * h + TE_RMSNORM_TOKEN * rows)
    rotated = shape.tokens * (formulas.q_width(arch, shape) + formulas.kv_width(arch, shape)) if arch.rotates else 0
    rope, rope_fused = _rope_saved(arch, shape), (ROPE_FUSED_FWD * rotated, ROPE_FUSED_BWD * rotated)
    if arch.mla:  # the latent norms and Megatron's fused MLA rotary (te_mla.py)
        rope, rope_fused = te_mla.saved_bytes(arch, shape), te_mla.fused_bytes(arch, shape)
    elif te_moe_eager.unfused_rotary(arch):  # YaRN's mscale != 1: Megatron-core's unfused rotary, eager bytes
        rope = ((analytic_time.ROTARY_FWD - te_moe_eager.UNFUSED_ROPE_FWD) * rotated,
                (analytic_time.ROTARY_BWD - te_moe_eager.UNFUSED_ROPE_BWD) * rotated)
        rope_fused = (0, 0)
    moe_saved, moe_fused = te_moe.moe_saved(arch, shape), te_moe.moe_fused_bytes(arch, shape)
    saved = tuple(norm_saved[i] + rope[i] + moe_saved[i] for i in (0, 1))
    fused = (norm_fused[0] + rope_fused[0] + moe_fused[0], norm_fused[1] + rope_fused[1] + moe_fused[1])
    replaced = moe_classes(arch, shape)
    return tuple(te_moe_float8.grouped_fc1(_fused_gemms(_on_fused(done, cut, moved, gone), arch, shape, times),
                                           arch, shape, times)
                 for done, cut, moved, gone, times in zip(passes, (saved[0], saved[1], saved[0]),
                                                          (fused[0], fused[1], fused[0]),
                                                          (replaced[0], replaced[1], replaced[0]), (1, 2, 1)))


def _fused_gemms(done: Work, arch, shape, times: int) -> Work:
    """`done` with a LLaMA block's Q, K, V GEMMs as one and gate and up as one (each `times` in the
    pass: 1 forward or rerun, 2 backward); a GPT block's, or a pass without them, as it is."""
    if arch.style == "gpt":
        return done
    T, h = shape.tokens, arch.hidden_size
    q, kv = formulas.q_width(arch, shape), formulas.kv_width(arch, shape)
    f = arch.intermediate_size // shape.tp
    groups = ((2 * T * h * f, 2 * T * h * f),) if arch.mla else ((2 * T * h * q, 2 * T * h * kv, 2 * T * h * kv),
                                                                 (2 * T * h * f, 2 * T * h * f))
    for parts in groups:  # an MLA block's latent projections are separate TE linears (te_mla.py)
        kernels = Counter(dict(done.kernels))
        needed = Counter({Kernel("matmul", part): 0 for part in parts})
        for part in parts:
            needed[Kernel("matmul", part)] += times
        if any(kernels[kernel] < count for kernel, count in needed.items()):
            continue
        kernels.subtract(needed)
        kernels[Kernel("matmul", sum(parts))] += times
        done = work(done.flops, done.bytes, list((+kernels).elements()), fused_bytes=done.fused_bytes,
                    classed=done.classed)
    return done


def fake_blocks_on_te(layers: list, arch, shape, gpu) -> list:
    """A fake profile's layers with the record an analytic profile of `arch` gives its dense blocks
    (te_time) on each layer that is one: a layer holding exactly the arch's dense block's parameters.
    The fake profile ran the model code's eager modules (Hugging Face's), which Megatron-LM does not
    run; its blocks on TE's kernels are the analytic block's, so that analytic and fake profiles of one
    architecture time alike under --runtime megatron. MoE layers and layers of another size keep none."""
    from planner.profiler import analytic_time, formulas

    dense = formulas.block_params(arch, shape, moe=False)
    passes = analytic_time.block_work(arch, shape, moe=False)
    return [layer.model_copy(update={"te_time": te_time(arch, shape, gpu, passes, moe=False, prefix=layer.name)})
            if layer.param_count == dense and layer.te_time is None else layer for layer in layers]
