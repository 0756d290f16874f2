"""The chunked MILP's size and solve time (docs/published-runs.md §67.review66, §67.milpexact): for (P, V) in the pairs
given, M = 2P under ZBV, caps 30% and 70% of the way from the largest full-checkpointing stage peak to the largest
no-checkpointing one (the baselines, costmodel.ranks_of), milp.build_problem then milp.solve(mip_gap=0, threads=1):
rows, columns, integer columns, seconds, the optimum beside its plan's linear time, and whether the plan fits
under evaluate.

The profile: tests/fixtures/chunked-milp-profile.json (12 measured layers), --blocks N its Block layer repeated to N
(N + 2 layers), or --drawn N scripts/milp_carry_brute.py's drawn split figures on heterogeneous(N, 0).

usage: PYTHONPATH=. python scripts/milp_chunked_size.py [--blocks 32 | --drawn 32] [--pairs 2x2,3x2]"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import pulp

from planner import io
from planner.cost import costmodel
from planner.models.synthetic import heterogeneous
from planner.schema import OPTION_FULL, OPTION_NONE, RecomputeOption, TrainSetup
from planner.solve import baselines, milp

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "chunked-milp-profile.json"
MIB = 2**20


def _blocks(profile, count: int):
    """The fixture's first and last layers around `count` copies of its second (a Block)."""
    first, block, last = profile.layers[0], profile.layers[1], profile.layers[-1]
    blocks = [block.model_copy(update={"name": f"blocks.{i}"}) for i in range(count)]
    return profile.model_copy(update={"layers": [first, *blocks, last]})


def _drawn(count: int):
    """heterogeneous(count, 0), every option's split figures drawn as milp_carry_brute draws them."""
    rng, layers = random.Random(0), []
    for item in heterogeneous(count, seed=0).layers:
        options = []
        for name, kept, recompute in ((OPTION_NONE, item.act_bytes, 0.0), (OPTION_FULL, item.input_bytes, item.fwd_ms)):
            peak = rng.choice([100, 200, 400]) * MIB
            options.append(RecomputeOption(
                name=name, kept_bytes=kept, recompute_ms=recompute, split_held_bytes=rng.choice([0, 25, 50]) * MIB,
                split_input_peak_bytes=rng.choice([50, 100, 200]) * MIB, split_peak_bytes=peak,
                split_first_peak_bytes=rng.choice([peak // 4, peak // 2, peak]),
                split_carry_bytes=rng.choice([0, 1, 2, 4]) * peak // 4))
        layers.append(item.model_copy(update={"recompute_options": options}))
    return heterogeneous(count, seed=0).model_copy(update={"layers": layers})


def _largest_peak(plan, profile, setup) -> int:
    return max(costmodel.evaluate(costmodel.ranks_of(plan, setup), profile, setup).peak_bytes_per_stage)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int)
    parser.add_argument("--drawn", type=int)
    parser.add_argument("--pairs", default="2x2,3x2")
    args = parser.parse_args()
    profile = io.load_profile(FIXTURE)
    profile = _blocks(profile, args.blocks) if args.blocks else _drawn(args.drawn) if args.drawn else profile
    for pair in args.pairs.split(","):
        ranks, chunks = (int(x) for x in pair.split("x"))
        roomy = TrainSetup(stages=ranks, microbatches=2 * ranks, micro_batch_size=1, schedule="ZBV", chunks=chunks,
                           mem_caps_bytes=[2**50] * ranks)
        low = _largest_peak(baselines.full_checkpointing(profile, roomy), profile, roomy)
        high = _largest_peak(baselines.no_checkpointing(profile, roomy), profile, roomy)
        for fraction in (0.3, 0.7):
            setup = roomy.model_copy(update={"mem_caps_bytes": [int(low + fraction * (high - low))] * ranks})
            problem = milp.build_problem(profile, setup)
            start = time.perf_counter()
            solved = milp.solve(problem, mip_gap=0.0, threads=1)
            seconds = time.perf_counter() - start
            columns = problem.lp.variables()
            plan = milp.extract_plan(problem) if solved.status in ("optimal", "feasible") else None
            fits = plan is not None and costmodel.evaluate(plan, profile, setup).feasible
            linear = costmodel.chunked_linear_ms(plan, profile, setup) if plan else float("nan")
            print(f"{len(profile.layers)} layers, {ranks}x{chunks}, cap {fraction}: {len(problem.lp.constraints())} rows, "
                  f"{len(columns)} columns ({sum(v.cat == pulp.LpInteger for v in columns)} integer), {seconds:.2f} s, "
                  f"{solved.status} {solved.objective:.4f} ms (its plan's {linear:.4f}), plan fits: {fits}")


if __name__ == "__main__":
    main()
