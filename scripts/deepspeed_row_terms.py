"""Print a published row's cost terms by layer: the per-term decomposition of its peak and time
(docs/published-runs.md §29.dsrows).

usage: PYTHONPATH=<checkout> python scripts/deepspeed_row_terms.py ROW [--work DIR] [--also "ARGS"]

The row's `ckplan evaluate` arguments and profile are the harness's (scripts/published_rows.toml; make the
profile first with `scripts/published_rows.py profiles --only ROW`). Prints, for the first layer, the first
decoder block and the last layer, every term (planner/cost/terms.py TERMS) that is not zero under the layer's
recompute option, and the stage's own terms: bytes in GiB, times in s; then the rank's peak, reserve and
iteration. `--also` appends `ckplan evaluate` arguments to the row's (a what-if: `--shard-bandwidth 192`).
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import published_rows  # noqa: E402  (the harness beside this file)

from planner.cost import terms  # noqa: E402
from planner.cost.layers import layer_costs  # noqa: E402

GIB = 2**30


def _shown(value: float, quantity: str) -> float:
    return round(value / 1e3, 4) if quantity in ("time", "comm", "step") else round(value / GIB, 4)


def decompose(stages, profile, setup) -> dict:
    """The terms of the first layer, the first decoder block and the last layer of the single stage, and the
    stage's: {where: {"quantity: term": value}}."""
    ctx = terms.Context(profile, setup)
    layers = layer_costs(profile)
    recompute = stages[0].recompute
    found = {}
    for layer in (layers[0], next(x for x in layers if x.kind == "decoder_block"), layers[-1]):
        option = next((i for i, o in enumerate(layer.options) if o.name == recompute.get(layer.name, "none")), 0)
        found[f"{layer.name} ({layer.options[option].name})"] = {
            f"{term.quantity}: {term.name}": _shown(value, term.quantity)
            for term in terms.TERMS if term.where == "layer" and (value := term.value(layer, option, ctx))}
    found["stage"] = {f"{term.quantity}: {term.name}": _shown(value, term.quantity)
                      for term in terms.TERMS if term.where == "stage" and (value := term.value(0, ctx))}
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("row")
    parser.add_argument("--work", type=Path, default=published_rows.WORK)
    parser.add_argument("--also", default="", help="ckplan evaluate arguments appended to the row's")
    args = parser.parse_args(argv)
    try:
        stages, profile, setup, cost = published_rows.capture_row(args.row, args.work, args.also)
    except published_rows.HarnessError as exc:
        parser.error(str(exc))
    found = decompose(stages, profile, setup)
    rank = cost.stages[0]
    found["rank"] = {"static": rank.static_bytes / GIB, "activations": rank.activation_bytes / GIB,
                     "transient": rank.transient_bytes / GIB, "allocated peak": rank.peak_bytes / GIB,
                     "reserved": (rank.reserved_bytes or rank.peak_bytes) / GIB, "cap": rank.cap_bytes / GIB,
                     "host": rank.host_bytes / GIB, "fits": rank.fits}
    found["iteration_s"] = cost.iteration_ms / 1e3
    print(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
