"""A replayed stage's fit: its caching-allocator replay under the cap, with torch's out-of-memory path.

torch does not fail a job whose allocator would pass the device: DeviceCachingAllocator::malloc
(c10/cuda/CUDACachingAllocator.cpp, pytorch/pytorch 001074d25084), when cudaMalloc (or an expandable
segment's mapping) is refused, releases cached segments (release_available_cached_blocks under
max_split_size; release_cached_blocks: every free whole segment, every free page of an expandable
one) and retries, and raises OutOfMemoryError only when the retry fails too
(planner/cost/allocator_segments.py). So a stage whose replay without a cap reserves more than the
device gives may run, and its max_memory_reserved is then at most the cap. The fit is the replay
under the cap: the bytes the allocator may reserve are the cap less what lies beside it (NCCL's
buffers and the other workspaces, FIT_MARGIN_BYTES) and less what the stage's reserve adds past its
replay (reserve.reserved_bytes' bytes the recorded sequence does not show). Nothing here reads a file
or prints."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from planner.cost.allocator import Replayed
from planner.cost.assembly import FIT_MARGIN_BYTES, StageCost

# StageCost.cap_replay: how its reserved peak was found where the replay ran
FITS = "fits"  # the replay without a cap is within it: the capped replay is the same (no request reaches the cap)
RETRIED = "retried"  # over the cap without one; torch's release-and-retry keeps every request within it: the capped
# replay's reserved peak (what max_memory_reserved shows)
OOM = "oom"  # a request fails even after the release (torch's OutOfMemoryError), or the reserve's floor passes the
# cap: the reserved peak reported is the replay's without a cap


def under_cap(cost: StageCost, replayed: Replayed, *, play: Callable[[int | None], Replayed | None],
              reserved_of: Callable[[Replayed], int], held: Callable[[], int | None] | None = None) -> StageCost:
    """`cost` with the reserve of its replay `replayed` (run without a cap; `reserved_of` makes the stage's reserved
    peak of a replay) where that fits the cap; else with the reserve of `play(room)` (the same replay under `room`
    bytes the allocator may reserve: play(None) is the replay without a cap) under the cap,
    where no request fails there; else with the uncapped reserve. The uncapped reserve is kept
    (uncapped_reserved_bytes) and cap_replay says which it is. `held`: where given, the most bytes the replayed
    sequence holds live at once (allocator.held_peak; None: not known): above the room, a request fails under it
    whatever the replay does (held_peak's text), so the replay under the cap is not run, its verdict known."""
    reserved = reserved_of(replayed)
    stage = dataclasses.replace(cost, reserved_bytes=reserved, reserved_by="replay", uncapped_reserved_bytes=reserved,
                                cap_replay=FITS)
    if stage.device_need_bytes <= stage.cap_bytes:
        return stage
    beside = reserved - replayed.reserved_peak_bytes  # what the reserve holds past the replay's segments
    room = stage.cap_bytes - stage.workspace_bytes - FIT_MARGIN_BYTES - beside
    if room <= 0:
        return dataclasses.replace(stage, cap_replay=OOM)
    floor = held() if held is not None else None
    if floor is not None and floor > room:
        return dataclasses.replace(stage, cap_replay=OOM)
    capped = play(room)
    if capped is None or capped.oom is not None:
        return dataclasses.replace(stage, cap_replay=OOM)
    retried = dataclasses.replace(stage, reserved_bytes=reserved_of(capped), cap_replay=RETRIED)
    return retried if retried.device_need_bytes <= retried.cap_bytes else dataclasses.replace(stage, cap_replay=OOM)
