"""ckplan's own ZBV or ZB run of a tiny model on a fixed cut, its peaks beside what a measured and a fake profile
(`ckplan profile --fake --device cpu --dtype float32`) each plan for it (docs/published-runs.md §67.fakesplit).
Profiles once per folder (micro-batch 4), solves for the setup, evaluates the fixed cut from each profile, runs one
step (gloo, CPU).
usage: fake_split_run.py FOLDER M [CUT, e.g. "0 1 2|3|4 5 6|7": stages 0-3] [ZB] [MODEL, default dp_tiny] [FULL:
    the layers checkpointed whole, e.g. "1 2"]"""
import sys
from pathlib import Path

from planner import io
from planner.cost import costmodel
from planner.cost.assembly import with_predictions
from planner.runtime.launcher import run_plan
from planner.schema import StagePlan
from tests.fixtures.cli import run_ok

folder, m = Path(sys.argv[1]), int(sys.argv[2])
schedule = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] else "ZBV"
model = sys.argv[5] if len(sys.argv) > 5 and sys.argv[5] else "tests/fixtures/dp_tiny.py"
default_cut = "0 1 2|3|4 5 6|7" if schedule == "ZBV" else "0 1|2 3|4 5|6 7"
folder.mkdir(parents=True, exist_ok=True)
paths = {kind: folder / f"{kind}.json" for kind in ("measured", "fake")}
if not paths["measured"].exists():
    run_ok("profile", model, "--micro-batch-size", "4", "--threads", "1", "--repeats", "1", "--warmup", "1",
           "--out", paths["measured"])
if not paths["fake"].exists():
    run_ok("profile", model, "--micro-batch-size", "4", "--fake", "--device", "cpu", "--dtype", "float32",
           "--out", paths["fake"])
plan_path = folder / f"{schedule.lower()}plan{m}.yaml"
run_ok("solve", "--profile", paths["measured"], "--stages", "2", "--mem", "100MiB", "--microbatches", str(m),
       "--schedule", schedule, "--chunks", "2", "--out", plan_path)
solved = io.load_plan(plan_path)
cut = [c.split() for c in (sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else default_cut).split("|")]
names = [layer.name for layer in io.load_profile(paths["measured"]).layers]
cut = [[names[int(i)] for i in c] for c in cut]
full = [names[int(i)] for i in sys.argv[6].split()] if len(sys.argv) > 6 else []
pairs = ((0, 3), (1, 2)) if schedule == "ZBV" else ((0, 2), (1, 3))  # V-shaped, or looped
ranks = [StagePlan(index=r, layers=cut[a] + cut[b], chunks=[cut[a], cut[b]],
                   checkpointed=[name for name in cut[a] + cut[b] if name in full]) for r, (a, b) in enumerate(pairs)]
planned = {kind: costmodel.evaluate(ranks, io.load_profile(path), solved.setup).peak_bytes_per_stage
           for kind, path in paths.items()}
plan = solved.model_copy(update={"stages": with_predictions(ranks, costmodel.evaluate(
    ranks, io.load_profile(paths["measured"]), solved.setup))})
io.save_plan(plan, plan_path)
report = run_plan(io.load_plan(plan_path), plan_file=plan_path, steps=1, warmup_steps=1)
for s in report.stages:
    got = s.measured.peak_bytes
    print(f"{schedule} M {m} rank {s.index}: measured {got:,} planned measured-profile {planned['measured'][s.index]:,.0f}"
          f" ({planned['measured'][s.index] - got:+,.0f}) fake-profile {planned['fake'][s.index]:,.0f}"
          f" ({planned['fake'][s.index] - got:+,.0f})")
