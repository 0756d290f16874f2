"""The chunked solver on a split backward (ZB, ZBV, DualPipeV), pricing each layer's I and W as the
evaluator runs them (splittime.layer_extra_ms in the MILP's rows) against pricing its backward as one
number (what the MILP read before: the same profile with no split recorded), in one run: solve time
and the plans' iteration under the evaluator (the simulated schedule), as ratios new / old.

Each case is a synthetic profile whose blocks record a split per option in framework-facts §62's
measured proportions (the bundled GPT's block on torch 2.13): none I + W = 1.15 x B, I 53% of it;
full I = 0.55 x B + its recompute, I + W = 3.0 x (B + recompute) (the weight pass reruns the
forward per parameter group: measured 2.7-3.4). The cap is `--cap-fraction` of the way from what
full checkpointing needs to what no checkpointing needs (evaluate on the even split, the largest
rank). Per repeat both pricings are solved back to back, the order alternating, as `ckplan solve`
does (baselines, then search.plan bounded and started by the best, HiGHS on one thread); times are
the process's CPU seconds (the machine is shared), medians, and the noise is the spread (slowest /
fastest) of each pricing's own repeats.

    .venv/bin/python scripts/bench_split_solver.py [--cases ZBV:uniform:32x4,ZB:heterogeneous:24x4]
        [--repeats 3] [--cap-fraction 0.4] [--microbatches-per-rank 2] [--time-limit 120] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.cost import costmodel  # noqa: E402
from planner.models import synthetic  # noqa: E402
from planner.schema import TrainSetup  # noqa: E402
from planner.schema.profile import RecomputeOption  # noqa: E402
from planner.solve import baselines, search  # noqa: E402

DEFAULT_CASES = "ZBV:uniform:32x4,ZBV:heterogeneous:24x4,ZB:heterogeneous:24x4,DualPipeV:heterogeneous:24x4"
MIB = 2**20
# framework-facts §62 (torch 2.13.0, the bundled GPT's block, SplitTimeJob): none (I + W) / B mostly
# 1.04-1.21 (1.15 taken), I 53% of it; full (I + W) / (B + recompute) 2.7-3.4 (3.0 taken), I about B
NONE_SPLIT, NONE_INPUT_SHARE = 1.15, 0.53
FULL_SPLIT, FULL_INPUT_OF_B = 3.0, 0.55


def recorded(layer, *, record: bool):
    """The layer with options none and full, each with its split recorded (or not: `record` False)."""
    rerun = layer.fwd_ms if layer.recompute_ms is None else layer.recompute_ms
    none_pair = (NONE_SPLIT * NONE_INPUT_SHARE * layer.bwd_ms, NONE_SPLIT * (1 - NONE_INPUT_SHARE) * layer.bwd_ms)
    full_input = FULL_INPUT_OF_B * layer.bwd_ms + rerun
    full_pair = (full_input, FULL_SPLIT * (layer.bwd_ms + rerun) - full_input)
    split = (lambda pair: {"input_grad_ms": pair[0], "weight_grad_ms": pair[1]}) if record else (lambda pair: {})
    options = [RecomputeOption(name="none", kept_bytes=layer.act_bytes, **split(none_pair)),
               RecomputeOption(name="full", kept_bytes=layer.input_bytes, recompute_ms=rerun, **split(full_pair))]
    return layer.model_copy(update={"recompute_options": options})


def profiles(kind: str, num_layers: int):
    """(with the split recorded, without it): the same layers."""
    base = synthetic.uniform_blocks(num_layers - 2, seed=0) if kind == "uniform" else synthetic.heterogeneous(num_layers, seed=0)
    return tuple(base.model_copy(update={"layers": [recorded(item, record=r) for item in base.layers]})
                 for r in (True, False))


def parse_case(text: str):
    try:
        schedule, kind, size = text.strip().split(":")
        layers, ranks = (int(part) for part in size.lower().split("x"))
    except ValueError:
        raise SystemExit(f"bad case {text!r}: expected SCHEDULE:KIND:LAYERSxRANKS, e.g. ZBV:uniform:32x4") from None
    if schedule not in ("ZB", "ZBV", "DualPipeV") or kind not in ("uniform", "heterogeneous"):
        raise SystemExit(f"bad case {text!r}: a split schedule (ZB, ZBV, DualPipeV) and uniform or heterogeneous")
    if layers < 2 * ranks:
        raise SystemExit(f"bad case {text!r}: fewer layers than the {2 * ranks} stages")
    return schedule, kind, layers, ranks


def case_setup(profile, schedule: str, ranks: int, microbatches: int, fraction: float) -> TrainSetup:
    roomy = TrainSetup(stages=ranks, microbatches=microbatches, micro_batch_size=profile.micro_batch_size,
                       schedule=schedule, chunks=2, mem_caps_bytes=[2**62] * ranks)
    found = {b.name: b for b in baselines.all_baselines(profile, roomy)}  # scored as ranks
    need = {name: max(costmodel.evaluate(found[name].stages, profile, roomy).peak_bytes_per_stage)
            for name in ("full-ckpt", "no-ckpt")}
    cap = int(need["full-ckpt"] + fraction * (need["no-ckpt"] - need["full-ckpt"]))
    return roomy.model_copy(update={"mem_caps_bytes": [cap] * ranks})


def one_solve(priced, scored, setup: TrainSetup, time_limit_s: float) -> tuple[dict, list | None]:
    """`ckplan solve` on the profile `priced` (baselines, then plan()), its plan scored on `scored`:
    (figures, the plan's ranks or None)."""
    started = time.process_time()  # this process's CPU (HiGHS on one thread runs in it): less moved by load
    feasible = [b for b in baselines.all_baselines(priced, setup) if b.feasible]
    best = min(feasible, key=lambda b: b.iteration_ms) if feasible else None
    result = search.plan(priced, setup, time_limit_s=time_limit_s, threads=1,
                         upper_bound_ms=best.iteration_ms if best else None, start=best.stages if best else None)
    wall = time.process_time() - started
    if not isinstance(result, search.PlanResult):
        return dict(solve_s=wall, status=result.status, iteration_ms=None, linear_ms=None), None
    cost = costmodel.evaluate(result.stages, scored, setup)
    recomputing = sum(1 for rank in result.stages for name in rank.layers if rank.option(name) != "none")
    return dict(solve_s=wall, status=result.solve.status, iteration_ms=cost.iteration_ms if cost.feasible else None,
                linear_ms=costmodel.chunked_linear_ms(result.stages, scored, setup),
                checkpointed=recomputing), result.stages


def bench_case(spec: str, args) -> dict:
    schedule, kind, num_layers, ranks = parse_case(spec)
    split, plain = profiles(kind, num_layers)
    setup = case_setup(split, schedule, ranks, args.microbatches_per_rank * 2 * ranks, args.cap_fraction)
    runs = {"new": [], "old": []}
    for repeat in range(args.repeats):
        order = ("new", "old") if repeat % 2 == 0 else ("old", "new")
        for name in order:
            runs[name].append(one_solve(split if name == "new" else plain, split, setup, args.time_limit)[0])
    row = dict(case=spec, layers=len(split.layers), microbatches=setup.pipeline.microbatches,
               cap_mib=setup.pipeline.mem_caps_bytes[0] / MIB, repeats=args.repeats)
    for name, found in runs.items():
        times = [run["solve_s"] for run in found]
        row[name] = dict(solve_s=statistics.median(times), spread=max(times) / min(times),
                         iteration_ms=found[0]["iteration_ms"], linear_ms=found[0]["linear_ms"],
                         checkpointed=found[0].get("checkpointed"), statuses=sorted({run["status"] for run in found}))
    return row


def ratio(a, b) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.3f}"


def print_table(rows) -> None:
    header = ("case", "M", "cap MiB", "old solve cpu s", "new solve cpu s", "new/old", "noise old", "noise new",
              "old iter ms", "new iter ms", "new/old", "old ckpt", "new ckpt")
    lines = [header]
    for row in rows:
        old, new = row["old"], row["new"]
        lines.append((row["case"], str(row["microbatches"]), f"{row['cap_mib']:.0f}", f"{old['solve_s']:.2f}",
                      f"{new['solve_s']:.2f}", ratio(new["solve_s"], old["solve_s"]), f"x{old['spread']:.2f}",
                      f"x{new['spread']:.2f}", f"{old['iteration_ms'] or float('nan'):.1f}",
                      f"{new['iteration_ms'] or float('nan'):.1f}", ratio(new["iteration_ms"], old["iteration_ms"]),
                      str(old["checkpointed"]), str(new["checkpointed"])))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for n, line in enumerate(lines):
        print("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths))))
        if n == 0:
            print("  ".join("-" * w for w in widths))
    print("noise: slowest / fastest of a pricing's own repeats; iter: evaluate()'s simulated iteration of the "
          "plan, both on the profile with its split recorded")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=DEFAULT_CASES)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cap-fraction", type=float, default=0.4)
    parser.add_argument("--microbatches-per-rank", type=int, default=2, help="M = this x 2 x ranks")
    parser.add_argument("--time-limit", type=float, default=120.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    rows = [bench_case(spec, args) for spec in args.cases.split(",")]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_table(rows)


if __name__ == "__main__":
    main()
