"""ZeRO 1 on ckplan's runtime (torch's ZeroRedundancyOptimizer, gloo, CPU): a profile's pinned 2-stage splits at
dp 2, 1F1B, 4 microbatches, nothing recomputed, each launched RUNS times (2 steps, 1 warm-up), printing per stage the
planned peak and measured - planned (positive: under), and the planned and measured static.

    PYTHONPATH=$PWD python scripts/zero_one_runs.py OUT PROFILE CUT[,CUT...] RUNS

CUT: the first stage's layer count. OUT keeps the solved plan (its setup; the split is pinned as
scripts/pp_zero_splits.py pins it). Run it under the tree whose cost model is measured (a tree before the profile's
trained_param_numels field needs a profile made by that tree)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pp_zero_splits import cli, pinned  # noqa: E402


def main(out: Path, profile_path: Path, cuts: list[int], runs: int) -> None:
    from planner import io
    from planner.runtime.launcher import run_plan

    out.mkdir(parents=True, exist_ok=True)
    base = out / "zero1.yaml"
    cli("solve", "--profile", profile_path.resolve(), "--stages", "2", "--dp", "2", "--zero", "1", "--mem", "1GiB",
        "--microbatches", "4", "--schedule", "1F1B", "--out", base.resolve())
    profile = io.load_profile(profile_path)
    for cut in cuts:
        plan = pinned(io.load_plan(base), profile, cut)
        for run in range(runs):
            report = run_plan(plan, plan_file=base, steps=2, warmup_steps=1)
            print(f"cut {cut} run {run}:", [(s.predicted.peak_bytes, s.measured.peak_bytes - s.predicted.peak_bytes,
                                             s.predicted.static_bytes, s.measured.static_bytes)
                                            for s in report.stages], flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit("usage: zero_one_runs.py OUT PROFILE CUT[,CUT...] RUNS")
    main(Path(sys.argv[1]), Path(sys.argv[2]), [int(c) for c in sys.argv[3].split(",")], int(sys.argv[4]))
