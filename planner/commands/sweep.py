"""`ckplan solve --sweep`: predicted iteration time against memory cap, ckplan and baselines."""

from __future__ import annotations

import json
from pathlib import Path

from planner.console import console, table
from planner.errors import UserError
from planner.units import format_bytes, format_ms

NUM_POINTS = 8


def sweep_caps(profile, setup, deadline=None, solver: str = "auto", top_bytes: int | None = None) -> list[int]:
    """From the least memory any plan needs to `top_bytes` (--mem), or else to what the
    no-checkpointing split needs (+5%)."""
    from planner.cost import costmodel
    from planner.solve import baselines, search

    lowest = search.min_cap_scale(profile, setup, deadline=deadline, solver=solver)
    if lowest is None:
        return []
    low = int(max(lowest[1].peak_bytes_per_stage))
    roomy = setup.model_copy(update={"mem_caps_bytes": [2**62] * setup.pipeline.stages})
    high = int(max(costmodel.evaluate(baselines.no_checkpointing(profile, roomy), profile, roomy).peak_bytes_per_stage) * 1.05)
    if top_bytes is not None:
        if top_bytes <= low + costmodel.FIT_MARGIN_BYTES:
            raise UserError(f"--mem {format_bytes(top_bytes)} is below the least any plan needs ({format_bytes(low)}); "
                            "give a larger --mem as the sweep's top, or none")
        high = top_bytes - costmodel.FIT_MARGIN_BYTES - 1
    step = (high - low) / (NUM_POINTS - 1)
    return [int(low + i * step) + costmodel.FIT_MARGIN_BYTES + 1 for i in range(NUM_POINTS)]


def sweep_points(profile, setup, *, time_limit_s: float, deadline=None, solver: str = "auto",
                 top_bytes: int | None = None) -> tuple[list[dict], list[str]]:
    """One row per cap: ckplan's and each baseline's predicted iteration (None: does not fit),
    and the solver's status per row ("searched" where the replay's search over caps gave the plan). One deadline (default: time_limit_s from now) bounds
    the whole sweep; points it cuts short keep the best plan known, "feasible", not "optimal"."""
    from planner.solve import search
    from planner.solve.deadline import Deadline
    from planner.solve.planning import search_plan

    deadline = deadline or Deadline(time_limit_s)
    rows, statuses = [], []
    for cap in sweep_caps(profile, setup, deadline, solver, top_bytes):
        point = setup.model_copy(update={"mem_caps_bytes": [cap] * setup.pipeline.stages})
        result, refs = search_plan(profile, point, time_limit_s=time_limit_s, solver=solver, deadline=deadline)
        solved = isinstance(result, search.PlanResult)
        rows.append({"cap_bytes": cap, "ckplan": result.cost.iteration_ms if solved else None,
                     **{b.name: (b.iteration_ms if b.feasible else None) for b in refs}})
        # "searched": the fastest plan the search over caps found that fits the replay (replayfit), not a time limit
        statuses.append("searched" if solved and result.solve.replay == "searched"
                        else (result.solve if solved else result).status)
    return rows, statuses


def run_sweep(profile, setup, *, plot: Path, time_limit_s: float, as_json: bool, solver: str = "auto",
              top_bytes: int | None = None) -> None:
    rows, statuses = sweep_points(profile, setup, time_limit_s=time_limit_s, solver=solver, top_bytes=top_bytes)
    if not rows:
        raise UserError(f"--time-limit {time_limit_s:g} s ran out before the sweep's smallest cap was found; raise it")
    if as_json:
        console.print_json(json.dumps(rows))
        return
    names = [key for key in rows[0] if key != "cap_bytes"] if rows else []
    cut_short = [status in ("feasible", "timeout") for status in statuses]
    console.print(table("predicted iteration time against memory cap (— : does not fit)", ["cap"] + names,
                        [[format_bytes(r["cap_bytes"])] + [_cell(r, n, short) for n in names]
                         for r, short in zip(rows, cut_short)]))
    if any(cut_short):
        console.print("* --time-limit ran out before these points were proven optimal: the best plan known then")
    if "searched" in statuses:
        console.print("at caps where the allocator replay puts the solvers' first plan over, the fastest plan of a "
                      "search over caps that fits the replay (planner/solve/replayfit.py): not proven fastest")
    _plot(rows, names, plot)


def _cell(row: dict, name: str, cut_short: bool) -> str:
    text = format_ms(row[name]) if row[name] else "—"
    return text + " *" if cut_short and name == "ckplan" else text


def _plot(rows, names, path: Path) -> None:
    """Predicted iteration against the cap: steps (a plan that fits a cap fits every larger
    one, so time only changes at the caps solved), curves that coincide drawn once under
    all their names, the cap in the unit the table uses, the legend beside the axes."""
    from planner.emit.charts import byte_unit, merged_curves, pyplot, save_png, strategy_colours

    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    unit, size = byte_unit([r["cap_bytes"] for r in rows])
    caps = [r["cap_bytes"] / size for r in rows]
    colours = strategy_colours(names)
    for name, members in merged_curves(names, {name: [r[name] for r in rows] for name in names}):
        points = [(c, r[name]) for c, r in zip(caps, rows) if r[name]]
        if points:
            ax.step(*zip(*points), where="post", marker="o", markersize=3, color=colours[name],
                    label=" = ".join(members), linewidth=2.5 if "ckplan" in members else 1.2)
    ax.set_xlabel(f"memory cap per device ({unit})")
    ax.set_ylabel("predicted iteration (ms)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    ax.grid(alpha=0.3)
    save_png(fig, path, dpi=120)
    plt.close(fig)
