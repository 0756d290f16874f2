"""What torchtitan's CP tables ask of a ring step, against what ckplan charges (docs/published-runs.md §29.crows).

Each table (8B: C1-C4; 405B: C5-C8) holds a rank's tokens fixed (32,768) and doubles the CP degree from row to
row, so a rank's work outside the ring is the same in every row and each row adds ring steps (cp - 1 after the
first). Between two consecutive rows, the published increment over ckplan's is what the added steps cost in the
runs over what they cost in ckplan. A per-step term (δ seconds an iteration for every step after the first) puts
every row of a table within the band only if one δ lies in every row's interval [(1 - band) P - T, (1 + band) P - T]
/ (cp - 1) (P published, T ckplan), and a row at CP 1 within the band as it is.

    PYTHONPATH=. python scripts/cp_row_steps.py RESULTS_DIR

RESULTS_DIR is a `published_rows.py run --only C1,...,C8 --out RESULTS_DIR` folder.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from published_rows import load_table  # noqa: E402

TABLES = {"8B (Table 2)": (("C1", 1), ("C2", 2), ("C3", 4), ("C4", 8)),
          "405B (Table 6)": (("C5", 1), ("C6", 2), ("C7", 4), ("C8", 8))}
BAND = 0.15


@dataclass(frozen=True)
class CpRow:
    id: str
    cp: int
    published_s: float
    ckplan_s: float


def increments(rows: list[CpRow]) -> list[tuple[str, int, float, float]]:
    """(pair, ring steps added, published increment s, ckplan increment s) between consecutive rows."""
    return [(f"{a.id}->{b.id}", b.cp - a.cp, b.published_s - a.published_s, b.ckplan_s - a.ckplan_s)
            for a, b in zip(rows, rows[1:])]


def delta_interval(rows: list[CpRow], band: float = BAND) -> tuple[float, float] | None:
    """The per-later-step δ (s an iteration) that puts every CP > 1 row within the band, or None if no δ does.
    Rows at CP 1 take no δ: they are within the band or not as they are (reported by the caller)."""
    low, high = float("-inf"), float("inf")
    for row in rows:
        steps = row.cp - 1
        if steps <= 0:
            continue
        low = max(low, ((1 - band) * row.published_s - row.ckplan_s) / steps)
        high = min(high, ((1 + band) * row.published_s - row.ckplan_s) / steps)
    return (low, high) if low <= high else None


def load(results: Path, ids: tuple[tuple[str, int], ...]) -> list[CpRow]:
    published = {row.id: row.time_s for row in load_table().rows}
    return [CpRow(name, cp, published[name], json.loads((results / f"{name}.json").read_text())["iteration_s"])
            for name, cp in ids]


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: cp_row_steps.py RESULTS_DIR (a published_rows.py run --out folder)", file=sys.stderr)
        return 2
    for title, ids in TABLES.items():
        missing = [name for name, _ in ids if not (Path(argv[0]) / f"{name}.json").is_file()]
        if missing:
            print(f"{argv[0]} has no result for {', '.join(missing)}: run published_rows.py run --only "
                  f"{','.join(name for name, _ in ids)} --out {argv[0]}", file=sys.stderr)
            return 2
        rows = load(Path(argv[0]), ids)
        print(f"{title}: " + ", ".join(f"{r.id} {r.ckplan_s:.3f} / {r.published_s:g} s ({r.ckplan_s / r.published_s:.3f})"
                                       for r in rows))
        for pair, steps, published, ckplan in increments(rows):
            ratio = f"ratio {published / ckplan:.2f}, " if ckplan else ""
            print(f"  {pair}: +{steps} ring steps, published +{published:.2f} s, ckplan +{ckplan:.2f} s, "
                  f"{ratio}a step {published / steps:.2f} against {ckplan / steps:.2f} s")
        found = delta_interval(rows)
        print("  per-later-step term putting every CP > 1 row within 15%: " +
              (f"{found[0]:.3f} to {found[1]:.3f} s an iteration" if found else "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
