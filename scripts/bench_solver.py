"""Solver benchmark: how long ckplan's solver takes on synthetic profiles, and what it finds.

For each case (a synthetic profile of some layers over some stages) the cap is put 40%
of the way from what full checkpointing needs to what no checkpointing needs (both
measured with evaluate() on the even split, the largest stage), so the problem is
neither trivial nor infeasible. Each repeat does what `ckplan solve` does: score the
baselines (the best feasible one bounds the solver and is its start), then search.plan()
(`--solver dp`, the exact dynamic programme, or `milp`, HiGHS; `dp,milp` runs both on
every case and adds a table of their objectives and times side by side), which re-evaluates
the plan. Times are medians over the repeats, with the spread (slowest - fastest) beside
them; "solve" is plan() alone, "total" baselines + solve.

Many-solves cases time one user question that needs many solves:
  sweep:KIND:LxP  min_cap_scale, then 10 caps from there to the no-checkpointing need,
                  baselines + plan() at each (what `ckplan solve --sweep` does, 10 points)
  batch:KIND:LxP  12 setups at the case's cap (ZeRO 0-3 x {dp 2, dp 8, dp 8 + offload}),
                  baselines + plan() for each, as an automatic data-parallel search would
Their "status" is the worst of their solves, "ckplan ms" the last solve's.

    .venv/bin/python scripts/bench_solver.py [--cases uniform:32x4,heterogeneous:64x8,sweep:heterogeneous:128x16]
        [--repeats 3] [--time-limit 120] [--solver dp|milp|auto|dp,milp] [--microbatches-per-stage 2] [--json]

Case names: uniform:LxP is uniform_blocks (embedding, L - 2 identical blocks, head:
L layers in all), heterogeneous:LxP is L layers that all differ; P stages.
"feasible" is a plan found when the time limit struck, with the gap left;
"timeout" is a time limit before any plan (only possible with no feasible baseline).
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
from planner.solve import baselines, search  # noqa: E402

DEFAULT_CASES = (
    "uniform:128x16,heterogeneous:128x16,heterogeneous:256x16,heterogeneous:96x32,heterogeneous:256x32,"
    "uniform:512x64,sweep:heterogeneous:128x16,batch:heterogeneous:128x16"
)
MANY = {"sweep": 10, "batch": 12}  # solves per many-solves case
KINDS = {"uniform": "uniform-block", "heterogeneous": "heterogeneous"}
MIB = 2**20


def parse_case(text: str) -> tuple[str | None, str, int, int]:
    """(many-solves mode or None, kind, layers, stages)."""
    parts = text.strip().split(":")
    mode = parts.pop(0) if len(parts) == 3 else None
    try:
        kind, size = parts
        layers, stages = (int(part) for part in size.lower().split("x"))
    except ValueError:
        raise SystemExit(f"bad case {text!r}: expected [sweep:|batch:]KIND:LAYERSxSTAGES, e.g. uniform:32x4") from None
    if kind not in KINDS or mode not in (None, *MANY):
        raise SystemExit(f"bad case {text!r}: kind must be one of {', '.join(KINDS)}, a prefix one of {', '.join(MANY)}")
    if kind == "uniform" and layers < 3 or layers < stages:
        raise SystemExit(f"bad case {text!r}: too few layers")
    return mode, kind, layers, stages


def make_profile(kind: str, layers: int):
    if kind == "uniform":
        return synthetic.uniform_blocks(layers - 2, seed=0)
    return synthetic.heterogeneous(layers, seed=0)


def interesting_setup(profile, stages: int, microbatches: int, fraction: float) -> TrainSetup:
    """One cap for every stage, `fraction` of the way from the full-checkpointing need to the
    no-checkpointing need (each the largest stage of the even split)."""
    roomy = TrainSetup(stages=stages, microbatches=microbatches, micro_batch_size=profile.micro_batch_size,
                       mem_caps_bytes=[2**62] * stages)
    need = {
        name: max(costmodel.evaluate(strategy(profile, roomy), profile, roomy).peak_bytes_per_stage)
        for name, strategy in (("full", baselines.full_checkpointing), ("none", baselines.no_checkpointing))
    }
    cap = int(need["full"] + fraction * (need["none"] - need["full"]))
    return roomy.model_copy(update={"mem_caps_bytes": [cap] * stages})


def one_solve(profile, setup: TrainSetup, args) -> dict:
    """What `ckplan solve` does: the baselines, then search.plan() bounded and started by the
    best of them (plan() re-scores the plan with evaluate())."""
    started = time.perf_counter()
    scored = baselines.all_baselines(profile, setup)
    feasible = [b for b in scored if b.feasible]
    best = min(feasible, key=lambda b: b.iteration_ms) if feasible else None
    after_baselines = time.perf_counter()
    result = search.plan(profile, setup, time_limit_s=args.time_limit, mip_gap=args.mip_gap, threads=args.threads,
                         upper_bound_ms=best.iteration_ms if best else None, start=best.stages if best else None,
                         solver=args.solver)
    finished = time.perf_counter()
    solved = isinstance(result, search.PlanResult)
    outcome = result.solve if solved else result
    return dict(
        total_s=finished - started, baselines_s=after_baselines - started,
        solve_s=finished - after_baselines, status=outcome.status, gap=outcome.gap,
        iteration_ms=result.cost.iteration_ms if solved else None,
        best_baseline=best.name if best else None, best_baseline_ms=best.iteration_ms if best else None,
    )


def sweep_setups(profile, setup: TrainSetup) -> list[TrainSetup]:
    """--sweep's caps, 10 of them: from the least any plan needs (min_cap_scale, timed with
    the sweep) to the no-checkpointing need + 5%."""
    found = search.min_cap_scale(profile, setup)
    low = max(found[1].peak_bytes_per_stage)
    roomy = setup.model_copy(update={"mem_caps_bytes": [2**62] * setup.pipeline.stages})
    high = max(costmodel.evaluate(baselines.no_checkpointing(profile, roomy), profile, roomy).peak_bytes_per_stage) * 1.05
    caps = [int(low + i * (high - low) / (MANY["sweep"] - 1)) + costmodel.FIT_MARGIN_BYTES + 1 for i in range(MANY["sweep"])]
    return [setup.model_copy(update={"mem_caps_bytes": [cap] * setup.pipeline.stages}) for cap in caps]


def batch_setups(setup: TrainSetup) -> list[TrainSetup]:
    """12 sharding setups at one cap, as a search over data parallelism would solve."""
    shapes = [(2, False), (8, False), (8, True)]
    return [setup.model_copy(update={"zero": zero, "dp": dp, "offload": offload})
            for zero in range(4) for dp, offload in shapes]


def one_run(mode, profile, setup: TrainSetup, args) -> dict:
    """One solve, or a many-solves question answered end to end."""
    if mode is None:
        return one_solve(profile, setup, args)
    started = time.perf_counter()
    setups = sweep_setups(profile, setup) if mode == "sweep" else batch_setups(setup)
    solves = [one_solve(profile, point, args) for point in setups]
    rank = ["optimal", "feasible", "infeasible", "timeout"]
    worst = max(solves, key=lambda run: rank.index(run["status"]))
    return dict(solves[-1], total_s=time.perf_counter() - started, solve_s=sum(run["solve_s"] for run in solves),
                baselines_s=sum(run["baselines_s"] for run in solves), status=worst["status"], gap=worst["gap"])


def bench_case(spec: str, args) -> dict:
    mode, kind, num_layers, stages = parse_case(spec)
    profile = make_profile(kind, num_layers)
    microbatches = args.microbatches_per_stage * stages
    setup = interesting_setup(profile, stages, microbatches, args.cap_fraction)
    runs = [one_run(mode, profile, setup, args) for _ in range(args.repeats)]
    by_total = sorted(runs, key=lambda run: run["total_s"])
    median_run = by_total[(len(by_total) - 1) // 2]
    statuses = sorted({run["status"] for run in runs})
    return dict(
        case=spec, kind=KINDS[kind] if mode is None else f"{mode} x{MANY[mode]} {KINDS[kind]}",
        layers=len(profile.layers), stages=stages, microbatches=microbatches,
        cap_bytes=setup.pipeline.mem_caps_bytes[0], repeats=args.repeats, time_limit_s=args.time_limit,
        solver=args.solver, mip_gap_target=args.mip_gap, threads=args.threads,
        total_s=statistics.median(run["total_s"] for run in runs),
        total_spread_s=by_total[-1]["total_s"] - by_total[0]["total_s"],
        solve_s=statistics.median(run["solve_s"] for run in runs),
        baselines_s=statistics.median(run["baselines_s"] for run in runs),
        status=median_run["status"], statuses=statuses, gap=median_run["gap"],
        iteration_ms=median_run["iteration_ms"], best_baseline=median_run["best_baseline"],
        best_baseline_ms=median_run["best_baseline_ms"], runs=runs,
    )


def fmt(value, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def print_table(rows: list[dict]) -> None:
    header = ("profile", "layers", "stages", "M", "cap MiB", "total s", "spread s", "baselines s", "solve s",
              "status", "gap", "ckplan ms", "best baseline ms", "saving", "solver")
    lines = [header]
    for row in rows:
        status = row["status"] + ("*" if len(row["statuses"]) > 1 else "")
        saving = None
        if row["iteration_ms"] is not None and row["best_baseline_ms"]:
            saving = 1 - row["iteration_ms"] / row["best_baseline_ms"]
        baseline = "-" if row["best_baseline"] is None else f"{row['best_baseline_ms']:.1f} ({row['best_baseline']})"
        lines.append((
            row["kind"], str(row["layers"]), str(row["stages"]), str(row["microbatches"]),
            f"{row['cap_bytes'] / MIB:.0f}", f"{row['total_s']:.2f}", f"{row['total_spread_s']:.2f}",
            f"{row['baselines_s']:.2f}", f"{row['solve_s']:.2f}", status,
            fmt(row["gap"], ".2%"), fmt(row["iteration_ms"], ".1f"), baseline, fmt(saving, ".1%"), row["solver"],
        ))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for n, line in enumerate(lines):
        print("  ".join(cell.ljust(width) if i in (0, 9, 12, 14) else cell.rjust(width)
                        for i, (cell, width) in enumerate(zip(line, widths))))
        if n == 0:
            print("  ".join("-" * width for width in widths))
    for row in rows:
        if len(row["statuses"]) > 1:
            runs = "; ".join(
                f"{run['status']} after {run['solve_s']:.1f} s"
                + (f" ({run['iteration_ms']:.1f} ms, gap {fmt(run['gap'], '.2%')})" if run["iteration_ms"] else "")
                for run in row["runs"])
            print(f"* {row['case']}: the repeats ended differently (the row shows the median by total time): {runs}")


def print_comparison(rows: list[dict], solvers: list[str]) -> None:
    """Per case, every solver's objective and solve time against the first solver's."""
    first = solvers[0]
    print(f"\n# against {first}: objective ratio (1 = the same optimum) and solve-time ratio")
    by_case = {}
    for row in rows:
        by_case.setdefault(row["case"], {})[row["solver"]] = row
    for case, found in by_case.items():
        base = found[first]
        for name in solvers[1:]:
            other = found[name]
            same = (f"{other['iteration_ms'] / base['iteration_ms']:.9f}"
                    if other["iteration_ms"] and base["iteration_ms"] else "-")
            print(f"{case:32s} {name}/{first}: objective x{same} ({other['status']} vs {base['status']}), "
                  f"solve {other['solve_s']:.3f} s vs {base['solve_s']:.3f} s (x{other['solve_s'] / max(base['solve_s'], 1e-9):.1f})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=DEFAULT_CASES, help=f"comma-separated KIND:LAYERSxSTAGES (default {DEFAULT_CASES})")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--time-limit", type=float, default=120.0, help="time limit per solve, seconds")
    parser.add_argument("--solver", default="auto",
                        help="search.plan()'s solver: auto, dp, milp, or several separated by commas (dp,milp) "
                             "to run each on every case and compare them [default: auto]")
    parser.add_argument("--microbatches-per-stage", type=int, default=2, help="M = this x stages")
    parser.add_argument("--cap-fraction", type=float, default=0.4,
                        help="cap between the full-checkpointing (0) and no-checkpointing (1) needs")
    parser.add_argument("--mip-gap", type=float, default=1e-4)
    parser.add_argument("--threads", type=int, default=None, help="HiGHS threads (default: HiGHS's choice)")
    parser.add_argument("--json", action="store_true", help="one JSON object per case, one per line")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    specs = [spec for spec in args.cases.split(",") if spec.strip()]
    solvers = [name.strip() for name in args.solver.split(",") if name.strip()]
    if not solvers or any(name not in search.SOLVERS for name in solvers):
        raise SystemExit(f"--solver {args.solver!r}: give {', '.join(search.SOLVERS)}, or several separated by commas")
    for spec in specs:
        parse_case(spec)  # fail on a bad case before any work
    rows = []
    for spec in specs:
        for solver in solvers:  # one case's solvers in turn, so they see the same load
            row = bench_case(spec, argparse.Namespace(**{**vars(args), "solver": solver}))
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                print(f"# {spec} ({solver}): {row['status']} in {row['total_s']:.2f} s", file=sys.stderr, flush=True)
    if not args.json:
        print(f"# repeats={args.repeats} solver={args.solver} time_limit={args.time_limit:g}s mip_gap={args.mip_gap:g} "
              f"threads={args.threads or 'HiGHS default'} cap={args.cap_fraction:.0%} of the way "
              f"from full to no checkpointing; times are medians")
        print_table(rows)
        if len(solvers) > 1:
            print_comparison(rows, solvers)


if __name__ == "__main__":
    main()
