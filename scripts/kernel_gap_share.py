"""What a device gap between back-to-back kernels would add to each published row (docs/published-runs.md §35.kgap):
the row's largest block-microbatch's device time as the cost model holds it (forward + backward of the row's largest
decoder or MoE block, `costmodel.layer_costs` of the profile `ckplan evaluate` builds for the row), a ceiling on the
kernels that block launches (given per row, counted by hand: §35.kgap says how), and the share a gap of each size would
add to it. The share is an upper bound of the step's growth: it takes every ms of the step as block time on the
device's critical path, with the host behind (where the host binds a pass, hosttime.py's floor, the gap is hidden).

    PYTHONPATH=$PWD python scripts/kernel_gap_share.py --rows E4=300,M11=150 --gap-us 0.58,1.3,6.3

Reads the harness's profiles (.published-rows/profiles, made by `published_rows.py profiles`). No device.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernel_gap_probe  # noqa: E402  (the probe beside this script: its arithmetic)
import published_rows  # noqa: E402  (the harness beside this script)


def parse_rows(text: str) -> dict[str, int]:
    """`ID=KERNELS,...` -> {id: kernels}; one sentence (ValueError) for anything else."""
    rows = {}
    for item in text.split(","):
        row, _, kernels = item.partition("=")
        if not row or not kernels.isdigit() or int(kernels) < 1:
            raise ValueError(
                f"--rows takes ID=KERNELS pairs (a positive kernel count), got {item!r}"
            )
        rows[row] = int(kernels)
    return rows


def parse_gaps(text: str) -> list[float]:
    try:
        gaps = [float(item) for item in text.split(",")]
    except ValueError:
        raise ValueError(f"--gap-us takes µs separated by commas, got {text!r}") from None
    if any(gap < 0 for gap in gaps):
        raise ValueError(f"--gap-us takes non-negative µs, got {text!r}")
    return gaps


def largest_block(profile) -> tuple[str, float]:
    """(kind, forward + backward ms) of the profile's largest block (a kind ending in "block")."""
    from planner.cost import costmodel

    blocks = [(layer.fwd_ms + layer.bwd_ms, layer.kind) for layer in costmodel.layer_costs(profile)]
    ms, kind = max(block for block in blocks if block[1].endswith("block"))
    return kind, ms


def line(row: str, gpu: str, kind: str, block_ms: float, kernels: int, gaps: list[float]) -> str:
    shares = " / ".join(
        f"{kernel_gap_probe.block_share(kernels, gap, block_ms):.1%}" for gap in gaps
    )
    return f"| {row} | {gpu} | {kind} | {block_ms:.3f} | {kernels} | {shares} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows", required=True, help="ID=KERNELS pairs: each row and its block's kernel ceiling"
    )
    parser.add_argument("--gap-us", default="0.58,1.3,6.3", help="gaps a kernel to price, µs")
    args = parser.parse_args(argv)
    try:
        rows, gaps = parse_rows(args.rows), parse_gaps(args.gap_us)
    except ValueError as exc:
        parser.error(str(exc))
    print(
        f"| row | GPU | block | block-microbatch device ms | kernels | share at {' / '.join(map(str, gaps))} µs |"
    )
    print("|---|---|---|---|---|---|")
    for row, kernels in rows.items():
        try:
            _, profile, _, _ = published_rows.capture_row(row, published_rows.WORK)
        except published_rows.HarnessError as exc:
            print(f"kernel_gap_share: {exc}", file=sys.stderr)
            return 2
        kind, ms = largest_block(profile)
        print(line(row, str(profile.assumptions.get("gpu")), kind, ms, kernels, gaps), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
