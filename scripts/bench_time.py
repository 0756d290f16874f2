"""Timing benchmark: how close the cost model's time prediction is to the run, before and
after `ckplan calibrate`, per stage and per iteration.

For each model (the bundled GPT and MLP, and scripts/models/mixer.py, which the tests
never use): profile with one thread per rank; solve 2 stages (ranks <= cores) at a cap
half-way between what full checkpointing and no checkpointing need; calibrate that plan;
solve again (now calibrated) and launch it: per-stage compute and iteration, measured
against the prediction before and after calibration. Then, for the GPT, 4 stages on the
machine's cores (more ranks than cores when it has 2): calibrate that plan too (the action
cost kept from the 2-stage calibration, the core sharing fitted), solve, launch.

The calibrating run and the launch are separate runs: the error after calibration is how
well one run's constants predict the next one on the same machine. Load averages are
printed with each launch; on a shared machine the noise is tens of percent.

    .venv/bin/python scripts/bench_time.py [--models gpt,mlp,mixer] [--steps 6] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner import io  # noqa: E402
from planner.cost import costmodel  # noqa: E402
from planner.measure import calibrate  # noqa: E402
from planner.schema import TrainSetup  # noqa: E402
from planner.solve import baselines  # noqa: E402

MODELS = {"gpt": ROOT / "configs/models/gpt.py", "mlp": ROOT / "configs/models/mlp.py",
          "mixer": ROOT / "scripts/models/mixer.py"}
CKPLAN = str(Path(sys.executable).parent / "ckplan")


def ck(*args: str) -> str:
    done = subprocess.run([CKPLAN, *args], capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"ckplan {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout + done.stderr


def middle_cap(profile, stages: int) -> str:
    """Half-way between the largest stage need of full and of no checkpointing (even splits)."""
    roomy = TrainSetup(stages=stages, microbatches=2 * stages, micro_batch_size=profile.micro_batch_size,
                       mem_caps_bytes=[2**50] * stages)
    full = max(costmodel.evaluate(baselines.full_checkpointing(profile, roomy), profile, roomy).peak_bytes_per_stage)
    none = max(costmodel.evaluate(baselines.no_checkpointing(profile, roomy), profile, roomy).peak_bytes_per_stage)
    return f"{(full + (none - full) // 2) // 2**20}MiB"


def measure(name: str, profile_path: Path, plan_path: Path, report_path: Path, steps: int) -> dict:
    """Launch the (calibrated) plan; per stage and iteration: measured, predicted after and before."""
    load_before = os.getloadavg()[0]
    ck("launch", str(plan_path), "--steps", str(steps), "--warmup-steps", "2", "--report", str(report_path))
    plan, profile, report = io.load_plan(plan_path), io.load_profile(profile_path), io.load_report(report_path)
    before = costmodel.evaluate(plan.stages, profile, calibrate.uncalibrated(plan.setup))
    after = costmodel.evaluate(plan.stages, profile, plan.setup)
    spread = (max(report.iteration_ms_all) - min(report.iteration_ms_all)) / report.iteration_ms
    return {
        "case": name, "load": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "calibration": plan.setup.time.calibration,
        "stages": [{"measured_ms": s.measured.time_ms, "after_ms": a.time_ms, "before_ms": b.time_ms}
                   for s, a, b in zip(report.stages, after.stages, before.stages, strict=True)],
        "iteration": {"measured_ms": report.iteration_ms, "after_ms": after.iteration_ms,
                      "before_ms": before.iteration_ms, "step_spread": spread},
    }


def calibrated_case(model: str, work: Path, stages: int, steps: int, profile_path: Path) -> dict:
    profile = io.load_profile(profile_path)
    cap = middle_cap(profile, stages)
    first, second = work / f"{model}-{stages}.yaml", work / f"{model}-{stages}-calibrated.yaml"
    ck("solve", "--profile", str(profile_path), "--mem", cap, "--stages", str(stages), "--out", str(first))
    ck("calibrate", str(first), "--steps", "4", "--warmup-steps", "2")
    ck("solve", "--profile", str(profile_path), "--mem", cap, "--stages", str(stages), "--out", str(second))
    return measure(f"{model}, {stages} stages, {cap}", profile_path, second, work / f"{model}-{stages}.json", steps)


def err(measured: float, predicted: float) -> str:
    return f"{(measured - predicted) / predicted * 100:+.1f}%"


def show(result: dict) -> None:
    print(f"\n{result['case']}  (load {result['load'][0]} -> {result['load'][1]}; {result['calibration']})")
    for index, stage in enumerate(result["stages"]):
        print(f"  stage {index}: measured {stage['measured_ms']:8.1f} ms   after {stage['after_ms']:8.1f} "
              f"({err(stage['measured_ms'], stage['after_ms'])})   before {stage['before_ms']:8.1f} "
              f"({err(stage['measured_ms'], stage['before_ms'])})")
    it = result["iteration"]
    print(f"  iteration: measured {it['measured_ms']:8.1f} ms   after {it['after_ms']:8.1f} "
          f"({err(it['measured_ms'], it['after_ms'])})   before {it['before_ms']:8.1f} "
          f"({err(it['measured_ms'], it['before_ms'])})   steps spread {it['step_spread'] * 100:.0f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt,mlp,mixer")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results = []
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="ckplan-bench-time-") as scratch:
        work = Path(scratch)
        for model in args.models.split(","):
            profile_path = work / f"{model}.json"
            ck("profile", str(MODELS[model]), "--threads", "1", "--repeats", "3", "--out", str(profile_path))
            results.append(calibrated_case(model, work, min(2, cores), args.steps, profile_path))
            show(results[-1])
            if model == "gpt":
                results.append(calibrated_case(model, work, 4, args.steps, profile_path))
                show(results[-1])
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
