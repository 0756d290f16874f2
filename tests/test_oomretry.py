"""The caching allocator's out-of-memory path under a cap (planner/cost/allocator_segments.py, torch's
DeviceCachingAllocator::malloc at 001074d25084): tiny sequences whose uncapped reserve passes the cap, counted by
hand, where the release-and-retry keeps the job under it and where it does not."""

import random

import pytest
import torch

from planner.cost.allocator import (
    Alloc,
    CachingAllocator,
    Free,
    OutOfMemory,
    play,
    replay,
    settled_replay,
)

MIB = 1 << 20


def _played(events, **kwargs):
    state = CachingAllocator(**kwargs)
    play(state, events)
    return state


# a: a 20 MiB segment, b: 30 MiB; a freed (its segment cached, whole); c (24 MiB) fits no cached block
WHOLE = [Alloc("a", 20 * MIB), Alloc("b", 30 * MIB), Free("a"), Alloc("c", 24 * MIB)]


def test_without_a_cap_the_cached_segment_stays_and_a_new_one_is_taken():
    assert replay(WHOLE).reserved_peak_bytes == (20 + 30 + 24) * MIB


def test_release_cached_blocks_frees_the_whole_cached_segment_and_the_retry_fits():
    # 74 MiB > 60: cudaMalloc refused; release_cached_blocks frees a's 20 MiB segment; 30 + 24 = 54 fit
    state = _played(WHOLE, cap_bytes=60 * MIB)
    assert (state.reserved_peak, state.reserved, state.retries, state.oom) == (54 * MIB, 54 * MIB, 1, None)
    assert state.segments == 2


def test_the_first_request_no_release_makes_room_for_is_recorded():
    # after the release 30 MiB stay (b's); 30 + 24 > 50: torch's OutOfMemoryError
    state = _played(WHOLE + [Alloc("d", 40 * MIB)], cap_bytes=50 * MIB)
    assert state.oom == OutOfMemory("c", 24 * MIB, 30 * MIB, 30 * MIB)
    assert state.retries == 2  # d retried too: the replay plays on past the cap, the first failure kept


def test_a_split_segment_is_not_released():
    # x's 12 MiB segment is split by y (6 MiB: the 6 MiB rest > 1 MiB); z (8 MiB) needs a 20 MiB segment (kLargeBuffer):
    # 12 + 20 > 25, and the free 6 MiB rest is part of a split segment: release_cached_blocks leaves it
    events = [Alloc("x", 12 * MIB), Free("x"), Alloc("y", 6 * MIB), Alloc("z", 8 * MIB)]
    state = _played(events, cap_bytes=25 * MIB)
    assert state.oom == OutOfMemory("z", 8 * MIB, 12 * MIB, 6 * MIB)
    # once y is freed the segment is whole again: released, and z's 20 MiB fits
    state = _played([Alloc("x", 12 * MIB), Free("x"), Alloc("y", 6 * MIB), Free("y"), Alloc("z", 30 * MIB)],
                    cap_bytes=35 * MIB)
    assert (state.reserved_peak, state.reserved, state.oom) == (30 * MIB, 30 * MIB, None)


def test_the_release_completes_deferred_frees_first():
    # a's free waits on another stream's event; synchronize_and_free_events caches it, then it is released
    events = [Alloc("a", 20 * MIB), Free("a", deferred=True), Alloc("b", 30 * MIB)]
    assert replay(events).reserved_peak_bytes == 50 * MIB
    state = _played(events, cap_bytes=40 * MIB)
    assert (state.reserved_peak, state.retries, state.oom) == (30 * MIB, 1, None)


def test_release_available_cached_blocks_frees_one_oversize_block_under_max_split_size():
    # max_split 32 MiB: b (40 MiB) may not take a's 64 MiB block (>= 40 + 20); 64 + 40 > 100: the smallest free block
    # at or above max(40, 32) is released and cudaMalloc retried: no release_cached_blocks, no retry counted
    events = [Alloc("a", 64 * MIB), Free("a"), Alloc("b", 40 * MIB)]
    assert replay(events, max_split_bytes=32 * MIB).reserved_peak_bytes == 104 * MIB
    state = _played(events, max_split_bytes=32 * MIB, cap_bytes=100 * MIB)
    assert (state.reserved_peak, state.reserved, state.retries, state.oom) == (64 * MIB, 40 * MIB, 0, None)


def test_release_available_cached_blocks_frees_the_largest_oversize_blocks_until_enough():
    # no free block reaches 80 MiB: the largest oversize ones go (40, then 36); a's 20 MiB is below max_split: 76 < 80,
    # the call fails and they stay released. Though 20 + 80 would now fit, malloc goes on to release_cached_blocks (a
    # retry), which frees a's whole segment too: 80 MiB stay
    events = [Alloc("a", 20 * MIB), Alloc("b", 36 * MIB), Alloc("c", 40 * MIB), Free("a"), Free("b"), Free("c"),
              Alloc("d", 80 * MIB)]
    state = _played(events, max_split_bytes=32 * MIB, cap_bytes=150 * MIB)
    assert (state.reserved_peak, state.reserved, state.retries, state.oom) == (96 * MIB, 80 * MIB, 1, None)


# expandable segments (20 MiB pages in the large pool): a [0, 30) and its free 10 MiB rest in pages [0, 40);
# b grows the segment by one page to [30, 60); a freed; c (50 MiB) needs three more pages: 60 + 60 = 120 MiB
EXPANDABLE = [Alloc("a", 30 * MIB), Alloc("b", 30 * MIB), Free("a"), Alloc("c", 50 * MIB)]


def test_expandable_segments_without_a_cap_map_pages_at_the_end():
    assert replay(EXPANDABLE, expandable=True).reserved_peak_bytes == 120 * MIB


def test_expandable_segments_unmap_the_free_whole_pages_and_the_retry_maps_past_them():
    # release_cached_blocks unmaps page [0, 20) of a's free [0, 30) ([20, 30) shares a page with b: it stays mapped);
    # 40 MiB stay; the hole [0, 20) and the free [20, 30) hold 30 MiB < 50: c's 60 MiB are mapped at the end: 100
    state = _played(EXPANDABLE, expandable=True, cap_bytes=110 * MIB)
    assert (state.reserved_peak, state.reserved, state.retries, state.oom) == (100 * MIB, 100 * MIB, 1, None)
    assert state.segments == 1
    state = _played(EXPANDABLE, expandable=True, cap_bytes=90 * MIB)
    assert state.oom == OutOfMemory("c", 50 * MIB, 40 * MIB, 30 * MIB)


def test_expandable_segments_map_the_lowest_hole_that_holds_the_request():
    # a, b: pages [0, 40), [40, 80); a freed; c (50 MiB) needs 60 at the end: 140 > 130, so a's two pages are unmapped
    # (a hole [0, 40)), 40 + 60 = 100. b freed; d (50 MiB): the hole and b's free block after it hold it, the lowest
    # address: mapping the hole's 40 gives 140 > 130; the release unmaps b's pages into the hole [0, 80); d maps 60 of
    # it at the segment's start: 60 + 60 = 120
    events = [Alloc("a", 40 * MIB), Alloc("b", 40 * MIB), Free("a"), Alloc("c", 50 * MIB), Free("b"), Alloc("d", 50 * MIB)]
    assert replay(events, expandable=True).reserved_peak_bytes == 140 * MIB
    state = _played(events, expandable=True, cap_bytes=130 * MIB)
    assert (state.reserved_peak, state.reserved, state.retries, state.oom) == (120 * MIB, 120 * MIB, 2, None)
    assert state.live["d"].address == state.live["c"].address - 80 * MIB  # c lies at [80, 130)


def test_expandable_segments_release_a_segment_left_with_no_page():
    # a's segment (stream 0) has no page left after the release: release_expandable_segment; b's (stream 1) maps 20
    events = [Alloc("a", 30 * MIB), Free("a"), Alloc("b", 10 * MIB, stream=1)]
    state = _played(events, expandable=True, cap_bytes=45 * MIB)
    assert (state.reserved_peak, state.reserved, state.segments, state.retries, state.oom) == \
        (40 * MIB, 20 * MIB, 1, 1, None)


def test_cap_bytes_caps_replay_and_settled_replay():
    capped = replay(WHOLE, cap_bytes=60 * MIB)
    assert (capped.reserved_peak_bytes, capped.retries) == (54 * MIB, 1)
    settled = settled_replay(WHOLE[:2], lambda i: [Free("a" if i == 0 else ("c", i - 1)), Alloc(("c", i), 24 * MIB)],
                             min_steps=2, max_steps=5, cap_bytes=60 * MIB)
    assert (settled.reserved_peak_bytes, settled.oom) == (54 * MIB, None)
    assert replay(WHOLE).reserved_peak_bytes == 74 * MIB  # cap_bytes None: no cap


@pytest.mark.parametrize("expandable", [False, True])
def test_under_a_cap_the_reserve_stays_within_it_until_a_request_fails(expandable):
    rng = random.Random(1)
    events, live = [], []
    for step in range(2000):
        if live and rng.random() < 0.45:
            events.append(Free(live.pop(rng.randrange(len(live))), deferred=rng.random() < 0.1))
        else:
            live.append(step)
            events.append(Alloc(step, rng.choice([rng.randrange(1, 4096), rng.randrange(1, 4 * MIB),
                                                  rng.randrange(1, 64 * MIB)]), rng.randrange(2)))
    uncapped = replay(events, expandable=expandable)
    assert replay(events, expandable=expandable) == uncapped  # no cap: nothing released
    # a cap the uncapped replay never reaches past: the same replay
    assert replay(events, expandable=expandable, cap_bytes=uncapped.reserved_peak_bytes) == uncapped
    cap = uncapped.reserved_peak_bytes * 3 // 4
    state = CachingAllocator(expandable=expandable, cap_bytes=cap)
    for event in events:
        play(state, [event])
        assert state.allocated <= state.reserved
        if state.oom is None:
            assert state.reserved <= cap
    assert state.retries > 0


_ON_THE_DEVICE = """
import json, random, sys
import torch
from planner.cost.allocator import Alloc, CachingAllocator, Free, play
rng, events, live, tensors = random.Random(int(sys.argv[1])), [], [], {}
total = torch.cuda.mem_get_info()[1]
fraction = (1 << 30) / total  # allowed_memory_maximum: 1 GiB, what alloc_block checks under set_fraction
torch.cuda.set_per_process_memory_fraction(fraction)
cap = int(fraction * total)
failed = None
for step in range(3000):
    if live and rng.random() < 0.45:
        key = live.pop(rng.randrange(len(live)))
        del tensors[key]
        events.append(Free(key))
    else:
        nbytes = rng.choice([rng.randrange(1, 4096), rng.randrange(1, 4 << 20), rng.randrange(1, 96 << 20)])
        events.append(Alloc(step, nbytes))
        try:
            tensors[step] = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError:
            failed = step
            break
        live.append(step)
stats = torch.cuda.memory_stats()
state = CachingAllocator(cap_bytes=cap)
play(state, events[:-1] if failed is not None else events)
peak, retries = state.reserved_peak, state.retries
play(state, events[-1:] if failed is not None else [])
print(json.dumps([torch.cuda.max_memory_reserved(), peak, stats["num_alloc_retries"], retries, failed,
                  None if state.oom is None else state.oom.key]))
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_capped_replay_retries_and_fails_where_torch_does_on_a_gpu(seed):
    """A random sequence through torch's allocator under set_per_process_memory_fraction (1 GiB: alloc_block's
    check is then the cap, default segments, no garbage collection threshold) in a fresh process, and through the
    capped replay: the same reserved peak, the same retries, the same first failing request. Not run where this was
    written (no GPU): a check for a GPU session."""
    import json
    import os
    import subprocess
    import sys

    from conftest import ROOT

    done = subprocess.run([sys.executable, "-c", _ON_THE_DEVICE, str(seed)], capture_output=True, text=True, cwd=ROOT,
                          check=True, env={**{k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"},
                                           "PYTHONPATH": str(ROOT)})
    reserved, replayed, retries, replayed_retries, failed, replayed_failed = json.loads(done.stdout.splitlines()[-1])
    assert (reserved, retries, failed) == (replayed, replayed_retries, replayed_failed)
