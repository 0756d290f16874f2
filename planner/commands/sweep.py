"""`ckplan solve --sweep`: predicted iteration time against memory cap, ckplan and baselines."""

from __future__ import annotations

import json
from pathlib import Path

from planner.console import console, table
from planner.units import format_bytes, format_ms

NUM_POINTS = 8


def sweep_caps(profile, setup) -> list[int]:
    """From the least memory any plan needs to what the no-checkpointing split needs (+5%)."""
    from planner import baselines, costmodel, milp

    lowest = milp.min_cap_scale(profile, setup)
    if lowest is None:
        return []
    low = int(max(lowest[1].peak_bytes_per_stage))
    roomy = setup.model_copy(update={"mem_caps_bytes": [2**62] * setup.stages})
    high = int(max(costmodel.evaluate(baselines.no_checkpointing(profile, roomy), profile, roomy).peak_bytes_per_stage) * 1.05)
    step = (high - low) / (NUM_POINTS - 1)
    return [int(low + i * step) + costmodel.FIT_MARGIN_BYTES + 1 for i in range(NUM_POINTS)]


def run_sweep(profile, setup, *, plot: Path, time_limit_s: float, as_json: bool) -> None:
    from planner import baselines, milp

    rows = []
    for cap in sweep_caps(profile, setup):
        point = setup.model_copy(update={"mem_caps_bytes": [cap] * setup.stages})
        refs = baselines.all_baselines(profile, point)
        best = min((b for b in refs if b.feasible), key=lambda b: b.iteration_ms, default=None)
        result = milp.plan(profile, point, time_limit_s=time_limit_s, upper_bound_ms=best and best.iteration_ms,
                           start=best and best.stages)
        ckplan_ms = None if isinstance(result, milp.SolveResult) else result.cost.iteration_ms
        rows.append({"cap_bytes": cap, "ckplan": ckplan_ms,
                     **{b.name: (b.iteration_ms if b.feasible else None) for b in refs}})
    if as_json:
        console.print_json(json.dumps(rows))
        return
    names = [key for key in rows[0] if key != "cap_bytes"] if rows else []
    console.print(table("predicted iteration time against memory cap (— : does not fit)", ["cap"] + names,
                        [[format_bytes(r["cap_bytes"])] + [format_ms(r[n]) if r[n] else "—" for n in names] for r in rows]))
    _plot(rows, names, plot)


def _plot(rows, names, path: Path) -> None:
    from planner.emit.charts import pyplot, save_png

    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    caps_gib = [r["cap_bytes"] / 2**30 for r in rows]
    for name in names:
        points = [(c, r[name]) for c, r in zip(caps_gib, rows) if r[name]]
        if points:
            ax.plot(*zip(*points), marker="o", label=name, linewidth=2.5 if name == "ckplan" else 1.2)
    ax.set_xlabel("memory cap per device (GiB)")
    ax.set_ylabel("predicted iteration (ms)")
    ax.legend()
    ax.grid(alpha=0.3)
    save_png(fig, path, dpi=120)
    plt.close(fig)
