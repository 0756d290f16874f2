"""ckplan's own ZB run (torch's interleaved zero bubble, 2 chunks a rank) of dp_tiny, stages [0 1] [2 3] [4 5] [6 7] looped: profile once per folder (micro-batch 4), run one step.
usage: runzb.py FOLDER M"""
import sys
from pathlib import Path

from planner import io
from planner.cost import costmodel
from planner.cost.assembly import with_predictions
from planner.runtime.launcher import run_plan
from planner.schema import StagePlan
from tests.fixtures.cli import run_ok

folder, m = Path(sys.argv[1]), int(sys.argv[2])
folder.mkdir(parents=True, exist_ok=True)
profile_path, plan_path = folder / "profile.json", folder / f"zbplan{m}.yaml"
if not profile_path.exists():
    run_ok("profile", "tests/fixtures/dp_tiny.py", "--micro-batch-size", "4", "--threads", "1", "--repeats", "1",
           "--warmup", "1", "--out", profile_path)
run_ok("solve", "--profile", profile_path, "--stages", "2", "--mem", "100MiB", "--microbatches", str(m),
       "--schedule", "ZB", "--chunks", "2", "--out", plan_path)
solved, profile = io.load_plan(plan_path), io.load_profile(profile_path)
ranks = [StagePlan(index=0, layers=["0", "1", "4", "5"], chunks=[["0", "1"], ["4", "5"]]),
         StagePlan(index=1, layers=["2", "3", "6", "7"], chunks=[["2", "3"], ["6", "7"]])]
cost = costmodel.evaluate(ranks, profile, solved.setup)
io.save_plan(solved.model_copy(update={"stages": with_predictions(ranks, cost)}), plan_path)
report = run_plan(io.load_plan(plan_path), plan_file=plan_path, steps=1, warmup_steps=1)
for s in report.stages:
    print(f"ZB M {m} rank {s.index}: measured {s.measured.peak_bytes:,} predicted {s.predicted.peak_bytes:,} "
          f"diff {s.measured.peak_bytes - s.predicted.peak_bytes:+,}")
