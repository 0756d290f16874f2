"""AsyncTP (torchtitan's `enable_async_tensor_parallel`): a fused collective charged as the pipeline
torch runs it, not as hidden behind its pass.

torch's micro-pipeline TP pass replaces an all-gather feeding matmuls, and a matmul feeding a
reduce-scatter, with symmetric-memory ops that split the matmul into tp row chunks and move each
chunk by a copy-engine copy from (or to) one peer (planner/profiler/analytic_asynctp.py says which
collectives of a block it fuses). The code, torch 2.13.0 cf30153c
torch/distributed/_symmetric_memory/__init__.py:
- all-gather + matmul (`_pipelined_multi_all_gather_and_consume`, 146-294): the rank copies its own
  shard into its symmetric buffer and waits at a barrier (262-266; overlapping that copy with the
  first matmul is given up, 222-261), multiplies its own chunk at once (269), then at step
  i = 1 .. tp-1 copies rank+i's shard and multiplies it, on stream i % 2 (271-280): a step's copy
  follows that stream's previous matmul (step i-2's), and "cp from different streams cannot
  overlap" (the copies run one at a time).
- matmul + reduce-scatter (`_pipelined_produce_and_all2all`, 325-440, from `_fused_matmul_reduce_
  scatter_impl` 1254-1320): at step i = 1 .. tp-1, on stream i % 2, the rank multiplies the chunk
  rank+i needs, barriers, and copies the peer's partial of its own rows (after that stream's
  previous copy, step i-2's, frees its buffer: two buffers alternate); its own chunk is multiplied
  last (438); then the tp partials are summed (a memory-bound kernel).
Each chunk's matmul runs at its own size's efficiency (the profile's chunk_ms, the roofline's shape
curve at 1/tp of the FLOPs); matmuls on the two streams share the SMs, taken here as one after the
other (their co-running, which the code's comment says reduces the small chunks' quantization
loss, is not credited). Each copy moves 1/tp of the tensor at a copy engine's rate from one peer
(CommSetup.tp_copy_gb_per_s, planner/models/copy_engines.py; the TP group's NCCL bus bandwidth, comm.tp_link,
where none is published): over the tp-1 copies, the ring's (tp-1)/tp of the tensor. Left out:
the barriers' and launches' latency (microseconds beside milliseconds here).

What a fused op adds to its pass: its pipeline's end, plus its copies (the profile's copy_ms),
less the matmuls' whole time (already in the pass's compute).

Memory, read at torch 2.6.0 (git 2236df17, the release of the torch 1963fc8 torchtitan 9dec370 ran)
torch/distributed/_symmetric_memory/__init__.py and torch/_inductor/fx_passes/micro_pipeline_tp.py:
- the workspace: one symmetric-memory tensor per tensor-parallel group (get_symm_mem_workspace,
  99-137), grown to the largest request and never shrunk, allocated by
  `_SymmetricMemory.empty_strided_p2p`, which maps memory with the CUDA driver (cuMemCreate and
  cuMemMap, torch/csrc/distributed/c10d/CUDASymmetricMemory.cu CUDASymmetricMemoryAllocator::alloc,
  read at pytorch 07506d39; the C++ of 1963fc8 was not at hand): outside the caching allocator, so in
  neither torch.cuda's reserved figure nor the allocated one, but taken from the device. An
  all-gather + matmul asks for its shard's bytes (172-175; the float8 shard under torchao's
  Float8ColwiseParallel, which casts before the all-gather), a matmul + reduce-scatter for two of
  its output's row chunks (336-337: two buffers alternate). `symmetric_workspace_bytes`.
- in the caching allocator, at any batch, the fused ops allocate what the unfused path does: the
  gathered input whole (A_flat, 534-537, returned for the weight gradients) and the matmuls' outputs
  (539-542), or the tp partials whole (stacked_partials, 954) and the scattered result. What
  depends on the layout: the pass makes the shard (and a reduce-scatter's matmul input) contiguous
  with its gathered dimension first (micro_pipeline_tp.py 566-572, 721-727: force_stride_order), so
  with the sequence gathered (SP) a batch of b > 1 sequences needs [s/tp, b, h] order, which inductor
  writes directly where the shard is a kernel it generates (the norms, the float8 casts, SwiGLU's
  product): a compiled torchtitan block's every fused shard is one. Nothing here is charged.
"""

from __future__ import annotations


def all_gather_matmul_ms(chunk_ms: float, transfer_ms: float, ranks: int) -> float:
    """The all-gather + matmul pipeline's length: own chunk first, beside the first copy; each
    further chunk's matmul once its copy has landed and the previous matmul is done."""
    mm_end = [chunk_ms]
    copy_end = 0.0
    for step in range(1, ranks):
        stream_free = mm_end[step - 2] if step >= 2 else 0.0  # this stream's previous matmul
        copy_end = max(copy_end, stream_free) + transfer_ms
        mm_end.append(max(mm_end[-1], copy_end) + chunk_ms)
    return mm_end[-1]


def matmul_reduce_scatter_ms(chunk_ms: float, transfer_ms: float, ranks: int) -> float:
    """The matmul + reduce-scatter pipeline's length: each peer's chunk multiplied, then copied
    once the link is free; own chunk last, beside the last copy."""
    mm_end, copy_end = 0.0, [0.0]  # copy_end[i]: step i's copy done (0: none yet)
    for step in range(1, ranks):
        buffer_free = copy_end[step - 2] if step >= 2 else 0.0  # this stream's previous copy
        mm_end = max(mm_end, buffer_free) + chunk_ms
        copy_end.append(max(copy_end[-1], mm_end) + transfer_ms)
    own_stream_free = copy_end[ranks - 1 - (ranks - 1) % 2] if ranks > 2 else 0.0  # stream 0's last copy
    mm_end = max(mm_end, own_stream_free) + chunk_ms
    return max(mm_end, copy_end[-1])


def fused_extra_ms(kind: str, tensor_bytes: float, ranks: int, gb_per_s: float, fused: tuple, *,
                   float8: bool = False, compute_scale: float = 1.0, gathers_float8: bool = False) -> float:
    """What one fused collective adds to its pass beyond its matmuls' whole time: `fused` is the
    layer's (whole, chunk, copy, fp8 whole, fp8 chunk) ms (LayerCost.collectives); under float8 the
    fp8 figures where the profile gives them. Matmul times scale as the pass's compute does.
    `gathers_float8` (comm.gathers_float8): an all-gather's shard is a float8 cast, so its copies into
    the symmetric buffer and from each peer move half the bf16 tensor's bytes (the workspace, below,
    holds it at 1 B too)."""
    whole, chunk, copy, fp8_whole, fp8_chunk = fused
    if float8 and fp8_whole is not None and fp8_chunk is not None:
        whole, chunk = fp8_whole, fp8_chunk
    if gathers_float8 and kind == "all-gather":
        tensor_bytes, copy = tensor_bytes / 2, copy / 2
    whole, chunk = whole * compute_scale, chunk * compute_scale
    transfer = tensor_bytes / ranks / (gb_per_s * 1e9) * 1e3
    pipeline = all_gather_matmul_ms if kind == "all-gather" else matmul_reduce_scatter_ms
    return max(0.0, pipeline(chunk, transfer, ranks) + copy - whole)


def symmetric_workspace_bytes(collectives, ranks: int, *, float8: bool) -> int:
    """AsyncTP's symmetric-memory workspace for the tensor-parallel group (the module's docstring):
    the largest request among the fused collectives, an all-gather's shard (1/ranks of the gathered
    tensor, half of it in float8) or two row chunks of a reduce-scatter's bf16 partials (2/ranks of
    the tensor: _scaled_mm's output is bf16 under float8 too). `collectives` are the profile's
    LayerCollective entries (tensor_bytes: the whole bf16 tensor); 0 where none is fused. The
    driver's allocation granularity and the signal pad (a few KiB) are left out."""
    need = 0.0
    for collective in collectives:
        if collective.fused is None:
            continue
        if collective.kind == "all-gather":
            need = max(need, collective.tensor_bytes / ranks / (2 if float8 else 1))
        else:
            need = max(need, 2 * collective.tensor_bytes / ranks)
    return int(need)
