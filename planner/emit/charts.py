"""PNG charts, when matplotlib is installed (the `plot` extra); written atomically."""

from __future__ import annotations

import io
from pathlib import Path

from planner.console import console, warn
from planner.io import write_atomic_bytes


def pyplot():
    """matplotlib.pyplot on a file-only backend, or None (with a warning) when it is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        warn("matplotlib is not installed; no chart written (pip install matplotlib)")
        return None
    return plt


def save_png(fig, path: Path, *, dpi: int = 110) -> None:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    fig.clf()
    write_atomic_bytes(path, buffer.getvalue())
    console.print(f"chart written to {path}")


# one colour per strategy, the same in every panel and every chart: ckplan green, each
# baseline its own (matplotlib's tab10, green left out)
_PALETTE = ["tab:blue", "tab:orange", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray", "tab:olive",
            "tab:cyan"]


def strategy_colours(names: list[str]) -> dict[str, str]:
    """A colour per strategy name: ckplan green, the others in order from the palette."""
    others = iter(_PALETTE * (1 + len(names) // len(_PALETTE)))
    return {name: "tab:green" if name == "ckplan" else next(others) for name in names}


def byte_unit(values: list[float]) -> tuple[str, float]:
    """(unit, bytes per unit) the tables would print the largest of `values` in."""
    largest = max(values, default=0.0)
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if largest >= size:
            return unit, float(size)
    return "B", 1.0


def merged_curves(names: list[str], values: dict[str, list]) -> list[tuple[str, list[str]]]:
    """Curves with identical values drawn once: (the first name, every name with those
    values), in the order of `names`."""
    groups: dict[tuple, list[str]] = {}
    for name in names:
        groups.setdefault(tuple(values[name]), []).append(name)
    return [(members[0], members) for members in groups.values()]
