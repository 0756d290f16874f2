"""The analytic profile's tensor-parallel collectives per layer and microbatch (LayerCollective),
as Megatron-LM's and torchtitan's tensor-parallel layer plans run them; the cost model charges
their bytes over the group's link (planner/cost/comm.py).

A block's whole activation is X = tokens x hidden x dtype bytes (the gathered sequence).
- With sequence parallelism (Megatron-LM `--sequence-parallel`: megatron/core/tensor_parallel/
  layers.py, ColumnParallelLinear gathers its sequence-sharded input, RowParallelLinear
  reduce-scatters its output; torchtitan's SequenceParallel + ColwiseParallel/RowwiseParallel
  plan, torch/distributed/tensor/parallel/style.py): forward, an all-gather of X before
  attention and before the MLP and a reduce-scatter after each; backward, the mirror (each
  all-gather's gradient a reduce-scatter, each reduce-scatter's an all-gather).
- Without it: an all-reduce of X after attention and after the MLP (RowParallelLinear), and in
  the backward one before each (ColumnParallelLinear's input gradient).
- A full recompute reruns the forward's collectives (the checkpointed region is the block).
- The vocab-parallel embedding reduces its output (all-reduce, or a reduce-scatter under SP; its
  backward an all-gather under SP, nothing without); the column-parallel LM head gathers its
  input under SP (its backward a reduce-scatter), and without SP all-reduces its input's gradient.
Left out: the vocab-parallel cross-entropy's all-reduces of two fp32 values per token (latency
only), and Megatron-LM's second all-gather of a sequence-parallel input for the weight gradient
in the backward (layers.py LinearWithGradAccumulationAndAsyncCommunication; run beside the
input-gradient matmul).
"""

from __future__ import annotations

from planner.profiler.formulas import Shape
from planner.schema import LayerCollective, LayerProfile


def block_collectives(hidden: int, shape: Shape) -> list[LayerCollective]:
    whole = shape.tokens * hidden * shape.d
    if shape.tp <= 1:
        return []
    if shape.sp:
        return [LayerCollective(kind="all-gather", tensor_bytes=whole, fwd=2, bwd=2, recompute=2),
                LayerCollective(kind="reduce-scatter", tensor_bytes=whole, fwd=2, bwd=2, recompute=2)]
    return [LayerCollective(kind="all-reduce", tensor_bytes=whole, fwd=2, bwd=2, recompute=2)]


def embedding_collectives(hidden: int, shape: Shape) -> list[LayerCollective]:
    whole = shape.tokens * hidden * shape.d
    if shape.tp <= 1:
        return []
    if shape.sp:
        return [LayerCollective(kind="reduce-scatter", tensor_bytes=whole, fwd=1, recompute=1),
                LayerCollective(kind="all-gather", tensor_bytes=whole, bwd=1)]
    return [LayerCollective(kind="all-reduce", tensor_bytes=whole, fwd=1, recompute=1)]


def head_collectives(hidden: int, shape: Shape) -> list[LayerCollective]:
    whole = shape.tokens * hidden * shape.d
    if shape.tp <= 1:
        return []
    if shape.sp:
        return [LayerCollective(kind="all-gather", tensor_bytes=whole, fwd=1, recompute=1),
                LayerCollective(kind="reduce-scatter", tensor_bytes=whole, bwd=1)]
    return [LayerCollective(kind="all-reduce", tensor_bytes=whole, bwd=1)]


BY_KIND = {"embedding": embedding_collectives, "decoder_block": block_collectives, "moe_block": block_collectives,
           "norm+lm_head": head_collectives}


def with_collectives(layers: list[LayerProfile], hidden: int, shape: Shape) -> list[LayerProfile]:
    """The analytic layers with their tensor-parallel collectives recorded."""
    return [layer.model_copy(update={"collectives": BY_KIND[layer.kind](hidden, shape)}) if layer.kind in BY_KIND
            else layer for layer in layers]
