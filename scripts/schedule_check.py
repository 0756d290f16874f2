#!/usr/bin/env python3
"""Where a launched pipeline's time went: the schedule's simulation run on the actions' own
measured times, beside the measured iteration and the plan's prediction.

    python scripts/schedule_check.py PLAN.yaml RUN.json [RUN2.json ...]

For each run report of PLAN (`ckplan launch PLAN --report RUN.json`, which records every chunk's
F, B or I, and W medians): per pipeline stage, the cost model's forward and backward (what the
plan's iteration was simulated with: a split backward's input and weight passes as
score.plan_iteration_ms takes them, splittime.split_pass_ms) against the measured F, I and W; then the iteration three ways: measured, simulated from the
measured actions (schedule_time.simulate_time on torch's order, plus the slowest rank's
measured optimizer step), and predicted. Measured ≈ simulated-from-measured means the schedule's
order and bubble are right and any miss is in the actions' predicted times; measured far below it
means the ranks overlapped what the simulation serialises (or the reverse).

Run from the folder the plan was made in (its profile's path is relative to it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner import io  # noqa: E402
from planner.cost import schedule_time, splittime  # noqa: E402
from planner.cost.assembly import stage_sums  # noqa: E402
from planner.cost.chunked import schedule_of, stages_view  # noqa: E402
from planner.cost.score import placed_chunks  # noqa: E402


def predicted_stage_times(plan) -> list[tuple[float, float, float]]:
    """Per pipeline stage, (forward, I, W) ms as score.plan_iteration_ms simulates them (a full
    backward's halves where the schedule does not split it)."""
    profile = io.load_profile(plan.profile.file)
    order = schedule_of(plan.setup)
    view = stages_view(plan.setup, order)
    chunks = placed_chunks(plan.stages, profile, order)
    sums = [stage_sums(layers, options, stage=k, profile=profile, setup=view) for k, (layers, options) in enumerate(chunks)]
    found = []
    for k, (s, (layers, options)) in enumerate(zip(sums, chunks)):
        forward = s.forward_ms + s.comm_ms / 2
        backward = max(s.busy_ms - forward, 0.0)
        halves = (backward / 2, backward / 2)
        if order.splits_backward:
            halves = splittime.split_pass_ms(backward, splittime.stage_split(layers, options, plan.setup), stage=k)
        found.append((forward, *halves))
    return found


def measured_stage_times(report) -> dict[int, tuple[float, float, float]]:
    """Per pipeline stage, (F, B or I, W) ms from the report's chunks."""
    found = {chunk.stage: (chunk.fwd_ms, chunk.bwd_ms, chunk.weight_grad_ms)
             for stage in report.stages for chunk in stage.measured.chunks}
    if not found:
        raise SystemExit("schedule_check: the report records no chunk times (a launch before they were recorded)")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plan", type=Path)
    parser.add_argument("reports", type=Path, nargs="+")
    a = parser.parse_args()
    plan = io.load_plan(a.plan)
    order = schedule_of(plan.setup)
    predicted = predicted_stage_times(plan)
    print(f"{a.plan}: {order.name}, {order.num_ranks} ranks x {order.num_chunks} chunks, "
          f"{order.num_microbatches} microbatches")
    for path in a.reports:
        report = io.load_report(path)
        measured = measured_stage_times(report)
        print(f"\n{path} (median of {report.steps} steps: {', '.join(f'{t:.0f}' for t in report.iteration_ms_all)} ms)")
        print(f"{'stage':>5} {'pred F':>9} {'pred I':>9} {'pred W':>9} {'F':>9} {'B or I':>9} {'W':>9} "
              f"{'F/pred F':>9} {'(I+W)/pred B':>13}")
        for k, (fwd, pred_i, pred_w) in enumerate(predicted):
            f, i, w = measured[k]
            bwd = pred_i + pred_w
            print(f"{k:>5} {fwd:9.1f} {pred_i:9.1f} {pred_w:9.1f} {f:9.1f} {i:9.1f} {w:9.1f} {f / fwd if fwd else 0:9.3f} "
                  f"{(i + w) / bwd if bwd else 0:13.3f}")
        split = order.splits_backward
        times = [schedule_time.StageTimes(f, i if split else i / 2, w if split else i / 2)
                 for f, i, w in (measured[k] for k in range(order.num_stages))]
        steps = max(stage.measured.step_ms or 0.0 for stage in report.stages)
        simulated = schedule_time.simulate_time(order, stage_times=times) if order.actions else None
        from_measured = (simulated.makespan_ms if simulated else
                         schedule_time.makespan_ms(order, stage_times=times)) + steps
        print(f"iteration: measured {report.iteration_ms:.0f} ms; simulated from the measured actions "
              f"{from_measured:.0f} ms (measured/simulated {report.iteration_ms / from_measured:.3f}); predicted "
              f"{report.predicted_iteration_ms:.0f} ms (measured/predicted {report.iteration_ms / report.predicted_iteration_ms:.3f})")
        if simulated:
            print("  simulated bubble per rank: " + ", ".join(f"{b:.3f}" for b in simulated.bubble_fraction))


if __name__ == "__main__":
    main()
