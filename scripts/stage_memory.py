"""Per rank's static, allocated peak and reserved peak of one published row, before -> after: two result
folders of `published_rows.py run` (their ROW.json files), in GB (1e9 B), e.g.
    python scripts/stage_memory.py T24 /tmp/before /tmp/after"""

from __future__ import annotations

import json
import sys
from pathlib import Path

KEYS = ("static_bytes", "peak_bytes", "reserved_bytes", "step_scratch_bytes")


def main(row: str, before: str, after: str) -> None:
    old, new = (json.loads((Path(folder) / f"{row}.json").read_text())["stages"] for folder in (before, after))
    print("| rank | " + " | ".join(key.removesuffix("_bytes") + " GB" for key in KEYS) + " |")
    print("|---" * (len(KEYS) + 1) + "|")
    for was, now in zip(old, new):
        cells = [f"{(was[key] or 0) / 1e9:.2f} → {(now[key] or 0) / 1e9:.2f}" for key in KEYS]
        print(f"| {now['index']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: stage_memory.py ROW BEFORE_DIR AFTER_DIR")
    main(*sys.argv[1:])
