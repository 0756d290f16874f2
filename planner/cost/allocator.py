"""What a CUDA device gives up beyond the bytes its tensors hold: the caching allocator's
rounding and fragmentation, and the communication library's workspaces.

A job fails when the caching allocator cannot *reserve*, not when the live tensors reach the
card's size. `torch.cuda.max_memory_allocated` counts live blocks; `max_memory_reserved`
counts the segments the allocator took from the driver, which also hold freed-but-cached
blocks and the tails of split segments; NCCL's buffers sit outside both. The numbers here,
each with its source:

- **Blocks.** Every allocation is rounded up to a multiple of 512 bytes (`kMinBlockSize`,
  `round_size` in c10/cuda/CUDACachingAllocator.cpp), and the allocated statistic counts
  the rounded size. `block_bytes` is that rule; ckplan's profiles count a cuda storage's
  bytes through it, so a fake profile on a fake `cuda` device counts what the allocator does.
- **Segments.** Requests of at most 1 MiB (`kSmallSize`) come from 2 MiB segments
  (`kSmallBuffer`); larger ones below 10 MiB (`kMinLargeAlloc`) from 20 MiB segments
  (`kLargeBuffer`); the rest get a segment of their own rounded up to 2 MiB (`kRoundLarge`).
  `segment_bytes` is that rule; a stage's reserved peak is rounded up to `kRoundLarge`.
- **Fragmentation.** Reserved runs above allocated by the cached blocks no request of the
  right size reuses. Guo et al. 2024 (GMLake, ASPLOS '24, arXiv 2401.08156) measured PyTorch's caching
  allocator on eight LLM training jobs on A100 80GB (recompute, ZeRO, offload, LoRA):
  fragmentation, 1 - allocated / reserved at the peak, 15% on average (up to 33%); that mean
  is the default margin (`DEFAULT_FRAGMENTATION`), and `--fragmentation` states another
  (0 for a run whose allocator is known not to fragment). The margin is a mean, not a bound:
  a job at the published worst case reserves 1.27x more than the default predicts.
- **NCCL.** Each NCCL communicator a rank uses holds buffers outside the caching allocator:
  measured with PyTorch on 4 A100s over NVLink, 544 MiB for a two-rank group and 688 MiB for
  larger ones (NVIDIA/nccl issue 964, the reporter's per-group figures; NCCL 2.18, default
  NCCL_BUFFSIZE). A pipeline rank sends to each neighbour over a two-rank communicator
  (ProcessGroupNCCL's point-to-point communicators), and joins one communicator per
  data-parallel group it reduces in.
"""

from __future__ import annotations

import math

MIB = 1 << 20

# c10/cuda/CUDACachingAllocator.cpp (PyTorch 2.x): the allocator's size classes
MIN_BLOCK_BYTES = 512  # kMinBlockSize: every allocation is a multiple of this
SMALL_SIZE = 1 * MIB  # kSmallSize: largest "small" request
SMALL_BUFFER = 2 * MIB  # kSmallBuffer: segment size for small requests
LARGE_BUFFER = 20 * MIB  # kLargeBuffer: segment size for requests between 1 MiB and 10 MiB
MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc: from here a request gets its own segment
ROUND_LARGE = 2 * MIB  # kRoundLarge: a large segment's size is a multiple of this

# GMLake (Guo et al. 2024): PyTorch's caching allocator on eight LLM training jobs, A100 80GB
DEFAULT_FRAGMENTATION = 0.15

# NVIDIA/nccl issue 964: GPU memory per NCCL communicator, PyTorch on 4 A100s over NVLink
NCCL_PAIR_BYTES = 544 * MIB
NCCL_GROUP_BYTES = 688 * MIB


def block_bytes(nbytes: int) -> int:
    """The bytes the caching allocator counts for a request of `nbytes` (round_size)."""
    if nbytes <= 0:
        return 0
    return max(MIN_BLOCK_BYTES, -(-nbytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES)


def segment_bytes(nbytes: int) -> int:
    """The segment the caching allocator reserves from the driver when no cached block can
    serve a request of `nbytes` (get_allocation_size)."""
    size = block_bytes(nbytes)
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


def reserved_bytes(allocated: float, fragmentation: float) -> int:
    """The reserved peak for an allocated peak: allocated / (1 - fragmentation), rounded up to
    the large segments' granularity."""
    if allocated <= 0:
        return 0
    return math.ceil(allocated / (1 - fragmentation) / ROUND_LARGE) * ROUND_LARGE


def allocated_limit(reservable: float, fragmentation: float) -> float:
    """The largest allocated peak whose reserved_bytes stays within `reservable`: the inverse
    of reserved_bytes, so a solver constraining the allocated peak agrees with the check."""
    if reservable <= 0:
        return 0.0
    return (reservable // ROUND_LARGE) * ROUND_LARGE * (1 - fragmentation)


def communicator_bytes(group_size: int) -> int:
    """NCCL's buffers for one communicator of `group_size` ranks; a group of one has none."""
    if group_size <= 1:
        return 0
    return NCCL_PAIR_BYTES if group_size == 2 else NCCL_GROUP_BYTES
