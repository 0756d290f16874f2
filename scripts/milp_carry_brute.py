"""The MILP against brute force where layers carry weight gradients between their weight passes
(planner/cost/wgroups.py; docs/published-runs.md §67.review66, §67.milpexact): on heterogeneous(6, seed) with every
option's split figures drawn (weight-pass peak 100/200/400 MiB, its first group a quarter, half or all of it, a carry
of CARRY x a quarter of the peak), every split into RANKS x CHUNKS stages under the schedule and every checkpoint set
scored by evaluate, at caps 20/40/60% of the way between the plans' peaks: the least time that fits (a chunked
schedule's linear time, costmodel.chunked_linear_ms, which its MILP minimises; a one-chunk schedule's iteration),
beside the MILP's (mip_gap 0).

usage: PYTHONPATH=. python scripts/milp_carry_brute.py [--seeds 0 10] [--carry 0,1,2,4] [--inputs] [--run]
           [--schedule ZBV|ZB|1F1B|GPipe] [--ranks 2] [--chunks 2]"""

from __future__ import annotations

import argparse
import itertools
import random

from planner.cost import costmodel
from planner.models.synthetic import heterogeneous
from planner.schema import OPTION_FULL, OPTION_NONE, RecomputeOption, TrainSetup
from planner.solve import milp

MIB = 2**20
LAYERS = 6
FRACTIONS = (0.2, 0.4, 0.6)


def drawn_profile(seed: int, carries: list[int], inputs: bool = False, left: bool = False):
    """heterogeneous(6, seed), each option's split figures drawn from `seed`; `inputs`: its input pass's too (what it
    leaves for the weight pass 0, 25 or 50 MiB, its peak 50, 100 or 200 MiB), else 0.25 MiB and 1 MiB; `left`: the
    full option's carry left to the pass's end (split_left_bytes: none, half or all of it), else not recorded."""
    rng = random.Random(seed)
    layers = []
    for item in heterogeneous(LAYERS, seed=seed).layers:
        options = []
        for name, kept, recompute in ((OPTION_NONE, item.act_bytes, 0.0), (OPTION_FULL, item.input_bytes, item.fwd_ms)):
            peak = rng.choice([100, 200, 400]) * MIB
            first = rng.choice([peak // 4, peak // 2, peak])
            carry = rng.choice(carries) * peak // 4
            held, input_peak = ((rng.choice([0, 25, 50]) * MIB, rng.choice([50, 100, 200]) * MIB) if inputs
                                else (MIB // 4, MIB))
            options.append(RecomputeOption(name=name, kept_bytes=kept, recompute_ms=recompute,
                                           split_held_bytes=held, split_input_peak_bytes=input_peak,
                                           split_peak_bytes=peak, split_first_peak_bytes=first,
                                           split_carry_bytes=carry,
                                           split_left_bytes=(rng.choice([0, carry // 2, carry])
                                                             if left and name == OPTION_FULL else None)))
        layers.append(item.model_copy(update={"recompute_options": options}))
    return heterogeneous(LAYERS, seed=seed).model_copy(update={"layers": layers})


def with_a_run(profile):
    """Layers 1-4 the same layer (one run of 4 in the MILP: milp.find_runs), the others as drawn."""
    copies = [profile.layers[1].model_copy(update={"name": f"same{i}"}) for i in range(4)]
    return profile.model_copy(update={"layers": [profile.layers[0], *copies, profile.layers[5]]})


def roomy_setup(schedule: str = "ZBV", ranks: int = 2, chunks: int = 2) -> TrainSetup:
    return TrainSetup(stages=ranks, microbatches=2 * ranks, micro_batch_size=1, schedule=schedule, chunks=chunks,
                      mem_caps_bytes=[2**50] * ranks)


def _ranks(stages, setup: TrainSetup):
    return costmodel.ranks_of(stages, setup) if setup.pipeline.chunks > 1 else stages


def every_plan(profile, roomy: TrainSetup) -> list:
    """(stages, time, peak) for every split into the schedule's stages and every checkpoint set."""
    plans = []
    for cuts in itertools.combinations(range(1, LAYERS), roomy.pipeline.stages * roomy.pipeline.chunks - 1):
        for mask in range(2**LAYERS):
            stages = costmodel.split_to_stages([0, *cuts], [mask >> i & 1 for i in range(LAYERS)], profile)
            cost = costmodel.evaluate(_ranks(stages, roomy), profile, roomy)
            time = (costmodel.chunked_linear_ms(_ranks(stages, roomy), profile, roomy) if roomy.pipeline.chunks > 1
                    else cost.iteration_ms)
            plans.append((stages, time, max(cost.peak_bytes_per_stage)))
    return plans


def cap_setup(plans: list, roomy: TrainSetup, fraction: float) -> TrainSetup:
    """Every rank's cap `fraction` of the way from the plans' least peak to their largest."""
    low, high = min(p for *_, p in plans), max(p for *_, p in plans)
    return roomy.model_copy(update={"mem_caps_bytes": [int(low + fraction * (high - low))] * roomy.pipeline.stages})


def least_fitting(plans: list, setup: TrainSetup) -> float:
    """Brute force's optimum: the least time of the plans whose peak fits the cap."""
    return min(time for _, time, peak in plans if peak + costmodel.FIT_MARGIN_BYTES <= setup.pipeline.mem_caps_bytes[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs=2, default=[0, 10])
    parser.add_argument("--carry", default="0,1,2,4")
    parser.add_argument("--schedule", default="ZBV")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--chunks", type=int, default=2)
    parser.add_argument("--inputs", action="store_true", help="draw the input pass's figures too")
    parser.add_argument("--run", action="store_true", help="layers 1-4 one run (with_a_run)")
    parser.add_argument("--left", action="store_true", help="draw what the full option leaves to the pass's end")
    args = parser.parse_args()
    carries = [int(c) for c in args.carry.split(",")]
    roomy = roomy_setup(args.schedule, args.ranks, args.chunks)
    above = []
    for seed in range(*args.seeds):
        profile = drawn_profile(seed, carries, args.inputs, args.left)
        profile = with_a_run(profile) if args.run else profile
        plans = every_plan(profile, roomy)
        for fraction in FRACTIONS:
            setup = cap_setup(plans, roomy, fraction)
            problem = milp.build_problem(profile, setup)
            solved = milp.solve(problem, mip_gap=0.0, threads=1)
            least = least_fitting(plans, setup)
            above.append(solved.objective / least - 1)
            fits = costmodel.evaluate(milp.extract_plan(problem), profile, setup).feasible
            print(f"seed {seed} cap {fraction}: brute force {least:.4f} ms, MILP {solved.objective:.4f} ms "
                  f"({solved.status}, {above[-1]:+.2%}{'' if fits else ', its plan does not fit'})")
    print(f"{len(above)} cases, {sum(a > 1e-6 for a in above)} above brute force, {sum(a < -1e-6 for a in above)} "
          f"below: max {max(above):+.2e}, mean {sum(above) / len(above):+.2e}, least {min(above):+.2e} "
          f"(below brute force: a row undercounting)")


if __name__ == "__main__":
    main()
