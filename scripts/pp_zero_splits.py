"""Every contiguous 2-stage split of the tied and untied GPT fixtures on ckplan's runtime at ZeRO 2 and 3 beside
a 1F1B pipeline (gloo, 2 stages x dp 2 = 4 processes, 2 microbatches, 1 GiB caps): each stage's worst rank's
measured peak against its prediction, the split pinned as tests/test_zero3pp.py pins it (docs/published-runs.md
§41.zero3split).

    PYTHONPATH=$PWD python scripts/pp_zero_splits.py OUT [FIXTURE:ZERO:CUT ...]

CUT: the first stage's layer count. OUT keeps the profiles and plans (made once)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cli(*args) -> None:
    subprocess.run([sys.executable, "-m", "planner.cli", *map(str, args)], check=True, capture_output=True, cwd=ROOT)


def pinned(plan, profile, cut: int):
    from planner.cost import costmodel
    from planner.schema import StagePlan

    names = [layer.name for layer in profile.layers]
    stages = [StagePlan(index=0, layers=names[:cut]), StagePlan(index=1, layers=names[cut:])]
    cost = costmodel.evaluate(stages, profile, plan.setup)
    return plan.model_copy(update={"stages": [stage.model_copy(update={"predicted": c.predicted()})
                                              for stage, c in zip(stages, cost.stages)]})


def main(out: Path, wanted: list[str]) -> None:
    from planner import io
    from planner.runtime.launcher import run_plan

    out.mkdir(parents=True, exist_ok=True)
    for fixture in ("tied", "untied"):
        profile_path = out / f"{fixture}.json"
        if not profile_path.exists():
            cli("profile", ROOT / "tests" / "fixtures" / f"{fixture}_gpt.py", "--micro-batch-size", "2", "--threads",
                "1", "--repeats", "1", "--warmup", "1", "--out", profile_path)
        profile = io.load_profile(profile_path)
        for zero in (2, 3):
            base = out / f"{fixture}_{zero}.yaml"
            if not base.exists():
                cli("solve", "--profile", profile_path, "--stages", "2", "--dp", "2", "--zero", zero, "--mem", "1GiB",
                    "--microbatches", "2", "--schedule", "1F1B", "--out", base)
            for cut in range(1, len(profile.layers)):
                key = f"{fixture}:{zero}:{cut}"
                if wanted and key not in wanted:
                    continue
                report = run_plan(pinned(io.load_plan(base), profile, cut), plan_file=base, steps=1, warmup_steps=1)
                rows = [(s.measured.peak_bytes, s.predicted.peak_bytes) for s in report.stages]
                print(key, [(measured, predicted, measured - predicted) for measured, predicted in rows], flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
