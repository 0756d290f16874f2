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
