#!/usr/bin/env python3
"""A plan's predicted iteration with its profile's split backward times and without them.

    python scripts/split_prediction.py PLAN.yaml [RUN.json ...]

With: each layer's recorded input and weight passes (planner/cost/splittime.py). Without: the same
profile with every option's input_grad_ms and weight_grad_ms removed, as a profile made before they
were recorded (half the backward each, the rule before branch splitbwd; the first stage's empty I
changes no makespan, docs/framework-facts.md §56). For each run report, measured / each prediction.
Run from the folder the plan was made in (its profile's path is relative to it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner import io  # noqa: E402
from planner.cost import costmodel  # noqa: E402


def without_split_times(profile):
    """The profile as one made before the split's times were recorded."""
    layers = [layer.model_copy(update={"recompute_options": [
        option.model_copy(update={"input_grad_ms": None, "weight_grad_ms": None}) for option in layer.recompute_options]})
        for layer in profile.layers]
    return profile.model_copy(update={"layers": layers})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plan", type=Path)
    parser.add_argument("reports", type=Path, nargs="*")
    a = parser.parse_args()
    plan = io.load_plan(a.plan)
    profile = io.load_profile(plan.profile.file)
    with_split = costmodel.evaluate(plan.stages, profile, plan.setup).iteration_ms
    halves = costmodel.evaluate(plan.stages, without_split_times(profile), plan.setup).iteration_ms
    print(f"{a.plan}: {plan.setup.pipeline.schedule}: predicted {with_split:.0f} ms with the recorded split, "
          f"{halves:.0f} ms with half the backward each")
    for path in a.reports:
        measured = io.load_report(path).iteration_ms
        print(f"  {path}: measured {measured:.0f} ms; measured/predicted {measured / with_split:.3f} "
              f"(half each: {measured / halves:.3f})")


if __name__ == "__main__":
    main()
