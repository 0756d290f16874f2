"""The analytic profile's work per pass, for the roofline (planner/profiler/roofline.py) the
fake profile is timed by: the kernels a layer's code dispatches, written from the
architecture's formulas, and the bytes its memory-bound ops move.

Kernels, per device and microbatch (T tokens; widths /t under TP, as in analytic.py):
- matmuls as the PyTorch-native models run them (Hugging Face, torchtitan): Q, K, V and the
  output projection separately, gate, up and down separately (GPT: one fused Q/K/V); each
  its own kernel, at the efficiency its size reaches. Backward: each matmul twice (the input
  and the weight gradient, each as large as the forward's);
- attention as one kernel of torch's FLOP count (4·T·w·a·hd forward, 2.5x that backward, as
  torch.utils.flop_counter counts flash attention; a latent attention's (3·d_qk + 2·d_v) / (d_qk + d_v),
  formulas.attention_bwd_flops), causal: it runs half its blocks (within a
  sliding window w, a fraction 1 - w/2s);
- a MoE block's router, every routed expert's three matmuls over its C tokens (Hugging Face
  loops over experts, one kernel each), and the shared experts; Mixtral's, Qwen3-MoE's and DeepSeek's
  (V2, V3: a latent attention's) experts two (gate and up fused in gate_up_proj), Mixtral's and
  Qwen3-MoE's router's and experts' bytes op by op (analytic_moe.py), DeepSeek-V3's (hf_moe.py).

Memory-bound bytes, per element of the tensor named, for 16-bit activations as eager
PyTorch moves them (the ops and their autograd formulas, counted op by op under
FakeTensorMode on Hugging Face's LLaMA modules, OpBytes in planner/profiler/fake.py):
- RMSNorm with its fp32 upcast (to fp32, pow, mean, rsqrt, mul, to bf16, weight):
  36 B forward and 96 B backward per element, 28 and 44 B per token; Gemma's, which scales in
  fp32, 40 and 108 (norm_bytes.py: each norm the architecture's own);
- rotary on Q and K (two multiplies, rotate_half's neg and cat, an add): 20 B forward per
  element of Q and K plus 8 per token·head_dim (cos and sin read), 32 and 8 backward; a latent
  attention's query cat, key build and output copy as transformers makes them (hf_mla.py);
- SwiGLU's SiLU and product: 10 B forward, 18 backward per element of the width-f tensors;
- residual adds: 6 B per element forward; backward, each place where two gradients meet
  (two residual branches, Q/K/V's shared input, gate and up's shared input): 6 B per element;
- every weight's gradient added into its .grad: 3 x its bytes (read both, write one);
- an embedding lookup reads and writes the rows it gathers; its backward writes the whole
  table's gradient (embedding_dense_backward) before accumulating it.
Each pass's bytes carry their op class (membound.OP_CLASSES: norm, layer_norm, attention,
activation, elementwise), each charged at its class's measured rate; the classes are where the ops
run in the model's modules, as the fake profiler classes them (fake.op_class).
A framework's fused kernels (Transformer Engine, Apex, Liger, torch.compile) move less;
this is the eager figure, as the fake profile of the same model's code counts it (torch.compile's,
read off inductor's fused kernels: compiled_time.py).
"""

from __future__ import annotations

from collections import Counter

from planner.models.archs import GPU
from planner.models.gptoss import window_pairs
from planner.profiler import analytic_moe, formulas, gptoss_time, hf_mla, hf_moe
from planner.profiler.activations import ACTIVATIONS
from planner.profiler.membound import membound_ms
from planner.profiler.norm_bytes import rms_norm
from planner.profiler.roofline import Kernel, Work, roofline_ms, work

ROTARY_FWD, ROTARY_BWD, ROTARY_TABLE = 20, 32, 8
SWIGLU_FWD, SWIGLU_BWD = 10, 18
ADD = 6  # a + b in 16 bits: read 2 + 2, write 2
ACCUMULATE = 3  # grad += new: read both, write one
# GPT-style blocks, per element: torch's native_layer_norm (one kernel each way); GELU as Hugging
# Face's GPT-2 writes it (gelu_new: pow, tanh and six elementwise ops, their gradients), ReLU
# (OPT); dropout with its mask; the fused Q/K/V gradient's cat, and each bias gradient's sum
LAYERNORM_FWD, LAYERNORM_BWD = 4, 6
# per Arch.mlp_act, (forward, backward) bytes an element (planner/profiler/activations.py)
ACT_BYTES = {name: (act.fwd_bytes, act.bwd_bytes) for name, act in ACTIVATIONS.items()}
DROPOUT_FWD, DROPOUT_BWD, QKV_CAT, BIAS_SUM = 5, 5, 4, 2
BIAS_WRITE = 2  # a bias's gradient written by its sum over the tokens, 16 bits an element
EAGER_SCORES_FWD, EAGER_SCORES_BWD = 20, 30  # eager attention: mask add, fp32 softmax and back, per score
# Megatron's fused causal softmax (Shape.fused_softmax), per 16-bit score, then its attention dropout
# (docs/framework-facts.md §894; Megatron-DeepSpeed 62bc4562 megatron/fused_kernels/
# scaled_upper_triang_masked_softmax.h): the forward reads row i's first i + 1 scores (half the s x s, 1 B a score)
# and writes the whole row, zeros past the diagonal (2 B); the backward reads the gradient and the output over
# the same triangle (2 B) and writes the whole row (2 B); torch's dropout reads 2, writes 2 and the 1-byte mask
# forward, reads the gradient and the mask and writes 2 backward (transformer.py 318)
FUSED_SOFTMAX_FWD, FUSED_SOFTMAX_BWD, DROPOUT_SCORES = 1 + 2, 2 + 2, 2 + 2 + 1
FUSED_SCORES_FWD, FUSED_SCORES_BWD = FUSED_SOFTMAX_FWD + DROPOUT_SCORES, FUSED_SOFTMAX_BWD + DROPOUT_SCORES


def _matmuls(*flops: int) -> list[Kernel]:
    return [Kernel("matmul", int(f)) for f in flops if f > 0]


def _backward_kernels(kernels: list[Kernel], arch=None) -> list[Kernel]:
    """Each matmul's two gradient GEMMs; an attention kernel's backward at formulas.attention_bwd_flops
    (`arch`: its head dims; None, equal ones)."""
    out = []
    for kernel in kernels:
        if kernel.kind == "attention-fwd":
            flops = formulas.attention_bwd_flops(arch, kernel.flops) if arch is not None else kernel.flops * 5 // 2
            out.append(Kernel("attention-bwd", flops, kernel.run_fraction, kernel.seq_len, kernel.window))
        else:
            out += [kernel, kernel]
    return out


def _attention(arch, shape) -> tuple[list[Kernel], int, int]:
    """The attention core: flash as one kernel (causal), or eager as two batched matmuls and
    the scores' softmax bytes (forward, backward).

    Under context parallelism the rank's flash work is cp calls of its ring, each over as many
    query-key pairs as a causal call over the rank's own s / cp tokens (analytic_cp.ring_calls), and
    each runs at that length's efficiency, not the whole sequence's: the kernel's length is s / cp."""
    s, b = shape.seq_len, shape.micro_batch_size
    window = min(s, arch.sliding_window or s)
    heads = arch.num_heads // shape.tp
    width = heads * (arch.qk_nope_head_dim + arch.qk_rope_head_dim + arch.v_head_dim) // 2 if arch.mla \
        else formulas.q_width(arch, shape)
    flops = 4 * shape.tokens * window * width
    if shape.attention == "flash":
        # causal: half the s² blocks; within a window w < s, the exact pairs over the s·w counted (gptoss.py)
        run = window_pairs(s, window) / (s * window) if window < s else 0.5
        return [Kernel("attention-fwd", flops, run, s // shape.cp, window if window < s else 0)], 0, 0
    scores = heads * s * s * b
    fwd, bwd = (FUSED_SCORES_FWD, FUSED_SCORES_BWD) if shape.fused_softmax else (EAGER_SCORES_FWD, EAGER_SCORES_BWD)
    return _matmuls(flops // 2, flops // 2), fwd * scores, bwd * scores


def _projections(arch, shape) -> tuple[list[Kernel], Counter, Counter]:
    """Attention's projections and the memory-bound ops around them (rotary, q/k or latent
    norms): kernels, forward bytes, backward bytes, by op class (membound.OP_CLASSES: what runs
    in the attention module itself is `attention`, its norms `norm`, the GPT biases' sums
    `elementwise`, in their own modules)."""
    T, h = shape.tokens, arch.hidden_size
    if arch.mla:
        heads, rope, nope, v = (arch.num_heads // shape.tp, arch.qk_rope_head_dim, arch.qk_nope_head_dim,
                                arch.v_head_dim)
        own, q_rank, kv_rank = T // shape.sp_div, arch.q_lora_rank, arch.kv_lora_rank
        kernels = _matmuls(2 * own * h * q_rank, 2 * own * h * (kv_rank + rope),
                           2 * T * (q_rank or h) * heads * (nope + rope), 2 * T * kv_rank * heads * (nope + v),
                           2 * T * heads * v * h)
        latents = T * (q_rank + kv_rank)
        rotated = T * (heads * rope + rope)
        # transformers' query cat, key build and output copy, and their gradients' copies (hf_mla.py)
        norm = rms_norm(arch)
        return (kernels, Counter(norm=norm.fwd * latents, attention=ROTARY_FWD * rotated) + hf_mla.forward_bytes(arch, shape),
                Counter(norm=norm.bwd * latents, attention=ROTARY_BWD * rotated,
                        elementwise=ADD * T * h * (1 + bool(q_rank))) + hf_mla.backward_bytes(arch, shape))
    q, kv = formulas.q_width(arch, shape), formulas.kv_width(arch, shape)
    rotated, table = T * (q + kv), T * arch.head_size * ROTARY_TABLE
    rotary = (ROTARY_FWD * rotated + table, ROTARY_BWD * rotated + table) if arch.rotates else (0, 0)
    norms = (rms_norm(arch).fwd * rotated, rms_norm(arch).bwd * rotated) if arch.qk_norm else (0, 0)  # per-head q and k norms
    if arch.style == "gpt":  # backward: the Q/K/V gradients concatenated, the biases' gradients summed
        return (_matmuls(2 * T * h * (q + 2 * kv), 2 * T * q * h), +Counter(attention=rotary[0], norm=norms[0]),
                +Counter(attention=QKV_CAT * T * (q + 2 * kv) + rotary[1], elementwise=BIAS_SUM * T * (q + 2 * kv),
                         norm=norms[1]))
    return (_matmuls(2 * T * h * q, 2 * T * h * kv, 2 * T * h * kv, 2 * T * q * h),
            +Counter(attention=rotary[0], norm=norms[0]),
            +Counter(attention=rotary[1], norm=norms[1],
                    elementwise=2 * ADD * T * h))  # Q, K and V's input gradients summed


def _swiglu(tokens: int, h: int, width: int) -> tuple[list[Kernel], Counter, Counter]:
    """Gate, up and down over `tokens`, with SiLU and the product between; backward sums the
    gate's and up's input gradients (elementwise: autograd sums them in a projection's backward)."""
    kernels = _matmuls(*(2 * tokens * h * width,) * 3)
    return (kernels, Counter(activation=SWIGLU_FWD * tokens * width),
            Counter(activation=SWIGLU_BWD * tokens * width, elementwise=ADD * tokens * h))


def _mlp(arch, shape, moe: bool) -> tuple[list[Kernel], Counter, Counter]:
    T, h, t = shape.tokens, arch.hidden_size, shape.tp
    if arch.style == "gpt":
        f = arch.intermediate_size // t
        act_fwd, act_bwd = ACT_BYTES[arch.mlp_act]
        return (_matmuls(2 * T * h * f, 2 * T * f * h), Counter(activation=act_fwd * T * f),
                Counter(activation=act_bwd * T * f, elementwise=BIAS_SUM * T * f))
    if not moe:
        return _swiglu(T, h, arch.intermediate_size // t)
    experts, tokens = arch.num_experts, formulas.expert_tokens(arch, shape)
    slots = experts * tokens
    one_kernels, one_fwd, one_bwd = _swiglu(tokens, h, arch.moe_intermediate_size // t)
    # the GEMMs as the rank runs them: its experts / ep local experts over ep x tokens each (Shape.ep)
    local, rows = formulas.expert_gemm_shape(arch, shape)
    # transformers' DeepseekV2Experts / DeepseekV3Experts hold gate and up as one gate_up_proj and run them as one
    # GEMM an expert (docs/framework-facts.md §117), as MixtralExperts does (analytic_moe.expert_kernels)
    expert = analytic_moe.expert_kernels(rows, h, arch.moe_intermediate_size // t) if arch.mla \
        else _swiglu(rows, h, arch.moe_intermediate_size // t)[0]
    kernels = _matmuls(2 * (T // shape.sp_div) * h * experts) + expert * local
    routing = 10 * T * experts  # the router's fp32 softmax (or sigmoid) over its logits
    moved = 4 * slots * h + 8 * slots * h  # dispatch gather; combine's weighting and scatter-add
    fwd = Counter({name: experts * num for name, num in one_fwd.items()}) + Counter(elementwise=routing + moved)
    bwd = Counter({name: experts * num for name, num in one_bwd.items()}) + Counter(elementwise=2 * routing + 2 * moved)
    if analytic_moe.counts_mixture(arch):  # Mixtral's router and grouped experts, op by op as transformers runs them
        fwd, bwd = analytic_moe.block_mixture_bytes(arch, shape)
        kernels = kernels[:1] + analytic_moe.expert_kernels(rows, h, arch.moe_intermediate_size // t) * local
    elif hf_moe.counts_deepseek(arch):  # DeepSeek-V3's router and the same grouped experts, op by op (hf_moe.py)
        fwd, bwd = hf_moe.mixture_bytes(arch, shape)
    shared = arch.num_shared_experts * arch.shared_intermediate_size // t
    if shared:
        shared_kernels, shared_fwd, shared_bwd = _swiglu(T, h, shared)
        kernels = kernels + shared_kernels
        fwd, bwd = fwd + shared_fwd + Counter(elementwise=ADD * T * h), bwd + shared_bwd + Counter(elementwise=ADD * T * h)
    return kernels, fwd, bwd


def block_work(arch, shape, *, moe: bool = False) -> tuple[Work, Work, Work]:
    """(forward, backward, what torch's checkpoint reruns) of one decoder block, its memory-bound
    bytes by op class (membound.OP_CLASSES)."""
    T, h = shape.tokens, arch.hidden_size
    rows = T // shape.sp_div
    proj, proj_fwd, proj_bwd = _projections(arch, shape)
    core, core_fwd, core_bwd = _attention(arch, shape)
    mlp, mlp_fwd, mlp_bwd = _mlp(arch, shape, moe)
    residual = 2 * ADD * rows * h  # the two residual adds (and their gradients' sums), on this device's rows
    if arch.style == "gpt":  # two LayerNorms, the two row-parallel biases' gradient sums
        norms = (Counter(layer_norm=2 * LAYERNORM_FWD * rows * h),
                 Counter(layer_norm=2 * LAYERNORM_BWD * rows * h + residual))
        biases = 2 * BIAS_SUM * T * h
    else:
        count, norm = formulas.block_norms(arch), rms_norm(arch)  # two, or Gemma 3's four; the arch's own norm
        norms = (Counter(norm=count * norm.forward(rows * h, rows)),
                 Counter(norm=count * norm.backward(rows * h, rows) + residual))
        biases = 0
    # the two residual dropouts where the model drops (the attention probabilities' under eager: _attention)
    dropouts = (2 * DROPOUT_FWD * T * h, 2 * DROPOUT_BWD * T * h) if arch.drops_residual else (0, 0)
    dropouts = (dropouts[0], dropouts[1] + biases)
    fwd_kernels = proj + core + mlp
    fwd_classes = norms[0] + proj_fwd + Counter(attention=core_fwd) + mlp_fwd + Counter(
        elementwise=residual + dropouts[0])
    # the residual stream's gradient sums land in the norms' backward (where autograd adds them: fake.op_class)
    bwd_classes = norms[1] + proj_bwd + Counter(attention=core_bwd) + mlp_bwd + Counter(
        elementwise=dropouts[1] + accumulate_bytes(arch, shape, moe=moe))
    extra_fwd, extra_bwd = gptoss_time.extra_bytes(arch, shape, moe=moe)  # GPT-OSS's sinks, biases, clamped SwiGLU
    extra_bwd = extra_bwd + Counter(elementwise=BIAS_WRITE * _bias_widths(arch, shape))  # the sums: gptoss_time's
    fwd_classes, bwd_classes = fwd_classes + extra_fwd, bwd_classes + extra_bwd
    flops = formulas.block_flops(arch, shape, moe=moe)
    fwd = work(flops, sum(fwd_classes.values()), fwd_kernels, classed=fwd_classes)
    # FLOPs as MFU counts them, backward 2 x forward; the kernels carry attention's own (2.5x at equal head dims)
    bwd = work(2 * flops, sum(bwd_classes.values()), _backward_kernels(fwd_kernels, arch), classed=bwd_classes)
    return fwd, bwd, _recompute(arch, shape, fwd, moe=moe)


def accumulate_bytes(arch, shape, *, moe: bool = False) -> int:
    """Bytes one backward's weight-gradient accumulation into .grad moves (torch's AccumulateGrad, eager:
    ACCUMULATE x the gradient's bytes) over the parameters this rank holds: under expert parallelism its
    experts / ep routed experts' only."""
    held = formulas.block_params(arch, shape, moe=moe)
    if formulas._is_moe(arch, moe) and shape.ep > 1:
        held -= arch.num_experts * formulas.expert_width_params(arch, shape) // shape.ep * (shape.ep - 1)
    return ACCUMULATE * held * shape.d


def head_accumulate_bytes(arch, shape) -> int:
    """Bytes the output layer's weight-gradient accumulation into .grad moves (head_work's, less the final norm's:
    a norm is no linear, its gradient takes the eager path under any fusion)."""
    return ACCUMULATE * formulas.vocab_per_device(arch, shape) * arch.hidden_size * shape.d


def accumulate_ms(num_bytes: int, gpu, mfu: float | None) -> float:
    """The eager accumulation's `num_bytes` as the roofline charges them (class elementwise; additive by class), the
    part of a backward Megatron's gradient-accumulation fusion does not run (LayerProfile.wgrad_accumulate_ms);
    0 under an explicit MFU, which times FLOPs alone."""
    return 0.0 if mfu is not None else membound_ms(num_bytes, gpu, "eager", "elementwise")


def block_weight_grad_work(arch, shape, *, moe: bool = False) -> Work:
    """What torch 2.13's stage_backward_weight runs of one block's backward (a zero-bubble
    schedule's W; its I, stage_backward_input, runs the rest): each weight's gradient GEMM, dW =
    Xᵀ·dY at its forward GEMM's FLOPs (the attention core's eager matmuls have no weight: both
    their backward GEMMs are I's), the GPT biases' gradient sums and the gradients' accumulation
    into .grad; on RMSNorm blocks each norm weight's gradient (norm_weight_grad_bytes: Hugging Face's
    `weight * hidden` is an op of its own, its weight's gradient a group of torch's, run in W)."""
    T, h = shape.tokens, arch.hidden_size
    proj, _, _ = _projections(arch, shape)
    mlp, _, _ = _mlp(arch, shape, moe)
    kernels = proj + mlp
    summed = 0
    if arch.style == "gpt":  # QKV's, the attention output's, the two MLP linears' biases
        q, kv = formulas.q_width(arch, shape), formulas.kv_width(arch, shape)
        summed = BIAS_SUM * T * (q + 2 * kv) + 2 * BIAS_SUM * T * h + BIAS_SUM * T * (arch.intermediate_size // shape.tp)
    accumulate = ACCUMULATE * formulas.block_params(arch, shape, moe=moe) * shape.d
    moved = summed + accumulate + norm_weight_grad_bytes(arch, shape) + linear_bias_grad_bytes(arch, shape)
    return work(sum(k.flops for k in kernels), moved, kernels, classed={"elementwise": moved})


def linear_bias_grad_bytes(arch, shape) -> int:
    """A LLaMA-style block's attention biases' gradients (Qwen2's q, k and v; GPT-OSS's o too): each the
    output's gradient summed over the tokens (aten.sum: 2 B an element read, gptoss_time.BIAS_GRAD_SUM, which
    block_work's backward charges) and the bias's gradient written (2 B an element, BIAS_WRITE). W runs
    them (torch 2.13's split: a bias's gradient needs no input gradient, and its group is its projection's);
    GPT blocks' bias sums are block_weight_grad_work's own."""
    return (gptoss_time.BIAS_GRAD_SUM * shape.tokens + BIAS_WRITE) * _bias_widths(arch, shape)


def _bias_widths(arch, shape) -> int:
    """The summed widths of a LLaMA-style block's attention biases (none in a GPT block: its own terms)."""
    if arch.style == "gpt":
        return 0
    return (formulas.q_width(arch, shape) + 2 * formulas.kv_width(arch, shape) if arch.qkv_bias else 0) \
        + (arch.hidden_size if arch.o_bias else 0)


def norm_weight_grad_bytes(arch, shape) -> int:
    """What a block's RMSNorm weights' gradients move (transformers' LlamaRMSNorm and kin end in
    `self.weight * hidden_states.to(input_dtype)`: the weight's gradient is grad x hidden, 6 B an element,
    summed over the tokens, 2 B an element read and the weight's width written; Gemma's, fp32: norm_bytes.py),
    over the elements each norm runs on: the block's two norms, or Gemma 3's four (this device's rows), the
    q_norm and k_norm (Qwen3, Gemma 3), a latent attention's latent norms. Part of the norms' backward
    bytes (norm_bytes.RMSNormBytes.bwd); W runs it (torch 2.13's split backward: each norm weight is a
    parameter group of its own). GPT's LayerNorm: 0 (its weight and bias gradients come from
    native_layer_norm_backward itself: not split off here)."""
    if arch.style == "gpt":
        return 0
    T, h = shape.tokens, arch.hidden_size
    rows = T // shape.sp_div
    norms = [(rows * h, h)] * formulas.block_norms(arch)  # each norm module: (elements it runs on, its weight's width)
    if arch.mla:
        norms += [(T * arch.kv_lora_rank, arch.kv_lora_rank)] + ([(T * arch.q_lora_rank, arch.q_lora_rank)]
                                                                 if arch.q_lora_rank else [])
    elif arch.qk_norm:
        norms += [(T * formulas.q_width(arch, shape), arch.head_size), (T * formulas.kv_width(arch, shape), arch.head_size)]
    norm = rms_norm(arch)
    return sum(norm.weight_grad * elements + norm.weight_out * width for elements, width in norms)


def _recompute(arch, shape, fwd: Work, *, moe: bool) -> Work:
    """torch's non-reentrant checkpoint reruns the forward up to the last tensor the backward
    needs (analytic.block_recompute_flops): a LLaMA block's forward but its last matmul (the
    down projection, or the shared experts' where they come last) and the residual add after, on
    this device's rows as block_work counts it (T/t under sequence parallelism)."""
    skipped = formulas.block_flops(arch, shape, moe=moe) - formulas.block_recompute_flops(arch, shape, moe=moe)
    if moe and not skipped and analytic_moe.counts_mixture(arch):  # Mixtral: the mixture's tail and the residual add
        residual, tail = ADD * (shape.tokens // shape.sp_div) * arch.hidden_size, analytic_moe.early_stop_bytes(arch, shape)
        return work(fwd.flops, fwd.bytes - residual - tail, [k for k, n in fwd.kernels for _ in range(n)],
                    classed=Counter(dict(fwd.classed)) - Counter(elementwise=residual, activation=tail))
    if not skipped and arch.post_norms and not arch.drops_residual:  # the rerun stops in the post-MLP norm
        elements = (shape.tokens // shape.sp_div) * arch.hidden_size
        residual, tail = ADD * elements, rms_norm(arch).tail * elements  # at its product's save (norm_bytes)
        return work(fwd.flops, fwd.bytes - residual - tail, [k for k, n in fwd.kernels for _ in range(n)],
                    classed=Counter(dict(fwd.classed)) - Counter(elementwise=residual, norm=tail))
    if not skipped:
        return fwd
    last = Kernel("matmul", skipped)
    kernels = [kernel for kernel, count in fwd.kernels for _ in range(count)]
    kernels.remove(last)
    residual = ADD * (shape.tokens // shape.sp_div) * arch.hidden_size
    return work(fwd.flops - skipped, fwd.bytes - residual, kernels,
                classed=Counter(dict(fwd.classed)) - Counter(elementwise=residual))


def rerun_work(arch, shape, part: str, *, moe: bool = True) -> Work:
    """What a selective option reruns in the backward (analytic.selective_options): `core-attn` the
    attention core; `attn` the attention module (a GQA block's) as torch's non-reentrant checkpoint
    reruns it, its early stop at the last tensor the module saves (the output projection's input, the
    core's output): the Q, K and V projections, rotary (and Qwen3's q/k norms), the core, not the
    output projection's GEMM; `mla-up` latent attention's up projections, `mlp` a MoE block's mixture
    (a dense block's MLP where not `moe`), `norm` one of the block's norms (its forward, as block_work's)."""
    if part == "norm":
        rows = shape.tokens // shape.sp_div
        if arch.style == "gpt":
            num_bytes = LAYERNORM_FWD * rows * arch.hidden_size
            return work(0, num_bytes, [], classed={"layer_norm": num_bytes})
        num_bytes = rms_norm(arch).forward(rows * arch.hidden_size, rows)
        return work(0, num_bytes, [], classed={"norm": num_bytes})
    if part == "core-attn":
        core, fwd_bytes, _ = _attention(arch, shape)
        flops = sum(kernel.flops for kernel in core)
        return work(flops, fwd_bytes, core, classed={"attention": fwd_bytes})
    if part == "attn":
        proj, proj_fwd, _ = _projections(arch, shape)
        core, core_fwd, _ = _attention(arch, shape)
        kernels = proj[:-1] + core  # _projections' last GEMM is the output projection
        classed = proj_fwd + Counter(attention=core_fwd)
        return work(sum(kernel.flops for kernel in kernels), sum(classed.values()), kernels, classed=classed)
    if part == "mla-up":  # the up projections, with the latent norms inside them (TE's spec) and rotary
        heads, T = arch.num_heads // shape.tp, shape.tokens
        kernels = _matmuls(2 * T * arch.q_lora_rank * heads * (arch.qk_nope_head_dim + arch.qk_rope_head_dim),
                           2 * T * arch.kv_lora_rank * heads * (arch.qk_nope_head_dim + arch.v_head_dim))
        _, proj_fwd, _ = _projections(arch, shape)  # but the output's copy (hf_mla: after the kernel)
        classed = Counter(norm=proj_fwd["norm"], attention=proj_fwd["attention"] - hf_mla.forward_bytes(arch, shape)["attention"]
                          + hf_mla.up_bytes(arch, shape))
        return work(sum(kernel.flops for kernel in kernels), sum(classed.values()), kernels, classed=+classed)
    kernels, fwd_bytes, _ = _mlp(arch, shape, moe=moe)
    flops = formulas.mlp_flops(arch, shape, moe=True) if moe else sum(kernel.flops for kernel in kernels)
    return work(flops, sum(fwd_bytes.values()), kernels, classed=fwd_bytes)


def head_work(arch, shape) -> tuple[Work, Work, Work]:
    """The final norm and the LM head: forward, backward, and what torch's checkpoint reruns
    (the norm: the head's matmul output is not needed for its backward)."""
    T, h = shape.tokens, arch.hidden_size
    rows = T // shape.sp_div
    if arch.style == "gpt":
        norm, name = (LAYERNORM_FWD * rows * h, LAYERNORM_BWD * rows * h), "layer_norm"
    else:
        norm, name = (rms_norm(arch).forward(rows * h, rows), rms_norm(arch).backward(rows * h, rows)), "norm"
    flops = formulas.head_flops(arch, shape)
    kernels = _matmuls(flops)
    accumulate = ACCUMULATE * formulas.head_params(arch, shape) * shape.d
    return (work(flops, norm[0], kernels, classed={name: norm[0]}),
            work(2 * flops, norm[1] + accumulate, _backward_kernels(kernels),
                 classed={name: norm[1], "elementwise": accumulate}),
            work(0, norm[0], [], classed={name: norm[0]}))


def embedding_work(arch, shape) -> tuple[Work, Work, Work]:
    """A lookup: the gathered rows read and written and the int64 ids read; backward writes the
    table's gradient from the rows' and adds it into .grad; a checkpoint reruns nothing (the
    lookup keeps only the ids, its input)."""
    rows = shape.tokens * arch.hidden_size * shape.d
    table = formulas.embedding_params(arch, shape) * shape.d
    ids = formulas.INDEX_BYTES * shape.tokens
    fwd, bwd = 2 * rows + ids, rows + ids + table + ACCUMULATE * table
    if arch.style == "gpt" and arch.max_position_embeddings:  # learned positions: one sequence's rows
        # gathered (by torch.arange's int64 positions, written and read) and added to every sequence's;
        # backward, the add's gradient summed over the sequences (none for one: its shape is the
        # positions'), and the lookup's backward reading it and the positions
        positions = shape.seq_len // shape.cp * arch.hidden_size * shape.d  # the rank's positions under CP
        position_ids = formulas.INDEX_BYTES * shape.seq_len // shape.cp
        summed = rows + positions if shape.micro_batch_size > 1 else 0
        fwd = fwd + 2 * positions + 2 * rows + positions + 2 * position_ids
        bwd = bwd + summed + positions + position_ids
    if arch.scaled_embedding:  # Gemma's √hidden_size: its output read and written once more each way
        fwd, bwd = fwd + 2 * rows, bwd + 2 * rows
    if arch.drops_embedding:  # the embedding's dropout over its output
        fwd, bwd = fwd + DROPOUT_FWD * shape.tokens * arch.hidden_size, bwd + DROPOUT_BWD * shape.tokens * arch.hidden_size
    return (work(0, fwd, [], classed={"elementwise": fwd}), work(0, bwd, [], classed={"elementwise": bwd}),
            work(0, 0, []))


def times_ms(passes: tuple[Work, ...], gpu: GPU, mfu: float | None) -> tuple[float, ...]:
    """Each pass's roofline; with an explicit MFU, its FLOPs at the peak x MFU instead."""
    if mfu is None:
        return tuple(roofline_ms(done, gpu) for done in passes)
    return tuple(formulas.flops_ms(done.flops, gpu, mfu) for done in passes)
