"""docs/published-runs.md §18's tables from the harness's results (scripts/published_rows.py `table`).

Goals, as issues 33 and 35 state them: memory, the published peak (reserved, or allocated where that was
published) within [0.90, 1.10] of ckplan's, and where the static bytes after the step are published (Megatron-LM's
logs) those within 3% too; time, the iteration within 15%.
"""

from __future__ import annotations

import json
from pathlib import Path

GIB = 2**30
MEMORY_GOAL = (0.90, 1.10)
STATIC_GOAL = (0.97, 1.03)
TIME_GOAL = 0.15


def load_results(folder: Path) -> dict[str, dict]:
    """Each row's result in `folder` (OUT/<row>.json), by id."""
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder of results (make one with `published_rows.py run --out DIR`)")
    return {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}


def worst(result: dict) -> dict:
    """The stage (rank) with the largest reserved peak; the first of equals."""
    return max(result["stages"], key=lambda s: s["reserved_bytes"])


def memory_of(row, result: dict) -> float:
    """ckplan's figure for the row's published peak, GiB: the worst rank's reserved peak, or its
    allocated peak where that was published (Megatron-LM's last rank: the rank its logs are of)."""
    if row.static_bytes is not None:
        return result["stages"][-1]["peak_bytes"] / GIB
    if row.memory_kind == "allocated":
        return max(s["peak_bytes"] for s in result["stages"]) / GIB
    return worst(result)["reserved_bytes"] / GIB


def static_of(result: dict) -> float:
    """Allocated after the optimizer step on the last rank, GiB (what Megatron-LM logs)."""
    return result["stages"][-1]["after_step_bytes"] / GIB


def within(ratio: float, goal: tuple[float, float]) -> bool:
    return goal[0] <= ratio <= goal[1]


def memory_met(row, result: dict) -> bool | None:
    """None where no memory is published."""
    if row.memory_bytes is None:
        return None
    met = within(memory_of(row, result) / (row.memory_bytes / GIB), MEMORY_GOAL)
    if row.static_bytes is not None:
        met = met and within(static_of(result) / (row.static_bytes / GIB), STATIC_GOAL)
    return met


def time_met(row, result: dict) -> bool:
    return abs(result["iteration_s"] / row.time_s - 1) <= TIME_GOAL


def _g(x: float) -> str:
    return f"{x:g}"


def published_text(row) -> str:
    time = _g(row.time_s) if row.tokens_per_s_per_gpu is None else f"{row.time_s:.3f}"
    if row.memory_bytes is None:
        return f"—; {time}"
    memory = _g(round(row.memory_bytes / GIB, 2))
    if row.static_bytes is not None:
        return f"static {row.static_bytes / GIB:.2f}, peak {memory} {row.memory_kind}; {time}"
    return f"{memory}{' allocated' if row.memory_kind == 'allocated' else ''}; {time}"


def memory_text(row, result: dict | None) -> str:
    if result is None:
        return "(not run)"
    if row.memory_bytes is None:
        return "—"
    peak = memory_of(row, result)
    text = f"{peak:.2f} ({peak / (row.memory_bytes / GIB):.3f})"
    if row.static_bytes is not None:
        static = static_of(result)
        text = f"static {static:.2f} ({static / (row.static_bytes / GIB):.3f}), peak {text}"
    return text


def time_text(row, result: dict | None) -> str:
    if result is None:
        return "(not run)"
    return f"{result['iteration_s']:.3f} ({result['iteration_s'] / row.time_s:.3f})"


def _verdict(met: bool | None) -> str:
    return "—" if met is None else "yes" if met else "**no**"


def _change(before: str | None, after: str) -> str:
    return after if before is None or before == after else f"{before} → {after}"


def main_table(rows, before: dict | None, after: dict) -> list[str]:
    """§18's first table: every row of the main group, memory and time (before → after given two folders)."""
    lines = ["| row | published (GiB; s) | ckplan memory (ratio) | ckplan time, s (ratio) | memory goal | "
             "time within 15% | fits (allocated / reserved peak + NCCL buffers, GiB, worst rank, of the cap) |",
             "|---|---|---|---|---|---|---|"]
    time_in = memory_in = timed = memory_rows = 0
    missing = []
    for row in rows:
        result = after.get(row.id)
        old = None if before is None else before.get(row.id)
        if result is None:
            missing.append(row.id)
            continue
        mem_before = None if before is None else memory_text(row, old)
        time_before = None if before is None else time_text(row, old)
        met, fast = memory_met(row, result), time_met(row, result)
        timed, time_in = timed + 1, time_in + fast
        if met is not None:
            memory_rows, memory_in = memory_rows + 1, memory_in + met
        fit_before = None if old is None else fits_text(old)
        lines.append(f"| {row.label} | {published_text(row)} | {_change(mem_before, memory_text(row, result))} | "
                     f"{_change(time_before, time_text(row, result))} | {_verdict(met)} | {_verdict(fast)} | "
                     f"{_change(fit_before, fits_text(result))} |")
    lines += ["", f"Time: {time_in} of {timed} rows within 15%. Memory: {memory_in} of {memory_rows} rows meet the goals."]
    if missing:
        lines.append(f"Not in the results: {', '.join(missing)}.")
    return lines


def _recipe(result: dict) -> tuple[str, str]:
    """The row's recipe (its YAML's name) and its GPUs, from its evaluate arguments."""
    args = result["args"]
    recipe = Path(args[args.index("--from-megatron") + 1]).stem if "--from-megatron" in args else "by hand"
    gpu = args[args.index("--gpu") + 1].upper() if "--gpu" in args else "?"
    gpus = args[args.index("--gpus") + 1] if "--gpus" in args else "?"
    return recipe, f"{gpus} x {gpu}"


def device_need(stage: dict) -> int:
    """What ckplan's fit test sets against the cap (assembly.StageCost.device_need_bytes, fits_allocated): the
    reserved peak and the communication library's buffers (workspace_bytes; 0 in results made before it was kept)."""
    return stage["reserved_bytes"] + stage.get("workspace_bytes", 0)


def fits_text(result: dict) -> str:
    """ckplan's verdict and the rank nearest its cap: allocated / reserved peak + NCCL's buffers, of the cap. Where
    the rank's replay passed the cap without one (planner/cost/capped_reserve.py): "retried" (torch's
    release-and-retry keeps it under the cap; the reserve is the capped replay's, the uncapped one beside it) or
    "OOM" (a request fails even then; the reserve is the uncapped replay's)."""
    stage = max(result["stages"], key=lambda s: device_need(s) - s["cap_bytes"])
    fits = all(s["fits"] for s in result["stages"])
    how = stage.get("cap_replay")
    reserved = f"{stage['reserved_bytes'] / GIB:.1f}"
    if how == "retried":
        reserved += f" (uncapped {stage['uncapped_reserved_bytes'] / GIB:.1f})"
    return (f"{'yes' if fits else '**no**'}{', retried' if how == 'retried' else ', OOM' if how == 'oom' else ''} "
            f"({stage['peak_bytes'] / GIB:.1f} / {reserved} + {stage.get('workspace_bytes', 0) / GIB:.1f} of "
            f"{stage['cap_bytes'] / GIB:.1f})")


def bridge_table(rows, before: dict | None, after: dict) -> list[str]:
    """§18's Megatron-Bridge table: time against tokens/s/GPU, and whether ckplan finds the job fits."""
    lines = ["| row | recipe | GPUs | published tok/s/GPU → s | ckplan s (tok/s/GPU) | ratio | within 15% | "
             "fits (ckplan's allocated / reserved peak + NCCL buffers, GiB, worst rank, of the cap) |",
             "|---|---|---|---|---|---|---|---|"]
    time_in = fit = count = 0
    for row in rows:
        result = after.get(row.id)
        if result is None:
            continue
        recipe, gpus = _recipe(result)
        tokens = row.time_s * row.gpus * row.tokens_per_s_per_gpu
        ckplan = f"{result['iteration_s']:.3f} ({tokens / (row.gpus * result['iteration_s']):,.0f})"
        old = None if before is None else before.get(row.id)
        if old is not None:
            ckplan = _change(f"{old['iteration_s']:.3f}", ckplan)
        fast = time_met(row, result)
        count, time_in, fit = count + 1, time_in + fast, fit + all(s["fits"] for s in result["stages"])
        lines.append(f"| {row.label} | {recipe} | {gpus} | {row.tokens_per_s_per_gpu:,.0f} → {row.time_s:.3f} | "
                     f"{ckplan} | {result['iteration_s'] / row.time_s:.3f} | {_verdict(fast)} | "
                     f"{fits_text(result)} |")
    lines += ["", f"Time: {time_in} of {count} rows within 15%. Fit by ckplan's reckoning: {fit} of {count}."]
    return lines


def deepspeed_table(rows, before: dict | None, after: dict) -> list[str]:
    """§25.dsrows' table: DeepSpeed's own runs, time against the published TFLOPs turned into seconds, and whether
    ckplan finds the job fits (every one ran on its GPUs, so a "no" is ckplan's error)."""
    lines = ["| row | published s | ckplan s (ratio) | within 15% | fits (ckplan's allocated / reserved peak + NCCL "
             "buffers, GiB, worst rank, of the cap) |", "|---|---|---|---|---|"]
    time_in = fit = count = 0
    for row in rows:
        result = after.get(row.id)
        if result is None:
            continue
        old = None if before is None else before.get(row.id)
        fast = time_met(row, result)
        count, time_in, fit = count + 1, time_in + fast, fit + all(s["fits"] for s in result["stages"])
        ckplan = _change(None if old is None else time_text(row, old), time_text(row, result))
        lines.append(f"| {row.label} | {row.time_s:.3f} | {ckplan} | {_verdict(fast)} | {fits_text(result)} |")
    lines += ["", f"Time: {time_in} of {count} rows within 15%. Fit by ckplan's reckoning: {fit} of {count} (all ran)."]
    return lines


def tables(rows, folders: list[Path]) -> str:
    """The markdown the `table` command prints: the main rows, then the Megatron-Bridge rows, then DeepSpeed's."""
    *first, last = [load_results(folder) for folder in folders]
    before = first[0] if first else None
    out = main_table([r for r in rows if r.group == "main"], before, last)
    bridge = [r for r in rows if r.group == "bridge"]
    if any(r.id in last for r in bridge):
        out += ["", *bridge_table(bridge, before, last)]
    deepspeed = [r for r in rows if r.group == "deepspeed"]
    if any(r.id in last for r in deepspeed):
        out += ["", *deepspeed_table(deepspeed, before, last)]
    return "\n".join(out) + "\n"
