"""`ckplan export`: write a plan as the configuration a framework reads, say what the
framework cannot express, and score the rounded plan beside the exact one."""

from __future__ import annotations

from pathlib import Path

import click

from planner.errors import UserError

TARGETS = ("colossalai", "megatron", "torchtitan", "deepspeed")
LAUNCHERS = ("torchrun", "slurm", "kubernetes")  # how to start it: planner/emit/launchers.py


@click.command("export")
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=Path))
@click.option("--to", "target", type=click.Choice(TARGETS + LAUNCHERS), required=True,
              help="The framework you train with, or how to start the job: torchrun (a line per node), slurm (an "
                   "sbatch script), kubernetes (Kubeflow Trainer's TrainJob).")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Where to write [default: beside the plan, e.g. plan.megatron.sh].")
@click.option("--profile", "profile_path", type=click.Path(path_type=Path), default=None,
              help="The plan's profile, to re-score the rounding [default: the file the plan names].")
@click.option("--torchtitan-version", default="0.3.0", show_default=True,
              help="torchtitan release (0.3.0 is configured in Python, 0.2.x in TOML), or main: torchtitan's main "
                   "branch after 73aed7f6c, which counts the batch in tokens (read at b5bcd76c). With torchrun, "
                   "slurm, kubernetes: the trainer a torchtitan plan's launch file runs, on that version's export.")
@click.option("--torchtitan-base", default=None, metavar="MODULE:FUNCTION",
              help="torchtitan (0.3+) config function the export refines [default: torchtitan's own config "
                   "for the profile's architecture, e.g. ...llama3.config_registry:llama3_70b].")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=None,
              help="With torchrun, slurm, kubernetes: GPUs (processes) a host [default: the host the plan was "
                   "scored for, else its GPU's: 8 on a DGX, 4 on a GB200 tray; 8 on cpu].")
@click.option("--entry", default=None, metavar="'PROGRAM ARGS'",
              help="With torchrun, slurm, kubernetes: what each process runs [default: `ckplan launch PLAN` for "
                   "ckplan's runtime; for torchtitan's, torchtitan.train on the export of --torchtitan-version: "
                   "--module PLAN_torchtitan --config ckplan_config (0.3.0, main) or --job.config_file "
                   "PLAN.torchtitan.toml (0.2.x)].")
@click.option("--image", default=None, help="With kubernetes: the training container image.")
def command(plan_path, target, out, profile_path, torchtitan_version, torchtitan_base, gpus_per_node, entry,
            image) -> None:
    """Write PLAN as ColossalAI, Megatron-LM, torchtitan or DeepSpeed configuration, with
    comments. What the framework cannot say is rounded (e.g. Megatron's one recompute
    count for every stage, a schedule it does not have), and the rounded plan is re-scored
    with the cost model: iteration time and each rank's peak against its cap, beside the
    exact plan.
    """
    from planner import io

    io.check_outputs({"--out": out}, inputs={"PLAN": plan_path, "--profile": profile_path})
    plan = io.load_plan(plan_path)
    profile, read_profile = _profile_of(plan, plan_path, profile_path)
    # every file the export reads, the plan's own profile too: --out never replaces one of them
    inputs = {"PLAN": plan_path, "plan's profile": read_profile, "--profile": profile_path}
    io.check_outputs({"--out": out}, inputs=inputs)
    from planner.emit import facts

    facts.read(profile)  # what the export copies from the profile, typed, before anything reads it
    _check_plan(plan, profile, plan_path)
    ctx = click.get_current_context()
    _refuse_torchtitan_options(ctx, target)
    if target in LAUNCHERS:
        given = ctx.get_parameter_source("torchtitan_version") != click.core.ParameterSource.DEFAULT
        _launcher(target, plan, profile, plan_path, out, inputs, gpus_per_node=gpus_per_node, entry=entry, image=image,
                  torchtitan_version=torchtitan_version if given else None)
        return
    _refuse_launch_options(click.get_current_context())
    _refuse_pure_bf16(plan)
    _refuse_fp16(plan, target)
    _refuse_unbuilt_block(profile, target)  # what the framework cannot build at all, before how it would run it
    _refuse_experts(profile, target)
    _refuse_megatron_settings(plan, target)
    _refuse_tied(plan, profile, target)
    _refuse_offload(plan)
    from planner.commands.training_settings import TrainingSettings, compiled_profile

    # a plan made under --compile is re-scored under it (solve scored it so; its profile file holds the
    # records uncompiled); the exporter applies each runtime's kernels and --float8 where it scores
    # (planner/emit/rounding.py evaluate): the framework it writes for may not be the plan's runtime
    profile = compiled_profile(profile, TrainingSettings(compile_model=plan.setup.training.compile))
    result = _exporter(target, plan, profile, str(plan_path), torchtitan_version, torchtitan_base)
    if out is None:
        out = plan_path.with_name(_export_name(target, plan_path.stem, result.suffix, torchtitan_version))
        io.check_outputs({"--out": out}, inputs=inputs)
    io.write_atomic(out, result.text)
    _report(plan, result, out, optimizer_impl=profile.assumptions.get("optimizer_impl"))
    if target == "torchtitan" and torchtitan_base is not None:
        _unchecked_base(torchtitan_base, profile)


def _unchecked_base(base: str, profile) -> None:
    """A --torchtitan-base whose model is not checked against the plan's, said: one ckplan does not
    know, or one it knows beside a profile that records no model dimensions (a model file's, measured
    or --fake: torchtitan._check_base_model has nothing to compare, and checks the depth only)."""
    from planner.console import warn
    from planner.emit import facts, torchtitan

    if base not in torchtitan.BASE_MODELS:
        warn(f"--torchtitan-base {base} is not a torchtitan config function ckplan knows (it knows "
             f"{', '.join(b.rsplit(':', 1)[1] for b in torchtitan.BASE_MODELS)}): the model it builds is not checked "
             "against the plan's; the written file checks only its depth, when it runs")
    elif facts.read(profile).model is None:
        warn(f"--torchtitan-base {base} builds {torchtitan.BASE_MODELS[base]}, and the plan's profile (a model "
             "file's, measured or --fake) records no model dimensions: only its depth was checked against the "
             "plan's, not its widths, heads or vocabulary; make sure the plan's model is the one it builds")


def _export_name(target: str, stem: str, suffix: str, torchtitan_version: str) -> str:
    """The export's file beside the plan: STEM + the target's suffix; torchtitan's Python config a
    module name torchtitan can import (planner/emit/torchtitan.py module_name)."""
    if target == "torchtitan":
        from planner.emit import torchtitan

        return torchtitan.export_name(stem, torchtitan_version)
    return stem + suffix


def _launcher(target, plan, profile, plan_path: Path, out: Path | None, inputs: dict, *, gpus_per_node: int,
              entry: str | None, image: str | None, torchtitan_version: str | None) -> None:
    """One launch file (planner/emit/launchers.py)."""
    from planner import io
    from planner.console import info
    from planner.emit import launchers

    if image is not None and target != "kubernetes":
        raise UserError("--image is the Kubernetes job's container image; it applies to --to kubernetes only")
    argv = launchers.entry_argv(entry) if entry is not None else None
    tp = profile.assumptions.get("tp", 1)
    scored = _host_gpus(plan, profile)
    if gpus_per_node is not None and gpus_per_node != scored and plan.setup.comm.nvlink_domain is not None:
        from planner.console import warn

        warn(f"--gpus-per-node {gpus_per_node}: the plan was scored for hosts of {scored} GPUs (the ranks sharing a "
             f"host's memory, where its NVLink domain's links stop, the launch's allocator settings); this launch runs "
             f"{gpus_per_node} a host, which the plan's figures do not hold for: solve again with --gpus-per-node "
             f"{gpus_per_node} to score it")
    gpus_per_node = gpus_per_node or scored
    launch = launchers.launch_for(plan, plan_path, tp=tp if isinstance(tp, int) else 1, gpus_per_node=gpus_per_node,
                                  entry=argv, image=image, gpu_name=plan.device.name,
                                  torchtitan_version=torchtitan_version)
    out = out or plan_path.with_name(plan_path.stem + launchers.SUFFIX[target])
    io.check_outputs({"--out": out}, inputs=inputs)
    io.write_atomic(out, launchers.RENDER[target](launch))
    info(f"{target}: {launch.num_nodes} node(s) x {launch.gpus_per_node} GPUs; wrote {out}")
    note = launchers.missing_export(launch, plan_path, torchtitan_version) if argv is None else None
    if note is not None:
        from planner.console import warn

        warn(note)


def _host_gpus(plan, profile) -> int:
    """The GPUs a host runs where --gpus-per-node is not given: the plan's host where it was scored with hosts and
    NVLink domains apart (CommSetup.nvlink_domain set), else its GPU's (planner/models/topology.py: a GB200 tray's 4,
    not the NVL72 rack's 72), else 8 (a cpu profile)."""
    from planner.cost import dataparallel
    from planner.models import topology

    if plan.setup.comm.nvlink_domain is not None:
        return plan.setup.comm.gpus_per_node
    if profile.device.type != "cuda":
        return 8
    try:
        return topology.host_gpus(dataparallel.profile_gpu(profile), None)
    except UserError:
        return 8


def _refuse_unbuilt_block(profile, target: str) -> None:
    """A block the framework has no model for (Gemma 3's post-norms, SmolLM3's NoPE layers): one sentence, first."""
    from planner.emit import facts, layer_kinds

    known = facts.read(profile)
    if target == "torchtitan":
        layer_kinds.torchtitan_checked(known)
    elif target == "megatron" and known.model is not None:
        layer_kinds.megatron_arguments(known.model)


def _refuse_torchtitan_options(ctx, target: str) -> None:
    """--torchtitan-version and --torchtitan-base say what the torchtitan export writes: another target
    takes neither, but a launch file takes the version (the trainer it runs, on that version's export)."""
    for name, flag in (("torchtitan_version", "--torchtitan-version"), ("torchtitan_base", "--torchtitan-base")):
        if name == "torchtitan_version" and target in LAUNCHERS:
            continue
        if target != "torchtitan" and ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT:
            raise UserError(f"{flag} applies to --to torchtitan (the config it writes); drop it"
                            + (" (a launch file runs the config `--to torchtitan` wrote with it)"
                               if target in LAUNCHERS else ""))


def _refuse_launch_options(ctx) -> None:
    """--gpus-per-node, --entry and --image say how to start a job: a framework's config takes none."""
    for name, flag in (("gpus_per_node", "--gpus-per-node"), ("entry", "--entry"), ("image", "--image")):
        if ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT:
            raise UserError(f"{flag} applies to --to torchrun, slurm or kubernetes; drop it")


def _refuse_pure_bf16(plan) -> None:
    """Every framework ckplan exports to trains bf16 with fp32 master weights and optimizer
    state; a plan charged for bf16 throughout (ckplan's runtime) would hold other bytes there."""
    if plan.setup.training.precision == "bf16":
        raise UserError("the plan trains in bf16 throughout (--precision bf16, as ckplan's runtime does), and no "
                        "framework does that: they keep fp32 master weights and optimizer state; solve again with "
                        "--precision bf16-mixed and export that plan")


def _refuse_fp16(plan, target: str) -> None:
    """An fp16-mixed plan exported to a framework whose record trains no fp16 (torchtitan, ColossalAI's path not
    read): the sentence its runtime's refusal says (planner/cost/runtime_fp16.py)."""
    from planner.cost import runtime_fp16, runtimes

    refused = runtime_fp16.refusal(plan.setup.training.precision, runtimes.facts(target), plan.setup.data_parallel.zero)
    if refused:
        raise UserError(refused.replace(f"--runtime {target}", f"--to {target}"))


# Targets whose exports write no expert or latent-attention settings: ColossalAI's MoE runs
# through its own MoeHybridParallelPlugin and model policies (ep_size, its MoE layers), DeepSpeed's
# through deepspeed.moe.layer.MoE inside the model's code, not through the pipeline settings
# these exports write. Megatron-LM and torchtitan (0.3.0) write them (planner/emit/).
_NO_EXPERTS = ("colossalai", "deepspeed")


def _refuse_experts(profile, target: str) -> None:
    """A mixture of experts or latent attention exported to a target that writes neither would
    be exported as a dense model: refused, in one sentence."""
    from planner.emit import facts

    model = facts.read(profile).model
    if target in _NO_EXPERTS and model is not None and (model.num_experts or model.kv_lora_rank):
        what = "mixture-of-experts" if model.num_experts else "multi-head latent attention"
        raise UserError(f"the plan's model is a {what} model, and the {target} export writes dense models' "
                        "settings only (its experts live in the model's code, not in these settings); export "
                        "--to megatron or --to torchtitan, or configure it by hand")


def _refuse_tied(plan, profile, target: str) -> None:
    """Tied weights beside a pipeline exported to torchtitan, which refuses them (b5bcd76c) or, before it
    tied, split the model into copies never summed (the record's ties_across_stages): one sentence."""
    from planner.cost import runnable

    if target == "torchtitan":
        refused = runnable.tied_refused("torchtitan", None, stages=len(plan.stages), tied=profile.tied)
        if refused:
            raise UserError(refused.replace("--runtime torchtitan", "torchtitan").replace("another --runtime",
                                                                                            "another --to"))


def _refuse_offload(plan) -> None:
    """A plan whose own runtime refuses its offloaded layers beside its pipeline (a plan file from before the
    solvers knew it, or edited by hand: runnable.offload_refused) is not rounded into another plan: one sentence."""
    from planner.cost import runnable
    from planner.schema import OPTION_OFFLOAD

    training = plan.setup.training
    offloaded = [name for s in plan.stages for name in s.layers if s.option(name) == OPTION_OFFLOAD]
    refused = runnable.offload_refused(training.runtime, training.runtime_version, offloaded=offloaded,
                                       stages=plan.setup.pipeline.stages * plan.setup.pipeline.chunks)
    if refused:
        raise UserError(refused)


def _refuse_megatron_settings(plan, target: str) -> None:
    """Megatron-LM's --no-gradient-accumulation-fusion, logging reads and --deterministic-mode are
    charged only under its runtime; another target has none of them to write: refused in one sentence."""
    training = plan.setup.training
    given = [flag for flag, on in (("--no-gradient-accumulation-fusion", training.unfused_grad_accumulation),
                                   ("--log-params-norm", training.log_params_norm),
                                   ("--log-num-zeros-in-grad", training.log_num_zeros_in_grad),
                                   ("--deterministic-mode", training.deterministic),
                                   ("--timing-log-level", getattr(training, "timing_log_level", 0))) if on]
    if given and target != "megatron":
        raise UserError(f"the plan was scored with Megatron-LM's {', '.join(given)}, which the {target} export has no "
                        "setting for; export --to megatron, or solve without them")


def _profile_of(plan, plan_path: Path, profile_path: Path | None):
    """(the plan's profile, the path it was read from)."""
    from planner import io

    if profile_path is not None and not profile_path.exists():
        raise UserError(f"the profile {profile_path} does not exist; pass the one the plan was made from with --profile")
    path = profile_path or io.plan_profile_path(plan, plan_path, remedy="pass it with --profile")
    if io.sha256_file(path) != plan.profile.sha256:
        if profile_path is not None:  # e.g. the same architecture profiled at another sequence length
            raise UserError(f"--profile {path} is not the profile {plan_path} was made from (its sha256 differs from "
                            "the one the plan pins); pass that profile, or re-run `ckplan solve` with this one")
        raise UserError(f"{path} changed since the plan was made; re-run `ckplan solve`, or pass the profile "
                        "the plan was made from with --profile")
    return io.load_profile(path), path


def _check_plan(plan, profile, plan_path: Path) -> None:
    from planner.cost import costmodel

    if plan.solver.status == "infeasible":
        raise UserError(f"{plan_path} records no feasible plan; solve again with more memory or stages")
    given, profiled = plan.setup.pipeline.micro_batch_size, profile.micro_batch_size
    if given != profiled:  # the export writes the one and scores the other: said, not refused (test fixtures build
        from planner.console import warn  # such plans by hand, tests/test_titan_main.py _plan)

        warn(f"{plan_path} gives micro_batch_size {given}, and its profile was made at {profiled}: the file written "
             f"says {given}, while its stages and the figures beside it are for {profiled}; re-profile with "
             f"--micro-batch-size {given} and re-run `ckplan solve` to plan for {given}")
    try:
        costmodel.evaluate(plan.stages, profile, plan.setup)
    except ValueError as exc:
        raise UserError(f"{plan_path} does not match its profile ({exc}); re-run `ckplan solve`") from exc


def _exporter(target, plan, profile, plan_file, torchtitan_version, torchtitan_base):
    from planner.emit import colossalai, deepspeed, megatron, torchtitan

    if target == "torchtitan":
        from planner.emit import titan_keys

        if torchtitan_base is not None and not titan_keys.parse(torchtitan_version).python:
            raise UserError(f"--torchtitan-base names the config function a torchtitan 0.3/main export refines; "
                            f"torchtitan {torchtitan_version} is configured by a TOML this export writes whole: drop it")
        return torchtitan.export(plan, profile, plan_file=plan_file, version=torchtitan_version,
                                 base=torchtitan_base)
    module = {"colossalai": colossalai, "megatron": megatron, "deepspeed": deepspeed}[target]
    return module.export(plan, profile, plan_file=plan_file)


def _report(plan, result, out: Path, *, optimizer_impl: str | None = None) -> None:
    """What the framework cannot express, what was rounded, and the exact and rounded plans scored; `optimizer_impl`:
    the profile's Adam step where it is not the fused one (`ckplan profile --optimizer-impl`), which no file written
    here selects: the framework steps its own Adam, while the figures keep the profile's step."""
    from rich.markup import escape

    from planner.commands.evaluate import stage_columns, stage_rows
    from planner.console import console, table, warn
    from planner.models.optimizer_impls import IMPL_HELP
    from planner.units import format_ms

    for item in result.cannot_express:
        console.print(escape(f"{result.target} cannot express: {item}"), soft_wrap=True)
    if optimizer_impl:
        console.print(escape(f"{result.target} cannot express: the profile's Adam step (--optimizer-impl "
                             f"{optimizer_impl}: {IMPL_HELP.get(optimizer_impl, optimizer_impl)}); the file steps "
                             f"{result.target}'s own Adam, and the figures below keep the profile's step"),
                      soft_wrap=True)
    for item in result.rounded.changes or ["nothing; the export is the plan exactly"]:
        console.print(escape(f"rounded: {item}"), soft_wrap=True)
    scored = result.scored
    exact = stage_rows(plan.stages, scored.exact)
    rounded = stage_rows(result.rounded.ranks(), scored.rounded)
    if exact == rounded:  # nothing rounded that the cost model sees: one table
        console.print(table(f"the plan, exactly as {result.target} runs it", stage_columns(scored.exact), exact, right_from=2))
    else:
        console.print(table("the plan, exactly", stage_columns(scored.exact), exact, right_from=2))
        console.print(table(f"as {result.target} runs it", stage_columns(scored.rounded), rounded, right_from=2))
    console.print(f"iteration: plan {format_ms(scored.exact.iteration_ms)}, {result.target} "
                  f"{format_ms(scored.rounded.iteration_ms)} ({scored.slowdown * 100:+.1f}%); wrote {out}")
    if not scored.rounded.feasible:
        over = ", ".join(str(s) for s, c in enumerate(scored.rounded.stages) if not c.fits)
        # the export is written (its header carries the same warning); not an error of the command
        warn(f"as {result.target} can express it, the plan NO LONGER FITS: stage {over} exceeds its memory cap "
             "under the cost model; solve with more memory headroom or more stages before using this export")
