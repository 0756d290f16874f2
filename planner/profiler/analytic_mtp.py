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

from planner.profiler import analytic_time, formulas
from planner.profiler.analytic_kept import _norm_terms
from planner.profiler.formulas import Shape
from planner.profiler.roofline import work
from planner.schema import LayerProfile

SOURCE = ("megatron/core/transformer/multi_token_prediction.py (MultiTokenPredictionLayer, process_mtp_loss) and "
          "megatron/core/models/gpt/gpt_model.py (the MTP stage's own LanguageModelEmbedding) at Megatron-LM d98e8a64")


def assumption(count: int) -> str:
    return (f"{count} multi-token-prediction layer(s) mtp.N on the last stage, each the MTP stage's own embedding "
            "lookup, enorm + hnorm, eh_proj (2h -> h), one block of the decoder's last layer's kind, its final norm, "
            "the shared head's GEMM and its own cross-entropy (kept: the loss's fp32 logits too); not charged: the "
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
    accumulate = analytic_time.ACCUMULATE * 2 * arch.hidden_size * arch.hidden_size // shape.tp * shape.d
    fwd = work(flops, 2 * norm_fwd + concat, kernels, classed={name: 2 * norm_fwd, "elementwise": concat})
    return (fwd, work(2 * flops, 2 * norm_bwd + concat + accumulate, analytic_time._backward_kernels(kernels),
                      classed={name: 2 * norm_bwd, "elementwise": concat + accumulate}), fwd)


def loss_split_ms(loss_ms: float, shape: Shape) -> tuple[float, float]:
    """The cross-entropy's time (analytic.loss_ms: per logit d + 12 bytes forward, 20 + d backward)
    split into its forward and backward."""
    per_logit = 2 * shape.d + 32
    return loss_ms * (shape.d + 12) / per_logit, loss_ms * (shape.d + 20) / per_logit


def mtp_layer(index: int, arch, shape: Shape, gpu, mfu, *, embedding: LayerProfile, block: LayerProfile,
              head: LayerProfile, loss_ms: float, loss_bytes: int, make) -> LayerProfile:
    """MTP layer `index` from the profile's own embedding, block (the decoder's last layer's kind)
    and head layers, and the loss's time and kept bytes; `make` is analytic._layer."""
    proj = analytic_time.times_ms(proj_work(arch, shape), gpu, mfu)
    loss_fwd, loss_bwd = loss_split_ms(loss_ms, shape)
    times = (embedding.fwd_ms + proj[0] + block.fwd_ms + head.fwd_ms + loss_fwd,
             embedding.bwd_ms + proj[1] + block.bwd_ms + head.bwd_ms + loss_bwd,
             embedding.recompute_ms + proj[2] + block.recompute_ms + head.recompute_ms + loss_fwd)
    norms = [term.num_bytes for term in _norm_terms(arch, shape, "enorm")] + \
        [term.num_bytes for term in _norm_terms(arch, shape, "hnorm")]
    concat = shape.tokens * 2 * arch.hidden_size * shape.d // shape.sp_div  # eh_proj's saved input
    kept = (embedding.act_bytes, *norms, concat, block.act_bytes, head.act_bytes, loss_bytes)
    params = (embedding.param_count + proj_params(arch, shape) + block.param_count
              + head.param_count - formulas.vocab_per_device(arch, shape) * arch.hidden_size)
    return make(f"mtp.{index}", "mtp", times=times, act_bytes=sum(kept), input_bytes=block.input_bytes,
                output_bytes=block.output_bytes, input_in_act_bytes=0, param_count=params,
                transient_bytes=max(block.transient_bytes, head.transient_bytes), shape=shape, gpu=gpu,
                expert_param_count=block.expert_param_count, a2a_bytes=block.a2a_bytes, kept_terms=kept)
