"""Static and peak memory per rank, predicted vs measured, for every ZeRO stage and shard group.

Profiles a model once, then for ZeRO 0 and ZeRO 1-3 x shard group 2, 4 (dp 4): `ckplan
solve --dp 4 --zero Z --shard-group K` and `ckplan launch`'s runtime (stages x 4 gloo
processes on this CPU, one timed step), and prints each stage's static bytes (weights +
gradients + optimizer state on one rank, the most it holds at once in a step) next to the
plan's prediction (which, where FSDP2 keeps a stage's weights gathered — ZeRO 2; ZeRO 3
per iteration — includes FSDP2's own 1/K shard of them, kept beside).

    .venv/bin/python scripts/bench_dp_static.py [--model configs/models/mlp.py] [--stages 2] [--offload]
        [--zero-gather per-microbatch|per-iteration]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner import io  # noqa: E402
from planner.console import console, table  # noqa: E402
from planner.runtime.launcher import run_plan  # noqa: E402
from planner.units import format_bytes  # noqa: E402

CKPLAN = str(ROOT / ".venv/bin/ckplan")
CASES = [(0, 1), *((zero, k) for zero in (1, 2, 3) for k in (2, 4))]  # solve refuses ZeRO over a group of 1


def solve(profile: Path, out: Path, *, stages: int, dp: int, zero: int, shard_group: int, offload: bool,
          zero_gather: str) -> Path:
    args = [CKPLAN, "solve", "--profile", str(profile), "--stages", str(stages), "--mem", "64GB", "--dp", str(dp),
            "--zero", str(zero), "--zero-gather", zero_gather, "--out", str(out)]
    args += ["--shard-group", str(shard_group)] if zero else []
    subprocess.run(args + (["--offload-optimizer", "--host-mem", "64GB"] if offload else []), check=True,
                   capture_output=True, cwd=ROOT)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="configs/models/mlp.py")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--dp", type=int, default=4)
    parser.add_argument("--offload", action="store_true")
    parser.add_argument("--zero-gather", choices=["per-microbatch", "per-iteration"], default="per-microbatch")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ckplan-dp-") as tmp:
        profile = Path(tmp) / "profile.json"
        subprocess.run([CKPLAN, "profile", args.model, "--micro-batch-size", "1", "--threads", "1", "--repeats", "2",
                        "--out", str(profile)], check=True, capture_output=True, cwd=ROOT)
        for zero, k in CASES:
            path = solve(profile, Path(tmp) / f"plan-z{zero}-k{k}.yaml", stages=args.stages, dp=args.dp, zero=zero,
                         shard_group=k, offload=args.offload, zero_gather=args.zero_gather)
            plan = io.load_plan(path)
            report = run_plan(plan, plan_file=path, steps=1, warmup_steps=0)
            for stage in report.stages:
                predicted, measured = stage.predicted.static_bytes, stage.measured.static_bytes
                rows.append([str(zero), str(k), str(stage.index), format_bytes(predicted), format_bytes(measured),
                             _err(measured, predicted), format_bytes(stage.predicted.peak_bytes),
                             format_bytes(stage.measured.peak_bytes),
                             _err(stage.measured.peak_bytes, stage.predicted.peak_bytes),
                             format_bytes(stage.measured.host_bytes)])
            console.print(f"ZeRO {zero}, shard group {k}: done", style="dim")
    title = (f"{args.model}: static bytes per rank, {args.stages} stages x dp {args.dp}, ZeRO 2/3 {args.zero_gather}"
             f"{' (optimizer offloaded)' if args.offload else ''}")
    columns = ["ZeRO", "shard group", "stage", "static predicted", "measured", "err", "peak predicted", "measured",
               "err", "host"]
    console.print(table(title, columns, rows))


def _err(measured: float, predicted: float) -> str:
    return f"{(measured - predicted) / predicted * 100:+.2f}%"


if __name__ == "__main__":
    main()
