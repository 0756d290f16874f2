"""`ckplan calibrate --from-log LOG`: a training log's memory and step-time lines (Megatron-LM's,
torchtitan's; planner/measure/fromlog.py) set against the prediction for the same job (its
--from-megatron / --from-torchtitan config, or a plan), per pipeline rank and term, and what the
log can identify fitted."""

from __future__ import annotations

import json
from pathlib import Path

import click

from planner.errors import UserError


def run(*, log_path: Path, plan_path: Path | None, from_megatron: Path | None, from_torchtitan: Path | None,
        gpus: int | None, gpu: str, gpus_per_node: int | None, as_json: bool, nvlink_domain: int | None = None) -> None:
    from planner.measure import fromlog

    text = _read(log_path)
    log = fromlog.parse(text)
    if log is None:
        raise UserError(f"{log_path} has no line in Megatron-LM's format (`[Rank N] (after K iterations) memory (MB) "
                        "| ...`, `iteration I/ T | ... elapsed time per iteration (ms): ...`) or torchtitan's "
                        "(`step: N  loss: ...  memory: X GiB(Y%)  tps: ...`); give the training's log")
    _check_format(log.framework, log_path, from_megatron, from_torchtitan)
    prediction, source, left_out = _prediction(plan_path, from_megatron, from_torchtitan, gpus=gpus, gpu=gpu,
                                               gpus_per_node=gpus_per_node, nvlink_domain=nvlink_domain,
                                               framework=log.framework)
    found = fromlog.residuals(log, prediction)
    fitted = fromlog.fit(log, found)
    if as_json:
        click.echo(json.dumps({
            "log": str(log_path), "format": log.framework, "prediction": source, "steps": log.steps,
            "residuals": [{"rank": r.rank, "term": r.term, "predicted": r.predicted, "logged": r.logged,
                           "error": r.error} for r in found],
            "fitted": [{"name": n, "value": v, "how": how} for n, v, how in fitted.fitted],
            "not_identified": fitted.unidentified, "left_out": left_out}, indent=2))
        return
    _print(log_path, log, found, fitted, source, left_out)


def _check_format(framework: str, log_path: Path, from_megatron: Path | None, from_torchtitan: Path | None) -> None:
    """A log in one framework's format set against the other's config compares two jobs: refused."""
    names = {"megatron": ("Megatron-LM", "--from-megatron"), "torchtitan": ("torchtitan", "--from-torchtitan")}
    config = {"megatron": from_megatron, "torchtitan": from_torchtitan}
    other = "torchtitan" if framework == "megatron" else "megatron"
    if config[other] is not None:
        raise UserError(f"{log_path} is a {names[framework][0]} log, and {names[other][1]} {config[other]} a "
                        f"{names[other][0]} job: give that job's log, or the config this log's job ran with "
                        f"{names[framework][1]}")


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file; give the training's log") from None
    except OSError as exc:
        raise UserError(f"{path} cannot be read ({exc.__class__.__name__}); give the training's log") from None


def _prediction(plan_path, from_megatron, from_torchtitan, *, gpus, gpu, gpus_per_node, nvlink_domain=None,
                framework: str = "megatron"):
    from planner.measure import fromlog

    configs = [p for p in (plan_path, from_megatron, from_torchtitan) if p is not None]
    if len(configs) != 1:
        raise UserError("give what the log ran: one of PLAN, --from-megatron FILE or --from-torchtitan FILE.toml")
    if plan_path is not None and nvlink_domain is not None:
        raise UserError("--nvlink-domain goes with --from-megatron / --from-torchtitan: PLAN's setup holds its own links")
    if plan_path is not None:
        return _plan_prediction(plan_path, framework), str(plan_path), []
    from planner.commands.evaluate_config import predict, read_job
    from planner.models import archs

    job = read_job(from_megatron, from_torchtitan)
    p = predict(job, gpus=gpus, gpu_name=gpu, gpus_per_node=gpus_per_node, nvlink_domain=nvlink_domain)
    costs = p.cost.stages
    # Megatron's static line is allocated after the step: compared with what the rank holds then
    return fromlog.Prediction(static_bytes=[c.after_step_bytes for c in costs], peak_bytes=[c.peak_bytes for c in costs],
                              reserved_bytes=[c.reserved_bytes for c in costs], iteration_ms=p.cost.iteration_ms,
                              tokens_per_s_per_gpu=p.tokens_per_s_per_gpu, mfu=p.mfu(archs.gpu(gpu)),
                              world=p.gpus, tokens_per_gpu_step=p.tokens_per_iteration / p.gpus,
                              megatron_tflops_per_gpu=p.megatron_tflops_per_gpu(archs.gpu(gpu))), job.source, \
        [f"{s.name} {s.value}".strip() for status in ("not modelled", "unknown") for s in job.of(status)]


def _plan_prediction(plan_path: Path, framework: str):
    """A plan's prediction: its stages scored with its setup, and its throughput as solve and evaluate report it
    (solve_report.throughput_of: the profile's sequence length and tensor parallelism give the tokens and the GPUs,
    the context-parallel ranks sharing their replica's sequences; the MFU by the count of the framework whose log it
    is set against, `framework`, and Megatron-LM's TFLOP/s/GPU, where the profile records its architecture and GPU)."""
    from planner import io
    from planner.commands.calibration import resolve_profile
    from planner.commands.solve_report import throughput_of
    from planner.cost import costmodel
    from planner.cost.float8 import float8_profile
    from planner.emit import facts
    from planner.measure import fromlog

    plan = io.load_plan(plan_path)
    # as evaluate and export charge it: Float8's records and the runtime's fused kernels (planner/cost/float8.py)
    profile = float8_profile(io.load_profile(resolve_profile(plan, plan_path)), plan.setup)
    cost = costmodel.evaluate(plan.stages, profile, plan.setup)
    known = facts.read(profile)
    if known.seq_len is None:
        raise UserError(f"{plan_path}'s profile does not record its sequence length, so its tokens per step are not "
                        "known; calibrate from the config the job ran (--from-megatron / --from-torchtitan)")
    setup = plan.setup
    pipeline, dp = setup.pipeline, setup.data_parallel.dp
    world = pipeline.stages * dp * known.tp
    # dp counts the context-parallel ranks, which share their replica's sequences (as throughput_of counts them)
    tokens = pipeline.microbatches * pipeline.micro_batch_size * dp * known.seq_len // setup.training.context_parallel
    found = throughput_of(profile, setup, cost.iteration_ms)
    mfu = None if found is None else found.torchtitan_mfu if framework == "torchtitan" else found.megatron_mfu
    return fromlog.Prediction(static_bytes=[c.after_step_bytes for c in cost.stages],
                              peak_bytes=[c.peak_bytes for c in cost.stages],
                              reserved_bytes=[c.reserved_bytes for c in cost.stages], iteration_ms=cost.iteration_ms,
                              tokens_per_s_per_gpu=tokens / (cost.iteration_ms / 1e3) / world, mfu=mfu, world=world,
                              tokens_per_gpu_step=tokens / world,
                              megatron_tflops_per_gpu=None if found is None else found.megatron_tflops_per_gpu)


def _print(log_path: Path, log, found, fitted, source: str, left_out: list[str]) -> None:
    from planner.console import console, info, table
    from planner.units import format_bytes, format_ms

    def shown(term: str, value):
        if value is None:
            return "not in the log"
        if term.endswith("peak") or term == "static":
            return format_bytes(value)
        if term == "step time ms":
            return format_ms(value)
        if term == "MFU":
            return f"{value:.1%}" if value else "-"
        if term == "TFLOP/s/GPU":
            return f"{value:.1f}"
        return f"{value:,.0f}"

    # the term's name without its unit: format_ms writes each value's own (10.40 s, 850 ms)
    rows = [["job" if r.rank is None else str(r.rank), r.term.removesuffix(" ms"), shown(r.term, r.predicted),
             shown(r.term, r.logged),
             "-" if r.error is None else f"{r.error:+.1%}"] for r in found]
    console.print(table(f"{log_path} ({log.framework}, {log.steps} step lines) against {source}: "
                        "(logged - predicted) / predicted", ["rank", "term", "predicted", "logged", "residual"],
                        rows, right_from=2))
    if left_out:
        # the residuals hold what the prediction leaves out: said before anything is fitted to them
        info(f"the prediction leaves out {len(left_out)} setting(s) {source} gives, not modelled or unknown "
             f"(`ckplan evaluate` lists them): {', '.join(left_out)}; the residuals include their effect")
    for name, value, how in fitted.fitted:
        info(f"fitted {name}: {value:.3g} ({how})")
    for what in fitted.unidentified:
        info(f"not identified: {what}")
