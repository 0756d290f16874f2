"""How far a replayed reserve moves when the large requests it plays are a page off: the replay's range.

The caching allocator is a function of the host's sequence of requests: DeviceCachingAllocator::malloc and
free (c10/cuda/CUDACachingAllocator.cpp, pytorch 001074d25084) decide on the host, consulting the device only for
blocks freed with record_stream (process_events) and for cudaMalloc's refusal. On torchtitan's steps that sequence
is the program's: FSDP2 holds its buffers by reference and waits on events (no record_stream), and under
TORCH_NCCL_AVOID_RECORD_STREAMS=1 (torchtitan 9dec370 utils.py 253) ProcessGroupNCCL stashes a collective's tensors
and drops them at the work's wait() on the host (WorkNCCL::synchronizeStream); the autograd engine runs a device's
backward on one thread in its ready queue's order. Nor does the order of frees at one instant matter: a freed
block merges with its free neighbours (free_block, try_merge_blocks), so a run of frees leaves the same free blocks
in any order. So the code leaves the replayed sequence no freedom that moves it (docs/published-runs.md §33.modes).

What moves it is ckplan's own precision. On torchtitan's 405B last pipeline ranks the step's large requests (the
~1 GiB outputs, the 8 GiB merge of them) land in a cached hole or take a segment of their own depending on a few
MiB: the reserve flips between two modes some GiB apart. One replayed figure hides that, so beside it a rank
carries the reserve its replay gives with every request of at least LARGE_REQUEST_BYTES one large-segment page
(kRoundLarge, 2 MiB: the granularity of the segments those requests take) larger, and one page smaller: under
0.4% of each request, below what any term of the cost model is known to. The predicted reserve stays the replay of
the sequence as the code orders it; the range is its sensitivity, not a bound of the code's own behaviour.
Nothing here reads a file or prints."""

from __future__ import annotations

from planner.cost.allocator import ROUND_LARGE, Alloc, Event, Perturb

# requests this large or larger are resized: 256 pages, so a page is at most 1/256 of the request
LARGE_REQUEST_BYTES = 256 * ROUND_LARGE
PAGE_BYTES = ROUND_LARGE  # kRoundLarge: a large request's segment is rounded to it (allocator_segments.segment_bytes)


def resized(delta_bytes: int, *, at_least: int = LARGE_REQUEST_BYTES) -> Perturb:
    """The change of a sequence that makes each request of at least `at_least` bytes `delta_bytes` larger."""
    def change(events: list[Event]) -> list[Event]:
        return [Alloc(e.key, e.nbytes + delta_bytes, e.stream) if type(e) is Alloc and e.nbytes >= at_least else e
                for e in events]
    return change


# the variants a range is made of, beside the sequence as played: its large requests a page larger, a page smaller
VARIANTS: tuple[Perturb, ...] = (resized(PAGE_BYTES), resized(-PAGE_BYTES))
