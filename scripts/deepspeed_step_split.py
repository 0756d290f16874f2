"""A published row's step time summed by cost term over its layers (docs/published-runs.md §35.dstime): where a
one-stage row's iteration goes, term by term, in seconds.

usage: PYTHONPATH=<checkout> python scripts/deepspeed_step_split.py ROW [--work DIR]

The row's `ckplan evaluate` arguments and profile are the harness's (scripts/published_rows.toml; make the profile
first with `scripts/published_rows.py profiles --only ROW`). Every time, step and comm term of planner/cost/terms.py
that is not zero, summed over the stage's layers at their recompute options, then the stage's own; the sum is the
iteration of a one-stage plan (the DeepSpeed rows), which the last two lines print side by side.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import published_rows  # noqa: E402  (the harness beside this file)

from planner.cost import terms  # noqa: E402
from planner.cost.layers import layer_costs  # noqa: E402

TIMED = ("time", "step", "comm")


def split(stages, profile, setup) -> dict[str, float]:
    """{term: ms} over the first stage's layers and the stage's own terms."""
    ctx, recompute, found = terms.Context(profile, setup), stages[0].recompute, {}
    for layer in layer_costs(profile):
        option = next((i for i, o in enumerate(layer.options) if o.name == recompute.get(layer.name, "none")), 0)
        for term in terms.TERMS:
            if term.where == "layer" and term.quantity in TIMED and (value := term.value(layer, option, ctx)):
                found[term.name] = found.get(term.name, 0.0) + value
    for term in terms.TERMS:
        if term.where == "stage" and term.quantity in TIMED and (value := term.value(0, ctx)):
            found[term.name] = found.get(term.name, 0.0) + value
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("row")
    parser.add_argument("--work", type=Path, default=published_rows.WORK)
    args = parser.parse_args(argv)
    try:
        stages, profile, setup, cost = published_rows.capture_row(args.row, args.work, "")
    except published_rows.HarnessError as exc:
        parser.error(str(exc))
    found = split(stages, profile, setup)
    shown = {name: round(ms / 1e3, 3) for name, ms in found.items()}
    shown |= {"terms summed": round(sum(found.values()) / 1e3, 3), "iteration_s": round(cost.iteration_ms / 1e3, 3)}
    print(json.dumps(shown, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
