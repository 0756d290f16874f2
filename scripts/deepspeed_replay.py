"""Print DeepSpeed ZeRO 3's caching-allocator replay of a published row's rank (planner/cost/reserve_deepspeed.py):
the replay's allocated and reserved peaks, the cost model's allocated peak, the stage's reserve and fit, and what
the divisor would have given (docs/published-runs.md §31.dsreplay).

    PYTHONPATH=$PWD python scripts/deepspeed_replay.py DS1 [--also "--reduce-bucket-size 5e8"]
        [--cached-at-once gathers|grads|both]

`--cached-at-once` plays a what-if against the replay's two assumptions (§31.dsreplay point 3): a released gather's
block, or a reduced gradient's, or both, cached again at once rather than after the next submodule / the next bucket.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import published_rows  # noqa: E402  (the harness beside this file)

from planner.cost import allocator, reserve_deepspeed  # noqa: E402
from planner.cost.allocator import Ready  # noqa: E402

GIB = 2**30


def _cached_at_once(what: str) -> None:
    """The step player with released gathers (`gathers`), reduced gradients (`grads`) or both cached at once."""
    player = reserve_deepspeed._StepPlayer
    if what in ("gathers", "both"):
        release = player._release

        def _release(self, param):
            buffer = self.gathered.get(param)
            release(self, param)
            if buffer is not None:
                self.events.append(Ready(buffer))
                self.released.remove(buffer)

        player._release = _release
    if what in ("grads", "both"):
        reduce = player._reduce

        def _reduce(self):
            reduce(self)
            self.events += [Ready(key) for key in self.reducing]
            self.reducing = []

        player._reduce = _reduce


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("row")
    parser.add_argument("--work", type=Path, default=published_rows.WORK)
    parser.add_argument("--also", default="", help="ckplan evaluate arguments appended to the row's")
    parser.add_argument("--cached-at-once", choices=("gathers", "grads", "both"), default=None)
    args = parser.parse_args(argv)
    if args.cached_at_once:
        _cached_at_once(args.cached_at_once)
    try:
        stages, profile, setup, cost = published_rows.capture_row(args.row, args.work, args.also)
    except published_rows.HarnessError as exc:
        parser.error(str(exc))
    for index, (stage, rank) in enumerate(zip(stages, cost.stages)):
        replayed = reserve_deepspeed.replay_stage(stage, rank, profile=profile, setup=setup)
        if replayed is None:
            print(f"stage {index}: not replayed (the divisor's reserve)")
            continue
        divisor = allocator.reserved_bytes(rank.peak_bytes, allocator.DEFAULT_FRAGMENTATION)
        print(f"stage {index}: replay allocated {replayed.allocated_peak_bytes / GIB:.2f} GiB, reserved "
              f"{replayed.reserved_peak_bytes / GIB:.2f} GiB ({replayed.segments} segments); the cost model's "
              f"allocated peak {rank.peak_bytes / GIB:.2f} GiB; the stage's reserve "
              f"{(rank.reserved_bytes or 0) / GIB:.2f} GiB ({rank.reserved_by}, {rank.cap_replay}) + workspaces "
              f"{rank.workspace_bytes / GIB:.2f} of {rank.cap_bytes / GIB:.2f}; the divisor's would be "
              f"{divisor / GIB:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
