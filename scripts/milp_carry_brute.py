"""The chunked MILP against brute force where layers carry weight gradients between their weight passes
(planner/cost/wgroups.py; docs/published-runs.md §67.review66): on heterogeneous(6, seed) with every option's split
figures drawn (weight-pass peak 100/200/400 MiB, its first group a quarter, half or all of it, a carry of CARRY x a
quarter of the peak), every split into 2 ranks x 2 chunks under ZBV and every checkpoint set scored by evaluate, at
caps 20/40/60% of the way between the plans' peaks: the least linear time that fits, beside the MILP's (mip_gap 0).

usage: PYTHONPATH=. python scripts/milp_carry_brute.py [--seeds 0 10] [--carry 0,1,2,4]"""

from __future__ import annotations

import argparse
import itertools
import random

from planner.cost import costmodel
from planner.models.synthetic import heterogeneous
from planner.schema import OPTION_FULL, OPTION_NONE, RecomputeOption, TrainSetup
from planner.solve import milp

MIB = 2**20


def _profile(seed: int, carries: list[int]):
    rng = random.Random(seed)
    layers = []
    for item in heterogeneous(6, seed=seed).layers:
        options = []
        for name, kept, recompute in ((OPTION_NONE, item.act_bytes, 0.0), (OPTION_FULL, item.input_bytes, item.fwd_ms)):
            peak = rng.choice([100, 200, 400]) * MIB
            first = rng.choice([peak // 4, peak // 2, peak])
            carry = rng.choice(carries) * peak // 4
            options.append(RecomputeOption(name=name, kept_bytes=kept, recompute_ms=recompute,
                                           split_held_bytes=MIB // 4, split_input_peak_bytes=MIB,
                                           split_peak_bytes=peak, split_first_peak_bytes=first,
                                           split_carry_bytes=carry))
        layers.append(item.model_copy(update={"recompute_options": options}))
    return heterogeneous(6, seed=seed).model_copy(update={"layers": layers})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs=2, default=[0, 10])
    parser.add_argument("--carry", default="0,1,2,4")
    args = parser.parse_args()
    carries = [int(c) for c in args.carry.split(",")]
    roomy = TrainSetup(stages=2, microbatches=4, micro_batch_size=1, schedule="ZBV", chunks=2,
                       mem_caps_bytes=[2**50] * 2)
    above = []
    for seed in range(*args.seeds):
        profile = _profile(seed, carries)
        plans = []
        for cuts in itertools.combinations(range(1, 6), 3):
            for mask in range(2**6):
                stages = costmodel.split_to_stages([0, *cuts], [mask >> i & 1 for i in range(6)], profile)
                plans.append((stages, max(costmodel.evaluate(costmodel.ranks_of(stages, roomy), profile, roomy)
                                          .peak_bytes_per_stage)))
        low, high = min(p for _, p in plans), max(p for _, p in plans)
        for fraction in (0.2, 0.4, 0.6):
            setup = roomy.model_copy(update={"mem_caps_bytes": [int(low + fraction * (high - low))] * 2})
            fitting = [costmodel.chunked_linear_ms(costmodel.ranks_of(stages, setup), profile, setup)
                       for stages, peak in plans
                       if peak + costmodel.FIT_MARGIN_BYTES <= setup.pipeline.mem_caps_bytes[0]]
            solved = milp.solve(milp.build_problem(profile, setup), mip_gap=0.0, threads=1)
            least = min(fitting)
            above.append(solved.objective / least - 1)
            print(f"seed {seed} cap {fraction}: brute force {least:.4f} ms, MILP {solved.objective:.4f} ms "
                  f"({solved.status}, {above[-1]:+.2%})")
    print(f"{len(above)} cases, {sum(a > 1e-6 for a in above)} above brute force: max {max(above):.2%}, "
          f"mean {sum(above) / len(above):.2%}; least {min(above):+.2e} (below brute force: a row undercounting)")


if __name__ == "__main__":
    main()
