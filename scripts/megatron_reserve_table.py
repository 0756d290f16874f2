"""Print the Megatron rows' iteration and per-rank memory from scripts/megatron_reserve_rows.sh's output (GiB):
static, allocated peak, reserved peak and what set it (replay or divisor), the usable cap, whether it fits; with BEFORE, each figure
before → after. usage: python scripts/megatron_reserve_table.py OUT [BEFORE]"""

import json
import sys
from pathlib import Path

GIB = 1 << 30


def scored(folder: Path, name: str) -> dict:
    text = (folder / f"{name}.json").read_text()
    return json.loads(text[text.index("{"):])


def ranks(folder: Path, name: str) -> list[dict]:
    return scored(folder, name)["ranks"]


def iteration(folder: Path, name: str) -> str:
    return f"{scored(folder, name)['iteration_ms'] / 1000:.3f} s"


def cell(rank: dict) -> str:
    return (f"{rank['static_bytes'] / GIB:.2f} / {rank['peak_bytes'] / GIB:.2f} / "
            f"{rank['reserved_bytes'] / GIB:.2f} ({rank['reserved_by']})")


def main() -> None:
    after = Path(sys.argv[1])
    before = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    for path in sorted(after.glob("*.json")):
        name = path.stem
        if "{" not in path.read_text():
            print(f"{name}: no result ({(after / f'{name}.err').read_text().strip()[-200:]})")
            continue
        new = ranks(after, name)
        old = ranks(before, name) if before and (before / path.name).exists() else None
        worst = max(new, key=lambda r: r["reserved_bytes"] / r["cap_bytes"])
        was_ms = f"{iteration(before, name)} → " if old else ""
        print(f"{name}: worst rank {worst['index']} of {len(new)}, cap {worst['cap_bytes'] / GIB:.1f} GiB, "
              f"fits {all(r['fits'] for r in new)}, iteration {was_ms}{iteration(after, name)}")
        for i, rank in enumerate(new):
            was = f"{cell(old[i])} → " if old else ""
            print(f"  {rank['index']}: {was}{cell(rank)}{'' if rank['fits'] else ' ✗'}")


if __name__ == "__main__":
    main()
