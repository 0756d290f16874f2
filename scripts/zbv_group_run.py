"""ckplan's own ZBV run of dp_tiny, §45.ownunder's plan ([0 1 2 | 7], [3 | 4 5 6]), or its ZB run (torch's
interleaved zero bubble, 2 chunks a rank, looped: [0 1] [4 5] | [2 3] [6 7]): profile once per folder (micro-batch
4), solve for the setup, evaluate the fixed plan, run one step.
usage: zbv_group_run.py FOLDER M [CUT, e.g. "0 1 2|3|4 5 6|7": stages 0-3] [ZB]"""
import sys
from pathlib import Path

from planner import io
from planner.cost import costmodel
from planner.cost.assembly import with_predictions
from planner.runtime.launcher import run_plan
from planner.schema import StagePlan
from tests.fixtures.cli import run_ok

folder, m = Path(sys.argv[1]), int(sys.argv[2])
schedule = sys.argv[4] if len(sys.argv) > 4 else "ZBV"
default_cut = "0 1 2|3|4 5 6|7" if schedule == "ZBV" else "0 1|2 3|4 5|6 7"
folder.mkdir(parents=True, exist_ok=True)
profile_path, plan_path = folder / "profile.json", folder / f"{schedule.lower()}plan{m}.yaml"
if not profile_path.exists():
    run_ok("profile", "tests/fixtures/dp_tiny.py", "--micro-batch-size", "4", "--threads", "1", "--repeats", "1",
           "--warmup", "1", "--out", profile_path)
run_ok("solve", "--profile", profile_path, "--stages", "2", "--mem", "100MiB", "--microbatches", str(m),
       "--schedule", schedule, "--chunks", "2", "--out", plan_path)
solved, profile = io.load_plan(plan_path), io.load_profile(profile_path)
cut = [c.split() for c in (sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else default_cut).split("|")]
pairs = ((0, 3), (1, 2)) if schedule == "ZBV" else ((0, 2), (1, 3))  # V-shaped, or looped
ranks = [StagePlan(index=r, layers=cut[a] + cut[b], chunks=[cut[a], cut[b]]) for r, (a, b) in enumerate(pairs)]
cost = costmodel.evaluate(ranks, profile, solved.setup)
plan = solved.model_copy(update={"stages": with_predictions(ranks, cost)})
io.save_plan(plan, plan_path)
report = run_plan(io.load_plan(plan_path), plan_file=plan_path, steps=1, warmup_steps=1)
for s in report.stages:
    print(f"{schedule} M {m} rank {s.index}: measured {s.measured.peak_bytes:,} predicted {s.predicted.peak_bytes:,} "
          f"diff {s.measured.peak_bytes - s.predicted.peak_bytes:+,}")
