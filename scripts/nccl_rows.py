"""Each row's NCCL buffers and fit verdict in two harness folders (scripts/published_rows.py run --out), before and
after: the workspace of the rank with the most, the ranks that do not fit, and the after folder's buffers by
communicator on that rank (planner/cost/nccl_buffers.py). Usage: scripts/nccl_rows.py BEFORE AFTER."""

from __future__ import annotations

import json
import sys
from pathlib import Path

GIB = 1 << 30
MIB = 1 << 20


def _row(path: Path) -> dict:
    return json.loads(path.read_text())


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write("usage: scripts/nccl_rows.py BEFORE AFTER (two folders of published_rows.py run)\n")
        return 2
    before, after = (Path(a) for a in argv)
    print("| row | NCCL, GiB, most on a rank (before → after) | ranks not fitting (before → after) | "
          "feasible (before → after) | after, that rank's communicators (MiB) |")
    print("|---|---|---|---|---|")
    for path in sorted(after.glob("*.json")):
        if not (before / path.name).exists():
            continue
        b, a = _row(before / path.name), _row(path)
        wb = max(s["workspace_bytes"] for s in b["stages"])
        top = max(a["stages"], key=lambda s: s["workspace_bytes"])
        nb = sum(not s["fits"] for s in b["stages"])
        na = sum(not s["fits"] for s in a["stages"])
        comms = ", ".join(f"{k} {v / MIB:.0f}" for k, v in top.get("nccl_buffers", {}).items())
        print(f"| {a['id']} | {wb / GIB:.2f} → {top['workspace_bytes'] / GIB:.2f} | {nb} → {na} of {len(a['stages'])} "
              f"| {b['feasible']} → {a['feasible']} | {comms} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
