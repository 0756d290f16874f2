"""The caching allocator's replay (planner/cost/allocator.py): hand-worked sequences, each
byte counted by the rules of c10/cuda/CUDACachingAllocator.cpp (commit 001074d25084)."""

import os
import random

import pytest
import torch

from planner.cost.allocator import Alloc, CachingAllocator, Free, Ready, Sync, replay

MIB = 2**20


def test_small_requests_are_rounded_and_packed_into_2_mib_segments():
    got = replay([Alloc("a", 1000), Alloc("b", 1), Alloc("c", MIB)])
    # 1024 + 512 fit one 2 MiB segment, split at >= 512 B remaining; 1 MiB leaves 1 MiB - 1536 there
    assert got.allocated_peak_bytes == 1024 + 512 + MIB
    assert got.reserved_peak_bytes == 2 * MIB and got.segments == 1
    # one more MiB does not fit what is left (1 MiB - 1536): a second small segment
    assert replay([Alloc("a", 1000), Alloc("b", 1), Alloc("c", MIB), Alloc("d", MIB)]).reserved_peak_bytes == 4 * MIB


def test_requests_between_1_and_10_mib_share_a_20_mib_segment():
    got = replay([Alloc("a", 6 * MIB), Alloc("b", 6 * MIB), Alloc("c", 6 * MIB)])
    # 20 - 6 = 14 > 1 MiB: split; 14 - 6 = 8: split; 8 - 6 = 2: split
    assert (got.allocated_peak_bytes, got.reserved_peak_bytes, got.segments) == (18 * MIB, 20 * MIB, 1)
    # a fourth does not fit the 2 MiB left: a second 20 MiB segment
    assert replay([Alloc(i, 6 * MIB) for i in range(4)]).reserved_peak_bytes == 40 * MIB


def test_a_large_request_gets_its_own_segment_rounded_to_2_mib():
    got = replay([Alloc("a", 11 * MIB + 1)])
    # the 12 MiB segment's remainder (1 MiB - 512) is not > 1 MiB: the block is not split, and
    # the allocated statistic counts it whole
    assert (got.allocated_peak_bytes, got.reserved_peak_bytes) == (12 * MIB, 12 * MIB)
    got = replay([Alloc("a", 13 * MIB + 1)])  # 14 MiB segment, 1 MiB - 512 left: whole again
    assert (got.allocated_peak_bytes, got.reserved_peak_bytes) == (14 * MIB, 14 * MIB)


def test_a_block_whose_remainder_is_at_most_1_mib_is_handed_out_whole():
    # the 12 MiB block serves 11 MiB unsplit (1 MiB left is not > 1 MiB): allocated counts 12
    got = replay([Alloc("a", 12 * MIB), Free("a"), Alloc("b", 11 * MIB)])
    assert (got.allocated_peak_bytes, got.reserved_peak_bytes) == (12 * MIB, 12 * MIB)
    # 10 MiB from it leaves 2 MiB > 1 MiB: split, the 10 MiB counted
    state = CachingAllocator()
    state.malloc("a", 12 * MIB)
    state.free("a")
    state.malloc("b", 10 * MIB)
    assert state.allocated == 10 * MIB and state.reserved == 12 * MIB


def test_best_fit_takes_the_smallest_free_block_that_serves():
    # free blocks of 30 and 14 MiB (two segments): 12 MiB takes the 14, and 28 MiB still fits the 30
    events = [Alloc("big", 30 * MIB), Alloc("mid", 14 * MIB), Free("big"), Free("mid"),
              Alloc("x", 12 * MIB), Alloc("y", 28 * MIB)]
    assert replay(events).reserved_peak_bytes == 44 * MIB
    # first fit (the 30 for the 12) would have needed a third segment for the 28


def test_split_blocks_coalesce_when_freed():
    # two 6 MiB blocks of one 20 MiB segment freed: one 20 MiB block again, which serves 16 MiB
    events = [Alloc("a", 6 * MIB), Alloc("b", 6 * MIB), Free("a"), Free("b"), Alloc("c", 16 * MIB)]
    assert replay(events).reserved_peak_bytes == 20 * MIB
    # with b alive the segment holds 6 + 8 free, split apart: 16 MiB needs a segment of its own
    assert replay([Alloc("a", 6 * MIB), Alloc("b", 6 * MIB), Free("a"), Alloc("c", 16 * MIB)]).reserved_peak_bytes \
        == 36 * MIB


def test_fragmentation_a_cached_block_too_small_for_the_next_request():
    # 30 MiB freed, 20 MiB takes its front, the 10 MiB tail cannot serve another 20
    events = [Alloc("a", 30 * MIB), Free("a"), Alloc("b", 20 * MIB), Alloc("c", 20 * MIB)]
    got = replay(events)
    assert (got.allocated_peak_bytes, got.reserved_peak_bytes) == (40 * MIB, 50 * MIB)


def test_each_stream_has_its_own_blocks():
    events = [Alloc("copy", 12 * MIB, stream=1), Free("copy"), Alloc("compute", 12 * MIB, stream=0)]
    assert replay(events).reserved_peak_bytes == 24 * MIB
    same = [Alloc("copy", 12 * MIB), Free("copy"), Alloc("compute", 12 * MIB)]
    assert replay(same).reserved_peak_bytes == 12 * MIB


def test_a_block_used_on_another_stream_is_cached_only_once_its_event_completes():
    waiting = [Alloc("a", 12 * MIB), Free("a", deferred=True), Alloc("b", 12 * MIB)]
    assert replay(waiting).reserved_peak_bytes == 24 * MIB
    synced = [Alloc("a", 12 * MIB), Free("a", deferred=True), Sync(), Alloc("b", 12 * MIB)]
    assert replay(synced).reserved_peak_bytes == 12 * MIB
    # a pending neighbour does not merge: of 6 + 6 + 8 free in one segment, a waits, b merges with
    # the tail (14 MiB), and 16 MiB needs a segment of its own; a freed at once, all 20 serve it
    pending = [Alloc("a", 6 * MIB), Alloc("b", 6 * MIB), Free("a", deferred=True), Free("b"), Alloc("c", 16 * MIB)]
    assert replay(pending).reserved_peak_bytes == 36 * MIB
    assert replay([Alloc("a", 6 * MIB), Alloc("b", 6 * MIB), Free("a"), Free("b"),
                   Alloc("c", 16 * MIB)]).reserved_peak_bytes == 20 * MIB


def test_max_split_size_keeps_large_cached_blocks_whole():
    # 8 MiB may not take a cached 64 MiB block at or above max_split (32 MiB): a 20 MiB segment
    events = [Alloc("a", 64 * MIB), Free("a"), Alloc("b", 8 * MIB)]
    assert replay(events).reserved_peak_bytes == 64 * MIB
    assert replay(events, max_split_bytes=32 * MIB).reserved_peak_bytes == 84 * MIB
    # a 40 MiB request takes the 64 only if it is less than 20 MiB larger: it is not
    assert replay([Alloc("a", 64 * MIB), Free("a"), Alloc("b", 40 * MIB)],
                  max_split_bytes=32 * MIB).reserved_peak_bytes == 104 * MIB
    # 50 MiB does, whole and unsplit
    got = replay([Alloc("a", 64 * MIB), Free("a"), Alloc("b", 50 * MIB)], max_split_bytes=32 * MIB)
    assert (got.allocated_peak_bytes, got.reserved_peak_bytes) == (64 * MIB, 64 * MIB)


@pytest.mark.parametrize("expandable", [False, True])
def test_the_replay_never_reserves_less_than_it_allocates_and_frees_everything(expandable):
    rng = random.Random(0)
    state, live = CachingAllocator(expandable=expandable), []
    for step in range(3000):
        if live and rng.random() < 0.45:
            state.free(live.pop(rng.randrange(len(live))))
        else:
            live.append(step)
            state.malloc(step, rng.choice([rng.randrange(1, 4096), rng.randrange(1, 4 * MIB), rng.randrange(1, 64 * MIB)]),
                         stream=rng.randrange(2))
        assert state.allocated <= state.reserved
    for key in live:
        state.free(key)
    assert state.allocated == 0
    # every segment is whole again: one free block per segment (expandable: one a stream and pool, its
    # mapped pages all of the reserve)
    assert sum(len(pool.keys) for pool in state.pools.values()) == state.segments
    if expandable:
        assert state.segments == 4
        assert sum(block.size for pool in state.pools.values() for block in pool.blocks.values()) == state.reserved


def test_ready_caches_one_waiting_block():
    events = [Alloc("a", 12 * MIB), Alloc("b", 12 * MIB), Free("a", deferred=True), Free("b", deferred=True),
              Ready("b"), Alloc("c", 12 * MIB), Alloc("d", 12 * MIB)]
    assert replay(events).reserved_peak_bytes == 36 * MIB  # c takes b's block, d a new one: a still waits


_ON_THE_DEVICE = """
import json, random, sys
import torch
from planner.cost.allocator import Alloc, Free, replay
rng, events, live, tensors = random.Random(int(sys.argv[1])), [], [], {}
side = torch.cuda.Stream()
torch.cuda.empty_cache()
torch.cuda.reset_peak_memory_stats()
base_reserved, base_allocated = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
for step in range(600):
    if live and rng.random() < 0.45:
        key = live.pop(rng.randrange(len(live)))
        del tensors[key]
        events.append(Free(key))
    else:
        nbytes = rng.choice([rng.randrange(1, 4096), rng.randrange(1, 4 << 20), rng.randrange(1, 48 << 20)])
        stream = rng.randrange(2)
        with torch.cuda.stream(side if stream else torch.cuda.current_stream()):
            tensors[step] = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        live.append(step)
        events.append(Alloc(step, nbytes, stream))
got = replay(events, expandable=len(sys.argv) > 2)
print(json.dumps([torch.cuda.max_memory_reserved() - base_reserved, got.reserved_peak_bytes,
                  torch.cuda.max_memory_allocated() - base_allocated, got.allocated_peak_bytes]))
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_replay_reserves_what_torchs_allocator_reserves_on_a_gpu(seed):
    """The same random sequence (two streams) through torch's caching allocator, in a fresh
    process, and through the replay: the same peaks (segment addresses only break ties)."""
    import json
    import subprocess
    import sys

    from conftest import ROOT

    done = subprocess.run([sys.executable, "-c", _ON_THE_DEVICE, str(seed)], capture_output=True, text=True,
                          cwd=ROOT, check=True,
                          env={**{k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"},
                               "PYTHONPATH": str(ROOT)})  # the allocator's defaults
    reserved, replayed, allocated, replayed_allocated = json.loads(done.stdout.splitlines()[-1])
    assert (reserved, allocated) == (replayed, replayed_allocated)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_expandable_replay_reserves_what_torchs_expandable_segments_reserve_on_a_gpu(seed):
    """As above under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (torchtitan's launch), against
    CachingAllocator(expandable=True). Not run where this was written (no GPU): a check for a GPU session."""
    import json
    import subprocess
    import sys

    from conftest import ROOT

    done = subprocess.run([sys.executable, "-c", _ON_THE_DEVICE, str(seed), "expandable"], capture_output=True,
                          text=True, cwd=ROOT, check=True,
                          env={**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
                               "PYTHONPATH": str(ROOT)})
    reserved, replayed, allocated, replayed_allocated = json.loads(done.stdout.splitlines()[-1])
    assert (reserved, allocated) == (replayed, replayed_allocated)


def test_expandable_segments_grow_one_segment_a_stream_by_pages_by_hand():
    """Expandable segments (Note [Expandable Segments]): a 12 MiB request maps one 20 MiB page (12 | 8
    left at the end); the next 12 takes the free 8 and one more page (12 | 16); a 10 reuses the first
    freed 12 (any remainder >= 512 B splits: 10 | 2); a 1 MiB request is the small pool's, a 2 MiB
    page; stream 1's 12 a segment of its own, one page. Freed, the second 12 merges with the 2 before
    it and the 16 after it: the 30 that follows fits there. Reserved 40 + 2 + 20 = 62 MiB, where the
    default segments take 12 + 12 + 2 + 12 + 30 = 68."""
    mib = 2**20
    events = [Alloc("a", 12 * mib), Alloc("b", 12 * mib), Free("a"), Alloc("c", 10 * mib), Alloc("d", 1 * mib),
              Alloc("e", 12 * mib, 1), Free("b"), Alloc("f", 30 * mib)]
    grown = replay(events, expandable=True)
    assert (grown.allocated_peak_bytes, grown.reserved_peak_bytes, grown.segments) == (53 * mib, 62 * mib, 3)
    assert replay(events).reserved_peak_bytes == 68 * mib


def test_expandable_best_fit_takes_a_larger_free_block_before_the_growing_end():
    """get_free_block under expandable segments counts the segment's free end block as the size it can
    grow to: a 10 MiB request with a free 12 MiB end and a free 24 MiB block before it takes the 24."""
    mib = 2**20
    state = CachingAllocator(expandable=True)
    state.malloc("a", 24 * mib)  # one 40 MiB page pair: [a 24][16 free, the end]
    state.malloc("b", 4 * mib)  # the end is the only fit: [a 24][b 4][12 free, the end]
    state.free("a")  # [24 free][b 4][12 free, the end]
    state.malloc("c", 10 * mib)
    assert state.live["c"].address == state.live["b"].address - 24 * mib  # the front block, split 10 | 14
    assert state.reserved == 40 * mib


@pytest.mark.parametrize("scratch_mib, reserved_mib", [(None, 160), (22, 102)])
def test_a_cached_scratch_segment_takes_a_held_block_that_would_split_the_merges_segment(scratch_mib, reserved_mib):
    """§18.replay17, M17's last rank in miniature: a layer's backward scratch (one block of 22 MiB, its own
    segment) made and freed, the merge of the outputs (80 MiB, its own segment) made and freed at step 1's end,
    then an output held over step 2's end (11 MiB) and the merge again. The output best-fits the smallest free block that serves it: without
    the scratch's segment that is the merge's (split: 69 MiB left, > kSmallSize), so the second merge takes a new
    80 MiB segment (80 + 80 = 160); with it, the scratch's (22 - 11 = 11 MiB left), the merge's stays whole and the
    second merge reuses it (80 + 22 = 102)."""
    events = [Alloc("scratch", scratch_mib * MIB), Free("scratch")] if scratch_mib else []
    events += [Alloc("merged", 80 * MIB), Free("merged"), Alloc("output", 11 * MIB), Alloc("merged", 80 * MIB), Free("merged")]
    result = replay(events)
    assert result.reserved_peak_bytes == reserved_mib * MIB
    assert result.allocated_peak_bytes == 91 * MIB


# torch 2.6.0's rules (docs/framework-facts.md §464-§466): the same as 001074d25084's at the defaults; each figure below
# counted by hand from them.


def test_best_fit_among_equal_blocks_takes_the_lowest_address():
    # a 30 MiB segment split as p (18) and q (12), then r (12) in a segment of its own, above it; q and r freed: two
    # 12 MiB blocks, and BlockComparatorSize's (stream, size, ptr) order hands s the lower one, q. Freeing p then finds
    # q taken: p stays 18 MiB, so t (30 MiB) needs a third segment: 30 + 12 + 30 = 72 MiB
    events = [Alloc("big", 30 * MIB), Free("big"), Alloc("p", 18 * MIB), Alloc("q", 12 * MIB), Alloc("r", 12 * MIB),
              Free("q"), Free("r"), Alloc("s", 12 * MIB), Free("p"), Alloc("t", 30 * MIB)]
    got = replay(events)
    assert (got.reserved_peak_bytes, got.allocated_peak_bytes, got.segments) == (72 * MIB, 42 * MIB, 3)
    # had s taken r (the higher address), p and q would merge into the 30 MiB t takes: 42 MiB
    by_r = [Alloc("big", 30 * MIB), Free("big"), Alloc("p", 18 * MIB), Alloc("q", 12 * MIB), Alloc("r", 12 * MIB),
            Free("r"), Alloc("s", 12 * MIB), Free("q"), Free("p"), Alloc("t", 30 * MIB)]
    assert replay(by_r).reserved_peak_bytes == 42 * MIB


def test_an_oversize_request_takes_a_block_less_than_max_non_split_rounding_larger():
    # max_split_size 32 MiB: a 44 MiB request and the cached 64 MiB block: 64 >= 44 + 20 (max_non_split_rounding_size,
    # kLargeBuffer by default), refused: a 44 MiB segment beside it
    got = replay([Alloc("a", 64 * MIB), Free("a"), Alloc("b", 44 * MIB)], max_split_bytes=32 * MIB)
    assert (got.reserved_peak_bytes, got.allocated_peak_bytes) == (108 * MIB, 64 * MIB)
    # 46 MiB: 64 < 66, served by the 64 MiB block, unsplit (the request is not below max_split_size): counted whole
    got = replay([Alloc("a", 64 * MIB), Free("a"), Alloc("b", 46 * MIB)], max_split_bytes=32 * MIB)
    assert (got.reserved_peak_bytes, got.allocated_peak_bytes) == (64 * MIB, 64 * MIB)


def test_a_block_made_once_in_the_first_step_makes_the_second_step_take_a_segment():
    """M16's kind of step-2 segment (docs/published-runs.md §41.m16trace, §42.bestfit26): the step makes k (12 MiB),
    h (40) and L (60) and frees them, L and h first; the first step also makes a state tensor (30 MiB) that lives on.
    Step 1: three segments, 12 + 40 + 60 = 112 MiB; the state takes the freed 40 (best fit) and leaves 10 of it.
    Step 2: k takes the 12; h finds only the 10 and the 60, splits the 60 (20 left); L finds 10 and 20: a fourth
    segment, 60 MiB (172). Step 3: h takes the lower of the two 60s, L the other: nothing new."""
    from planner.cost.allocator import settled_replay

    def step(index):
        events = [Alloc("k", 12 * MIB), Alloc("h", 40 * MIB), Alloc("L", 60 * MIB), Free("L"), Free("h")]
        return events + ([Alloc("state", 30 * MIB)] if index == 0 else []) + [Free("k")]

    first = settled_replay([], step, min_steps=1, max_steps=1)
    assert (first.reserved_peak_bytes, first.segments) == (112 * MIB, 3)
    settled = settled_replay([], step, min_steps=1, max_steps=8)
    assert (settled.reserved_peak_bytes, settled.segments) == (172 * MIB, 4)
    # the allocated peak is step 2's and 3's: state + k + h + L = 142 MiB
    assert settled.allocated_peak_bytes == 142 * MIB
