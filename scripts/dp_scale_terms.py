"""Two published rows' time terms side by side, summed over the single stage's layers: what the cluster adds
between a row on one node and the same job on many (docs/published-runs.md §31.x2nics: M8 against M10).

usage: PYTHONPATH=<checkout> python scripts/dp_scale_terms.py ROW_A ROW_B [--work DIR] [--also "ARGS"]

Profiles made first by `scripts/published_rows.py profiles --only ROW_A,ROW_B`. Prints each "time", "comm" and
"step" term (planner/cost/terms.py TERMS) of the layers under their recompute options and of the stage, in ms,
for both rows and B - A, then the iterations. `--also` appends `ckplan evaluate` arguments to ROW_B's (a what-if:
`--shard-bandwidth 48`, one NIC's rate for the shard group).
"""
import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import published_rows  # noqa: E402  (the harness beside this file)

from planner.cost import terms  # noqa: E402
from planner.cost.layers import layer_costs  # noqa: E402

QUANTITIES = ("time", "comm", "step")


def stage_terms_ms(row_id: str, work: Path, also: str = "") -> tuple[dict[str, float], float]:
    """({"quantity: term": ms summed over the stage's layers and the stage}, iteration ms) of a one-stage row, its
    arguments followed by `also`'s."""
    rows = {row.id: row for row in published_rows.load_table().rows}
    if row_id not in rows:
        raise SystemExit(f"no row {row_id} in scripts/published_rows.toml")
    argv = published_rows.evaluate_args(rows[row_id], work) + shlex.split(also)
    stages, profile, setup, cost = published_rows.capture(argv)
    if len(stages) != 1:
        raise SystemExit(f"{row_id}: {len(stages)} stages; this compares one-stage rows")
    ctx, recompute, found = terms.Context(profile, setup), stages[0].recompute, {}
    for layer in layer_costs(profile):
        option = next((i for i, o in enumerate(layer.options) if o.name == recompute.get(layer.name, "none")), 0)
        for term in terms.TERMS:
            if term.where == "layer" and term.quantity in QUANTITIES:
                key = f"{term.quantity}: {term.name}"
                found[key] = found.get(key, 0.0) + term.value(layer, option, ctx)
    for term in terms.TERMS:
        if term.where == "stage" and term.quantity in QUANTITIES:
            key = f"{term.quantity}: {term.name}"
            found[key] = found.get(key, 0.0) + term.value(0, ctx)
    return found, cost.iteration_ms


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--work", type=Path, default=published_rows.WORK)
    parser.add_argument("--also", default="", help="ckplan evaluate arguments appended to ROW_B's")
    args = parser.parse_args(argv)
    (a, a_ms), (b, b_ms) = stage_terms_ms(args.a, args.work), stage_terms_ms(args.b, args.work, args.also)
    print(f"{'ms':>10} {args.a:>10} {args.b:>10} {'B - A':>10}  term")
    for key in a:
        if a[key] or b.get(key):
            print(f"{'':>10} {a[key]:10.3f} {b.get(key, 0.0):10.3f} {b.get(key, 0.0) - a[key]:10.3f}  {key}")
    print(f"{'iteration':>10} {a_ms:10.3f} {b_ms:10.3f} {b_ms - a_ms:10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
