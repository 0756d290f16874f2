"""Profiles of published architectures from formulas, without running them.

The pipeline layers are the ones frameworks cut between: the token embedding
(`tok_embeddings`), the N decoder blocks (`layers.0` ... one kind), and the final
norm with the LM head (`output`; torchtitan's `norm` + `output`). Everything is
per device and per microbatch of `b` sequences of `s` tokens, `d` bytes per
activation element (2 for bf16), tensor parallelism `t`, sequence parallelism on
or off. The kept-bytes terms below and the recompute options built from them are in
analytic_kept.py; the layers and the profile are built here.

Kept activation bytes (what a block keeps for backward). Source: Korthikanti et al.
2022, "Reducing Activation Recomputation in Large Transformer Models", §4.1-4.2.
For a GPT block (LayerNorm, GELU MLP of width 4h, dropout, eager attention, 16-bit
activations, 1-byte dropout masks) they count

    no parallelism      s·b·h·(34 + 5·a·s/h)
    TP t                s·b·h·(10 + 24/t + 5·a·s/(h·t))
    TP t + SP           s·b·h·(34/t + 5·a·s/(h·t))
    full recompute      2·s·b·h (/t with SP): the block input only

term by term: LayerNorm inputs 4sbh, the Q/K/V matmuls' shared input 2sbh, Q and K
4sbh, V 2sbh, the output projection's input 2sbh, the MLP's input 2sbh, GELU input
and output 8sbh each, two dropout masks sbh each; and the attention scores: softmax
output 2as²b, its dropout mask as²b and the dropout output 2as²b. Under TP the 24sbh
of Q, K, V, the projection input and the MLP's inner tensors are split /t and the
10sbh of norms, inputs and masks are replicated; SP splits those too.
`gpt_block_terms` lists exactly these terms (with `d` for the 2 bytes) plus
LayerNorm's per-token mean and 1/std in fp32 (8sb per norm), which the paper
leaves out.

LLaMA-style variant (derived here, `llama_block_terms`), term by term from the same
accounting:
- RMSNorm keeps its input (d·sbh) and 1/rms per token in fp32 (4sb), as fused
  RMSNorm kernels (Apex, Transformer Engine) do; twice per block.
- Q/K/V projections: shared input d·sbh (the norm output), as in the paper.
- Grouped-query attention: Q keeps width a·hd, K and V only kv·hd each (kv the
  number of K/V heads; the paper's 4sbh + 2sbh becomes d·sb·(a·hd + 2·kv·hd)).
  Rotary embeddings keep nothing per token beyond the rotated Q and K.
- Attention, flash (the default): no s² scores; FlashAttention keeps its output O
  (which is the output projection's input, counted once) and the softmax
  statistics, logsumexp in fp32 per head and token (4·a·s·b). Dao 2023,
  "FlashAttention-2", Algorithm 1-2.
- Attention, eager: the softmax output d·a·s²·b, kept once for softmax's backward
  and the product with V; no dropout, so none of the paper's as²b mask or 2as²b
  dropout output; the output projection's input d·sbh.
- SwiGLU MLP of width f (intermediate_size): the norm output d·sbh shared by the
  gate and up projections, then four f-wide tensors: the gate output (SiLU's
  input), SiLU's output and the up output (the two factors of the product), and the
  product (the down projection's input): 4·d·sbf where GELU's 4h MLP keeps 2·d·4sbh.
  Megatron's fused bias-SwiGLU keeps 3·d·sbf; unfused (torchtitan, HF) 4.
- No dropout, so no masks.
Under TP the attention and MLP inner tensors are split /t (K/V at
max(kv/t, 1) heads per device), norms and block inputs are replicated unless SP.

Mixture of experts and multi-head latent attention (derived here, term by term in the same
accounting; `moe_terms`, `mla_terms` and their parameter and FLOP counterparts say each term):
a MoE block keeps its router's fp32 probabilities and top-k choice, the tokens dispatched to
each expert, each expert's SwiGLU over its tokens, the outputs the routing weights multiply, and
the shared experts as a dense SwiGLU; an MLA block keeps its latents (norm input and output)
and the up-projected Q, K and V. Routing is data-dependent: each expert is charged
capacity_factor · tokens · top_k / experts tokens (Shape.capacity_factor, 1 = balanced), its
FLOPs likewise (top-k experts per token, not all). MoE blocks are their own layer kind.

FLOPs (forward, per device; multiply-add = 2 FLOPs). GPT block: Narayanan et al.
2021, "Efficient Large-Scale Language Model Training on GPU Clusters", §5.1:
24·b·s·h²·(1 + s/(6h)) = Q/K/V 6bsh², scores and scores·V 4bs²h, output
projection 2bsh², MLP 16bsh². LLaMA: 2·b·s·h·(2·a·hd + 2·kv·hd + 3·f) + 4·b·s²·a·hd
(Q and output projections, K and V at GQA width, three SwiGLU matrices; the
attention matmuls over the full s², as MFU is conventionally counted). LM head
2·b·s·h·V. Backward = 2 × forward (the weight and input gradients, each as large as
the forward matmul); checkpointing recomputes one forward. Time is the fake profile's
roofline (planner/profiler/roofline.py) over the kernels and bytes analytic_time.py writes
from these formulas; an explicit --mfu overrides it with FLOPs / (peak × MFU), and the MFU
the roofline implies is recorded (mfu_implied).

The loss and transients. The head's output is the logits, s·b·V/t in the activation
dtype (vocab-parallel under TP); cross-entropy keeps fp32 softmax over them
(loss_bytes) and builds their gradient in fp32 (loss_transient_bytes), as
Megatron's vocab-parallel cross-entropy does. A layer's transient is the gradient it
receives in backward plus, for a block, an estimate (not from the paper) of the two
largest gradients its backward builds at once; weight gradients are taken to be
accumulated in place. The optimizer step is memory-bound: bytes moved per parameter
(STEP_BYTES_PER_PARAM) over the GPU's HBM bandwidth. Cross-entropy's time likewise.
"""

from __future__ import annotations

import datetime
import json

from planner.errors import UserError
from planner.models.archs import CONTEXT_SOURCE, GPU, Arch
from planner.profiler import (
    allocseq,
    analytic_blocks,
    analytic_comm,
    analytic_cp,
    analytic_mtp,
    analytic_notes,
    analytic_records,
    analytic_split,
    analytic_time,
    compiled_blocks,
    compiled_kept,
    compiled_time,
    float8,
    opsac,
    te_fused,
)
from planner.profiler.analytic_kept import (  # noqa: F401  read as analytic.<name> by callers
    FLASH,
    FP32,
    KORTHIKANTI,
    MASK_BYTES,
    _norm_terms,
    block_terms,
    boundary_bytes,
    korthikanti_block_bytes,
    offload_option,
    selective_options,
)
from planner.profiler.analytic_lifetimes import (
    forward_freed_last,
    forward_last_uses,
    forward_points,
)
from planner.profiler.analytic_scratch import (  # noqa: F401  read as analytic.<name> by callers
    block_scratch,
    block_scratch_terms,
    block_transient_bytes,
)
from planner.profiler.analytic_tied import TIED_ADD_BYTES, tied_embedding, tied_sum_ms  # noqa: F401  read as analytic.<name>
from planner.profiler.formulas import (  # noqa: F401  read as analytic.<name> by callers
    DTYPE_BYTES,
    INDEX_BYTES,
    Attention,
    Shape,
    _is_moe,
    active_params,
    attention_flops,
    attention_params,
    block_flops,
    block_params,
    block_recompute_flops,
    embedding_params,
    expert_gemm_shape,
    expert_tokens,
    expert_width_params,
    flops_ms,
    head_flops,
    head_params,
    kv_width,
    mlp_flops,
    mlp_params,
    q_width,
    total_params,
    vocab_per_device,
)
from planner.profiler.membound import membound_facts, membound_ms
from planner.profiler.roofline import MATMUL_TABLE_SOURCE, implied_mfu
from planner.schema import (
    OPTION_FULL,
    OPTION_NONE,
    DeviceInfo,
    FileRef,
    LayerProfile,
    Profile,
    RecomputeOption,
)

# Bytes one fused optimizer step moves per parameter in mixed precision. Adam: read fp32
# master, m, v and the bf16 gradient, write master, m, v and the bf16 weights (4+4+4+2)·2;
# SGD with momentum: (4+4+2)·2. The step is memory-bound: time = bytes / HBM bandwidth.
STEP_BYTES_PER_PARAM = {"adam": 28, "sgd": 20}


# ---------------------------------------------------------------- widths per device


def check_fits(arch: Arch, shape: Shape) -> None:
    """Refuse a tensor-parallel split the frameworks refuse, and a capacity factor past the worst case."""
    t = shape.tp
    dense = arch.num_moe_layers < arch.num_layers
    widths = [arch.intermediate_size] * dense + [arch.moe_intermediate_size] * (arch.num_moe_layers > 0) + \
        [arch.num_shared_experts * arch.shared_intermediate_size] * (arch.num_shared_experts > 0)
    if arch.num_heads % t or any(width % t for width in widths):
        raise UserError(f"--tp {t} does not divide {arch.name}'s {arch.num_heads} attention heads and MLP "
                        f"widths {', '.join(map(str, widths))}; choose a --tp that divides them")
    worst = arch.num_experts / arch.num_experts_per_tok if arch.num_experts else 0.0
    if arch.num_experts and not 0 < shape.capacity_factor <= worst:
        raise UserError(f"--capacity-factor {shape.capacity_factor:g} is outside (0, {worst:g}] for {arch.name}: "
                        f"{worst:g} (experts / top-k) already puts every token on one expert")
    if not arch.num_experts and shape.capacity_factor != 1.0:
        raise UserError(f"--capacity-factor applies to mixture-of-experts models; {arch.name} has no experts: "
                        "drop it")
    if arch.num_kv_heads % t and t % arch.num_kv_heads:
        raise UserError(f"--tp {t} and {arch.name}'s {arch.num_kv_heads} K/V heads do not divide one "
                        "another; choose a --tp that does")
    if shape.sp and t == 1:
        raise UserError("--sp splits the sequence across the tensor-parallel group; it needs --tp 2 or more")
    if shape.sp and shape.seq_len % t:
        raise UserError(f"--sp splits the sequence across --tp {t} devices; choose a --seq-len divisible by {t}")
    analytic_cp.check_cp(arch, shape)


# ---------------------------------------------------------------- parameters (per device)


def expert_params(arch: Arch, shape: Shape) -> int:
    """The routed experts of one MoE block on one device, E·3·h·f_e/t (of mlp_params): what
    expert parallelism splits over its ranks. The router, the shared experts and Qwen2-MoE's
    shared-expert gate are dense, replicated like attention (Megatron-LM's SharedExpertMLP and
    TopKRouter sit outside its expert-parallel GroupedMLP; torchtitan's likewise)."""
    return arch.num_experts * expert_width_params(arch, shape)  # with GPT-OSS's expert biases


def dispatch_bytes(arch: Arch, shape: Shape) -> int:
    """What a MoE block's token dispatch moves per microbatch from one device: every routed
    token copy's hidden state, E·C slots of h at d bytes (tokens × top-k × h × d at a capacity
    factor of 1; capacity-padded beyond it, as moe_terms keeps them). The combine sends as
    much back, and the backward both again (costmodel: the all-to-all term)."""
    return arch.num_experts * expert_tokens(arch, shape) * arch.hidden_size * shape.d


def step_ms(param_count: int, gpu: GPU) -> dict[str, float]:
    """One memory-bound optimizer step over these parameters at the HBM bandwidth."""
    return {name: param_count * num_bytes / (gpu.hbm_tbps * 1e12) * 1e3
            for name, num_bytes in STEP_BYTES_PER_PARAM.items()}


# ---------------------------------------------------------------- transients


def head_input_grad_bytes(arch: Arch, shape: Shape) -> int:
    """What the output layer's backward makes beside the logits' gradient it receives (both alive then): its
    linear's input gradient [tokens, h], whole under TP (the column-parallel linear's grad_input before its
    all-reduce or reduce-scatter), and under SP the reduce-scatter's output [tokens/t, h], made while that is
    alive (megatron-core tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication.backward:
    `grad_input = grad_output.matmul(weight)`, then `sub_grad_input = torch.empty(...)` reduce-scattered into;
    the same shapes under DTensor's ColwiseParallel). The final norm's backward runs after the logits' gradient
    is freed, on tensors of [tokens, h] at most: smaller than these with it."""
    whole = shape.tokens * arch.hidden_size * shape.d
    return whole + (boundary_bytes(arch, shape) if shape.sp_div > 1 else 0)


def logits_bytes(arch: Arch, shape: Shape, element_bytes: int) -> int:
    """s·b·V/t logits (vocab-parallel under TP)."""
    return shape.tokens * vocab_per_device(arch, shape) * element_bytes


def loss_ms(arch: Arch, shape: Shape, gpu: GPU) -> float:
    """Cross-entropy is memory-bound; per logit, as eager PyTorch runs it over fp32 logits
    (Hugging Face's loss, torchtitan's cross_entropy on logits.float(); the fake profile counts
    the same ops): the cast to fp32 (read d, write 4) and log_softmax (read 4, write 4) forward;
    nll_loss's backward writes a zero-filled fp32 gradient (4), log_softmax's backward reads
    it and its output and writes (12), the cast back reads 4 and writes d. nll_loss itself
    gathers one entry per token. All at the `loss` class's rate (membound.OP_CLASSES), casts included,
    as the fake profile classes everything its loss_fn runs."""
    return membound_ms(logits_bytes(arch, shape, loss_bytes_per_logit(shape)), gpu, "eager", "loss")


def loss_bytes_per_logit(shape: Shape) -> int:
    """The bytes loss_ms moves per logit (recorded in the profile's assumptions: cost/megatron_loss.py)."""
    return 2 * shape.d + 8 * FP32


# ---------------------------------------------------------------- layers and profile


def _layer(name: str, kind: str, *, times: tuple[float, ...], act_bytes: int, input_bytes: int, output_bytes: int,
           input_in_act_bytes: int, param_count: int, transient_bytes: int, shape: Shape, gpu: GPU,
           selective: tuple[RecomputeOption, ...] = (), input_grad_in_transient: bool = False,
           expert_param_count: int = 0, a2a_bytes: int = 0, kept_terms: tuple[int, ...] = (),
           splits: dict | None = None, scratch_terms: list[int] | None = None,
           scratch_freed_early: int = 0, last_uses: tuple[int | None, ...] | None = None,
           points: dict | None = None, freed_last: frozenset[int] = frozenset(), incoming_grad_bytes: int = 0
           ) -> LayerProfile:
    """`times`: forward, backward and (optional, default one forward) what checkpointing reruns,
    in ms; `selective`: the layer's options beyond none and full; a MoE block's routed-expert
    parameters (of param_count) and what its dispatch sends (a2a_bytes); `input_grad_in_transient`: the
    transient counts the input gradient its backward makes, `scratch_terms` its scratch's tensors, the first
    `scratch_freed_early` of them freed before its input gradient (allocseq.synthesised); `splits`: none's and full's split backward (analytic_split.splits); `incoming_grad_bytes`: of the transient, its output's gradient."""
    fwd_ms, bwd_ms, recompute = (*times, times[0]) if len(times) == 2 else times
    options = [RecomputeOption(name=OPTION_NONE, kept_bytes=act_bytes, **(splits or {}).get(OPTION_NONE, {})),
               RecomputeOption(name=OPTION_FULL, kept_bytes=input_bytes, recompute_ms=recompute,
                               recompute_peak_bytes=max(act_bytes - input_bytes, 0), **(splits or {}).get(OPTION_FULL, {})),
               *selective] if selective else []
    return allocseq.synthesised(LayerProfile(  # kept_terms: each kept tensor, for the allocator replay
        recompute_options=options,
        name=name, kind=kind, fwd_ms=fwd_ms, bwd_ms=bwd_ms, fwd_ms_min=fwd_ms, fwd_ms_max=fwd_ms,
        bwd_ms_min=bwd_ms, bwd_ms_max=bwd_ms, recompute_ms=recompute,
        act_bytes=act_bytes,
        input_bytes=input_bytes, output_bytes=output_bytes, input_in_act_bytes=input_in_act_bytes,
        param_count=param_count, param_bytes=param_count * shape.d, transient_bytes=transient_bytes,
        weight_grad_transient_bytes=0, incoming_grad_bytes=incoming_grad_bytes, expert_param_count=expert_param_count,
        a2a_bytes=a2a_bytes, step_ms=step_ms(param_count, gpu),
    ), list(kept_terms) or [act_bytes], input_grad_in_transient=input_grad_in_transient, scratch_terms=scratch_terms,
       scratch_freed_early=scratch_freed_early, last_uses=last_uses, points=points, freed_last=freed_last)


def embedding_layer(arch: Arch, shape: Shape, gpu: GPU, mfu: float | None = None) -> LayerProfile:
    """Keeps the token ids for its weight gradient (learned positions: the one sequence's int64
    position ids too, which the position lookup saves; and GPT's dropout mask); a lookup, no FLOPs:
    memory-bound both ways (analytic_time.embedding_work). Its backward holds the output's gradient and
    the table's, which embedding_dense_backward makes whole and fresh (no GEMM to accumulate it: §700)."""
    ids = INDEX_BYTES * shape.tokens
    positions = INDEX_BYTES * shape.seq_len // shape.cp if arch.style == "gpt" and arch.max_position_embeddings else 0
    mask = MASK_BYTES * shape.tokens * arch.hidden_size // shape.sp_div if arch.drops_embedding else 0
    out = boundary_bytes(arch, shape)
    table = embedding_params(arch, shape) * shape.d  # every table's gradient, in the weights' dtype
    times = analytic_time.times_ms(analytic_time.embedding_work(arch, shape), gpu, mfu)
    return _layer("tok_embeddings", "embedding", times=times, act_bytes=ids + positions + mask, input_bytes=ids,
                  output_bytes=out, input_in_act_bytes=ids, param_count=embedding_params(arch, shape),
                  transient_bytes=out + table, incoming_grad_bytes=out, shape=shape, gpu=gpu,
                  kept_terms=(ids, positions, mask)).model_copy(update={
                      "lookup_param_count": embedding_params(arch, shape), "weight_grad_transient_bytes": table})


def block_layer(index: int, arch: Arch, shape: Shape, gpu: GPU, mfu: float | None = None, *,
                compiled: bool = False) -> LayerProfile:
    """Decoder block `index`: kind moe_block where its MLP is the experts (the cost model
    normalises layers within a kind, and a MoE block is not a dense one), else decoder_block.
    `compiled`: record its kept bytes and its passes' times under torch.compile too (compiled_kept.py,
    compiled_time.py)."""
    boundary, moe = boundary_bytes(arch, shape), arch.is_moe_layer(index)
    scratch = block_scratch(arch, shape, moe=moe)
    passes = analytic_time.block_work(arch, shape, moe=moe)
    times = analytic_time.times_ms(passes, gpu, mfu)
    split = analytic_split.none_split(arch, shape, passes[1], gpu, mfu, moe=moe)  # a split backward's I, W
    # Float8's record (planner/profiler/float8.py): dense blocks, timed by the roofline (not under --mfu)
    fp8 = None if moe or arch.mla or mfu is not None else float8.block_record(
        arch, shape, gpu, passes, prefix=f"layers.{index}", op_sac=opsac.offers_op_sac(arch, shape, moe=moe))
    layer = _layer(f"layers.{index}", "moe_block" if moe else "decoder_block", times=times,
                  act_bytes=sum(term.num_bytes for term in block_terms(arch, shape, moe=moe)), input_bytes=boundary,
                  kept_terms=tuple(term.num_bytes for term in block_terms(arch, shape, moe=moe)),
                  last_uses=forward_last_uses(block_terms(arch, shape, moe=moe)),
                  points=forward_points(block_terms(arch, shape, moe=moe)),
                  freed_last=forward_freed_last(block_terms(arch, shape, moe=moe)),
                  output_bytes=boundary, input_in_act_bytes=boundary, param_count=block_params(arch, shape, moe=moe),
                  transient_bytes=block_transient_bytes(arch, shape, moe=moe), incoming_grad_bytes=boundary, shape=shape, gpu=gpu,
                  scratch_terms=list(scratch.terms), scratch_freed_early=scratch.freed_early,
                  selective=selective_options(arch, shape, gpu, mfu, moe=moe, fwd_ms=times[0], bwd_ms=times[1],
                                              none_split=split), splits=analytic_split.splits(arch, split, times[2], moe=moe),
                  expert_param_count=expert_params(arch, shape) if moe else 0,
                  a2a_bytes=dispatch_bytes(arch, shape) if moe else 0).model_copy(update={
                      "float8": fp8, "wgrad_accumulate_ms": analytic_time.accumulate_ms(
                          analytic_time.accumulate_bytes(arch, shape, moe=moe), gpu, mfu)})
    layer = analytic_records.with_option_records(layer, arch, shape, moe=moe)  # the selective options' records
    layer = layer.model_copy(update={"recompute_options": analytic_split.with_split_bytes(  # a split's bytes
        layer.recompute_options, arch, shape, moe=moe, param_count=layer.param_count,
        transient_bytes=layer.transient_bytes)})
    exchanged = analytic_cp.exchange(arch, shape, gpu, mfu)  # context parallelism's (None at cp 1)
    if exchanged is not None:
        layer = layer.model_copy(update={"context_parallel": exchanged})
    if mfu is None:  # the passes on Transformer Engine's fused kernels (te_fused.py), read under --runtime megatron
        layer = layer.model_copy(update={"te_time": te_fused.te_time(arch, shape, gpu, passes, moe=moe,
                                                                             prefix=f"layers.{index}")})
    if not compiled:
        return layer
    # under torch.compile: what the partition keeps, and the passes timed by inductor's fused bytes
    # (not under --mfu, which times FLOPs alone)
    timed = None if mfu is not None else compiled_time.compiled_time(arch, shape, gpu, passes, moe=moe)
    return layer.model_copy(update={"compiled_kept_bytes": compiled_kept.compiled_kept_bytes(arch, shape, moe=moe),
                                    "compiled_time": timed})


def head_layer(arch: Arch, shape: Shape, gpu: GPU, mfu: float | None = None) -> LayerProfile:
    """Final norm (keeps its input and statistics) and the LM head (keeps the norm output);
    its output is the logits, its backward receives their gradient and makes its input's beside it
    (head_input_grad_bytes): the transient, both."""
    boundary = boundary_bytes(arch, shape)
    kept = sum(term.num_bytes for term in _norm_terms(arch, shape, "final")) + boundary
    times = analytic_time.times_ms(analytic_time.head_work(arch, shape), gpu, mfu)
    return _layer("output", "norm+lm_head", times=times, act_bytes=kept,
                  input_bytes=boundary, output_bytes=logits_bytes(arch, shape, shape.d),
                  input_in_act_bytes=boundary, param_count=head_params(arch, shape),
                  transient_bytes=logits_bytes(arch, shape, shape.d) + head_input_grad_bytes(arch, shape),
                  incoming_grad_bytes=logits_bytes(arch, shape, shape.d),
                  input_grad_in_transient=True, shape=shape, gpu=gpu, kept_terms=(*(term.num_bytes for term in _norm_terms(arch, shape, "final")), boundary)
                  ).model_copy(update={"wgrad_accumulate_ms": analytic_time.accumulate_ms(
                      analytic_time.head_accumulate_bytes(arch, shape), gpu, mfu)})


def mtp_layers(arch: Arch, shape: Shape, gpu: GPU, mfu: float | None) -> list[LayerProfile]:
    """Megatron-core's MTP layers (shape.mtp of them; analytic_mtp.py), each with the decoder's last layer's kind."""
    last = arch.num_layers - 1
    kind = arch.layer(last)
    moe = kind.is_moe_layer(last)
    parts = shape.mtp and dict(embedding=embedding_layer(arch, shape, gpu, mfu), block=block_layer(last, kind, shape, gpu, mfu),
                 block_kept=tuple(term.num_bytes for term in block_terms(kind, shape, moe=moe)), moe=moe,
                 head=head_layer(arch, shape, gpu, mfu), loss_ms=loss_ms(arch, shape, gpu),
                 loss_bytes=logits_bytes(arch, shape, FP32) + FP32, make=_layer)
    return [layer for i in range(shape.mtp) for layer in analytic_mtp.mtp_layers(i, arch, shape, gpu, mfu, **parts)]  # type: ignore[arg-type]


def analytic_profile(arch: Arch, shape: Shape, *, gpu: GPU, mfu: float | None = None,
                     model: FileRef, compiled: bool = False) -> Profile:
    """A Profile with the measured schema, marked analytic, every assumption recorded. Times
    are the roofline (planner/profiler/roofline.py), unless `mfu` overrides them: then each
    pass's FLOPs at the BF16 peak x mfu (memory-bound passes cost nothing). `compiled`: the blocks
    record their kept bytes under torch.compile too (compiled_kept.py)."""
    check_fits(arch, shape)
    layers = [embedding_layer(arch, shape, gpu, mfu),
              *analytic_blocks.blocks(block_layer, arch, shape, gpu, mfu, compiled=compiled),  # each distinct one built once
              *mtp_layers(arch, shape, gpu, mfu),
              head_layer(arch, shape, gpu, mfu)]
    layers = analytic_comm.with_collectives(layers, arch, shape, gpu, mfu)  # tensor-parallel, per microbatch
    layers = compiled_blocks.with_records(layers, arch, shape)  # the compiled blocks read (compiled_blocks.py)
    return Profile(
        name=f"{arch.name}-s{shape.seq_len}-mbs{shape.micro_batch_size}-tp{shape.tp}{'-sp' if shape.sp else ''}"
             f"{f'-cp{shape.cp}' if shape.cp > 1 else ''}{f'-ep{shape.ep}' if shape.ep > 1 else ''}"
             f"{f'-cf{shape.capacity_factor:g}' if shape.capacity_factor != 1.0 else ''}{f'-mtp{shape.mtp}' if shape.mtp else ''}",
        created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        torch_version="none (analytic)",
        device=DeviceInfo(type="cuda", name=f"{gpu.name} (analytic)"),
        dtype=shape.dtype, micro_batch_size=shape.micro_batch_size, model=model,
        batch_input_bytes=INDEX_BYTES * shape.tokens, batch_target_bytes=INDEX_BYTES * shape.tokens,
        # cross-entropy keeps fp32 softmax over the (vocab-parallel) logits, plus the loss value
        loss_bytes=logits_bytes(arch, shape, FP32) + FP32,
        loss_ms=loss_ms(arch, shape, gpu),
        loss_transient_bytes=logits_bytes(arch, shape, FP32),  # the logits' gradient, fp32
        compiled_loss_ms=compiled_time.compiled_loss_ms(arch, shape, gpu, logits_bytes(arch, shape, shape.d))
        if compiled and mfu is None else None,
        layers=layers, source="analytic", assumptions=assumptions(arch, shape, gpu, mfu, layers),
        tied=tied_embedding(arch, shape, gpu),
    )


def implied(arch: Arch, shape: Shape, gpu: GPU, layers: list[LayerProfile]) -> float:
    """The model-FLOPs utilisation the layers' times imply: 3 x the forward's matmul FLOPs
    (forward and backward, no recompute, as frameworks log MFU) over their forward and backward
    time at the BF16 peak."""
    flops = 3 * (sum(block_flops(arch.layer(i), shape, moe=arch.is_moe_layer(i)) for i in range(arch.num_layers))
                 + head_flops(arch, shape))
    return implied_mfu(flops, sum(layer.fwd_ms + layer.bwd_ms for layer in layers), gpu)


def assumptions(arch: Arch, shape: Shape, gpu: GPU, mfu: float | None, layers: list[LayerProfile]) -> dict:
    return {
        "arch": arch.name, "arch_source": arch.source, "style": arch.style,
        # the dimensions themselves, so an export can reproduce the model (Megatron-LM's shape flags)
        "model": json.loads(arch.canonical_json()),
        "seq_len": shape.seq_len, "micro_batch_size": shape.micro_batch_size, "tp": shape.tp, "sp": shape.sp,
        # context parallelism: every per-token figure is the rank's seq_len / cp tokens' (analytic_cp.py)
        "cp": shape.cp,
        # expert parallelism the experts' GEMMs are timed at (formulas.Shape.ep); --ep must match it
        **({"ep": shape.ep} if shape.ep > 1 else {}),
        "attention": shape.attention, "dtype": shape.dtype,
        "gpu": gpu.name, "gpu_memory_bytes": gpu.memory_bytes, "gpu_bf16_tflops": gpu.bf16_tflops,
        "gpu_hbm_tbps": gpu.hbm_tbps, "gpu_source": gpu.source,
        # the bandwidth memory-bound kernels are measured to reach (eager ops, fused kernels; membound.py)
        "membound_tbps": membound_facts(gpu),
        "loss_bytes_per_logit": loss_bytes_per_logit(shape),  # the eager loss loss_ms times
        # --mfu, an explicit override of the roofline (None: not given), and the MFU the times imply
        "mfu": mfu, "mfu_implied": implied(arch, shape, gpu, layers),
        "matmul_efficiency": gpu.matmul_efficiency, "matmul_source": f"{gpu.matmul_source}; by size: "
                                                                     f"{MATMUL_TABLE_SOURCE}",
        "attention_efficiency": list(gpu.attention_efficiency), "attention_source": gpu.attention_source,
        # what one training process can allocate: solve's default --mem
        "gpu_usable_bytes": gpu.usable_bytes,
        "gpu_usable_source": f"{gpu.total_source}; less the {CONTEXT_SOURCE}",
        "vocab_per_device": vocab_per_device(arch, shape),
        "layers": "tok_embeddings = token embedding; layers.N = decoder blocks; output = final norm + LM head",
        "activations": f"{KORTHIKANTI}; LLaMA-style variant derived in planner/profiler/analytic.py; {FLASH}",
        "flops": "Narayanan et al. 2021 §5.1; backward = 2 x forward; recompute: what torch's non-reentrant "
                 "checkpoint reruns (a LLaMA block's forward but its down projection, a GPT block's whole forward); "
                 "the frameworks' runtimes rerun whole forwards (--runtime megatron, torchtitan, deepspeed, colossalai) "
                 "and are charged one forward",
        "time": ("FLOPs / (gpu_bf16_tflops x mfu), --mfu given" if mfu is not None else
                 "roofline per kernel (planner/profiler/roofline.py): each matmul at the efficiency published for "
                 "its size, attention at FlashAttention-2's published throughput (causal: half its blocks), "
                 "memory-bound ops' bytes as eager PyTorch moves them over the HBM bandwidth "
                 "(planner/profiler/analytic_time.py); communication not in these per-layer times"),
        "optimizer_step": "memory-bound: Adam 28, SGD 20 bytes per parameter / HBM bandwidth",
        "loss": "cross-entropy keeps fp32 softmax over s*b*V/t logits; its gradient in fp32 is the transient",
        "transients": "block: output gradient + two largest backward gradients (estimate); "
                      "weight gradients accumulated in place, as a wgrad GEMM accumulating into main_grad makes "
                      "them (Megatron-core's gradient_accumulation_fusion): no fresh weight gradient "
                      "(weight_grad_transient_bytes 0)",
        "tied_embeddings": ("one matrix where the embedding and the head share a stage; split, the last stage "
                            "holds a copy and the cost model charges the gradient's all-reduce between the stages")
                           if arch.tie_word_embeddings else "untied",
        **analytic_notes.moe_assumptions(arch, shape), **analytic_notes.mla_assumptions(arch),
        **({"left_out": arch.left_out} if arch.left_out else {}),  # a multimodal config's vision tower
    }
