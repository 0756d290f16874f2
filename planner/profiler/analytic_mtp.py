"""Megatron-core's multi-token-prediction (MTP) modules as pipeline layers of the analytic profile
(`mtp.0`, `mtp.1` ...: kind `mtp`, after the decoder stack and before `output`, so they run on the
last stage, as Megatron-core builds them with the output layer: mtp_on_this_rank).

What one MTP layer runs (megatron/core/transformer/multi_token_prediction.py
MultiTokenPredictionLayer at Megatron-LM d98e8a64, and gpt_model.py GPTModel._postprocess /
process_mtp_loss), each part charged as the analytic profile charges the same part elsewhere:
  - the embedding of the input ids rolled by one (`_get_embeddings`): the MTP stage builds a
    LanguageModelEmbedding of its own (gpt_model.py 173: `if self.pre_process or self.mtp_process`),
    so its table's parameters (V/t x h) sit on the last stage beside the head's;
  - enorm (of that embedding) and hnorm (of the decoder's hidden states), their concatenation [T, 2h]
    and eh_proj, a linear 2h -> h (eh_proj's input is what its backward keeps);
  - one transformer layer of the decoder's last layer's kind (a MoE layer for DeepSeek-V3);
  - its own final_layernorm, then the shared output layer over its hidden states (the same FLOPs as the
    head's; no new weight: `output_weight` is the head's) and its own cross-entropy, scaled by
    --mtp-loss-scaling-factor / mtp_num_layers (a scalar: no memory, no time).
Not charged (said in the profile's assumptions): the MTP embedding's gradient all-reduce with the first
stage's (the embedding group) and, under TP > 1, eh_proj's own collective (the layer carries the
embedding's, the block's and the head's)."""

from __future__ import annotations

from planner.profiler import analytic_records, analytic_time
from planner.profiler.analytic_kept import _norm_terms
from planner.profiler.formulas import Shape
from planner.profiler.roofline import work
from planner.schema import OPTION_FULL, OPTION_NONE, FusedKernelTime, LayerProfile, RecomputeOption

SOURCE = ("megatron/core/transformer/multi_token_prediction.py (MultiTokenPredictionLayer, process_mtp_loss) and "
          "megatron/core/models/gpt/gpt_model.py (the MTP stage's own LanguageModelEmbedding) at Megatron-LM d98e8a64")


def assumption(count: int) -> str:
    return (f"{count} multi-token-prediction layer(s) on the last stage, each two layers: mtp.N (the MTP stage's own "
            "embedding lookup, enorm + hnorm, eh_proj (2h -> h), one block of the decoder's last layer's kind, its "
            "final norm) and mtp.N.head (the shared head's GEMM and its own cross-entropy, its fp32 logits kept as "
            "the profile's loss keeps the main one's); not charged: the "
            f"MTP embedding's gradient all-reduce with the first stage's, eh_proj's TP collective ({SOURCE})")


def proj_params(arch, shape: Shape) -> int:
    """enorm and hnorm (RMSNorm: a weight of h each; LayerNorm: weight and bias) and eh_proj's
    [h/t, 2h] weight (a column-parallel linear without bias)."""
    norm = 2 * arch.hidden_size if arch.style == "gpt" else arch.hidden_size
    return 2 * norm + 2 * arch.hidden_size * arch.hidden_size // shape.tp


def proj_work(arch, shape: Shape):
    """enorm + hnorm, the concatenation and eh_proj: forward, backward, rerun (the norms as
    head_work's final norm, each; the concatenation read and written; eh_proj's GEMM 2·T·2h·h/t)."""
    head_fwd, head_bwd, _ = analytic_time.head_work(arch, shape)
    name = "layer_norm" if arch.style == "gpt" else "norm"  # the final norm's class, which head_work names
    norm_fwd, norm_bwd = dict(head_fwd.classed)[name], dict(head_bwd.classed)[name]
    concat = 2 * shape.tokens * 2 * arch.hidden_size * shape.d // shape.sp_div  # torch.cat: read and written
    flops = 2 * shape.tokens * 2 * arch.hidden_size * arch.hidden_size // shape.tp
    kernels = analytic_time._matmuls(flops)
    accumulate = eh_proj_accumulate_bytes(arch, shape)
    fwd = work(flops, 2 * norm_fwd + concat, kernels, classed={name: 2 * norm_fwd, "elementwise": concat})
    return (fwd, work(2 * flops, 2 * norm_bwd + concat + accumulate, analytic_time._backward_kernels(kernels),
                      classed={name: 2 * norm_bwd, "elementwise": concat + accumulate}), fwd)


def eh_proj_accumulate_bytes(arch, shape: Shape) -> int:
    """eh_proj's weight gradient ([h/t, 2h]) added into .grad by the eager pass (analytic_time.ACCUMULATE a
    bf16 element)."""
    return analytic_time.ACCUMULATE * 2 * arch.hidden_size * arch.hidden_size // shape.tp * shape.d


def loss_split_ms(loss_ms: float, shape: Shape) -> tuple[float, float]:
    """The cross-entropy's time (analytic.loss_ms: per logit d + 12 bytes forward, 20 + d backward)
    split into its forward and backward."""
    per_logit = 2 * shape.d + 32
    return loss_ms * (shape.d + 12) / per_logit, loss_ms * (shape.d + 20) / per_logit


def final_norm_work(arch, shape: Shape):
    """The MTP layer's own final_layernorm: head_work's norm, without the head's GEMM."""
    head_fwd, head_bwd, _ = analytic_time.head_work(arch, shape)
    name = "layer_norm" if arch.style == "gpt" else "norm"
    fwd = work(0, dict(head_fwd.classed)[name], [], classed={name: dict(head_fwd.classed)[name]})
    return fwd, work(0, dict(head_bwd.classed)[name], [], classed={name: dict(head_bwd.classed)[name]}), fwd


def mtp_layers(index: int, arch, shape: Shape, gpu, mfu, *, embedding: LayerProfile, block: LayerProfile,
               block_kept: tuple[int, ...], moe: bool, head: LayerProfile, loss_ms: float, loss_bytes: int,
               make) -> list[LayerProfile]:
    """MTP layer `index` as two pipeline layers, from the profile's own embedding, block (the decoder's last
    layer's kind, `moe` or not; `block_kept` each tensor it keeps, its input among them) and head layers and the
    loss's time and kept bytes (`make` is analytic._layer):
    `mtp.N`, what Megatron-core's full recompute checkpoints with the lookup before it (the lookup, enorm,
    hnorm, eh_proj, the transformer layer, the final norm), and `mtp.N.head`, the shared head's GEMM over its
    output and its own cross-entropy. `mtp.N` keeps the transformer layer's tensors one by one, so each of its
    selective options (the block's) has the allocation record the block's has (analytic_records.py)."""
    proj = analytic_time.times_ms(proj_work(arch, shape), gpu, mfu)
    norm = analytic_time.times_ms(final_norm_work(arch, shape), gpu, mfu)
    loss_fwd, loss_bwd = loss_split_ms(loss_ms, shape)
    boundary = block.input_bytes
    norms = [term.num_bytes for which in ("enorm", "hnorm", "final") for term in _norm_terms(arch, shape, which)]
    concat = shape.tokens * 2 * arch.hidden_size * shape.d // shape.sp_div  # eh_proj's saved input
    before = (embedding.act_bytes, *norms[:4], concat)
    kept = (*before, *block_kept, *norms[4:])
    final_norm = 2 * arch.hidden_size if arch.style == "gpt" else arch.hidden_size
    inputs = embedding.act_bytes + 2 * boundary  # the ids, and the checkpoint's two inputs
    body = make(f"mtp.{index}", "mtp", times=(embedding.fwd_ms + proj[0] + block.fwd_ms + norm[0],
                                              embedding.bwd_ms + proj[1] + block.bwd_ms + norm[1],
                                              proj[2] + block.recompute_ms + norm[2]),
                act_bytes=sum(kept), input_bytes=inputs, output_bytes=boundary, input_in_act_bytes=0,
                param_count=embedding.param_count + proj_params(arch, shape) + block.param_count + final_norm,
                transient_bytes=block.transient_bytes, incoming_grad_bytes=block.incoming_grad_bytes, shape=shape,
                gpu=gpu, kept_terms=kept,
                expert_param_count=block.expert_param_count, a2a_bytes=block.a2a_bytes)
    eh_proj = analytic_time.accumulate_ms(eh_proj_accumulate_bytes(arch, shape), gpu, mfu)
    body = body.model_copy(update={"recompute_options": recompute_options(body, block),
                                   "te_time": _te_time(block, embedding, proj, norm, eh_proj),
                                   "wgrad_accumulate_ms": block.wgrad_accumulate_ms + eh_proj})
    start = sum(1 for size in before if size > 0)  # the block's tensors among none's kept ones (zeros not made)
    body = analytic_records.with_option_records(body, arch.layer(arch.num_layers - 1), shape, moe=moe, within=range(
        start, start + sum(1 for size in block_kept if size > 0)))
    gemm = (head.fwd_ms - norm[0] + loss_fwd, head.bwd_ms - norm[1] + loss_bwd, head.recompute_ms - norm[2] + loss_fwd)
    # the shared output weight's second wgrad GEMM, accumulated as the head's first (its own eager pass, or fused)
    return [body, make(f"mtp.{index}.head", "mtp_head", times=gemm, act_bytes=boundary + loss_bytes,
                       input_bytes=boundary, output_bytes=head.output_bytes, input_in_act_bytes=boundary, param_count=0,
                       transient_bytes=head.transient_bytes, incoming_grad_bytes=head.incoming_grad_bytes, shape=shape,
                       gpu=gpu, kept_terms=(boundary, loss_bytes)
                       ).model_copy(update={"wgrad_accumulate_ms": head.wgrad_accumulate_ms})]


def _te_time(block: LayerProfile, embedding: LayerProfile, proj: tuple, norm: tuple,
             eh_proj_accumulate_ms: float) -> FusedKernelTime | None:
    """The MTP layer's passes where its transformer layer runs on Transformer Engine's fused kernels (the
    block's own record, te_fused.te_time: Megatron-core builds `mtp_model_layer` from the decoder's layer
    spec, multi_token_prediction.py 1157-1250 at d98e8a64): the lookup, enorm, hnorm, eh_proj and the final
    norm as the layer's eager passes time them, the block's passes the record's (its selective parts' reruns
    too: the layer's selective options are the block's), eh_proj's backward without its weight gradient's eager
    accumulation (`eh_proj_accumulate_ms`: a ColumnParallelLinear, which the gradient-accumulation fusion runs in its
    wgrad GEMM as the record's linears; kept in accumulate_ms for where it is off); None without a record."""
    timed = block.te_time
    if timed is None:
        return None
    full = timed.recompute_ms.get(OPTION_FULL, block.recompute_ms)
    return FusedKernelTime(fwd_ms=embedding.fwd_ms + proj[0] + timed.fwd_ms + norm[0],
                           bwd_ms=embedding.bwd_ms + proj[1] - eh_proj_accumulate_ms + timed.bwd_ms + norm[1],
                           recompute_ms={**timed.recompute_ms, OPTION_FULL: proj[2] + full + norm[2]}, float8=None,
                           accumulate_ms=timed.accumulate_ms + eh_proj_accumulate_ms)  # where the fusion is off


def recompute_options(layer: LayerProfile, block: LayerProfile) -> list[RecomputeOption]:
    """What an MTP layer keeps under each recompute Megatron-core runs on it: `none`; `full`
    (--recompute-granularity full, method uniform: MultiTokenPredictionLayer._checkpointed_forward
    checkpoints eh_proj, the transformer layer and the final norm, keeping its two inputs, the hidden
    states and the rolled embedding, beside the lookup's ids: the layer's input_bytes; method block skips
    MTP recompute, multi_token_prediction.py 1630-1634); and each selective option of its transformer
    layer (the block's: TransformerLayer's and MoELayer's own recompute of the same modules), the rest kept."""
    rest = layer.act_bytes - block.act_bytes
    options = [RecomputeOption(name=OPTION_NONE, kept_bytes=layer.act_bytes),
               RecomputeOption(name=OPTION_FULL, kept_bytes=layer.input_bytes, recompute_ms=layer.recompute_ms,
                               recompute_peak_bytes=max(layer.act_bytes - layer.input_bytes, 0))]
    return options + [option.model_copy(update={"kept_bytes": rest + option.kept_bytes})
                      for option in block.recompute_options
                      if option.name not in (OPTION_NONE, OPTION_FULL, "op-sac", "offload")]
