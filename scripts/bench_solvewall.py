"""`ckplan solve` as a user runs it, timed on two source trees in one run: the wall and the CPU seconds of each
solve, the runs alternating (before, after, then after, before, ...) so a load that drifts over the run weighs on
both alike, and whether the two trees wrote the same plan.

Each case is a `ckplan solve` command line (its flags after `solve`); each repeat runs it once on each tree, in a
fresh process (imports included, as a user waits for them), writing the plan to a scratch file. Reported per case
and tree: the median wall and CPU seconds (user + system of the child), the spread (slowest - fastest) beside each as
its noise, the solver's line (status, gap, its own seconds), and after / before as ratios of the medians. "same
plan": the plan files' stages, predicted figures and solver status equal (the wall, the date and the solver's
seconds aside).

    .venv/bin/python scripts/bench_solvewall.py --before /tmp/base --after . --repeats 2 \\
        --case "--profile msmall-f.json --mem 80GB --stages 8 --microbatches 16 --precision bf16-mixed" [--json]

--before / --after: a tree holding `planner/` (a `git archive` of each commit). Each solve runs in its tree (`-m` puts
the working directory before PYTHONPATH on the path, so run elsewhere both would import that one), so give the
case's files as absolute paths.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

SOLVER_LINE = re.compile(r"solver: (\w+), (\w+)(?:, gap ([0-9.e+-]+))? in ([0-9.]+) s")


def imported_from(tree: Path) -> Path:
    """Where `python -m planner.cli` run as run_once runs it imports planner from: `-m` puts the working directory
    first on the path, before PYTHONPATH, so each tree's solve runs in the tree itself."""
    env = dict(os.environ, PYTHONPATH=str(tree.resolve()))
    done = subprocess.run([sys.executable, "-c", "import planner; print(planner.__file__)"], env=env, cwd=tree,
                          capture_output=True, text=True, check=True)
    return Path(done.stdout.strip()).resolve().parent.parent


def run_once(tree: Path, case: str, out: Path) -> dict:
    """One solve of `case` with `tree`'s planner: wall and CPU seconds, the solver's line, the plan's digest."""
    env = dict(os.environ, PYTHONPATH=str(tree.resolve()))
    command = [sys.executable, "-m", "planner.cli", "solve", *shlex.split(case), "--out", str(out)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: solve failed (rc {done.returncode}): {done.stderr.strip()[-500:]}")
    found = SOLVER_LINE.search(" ".join(done.stdout.split()))
    plan = yaml.safe_load(out.read_text())
    solver = plan.get("solver", {})
    digest = json.dumps({"stages": plan.get("stages"), "predicted": plan.get("predicted"),
                         "status": solver.get("status")}, sort_keys=True)
    return {"wall_s": wall, "cpu_s": cpu, "status": found.group(2) if found else "?",
            "gap": float(found.group(3)) if found and found.group(3) else None,
            "solve_s": float(found.group(4)) if found else None, "iteration_ms": plan["predicted"]["iteration_ms"],
            "digest": digest}


def summary(runs: list[dict], key: str) -> tuple[float, float]:
    values = [run[key] for run in runs]
    return statistics.median(values), max(values) - min(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, required=True)
    parser.add_argument("--case", action="append", required=True, help="the flags after `ckplan solve`")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    for tree in (args.before, args.after):
        if not (tree / "planner" / "cli.py").is_file():
            raise SystemExit(f"{tree} holds no planner/cli.py: give a source tree")
    for tree in (args.before, args.after):
        if imported_from(tree) != tree.resolve():
            raise SystemExit(f"{tree}'s solve would import planner from {imported_from(tree)}")
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for c, case in enumerate(args.case):
            runs: dict[str, list[dict]] = {"before": [], "after": []}
            for repeat in range(args.repeats):
                order = ("before", "after") if repeat % 2 == 0 else ("after", "before")
                for name in order:
                    tree = args.before if name == "before" else args.after
                    run = run_once(tree, case, Path(scratch) / f"plan-{c}-{name}-{repeat}.yaml")
                    runs[name].append(run)
                    print(f"case {c} repeat {repeat} {name}: wall {run['wall_s']:.1f} s, cpu {run['cpu_s']:.1f} s, "
                          f"{run['status']} gap {run['gap']} in {run['solve_s']} s, {run['iteration_ms']:.1f} ms",
                          file=sys.stderr, flush=True)
            row = {"case": case}
            for name in ("before", "after"):
                for key in ("wall_s", "cpu_s"):
                    row[f"{name}_{key}"], row[f"{name}_{key}_spread"] = summary(runs[name], key)
                row[f"{name}_status"] = sorted({f"{run['status']} gap {run['gap']}" for run in runs[name]})
                row[f"{name}_iteration_ms"] = sorted({round(run["iteration_ms"], 3) for run in runs[name]})
            row["wall_ratio"] = row["after_wall_s"] / row["before_wall_s"]
            row["cpu_ratio"] = row["after_cpu_s"] / row["before_cpu_s"]
            row["same_plan"] = len({run["digest"] for run in runs["before"] + runs["after"]}) == 1
            results.append(row)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for row in results:
        print(f"{row['case']}\n"
              f"  before: wall {row['before_wall_s']:.1f} s (spread {row['before_wall_s_spread']:.1f}), "
              f"cpu {row['before_cpu_s']:.1f} s (spread {row['before_cpu_s_spread']:.1f}), {row['before_status']}, "
              f"{row['before_iteration_ms']} ms\n"
              f"  after:  wall {row['after_wall_s']:.1f} s (spread {row['after_wall_s_spread']:.1f}), "
              f"cpu {row['after_cpu_s']:.1f} s (spread {row['after_cpu_s_spread']:.1f}), {row['after_status']}, "
              f"{row['after_iteration_ms']} ms\n"
              f"  after / before: wall {row['wall_ratio']:.3f}, cpu {row['cpu_ratio']:.3f}; same plan: "
              f"{row['same_plan']}")


if __name__ == "__main__":
    main()
