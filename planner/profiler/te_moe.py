"""A MoE block's memory-bound bytes as Megatron-core runs it on Transformer Engine with
`--moe-router-fusion` and `--moe-permute-fusion` (te_fused.te_time's record for a MoE block): the
block's norms, q/k norms and rotary on TE's fused kernels, the router's top-k in TE's fused kernel, the
token permute / sort / unpermute in TE's fused permutation kernels, and the experts' activation with the
routing weights in Megatron's fused weighted GLU. docs/framework-facts.md §94 has each source.

Symbols: T tokens on the device, h hidden, E experts, k top-k, S = T·k token copies (under balanced,
dropless routing a rank's local experts receive S copies whatever the EP: E/ep experts x ep·T·k/E),
f the experts' width (/TP); bf16 activations, logits and routing weights (2 B: Megatron's router runs in
the input's dtype unless `--moe-router-dtype`), TE's row map int32 (4 B).

- the router (TE `fused_topk_with_score_function`, transformer_engine/pytorch/router.py): forward reads
  the logits (2 TE) and writes the probabilities (2 TE), the routing map (bool, 1 TE) and its intermediate
  (2 TE: the logits' dtype at TE v2.9, csrc/extensions/router.cpp 42-47, to v2.12); backward reads the map, the
  intermediate and the probabilities' gradient and writes the logits' gradient (the intermediate's dtype, 77-78):
  7 TE each way. TE v2.13 on writes the intermediate fp32 (9 TE each way). The record is made at v2.9's dtypes
  and carries what v2.13's fp32 adds beside it (fp32_scores_bytes), which the cost model adds where the runtime
  record's te_router_scores is "fp32" (planner/cost/fusedkernels.py; framework-facts §543, §588). Under
  `--moe-router-dtype fp32` (Arch.router_dtype_bytes) the logits, probabilities and their gradients are 4 B, and
  so the probabilities the permutations and the weighted activation move (router_elements, routed_bytes);
- permutation 1 (megatron/core/transformer/moe/moe_utils.py `permute(fused=True, probs=...)` ->
  TE `moe_permute_with_probs`, permutation.py `_moe_permute_mask_map`): the row map made from the routing
  map (1 TE read, 4 TE written), each token's row read once and written to its k slots (2 T h + 2 S h),
  the probabilities read (2 TE) and the permuted ones written (2 S), the row map read (4 TE); backward
  `unpermute_with_mask_map` of the gradient: 2 S h read, 2 T h written, the row map read, the
  probabilities' gradient 2 S read and 2 TE written;
- permutation 2 (token_dispatcher.py `dispatch_postprocess` / `combine_preprocess`, only where a rank
  holds more than one local expert under EP > 1): TE `moe_sort_chunks_by_index` with the probabilities,
  2 S h read and written and 2 S + 2 S, each way; its inverse on the experts' output the same;
- the experts' activation: `weighted_bias_swiglu_impl` / `weighted_bias_quick_geglu_impl` (the routing
  weight multiplied inside, jit_fuser: torch.compile; megatron/core/transformer/moe/experts.py
  TEGroupedMLP.forward), reading gate and up (4 S f) and the weight (2 S), writing 2 S f; backward the
  gradient (2 S f), both inputs and the weight read, both gradients (4 S f) and the weight's (2 S) written;
  GPT-OSS's clamp is not inside it (te_moe_eager.py);
- unpermutation 1 (`unpermute(fused=True)` without probabilities, the weight was applied in the
  activation): 2 S h read, 2 T h written; backward its permute: 2 T h read, 2 S h written, the row map
  read each way.
GPT-OSS's clamp runs before the compiled function, eagerly, and linear_fc2's bias is added expert by expert
(te_moe_eager.py): their bytes stay eager ops' in the record (moe_saved keeps them, and takes out the eager
profile's repeated biases).
- the auxiliary load-balancing loss (`Arch.router_aux_loss`: Megatron-core's aux_loss type with a coefficient above 0,
  router.py 270-296 and 526-538 at 92c8482e; TE v2.9 csrc/extensions/router.cpp 93-190, the tensors in the
  logits' dtype): forward `fused_score_for_moe_aux_loss_fwd` reads the logits (2 TE) and writes the scores (2 TE), the
  routing map (1 TE) and its intermediate (2 TE), and `fused_moe_aux_loss_fwd` reads the scores (2 TE); backward
  `fused_moe_aux_loss_bwd` writes the scores' gradient (2 TE) and `fused_score_for_moe_aux_loss_bwd` reads the
  intermediate and that gradient and writes the logits' (6 TE): 9 TE forward, 8 backward at the fused rate (the
  routing map's eager sum and the logits' two gradients' add: te_moe_eager.py).
Not counted (T·E-sized or smaller): the split sizes' reductions; the all-to-all is the cost model's term.
"""

from __future__ import annotations

from collections import Counter

from planner.profiler import analytic_time, formulas, gptoss_time, te_bytes, te_moe_eager
from planner.profiler.norm_bytes import rms_norm

ROW_MAP_MAKE, ROW_MAP = 5, 4  # per (token, expert): routing map read + int32 row map written; row map read
WEIGHTED_GLU_FWD, WEIGHTED_GLU_BWD = 6, 10  # per element of the width-f output (SWIGLU_FUSED's)
LOGITS, FP32 = 2, 4  # the router's logits without --moe-router-dtype (the input's bf16); TE v2.13 on's intermediates


def router_elements(arch, *, scores: str = "logits") -> tuple[int, int]:
    """(forward, backward) bytes per (token, expert) of TE's fused top-k and, where it runs, the aux loss's two
    kernels (the module docstring), with the logits in their dtype (L: Arch.router_dtype_bytes, else bf16) and TE's
    saved intermediates and the aux loss's scores in `scores`' dtype (the record's te_router_scores: "logits" to
    TE v2.12, "fp32" from v2.13; framework-facts §543, §588). Top-k: logits L read, probs L, map 1 and intermediate I
    written; backward map 1, intermediate I, probs' gradient L read, logits' gradient L written (v2.9: the
    intermediate's dtype, the logits' there; v2.13 on: ctx.logits_dtype). Aux loss: logits L read, scores I, map 1,
    intermediate I written, scores I read; backward the scores' gradient (the loss's, the scores' dtype) written and
    read, the intermediate read, the logits' gradient L written. At v2.9 in bf16: 7 / 7 and 9 / 8."""
    L = arch.router_dtype_bytes or LOGITS
    i = L if scores == "logits" else FP32
    fwd, bwd = 2 * L + 1 + i, 1 + i + 2 * L
    if arch.router_aux_loss:
        fwd, bwd = fwd + L + 1 + 3 * i, bwd + 3 * i + L
    return fwd, bwd


def routed_bytes(arch, shape, *, scores: str = "logits") -> tuple[int, int]:
    """(forward, backward) memory-bound bytes of a MoE block's router, permutations and experts'
    activation as Megatron-core runs them fused (the module docstring), TE's router intermediates in `scores`' dtype
    (router_elements); the probabilities (read, permuted, sorted, read by the weighted activation, their gradients)
    in the logits' dtype (2 B, 4 under --moe-router-dtype fp32)."""
    T, h, E, k = shape.tokens, arch.hidden_size, arch.num_experts, arch.num_experts_per_tok
    S, f, p = T * k, arch.moe_intermediate_size // shape.tp, arch.router_dtype_bytes or LOGITS
    local = formulas.expert_gemm_shape(arch, shape)[0]
    sort = 2 * (4 * S * h + 2 * p * S) if shape.ep > 1 and local > 1 else 0  # sort + unsort, one way each
    router, weight = router_elements(arch, scores=scores), weight_bytes(arch)
    fwd = (router[0] * T * E + ROW_MAP_MAKE * T * E + (2 * T * h + 2 * S * h) + p * T * E + p * S + ROW_MAP * T * E
           + sort + WEIGHTED_GLU_FWD * S * f + weight[0] * S + (2 * S * h + 2 * T * h) + ROW_MAP * T * E)
    bwd = (router[1] * T * E + (2 * S * h + 2 * T * h) + ROW_MAP * T * E + p * S + p * T * E
           + sort + WEIGHTED_GLU_BWD * S * f + weight[1] * S + (2 * T * h + 2 * S * h) + ROW_MAP * T * E)
    return fwd, bwd


def fp32_scores_bytes(arch, shape) -> tuple[int, int]:
    """(forward, backward) bytes TE v2.13 on's fp32 router intermediates and aux-loss scores move beyond v2.9's
    (routed_bytes' difference): what the record's te_router_scores "fp32" adds to a block timed at v2.9's
    (FusedKernelTime.fp32_scores_fwd_ms / _bwd_ms, read by planner/cost/fusedkernels.py)."""
    new, old = routed_bytes(arch, shape, scores="fp32"), routed_bytes(arch, shape)
    return new[0] - old[0], new[1] - old[1]


def weight_bytes(arch) -> tuple[int, int]:
    """(forward, backward) bytes per routed copy of the routing weight the experts' weighted activation reads (and
    whose gradient it writes), in the logits' dtype."""
    p = arch.router_dtype_bytes or LOGITS
    return p, 2 * p


def eager_routed_classes(arch, shape) -> tuple[Counter, Counter]:
    """(forward, backward) bytes by op class (membound.OP_CLASSES) the eager profile charges the same work, as it
    classes them: the block's MLP memory-bound bytes (analytic_time._mlp: the router, dispatch and experts; Mixtral's
    and Qwen3's op by op, DeepSeek's hf_moe.py's) less the shared experts' SwiGLU and their output's add, and GPT-OSS's
    clamped activation beyond SwiGLU (gptoss_time's, activation)."""
    _, fwd, bwd = analytic_time._mlp(arch, shape, True)
    fwd, bwd = Counter(fwd), Counter(bwd)
    shared = arch.num_shared_experts * arch.shared_intermediate_size // shape.tp
    if shared:
        _, s_fwd, s_bwd = analytic_time._swiglu(shape.tokens, arch.hidden_size, shared)
        add = Counter(elementwise=analytic_time.ADD * shape.tokens * arch.hidden_size)
        for passed, own in ((fwd, s_fwd), (bwd, s_bwd)):
            passed.subtract(own)
            passed.subtract(add)
    if arch.swiglu_limit:
        slots = arch.num_experts * formulas.expert_tokens(arch, shape)
        f = arch.moe_intermediate_size // shape.tp
        fwd["activation"] += (gptoss_time.CLAMPED_SWIGLU_FWD - gptoss_time.SILU_SWIGLU_FWD) * slots * f
        bwd["activation"] += (gptoss_time.CLAMPED_SWIGLU_BWD - gptoss_time.SILU_SWIGLU_BWD) * slots * f
    return fwd, bwd


def eager_routed_bytes(arch, shape) -> tuple[int, int]:
    """(forward, backward) bytes the eager profile charges the same work (eager_routed_classes' sums)."""
    fwd, bwd = eager_routed_classes(arch, shape)
    return sum(fwd.values()), sum(bwd.values())


def qk_norm_bytes(arch, shape, *, fused: bool) -> tuple[int, int]:
    """(forward, backward) bytes of the q/k norms over the device's Q and K heads: eager as
    analytic_time._projections counts them, or TE's RMSNorm (Megatron-core's `q_layernorm` /
    `k_layernorm`, TENorm, per head): x read and y written (4 B an element) and 1/rms per row (4 B)
    forward, 6 B an element and the statistics backward (te_bytes.TE_NORM_*); a GPT block's TENorm is TE's
    LayerNorm, whose rows carry the mean and 1/std (8 B: te_fused's docstring). Dense blocks' as MoE blocks'."""
    if not arch.qk_norm or arch.mla:  # a latent attention's norms are its latents' (te_mla.py)
        return 0, 0
    rotated = shape.tokens * (formulas.q_width(arch, shape) + formulas.kv_width(arch, shape))
    if not fused:
        return rms_norm(arch).forward(rotated), rms_norm(arch).backward(rotated)
    rows = rotated // arch.head_size * te_bytes.TE_RMSNORM_TOKEN * (1 if arch.style == "llama" else 2)
    return te_bytes.TE_NORM_FWD * rotated + rows, te_bytes.TE_NORM_BWD * rotated + rows


def shared_swiglu_elements(arch, shape) -> int:
    """Elements of the shared experts' SwiGLU output on the device (T x the shared width / TP): Megatron-core's
    SharedExpertMLP is an MLP (megatron/core/transformer/moe/shared_experts.py 102-206, Megatron-LM d98e8a64),
    whose activation under bias_activation_fusion is `bias_swiglu_impl` (mlp.py 275-309): the fused SwiGLU
    (te_bytes.SWIGLU_FUSED_*) where the eager count charges SiLU and the product (analytic_time.SWIGLU_*)."""
    return shape.tokens * (arch.num_shared_experts * arch.shared_intermediate_size // shape.tp)


def moe_saved(arch, shape) -> tuple[int, int]:
    """(forward, backward) bytes Megatron's fused MoE block moves less than the eager count of its
    router, dispatch, experts' activation, shared experts' activation and q/k norms (the block's own norms
    and rotary: te_fused's)."""
    eager, fused = eager_routed_bytes(arch, shape), routed_bytes(arch, shape)
    qk_eager, qk_fused = qk_norm_bytes(arch, shape, fused=False), qk_norm_bytes(arch, shape, fused=True)
    shared = shared_swiglu_elements(arch, shape)
    shared_saved = ((analytic_time.SWIGLU_FWD - te_bytes.SWIGLU_FUSED_FWD) * shared,
                    (analytic_time.SWIGLU_BWD - te_bytes.SWIGLU_FUSED_BWD) * shared)
    # GPT-OSS's experts: the eager profile's repeated biases out, Megatron's eager clamp and weighted fc2 bias kept
    biases, kept = te_moe_eager.eager_expert_bias_bytes(arch, shape), te_moe_eager.eager_bytes(arch, shape)
    return tuple(eager[i] - fused[i] + qk_eager[i] - qk_fused[i] + shared_saved[i] + biases[i] - kept[i]
                 for i in (0, 1))


def moe_classes(arch, shape) -> tuple[Counter, Counter]:
    """(forward, backward) eager bytes by op class that Megatron's fused MoE kernels replace, net of the eager ops
    Megatron keeps around them (moe_saved + moe_fused_bytes, split): the routed work (eager_routed_classes), the q/k
    norms (norm), the shared experts' SwiGLU (activation) and the eager profile's repeated expert biases
    (elementwise, gptoss_time's class), less GPT-OSS's eager clamp and weighted fc2 bias (te_moe_eager.eager_classes),
    which stay eager ops' in their classes. A class may come out negative (kept above what is replaced)."""
    routed, kept = eager_routed_classes(arch, shape), te_moe_eager.eager_classes(arch, shape)
    qk, biases = qk_norm_bytes(arch, shape, fused=False), te_moe_eager.eager_expert_bias_bytes(arch, shape)
    shared = shared_swiglu_elements(arch, shape)
    swiglu = analytic_time.SWIGLU_FWD, analytic_time.SWIGLU_BWD
    classes = []
    for i in (0, 1):
        replaced = Counter(routed[i])
        replaced.update(norm=qk[i], activation=swiglu[i] * shared, elementwise=biases[i])
        replaced.subtract(kept[i])
        classes.append(replaced)
    return classes[0], classes[1]


def moe_fused_bytes(arch, shape) -> tuple[int, int]:
    """(forward, backward) bytes the fused MoE kernels themselves move (Work.fused_bytes)."""
    fused, qk = routed_bytes(arch, shape), qk_norm_bytes(arch, shape, fused=True)
    shared = shared_swiglu_elements(arch, shape)
    return (fused[0] + qk[0] + te_bytes.SWIGLU_FUSED_FWD * shared, fused[1] + qk[1] + te_bytes.SWIGLU_FUSED_BWD * shared)


def counts_moe(arch, shape) -> bool:
    """Whether the MoE record is made: a routed-experts block of gated experts (SwiGLU or GPT-OSS's
    quick-GeGLU, the two Megatron fuses with the weight), flash attention (a latent attention's parts:
    te_mla.py)."""
    return (bool(arch.num_experts) and shape.attention == "flash" and arch.style != "gpt"
            and arch.num_experts % shape.ep == 0)
