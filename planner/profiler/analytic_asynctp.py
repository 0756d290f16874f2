"""Which tensor-parallel collectives of a block torch's micro-pipeline TP pass fuses with matmuls
(torchtitan's AsyncTP), and those matmuls' times whole and per chunk (LayerCollective.fused), for
the cost model to run the fused op as its pipeline (planner/cost/asynctp.py).

The pass (torch/_inductor/fx_passes/micro_pipeline_tp.py, torch 2.13.0 cf30153c, and the same
matching in the copy stored at 5f65158a; torchtitan's `enable_async_tensor_parallel` turns on
`torch._inductor.config._micro_pipeline_tp`, 76dd118 parallelize.py `apply_tp`) rewrites, in each
compiled graph, forward and backward alike:
- an all-gather whose gathered result is the left operand of one or more matmuls
  (`fuse_all_gather_matmul`, 782-910: `_find_consumer_matmuls` 725-742, every mm or
  reshape-mm-reshape user) into `symm_mem.fused_all_gather_matmul(A_shard, [B...])`; the gathered A
  is still returned where something else uses it (return_A, 893-898);
- a reduce-scatter whose input is a matmul's output and nothing else's (`fuse_matmul_reduce_scatter`,
  1030-1175: `_find_producer_matmul` 957-985 must find an mm, or reshape(mm(reshape)), as the
  input itself) into `symm_mem.fused_matmul_reduce_scatter`.
Nothing else: an all-reduce, or a reduce-scatter of a sum of matmuls, stays an NCCL collective.
The pass runs among the post-grad passes of every compiled graph (torch/_inductor/fx_passes/
post_grad.py 241-242), after views became reshapes (compile_fx.py 1349, before 1380), so a linear's
reshape-mm-reshape on a 3-D activation matches; `_is_backward` is defined but unused: backward graphs
are rewritten alike.

On torchtitan's LLaMA block with sequence parallelism (parallelize_llama.py `apply_tp`: attention
and feed_forward take a Shard(1) input redistributed to Replicate; wq/wk/wv and w1/w3 colwise, wo
and w2 rowwise with Shard(1) outputs), the forward's four collectives are all fused: the gather
before attention with wq, wk, wv (three Bs); wo with its reduce-scatter; the gather before the MLP
with w1 and w3; w2 with its reduce-scatter. In the backward: the all-gathers of wo's and w2's
output gradients (the reduce-scatters' adjoints) feed the input-gradient matmuls grad @ W: fused,
and the gathered gradient they return is reused by the weight-gradient matmul (its user through a
transpose), not gathered again. The reduce-scatters of the attention's and the MLP's input
gradients (the gathers' adjoints) take the sum of wq's, wk's, wv's (w1's, w3's) input gradients:
an add, no producer matmul, so not fused and charged whole. The weight gradients of wq..w3 use the
gathered input the forward's fused op returned (saved), or under full AC the recompute's. Under full
AC (torchtitan wraps each block in checkpoint_wrapper, then compiles the block), the collectives
inside the checkpointed region are recomputable (torch/_functorch/partitioners.py 1973-1985
`force_save_collectives` spares must_recompute nodes; PREFER_RECOMPUTE, torch/_higher_order_ops/
wrap.py 445-448), and the recompute's are fused as the forward's. The recompute stops before w2
(its output is not needed by the backward: analytic_time._recompute), so w2's reduce-scatter is
not rerun (analytic_comm).

Only compiled code is rewritten: torchtitan compiles each TransformerBlock (`apply_compile`), so
the embedding's and the LM head's collectives stay NCCL's. MoE blocks: attention as above; the MoE
layer's collectives are not read, so not fused. Latent attention (MLA): not read, not fused.
"""

from __future__ import annotations

from planner.models.archs import GPU
from planner.profiler import analytic_time, formulas
from planner.profiler.formulas import Shape
from planner.profiler.roofline import Kernel, work
from planner.schema import FusedMatmuls

# the sites analytic_comm.block_collectives lists, and which matmuls (their FLOPs) each is fused with
FORWARD_SITES = ("attn-gather", "wo-scatter", "mlp-gather", "w2-scatter")
BACKWARD_SITES = ("wo-grad-gather", "attn-grad-scatter", "w2-grad-gather", "mlp-grad-scatter")


def site_flops(arch, shape: Shape, moe: bool) -> dict[str, list[int]]:
    """Each fused site's matmuls, FLOPs each, on this rank (T gathered tokens, widths / tp)."""
    T, h = shape.tokens, arch.hidden_size
    q, kv = formulas.q_width(arch, shape), formulas.kv_width(arch, shape)
    qkv = [2 * T * h * (q + 2 * kv)] if arch.style == "gpt" else [2 * T * h * q, 2 * T * h * kv, 2 * T * h * kv]
    sites = {"attn-gather": qkv, "wo-scatter": [2 * T * q * h], "wo-grad-gather": [2 * T * h * q]}
    if moe:
        return sites
    f = arch.intermediate_size // shape.tp
    up = [2 * T * h * f] if arch.style == "gpt" else [2 * T * h * f, 2 * T * h * f]
    return {**sites, "mlp-gather": up, "w2-scatter": [2 * T * f * h], "w2-grad-gather": [2 * T * h * f]}


def matmuls_ms(flops: list[int], gpu: GPU, mfu: float | None, *, fp8: bool = False) -> float:
    kernels = [Kernel("matmul-fp8" if fp8 else "matmul", flop) for flop in flops]
    return analytic_time.times_ms((work(sum(flops), 0, kernels),), gpu, mfu)[0]


def _copy_ms(site: str, arch, shape: Shape, gpu: GPU) -> float:
    """The memory-bound copies the fused op adds, at HBM bandwidth: an all-gather's local shard
    into its symmetric-memory buffer (read and write, torch/distributed/_symmetric_memory/__init__.py
    262, 2.13); a reduce-scatter's sum of the tp stacked partials (reads them all, writes the
    rank's shard: `reduce_fn` after `_pipelined_produce_and_all2all`, 1254-1320)."""
    whole = shape.tokens * arch.hidden_size * shape.d
    moved = 2 * whole // shape.tp if site.endswith("gather") else whole + whole // shape.tp
    return moved / (gpu.hbm_tbps * 1e12) * 1e3


def block_fused(arch, shape: Shape, gpu: GPU, mfu: float | None = None, *, moe: bool = False,
                fp8: bool = False) -> dict[str, FusedMatmuls]:
    """The fused sites of one decoder block under sequence parallelism, by site name; none without
    SP (all-reduces are not fused), at TP 1, or for latent attention (not read). `fp8`: the block's
    linears run in float8 under --float8 (its profile's Float8 record)."""
    if shape.tp <= 1 or not shape.sp or arch.mla:
        return {}
    fused = {}
    for site, flops in site_flops(arch, shape, moe).items():
        chunk = [flop // shape.tp for flop in flops]
        fused[site] = FusedMatmuls(
            whole_ms=matmuls_ms(flops, gpu, mfu), chunk_ms=matmuls_ms(chunk, gpu, mfu), copy_ms=_copy_ms(site, arch, shape, gpu),
            fp8_whole_ms=matmuls_ms(flops, gpu, mfu, fp8=True) if fp8 else None,
            fp8_chunk_ms=matmuls_ms(chunk, gpu, mfu, fp8=True) if fp8 else None)
    return fused
