"""The iteration of each row scripts/rows_megatron.sh wrote, against its published time.
usage: python scripts/rows_megatron_table.py OUT [BEFORE]"""
import json
import sys
from pathlib import Path

# published seconds an iteration: Megatron-Bridge 25.11 tokens/s/GPU -> GBS x 8192 / (GPUs x tok/s/GPU)
# (docs/published-runs.md §17.bridge); the functional tests' iteration-time medians (§17.megfunc3, §18)
PUBLISHED = {"T22": 4.280, "T23": 9.070, "B1": 4.160, "B2": 10.227, "B3": 7.599, "B4": 14.027, "B5": 6.197,
             "B6": 60.458, "T15": 1.150, "T16": 2.942, "T17": 0.787, "T18": 1.115, "T19": 2.587, "T20": 0.853}


def seconds(path: Path) -> float | None:
    if not path.exists():
        return None
    text = path.read_text()
    try:
        return json.loads(text[text.index("{"):])["iteration_ms"] / 1e3
    except ValueError:
        return None


def main() -> None:
    out = Path(sys.argv[1])
    before = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    print("| row | published s | " + ("before s (ratio) | " if before else "") + "ckplan s (ratio) | within 15% |")
    for row, published in PUBLISHED.items():
        now = seconds(out / f"{row}.json")
        cells = [row, f"{published:.3f}"]
        if before:
            was = seconds(before / f"{row}.json")
            cells.append("—" if was is None else f"{was:.3f} ({was / published:.3f})")
        cells.append("—" if now is None else f"{now:.3f} ({now / published:.3f})")
        cells.append("—" if now is None else ("yes" if abs(now / published - 1) <= 0.15 else "**no**"))
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
