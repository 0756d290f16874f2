"""What `ckplan profile` prints of the recompute options it measured (measured and --fake
profiles alike)."""

from __future__ import annotations


def options_report(profile, timed: str) -> None:
    """The recompute options found per layer kind, as the solver sees them (kind-normalised:
    bytes the most of any layer of the kind, times the mean); `timed` says how their times came."""
    from planner.console import console, info, table
    from planner.cost.costmodel import layer_costs

    kinds = {}
    for layer in layer_costs(profile):
        kinds.setdefault(layer.kind, layer)
    rows = [[kind if index == 0 else "", option.name, f"{option.kept_bytes / 2**20:.3f}",
             "–" if option.recompute_ms is None else f"{option.recompute_ms:.3f}", f"{option.peak_bytes / 2**20:.3f}"]
            for kind, layer in kinds.items() if len(layer.options) > 2
            for index, option in enumerate(layer.options)]
    if not rows:
        return
    console.print(table("recompute options per layer kind (planner/runtime/recompute.py)",
                        ["kind", "option", "kept MiB", "recompute ms", "recompute peak MiB"], rows, right_from=2))
    found = ", ".join(f"{kind}: {', '.join(option.name for option in layer.options[2:]) or 'none and full only'}"
                      for kind, layer in kinds.items())
    info(f"selective options found per kind: {found} ({timed})")
