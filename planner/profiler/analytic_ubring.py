"""The GEMMs Transformer Engine's userbuffers ring exchange splits (Megatron-LM's --tp-comm-overlap), each as TE's
linears run it, whole and in its chunks, for the cost model to run as TE's code orders them
(LayerCollective.ring; planner/cost/ub_ring.py).

A ring exchange (TE v2.9 70f53666, common/comm_gemm_overlap/comm_gemm_overlap.cpp: CommOverlapP2PBase's
split_overlap_ag 887-1050, split_overlap_rs 1118-1207; docs/framework-facts.md §357) runs its GEMM as tp GEMMs of
M / tp rows (the communicator's _ubufs chunks, 662-681), or, aggregated (an all-gather's `aggregate`), as tp / 2
GEMMs of 2 M / tp rows: each such GEMM is timed at its own FLOPs' efficiency (the roofline's shape curve,
planner/profiler/roofline.py matmul_efficiency: OpenXLA's measured H100 GEMMs read at the GPU's own plateau).

Under sequence parallelism a dense block's collectives (analytic_comm.block_collectives, analytic_asynctp's site
order) sit beside these GEMMs under TE's userbuffers (TE v2.9 module/base.py 302-312, framework-facts §137):
  attn-gather      qkv_fprop    linear_qkv's forward, Q, K and V one GEMM over the gathered norm output
  wo-scatter       proj_fprop   linear_proj's forward, its output reduce-scattered
  mlp-gather       fc1_fprop    linear_fc1's forward, gate and up one GEMM (2 f wide under SwiGLU)
  w2-scatter       fc2_fprop    linear_fc2's forward
  wo-grad-gather   proj_dgrad   linear_proj's input gradient over the gathered output gradient
  w2-grad-gather   fc2_dgrad    linear_fc2's input gradient
The two backward reduce-scatters (attn-grad-scatter, mlp-grad-scatter) are bulk overlaps of qkv_wgrad and
fc1_wgrad: beside a whole GEMM, none split (no record). A MoE or latent-attention block: none read.
"""

from __future__ import annotations

from planner.models.archs import GPU
from planner.profiler import analytic_asynctp
from planner.profiler.formulas import Shape
from planner.schema import RingGemm

RING_SITES = ("attn-gather", "wo-scatter", "mlp-gather", "w2-scatter", "wo-grad-gather", "w2-grad-gather")


def block_ring(arch, shape: Shape, gpu: GPU, mfu: float | None = None, *, fp8: bool = False) -> dict[str, RingGemm]:
    """The ring-exchange GEMMs of one dense decoder block under sequence parallelism, by site name (RING_SITES):
    each site's GEMMs as one (TE's fused Q/K/V and gate/up linears: analytic_asynctp's per-matmul FLOPs summed);
    none at TP 1, without SP, for latent attention or a MoE block. `fp8`: the block's linears run in FP8."""
    if shape.tp <= 1 or not shape.sp or arch.mla:
        return {}
    flops = analytic_asynctp.site_flops(arch, shape, moe=False)
    ring = {}
    for site in RING_SITES:
        gemm = sum(flops[site])
        ring[site] = RingGemm(**_times(gemm, shape.tp, gpu, mfu, fp8=False),
                              **({f"fp8_{key}": ms for key, ms in _times(gemm, shape.tp, gpu, mfu, fp8=True).items()}
                                 if fp8 else {}))
    return ring


def _times(flops: int, tp: int, gpu: GPU, mfu: float | None, *, fp8: bool) -> dict[str, float]:
    """One GEMM of `flops` whole, one of its tp row chunks and two (an aggregated exchange's), in ms."""
    pair = 2 * flops // tp if tp > 2 else flops
    return {"whole_ms": analytic_asynctp.matmuls_ms([flops], gpu, mfu, fp8=fp8),
            "chunk_ms": analytic_asynctp.matmuls_ms([flops // tp], gpu, mfu, fp8=fp8),
            "pair_ms": analytic_asynctp.matmuls_ms([pair], gpu, mfu, fp8=fp8)}
