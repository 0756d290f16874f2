#!/usr/bin/env python3
"""One profile's split-schedule plan priced two ways: the chunked solver pricing each layer's input
and weight passes as the evaluator runs them (the profile as recorded), and pricing its backward as
one number (the profile with its split times removed: what the MILP read before branch milpsplit).
Both plans are scored on the recorded profile (evaluate: the simulated schedule).

    python scripts/split_pricing.py PROFILE.json --schedule ZBV --stages 2 --microbatches 8
        [--cap-fraction 0.4 | --mem 12GiB] [--time-limit 120] [--priced-on OTHER.json]

--cap-fraction puts every rank's cap that far from what full checkpointing needs to what no
checkpointing needs (the baselines, evaluated); --mem gives it. --priced-on adds the plan solved on
another profile of the same layers (e.g. one made before a profiler change), scored on PROFILE.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_split_solver import one_solve  # noqa: E402
from split_prediction import without_split_times  # noqa: E402

from planner import io  # noqa: E402
from planner.cost import costmodel  # noqa: E402
from planner.schema import TrainSetup  # noqa: E402
from planner.solve import baselines  # noqa: E402
from planner.units import parse_size  # noqa: E402


def cap_between(profile, setup: TrainSetup, fraction: float) -> int:
    found = {b.name: b for b in baselines.all_baselines(profile, setup)}
    need = {name: max(costmodel.evaluate(found[name].stages, profile, setup).peak_bytes_per_stage)
            for name in ("full-ckpt", "no-ckpt")}
    return int(need["full-ckpt"] + fraction * (need["no-ckpt"] - need["full-ckpt"]))


def describe(ranks) -> str:
    """Each rank's chunks: first..last layer (count), the layers recomputing and their option."""
    out = []
    for rank in ranks:
        chunks = []
        for chunk in rank.chunks:
            recomputed = [f"{name}:{rank.option(name)}" for name in chunk if rank.option(name) != "none"]
            chunks.append(f"{chunk[0]}..{chunk[-1]} ({len(chunk)})" + (f" [{', '.join(recomputed)}]" if recomputed else ""))
        out.append(f"  rank {rank.index}: " + " | ".join(chunks))
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("--schedule", choices=("ZB", "ZBV", "DualPipeV"), default="ZBV")
    parser.add_argument("--stages", type=int, default=2, help="pipeline ranks")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--cap-fraction", type=float, default=0.4)
    parser.add_argument("--mem", help="every rank's cap, e.g. 12GiB (instead of --cap-fraction)")
    parser.add_argument("--time-limit", type=float, default=120.0)
    parser.add_argument("--priced-on", type=Path, help="also solve on this profile, score its plan on PROFILE")
    a = parser.parse_args()
    profile = io.load_profile(a.profile)
    roomy = TrainSetup(stages=a.stages, microbatches=a.microbatches, micro_batch_size=profile.micro_batch_size,
                       schedule=a.schedule, chunks=2, mem_caps_bytes=[2**62] * a.stages)
    cap = parse_size(a.mem) if a.mem else cap_between(profile, roomy, a.cap_fraction)
    setup = roomy.model_copy(update={"mem_caps_bytes": [cap] * a.stages})
    print(f"{a.profile}: {a.schedule}, {a.stages} ranks, M {a.microbatches}, cap {cap / 2**20:.0f} MiB a rank")
    pricings = [("one backward (before)", without_split_times(profile)), ("split passes (after)", profile)]
    if a.priced_on:
        pricings.append((f"split passes, solved on {a.priced_on}", io.load_profile(a.priced_on)))
    for name, priced in pricings:
        found, ranks = one_solve(priced, profile, setup, a.time_limit)
        if ranks is None:
            print(f"{name}: no plan ({found['status']})")
            continue
        if found["iteration_ms"] is None:  # a plan solved on another profile that does not fit on this one
            peaks = costmodel.evaluate(ranks, profile, setup).peak_bytes_per_stage
            print(f"{name}: does not fit this profile: peaks {', '.join(f'{p / 2**20:,.0f}' for p in peaks)} MiB")
            print(describe(ranks))
            continue
        print(f"{name}: evaluate {found['iteration_ms']:.1f} ms, linear {found['linear_ms']:.1f} ms, "
              f"{found['checkpointed']} layers recomputing, solve {found['solve_s']:.2f} s cpu ({found['status']})")
        print(describe(ranks))


if __name__ == "__main__":
    main()
