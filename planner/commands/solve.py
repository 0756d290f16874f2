"""`ckplan solve`: choose each stage's layers and checkpointed layers, write plan.yaml."""

from __future__ import annotations

import json
from pathlib import Path

import click

from planner.commands.setup_options import (
    SOLVER_OPTION,
    newest_profile,
    planned_setup,
    setup_options,
)
from planner.commands.training_settings import compiled_profile


@click.command("solve")
@click.option("--stages", type=click.IntRange(min=1), required=True, help="Pipeline stages (one device each).")
@setup_options
@SOLVER_OPTION
@click.option("--auto-dp", is_flag=True,
              help="Try every ZeRO stage x shard group x offload for --dp, re-solve the plan for each, show "
                   "them in one table and write the fastest that fits.")
@click.option("--time-limit", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              help="Seconds the solver may take; past it the best plan found is kept with its gap.")
@click.option("--out", type=click.Path(path_type=Path), default=Path("plan.yaml"), show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary instead of tables.")
@click.option("--sweep", is_flag=True,
              help="Instead of a plan: iteration time against memory cap for ckplan and the baselines, from the "
                   "least any plan needs up to --mem [default: what no checkpointing needs, +5%].")
@click.option("--plot", type=click.Path(path_type=Path), default=Path("sweep.png"), show_default=True,
              help="With --sweep: PNG chart (needs matplotlib).")
def command(stages, profile_path, mem, microbatches, schedule, chunks, optimizer, precision, runtime, recompute,
            fragmentation, parallel_stages, data_parallel, solver, auto_dp, time_limit, out, as_json, sweep,
            plot) -> None:
    """Choose, jointly, how many layers each pipeline stage gets and which of them are
    checkpointed, so every stage fits its cap and the iteration is fastest (exact: a
    dynamic programme, or the MILP on HiGHS with --solver milp; --time-limit bounds the
    whole solve).

    \b
    Prints the plan per stage and a comparison with the baselines (no/full
    checkpointing, ColossalAI ratio, Megatron block, compute-balanced), then
    writes the plan for `ckplan launch`.
    """
    from planner import io
    from planner.console import err_console, info
    from planner.errors import UserError
    from planner.schema import CHUNKED_SCHEDULES
    from planner.solve.deadline import Deadline

    deadline = Deadline(time_limit)  # one limit for the whole solve: loading, the schedule's order, the search

    if (schedule in CHUNKED_SCHEDULES or schedule == "auto") and (auto_dp or sweep):
        raise UserError(f"--auto-dp and --sweep plan 1F1B and GPipe; solve {schedule} without them")
    if schedule == "auto" and as_json:
        raise UserError("--schedule auto prints a table of the schedules; drop --json, or name one schedule")
    profile_path = profile_path or newest_profile()
    if sweep:
        io.check_outputs({"--plot": plot}, inputs={"--profile": profile_path})
    else:
        io.check_outputs({"--out": out}, inputs={"--profile": profile_path})
    profile = compiled_profile(io.load_profile(profile_path), data_parallel.settings)
    say = (lambda note: err_console.print(note)) if as_json else info  # stdout carries the JSON alone
    if (schedule == "auto" or auto_dp) and data_parallel.settings is not None and data_parallel.settings.float8:
        from planner.errors import UserError

        raise UserError("--float8 with --schedule auto or --auto-dp is not modelled: name the schedule and the "
                        "data-parallel degree")
    if schedule == "auto":
        from planner.commands.auto_schedule import run_auto_schedule

        run_auto_schedule(profile, profile_path, stages=stages, mem=mem, microbatches=microbatches, chunks=chunks,
                          optimizer=optimizer, precision=precision, runtime=runtime, recompute=recompute,
                          fragmentation=fragmentation, parallel_stages=parallel_stages, data_parallel=data_parallel,
                          solver=solver, time_limit_s=time_limit, out=out, say=say)
        return
    if auto_dp:
        from planner.commands.auto_dp import run_auto_dp

        run_auto_dp(profile, profile_path, stages=stages, data_parallel=data_parallel, solver=solver,
                    time_limit_s=time_limit, out=out, as_json=as_json, say=say, mem=mem, microbatches=microbatches,
                    schedule=schedule, chunks=chunks, optimizer=optimizer, precision=precision, runtime=runtime,
                    recompute=recompute, fragmentation=fragmentation, parallel_stages=parallel_stages)
        return
    sweep_top = mem
    if sweep and mem is None:  # the sweep sets the caps itself; --mem only bounds it from above
        mem = str(2**50)
    setup, time_notes = planned_setup(profile, profile_path, stages=stages, mem=mem, microbatches=microbatches,
                                      schedule=schedule, chunks=chunks, optimizer=optimizer, precision=precision,
                                      runtime=runtime, recompute=recompute, fragmentation=fragmentation,
                                      parallel_stages=parallel_stages, data_parallel=data_parallel, say=say,
                                      deadline=deadline)
    from planner.cost.float8 import float8_profile

    profile = float8_profile(profile, setup)  # --float8: the profile's Float8 records applied
    if sweep:
        from planner.commands.sweep import run_sweep

        run_sweep(profile, setup, plot=plot, time_limit_s=time_limit, as_json=as_json, solver=solver,
                  top_bytes=max(setup.pipeline.mem_caps_bytes) if sweep_top is not None else None)
        for note in time_notes:
            say(note)
        return
    from planner.errors import SolverTimeLimit, UserError
    from planner.solve.planning import Unplanned, make_plan

    plan = make_plan(profile, profile_path, setup, time_limit_s=time_limit, solver=solver, deadline=deadline)
    if isinstance(plan, Unplanned):
        raise (SolverTimeLimit if plan.status == "timeout" else UserError)(plan.message(setup))
    io.save_plan(plan, out)
    from planner.commands.solve_report import (
        print_plan,
        throughput_json,
        throughput_line,
        throughput_of,
    )
    from planner.commands.stage_json import range_line, reserve_ranges
    from planner.cost import costmodel

    found = throughput_of(profile, plan.setup, plan.predicted.iteration_ms)
    # each rank's dictionary reads its StageCost (stage_json: the keys every --json shares), which
    # the plan keeps only in part (StagePredicted): the plan scored again, as the solver scored it
    cost = costmodel.evaluate(plan.stages, profile, plan.setup)
    ranges = reserve_ranges(plan.stages, cost, profile=profile, setup=plan.setup)
    if as_json:
        click.echo(json.dumps(_summary(plan, cost, out, ranges) | {"throughput": throughput_json(found)}, indent=2))
    else:
        print_plan(plan, out)
        if (line := range_line(ranges, cost)) is not None:
            say(line)
        say(throughput_line(found))
    for note in time_notes:
        say(note)


def _summary(plan, cost, out: Path, ranges) -> dict:
    from planner.commands.stage_json import stages_json

    return {
        "plan": str(out),
        "solver": plan.solver.name,
        "status": plan.solver.status,
        "objective_ms": plan.solver.objective,
        "bound_ms": plan.solver.bound,
        "gap": plan.solver.gap,
        "solve_s": plan.solver.wall_s,
        "replay": plan.solver.replay,  # "relaxed", "cut" (the status holds against the replay: replaycuts), "searched"
        "solves": plan.solver.solves,
        # the search over caps cut by --time-limit: at most this many solves unmade, each about round_s seconds
        "rounds_left": plan.solver.rounds_left,
        "round_s": plan.solver.round_s,
        "timed_out": plan.solver.timed_out,  # --time-limit stopped a solver before it finished
        "iteration_ms": plan.predicted.iteration_ms,
        "stages": stages_json(plan.stages, cost, ranges),
        "baselines": [
            {"name": b.name, "feasible": b.feasible, "iteration_ms": b.iteration_ms} for b in plan.baselines
        ],
    }
