"""FSDP2's replay of a one-stage plan with gradient accumulation, beside one microbatch's (docs/published-runs.md
§21.gaccum).

usage: PYTHONPATH=<checkout> python scripts/accum_replay.py PLAN.yaml PROFILE.json

Prints, in GiB: the cost model's allocated peak and reserve (and what made it), the accumulated step's replay
(allocated and reserved peaks, as the plan's reserve reads it), the same stage's one-microbatch replay, and the
accumulated replay after 2, 3 and 4 steps (planner/cost/fsdp2_accum.py plays until a step raises neither peak).
"""
import sys

from planner import io
from planner.cost import allocator, fsdp2_accum, reserve_fsdp2, score

GIB = 2**30


def main(plan_path: str, profile_path: str) -> int:
    plan, profile = io.load_plan(plan_path), io.load_profile(profile_path)
    setup, ranks = plan.setup, list(plan.stages)
    if not (reserve_fsdp2.replays(setup) and reserve_fsdp2.accumulates(setup)):
        sys.stderr.write("the plan is not one FSDP2 stage accumulating several microbatches\n")
        return 1
    cost = score.evaluate(ranks, profile, setup).stages[0]
    built = reserve_fsdp2.stage_of(ranks[0], cost, stage=0, profile=profile, setup=setup)
    expandable = reserve_fsdp2.expandable_segments(profile, setup)
    accumulated = reserve_fsdp2.replay(built, expandable=expandable)
    one = reserve_fsdp2.replay(built.stage, expandable=expandable)
    print(f"expandable segments: {expandable}; microbatches: {built.microbatches}")
    print(f"cost model: allocated peak {cost.peak_bytes / GIB:.3f}, reserve {cost.reserved_bytes / GIB:.3f} "
          f"({cost.reserved_by})")
    print(f"accumulated replay: allocated {accumulated.allocated_peak_bytes / GIB:.3f}, "
          f"reserved {accumulated.reserved_peak_bytes / GIB:.3f}")
    print(f"one-microbatch replay: allocated {one.allocated_peak_bytes / GIB:.3f}, reserved {one.reserved_peak_bytes / GIB:.3f}")
    for steps in (2, 3, 4):
        got = allocator.replay(fsdp2_accum.accumulated_events(built, steps=steps), expandable=expandable)
        print(f"{steps} steps: allocated {got.allocated_peak_bytes / GIB:.3f}, reserved {got.reserved_peak_bytes / GIB:.3f}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
