"""Which terms moved each row between two `published_rows.py run` folders: per row, the rank its memory is scored on
(scripts/published_rows_table.py: the last rank for Megatron-LM's functional tests, the rank with the largest
allocated peak where an allocated peak is published, else the worst reserved rank; the same rank in both), in MiB:
the allocated peak's change and its parts (static, activations in flight, transient, buffers), what is left of it
(the cuBLAS workspaces and the other rank-wide terms), and the reserved peak's change.

    python scripts/published_rows_deltas.py BEFORE AFTER [--only T15,T16]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MIB = 2**20
PARTS = ("static_bytes", "activation_bytes", "transient_bytes", "buffer_bytes")


def scored_rank(result: dict, row: str) -> int:
    """The index of the stage the table scores (published_rows_table.memory_of), by the row's kind."""
    stages = result["stages"]
    if row in {"T15", "T16", "T17", "T18", "T19", "T20", "M19"}:
        pick = len(stages) - 1 if row != "M19" else max(range(len(stages)), key=lambda i: stages[i]["peak_bytes"])
        return pick
    return max(range(len(stages)), key=lambda i: stages[i]["reserved_bytes"])


def deltas(before: dict, after: dict, row: str) -> str:
    rank = scored_rank(after, row)
    old, new = before["stages"][rank], after["stages"][rank]
    moved = {part: (new[part] - old[part]) / MIB for part in PARTS}
    peak = (new["peak_bytes"] - old["peak_bytes"]) / MIB
    rest = peak - sum(moved.values())
    cells = " | ".join(f"{moved[p]:+.1f}" for p in PARTS)
    return (f"| {row} | {rank} | {old['peak_bytes'] / 2**30:.2f} → {new['peak_bytes'] / 2**30:.2f} | {peak:+.1f} | "
            f"{cells} | {rest:+.1f} | {(new['reserved_bytes'] - old['reserved_bytes']) / MIB:+.1f} |")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--only", default=None)
    args = parser.parse_args(argv)
    rows = sorted(p.stem for p in args.after.glob("*.json") if (args.before / p.name).exists())
    if args.only:
        rows = [r for r in rows if r in set(args.only.split(","))]
    print("| row | rank | allocated peak, GiB | Δ peak, MiB | Δ static | Δ activations | Δ transient | Δ buffers | "
          "Δ rest (cuBLAS, step end) | Δ reserved |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        before, after = (json.loads((folder / f"{row}.json").read_text()) for folder in (args.before, args.after))
        print(deltas(before, after, row))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
