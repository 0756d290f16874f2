"""tests/fixtures/frozen_front.py at dp 2 under ZeRO 2 and 3, cut 0,1,2 | 3 and 0,1 | 2,3, launched on gloo: each stage's
planned / measured static and peak bytes (docs/published-runs.md §66.frozen3), and with --runs N each cut launched N
times, the least and the most measured peak per stage against the planned (§67.ownexact: the measured peak of a stage
moves run to run on gloo).

usage: PYTHONPATH=<checkout> python scripts/frozen_sharded.py WORKDIR [ZERO ...] [--runs N] [--cut 3|2]
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

from planner import io
from planner.cost import costmodel
from planner.cost.assembly import with_predictions
from planner.runtime.launcher import run_plan
from planner.schema import StagePlan

CUTS = ([["0", "1", "2"], ["3"]], [["0", "1"], ["2", "3"]])


def main(work: Path, zeros: list[int], runs: int, firsts: list[int]) -> None:
    work.mkdir(parents=True, exist_ok=True)
    fixture = Path(os.environ["PYTHONPATH"].split(":")[0]) / "tests" / "fixtures" / "frozen_front.py"
    (work / "front.py").write_text(fixture.read_text())
    ck = [sys.executable, "-m", "planner.cli"]
    subprocess.run([*ck, "profile", work / "front.py", "--micro-batch-size", "4", "--threads", "1", "--repeats", "1",
                    "--warmup", "0", "--out", work / "p.json"], check=True, capture_output=True)
    profile = io.load_profile(work / "p.json")
    for zero in zeros:
        subprocess.run([*ck, "solve", "--profile", work / "p.json", "--mem", "100MiB", "--stages", "2", "--microbatches",
                        "4", "--dp", "2", "--zero", str(zero), "--out", work / f"z{zero}.yaml"], check=True, capture_output=True)
        solved = io.load_plan(work / f"z{zero}.yaml")
        for cut in (c for c in CUTS if len(c[0]) in firsts):
            stages = [StagePlan(index=i, layers=names) for i, names in enumerate(cut)]
            costs = costmodel.evaluate(stages, profile, solved.setup)
            path = work / f"z{zero}-{len(cut[0])}.yaml"
            io.save_plan(solved.model_copy(update={"stages": with_predictions(stages, costs)}), path)
            name = f"ZeRO {zero} cut {' | '.join(','.join(c) for c in cut)}"
            peaks: dict[int, list[int]] = {}
            for _ in range(runs):
                report = run_plan(io.load_plan(path), plan_file=path, steps=1, warmup_steps=0)
                for stage in report.stages:
                    planned, measured = stage.predicted, stage.measured
                    peaks.setdefault(stage.index, []).append(measured.peak_bytes)
                    if runs == 1:
                        print(f"{name} stage {stage.index}: static {planned.static_bytes:,} / {measured.static_bytes:,}, "
                              f"peak {planned.peak_bytes:,} / {measured.peak_bytes:,} "
                              f"({planned.peak_bytes - measured.peak_bytes:+,})", flush=True)
            if runs > 1:
                for stage in report.stages:
                    planned, seen = stage.predicted.peak_bytes, peaks[stage.index]
                    print(f"{name} stage {stage.index}: peak planned {planned:,}, measured {min(seen):,}-{max(seen):,} "
                          f"in {runs} runs ({planned - max(seen):+,} to {planned - min(seen):+,}); "
                          f"{', '.join(f'{p:,}' for p in seen)}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("work", type=Path)
    parser.add_argument("zeros", type=int, nargs="*", default=[2, 3])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--cut", type=int, action="append", choices=[2, 3], help="stage 0's layers (default both)")
    args = parser.parse_args()
    main(args.work, args.zeros or [2, 3], args.runs, args.cut or [2, 3])
