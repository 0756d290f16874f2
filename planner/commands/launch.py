"""`ckplan launch PLAN`: run the plan, one process per stage, and compare each stage's
measured peak memory and time with the plan's prediction."""

from __future__ import annotations

import os
from pathlib import Path

import click


@click.command("launch")
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=Path))
@click.option("--steps", type=click.IntRange(min=1), default=10, show_default=True,
              help="Timed training steps (the iteration time is their median).")
@click.option("--warmup-steps", type=click.IntRange(min=0), default=2, show_default=True,
              help="Untimed steps first.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
              help="Where the stages run [default: the device the profile was measured on].")
@click.option("--backend", type=click.Choice(["gloo", "nccl"]), default=None,
              help="torch.distributed backend [default: gloo on cpu, nccl on cuda].")
@click.option("--report", "report_path", type=click.Path(path_type=Path), default=None,
              help="Write the run report (json) here.")
@click.option("--enforce-cap", is_flag=True,
              help="Hold each stage to its memory cap (cuda: allocator limit; cpu: checked after the run).")
@click.option("--strategy", default="ckplan", show_default=True,
              help="Run a baseline stored in the plan instead of ckplan's stages.")
@click.option("--force", is_flag=True, help="Run even if the model file changed since the plan was made.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for weights (same on every rank).")
@click.option("--start-timeout", "start_timeout_s", type=click.FloatRange(min=0, min_open=True), default=120.0,
              show_default=True, help="Seconds until every stage trains (imports, build_model, rendezvous); "
              "past it the job ends naming the stage that hung.")
@click.option("--progress-timeout", "progress_timeout_s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds one forward, backward, loss or optimizer step of a stage may take (or its process stay "
              "stopped) before the job ends naming it as hung [default: 20, or 10x the slowest predicted stage].")
@click.option("--dp", type=click.IntRange(min=1), default=None,
              help="Data-parallel replicas of every stage: stages x dp processes (under torchrun WORLD_SIZE must be "
                   "that) [default: the plan's setup.data_parallel.dp]. The plan's ZeRO stage, shard group and offload apply.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Torch threads per rank [default: the profile's if every rank can have them, else cores / ranks; "
                   "more than that oversubscribes the cores and is warned about].")
@click.option("--reference", is_flag=True,
              help="Afterwards train the same steps in one process (same batch and seed), show the loss "
                   "difference per step and fail if it is beyond float tolerance.")
def command(plan_path, steps, warmup_steps, device, backend, report_path, enforce_cap, strategy, force, seed,
            reference, start_timeout_s, progress_timeout_s, dp, threads) -> None:
    """Train PLAN's pipeline locally (one process per stage) or as one rank of torchrun,
    and show predicted vs measured memory and time per stage."""
    from planner import console, io
    from planner.runtime import in_torchrun, rank_threads, run_plan, unsupported_setup
    from planner.runtime.checks import zero_one_imbalance

    plan = with_dp(io.load_plan(plan_path), dp)
    io.check_outputs({"--report": report_path}, inputs={"PLAN": plan_path})
    device = device or plan.device.type
    speaks = not in_torchrun() or os.environ.get("RANK") == "0"
    for note in unsupported_setup(plan) + zero_one_imbalance(plan, plan_path) if speaks else []:
        console.warn(note)
    if speaks and dp is not None and plan.setup.data_parallel.dp != dp:
        console.warn(f"the plan was made for dp {plan.setup.data_parallel.dp}; its predictions are for that, not for --dp {dp}")
    with console.StepProgress("launch") as progress:
        report = run_plan(plan, plan_file=plan_path, strategy=strategy, steps=steps, warmup_steps=warmup_steps,
                          device=device, backend=backend, enforce_cap=enforce_cap, seed=seed, force=force,
                          start_timeout_s=start_timeout_s, progress_timeout_s=progress_timeout_s, threads=threads,
                          on_steps=progress.run(f"{strategy}, {plan.setup.pipeline.stages} stages x dp "
                                                f"{plan.setup.data_parallel.dp} on {device}"))
    if not speaks:
        return
    _announce(plan, device, steps, warmup_steps, rank_threads(plan, threads))
    console.console.print(memory_table(report))
    console.console.print(time_table(report, _strategy_stages(plan, strategy)))
    console.info(iteration_line(report))
    _calibration_line(plan, plan_path, strategy, report)
    if report_path is not None:
        io.save_report(report, report_path)
        console.info(f"report written to {report_path}")
    if reference:
        _check_reference(plan, report, plan_path=plan_path, seed=seed, force=force)
    over_cap(report)


def over_cap(report) -> None:
    """A run whose measured peak went over a stage's cap fails: the plan did not fit."""
    from planner.errors import UserError

    over = [stage for stage in report.stages if stage.measured.peak_bytes > stage.cap_bytes]
    if not over:
        return
    worst = max(over, key=lambda stage: stage.measured.peak_bytes / stage.cap_bytes)
    raise UserError(
        f"{len(over)} of {len(report.stages)} stages went over their cap: stage {worst.index} used "
        f"{_size(worst.measured.peak_bytes)} of {_size(worst.cap_bytes)} "
        f"({worst.measured.peak_bytes / worst.cap_bytes:.0%}), so the plan does not fit; run `ckplan validate` on it "
        "and re-solve from a new profile, or with a lower --mem"
    )


def with_dp(plan, dp: int | None):
    """The plan with `dp` replicas (its shard group must divide it)."""
    from pydantic import ValidationError

    from planner.errors import UserError
    from planner.io import describe_error

    if dp is None or dp == plan.setup.data_parallel.dp:
        return plan
    try:
        setup = plan.setup.model_copy(update={"dp": dp})
    except ValidationError as exc:
        raise UserError(f"--dp {dp} does not fit the plan: {describe_error(exc)}; give a --dp its shard group "
                        f"({plan.setup.data_parallel.shard_group}) divides") from exc
    return plan.model_copy(update={"setup": setup})


def _check_reference(plan, report, *, plan_path, seed: int, force: bool) -> None:
    from planner import console
    from planner.errors import UserError
    from planner.runtime.reference import against_reference

    with console.err_console.status("training the same steps in one process"):
        diffs = against_reference(plan, report, plan_file=plan_path, seed=seed, force=force)
    console.console.print(reference_table(diffs))
    off = [diff for diff in diffs if not diff.ok]
    if off:
        raise UserError(
            f"the pipeline's loss differs from one process by {off[0].diff:+.3g} at step {off[0].step} "
            f"(tolerance {off[0].tolerance:.2g}; {len(off)} of {len(diffs)} steps differ): the stages do not "
            "train the model one process trains; look for state the layers share or update outside their "
            "parameters (buffers, random numbers)"
        )
    largest = max(abs(diff.diff) for diff in diffs)
    console.info(f"the pipeline trains like one process: largest loss difference {largest:.2g} over "
                 f"{len(diffs)} steps (tolerance {min(diff.tolerance for diff in diffs):.2g})")


def reference_table(diffs):
    from planner import console

    rows = [[str(diff.step), f"{diff.pipeline:.6f}", f"{diff.reference:.6f}", f"{diff.diff:+.2e}",
             f"{diff.tolerance:.1e}", "ok" if diff.ok else "DIFFERS"] for diff in diffs]
    columns = ["step", "pipeline loss", "one process", "difference", "tolerance", ""]
    return console.table("loss per step: pipeline vs one process", columns, rows)


def _calibration_line(plan, plan_path, strategy: str, report) -> None:
    """The measured iteration beside the prediction before and after `ckplan calibrate`."""
    from planner import console
    from planner.commands.calibrate import before_after_line

    line = before_after_line(plan, plan_path, _strategy_stages(plan, strategy), report.iteration_ms,
                             threads=report.device.threads or 1)
    if line is not None:
        console.info(line)


def _announce(plan, device: str, steps: int, warmup_steps: int, threads: tuple[int, str]) -> None:
    from planner import console

    count, source = threads
    why = {"plan": "as profiled", "option": "--threads"}.get(
        source, f"{os.cpu_count()} cores / {plan.setup.pipeline.stages * plan.setup.data_parallel.dp} ranks")
    setup = plan.setup
    dp = (f" x dp {setup.data_parallel.dp} (ZeRO {setup.data_parallel.zero}, shard group {setup.data_parallel.shard_group or setup.data_parallel.dp}"
          f"{', optimizer offloaded' if setup.data_parallel.offload else ''})" if setup.data_parallel.dp > 1 or setup.data_parallel.offload else "")
    console.info(f"ran {plan.setup.pipeline.stages} stages{dp} on {device}: {plan.setup.pipeline.microbatches} microbatches of "
                 f"{plan.setup.pipeline.micro_batch_size}, {plan.setup.pipeline.schedule}, {warmup_steps} warm-up + {steps} timed "
                 f"steps, {count} torch thread{'s' if count != 1 else ''} per rank ({why})")
    if device == "cpu" and count * plan.setup.pipeline.stages * plan.setup.data_parallel.dp > (os.cpu_count() or 1):
        console.warn(f"{plan.setup.pipeline.stages * plan.setup.data_parallel.dp} ranks x {count} thread{'s' if count != 1 else ''} oversubscribe {os.cpu_count()} cores: "
                     "measured times will be longer than the profile's")


def _size(num_bytes: int) -> str:
    from planner.units import format_bytes

    return format_bytes(num_bytes)


def _error(measured: float, predicted: float | None) -> str:
    if not predicted:
        return "–"
    return f"{(measured - predicted) / predicted * 100:+.1f}%"


def _strategy_stages(plan, strategy: str):
    if strategy == "ckplan":
        return plan.stages
    return next(baseline.stages for baseline in plan.baselines if baseline.name == strategy)


def memory_table(report):
    """Per stage, predicted vs measured: peak memory against the stage's cap, and static
    memory (weights + grads + optimizer state on one rank, after ZeRO and offload)."""
    from planner import console

    rows = []
    for stage in report.stages:
        predicted = stage.predicted.peak_bytes if stage.predicted else None
        static = stage.predicted.static_bytes if stage.predicted else None
        measured, measured_static = stage.measured.peak_bytes, stage.measured.static_bytes
        rows.append([str(stage.index), _size(predicted) if predicted else "–", _size(measured),
                     _error(measured, predicted), _size(stage.cap_bytes),
                     console.bar(measured / stage.cap_bytes, width=10),
                     _size(static) if static else "–", _size(measured_static) if measured_static is not None else "–",
                     _error(measured_static, static) if measured_static is not None else "–"])
    columns = ["stage", "predicted", "measured", "err", "cap", "measured / cap", "static pred", "static", "err"]
    if any(stage.measured.reserved_bytes is not None for stage in report.stages):  # cuda: the allocator's reserve
        columns += ["reserved pred", "reserved", "err"]
        for row, stage in zip(rows, report.stages):
            predicted = stage.predicted.reserved_bytes if stage.predicted else None
            measured = stage.measured.reserved_bytes
            row += [_size(predicted) if predicted else "–", _size(measured) if measured is not None else "–",
                    _error(measured, predicted) if measured is not None else "–"]
    return console.table(f"{report.strategy}: peak memory per stage (static: per rank)", columns, rows)


def time_table(report, stages):
    """Compute time per microbatch per stage (backward includes recompute)."""
    from planner import console
    from planner.units import format_ms

    rows = []
    for stage, plan_stage in zip(report.stages, stages, strict=True):
        predicted = stage.predicted.time_ms if stage.predicted else None
        measured = stage.measured
        rows.append([str(stage.index), f"{len(plan_stage.recompute)}/{len(plan_stage.layers)}",  # any option, as solve
                     format_ms(measured.fwd_ms), format_ms(measured.bwd_ms),
                     format_ms(predicted) if predicted else "–", format_ms(measured.time_ms),
                     _error(measured.time_ms, predicted),
                     format_ms(stage.predicted.step_ms) if stage.predicted else "–",
                     format_ms(measured.step_ms) if measured.step_ms is not None else "–"])
    columns = ["stage", "ckpt", "fwd", "bwd", "predicted", "measured", "err", "opt step pred", "opt step"]
    return console.table(f"{report.strategy}: time per microbatch (fwd + bwd), optimizer step per iteration",
                         columns, rows)


def iteration_line(report) -> str:
    from planner.units import format_ms

    return (f"iteration: predicted {format_ms(report.predicted_iteration_ms)}, measured "
            f"{format_ms(report.iteration_ms)} ({_error(report.iteration_ms, report.predicted_iteration_ms)}), "
            f"median of {report.steps} steps after {report.warmup_steps} warm-up")
