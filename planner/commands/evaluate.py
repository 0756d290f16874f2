"""`ckplan evaluate`: score a hand-written configuration (layers and checkpointed layers per
stage) with the cost model, beside ckplan's optimal plan for the same setup."""

from __future__ import annotations

import json
from pathlib import Path

import click

from planner.commands.handplan import hand_stages, parse_counts
from planner.commands.setup_options import (
    SOLVER_OPTION,
    newest_profile,
    planned_setup,
    setup_options,
)
from planner.commands.training_settings import compiled_profile, op_sac_stages
from planner.cost.float8 import float8_profile
from planner.errors import UserError
from planner.schema import CHUNKED_SCHEDULES


def named_checkpoints(stages, text: str):
    """The stages with the named layers checkpointed (each in the stage that holds it)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    owner = {name: stage.index for stage in stages for name in stage.layers}
    unknown = [name for name in names if name not in owner]
    if unknown:
        raise UserError(f"--checkpoint names {', '.join(map(repr, unknown[:3]))}, not a layer of the profile; "
                        "give layer names as the profile lists them")
    return [stage.with_checkpointed([n for n in stage.layers if n in names]) for stage in stages]


@click.command("evaluate")
@click.option("--from-megatron", type=click.Path(path_type=Path), default=None, metavar="FILE",
              help="Score the job a Megatron-LM launch script (read, never run) or YAML of its arguments describes.")
@click.option("--from-torchtitan", type=click.Path(path_type=Path), default=None, metavar="FILE.toml|FILE.py:FN",
              help="Score the job a torchtitan job TOML, or config function (0.3.0, main; read, never run), "
                   "describes.")
@click.option("--gpus", type=click.IntRange(min=1), default=None,
              help="With --from-*: GPUs of the job [default: torchrun's --nproc_per_node x --nnodes in the script].")
@click.option("--gpu", default="h100-sxm", show_default=True, help="With --from-*: the GPU kind.")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=None,
              help="With --from-*: GPUs one host runs [default: the GPU kind's; a GB200 tray: 4].")
@click.option("--layers-per-stage", default=None, metavar="N,N,...",
              help="Layers of each stage, e.g. 19,20,20,21: all the profile's layers, or its decoder "
                   "layers only (the embedding then on the first stage, the head on the last).")
@click.option("--ckpt-per-stage", default=None, metavar="K,K,...",
              help="Checkpointed layers of each stage, e.g. 19,19,19,13 (at most that stage's layers).")
@click.option("--checkpoint", "checkpoint_names", default=None, metavar="NAME,NAME,...",
              help="Instead of --ckpt-per-stage: the checkpointed layers by name, as a plan lists them.")
@click.option("--ckpt-rule", type=click.Choice(["first", "last"]), default="first", show_default=True,
              help="Which k layers of a stage are checkpointed (ColossalAI and Megatron: the first).")
@click.option("--stages", type=click.IntRange(min=1), default=None,
              help="Pipeline stages [default: the length of --layers-per-stage].")
@setup_options
@SOLVER_OPTION
@click.option("--time-limit", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              help="Seconds the solver may take for ckplan's plan.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary instead of tables.")
def command(from_megatron, from_torchtitan, gpus, gpu, gpus_per_node, layers_per_stage, ckpt_per_stage, checkpoint_names, ckpt_rule, stages, profile_path, mem, microbatches, schedule,
            chunks, optimizer, precision, runtime, recompute, fragmentation, parallel_stages, data_parallel, solver,
            time_limit, as_json) -> None:
    """Score a configuration you run today (layers and checkpointed layers per stage) with
    the same cost model as ckplan's plans: each stage's peak against its cap, and the
    iteration time, beside ckplan's optimal plan for the same setup.

    \b
    ColossalAI's hand configuration for LLaMA3-70B on 4 stages:
      ckplan evaluate --layers-per-stage 19,20,20,21 --ckpt-per-stage 19,19,19,13 \\
          --microbatches 16 --precision bf16-mixed
    """
    from planner import io
    from planner.console import err_console, info
    from planner.cost import costmodel

    if from_megatron is not None or from_torchtitan is not None:
        from planner.commands import evaluate_config

        check_config_only(click.get_current_context())
        evaluate_config.run(from_megatron=from_megatron, from_torchtitan=from_torchtitan, gpus=gpus, gpu=gpu,
                            gpus_per_node=gpus_per_node, nvlink_domain=data_parallel.nvlink_domain, mem=mem, fragmentation=fragmentation, as_json=as_json)
        return
    check_config_options_absent(click.get_current_context())
    if layers_per_stage is None:
        raise UserError("give --layers-per-stage N,N,... (your configuration), or --from-megatron FILE / "
                        "--from-torchtitan FILE.toml")
    counts = parse_counts(layers_per_stage, "--layers-per-stage")
    chunks = chunks or (2 if schedule in CHUNKED_SCHEDULES else 1)
    if len(counts) % chunks:
        raise UserError(f"--layers-per-stage lists {len(counts)} stages for --chunks {chunks}; give one count per "
                        f"stage of every rank ({chunks} per rank), in pipeline order")
    if (ckpt_per_stage is None) == (checkpoint_names is None):
        raise UserError("give the checkpointed layers either as counts (--ckpt-per-stage 2,1,0) or by name "
                        "(--checkpoint NAME,NAME), one of the two")
    ckpts = parse_counts(ckpt_per_stage, "--ckpt-per-stage") if ckpt_per_stage is not None else [0] * len(counts)
    if stages is not None and stages * chunks != len(counts):
        raise UserError(f"--stages {stages} but --layers-per-stage lists {len(counts)} stages; give one count per stage"
                        + (f" ({chunks} per rank)" if chunks > 1 else ""))
    profile_path = profile_path or newest_profile()
    profile = compiled_profile(io.load_profile(profile_path), data_parallel.settings)
    say = (lambda note: err_console.print(note)) if as_json else info
    setup, time_notes = planned_setup(profile, profile_path, stages=len(counts) // chunks, mem=mem,
                                      microbatches=microbatches, schedule=schedule, chunks=chunks, optimizer=optimizer,
                                      precision=precision, runtime=runtime, recompute=recompute,
                                      fragmentation=fragmentation, parallel_stages=parallel_stages,
                                      data_parallel=data_parallel, say=say)
    profile = float8_profile(profile, setup)  # --float8: the profile's Float8 records applied (planner/cost/float8.py)
    hand = hand_stages(profile, counts, ckpts, ckpt_rule)
    if checkpoint_names is not None:
        hand = named_checkpoints(hand, checkpoint_names)
    if setup.training.op_level_sac:
        hand = op_sac_stages(hand, profile)
    if chunks > 1:
        hand = costmodel.ranks_of(hand, setup)
    hand_cost = costmodel.evaluate(hand, profile, setup)
    best = _ckplan_plan(profile, setup, hand, time_limit_s=time_limit, solver=solver)
    if as_json:
        click.echo(json.dumps(_summary(profile_path, hand, hand_cost, best, profile=profile, setup=setup), indent=2))
    else:
        _print(setup, hand, hand_cost, best, ckpt_rule)
        _print_ranges(profile, setup, hand, hand_cost)
        _print_divisor(profile, setup, hand, hand_cost, best)
        _print_throughput(profile, setup, hand_cost, best)
    for note in time_notes:
        say(note)


# what --from-megatron / --from-torchtitan take beside the file: the rest comes from the file
CONFIG_OPTIONS = ("from_megatron", "from_torchtitan", "gpus", "gpu", "gpus_per_node", "nvlink_domain", "mem", "fragmentation",
                  "as_json")


def check_config_only(ctx: click.Context) -> None:
    """A setup option beside a config file would say twice what the file says: refused."""
    given = [param for param in ctx.command.params if param.name not in CONFIG_OPTIONS
             and ctx.get_parameter_source(param.name) != click.core.ParameterSource.DEFAULT]
    if given:
        raise UserError(f"{given[0].opts[0]} is read from the config file with --from-megatron/--from-torchtitan; "
                        "drop it (only --gpus, --gpu, --gpus-per-node, --nvlink-domain, --mem, --fragmentation and --json go "
                        "beside)")


# what only a config file's job reads: with --profile the profile's GPU and the degrees given set them
CONFIG_ONLY = ("gpus", "gpu")


def check_config_options_absent(ctx: click.Context) -> None:
    """--gpus and --gpu beside a profile would be dropped (the degrees set the GPUs, the profile their kind):
    refused. (--gpus-per-node is read either way: the setup's topology.)"""
    given = [param for param in ctx.command.params if param.name in CONFIG_ONLY
             and ctx.get_parameter_source(param.name) != click.core.ParameterSource.DEFAULT]
    if given:
        raise UserError(f"{given[0].opts[0]} goes with --from-megatron/--from-torchtitan; with a profile the GPU is "
                        "the profile's (ckplan profile --gpu) and the GPUs are the stages x --dp the configuration "
                        "gives: drop it")


def _ckplan_plan(profile, setup, hand, *, time_limit_s: float, solver: str):
    """ckplan's plan for the same setup, by the path `solve` takes, started from the hand
    configuration where it fits and beats the baselines; None when no plan is found."""
    from planner.solve import search
    from planner.solve.planning import search_plan

    result, _ = search_plan(profile, setup, time_limit_s=time_limit_s, solver=solver, starts=[hand])
    return result if isinstance(result, search.PlanResult) else None


def stage_rows(stages, cost) -> list[list[str]]:
    """One row per stage: layers, checkpointed, peak (and on cuda reserved and nccl) against
    cap, time per microbatch."""
    from planner.commands.solve_report import _layer_range, _share, device_bytes, reserved_columns
    from planner.units import format_bytes, format_ms

    def counts(stage, cuda: bool) -> list[str]:  # cuda: one column, room for the reserved ones
        return [f"{len(stage.checkpointed)}/{len(stage.layers)}"] if cuda else \
            [str(len(stage.layers)), str(len(stage.checkpointed))]

    return [
        [str(stage.index), " + ".join(_layer_range(chunk) for chunk in stage.chunks or [stage.layers]),
         *counts(stage, c.reserved_bytes is not None),
         format_bytes(c.peak_bytes), *(reserved_columns(c.predicted()) if c.reserved_bytes is not None else []),
         format_bytes(c.cap_bytes), _share(device_bytes(c.predicted()) / c.cap_bytes, c.reserved_bytes is not None),
         "yes" if c.fits else "[bold red]NO[/]" if c.fits_host else "[bold red]NO (host)[/]", format_ms(c.time_ms)]
        for stage, c in zip(stages, cost.stages)
    ]


def stage_columns(cost) -> list[str]:
    from planner.commands.solve_report import RESERVED_COLUMNS

    if any(c.reserved_bytes is not None for c in cost.stages):
        return ["stage", "layers", "ckpt", "peak", *RESERVED_COLUMNS, "cap", "% cap", "fits", "time/mb"]
    return ["stage", "layers", "#", "ckpt", "peak", "cap", "peak / cap", "fits", "time/mb"]


def _print(setup, hand, hand_cost, best, rule: str) -> None:
    from planner.commands.solve_report import dp_words
    from planner.console import console, table
    from planner.units import format_ms

    chunked = setup.pipeline.chunks > 1
    ranks = f"{setup.pipeline.stages} ranks × {setup.pipeline.chunks} chunks" if chunked else \
        f"{setup.pipeline.stages} stages"
    where = (f"{ranks}, {setup.pipeline.microbatches} microbatches × {setup.pipeline.micro_batch_size}, "
             f"{setup.pipeline.schedule}, {setup.training.optimizer} {setup.training.precision}{dp_words(setup)}, "
             f"scored for {setup.training.runtime}'s runtime")
    console.print(table(f"your configuration ({rule} k layers of a stage checkpointed): {where}",
                        stage_columns(hand_cost), stage_rows(hand, hand_cost), right_from=2))
    if chunked:
        console.print(f"iteration {format_ms(hand_cost.iteration_ms)} (the schedule simulated: "
                      f"planner/cost/schedules.py); {'it fits' if hand_cost.feasible else '[bold red]it does not fit[/]'}")
    if best is None:
        console.print("[bold red]no plan fits these caps[/]: not ckplan's either; see `ckplan solve` for the "
                      "smallest cap that works")
        return
    console.print(table(f"ckplan's plan ({best.solve.status}): {where}", stage_columns(best.cost),
                        stage_rows(best.stages, best.cost), right_from=2))
    mine, theirs = hand_cost.iteration_ms, best.cost.iteration_ms
    if not hand_cost.feasible:
        over = [str(s) for s, c in enumerate(hand_cost.stages) if not c.fits]
        what = "cap" if all(c.fits_host for c in hand_cost.stages) else "cap or host memory"
        verdict = (f"[bold red]your configuration does not fit[/] (stage {', '.join(over)} over its {what}); "
                   f"ckplan's plan fits at {format_ms(theirs)} per iteration")
    else:
        verdict = (f"your configuration fits: {format_ms(mine)} per iteration; ckplan's plan takes "
                   f"{format_ms(theirs)} ({(1 - theirs / mine) * 100:.1f}% less)")
    console.print(verdict)


def _print_ranges(profile, setup, hand, hand_cost) -> None:
    """One line where the configuration's replayed reserve turns on its large requests' last pages
    (stage_json.range_line; ckplan's plan is solve's to say)."""
    from planner.commands.stage_json import range_line, reserve_ranges
    from planner.console import console

    line = range_line(reserve_ranges(hand, hand_cost, profile=profile, setup=setup), hand_cost)
    if line is not None:
        console.print(f"your configuration: {line}")


def divisor_lines(profile, setup, stages, cost) -> list[str]:
    """A line for each cuda stage whose reserve is the divisor's, not the allocator replay's, and why
    (replayed_reserve.divisor_reason); none where --fragmentation asks for the divisor everywhere."""
    from planner.cost.allocator import DEFAULT_FRAGMENTATION
    from planner.cost.replayed_reserve import divisor_reason

    if setup.pipeline.fragmentation is not None:
        return []
    return [f"stage {i}'s reserved is the divisor's (its allocated peak at {DEFAULT_FRAGMENTATION:.0%} "
            f"fragmentation), not the allocator replay's: {divisor_reason(stage, i, profile=profile, setup=setup)}"
            for i, (stage, c) in enumerate(zip(stages, cost.stages, strict=True))
            if c.reserved_bytes is not None and c.reserved_by != "replay"]


def _print_divisor(profile, setup, hand, hand_cost, best) -> None:
    from planner.console import console

    for who, stages, cost in (("your configuration", hand, hand_cost),
                              *((("ckplan's plan", best.stages, best.cost),) if best is not None else ())):
        for line in divisor_lines(profile, setup, stages, cost):
            console.print(f"{who}: {line}")


def _print_throughput(profile, setup, hand_cost, best) -> None:
    from planner.commands.solve_report import throughput_line, throughput_of
    from planner.console import console

    console.print(f"your configuration {throughput_line(throughput_of(profile, setup, hand_cost.iteration_ms))}")
    if best is not None:
        console.print(f"ckplan's plan {throughput_line(throughput_of(profile, setup, best.cost.iteration_ms))}")


def _summary(profile_path: Path, hand, hand_cost, best, *, profile, setup) -> dict:
    from planner.commands.solve_report import throughput_json, throughput_of
    from planner.commands.stage_json import reserve_ranges, stages_json

    def describe(stages, cost, ranges=None) -> dict:
        return {
            "feasible": cost.feasible,
            "iteration_ms": cost.iteration_ms,
            "throughput": throughput_json(throughput_of(profile, setup, cost.iteration_ms)),
            "stages": stages_json(stages, cost, ranges),
        }

    # the reserve's range for the configuration given (its replay three times); ckplan's plan's is solve's to give
    return {"profile": str(profile_path),
            "hand": describe(hand, hand_cost, reserve_ranges(hand, hand_cost, profile=profile, setup=setup)),
            "ckplan": describe(best.stages, best.cost) | {"status": best.solve.status, "solver": best.solve.solver}
            if best else None}
