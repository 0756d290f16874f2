"""One pipeline step on ckplan's own runtime (gloo, CPU) with the layers cut by hand, measured beside evaluate's
prediction per stage (docs/published-runs.md §66.gpipehead: GPipe's head-alone stage).

    python scripts/fixed_cut_run.py WORK MODEL M SCHEDULE CUT    # e.g. /tmp/x tests/fixtures/shared_input.py 4 GPipe 3

Profiles MODEL once into WORK (4 samples a microbatch), solves two stages for the setup (100 MiB, SCHEDULE, M
microbatches), replaces the stages by layers [0, CUT) | [CUT, end) with nothing recomputed, predicts them with
costmodel.evaluate and prints one JSON line: per stage [measured, predicted] peak bytes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from click.testing import CliRunner

from planner import io
from planner.cli import cli
from planner.cost import costmodel
from planner.runtime.launcher import run_plan
from planner.schema import StagePlan


def _ckplan(*args) -> None:
    result = CliRunner().invoke(cli, [str(arg) for arg in args])
    if result.exit_code != 0:
        sys.exit(result.output)


def main(work: Path, model: Path, microbatches: int, schedule: str, cut: int) -> None:
    work.mkdir(parents=True, exist_ok=True)
    profile_path, plan_path = work / "profile.json", work / f"plan_{schedule}_{microbatches}_{cut}.yaml"
    if not profile_path.exists():
        _ckplan("profile", model, "--micro-batch-size", 4, "--threads", 1, "--repeats", 1, "--warmup", 1,
                "--out", profile_path)
    _ckplan("solve", "--profile", profile_path, "--stages", 2, "--mem", "100MiB", "--microbatches", microbatches,
            "--schedule", schedule, "--out", plan_path)
    plan, profile = io.load_plan(plan_path), io.load_profile(profile_path)
    names = [layer.name for layer in profile.layers]
    stages = [StagePlan(index=0, layers=names[:cut]), StagePlan(index=1, layers=names[cut:])]
    cost = costmodel.evaluate(stages, profile, plan.setup)
    plan = plan.model_copy(update={"stages": [stage.model_copy(update={"predicted": c.predicted()})
                                              for stage, c in zip(stages, cost.stages)]})
    io.write_atomic(plan_path, io.plan_to_yaml(plan))
    report = run_plan(plan, plan_file=plan_path, steps=1, warmup_steps=1)
    print(json.dumps({"schedule": schedule, "microbatches": microbatches, "cut": cut,
                      "measured_predicted": [[s.measured.peak_bytes, s.predicted.peak_bytes] for s in report.stages]}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
