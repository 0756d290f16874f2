"""The host's waits in DeepSpeed ZeRO 3's backward under the optimizer's offload (docs/framework-facts.md §255-§257;
the record's waits_offloaded_grad_copy, read at DeepSpeed v0.6.2).

Each parameter's gradient hook runs on torch's AccumulateGrad node, which autograd runs as soon as the gradient is
made (sequence_nr UINT64_MAX), before the next node's kernels are issued. A weight of at least `reduce_bucket_size`
elements (every weight of the Azure blocks at their 9e7) goes into a bucket of its own and is reduce-scattered at the
next parameter's hook (stage3.py 1469-1490: the bucket flushes when the next gradient would take it past the size);
under the optimizer's offload that hook then copies the reduced partition to the host with a blocking `copy_` on the
reduce stream, at the accumulation boundary (once an iteration). So the host issues nothing more until the weight's
reduce-scatter (which waits for the weight's own backward GEMMs) and the partition's copies are done, and all the GPU
has meanwhile is what was issued between the weight's hook and the next one.

In Megatron-DeepSpeed's GPT block (62bc4562: dense_h_to_4h, dense and dense_4h_to_h skip their bias add, which
runs fused in bias_gelu and bias_dropout_add; query_key_value adds its own) the next hook after a weight comes after:

- dense_4h_to_h's weight: bias_gelu_back (read the gradient and the input, write the gradient: 6 B an element of
  T x 4h) and dense_h_to_4h's bias gradient, summed from it (read 2 B), then dense_h_to_4h's bias hook;
- dense_h_to_4h's weight: post_attention_layernorm's backward and the residual's gradient add (6 + 6 B an element
  of T x h, the analytic profile's layer_norm class for both), then that norm's weight hook;
- dense's weight: the core attention's backward (its two batched GEMMs, the scores' softmax and dropout), then
  query_key_value's bias hook: longer than dense's reduce-scatter on every Azure row (DS4: ~34 ms of eager scores
  against 12 ms), so not charged;
- query_key_value's weight: input_layernorm's backward and the residual's add, then that norm's weight hook.

Each is charged max(0, reduce-scatter + NCCL's ring latency (Simple) + the partition's three copies over the host
link - the kernels queued behind it), once an iteration. The three copies (stage3.py 1655-1706): the partition into
the pinned fp16 buffer (non_blocking), back to the GPU (`.to(device)`), and to the fp32 gradient through a host fp16
temporary (the blocking one), 2 B an element each; the step no longer charges the gradients' copy to the host
(dataparallel.offload_phases_ms), nor nccl_sms.layer_ms its CTAs beside these reduce-scatters, which run beside
no GEMM (`waited_reduce_ms`). Not charged: the host's fp16-to-fp32 conversion of the partition and its Python
until the next kernel (the torch calls there not counted; GPU.host_call_us, DGX A100's 21.01 µs carried to its EPYC
7742 and read for NDm A100 v4's 7V12, both Zen 2, would price them once counted); weights under the bucket size, which
share buckets flushed where the running sum crosses it; the copies of the other parameters (dense's weight, biases,
norms: reduced behind GEMMs or the core attention); and the blocks of other archs (their hook order not read).

The embedding's gradients (the word embedding, tied to the head in Megatron-DeepSpeed's GPT, and the positions) are
made by the backward's last kernels, so they sit in the last bucket, which `independent_gradient_partition_epilogue`
reduces and partitions after the backward (stage3.py 1390-1395), its three copies included, and then waits for
(`__reduce_and_partition_stream.synchronize()`): nothing is left on the GPU to hide the copies, charged in full
(`embedding_copies_ms`, framework-facts §293; dataparallel.exposed_comm_ms charges the reduce-scatter itself).
"""

from __future__ import annotations

from planner.cost import dataparallel, deepspeed_terms, links, runtimes, stepcomm
from planner.cost.comm import MS_PER_US
from planner.cost.layers import LayerCost
from planner.schema import Profile, TrainSetup

GB = 1e9
COPIES = 3  # the reduced partition to pinned fp16, back to the GPU, and to the fp32 gradient (stage3.py 1655-1706)

# Megatron-DeepSpeed's GPT block: a weight -> the kernels issued before the next parameter's hook, each (the analytic
# profile's op class, bytes an element, the width: "h" hidden or "f" intermediate) of T tokens (the module docstring;
# the bytes are planner/profiler/analytic_time.py's ACT_BYTES["gelu_kernel"] backward, BIAS_SUM, LAYERNORM_BWD, ADD)
QUEUED_BEHIND = {
    "dense_4h_to_h": (("activation", 6, "f"), ("elementwise", 2, "f")),
    "dense_h_to_4h": (("layer_norm", 6, "h"), ("layer_norm", 6, "h")),
    "query_key_value": (("layer_norm", 6, "h"), ("layer_norm", 6, "h")),
}


def _rate_tbps(profile: Profile, op_class: str) -> float | None:
    """The profile's eager rate for an op class (membound_tbps' by_class, else its eager mean, else the HBM's)."""
    known = profile.assumptions
    rates = known.get("membound_tbps") or {}
    return (rates.get("by_class") or {}).get(op_class) or rates.get("eager") or known.get("gpu_hbm_tbps")


def queued_ms(name: str, profile: Profile, setup: TrainSetup) -> float:
    """The kernels queued behind a GPT block's weight when its reduce-scatter is issued (QUEUED_BEHIND), ms."""
    model, known = profile.assumptions["model"], profile.assumptions
    tokens = known["micro_batch_size"] * known["seq_len"]
    width = {"h": model["hidden_size"], "f": model["intermediate_size"]}
    total = 0.0
    for op_class, per_element, which in QUEUED_BEHIND[name]:
        tbps = _rate_tbps(profile, op_class)
        total += per_element * tokens * width[which] / (tbps * 1e12) * 1e3 if tbps else 0.0
    return total * setup.time.compute_scale


def charges(profile: Profile, setup: TrainSetup) -> bool:
    """Whether the waits are charged: the record's blocking copy under the optimizer's offload, ZeRO 3's coordinator
    running, and a GPT block ckplan can split (deepspeed_terms.profile_block at TP 1)."""
    model = profile.assumptions.get("model") or {}
    return bool(setup.data_parallel.offload and runtimes.of(setup.training).waits_offloaded_grad_copy
                and deepspeed_terms.runs_zero3(setup) and model.get("style") == "gpt"
                and setup.data_parallel.shard_gb_per_s)


def weight_wait_ms(numel: int, setup: TrainSetup) -> float:
    """One weight's reduce-scatter as the host waits for it: its bytes over the shard group's link (one reduction's
    share of dataparallel.grad_reduce_ms), NCCL's ring latency (Simple, the tuner's for these sizes), and the
    partition's COPIES over the host link."""
    k, tp = dataparallel.shard_size(setup), setup.comm.tp
    reduce = dataparallel.grad_reduce_ms(numel, setup) / dataparallel.reductions_per_iteration(setup)
    nodes = links.group_nodes(k, tp, setup.comm.domain)
    latency = links.ring_latency_us("reduce-scatter", k, nodes, stepcomm.in_node_hardware(setup), "Simple") * MS_PER_US
    host = setup.data_parallel.host_gb_per_s
    copies = COPIES * dataparallel.param_bytes(setup).grads * numel / k / (host * GB) * 1e3 if host else 0.0
    return reduce + latency + copies


def waited_weights(layer: LayerCost, profile: Profile, setup: TrainSetup) -> list[tuple[str, int]]:
    """(name, elements) of the layer's weights the host waits for (QUEUED_BEHIND's, of at least reduce_bucket_size
    elements); [] where `charges` is false or the layer is not a GPT block ckplan can split."""
    if layer.kind != "decoder_block" or not charges(profile, setup):
        return []
    block = deepspeed_terms.profile_block(profile, layer)
    if block is None:
        return []
    bucket = setup.data_parallel.reduce_bucket_size
    bucket = deepspeed_terms.REDUCE_BUCKET_DEFAULT if bucket is None else bucket
    return [(module.name, module.param_numels[0]) for module in block
            if module.name in QUEUED_BEHIND and module.param_numels[0] >= bucket]


def offload_waits_ms(layer: LayerCost, profile: Profile, setup: TrainSetup) -> float:
    """The GPU's idle time in the layer's backward while the host waits for its weights' reduce-scatters (the module
    docstring), once an iteration; 0 where nothing is waited for (waited_weights)."""
    return sum(max(0.0, weight_wait_ms(numel, setup) - queued_ms(name, profile, setup))
               for name, numel in waited_weights(layer, profile, setup))


def waited_reduce_ms(layer: LayerCost, profile: Profile, setup: TrainSetup) -> float:
    """The waited weights' reduce-scatters at the boundary microbatch (their bytes, one reduction's), ms: they run
    beside the few kernels queued behind them, not beside the backward's GEMMs, so nccl_sms.layer_ms leaves them out
    of the compute its CTAs slow."""
    reductions = dataparallel.reductions_per_iteration(setup)
    return sum(dataparallel.grad_reduce_ms(numel, setup) / reductions
               for _, numel in waited_weights(layer, profile, setup))


def embedding_copies_ms(layer: LayerCost, setup: TrainSetup) -> float:
    """The embedding's reduced partitions' COPIES over the host link after the last backward, once an iteration (the
    module docstring: the epilogue's bucket, waited for with nothing queued behind it), ms; 0 but for the embedding
    under the record's blocking copy, the optimizer's offload and ZeRO 3's coordinator."""
    host = setup.data_parallel.host_gb_per_s
    if (layer.kind != "embedding" or not host or not setup.data_parallel.offload
            or not runtimes.of(setup.training).waits_offloaded_grad_copy or not deepspeed_terms.runs_zero3(setup)):
        return 0.0
    partition = layer.param_count / dataparallel.shard_size(setup)
    return COPIES * dataparallel.param_bytes(setup).grads * partition / (host * GB) * 1e3


# the rows planner/cost/deepspeed_step.py adds to TERMS (name, quantity, where, value, source)
ROWS = (
    ("the offloaded optimizer's blocking gradient copy: a weight's reduce-scatter the host waits for beyond the "
     "kernels queued behind it", "step", "layer",
     lambda layer, ckpt, ctx: offload_waits_ms(layer, ctx.profile, ctx.setup),
     "the record's waits_offloaded_grad_copy (DeepSpeed v0.6.2 stage3.py __partition_grads: fp32_grad_tensor.copy_, "
     "blocking, in the gradient hook); torch's AccumulateGrad first; Megatron-DeepSpeed 62bc4562's GPT block "
     "(planner/cost/deepspeed_waits.py, §255-§257)"),
    ("the offloaded optimizer's copies of the embedding's gradient partitions after the last backward", "step",
     "layer", lambda layer, ckpt, ctx: embedding_copies_ms(layer, ctx.setup),
     "the record's waits_offloaded_grad_copy (DeepSpeed v0.6.2 stage3.py independent_gradient_partition_epilogue "
     "1390-1395: the last bucket reduced and its partition copied, then the stream synchronized), three copies of 2 "
     "B an element of the rank's partition over the host link (planner/cost/deepspeed_waits.py, §293)"),
)
