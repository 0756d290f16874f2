"""`ckplan calibrate PLAN`: measure on this machine what the profile leaves out — sends
between stages, the schedule's cost per action, compute at the threads a launch gives each
rank, ranks sharing cores — and write the constants beside the profile
(<profile>.calibration.json), where `solve` reads them. Also the helpers `solve`, `launch`
and `compare` use to read them and to show the prediction before and after calibration."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

import click

from planner.commands.calibration import (
    calibration_path,
    load_calibration,
    resolve_profile,
)
from planner.errors import UserError


@click.command("calibrate")
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=Path), required=False)
@click.option("--from-log", "log_path", type=click.Path(path_type=Path), default=None, metavar="LOG",
              help="Instead of running PLAN: read the memory and step-time lines a Megatron-LM or torchtitan run "
                   "printed, set them against PLAN's (or --from-megatron / --from-torchtitan's) prediction per rank "
                   "and term, and fit what they identify.")
@click.option("--from-megatron", type=click.Path(path_type=Path), default=None, metavar="FILE",
              help="With --from-log: the Megatron-LM launch script or YAML the log's run used.")
@click.option("--from-torchtitan", type=click.Path(path_type=Path), default=None, metavar="FILE.toml|FILE.py:FN",
              help="With --from-log: the torchtitan job TOML or config function (read, never run) the log's run used.")
@click.option("--gpus", type=click.IntRange(min=1), default=None, help="With --from-log and a config: its GPUs.")
@click.option("--gpu", default="h100-sxm", show_default=True, help="With --from-log and a config: the GPU kind.")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=None,
              help="With --from-log and a config: GPUs one host runs.")
@click.option("--nvlink-domain", type=click.IntRange(min=1), default=None, metavar="GPUS",
              help="With --from-log and a config: GPUs that reach each other over NVLink, whole hosts [default: "
                   "the GPU kind's].")
@click.option("--json", "as_json", is_flag=True, help="With --from-log: a machine-readable report.")
@click.option("--steps", type=click.IntRange(min=1), default=5, show_default=True,
              help="Timed training steps of the plan's pipeline.")
@click.option("--warmup-steps", type=click.IntRange(min=0), default=2, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Torch threads per rank [default: what `launch` uses: the profile's if every rank can have "
                   "them, else cores / ranks].")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
              help="[default: the device the profile was measured on]")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Calibration file [default: <profile>.calibration.json beside the profile, where solve looks].")
@click.option("--force", is_flag=True, help="Run even if the model file changed since the plan was made.")
@click.option("--accept", is_flag=True,
              help="Write the fit even if it looks suspect (taken under load, or far from the last fit).")
def command(plan_path, log_path, from_megatron, from_torchtitan, gpus, gpu, gpus_per_node, nvlink_domain, as_json, steps,
            warmup_steps, threads, device, out, force, accept) -> None:
    """Time point-to-point sends (a ping-pong micro-benchmark on the plan's backend), run
    PLAN's pipeline briefly, and fit the send latency and bandwidth, the compute scale,
    the cost per schedule action (ranks within the cores) or the cost of ranks sharing
    cores (more ranks than cores), so `solve` predicts what `launch` measures.

    \b
    With --from-log LOG nothing runs: a Megatron-LM or torchtitan log set against the prediction
      ckplan calibrate --from-log train.log --from-megatron train_llama3_8b.sh
    """
    from planner import console, io
    from planner.measure import calibrate
    from planner.profiler import commbench
    from planner.runtime.checks import check_runnable, resolve_model_file
    from planner.runtime.launcher import rank_threads, run_plan

    if log_path is not None:
        from planner.commands import calibrate_log

        calibrate_log.run(log_path=log_path, plan_path=plan_path, from_megatron=from_megatron,
                          from_torchtitan=from_torchtitan, gpus=gpus, gpu=gpu, gpus_per_node=gpus_per_node,
                          nvlink_domain=nvlink_domain, as_json=as_json)
        return
    if nvlink_domain is not None:
        raise UserError("--nvlink-domain places a config's collectives with --from-log; a run of PLAN measures its own")
    if plan_path is None or from_megatron or from_torchtitan:
        raise UserError("give PLAN to run and calibrate; --from-megatron/--from-torchtitan go with --from-log LOG")
    plan = io.load_plan(plan_path)
    if plan.profile_source == "analytic":
        raise UserError(f"{plan_path} was planned from an analytic profile (`profile --arch`), which has no model to "
                        "run; calibration runs a plan of a measured profile (`ckplan profile MODEL.py`) on the "
                        "machines that train")
    if plan.profile_source == "fake":
        raise UserError(f"{plan_path} was planned from a --fake profile, run on no hardware; calibration runs a plan "
                        "of a measured profile (`ckplan profile MODEL.py`) on the machines that train")
    check_runnable(plan)
    profile_path = resolve_profile(plan, plan_path)
    out = out or calibration_path(profile_path)
    io.check_outputs({"--out": out}, inputs={"PLAN": plan_path, "the plan's profile": profile_path})
    resolve_model_file(plan, plan_path)  # before the sends are timed: a plan that cannot run fails at once
    profile = io.load_profile(profile_path)
    device = device or plan.device.type
    backend = "nccl" if device == "cuda" else "gloo"
    threads, _ = rank_threads(plan, threads)
    ranks, cores = plan.setup.pipeline.stages * plan.setup.data_parallel.dp, os.cpu_count() or 1
    busy = busy_share()
    with console.err_console.status(f"timing sends ({backend}, {device})"):
        sends = commbench.measure_sends(backend=backend, device=device, threads=threads)
    with console.StepProgress("calibrate") as progress:
        report = run_plan(plan, plan_file=plan_path, steps=steps, warmup_steps=warmup_steps, device=device,
                          backend=backend, force=force, threads=threads,
                          on_steps=progress.run(f"{plan_path.name}, {ranks} ranks x {threads} threads"))
    old = load_calibration(out) if out.is_file() else None
    if old is not None and old.profile.sha256 != io.sha256_file(profile_path):
        console.warn(f"{out} was fitted to another version of the profile: replacing it, not merging")
        old = None
    new = fitted(plan, plan_path, profile, profile_path, report, sends, old, threads=threads, cores=cores,
                 backend=backend, device=device)
    calibration = calibrate.merged(old, new)
    print_fit(calibration, plan, profile, report, threads=threads, source=str(out))
    expected = (calibrate.placement_scale(profile.device, ranks=ranks, threads=threads, cores=cores)
                if device == "cpu" and profile.device.thread_ms else None)
    reasons = calibrate.suspect(new, old, expected_scale=expected, busy_share=busy,
                                oversubscribed=ranks * threads / cores)
    for reason in reasons:
        console.warn(f"suspect fit: {reason}")
    if reasons and not accept:
        kept = f"{out} keeps the earlier constants" if old is not None else f"{out} was not written"
        raise UserError(f"this fit looks suspect and {kept}; re-run `ckplan calibrate` on a quiet machine, or "
                        "pass --accept to use it")
    io.write_atomic(out, calibration.model_dump_json(indent=2) + "\n")
    console.info(f"calibration written to {out}; `ckplan solve --profile {profile_path}` now uses it")


def fitted(plan, plan_path, profile, profile_path, report, sends, old, *, threads: int, cores: int, backend: str,
           device: str):
    """The Calibration of this run: sends fitted from the ping-pong, the placement's
    constants from the pipeline (the action cost kept from `old` when ranks share cores)."""
    from planner import io
    from planner.measure import calibrate
    from planner.profiler.commbench import REPEATS
    from planner.schema import Calibration

    latency_ms, gb_per_s = calibrate.fit_send(sends)
    ranks = plan.setup.pipeline.stages * plan.setup.data_parallel.dp
    setup = calibrate.with_sends(placed(calibrate.uncalibrated(plan.setup), threads=threads, cores=cores,
                                        device=device), latency_ms, gb_per_s)
    sample = calibrate.PipelineSample(stages=plan.stages, stage_ms=[s.measured.time_ms for s in report.stages],
                                      iteration_ms=report.iteration_ms)
    prior = old.action_overhead_ms if old is not None else None
    fit, overhead = calibrate.fit_placement(sample, profile, setup, ranks=ranks, threads=threads, cores=cores,
                                            plan=str(plan_path), action_overhead_ms=prior)
    bandwidth = f"{gb_per_s:.3g} GB/s" if gb_per_s else "no bandwidth resolved (time did not rise with bytes)"
    notes = [
        f"sends: {backend} on {device}, ping-pong of {len(sends)} sizes ({sends[0].num_bytes}-{sends[-1].num_bytes} "
        f"bytes), median of {REPEATS} round trips each: latency {latency_ms:.3g} ms, {bandwidth}",
        f"{plan_path}: {report.steps} steps after {report.warmup_steps} warm-up, {ranks} ranks x {threads} threads "
        f"on {cores} cores (load average {os.getloadavg()[0]:.1f}): the stages' measured fwd + bwd "
        f"x{calibrate.fit_compute_scale(sample, profile, setup):.3g} the profile's",
    ]
    if costmodel_shares(setup):
        notes.append(f"ranks share cores: sharing x{fit.cpu_sharing:.3g} fitted to the iteration; action cost "
                     + (f"{overhead:.3g} ms kept from the earlier calibration" if prior is not None else
                        "not measured (0): calibrate a plan whose ranks fit the cores first"))
    elif fit.compute_scale < calibrate.fit_compute_scale(sample, profile, setup):
        notes.append(f"the iteration ran faster than its stages imply (ranks slow each other only while both "
                     f"compute): no action cost, compute x{fit.compute_scale:.3g} fitted to stages and iteration")
    else:
        notes.append(f"compute x{fit.compute_scale:.3g}; action cost {overhead:.3g} ms per forward or backward, "
                     "fitted to the iteration")
    return Calibration(created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       profile=io.file_ref(profile_path), backend=backend, device_type=device,
                       send_latency_ms=latency_ms, send_gb_per_s=gb_per_s, action_overhead_ms=overhead,
                       placements=[fit], notes=notes)


def busy_share(seconds: float = 0.5) -> float | None:
    """The share of this machine's CPU time other processes used over the next `seconds`
    (from /proc/stat; None where there is none)."""
    import time

    def sample() -> tuple[int, int]:
        fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields), fields[3] + (fields[4] if len(fields) > 4 else 0)  # total, idle + iowait

    try:
        total_before, idle_before = sample()
        time.sleep(seconds)
        total_after, idle_after = sample()
    except (OSError, ValueError, IndexError):
        return None
    total = total_after - total_before
    return None if total <= 0 else 1 - (idle_after - idle_before) / total


def costmodel_shares(setup) -> bool:
    from planner.cost import costmodel

    return costmodel.parallel_stages(setup) < setup.pipeline.stages


def placed(setup, *, threads: int, cores: int, device: str = "cpu"):
    """The setup with the stages that compute at once for this placement (CPU ranks of
    `threads` threads sharing `cores`; on GPUs all of them), and on CPU the optimizer step at the
    ranks' `threads` (rank_threads), as calibrate.threaded and calibrate.apply charge it: the
    constants are fitted to the run against the step the run took."""
    from planner.placement import stages_at_once

    if device == "cuda":
        return setup.model_copy(update={"parallel_stages": None})
    return setup.model_copy(update={"parallel_stages": stages_at_once(cores=cores, threads=threads,
                                                                      stages=setup.pipeline.stages, dp=setup.data_parallel.dp),
                                    "rank_threads": threads})


def print_fit(calibration, plan, profile, report, *, threads: int, source: str) -> None:
    """Per stage and for the iteration: the uncalibrated prediction, the calibrated one, the measurement."""
    from planner import console
    from planner.cost import costmodel
    from planner.measure import calibrate
    from planner.units import format_ms

    cores, ranks = os.cpu_count() or 1, plan.setup.pipeline.stages * plan.setup.data_parallel.dp
    base = placed(calibrate.threaded(plan.setup, profile.device, threads, ranks=ranks, cores=cores), threads=threads, cores=cores,
                  device=plan.device.type)
    before = costmodel.evaluate(plan.stages, profile, base)
    after = costmodel.evaluate(plan.stages, profile, calibrate.apply(base, calibration, ranks=ranks, threads=threads,
                                                                     source=source, device=profile.device, cores=cores))
    rows = [[str(stage.index), format_ms(b.time_ms), format_ms(a.time_ms), format_ms(stage.measured.time_ms)]
            for stage, b, a in zip(report.stages, before.stages, after.stages, strict=True)]
    rows.append(["iteration", format_ms(before.iteration_ms), format_ms(after.iteration_ms),
                 format_ms(report.iteration_ms)])
    console.console.print(console.table("predicted before and after calibration, and measured (stages: fwd + bwd "
                                        "per microbatch)", ["", "before", "after", "measured"], rows))
    for note in calibration.notes:
        console.info(note)


# ---------------------------------------------------------------- reading it back


def before_after(plan, plan_path: Path, stages, *, threads: int) -> tuple[float, float | None, str] | None:
    """The iteration `stages` take by the uncalibrated cost model and by the calibration
    beside the plan's profile (None: none there), and where that came from; None when
    the profile cannot be read."""
    from planner import io
    from planner.cost import costmodel
    from planner.measure import calibrate

    try:
        profile_path = resolve_profile(plan, plan_path)
        profile = io.load_profile(profile_path)
    except UserError:
        return None
    cores, ranks = os.cpu_count() or 1, plan.setup.pipeline.stages * plan.setup.data_parallel.dp
    base = placed(calibrate.threaded(plan.setup, profile.device, threads, ranks=ranks, cores=cores), threads=threads, cores=cores,
                  device=plan.device.type)
    before = costmodel.evaluate(stages, profile, base).iteration_ms
    path = calibration_path(profile_path)
    if not path.is_file():
        return before, None, "no calibration"
    after = calibrate.apply(base, load_calibration(path), ranks=ranks, threads=threads, source=str(path),
                            device=profile.device, cores=cores)
    return before, costmodel.evaluate(stages, profile, after).iteration_ms, after.time.calibration


def before_after_line(plan, plan_path: Path, stages, measured_ms: float, *, threads: int) -> str | None:
    """One sentence: measured, predicted uncalibrated and calibrated, each with its error."""
    from planner.units import format_ms

    found = before_after(plan, plan_path, stages, threads=threads)
    if found is None:
        return None
    before, after, source = found

    def err(predicted: float) -> str:
        return f"{(measured_ms - predicted) / predicted * 100:+.1f}%"

    line = f"iteration {format_ms(measured_ms)} measured; predicted {format_ms(before)} uncalibrated ({err(before)})"
    if after is None:
        return line + "; not calibrated (`ckplan calibrate PLAN`)"
    return line + f", {format_ms(after)} calibrated ({err(after)}) by {source}"
