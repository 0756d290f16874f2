"""`ckplan solve --auto-dp`: every ZeRO stage x shard group x optimizer offload for the given
--dp, the checkpointing plan re-solved for each, in one table; the fastest that fits is
written as the plan."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from planner.errors import UserError


@dataclass
class Trial:
    zero: int
    shard_group: int | None
    offload: bool
    setup: object = None
    plan: object = None  # None: no plan fits the device caps
    host_bytes: float = 0.0
    why_not: str = ""  # why it has no plan that fits: device memory, host memory, the time limit, or refused
    reason: str = ""  # where refused: the sentence the options gave for this combination

    @property
    def fits(self) -> bool:
        return self.plan is not None and not self.why_not


def combinations(dp: int, *, offload_choices: tuple[bool, ...], ep: int = 1) -> list[tuple[int, int | None, bool]]:
    """(zero, shard group, offload): ZeRO-0 unsharded, ZeRO 1-3 over every shard group of 2 or
    more ranks that divides dp (and that --ep divides: the experts shard over group / ep); each
    with and without offload."""
    groups = [k for k in range(2, dp + 1) if dp % k == 0 and k % ep == 0]
    sharded = [(zero, k) for zero in (1, 2, 3) for k in groups]
    return [(zero, k, offload) for zero, k in [(0, None), *sharded] for offload in offload_choices]


def run_auto_dp(profile, profile_path: Path, *, stages: int, data_parallel, time_limit_s: float, out: Path,
                as_json: bool, say, solver: str = "auto", **options) -> None:
    """Solve every combination, print the table, write the fastest that fits to `out`.
    --zero, --shard-group and --offload-optimizer (of `data_parallel`, the DataParallelOptions
    given) are what it tries, so they are not given; --host-mem caps the host memory of the
    combinations that offload (the optimizer, or activations). `options`: build_setup's others."""
    import dataclasses

    from planner import io
    from planner.commands.setup_options import host_bytes, may_offload_activations

    dp, host_mem = data_parallel.dp, data_parallel.host_mem
    if data_parallel.zero or data_parallel.shard_group is not None or data_parallel.offload_optimizer:
        raise UserError("--auto-dp tries every --zero, --shard-group and --offload-optimizer itself; "
                        "drop those options or drop --auto-dp")
    offload_choices = (False, True) if profile.host_step_ns_per_param else (False,)
    if len(offload_choices) == 1:
        say("offload not tried: the profile does not record the host's optimizer speed; re-run `ckplan profile`")
    offloads_activations = may_offload_activations(profile, options.get("recompute", "options"),
                                                   options.get("schedule", "1F1B"))
    trials = [_trial(profile, profile_path, stages=stages, time_limit_s=time_limit_s, solver=solver,
                     say=say if i == 0 else None, options=options, host_bytes=host_bytes,
                     data_parallel=dataclasses.replace(data_parallel, zero=z, shard_group=k, offload_optimizer=o,
                                                       host_mem=host_mem if o or offloads_activations else None))
              for i, (z, k, o) in enumerate(combinations(dp, offload_choices=offload_choices, ep=data_parallel.ep))]
    if all(t.why_not == "refused" for t in trials):
        raise UserError(trials[0].reason)  # the options' own fault, whatever the combination: said once
    best = min((t for t in trials if t.fits), key=lambda t: t.plan.predicted.iteration_ms, default=None)
    if best is not None:
        io.check_outputs({"--out": out}, inputs={"--profile": profile_path})
        io.save_plan(best.plan, out)
    if as_json:
        print_json(trials, best, out)
    else:
        print_table(trials, best, out, dp)
    if best is None and any(t.why_not == "time limit" for t in trials):
        raise UserError(f"no combination of ZeRO stage, shard group and offload was found to fit with --dp {dp}, "
                        "and some ran out of --time-limit before the solver found any plan; raise --time-limit")
    if best is None:
        host = " or give --host-mem more room" if any(t.why_not == "host memory" for t in trials) else ""
        raise UserError(f"no combination of ZeRO stage, shard group and offload fits with --dp {dp}; raise "
                        f"--mem or add --stages{host}")


def _trial(profile, profile_path, *, stages, data_parallel, time_limit_s, solver, say, options, host_bytes) -> Trial:
    """One combination planned the way `solve` plans (calibration included); where none fits,
    why: "time limit" (it may well fit: the solver did not get to say), "host memory" or
    "device memory"."""
    from planner.commands.setup_options import planned_setup
    from planner.solve.planning import Unplanned, make_plan

    trial = Trial(data_parallel.zero, data_parallel.shard_group, data_parallel.offload_optimizer)
    try:
        trial.setup, notes = planned_setup(profile, profile_path, stages=stages, data_parallel=data_parallel,
                                           say=say, **options)
    except UserError as exc:  # a setting this combination cannot take (e.g. an allocator flag only ZeRO 3 replays)
        trial.why_not, trial.reason = "refused", str(exc)
        return trial
    for note in notes if say is not None else ():
        say(note)
    # the table says which resource ruled a combination out; the least-memory search that would
    # word it to the byte is left to `solve` with that combination
    planned = make_plan(profile, profile_path, trial.setup, time_limit_s=time_limit_s, solver=solver, explain=False)
    if isinstance(planned, Unplanned):
        trial.why_not = planned.resource
        return trial
    trial.plan = planned
    trial.host_bytes = host_bytes(trial.plan.stages, trial.setup)
    return trial


def _row(trial: Trial, best: Trial | None) -> list[str]:
    from planner.cost import dataparallel
    from planner.emit import dp_support
    from planner.units import format_bytes, format_ms

    setup = trial.setup
    if setup is None:  # refused before a setup was made: the sentence is listed under the table
        return [str(trial.zero), str(trial.shard_group or "-"), "yes" if trial.offload else "no", "[red]no[/] (refused)",
                "-", "-", "-", "-", "-", "", "-", "-"]
    group = str(dataparallel.shard_size(setup)) if setup.data_parallel.zero else "-"
    refused = ", ".join(dp_support.refused_by(setup)) or "-"
    mark = "[bold green]best[/]" if trial is best else ""
    words = dataparallel.communicated(setup)
    if trial.plan is None:
        return [str(setup.data_parallel.zero), group, "yes" if setup.data_parallel.offload else "no", f"[red]no[/] ({_reason(trial)})", "-", "-", "-",
                "-", "-", "", words, refused]
    stages = trial.plan.stages
    peaks = per_stage([s.predicted.peak_bytes for s in stages])
    static = per_stage([s.predicted.static_bytes for s in stages])
    host = format_bytes(trial.host_bytes) if trial.host_bytes else "-"
    fits = "yes" if trial.fits else f"[red]no[/] ({_reason(trial)})"
    ckpt = str(sum(len(s.recompute) for s in stages))  # whole layers and selective options alike
    return [str(setup.data_parallel.zero), group, "yes" if setup.data_parallel.offload else "no", fits, peaks, static, host, ckpt,
            format_ms(trial.plan.predicted.iteration_ms), mark, words, refused]


def _reason(trial: Trial) -> str:
    """Why not, in a word or two for the table: device, host, time limit."""
    return trial.why_not.removesuffix(" memory")


def per_stage(values: list[int]) -> str:
    """Bytes per stage in one unit: 26.2/22.4/15.7/9.3 GiB."""
    unit, size = next((u, b) for u, b in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("B", 1))
                      if max(values) >= b or b == 1)
    return "/".join(f"{v / size:.3g}" for v in values) + f" {unit}"


COLUMNS = ["ZeRO", "group", "offload", "fits", "peak per stage", "static per stage", "host/node",
           "ckpt", "iteration", "", "communicated", "refused by (pp > 1)"]
# the compact table for terminals under 110 columns (fits 80): one line a row; the best row is
# named by the "recommended" line below it
NARROW_COLUMNS = ["ZeRO", "group", "offload", "fits", "peak per stage", "host/node", "iteration"]
NARROW_HEADERS = {"ZeRO": "ZeRO", "group": "grp", "offload": "offl", "fits": "fits", "peak per stage": "peak / stage",
                  "host/node": "host", "iteration": "iter"}
LEGEND = ("AR all-reduce, RS reduce-scatter, AG all-gather over /n ranks, xN per iteration; D2H/H2D "
          "offload's copies; ckpt: layers that recompute (whole, or a selective option)")


def print_table(trials: list[Trial], best: Trial | None, out: Path, dp: int) -> None:
    from planner.console import console, narrow, table
    from planner.cost import dataparallel
    from planner.emit import dp_support
    from planner.units import format_ms

    setup = next(t.setup for t in trials if t.setup is not None)
    title = (f"--auto-dp: dp {dp} x {setup.pipeline.stages} stages, {setup.pipeline.microbatches} microbatches, "
             f"{setup.training.optimizer} {setup.training.precision}; plan re-solved for each")
    rows = [_row(t, best) for t in trials]
    if narrow():  # compact: one line a row; what is communicated and who refuses it listed below
        keep = [COLUMNS.index(name) for name in NARROW_COLUMNS]
        console.print(table(title, [NARROW_HEADERS.get(COLUMNS[i], COLUMNS[i]) for i in keep],
                            [[row[i] for i in keep] for row in rows], right_from=4,
                            whole=tuple(NARROW_HEADERS.values())))  # every cell whole, on one line
        for row in rows:
            refused = f"; refused by {row[-1]} (pp > 1)" if row[-1] != "-" else ""
            console.print(f"  ZeRO {row[0]}, group {row[1]}, offload {row[2]}: {row[-2]}{refused}", soft_wrap=True)
    else:
        console.print(table(title, COLUMNS, rows, right_from=4, whole=tuple(COLUMNS[1:4]),
                            wrap=("communicated", "refused by (pp > 1)")))
    console.print(LEGEND)
    for trial in trials:
        if trial.why_not == "refused":
            console.print(f"ZeRO {trial.zero}, group {trial.shard_group or '-'}, offload "
                          f"{'yes' if trial.offload else 'no'} refused: {trial.reason}", soft_wrap=True)
    trials = [t for t in trials if t.setup is not None]
    offloaded = next((t for t in trials if t.setup.data_parallel.offload), None)
    if offloaded is not None:
        console.print(next(note for note in offloaded.setup.data_parallel.dp_notes if note.startswith("host ")),
                      soft_wrap=True)
    if best is None:
        return
    console.print(f"recommended: {dataparallel.described(best.setup)}: {format_ms(best.plan.predicted.iteration_ms)} per iteration; "
                  f"plan written to {out}")
    refusing = dp_support.refused_by(best.setup)
    runnable = [t for t in trials if t.fits and not dp_support.refused_by(t.setup)]
    if refusing and runnable:
        other = min(runnable, key=lambda t: t.plan.predicted.iteration_ms)
        console.print(f"{', '.join(refusing)} refuse ZeRO-{best.setup.data_parallel.zero} beside a pipeline; the fastest they "
                      f"run is {dataparallel.described(other.setup)}: {format_ms(other.plan.predicted.iteration_ms)}")


def print_json(trials: list[Trial], best: Trial | None, out: Path) -> None:
    import click

    from planner.cost import dataparallel
    from planner.emit import dp_support

    def one(trial: Trial) -> dict:
        plan = trial.plan
        if trial.setup is None:
            return {"zero": trial.zero, "shard_group": trial.shard_group, "offload": trial.offload, "fits": False,
                    "why_not": "refused", "reason": trial.reason, "best": False}
        return {"zero": trial.setup.data_parallel.zero, "shard_group": dataparallel.shard_size(trial.setup),
                "offload": trial.setup.data_parallel.offload, "fits": trial.fits, "why_not": trial.why_not or None,
                "iteration_ms": plan.predicted.iteration_ms if plan else None,
                "peak_bytes_per_stage": [s.predicted.peak_bytes for s in plan.stages] if plan else None,
                "static_bytes_per_stage": [s.predicted.static_bytes for s in plan.stages] if plan else None,
                "reserved_bytes_per_stage": [s.predicted.reserved_bytes for s in plan.stages] if plan else None,
                "host_bytes_per_node": trial.host_bytes if trial.host_bytes else None,
                "checkpointed_layers": sum(len(s.checkpointed) for s in plan.stages) if plan else None,
                "recomputing_layers": sum(len(s.recompute) for s in plan.stages) if plan else None,
                "communicated": dataparallel.communicated(trial.setup),
                "refused_by": dp_support.refused_by(trial.setup), "best": trial is best}

    click.echo(json.dumps({"plan": str(out) if best else None, "combinations": [one(t) for t in trials]},
                          indent=2))
