"""`ckplan search`: from a model and N GPUs to the fastest configurations that fit, each with the
exact plan ckplan solves today (planner/solve/jobsearch.py), ranked; the best written as a plan
that `ckplan export` turns into each framework's config."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from planner.commands import search_settings
from planner.errors import UserError

SCHEDULE_NAMES = ("1F1B", "GPipe", "interleaved-1F1B", "ZB", "ZBV", "DualPipeV")


def _ints(text: str | None, option: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    from planner.commands.handplan import parse_counts

    values = tuple(parse_counts(text, option))
    if any(v < 1 for v in values):
        raise UserError(f"{option} {text!r}: give whole numbers of 1 or more")
    return values


def _schedules(text: str | None, runtime: str, settings) -> tuple[str, ...]:
    """The schedules named, else the runtime's default space (degrees.default_schedules of its record's)."""
    if text is None:
        from planner.cost import runtimes
        from planner.solve.degrees import default_schedules

        return default_schedules(runtimes.facts(runtime, settings.runtime_version).pipeline_schedules)
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    stray = [n for n in names if n not in SCHEDULE_NAMES]
    if stray or not names:
        raise UserError(f"--schedules {text!r}: name schedules from {', '.join(SCHEDULE_NAMES)}, separated by commas")
    return names


@click.command("search")
@click.option("--arch", default=None, metavar="NAME", help="A published architecture (as `ckplan profile --arch`).")
@click.option("--arch-config", type=click.Path(path_type=Path), default=None,
              help="A Hugging Face-style config.json, profiled analytically (as `ckplan profile --arch-config`).")
@click.option("--hf-config", type=click.Path(path_type=Path), default=None,
              help="The same as --arch-config: the search profiles analytically, it runs no model.")
@click.option("--profile", "profile_path", type=click.Path(path_type=Path), default=None,
              help="A profile instead of a model: its tensor parallelism and micro-batch size are then fixed.")
@click.option("--gpus", type=click.IntRange(min=1), required=True, help="GPUs the job has.")
@click.option("--gpu", default="h100", show_default=True, help="The GPU (ckplan profile --gpu's names).")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=None,
              help="GPUs one host runs [default: the GPU's reference system, 8 for H100, 4 for a GB200 tray]; the "
                   "launch files start this many processes a host.")
@click.option("--nvlink-domain", type=click.IntRange(min=1), default=None, metavar="GPUS",
              help="GPUs that reach each other over NVLink, whole hosts [default: GB200 NVL72's 72, else the host]; "
                   "tensor parallelism stays inside one.")
@click.option("--global-batch", type=click.IntRange(min=1), required=True, help="Sequences per iteration.")
@click.option("--seq-len", type=click.IntRange(min=1), default=None, help="Tokens per sequence (required with a model).")
@click.option("--runtime", type=click.Choice(["ckplan", "megatron", "torchtitan", "colossalai", "deepspeed"]),
              default="ckplan", show_default=True, help="The framework that will run it: its way is charged.")
@click.option("--attention-kernel", type=click.Choice(("flash2", "flash1")), default=None,
              help="The flash kernel the job's attention runs, as `ckplan profile --attention-kernel` [default: "
                   "flash2, or a --profile's own].")
@click.option("--optimizer", type=click.Choice(["adam", "sgd"]), default="adam", show_default=True)
@click.option("--precision", type=click.Choice(["fp32", "bf16", "bf16-mixed", "fp16-mixed"]), default="bf16-mixed",
              show_default=True)
@click.option("--recompute", type=click.Choice(["options", "whole-layer"]), default="options", show_default=True,
              help="What a layer may recompute in each configuration's plan.")
@click.option("--mem", default=None, metavar="SIZE", help="Memory cap per GPU [default: what a process can allocate].")
@click.option("--schedules", "schedule_list", default=None, metavar="NAME[,NAME...]",
              help=f"Schedules to try: {', '.join(SCHEDULE_NAMES)} [default: 1F1B, and interleaved-1F1B where the "
                   "runtime runs it]. 1F1B and GPipe are solved exactly (DP), first; the chunked ones by the MILP, "
                   "whose plans are feasible, not proven optimal, and slower to find.")
@click.option("--chunk-counts", default=None, metavar="N[,N...]",
              help="Chunks a rank to try with interleaved-1F1B and ZB (ZBV and DualPipeV: 2) [default: every count "
                   "from 2 whose stages the layers fill, a layer at least each].")
@click.option("--micro-batch-sizes", default=None, metavar="N[,N...]",
              help="Micro-batch sizes to try [default: every divisor of a replica's share of the batch].")
@click.option("--top", type=click.IntRange(1, 50), default=5, show_default=True, help="Configurations ranked.")
@click.option("--time-limit", type=click.FloatRange(min=0, min_open=True), default=600.0, show_default=True,
              help="Seconds for the whole search, its profiles and the configurations compared beside "
                   "included; past it the ranking is the best of what "
                   "was solved, and what was left unexplored or unsolved is said.")
@click.option("--compare", is_flag=True, help="Score the frameworks' published configurations of this model beside.")
@click.option("--tp", type=click.IntRange(min=1), default=None, help="A hand configuration: tensor parallel.")
@click.option("--sp", is_flag=True, help="A hand configuration: sequence parallelism.")
@click.option("--pp", type=click.IntRange(min=1), default=None, help="A hand configuration: pipeline stages.")
@click.option("--dp", type=click.IntRange(min=1), default=None, help="A hand configuration: data parallel [default: the rest].")
@click.option("--zero", type=click.IntRange(0, 3), default=None, help="A hand configuration: ZeRO stage.")
@click.option("--shard-group", type=click.IntRange(min=2), default=None, help="A hand configuration: HSDP group.")
@click.option("--ep", type=click.IntRange(min=1), default=None, help="A hand configuration: expert parallel.")
@click.option("--micro-batch-size", type=click.IntRange(min=1), default=None, help="A hand configuration.")
@click.option("--schedule", type=click.Choice(SCHEDULE_NAMES), default=None, help="A hand configuration.")
@click.option("--chunks", type=click.IntRange(min=1), default=None, help="A hand configuration.")
@click.option("--from-megatron", type=click.Path(path_type=Path, dir_okay=False), default=None, metavar="FILE",
              help="Score the configuration of a Megatron-LM launch script or YAML of its arguments beside.")
@click.option("--from-torchtitan", type=click.Path(path_type=Path, dir_okay=False), default=None, metavar="TOML",
              help="Score the configuration of a torchtitan job TOML beside.")
@click.option("--hand-recompute", type=click.Choice(["full", "none", "plan"]), default="full", show_default=True,
              help="A hand configuration's recompute: every layer, none, or ckplan's plan for its degrees.")
@click.option("--out", type=click.Path(path_type=Path), default=Path("plan.yaml"), show_default=True,
              help="The best configuration's plan (its profile beside it, PLAN.profile.json).")
@click.option("--launch-files", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Also write how to start the best: torchrun per node, a Slurm script, a Kubernetes job.")
@click.option("--entry", default=None, metavar="'PROGRAM ARGS'",
              help="With --launch-files: what each process runs [default: torchtitan's trainer for --runtime "
                   "torchtitan; other frameworks need it].")
@click.option("--torchtitan-version", default=None, metavar="VERSION",
              help="With --launch-files and --runtime torchtitan: the torchtitan release (or main) whose trainer "
                   "the launch files run, on that version's export [default: 0.3.0].")
@click.option("--json", "as_json", is_flag=True, help="The whole ranking as JSON on stdout.")
@search_settings.settings_options
def command(arch, arch_config, hf_config, profile_path, gpus, gpu, gpus_per_node, nvlink_domain, global_batch, seq_len,
            runtime, attention_kernel,
            optimizer, precision, recompute, mem, schedule_list, chunk_counts, micro_batch_sizes, top, time_limit,
            compare, tp, sp, pp, dp, zero, shard_group, ep, micro_batch_size, schedule, chunks, from_megatron, from_torchtitan, hand_recompute, out,
            launch_files, entry, torchtitan_version, as_json, settings, tp_overlap, deepspeed) -> None:
    """Search every tensor-, context- (--runtime megatron or torchtitan), pipeline-, data- and expert-parallel degree, ZeRO stage and shard
    group, micro-batch size and schedule for N GPUs, each with its exact plan (layers per stage,
    recompute per layer), and rank the fastest that fit.

    The settings real jobs use (--compile, --float8, --op-level-sac, --tp-overlap, --runtime-version
    ...) are evaluate's and solve's: every configuration is scored with them. --cp N searches
    context parallelism N alone; --expert-tp N keeps to TP N.

    \b
      ckplan search --arch llama3.1-405b --gpus 1024 --global-batch 512 --seq-len 8192 --compare
    """
    from planner import io
    from planner.commands import search_report
    from planner.console import err_console, info
    from planner.models import topology
    from planner.solve import jobsearch
    from planner.solve.deadline import Deadline

    deadline = Deadline(time_limit)  # the whole search's: its first profile (the settings' sample) included
    say = (lambda note: err_console.print(note, soft_wrap=True)) if as_json else info
    model = _model(arch, arch_config or hf_config, profile_path, both=arch_config is not None and hf_config is not None,
                   settings=settings, flag="--arch-config" if hf_config is None else "--hf-config")
    if compare:
        _check_compare(model)
    device = _gpu(gpu, model)
    per_node = topology.host_gpus(device, gpus_per_node)  # the launch's processes a host
    domain = min(topology.nvlink_domain(device, gpus_per_node, nvlink_domain), gpus)  # the links' placement, TP's reach
    if gpus > per_node and gpus % per_node:
        raise UserError(f"--gpus {gpus} is not a whole number of nodes of {per_node} (--gpus-per-node)")
    seq_len = _seq_len(seq_len, model)
    io.check_outputs({"--out": out, "--out's profile": _profile_out(out)}, inputs={"--profile": profile_path})
    job = _job(model, gpus=gpus, per_node=domain, global_batch=global_batch, seq_len=seq_len,
               schedules=_schedules(schedule_list, runtime, settings), chunks=_ints(chunk_counts, "--chunk-counts"),
               micro_batch_sizes=_ints(micro_batch_sizes, "--micro-batch-sizes"), runtime=runtime, settings=settings)
    if model.profile is not None and job.num_experts and job.ep_ok is not None:
        say(f"the profile times its experts' GEMMs at expert parallelism {job.ep_ok[0]}: the search tries ep "
            f"{job.ep_ok[0]} only; search --arch or --arch-config to try every ep, each timed at its own")
    elif model.profile is not None and job.num_experts:
        say(f"the {model.profile.source} profile's experts' times are one device's, running every expert over its "
            "share of the tokens: every ep is scored with them (an ep rank's fewer, larger GEMMs not timed)")
    loss_compiled = settings.compile_model if settings.compile_loss is None else settings.compile_loss
    kernel = _attention_kernel(attention_kernel, model, device, seq_len, say)
    profile_for = model.profile_for(device, seq_len, compiled=settings.compile_model, compiled_loss=loss_compiled,
                                    kernel=kernel)
    sample = model.profile or profile_for(min(job.tp_ok), False, 1)
    training = search_settings.checked(settings, tp_overlap=tp_overlap, runtime=runtime, job=job, sample=sample,
                                       arch_given=model.arch is not None, say=say)
    options = jobsearch.JobOptions(mem_cap_bytes=_cap(mem, device), gpus_per_node=min(per_node, gpus),
                                   nvlink_domain=domain,
                                   optimizer=optimizer, precision=precision, runtime=runtime, recompute=recompute,
                                   training=training, tp_overlap=tp_overlap,
                                   data_parallel=search_settings.deepspeed_fields(deepspeed, runtime=runtime,
                                                                                  sample=sample))
    job = dataclasses.replace(job, offload_ok=search_settings.offload_choices(runtime=runtime, sample=sample,
                                                                              optimizer=optimizer))
    if entry is not None and launch_files is None:
        raise UserError("--entry says what the launch files run; give --launch-files DIR or drop it")
    if launch_files is not None and entry is None and runtime not in ("ckplan", "torchtitan"):
        raise UserError(f"--launch-files for --runtime {runtime}: say what each process runs with --entry")
    if launch_files is not None and entry is None and runtime == "ckplan" and model.profile is None:
        raise UserError("--launch-files: an analytic plan is exported, not run by ckplan's runtime; search with "
                        "--runtime torchtitan, or say what each process runs with --entry")
    if torchtitan_version is not None and launch_files is None:
        raise UserError("--torchtitan-version says which torchtitan trainer the launch files run; give "
                        "--launch-files DIR or drop it")
    from planner.emit import launchers

    launchers.check_torchtitan_version(torchtitan_version, framework=runtime, entry=_entry(entry))
    hand = _hand(locals(), model, gpus=gpus, global_batch=global_batch, seq_len=seq_len, gpu=device.name)
    imported = _imported(from_megatron, from_torchtitan, model, seq_len=seq_len, gpu=device.name,
                         searched=training | {"tp_overlap": tp_overlap})
    # every chunk count the bounds leave, the default space's and named schedules' alike: an interleaved one's
    # bound with its bubble, sends and reductions (chunkbound.py) prunes before its MILP (§41.chunklp)
    # the configurations compared first, inside the limit (scored after the search's, they ran past it: §42.searchscale)
    compared = search_report.compared(model.arch_name if compare else None, hand, gpus=gpus, global_batch=global_batch,
                                      options=options, profile_for=profile_for, seq_len=seq_len, gpu=device.name,
                                      imported=imported, profile_for_model=lambda arch: _Model(
                                          arch=arch, ref=model.ref).profile_for(
                                          device, seq_len, compiled=settings.compile_model, compiled_loss=loss_compiled),
                                      deadline=deadline)
    outcome = jobsearch.search_job(job, options, profile_for, top=top, deadline=deadline)
    report = search_report.Report(outcome, compared, job=job, options=options, gpu=device, arch=model.arch,
                                  seq_len=seq_len, global_batch=global_batch, out=out if outcome.ranked else None,
                                  timed_on=_timed_on(model))
    if outcome.ranked:
        best = outcome.ranked[0]
        search_report.write_plan(best, out, _profile_out(out), model.ref)
        if launch_files is not None:
            _write_launch_files(out, launch_files, tp=best.degrees.tp, gpus_per_node=min(per_node, gpus),
                                framework=runtime, entry=_entry(entry), torchtitan_version=torchtitan_version,
                                say=say)
    if as_json:
        click.echo(report.as_json())
    else:
        report.print()
    if not outcome.ranked:
        raise UserError(search_report.nothing_fits(report, job, options, profile_for, time_limit_s=time_limit))


def _write_launch_files(out: Path, folder: Path, *, tp: int, gpus_per_node: int, framework: str,
                        entry: tuple[str, ...] | None, torchtitan_version: str | None, say) -> None:
    """The best plan's launch files; where they run a torchtitan export not written yet, the
    command that writes it (a 0.3+ export refines a torchtitan config function the user names)."""
    from planner import io
    from planner.console import warn
    from planner.emit import launchers

    written, launch = launchers.write_all(io.load_plan(out), out, folder, tp=tp, gpus_per_node=gpus_per_node,
                                          framework=framework, entry=entry, torchtitan_version=torchtitan_version)
    say(f"launch files: {', '.join(str(p) for p in written)}")
    note = launchers.missing_export(launch, out, torchtitan_version) if entry is None else None
    if note is not None:
        warn(note)


def _check_compare(model: _Model) -> None:
    """--compare scores the published configurations of the model searched: one sentence where there are none."""
    from planner.models.published import PUBLISHED, published_for

    if model.arch_name is not None and published_for(model.arch_name):
        return
    known = ", ".join(sorted({p.arch for p in PUBLISHED}))
    what = f"--arch {model.arch_name}" if model.arch_name is not None else "a --profile"
    raise UserError(f"--compare: ckplan holds no published configuration of {what} (it holds those of {known}); "
                    "drop --compare, or score a framework's own file beside with --from-megatron/--from-torchtitan")


def _entry(entry: str | None) -> tuple[str, ...] | None:
    """--entry as export reads it (launchers.entry_argv: a shell expansion refused, never written as text)."""
    from planner.emit import launchers

    return None if entry is None else launchers.entry_argv(entry)


def _profile_out(out: Path) -> Path:
    return out.with_name(out.stem + ".profile.json")


class _Model:
    """The model searched: a published architecture or config (profiled analytically per
    tp/sp/micro-batch), or a given profile (tp, sp and micro-batch fixed)."""

    def __init__(self, *, arch=None, ref=None, profile=None):
        self.arch, self.ref, self.profile = arch, ref, profile

    @property
    def arch_name(self) -> str | None:
        return self.arch.name if self.arch is not None else None

    def profile_for(self, device, seq_len: int, *, compiled: bool = False, compiled_loss: bool = False,
                    kernel: str = "flash2"):
        """(tp, sp, micro-batch size, cp, ep) -> the profile scored, its experts' GEMMs timed as an
        expert-parallel rank of ep runs them (formulas.Shape.ep); `compiled` (--compile model): each
        block keeps what it keeps and runs the passes it runs under torch.compile where the analytic
        profiler records them; `compiled_loss` (--compile loss): the profile records the compiled
        loss's time (the runtime's record says whether it compiles it); `kernel` (--attention-kernel): the
        flash kernel whose published rate times attention (planner/models/attention_kernels.py)."""
        if self.profile is not None:
            return self._given
        from planner.commands.profile_arch import _with_host_step, _with_model_facts, check_ep
        from planner.models.attention_kernels import kernel_gpu
        from planner.profiler.analytic import Shape, analytic_profile
        from planner.profiler.compiled_kept import compiled_layers
        from planner.profiler.compiled_time import timed_layers

        host: dict = {}  # the host's optimizer step, timed once (profile_arch times it per profile)
        device, unmodelled = kernel_gpu(device, kernel)
        recorded = {"attention_kernel": kernel} | ({"attention_kernel_not_modelled": unmodelled} if unmodelled else {})

        def build(tp: int, sp: bool, mbs: int, cp: int = 1, ep: int = 1):
            check_ep(self.arch, ep)  # a hand or published configuration's ep the experts do not divide
            shape = Shape(seq_len=seq_len, micro_batch_size=mbs, tp=tp, sp=sp, cp=cp, ep=ep)
            profile = _with_model_facts(analytic_profile(self.arch, shape, gpu=device, model=self.ref,
                                                         compiled=compiled or compiled_loss), self.arch, "bfloat16")
            if compiled:
                profile = timed_layers(compiled_layers(profile)[0])[0]
            if not host:
                timed = _with_host_step(profile)
                host.update(step=timed.host_step_ns_per_param, note=timed.assumptions["host_step"])
            return profile.model_copy(update={"host_step_ns_per_param": host["step"], "assumptions": (
                profile.assumptions | {"host_step": host["note"]} | recorded)})

        return build


    def _given(self, tp: int, sp: bool, mbs: int, cp: int = 1, ep: int = 1):
        """The given profile, for the tp, sp, micro-batch size and cp it was made at only; an analytic
        one for the ep it was made at only too (a measured or --fake one's experts' times are one
        device's at any ep: expert_options.expert_time_note)."""
        from planner.commands.training_settings import profile_cp

        facts = self.profile.assumptions
        made = (int(facts.get("tp", 1)), bool(facts.get("sp", False)), self.profile.micro_batch_size,
                profile_cp(self.profile))
        if (tp, sp, mbs, cp) != made:
            raise UserError(f"the profile was made at tp {made[0]}, sp {made[1]}, micro-batch {made[2]}, cp {made[3]}, "
                            f"not tp {tp}, sp {sp}, micro-batch {mbs}, cp {cp}")
        allowed = _given_ep(self.profile)
        if allowed is not None and ep not in allowed:
            raise UserError(f"the profile times its experts at ep {facts.get('ep', 1)}, not ep {ep}")
        return self.profile


def _given_ep(profile) -> tuple[int, ...] | None:
    """The expert-parallel degrees a given profile's times hold at: an analytic profile's own
    (formulas.Shape.ep, 1 where it records none); None, any, for a measured or --fake one."""
    if profile.source != "analytic":
        return None
    return (int(profile.assumptions.get("ep", 1)),)


def _model(arch, config, profile_path, *, both: bool, settings=None, flag: str = "--arch-config") -> _Model:
    from planner.commands.profile_arch import _arch

    given = [x for x in (arch, config, profile_path) if x is not None]
    if both or len(given) != 1:
        raise UserError("give one model: --arch NAME, --arch-config (or --hf-config) config.json, or --profile FILE")
    if profile_path is not None:
        from planner import io
        from planner.commands.training_settings import compiled_profile

        return _Model(profile=compiled_profile(io.load_profile(profile_path), settings), ref=None)
    spec, ref = _arch(arch, config, flag)
    return _Model(arch=spec, ref=ref)


def _attention_kernel(kernel: str | None, model: _Model, device, seq_len: int, say) -> str:
    """The flash kernel the searched profiles time attention with: --attention-kernel (flash2 unless given), checked
    as `ckplan profile` checks it (the config's positions and modules left out said as it says them); a --profile's
    own, which the option may only repeat."""
    from planner.commands.profile_arch import _check_kernel_window, check_arch_shape
    from planner.models.attention_kernels import FLASH2, kernel_gpu

    if model.profile is not None:
        made = model.profile.assumptions.get("attention_kernel", FLASH2)
        if kernel is not None and kernel != made:
            raise UserError(f"--attention-kernel {kernel}: the profile's attention was timed with {made} when it was "
                            f"made (`ckplan profile --attention-kernel`); drop the option, or profile again with it")
        return made
    kernel = kernel or FLASH2
    _check_kernel_window(model.arch, kernel, seq_len)
    check_arch_shape(model.arch, seq_len, say=say)
    unmodelled = kernel_gpu(device, kernel)[1]
    if unmodelled:
        say(unmodelled)
    return kernel


def _timed_on(model: _Model) -> str | None:
    """A measured profile not made on a GPU: its times are that device's, the named GPU's links and memory beside them."""
    profile = model.profile
    return None if profile is None or profile.device.type == "cuda" or "gpu" in profile.assumptions else \
        profile.device.type


def _gpu(name: str, model: _Model):
    from planner.cost import dataparallel
    from planner.models import archs

    if model.profile is not None and model.profile.device.type == "cuda":
        return dataparallel.profile_gpu(model.profile)
    return archs.gpu(name)


def _seq_len(seq_len: int | None, model: _Model) -> int:
    if model.profile is not None:
        recorded = model.profile.assumptions.get("seq_len")
        if seq_len is not None and isinstance(recorded, int) and recorded != seq_len:
            raise UserError(f"--seq-len {seq_len} but the profile was made at {recorded}; drop --seq-len")
        return recorded if isinstance(recorded, int) else (seq_len or 0)
    if seq_len is None:
        raise UserError("give --seq-len (tokens per sequence)")
    return seq_len


def _cap(mem: str | None, device) -> int:
    if mem is None:
        return device.usable_bytes
    from planner.units import parse_memory

    try:
        return parse_memory(mem)
    except ValueError as exc:
        raise UserError(f"--mem: {exc}") from exc


def _job(model: _Model, *, gpus, per_node, global_batch, seq_len, schedules, chunks, micro_batch_sizes,
         runtime: str = "ckplan", settings=None):
    from planner.commands.training_settings import TrainingSettings, context_parallel
    from planner.cost import runtimes
    from planner.solve.degrees import JobShape, divisors

    settings = settings or TrainingSettings()
    if model.profile is not None:
        profile = model.profile
        tp = int(profile.assumptions.get("tp", 1))
        fixed = (tp, bool(profile.assumptions.get("sp", False)))
        search_settings.tp_degrees(settings, (tp,))
        cp = context_parallel(profile, settings.context_parallel)  # --cp other than the profile's refused
        if cp > 1 and runtimes.facts(runtime).cp_comm is None:
            raise UserError(f"the profile splits each sequence over cp {cp} ranks, which {runtime}'s runtime does not "
                            "run; search with --runtime megatron or torchtitan")
        return JobShape(gpus=gpus, gpus_per_node=per_node, global_batch=global_batch, seq_len=seq_len,
                        num_layers=len(profile.layers), tp_ok=(tp,), schedules=schedules, chunks=chunks,
                        fixed_tp=fixed, fixed_micro_batch_size=profile.micro_batch_size,
                        num_blocks=sum(layer.kind == "decoder_block" for layer in profile.layers) or None,
                        num_experts=_experts(profile), cp_ok=(cp,), ep_ok=_given_ep(profile))
    from planner.profiler.analytic import Shape, check_fits

    spec = model.arch
    allowed = []
    for tp in divisors(per_node):
        try:
            check_fits(spec, Shape(seq_len=seq_len, micro_batch_size=1, tp=tp))
        except UserError:
            continue
        allowed.append(tp)
    if not allowed:  # no TP degree takes the model: the reason at TP 1, in its own sentence
        check_fits(spec, Shape(seq_len=seq_len, micro_batch_size=1, tp=1))
    # context parallelism where the runtime runs it: every degree whose 2·cp chunks divide the sequence
    # (degrees.context_choices keeps those the GPUs and TP allow)
    cp_ok = tuple(cp for cp in divisors(gpus) if cp == 1 or seq_len % (2 * cp) == 0) \
        if runtimes.facts(runtime).cp_comm is not None else (1,)
    cp_ok = search_settings.cp_degrees(settings, cp_ok, runtime=runtime, seq_len=seq_len, gpus=gpus,
                                       heads=(spec.num_heads, spec.num_kv_heads))
    allowed = search_settings.tp_degrees(settings, tuple(allowed))
    return JobShape(gpus=gpus, gpus_per_node=per_node, global_batch=global_batch, seq_len=seq_len,
                    num_layers=spec.num_layers + 2, num_blocks=spec.num_layers, tp_ok=tuple(allowed),
                    num_experts=spec.num_experts,
                    schedules=schedules, chunks=chunks, micro_batch_sizes=micro_batch_sizes, cp_ok=cp_ok)


def _experts(profile) -> int:
    from planner.commands.expert_options import routed_experts

    return (routed_experts(profile) or 0) if any(layer.expert_param_count for layer in profile.layers) else 0


def _imported(from_megatron, from_torchtitan, model: _Model, *, seq_len: int, gpu: str, searched: dict) -> list:
    """The configurations read from the framework files given, as Published records (scored with
    the search's settings, `searched`: those the file asks otherwise are said)."""
    from planner.commands.evaluate_config import read_job
    from planner.commands.search_compare import from_framework_job

    if model.arch is None and (from_megatron or from_torchtitan):
        raise UserError("--from-megatron/--from-torchtitan compare a config with a searched architecture; search "
                        "with --arch, --arch-config or --hf-config")
    files = [(from_megatron, None)] if from_megatron else []
    files += [(None, from_torchtitan)] if from_torchtitan else []
    return [from_framework_job(read_job(m, t), arch=model.arch, gpu=gpu, seq_len=seq_len, settings=searched)
            for m, t in files]


def _hand(given: dict, model: _Model, *, gpus, global_batch, seq_len, gpu):
    """The hand configuration, where any of its flags is given."""
    from planner.commands.search_compare import hand_config

    flags = ("tp", "pp", "dp", "zero", "shard_group", "ep", "micro_batch_size", "schedule", "chunks")
    if not any(given[name] is not None for name in flags) and not given["sp"]:
        ctx = click.get_current_context()
        if ctx.get_parameter_source("hand_recompute") != click.core.ParameterSource.DEFAULT:
            raise UserError("--hand-recompute applies to a hand configuration (--tp, --pp, ...); give one or drop it")
        return None
    if given["micro_batch_size"] is None:
        raise UserError("a hand configuration needs --micro-batch-size")
    search_settings.check_hand(given["settings"], tp=given["tp"] or 1)
    return hand_config(tp=given["tp"] or 1, sp=given["sp"], pp=given["pp"] or 1, dp=given["dp"],
                       zero=given["zero"] or 0, shard_group=given["shard_group"], ep=given["ep"] or 1,
                       micro_batch_size=given["micro_batch_size"], schedule=given["schedule"] or "1F1B",
                       chunks=given["chunks"], recompute=given["hand_recompute"], gpus=gpus,
                       global_batch=global_batch, arch_name=model.arch_name or "profile", gpu=gpu, seq_len=seq_len)
