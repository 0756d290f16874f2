"""Per-rank peak in-flight activations and the bubble of every schedule, from torch's own
action lists (planner/cost/schedules.py).

In-flight counts are in layer-range microbatches: one microbatch's activations of L/P layers
(what a 1F1B stage keeps per microbatch), so a chunk of a V-chunk schedule counts 1/V.
"act" is what the input-gradient pass frees (B or I); "until W" also counts the microbatches
whose weight gradient has not run (what a zero-bubble schedule keeps for W); the two agree
for schedules without a split backward. The bubble is the mean idle share per rank with a
layer range's F = 1, I = W = 1 (B = 2), no send time. "Megatron" is the interleaved closed
form, ((P - r - 1)·2 + (V - 1)·P + 1) / V, capped at M.

    .venv/bin/python scripts/bench_schedules.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.cost.schedule_time import StageTimes, simulate_time  # noqa: E402
from planner.cost.schedules import (  # noqa: E402
    SCHEDULES,
    ChunkBytes,
    build_schedule,
    peak_in_flight,
)
from planner.errors import UserError  # noqa: E402

V = 2


def chunks_of(name: str) -> int:
    return 1 if name in ("1F1B", "GPipe") else V


def fmt(counts, num_chunks: int) -> str:
    return " ".join(f"{c / num_chunks:g}" for c in counts)


def megatron(P: int, M: int) -> list[float]:
    return [min((P - r - 1) * 2 + (V - 1) * P + 1, M * V) / V for r in range(P)]


def row(name: str, P: int, M: int) -> str:
    num_chunks = chunks_of(name)
    try:
        schedule = build_schedule(name, num_ranks=P, num_microbatches=M, num_chunks=num_chunks)
    except UserError as exc:
        return f"{name:<17} {num_chunks}  refused: {exc}"
    act = [peak.activations for peak in peak_in_flight(schedule)]
    held = [ChunkBytes(freed_at_input_grad=0.0, kept_for_weight_grad=1.0)] * schedule.num_stages
    until_w = [peak.weight_grad_inputs for peak in peak_in_flight(schedule, stage_bytes=held)]
    per_chunk = 1 / num_chunks
    times = [StageTimes(per_chunk, per_chunk, per_chunk)] * schedule.num_stages
    bubble = simulate_time(schedule, stage_times=times).mean_bubble_fraction
    closed = " ".join(f"{c:g}" for c in megatron(P, M)) if name == "interleaved-1F1B" else ""
    return (f"{name:<17} {num_chunks}  {bubble:6.3f}  act: {fmt(act, num_chunks):<34}"
            f" until W: {fmt(until_w, num_chunks):<34} {closed}")


def main() -> None:
    for P in (4, 8):
        for M in (8, 16):
            print(f"\nP={P} M={M}   (per rank 0..P-1, layer-range microbatches)")
            print(f"{'schedule':<17} V  bubble  {'act':<39} {'until W':<43} Megatron")
            for name in SCHEDULES:
                print(row(name, P, M))


if __name__ == "__main__":
    main()
