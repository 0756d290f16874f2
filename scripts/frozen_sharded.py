"""tests/fixtures/frozen_front.py at dp 2 under ZeRO 2 and 3, cut 0,1,2 | 3 and 0,1 | 2,3, launched on gloo: each stage's
planned / measured static and peak bytes (docs/published-runs.md §66.frozen3).

usage: PYTHONPATH=<checkout> python scripts/frozen_sharded.py WORKDIR [ZERO ...]
"""
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


def main(work: Path, zeros: list[int]) -> None:
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
        for cut in CUTS:
            stages = [StagePlan(index=i, layers=names) for i, names in enumerate(cut)]
            costs = costmodel.evaluate(stages, profile, solved.setup)
            path = work / f"z{zero}-{len(cut[0])}.yaml"
            io.save_plan(solved.model_copy(update={"stages": with_predictions(stages, costs)}), path)
            report = run_plan(io.load_plan(path), plan_file=path, steps=1, warmup_steps=0)
            for stage in report.stages:
                planned, measured = stage.predicted, stage.measured
                print(f"ZeRO {zero} cut {' | '.join(','.join(c) for c in cut)} stage {stage.index}: static "
                      f"{planned.static_bytes:,} / {measured.static_bytes:,}, peak {planned.peak_bytes:,} / "
                      f"{measured.peak_bytes:,} ({planned.peak_bytes - measured.peak_bytes:+,})", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), [int(z) for z in sys.argv[2:]] or [2, 3])
