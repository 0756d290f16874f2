"""The caching allocator's segments: what c10/cuda/CUDACachingAllocator.cpp (pytorch/pytorch 001074d25084) takes
from the driver and gives back, under the free pools planner/cost/allocator.py's CachingAllocator serves requests
from: the size classes, blocks and pools, a new segment (cudaMalloc) or an expandable segment's pages, and, under a
cap, malloc's out-of-memory path (release_available_cached_blocks, release_cached_blocks, the retry, then
OutOfMemoryError). Nothing here reads a file or prints."""

from __future__ import annotations

import bisect
from collections.abc import Hashable
from dataclasses import dataclass
from typing import NamedTuple

MIB = 1 << 20

# c10/cuda/CUDACachingAllocator.cpp (PyTorch 2.x): the allocator's size classes
MIN_BLOCK_BYTES = 512  # kMinBlockSize: every allocation is a multiple of this
SMALL_SIZE = 1 * MIB  # kSmallSize: largest "small" request
SMALL_BUFFER = 2 * MIB  # kSmallBuffer: segment size for small requests
LARGE_BUFFER = 20 * MIB  # kLargeBuffer: segment size for requests between 1 MiB and 10 MiB
MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc: from here a request gets its own segment
ROUND_LARGE = 2 * MIB  # kRoundLarge: a large segment's size is a multiple of this
# get_free_block's "oversized block ... rounded up but within a limit": a request at or above max_split_size takes a
# cached block only if it is less than this much larger. torch 2.6.0 reads it from PYTORCH_CUDA_ALLOC_CONF's
# max_non_split_rounding_mb (CUDAAllocatorConfig.h 70-72, 125 in the 2.6.0 wheel, git 2236df17), default kLargeBuffer
# (CUDAAllocatorConfig's constructor); 001074d25084, older, adds kLargeBuffer itself: the same 20 MiB unless that
# option is set (docs/framework-facts.md §464-§465)
MAX_NON_SPLIT_ROUNDING = LARGE_BUFFER

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


class OutOfMemory(NamedTuple):
    """The first request no release made room for under the cap: torch raises OutOfMemoryError here."""

    key: Hashable
    nbytes: int  # the rounded request
    reserved: int  # what the allocator held after releasing every cached segment it could
    allocated: int


@dataclass(eq=False, slots=True)
class _Block:
    address: int
    size: int
    stream: int
    small: bool
    allocated: bool = False
    waiting: bool = False  # freed, its other stream's event not yet complete
    mapped: bool = True  # expandable segments: False for a range of the segment's address space with no pages
    prev: _Block | None = None
    next: _Block | None = None

    def sort_key(self) -> tuple[int, int, int]:
        return self.stream, self.size, self.address


class _Pool:
    """Free blocks ordered as BlockComparatorSize orders them."""

    def __init__(self) -> None:
        self.keys: list[tuple[int, int, int]] = []
        self.blocks: dict[tuple[int, int, int], _Block] = {}

    def insert(self, block: _Block) -> None:
        key = (block.stream, block.size, block.address)  # sort_key, inline: the replay's most frequent call
        bisect.insort(self.keys, key)
        self.blocks[key] = block

    def remove(self, block: _Block) -> None:
        key = (block.stream, block.size, block.address)
        del self.keys[bisect.bisect_left(self.keys, key)]
        del self.blocks[key]

    def next_of(self, block: _Block) -> _Block | None:
        """The next larger free block of `block`'s stream, in BlockComparatorSize's order."""
        at = bisect.bisect_right(self.keys, block.sort_key())
        if at == len(self.keys) or self.keys[at][0] != block.stream:
            return None
        return self.blocks[self.keys[at]]

    def best_fit(self, stream: int, size: int) -> _Block | None:
        at = bisect.bisect_left(self.keys, (stream, size, -1))
        if at == len(self.keys) or self.keys[at][0] != stream:
            return None
        return self.blocks[self.keys[at]]


# An expandable segment's address space: room to grow past any cap (torch's is 1 1/8 of the device's memory), and a
# multiple of both page sizes, so every segment starts on a page and its pages lie on whole multiples of the page.
SEGMENT_SPACE = LARGE_BUFFER << 30


class SegmentPools:
    """The allocator's segments and free pools, its deferred frees (process_events), and its reserved statistic.
    `cap_bytes`: what the driver lets the process reserve (the device's usable bytes less what lies outside the
    allocator: NCCL's buffers); None: no cap, and segments are never released (no empty_cache during a step)."""

    def __init__(self, *, max_split_bytes: int | None, expandable: bool, cap_bytes: int | None) -> None:
        self.max_split = max_split_bytes if max_split_bytes is not None else 1 << 62
        self.expandable = expandable
        self.cap = cap_bytes
        self.unmapped: dict[tuple[int, bool], list[_Block]] = {}  # expandable: a stream and pool's unmapped ranges
        self.pools = {True: _Pool(), False: _Pool()}  # small, large
        self.pending: dict[Hashable, _Block] = {}
        self.allocated = self.reserved = self.reserved_peak = 0
        self.segments = self.retries = 0
        self.oom: OutOfMemory | None = None
        self._next_address = 0

    def ready(self, key: Hashable) -> None:
        block = self.pending.pop(key, None)
        if block is not None:
            block.waiting = False
            self._free_block(block)

    def sync(self) -> None:
        for key in list(self.pending):
            self.ready(key)

    def _alloc_block(self, key: Hashable, size: int, stream: int, small: bool) -> _Block:
        """DeviceCachingAllocator::malloc when no cached block serves: alloc_block (cudaMalloc, or the expandable
        segment's pages); where the cap refuses it, release_available_cached_blocks and alloc_block again; then
        release_cached_blocks and alloc_block again (a retry: num_alloc_retries); then torch raises
        OutOfMemoryError: the first such request is recorded and the replay takes the memory past the cap, so the
        sequence plays on. (garbage_collection_threshold acts only under set_per_process_memory_fraction.)"""
        block = self._driver_block(size, stream, small, capped=True)
        if block is None and self._release_available(size, stream, small):
            block = self._driver_block(size, stream, small, capped=True)
        if block is None:
            self.retries += 1
            self._release_cached()
            block = self._driver_block(size, stream, small, capped=True)
        if block is None:
            if self.oom is None:
                self.oom = OutOfMemory(key, size, self.reserved, self.allocated)
            block = self._driver_block(size, stream, small, capped=False)
        assert block is not None
        return block

    def _over(self, nbytes: int) -> bool:
        return self.cap is not None and self.reserved + nbytes > self.cap

    def _driver_block(self, size: int, stream: int, small: bool, *, capped: bool) -> _Block | None:
        if self.expandable:
            return self._allocate_expandable(size, stream, small, capped=capped)
        nbytes = segment_bytes(size)
        if capped and self._over(nbytes):
            return None
        return self._new_segment(nbytes, stream, small)

    def _new_segment(self, size: int, stream: int, small: bool) -> _Block:
        block = _Block(self._next_address, size, stream, small)
        self._next_address += size + ROUND_LARGE  # segments never touch: only split blocks merge
        self.reserved += size
        self.reserved_peak = max(self.reserved_peak, self.reserved)
        self.segments += 1
        return block

    def _release_available(self, size: int, stream: int, small: bool) -> bool:
        """release_available_cached_blocks: nothing unless max_split_size is set; then the request's pool's
        smallest free block of its stream at or above max(request, max_split_size), released whole; none: its
        largest free oversize blocks, largest first, until they add up to that much (those released stay released
        even where they fall short, and the call then fails). Not under expandable segments: at 001074d25084
        release_block asserts on an expandable block (later torch skips them)."""
        if self.max_split >= 1 << 62 or self.expandable:
            return False
        pool, want = self.pools[small], max(size, self.max_split)
        at = bisect.bisect_left(pool.keys, (stream, want, -1))
        if at < len(pool.keys) and pool.keys[at][0] == stream:
            self._release(pool.blocks[pool.keys[at]])
            return True
        released = 0
        at -= 1
        while released < want and at >= 0 and pool.keys[at][0] == stream and pool.keys[at][1] >= self.max_split:
            block = pool.blocks[pool.keys[at]]
            released += block.size
            self._release(block)
            at -= 1
        return released >= want

    def _release(self, block: _Block) -> None:
        """release_block: a free segment back to the driver (cudaFree)."""
        self.pools[block.small].remove(block)
        self.reserved -= block.size
        self.segments -= 1

    def _release_cached(self) -> None:
        """release_cached_blocks: every deferred free completed (synchronize_and_free_events), then release_blocks
        on the large pool and the small one: each free block that is a whole segment (no prev, no next) released;
        under expandable segments every free block's whole pages unmapped instead, and a segment left with no
        mapped page released."""
        self.sync()
        for small in (False, True):
            pool = self.pools[small]
            for block in [pool.blocks[key] for key in pool.keys]:
                if self.expandable:
                    self._unmap(block)
                    if block.prev is None and block.next is None:
                        self.unmapped[block.stream, small].remove(block)  # release_expandable_segment
                        self.segments -= 1
                elif block.prev is None and block.next is None:
                    self._release(block)

    # ------------------------------------------------------------ expandable segments

    def _allocate_expandable(self, size: int, stream: int, small: bool, *, capped: bool) -> _Block | None:
        """try_allocate_expandable_block: the candidate find_expandable_block gives, its unmapped ranges mapped
        (map_block) one after the other until it holds the request; a mapping the cap refuses fails whole, and
        the pages mapped before it stay mapped (free, in the pool)."""
        block = self._find_expandable(size, stream, small)
        if not block.mapped and not self._map(block, min(block.size, size), capped=capped):
            return None
        while block.size < size:
            following = block.next
            assert following is not None
            if not self._map(following, min(size - block.size, following.size), capped=capped):
                return None
            block = following
        self.pools[small].remove(block)
        return block

    def _free_to_use(self, block: _Block | None) -> bool:
        return block is not None and not block.allocated and not block.waiting

    def _find_expandable(self, size: int, stream: int, small: bool) -> _Block:
        """find_expandable_block: the lowest-address unmapped range of the stream's segments (with the free block
        before it, where there is one) whose run of free and unmapped blocks holds the request; else a new
        segment, all of it unmapped."""
        holes = self.unmapped.setdefault((stream, small), [])
        for hole in holes:
            start = hole.prev if self._free_to_use(hole.prev) else hole
            room, block = 0, start
            while room < size and self._free_to_use(block):
                room += block.size
                block = block.next
            if room >= size:
                return start
        address = -(-self._next_address // SEGMENT_SPACE) * SEGMENT_SPACE
        self._next_address = address + SEGMENT_SPACE
        segment = _Block(address, SEGMENT_SPACE, stream, small, mapped=False)
        bisect.insort(holes, segment, key=_address)
        self.segments += 1
        return segment

    def _map(self, block: _Block, nbytes: int, *, capped: bool) -> bool:
        """map_block: the whole pages that cover `nbytes` at the front of the unmapped `block`, merged with the
        free blocks beside them; False where the cap refuses them (ExpandableSegment::map releases what it made)."""
        page = SMALL_BUFFER if block.small else LARGE_BUFFER
        mapped = min(-(-nbytes // page) * page, block.size)
        if capped and self._over(mapped):
            return False
        holes = self.unmapped[block.stream, block.small]
        holes.remove(block)
        block.mapped = True
        if mapped < block.size:
            rest = _Block(block.address + mapped, block.size - mapped, block.stream, block.small, mapped=False,
                          prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, mapped
            bisect.insort(holes, rest, key=_address)
        self.reserved += mapped
        self.reserved_peak = max(self.reserved_peak, self.reserved)
        self._merge(block)
        self.pools[block.small].insert(block)
        return True

    def _unmap(self, block: _Block) -> None:
        """unmap_block: the whole pages inside the free `block` unmapped (the partial pages before and after stay
        free blocks), merged with the unmapped ranges beside them."""
        page = SMALL_BUFFER if block.small else LARGE_BUFFER
        end = block.address + block.size
        first, last = -(-block.address // page) * page, end // page * page
        if first >= last:
            return
        self.pools[block.small].remove(block)
        if first > block.address:
            before = _Block(block.address, first - block.address, block.stream, block.small, prev=block.prev, next=block)
            if block.prev is not None:
                block.prev.next = before
            block.prev = before
            self.pools[block.small].insert(before)
        if last < end:
            after = _Block(last, end - last, block.stream, block.small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = after
            block.next = after
            self.pools[block.small].insert(after)
        block.address, block.size, block.mapped = first, last - first, False
        self.reserved -= last - first
        self._merge(block)
        bisect.insort(self.unmapped[block.stream, block.small], block, key=_address)

    # ------------------------------------------------------------ freeing

    def _merge(self, block: _Block) -> None:
        """try_merge_blocks with both neighbours: a free one of the same mapping joins `block`, leaving the pool
        (mapped) or the segment's unmapped ranges."""
        for neighbour in (block.prev, block.next):
            if not self._free_to_use(neighbour) or neighbour.mapped != block.mapped:
                continue
            if neighbour.mapped:
                self.pools[block.small].remove(neighbour)
            else:
                self.unmapped[block.stream, block.small].remove(neighbour)
            if neighbour is block.prev:  # [neighbour block]
                block.address, block.prev = neighbour.address, neighbour.prev
                if block.prev is not None:
                    block.prev.next = block
            else:  # [block neighbour]
                block.next = neighbour.next
                if block.next is not None:
                    block.next.prev = block
            block.size += neighbour.size

    def _free_block(self, block: _Block) -> None:
        self._merge(block)
        self.pools[block.small].insert(block)



def _address(block: _Block) -> int:
    return block.address
