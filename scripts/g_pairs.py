"""The Megatron-LM functional-test rows held against their own pairs (issue 35, docs/published-runs.md §39.gpair).

    python scripts/g_pairs.py schedule           # G1 (1F1B, 2/4/4/2) against G2 (interleaved, a layer a chunk)
    python scripts/g_pairs.py rows BEFORE AFTER  # the same config on H100, GB200 and A100: published and ckplan

`schedule` plays both on ckplan's own schedules (planner/cost/schedule_time.py) with a block-microbatch of b and
the head and loss of h on the last stage (each split 1:2 forward to backward; the embedding, the sends and the
step left out, each of which lowers G1/G2): the ratio G1/G2 as h/b grows, ckplan's own b and h, and the (b, h) the
published steps ask. `rows` reads the harness's result files (scripts/published_rows.py run --out DIR) and
scripts/published_rows.toml's published steps; for each H100/GB200 pair, the most of the H100 step that can be
the host's issue when GB200's host issues the same work 2.751x slower (TE#2053: a torch Linear 37.08 µs on Grace,
13.48 on the DGX H100's Xeon) and its device runs it `g` times faster: (ratio − 1/g) / (2.751 − 1/g)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import tomllib

HOST_RATIO = 37.08 / 13.48  # GB200's host against the DGX H100's (TE#2053), planner/models/gpus.py's host_call_us
DEVICE_SPEEDUP = 8.0 / 3.35  # GB200's HBM over the H100 SXM's (the smaller of HBM and BF16 peak, 2500 / 989.4)
GB200_PAIRS = (("G1", "G33"), ("G2", "G25"), ("G3", "G34"), ("G4", "G35"), ("G5", "G36"), ("G6", "G37"),
               ("G7", "G38"), ("G8", "G39"), ("G10", "G40"), ("G11", "G19"), ("G12", "G20"), ("G13", "G21"),
               ("G14", "G41"), ("G15", "G22"), ("G16", "G23"), ("G17", "G42"), ("G18", "G24"))
A100_PAIRS = (("G11", "G26"), ("G12", "G27"), ("G13", "G28"), ("G15", "G29"), ("G16", "G30"), ("G18", "G31"),
              ("G2", "G32"))


def host_share_at_most(ratio: float, *, host: float = HOST_RATIO, device: float = DEVICE_SPEEDUP) -> float:
    """The most of the H100 step that can be host issue, given the GB200 step / the H100 step (`ratio`): the step
    D + H on the H100 is D / device + host · H on GB200."""
    return (ratio - 1 / device) / (host - 1 / device)


def _times(ms: float):
    from planner.cost.schedule_time import StageTimes

    return StageTimes(ms / 3, 2 * ms / 3, 0.0)


def g1_ms(b: float, h: float) -> float:
    """G1's step: 1F1B over 4 ranks of 2/4/4/2 blocks, 4 microbatches, the head and loss on the last."""
    from planner.cost.schedule_time import simulate_time
    from planner.cost.schedules import build_schedule

    stages = [_times(2 * b), _times(4 * b), _times(4 * b), _times(2 * b + h)]
    return simulate_time(build_schedule("1F1B", num_ranks=4, num_microbatches=4), stage_times=stages).makespan_ms


def g2_ms(b: float, h: float) -> float:
    """G2's step: interleaved 1F1B over 4 ranks, 3 chunks of one block each, 4 microbatches, the head and loss on
    the last chunk."""
    from planner.cost.schedule_time import simulate_time
    from planner.cost.schedules import build_schedule

    schedule = build_schedule("interleaved-1F1B", num_ranks=4, num_microbatches=4, num_chunks=3)
    stages = [_times(b + (h if stage == 11 else 0.0)) for stage in range(12)]
    return simulate_time(schedule, stage_times=stages).makespan_ms


def asked(g1_published_ms: float, g2_published_ms: float) -> tuple[float, float, float]:
    """(b, h, G1 left over) the published pair asks: h / b bisected to the published ratio where a head can reach
    it, else h 0 and G1's step beyond what equal blocks allow."""
    target, lo, hi = g1_published_ms / g2_published_ms, 0.0, 8.0
    if g1_ms(1, 0) / g2_ms(1, 0) < target:
        b = g2_published_ms / g2_ms(1, 0)
        return b, 0.0, g1_published_ms - g1_ms(b, 0)
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if g1_ms(1, mid) / g2_ms(1, mid) > target else (lo, mid)
    b = g2_published_ms / g2_ms(1, lo)
    return b, lo * b, g1_published_ms - g1_ms(b, lo * b)


def schedule_report() -> None:
    print("| head and loss h / block-microbatch b | G1 / G2 on ckplan's schedules |")
    print("|---|---|")
    for h in (0, 0.25, 0.5, 1, 2, 3.29, 5.75):
        print(f"| {h} | {g1_ms(1, h) / g2_ms(1, h):.3f} |")
    for label, g1, g2 in (("H100 (G1, G2)", 144.1, 91.8), ("GB200 (G33, G25)", 126.8, 106.0)):
        b, h, left = asked(g1, g2)
        print(f"{label}: published {g1} / {g2} ms = {g1 / g2:.3f}: b {b:.2f} ms, h {h:.2f} ms, G1 left {left:.1f} ms")


def rows_report(before: Path, after: Path) -> None:
    rows = {r["id"]: r for r in tomllib.loads(Path("scripts/published_rows.toml").read_text())["row"]}

    def step(folder: Path, row: str) -> float:
        return json.loads((folder / f"{row}.json").read_text())["iteration_s"]

    print("| H100 / GB200 | published s | published ratio | ckplan ratio before | after | host share of the H100 "
          f"step at most: device x{DEVICE_SPEEDUP:.2f} | device infinitely faster |")
    print("|---|---|---|---|---|---|---|")
    for h100, other in GB200_PAIRS:
        ph, po = rows[h100]["time_s"], rows[other]["time_s"]
        print(f"| {h100} / {other} | {ph} / {po} | {po / ph:.3f} | {step(before, other) / step(before, h100):.3f} | "
              f"{step(after, other) / step(after, h100):.3f} | {host_share_at_most(po / ph):.2f} | "
              f"{po / ph / HOST_RATIO:.2f} |")
    print("\n| H100 / A100 | published s | published ratio | ckplan ratio before | after |\n|---|---|---|---|---|")
    for h100, other in A100_PAIRS:
        ph, po = rows[h100]["time_s"], rows[other]["time_s"]
        print(f"| {h100} / {other} | {ph} / {po} | {po / ph:.3f} | {step(before, other) / step(before, h100):.3f} | "
              f"{step(after, other) / step(after, h100):.3f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("schedule")
    rows = sub.add_parser("rows")
    rows.add_argument("before", type=Path)
    rows.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    if args.command == "schedule":
        schedule_report()
        return 0
    missing = [str(d) for d in (args.before, args.after) if not d.is_dir()]
    if missing:
        print(f"no such folder of row results: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        rows_report(args.before, args.after)
    except FileNotFoundError as error:
        print(f"a G row's result is missing: {error.filename} (run scripts/published_rows.py run --only G1,...,G43)",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
