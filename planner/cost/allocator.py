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
  a job at the published worst case reserves 1.27x more than the default predicts. It is the
  fallback: where a profile recorded its layers' allocations the reserve is the replay's
  (planner/cost/reserve.py), and the solvers keep the margin to bound the allocated peak.
- **Expandable segments.** torchtitan's launch scripts set `PYTORCH_CUDA_ALLOC_CONF=
  "expandable_segments:True"` (run_llama_train.sh 22 at 9dec370; run_train.sh at 3aff9bd9 to
  2c8b5947 and later). CUDA builds honour it (one growing segment per stream and pool; any split
  whose remainder is >= 512 B). ROCm builds ignored it, warning "expandable_segments not supported on
  this platform", until pytorch#173330 (merged 2026-03-01, relanded as #177974): the allocator's
  ExpandableSegment was compiled only `#if !defined(USE_ROCM) && defined(PYTORCH_C10_DRIVER_API_
  SUPPORTED)`. So torchao's MI300X benchmark (torch 2.9.0.dev20250811+rocm6.4) ran the rules below,
  and its H100 one (torch 2.7.0a0) ran expandable segments. The segment sizes themselves have no ROCm
  branch (get_allocation_size). GMLake's margin was measured without expandable segments; no
  published fragmentation figure with them was found, so the divisor charges the same margin to both.
  The replay runs them (CachingAllocator(expandable=True)) where the job's launch sets them:
  --expandable-segments, else as the runtime's launch script does (RuntimeFacts.expandable_segments; torchtitan's
  multi-node multinode_trainer.slurm sets nothing, so a job over several nodes runs the default segments:
  expandable_segments_across_nodes; planner/cost/reserve_fsdp2.py, docs/framework-facts.md §31).
- **NCCL.** Each NCCL communicator's buffers sit outside the caching allocator: planner/cost/nccl_buffers.py.
- **The replay.** `replay` runs the allocator's own rules (below) on a stage's allocations and
  frees, so the reserved peak is the segments that sequence takes, not a margin.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

from planner.cost.allocator_segments import (  # noqa: F401 (the size classes, named from here too)
    LARGE_BUFFER,
    MAX_NON_SPLIT_ROUNDING,
    MIB,
    MIN_BLOCK_BYTES,
    MIN_LARGE_ALLOC,
    ROUND_LARGE,
    SMALL_BUFFER,
    SMALL_SIZE,
    OutOfMemory,
    SegmentPools,
    _Block,
    _Pool,
    block_bytes,
    segment_bytes,
)

# GMLake (Guo et al. 2024): PyTorch's caching allocator on eight LLM training jobs, A100 80GB
DEFAULT_FRAGMENTATION = 0.15

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


# ---------------------------------------------------------------- the replay
#
# PyTorch's CUDACachingAllocator replayed on a sequence of allocations and frees, read from
# c10/cuda/CUDACachingAllocator.cpp at pytorch/pytorch commit 001074d25084 (DeviceCachingAllocator:
# malloc, get_free_block, should_split, alloc_found_block, free_block, try_merge_blocks), with the
# defaults a job runs under: no expandable segments, max_split_size unlimited, no garbage
# collection threshold, no empty_cache during the step (segments are returned only by the out-of-memory path
# under a cap: planner/cost/allocator_segments.py, docs/framework-facts.md §132).
#
# - A request is rounded by round_size (block_bytes) and served from the small pool (<= 1 MiB) or
#   the large one. Each pool's free blocks are ordered by (stream, size, address)
#   (BlockComparatorSize); get_free_block takes the first at or above (stream, size): best fit,
#   the lowest address among equals, and never a block of another stream.
# - None found: a new segment of get_allocation_size (segment_bytes) is reserved.
# - The block found is split when the remainder is >= 512 B (small pool) or > 1 MiB (large pool,
#   and only for a request below max_split_size); the request takes the front. An unsplit
#   block is allocated whole: the allocated statistic counts its whole size.
# - A freed block merges with its free neighbours in the segment (try_merge_blocks). A block
#   used on another stream (record_stream) is not free until that stream's event completes
#   (free is deferred to process_events): Free(deferred=True) holds it until its Ready(key) or a Sync().
# - With max_split_size set, a request below it is never served by a block at or above it, and
#   a request at or above it only by a block less than max_non_split_rounding_size (kLargeBuffer by default)
#   larger (get_free_block).
#
# The torchtitan rows ran torch 2.6.0 (git 2236df17; torchtitan 9dec370's own torch 1963fc8 is of the same December
# 2024 main). 001074d25084 is older than 2.6.0 (it has no max_non_split_rounding_size, which 2.6.0's
# CUDAAllocatorConfig.h has), and a later copy (ROCm/pytorch 08b2238d, c10 AcceleratorAllocatorConfig) has the same
# get_free_block, should_split, get_allocation_size, round_size, try_merge_blocks and malloc order at the defaults:
# at the defaults these jobs run (no PYTORCH_CUDA_ALLOC_CONF across nodes, no memory fraction) the rules above are
# 2.6.0's too (docs/framework-facts.md §464-§466). A collective's tensors are freed at once where the job sets
# TORCH_NCCL_AVOID_RECORD_STREAMS=1 (torchtitan does: §467-§468); without it ProcessGroupNCCL records its stream on
# them and their frees wait for its events (Free(deferred=True)).


# Events are named tuples: a stage's step makes thousands, and the replay runs once per stage of
# every evaluated plan.


class Alloc(NamedTuple):
    key: Hashable  # names the allocation for its Free
    nbytes: int
    stream: int = 0  # the stream current when it was allocated: its pool


class Free(NamedTuple):
    key: Hashable
    deferred: bool = False  # used on another stream (record_stream): cached only at its Ready


class Ready(NamedTuple):
    """The other stream's event recorded on `key`'s deferred free is complete: its block is cached."""

    key: Hashable


class Sync(NamedTuple):
    """Every other stream's recorded events are complete (process_events frees what waited)."""


Event = Alloc | Free | Ready | Sync


@dataclass(frozen=True)
class Replayed:
    allocated_peak_bytes: int  # max_memory_allocated: the blocks handed out, whole
    reserved_peak_bytes: int  # max_memory_reserved: the segments taken from the driver
    segments: int
    # under a cap (CachingAllocator(cap_bytes=...)): the requests that released cached segments and retried
    # (num_alloc_retries), and the first that failed even then (None: the replay ran under the cap)
    retries: int = 0
    oom: OutOfMemory | None = None


class CachingAllocator(SegmentPools):
    """The DeviceCachingAllocator's bookkeeping (no memory): malloc, free, process_events.
    `expandable`: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, read at 001074d25084 (Note
    [Expandable Segments]; alloc_block, find_expandable_block, map_block,
    try_allocate_expandable_block, should_split, get_free_block): one segment per stream and pool,
    its pages 2 MiB (small pool) or 20 MiB (large) mapped for the rounded request (not
    get_allocation_size's) at the lowest-address unmapped range that, with the free block before it,
    holds it; best fit counts a free block followed by unmapped space as the size it can grow to, so a
    larger free block that fits is taken before it; any split whose remainder is >= 512 B.
    `cap_bytes`: the bytes the process may reserve; past them malloc's out-of-memory path runs as the code
    does (planner/cost/allocator_segments.py `_alloc_block`). None: no cap, no segment ever released."""

    def __init__(self, *, max_split_bytes: int | None = None, expandable: bool = False,
                 cap_bytes: int | None = None) -> None:
        super().__init__(max_split_bytes=max_split_bytes, expandable=expandable, cap_bytes=cap_bytes)
        self.live: dict[Hashable, _Block] = {}
        self.allocated_peak = 0

    def malloc(self, key: Hashable, nbytes: int, stream: int = 0) -> None:
        if key in self.live:
            raise ValueError(f"allocation {key!r} is already live")
        size = block_bytes(nbytes)
        if size == 0:
            return
        small = size <= SMALL_SIZE
        pool = self.pools[small]
        block = pool.best_fit(stream, size)
        if block is not None and self.expandable:
            block = self._growable_fit(pool, block)
        if block is not None and self._oversize_refuses(size, block):
            block = None
        if block is not None:
            pool.remove(block)
        else:
            block = self._alloc_block(key, size, stream, small)
        if self._should_split(block, size):
            rest = _Block(block.address + size, block.size - size, stream, small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            pool.insert(rest)
        block.allocated = True
        self.live[key] = block
        self.allocated += block.size
        if self.allocated > self.allocated_peak:
            self.allocated_peak = self.allocated

    def free(self, key: Hashable, *, deferred: bool = False) -> None:
        block = self.live.pop(key, None)
        if block is None:
            return  # a zero-byte request: never allocated
        block.allocated = False
        self.allocated -= block.size
        if deferred:
            block.waiting = True
            self.pending[key] = block
        else:
            self._free_block(block)

    @staticmethod
    def _growable_fit(pool: _Pool, block: _Block) -> _Block:
        """get_free_block under expandable segments: while the next larger free block of the stream can grow to
        less than this one (its size, and the unmapped range after it), that one."""
        def grows(b: _Block) -> int:
            return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)
        while (larger := pool.next_of(block)) is not None and grows(larger) < grows(block):
            block = larger
        return block

    def _oversize_refuses(self, size: int, block: _Block) -> bool:
        if block.small:
            return False
        if size < self.max_split:
            return block.size >= self.max_split
        return block.size >= size + MAX_NON_SPLIT_ROUNDING

    def _should_split(self, block: _Block, size: int) -> bool:
        remaining = block.size - size
        if block.small or self.expandable:
            return remaining >= MIN_BLOCK_BYTES
        return size < self.max_split and remaining > SMALL_SIZE


def _replayed(state: CachingAllocator) -> Replayed:
    return Replayed(state.allocated_peak, state.reserved_peak, state.segments, state.retries, state.oom)


# A change of a replayed sequence (planner/cost/reserve_range.py: its large requests a page larger or smaller)
Perturb = Callable[[list[Event]], list[Event]]


def replay(events: Iterable[Event], *, max_split_bytes: int | None = None, expandable: bool = False,
           cap_bytes: int | None = None, perturb: Perturb | None = None) -> Replayed:
    """The allocated and reserved peaks of the caching allocator over `events`, from an empty
    cache (a pure function of the sequence); `expandable`: under expandable segments; `cap_bytes`: the bytes
    the allocator may reserve (torch's out-of-memory path past them; None: no cap); `perturb`: the sequence
    changed by it first (None: as given)."""
    state = CachingAllocator(max_split_bytes=max_split_bytes, expandable=expandable, cap_bytes=cap_bytes)
    play(state, events if perturb is None else perturb(list(events)))
    return _replayed(state)


def play(state: CachingAllocator, events: Iterable[Event]) -> None:
    """`events` on the allocator's `state`, in order."""
    malloc, free, ready = state.malloc, state.free, state.ready
    for event in events:
        kind = type(event)
        if kind is Alloc:
            malloc(*event)
        elif kind is Free:
            free(event[0], deferred=event[1])
        elif kind is Ready:
            ready(event[0])
        else:
            state.sync()


def held_peak(events: Iterable[Event]) -> int:
    """The most bytes `events` hold live at once, each request rounded as round_size rounds it (block_bytes): a
    floor under the allocated peak of any replay of them, and so under its reserved peak (a segment holds every
    block allocated in it, and each block is at least its rounded request), whatever the cap. A replay under a
    cap that keeps its reserve within it never reserves more than the cap, so under a cap below this floor some
    request fails (torch's OutOfMemoryError). Deferred frees count as freed (their blocks, waiting, are cached
    later: still reserved, so the floor holds)."""
    live: dict[Hashable, int] = {}
    held = peak = 0
    for event in events:
        kind = type(event)
        if kind is Alloc:
            size = block_bytes(event[1])
            if size:
                live[event[0]] = size
                held += size
                peak = max(peak, held)
        elif kind is Free:
            held -= live.pop(event[0], 0)
    return peak


def settled_replay(static: Iterable[Event], step: Callable[[int], list[Event]], *, min_steps: int, max_steps: int,
                   expandable: bool = False, cap_bytes: int | None = None, perturb: Perturb | None = None) -> Replayed:
    """The peaks over `static`, then step(0), step(1), ... until a step raises neither peak (at least
    `min_steps`, at most `max_steps`): every step makes the same requests, so one that takes no new segment
    leaves the cache as the next finds it. A run's logged max_memory_reserved is over every step before it,
    and without a cap the reserve only grows (nothing empties the cache), so the settled figure is what a later
    step logs. Under `cap_bytes` (None: no cap): a release can leave the next step to take its segments again, and
    the peak (never past the cap) still only grows; the replay stops at the first request no release makes room
    for (torch's OutOfMemoryError ends the run). `perturb`: the static events and each step changed by it (None:
    as given)."""
    change: Perturb = (lambda events: events) if perturb is None else (lambda events: perturb(list(events)))
    state = CachingAllocator(expandable=expandable, cap_bytes=cap_bytes)
    play(state, change(static))
    for index in range(max_steps):
        peaks = (state.allocated_peak, state.reserved_peak)
        play(state, change(step(index)))
        if state.oom is not None or index >= min_steps - 1 and (state.allocated_peak, state.reserved_peak) == peaks:
            break
    return _replayed(state)
