"""ZeRO 1 on ckplan's runtime under a chunked schedule (gloo, CPU): 2 ranks x 2 chunks at dp 2, M 4, nothing recomputed,
the four stages pinned at CUTS (the profile's layer counts before stages 1, 2 and 3), each launched RUNS times (2
steps, 1 warm-up), printing per rank the planned static, measured - planned static, the planned peak and measured -
planned peak (positive: under).

    PYTHONPATH=$PWD python scripts/zero_one_chunks.py OUT PROFILE SCHEDULE CUTS[;CUTS...] RUNS [ZERO]

CUTS: e.g. 2-3-4 ([embed, blocks.0] | [blocks.1] | [blocks.2] | [blocks.3, head] on the GPT fixtures). ZERO: 1 unless
given. OUT keeps the solved plan (its setup). docs/published-runs.md §69.zeroonechunk."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pp_zero_splits import cli  # noqa: E402


def pinned(plan, profile, cuts: list[int]):
    """The plan's ranks holding the stages cut at `cuts`, as the schedule places them, each predicted by evaluate."""
    from planner.cost import costmodel
    from planner.schema import StagePlan

    names = [layer.name for layer in profile.layers]
    bounds = [0, *cuts, len(names)]
    stages = [names[a:b] for a, b in zip(bounds, bounds[1:])]
    order = costmodel.schedule_of(plan.setup)
    ranks = [StagePlan(index=rank, layers=[n for k in order.stages_of(rank) for n in stages[k]],
                       chunks=[stages[k] for k in order.stages_of(rank)]) for rank in range(order.num_ranks)]
    cost = costmodel.evaluate(ranks, profile, plan.setup)
    return plan.model_copy(update={"stages": [rank.model_copy(update={"predicted": c.predicted()})
                                              for rank, c in zip(ranks, cost.stages)]})


def main(out: Path, profile_path: Path, schedule: str, cutsets: list[list[int]], runs: int, zero: int) -> None:
    from planner import io
    from planner.runtime.launcher import run_plan

    out.mkdir(parents=True, exist_ok=True)
    base = out / f"zero{zero}-{schedule}.yaml"
    cli("solve", "--profile", profile_path.resolve(), "--stages", "2", "--dp", "2", "--zero", zero, "--mem", "1GiB",
        "--microbatches", "4", "--schedule", schedule, "--chunks", "2", "--out", base.resolve())
    profile = io.load_profile(profile_path)
    for cuts in cutsets:
        plan = pinned(io.load_plan(base), profile, cuts)
        for run in range(runs):
            report = run_plan(plan, plan_file=base, steps=2, warmup_steps=1)
            print(schedule, "-".join(map(str, cuts)), f"run {run}:",
                  [(s.predicted.static_bytes, s.measured.static_bytes - s.predicted.static_bytes,
                    s.predicted.peak_bytes, s.measured.peak_bytes - s.predicted.peak_bytes) for s in report.stages],
                  flush=True)


if __name__ == "__main__":
    if len(sys.argv) not in (6, 7):
        sys.exit("usage: zero_one_chunks.py OUT PROFILE SCHEDULE CUTS[;CUTS...] RUNS [ZERO]")
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3],
         [[int(c) for c in cuts.split("-")] for cuts in sys.argv[4].split(";")], int(sys.argv[5]),
         int(sys.argv[6]) if len(sys.argv) == 7 else 1)
