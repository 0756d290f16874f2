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
- Under SP a block lists each of its eight collectives as its own entry, in analytic_asynctp's
  site order, with the matmuls torch's micro-pipeline TP pass fuses it with (AsyncTP) where it
  fuses any: what the cost model charges under `--tp-overlap async-tp` (planner/cost/asynctp.py), and the
  GEMM Transformer Engine's userbuffers ring exchange splits beside it where it splits one: what the cost
  model runs under `--tp-overlap tp-comm-overlap` (analytic_ubring.py, planner/cost/ub_ring.py).
- The vocab-parallel embedding reduces its output (all-reduce, or a reduce-scatter under SP; its
  backward an all-gather under SP, nothing without); the column-parallel LM head gathers its
  input under SP (its backward a reduce-scatter), and without SP all-reduces its input's gradient.
Left out: the vocab-parallel cross-entropy's all-reduces of two fp32 values per token (latency
only), and Megatron-LM's second all-gather of a sequence-parallel input for the weight gradient
in the backward (layers.py LinearWithGradAccumulationAndAsyncCommunication; run beside the
input-gradient matmul).
"""

from __future__ import annotations

from planner.profiler import analytic_asynctp, analytic_ubring
from planner.profiler.formulas import Shape
from planner.schema import FusedMatmuls, LayerCollective, LayerProfile, RingGemm


def block_collectives(hidden: int, shape: Shape, fused: dict[str, FusedMatmuls] | None = None,
                      ring: dict[str, RingGemm] | None = None) -> list[LayerCollective]:
    """Under SP one entry per place the block runs a collective (analytic_asynctp's site names),
    each with the matmuls AsyncTP fuses it with where `fused` names the site, and the GEMM TE's
    userbuffers ring exchange splits beside it where `ring` does (analytic_ubring)."""
    whole = shape.tokens * hidden * shape.d
    if shape.tp <= 1:
        return []
    if not shape.sp:
        return [LayerCollective(kind="all-reduce", tensor_bytes=whole, fwd=2, bwd=2, recompute=2)]
    fused, ring, kinds = fused or {}, ring or {}, ("all-gather", "reduce-scatter") * 2
    return ([LayerCollective(kind=kind, tensor_bytes=whole, fwd=1, recompute=1, fused=fused.get(site),
                             ring=ring.get(site))
             for site, kind in zip(analytic_asynctp.FORWARD_SITES, kinds)]
            + [LayerCollective(kind=kind, tensor_bytes=whole, bwd=1, fused=fused.get(site), ring=ring.get(site))
               for site, kind in zip(analytic_asynctp.BACKWARD_SITES, kinds)])


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


def mtp_collectives(hidden: int, shape: Shape) -> list[LayerCollective]:
    """An MTP layer's body (analytic_mtp.py): its embedding's and its block's (eh_proj's own not charged)."""
    return embedding_collectives(hidden, shape) + block_collectives(hidden, shape)


BY_KIND = {"embedding": embedding_collectives, "decoder_block": block_collectives, "moe_block": block_collectives,
           "norm+lm_head": head_collectives, "mtp": mtp_collectives, "mtp_head": head_collectives}


def with_collectives(layers: list[LayerProfile], arch, shape: Shape, gpu, mfu: float | None = None) -> list[LayerProfile]:
    """The analytic layers with their tensor-parallel collectives recorded, the blocks' with the
    matmuls AsyncTP fuses them with (analytic_asynctp; the first block of a kind stands for all)."""
    fused, ring = {}, {}
    for layer in layers:
        if layer.kind in ("decoder_block", "moe_block") and layer.kind not in fused:
            fused[layer.kind] = analytic_asynctp.block_fused(arch, shape, gpu, mfu, moe=layer.kind == "moe_block",
                                                             fp8=layer.float8 is not None)
            if layer.kind == "decoder_block":  # TE's ring-exchange GEMMs (a dense block's alone)
                ring[layer.kind] = analytic_ubring.block_ring(arch, shape, gpu, mfu, fp8=layer.float8 is not None)
    out = []
    for layer in layers:
        if layer.kind in fused:
            out.append(layer.model_copy(update={"collectives": block_collectives(
                arch.hidden_size, shape, fused[layer.kind], ring.get(layer.kind))}))
        elif layer.kind in BY_KIND:
            out.append(layer.model_copy(update={"collectives": BY_KIND[layer.kind](arch.hidden_size, shape)}))
        else:
            out.append(layer)
    return out
