"""Transformer Engine's userbuffers ring exchange (Megatron-LM's --tp-comm-overlap) charged as its code runs it: the
GEMM in tp row chunks, each at its own size's efficiency, issued as the chunks' peer copies allow
(docs/framework-facts.md §357-§360).

TE v2.9 (70f53666) common/comm_gemm_overlap/comm_gemm_overlap.cpp, CommOverlapP2PBase:
- all-gather + GEMM (`split_overlap_ag`, 887-1050): the rank's own chunk is in the buffer; GEMM i (of M / tp rows)
  runs on compute stream i % 3, the first at once on the own chunk; step i's copy (a copy-engine peer copy,
  `userbuffers_send` with use_ce) waits on step i-1's receive (`cudaStreamWaitEvent(_stream_send[0], _stop_recv)`,
  so the copies run one after another), and GEMM i+1 waits on step i's receive. Aggregated (`_aggregate`, an
  all-gather's), a first copy of one chunk between neighbours (GEMM 0 waits on it), then tp / 2 GEMMs of two chunks,
  each next one after a copy of two chunks.
- GEMM + reduce-scatter (`split_overlap_rs`, 1118-1207): GEMM i (the chunk rank + i + 1 owns, the rank's own last)
  into its own buffer chunk; once GEMM i is done its output is copied to its owner (on send stream i % 3); the main
  stream waits on every GEMM, send and receive, then reduces (reduce_bf16: ub_sms.ring_reduce_bytes, charged
  apart: comm.userbuffers_reduce_ms).
Taken as TE's code makes it:
- the chunks' GEMMs one after another on the SMs (three streams let two co-run when a chunk's data is ready early;
  what that wins back is not published: not credited, as planner/cost/asynctp.py does for torch's);
- the copies one at a time at a copy engine's peer rate (CommSetup.tp_copy_gb_per_s, planner/models/
  copy_engines.py; NCCL's ring rate for the group where none is published), each a chunk: the all-gather's FP8
  where the record gathers FP8 (TE's fp8_buf), the reduce-scatter's bf16 (its buffer, base.py 475-479);
- set_sm_margin: each chunk's GEMM on the GPU's SMs less num_sm (`_math_sms`, comm_gemm_overlap.cpp 99), at first
  order sms / (sms - num_sm) its time; without use_ce the copies run on num_sm SMs (userbuffers.cu 2314-2340),
  which the GEMMs beside them lose: num_sm / sms of the copies' time.
What a ring-exchange site adds to its pass is the pipeline's length less the GEMM whole (the pass's compute holds
it whole); 0 where the profile gives no ring record (a profile made before, a fake or measured one): those keep
ub_sms's first-order charge.
"""

from __future__ import annotations

from planner.cost import ub_sms

PASSES = ("fwd", "bwd", "recompute")


def all_gather_gemm_ms(chunk_ms: float, copy_ms: float, ranks: int, *, aggregate: bool = False,
                       pair_ms: float = 0.0) -> float:
    """split_overlap_ag's length: GEMM 0 on the own chunk at once, GEMM i once step i-1's copy has landed and
    GEMM i-1 is done, the copies one after another; aggregated (ranks even), a one-chunk copy first, then ranks / 2
    GEMMs of two chunks (`pair_ms`) with two-chunk copies between them."""
    if aggregate and ranks % 2 == 0:
        copy_end = copy_ms  # the first exchange between neighbours: GEMM 0 waits on it
        mm_end = copy_end + pair_ms
        for _ in range(1, ranks // 2):
            copy_end += 2 * copy_ms
            mm_end = max(mm_end, copy_end) + pair_ms
        return mm_end
    mm_end, copy_end = chunk_ms, 0.0
    for _ in range(1, ranks):
        copy_end += copy_ms
        mm_end = max(mm_end, copy_end) + chunk_ms
    return mm_end


def gemm_reduce_scatter_ms(chunk_ms: float, copy_ms: float, ranks: int) -> float:
    """split_overlap_rs's length before its reduce: the ranks' GEMMs one after another, each but the last (the
    rank's own chunk) copied to its owner once done, the copies one at a time."""
    mm_end, copy_end = 0.0, 0.0
    for step in range(ranks):
        mm_end += chunk_ms
        if step < ranks - 1:
            copy_end = max(copy_end, mm_end) + copy_ms
    return max(mm_end, copy_end)


def site_extra_ms(kind: str, tensor_bytes: float, ring: tuple, overlap: ub_sms.Overlap, *, ranks: int,
                  copy_gb_per_s: float, sms: int, float8: bool, gathered_float8: bool,
                  compute_scale: float = 1.0) -> tuple[float, float]:
    """(what one ring-exchange site adds to its pass, its GEMM whole as the pass charges it): `ring` the layer's
    (whole, chunk, pair, fp8 whole, fp8 chunk, fp8 pair) ms, the FP8 ones under float8 where given; `tensor_bytes`
    the whole collective's bf16 tensor, an all-gather's chunk at 1 B an element where `gathered_float8`."""
    whole, chunk, pair, fp8_whole, fp8_chunk, fp8_pair = ring
    if float8 and fp8_whole is not None:
        whole, chunk, pair = fp8_whole, fp8_chunk, fp8_pair
    whole, chunk, pair = whole * compute_scale, chunk * compute_scale, pair * compute_scale
    if overlap.set_sm_margin and sms > overlap.num_sm:
        chunk, pair = chunk * sms / (sms - overlap.num_sm), pair * sms / (sms - overlap.num_sm)
    moved = tensor_bytes / ranks / (2 if gathered_float8 and kind == "all-gather" else 1)
    copy = moved / (copy_gb_per_s * 1e9) * 1e3
    if kind == "all-gather":
        length = all_gather_gemm_ms(chunk, copy, ranks, aggregate=overlap.aggregate, pair_ms=pair)
    else:
        length = gemm_reduce_scatter_ms(chunk, copy, ranks)
    if not overlap.use_ce and sms:  # the copies' CTAs on num_sm SMs beside the GEMMs
        length += min(overlap.num_sm, sms) / sms * (ranks - 1) * copy
    return max(0.0, length - whole), whole


def ring_sites(collectives, which: str, *, config: str | None, gemms: dict | None) -> list[tuple[int, str]]:
    """The indices (into a dense block's eight collectives, LayerCost.collectives) and GEMM names of the pass's
    ring-exchange sites with a ring record: the forward's four (and a full recompute's) or the backward's
    proj_dgrad and fc2_dgrad, by the config's methods (ub_sms.overlaps)."""
    if len(collectives) != 8:
        return []
    table = ub_sms.overlaps(config, gemms)
    names, first = (ub_sms.BACKWARD_GEMMS, 4) if which == "bwd" else (ub_sms.FORWARD_GEMMS, 0)
    return [(first + i, gemm) for i, gemm in enumerate(names)
            if table[gemm].method == "ring_exchange" and len(collectives[first + i]) > 6
            and collectives[first + i][6] is not None]
