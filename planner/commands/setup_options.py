"""The training-setup options every command that scores a plan shares (`--profile`, `--mem`,
`--stages`, `--microbatches`, `--schedule`, `--optimizer`, `--precision`,
`--parallel-stages`, and the data-parallel ones: `--dp`, `--zero`, `--shard-group`, `--ep`,
`--offload-optimizer`, `--offload-copies`, `--host-mem`, the bandwidths), and the TrainSetup they
make with a profile."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import click

from planner.commands.ddp_options import DDP_OPTIONS, check_ddp, ddp_given
from planner.commands.deepspeed_options import (
    DEEPSPEED_OPTIONS,
    check_deepspeed,
    checkpointing_note,
    deepspeed_given,
    deepspeed_note,
)
from planner.commands.expert_options import (
    check_ep,
    check_ep_runtime,
    expert_time_note,
    routing_note,
)
from planner.commands.training_settings import (
    SETTING_OPTIONS,
    TrainingSettings,
    check_settings,
    offload_copies_default,
    with_context_parallel,
)
from planner.errors import UserError
from planner.schema import CHUNKED_SCHEDULES
from planner.schema.setup import deepspeed_checkpointing_refused
from planner.units import format_bytes

_OPTIONS = [
    click.option("--profile", "profile_path", type=click.Path(path_type=Path), default=None,
                 help="Profile from `ckplan profile` [default: the newest in profiles/]."),
    click.option("--mem", default=None, metavar="SIZE[,SIZE...]",
                 help="Memory cap per device: one for all stages (24GB) or one per stage (80GB,80GB,40GB,40GB) "
                      "[default: the memory of the GPU a `ckplan profile --arch` profile records]."),
    click.option("--microbatches", type=click.IntRange(min=1), default=None,
                 help="Microbatches per iteration [default: 2 x stages]."),
    click.option("--schedule", type=click.Choice(["1F1B", "GPipe", "interleaved-1F1B", "ZB", "ZBV", "DualPipeV",
                                                  "auto"]),
                 default="1F1B", show_default=True,
                 help="The pipeline schedule: torch.distributed.pipelining's; interleaved-1F1B, ZB, ZBV and "
                      "DualPipeV give each rank --chunks stages. auto (solve): each schedule solved, side by "
                      "side, the fastest that fits written."),
    click.option("--chunks", type=click.IntRange(min=1, max=64), default=None,
                 help="Stages per rank for interleaved-1F1B, ZB, ZBV, DualPipeV [default: 2; 1 for 1F1B, GPipe]."),
    click.option("--optimizer", type=click.Choice(["adam", "sgd"]), default="adam", show_default=True),
    click.option("--precision", type=click.Choice(["fp32", "bf16", "bf16-mixed", "fp16-mixed"]), default="fp32",
                 show_default=True, help="fp32 or bf16: weights, gradients and optimizer state all in that dtype; "
                 "bf16-mixed: bf16 weights and gradients, fp32 master and state; fp16-mixed: fp16 with a loss scaler."),
    click.option("--runtime", type=click.Choice(["ckplan", "megatron", "torchtitan", "colossalai", "deepspeed"]),
                 default="ckplan", show_default=True,
                 help="Whose runtime the plan is scored for: ckplan's own (launch), or the framework it is exported "
                      "to, which overlap data-parallel reductions with the backward (ckplan's does under ZeRO 2/3)."),
    click.option("--recompute", type=click.Choice(["options", "whole-layer"]), default="options", show_default=True,
                 help="What a layer may recompute: any option its profile lists (selective: attention, the "
                      "MLP's activation, norms, all but the matmuls; or the whole layer), or whole layers only "
                      "(none or full, to see what the options buy)."),
    click.option("--fragmentation", type=click.FloatRange(0, 0.9), default=None, metavar="F",
                 help="cuda: the share of reserved memory the caching allocator loses to fragmentation at the peak, "
                      "1 - allocated / reserved; the cap holds the reserved peak and NCCL's buffers [default: 0.15, "
                      "GMLake's mean over eight LLM training jobs; up to 0.33 measured]."),
    click.option("--parallel-stages", type=click.IntRange(min=1), default=None,
                 help="Stages that can compute at once [default: all on GPUs; for a CPU profile, "
                      "cores / the threads a launch gives each rank, since ranks then share the cores]."),
    click.option("--dp", type=click.IntRange(min=1), default=1, show_default=True,
                 help="Data-parallel replicas of every stage."),
    click.option("--zero", type=click.IntRange(0, 3), default=0, show_default=True,
                 help="ZeRO stage: 1 shards optimizer state, 2 also gradients, 3 also weights."),
    click.option("--shard-group", type=click.IntRange(min=1), default=None,
                 help="ZeRO shards inside groups of K data-parallel ranks and replicates across the dp / K "
                      "groups (HSDP) [default: one group of all --dp ranks]."),
    click.option("--ep", type=click.IntRange(min=1), default=1, show_default=True,
                 help="Expert parallelism (mixture-of-experts profiles): the routed experts split over E of the --dp "
                      "ranks (Megatron-LM's --expert-model-parallel-size, torchtitan's expert_parallel_degree); "
                      "each expert's state is replicated, and ZeRO-sharded, over the dp / E others, and the tokens "
                      "cross an all-to-all before and after the experts. E divides --dp and the experts."),
    click.option("--zero-gather", type=click.Choice(["per-microbatch", "per-iteration"]), default="per-microbatch",
                 show_default=True,
                 help="ZeRO 2/3: reduce-scatter gradients (and gather ZeRO 3's weights) every microbatch, or keep "
                      "them whole through the iteration and do it once (torch.distributed.pipelining with FSDP2)."),
    click.option("--offload-optimizer", is_flag=True,
                 help="Optimizer state (and the fp32 master) in host memory, the step on the host."),
    click.option("--offload-copies", type=click.Choice(["overlapped", "serial"]), default=None, help="Offload's "
                 "gradient copy, host step and weight copy: overlapped in chunks, or one after another [default: as "
                 "the runtime's code runs them: serial under DeepSpeed's ZeRO 3, a sub-group at a time; overlapped]."),
    click.option("--host-mem", default=None, metavar="SIZE",
                 help="Host memory of a node, shared by its ranks: caps the offloaded optimizer and activations "
                      "offloaded by the offload recompute option."),
    click.option("--shard-bandwidth", type=click.FloatRange(min=0, min_open=True), default=None,
                 metavar="GB/s", help="Reduction bandwidth per rank inside a shard group [default: from the "
                                      "profile's GPU and interconnect]."),
    click.option("--replica-bandwidth", type=click.FloatRange(min=0, min_open=True), default=None,
                 metavar="GB/s", help="Reduction bandwidth per rank across shard groups [default: as above]."),
    click.option("--ep-bandwidth", type=click.FloatRange(min=0, min_open=True), default=None, metavar="GB/s",
                 help="The experts' all-to-all bandwidth per rank inside an expert-parallel group [default: the "
                      "in-node link where E x tp GPUs fit in a node, else the network]."),
    click.option("--host-bandwidth", type=click.FloatRange(min=0, min_open=True), default=None,
                 metavar="GB/s", help="Host<->device copy bandwidth per rank [default: the GPU's PCIe link]."),
    click.option("--gpus-per-node", type=click.IntRange(min=1, max=4096), default=None,
                 help="GPUs one host runs: its processes, its host memory, its NICs [default: the GPU's reference "
                      "system, 8; a GB200 tray: 4]."),
    click.option("--nvlink-domain", type=click.IntRange(min=1, max=4096), default=None, metavar="GPUS",
                 help="GPUs that reach each other over NVLink, whole hosts: a group inside runs its collectives "
                      "over NVLink, one past it at the network's rate [default: GB200 NVL72's 72, else the host]."),
    click.option("--nics-per-gpu", type=click.FloatRange(min=0, min_open=True, max=64), default=None,
                 help="Network cards per GPU, each at the GPU's reference NIC rate [default: 1, as DGX systems]."),
    click.option("--tp-overlap", type=click.Choice(["none", "async-tp", "tp-comm-overlap"]), default="none",
                 show_default=True,
                 help="The runtime setting that overlaps tensor-parallel collectives with the matmuls: torchtitan's "
                      "AsyncTP (async-tp) or Megatron-LM's --tp-comm-overlap; without it every collective is on the "
                      "critical path."),
    click.option("--host-step-ns", type=click.FloatRange(min=0, max=1e6, min_open=True), default=None, metavar="NS",
                 help="With offload: the training hosts' optimizer step, ns per parameter [default: the profile's; "
                      "for --arch profiles a published server figure for Adam, 0.4]."),
]
DP_OPTION_NAMES = ("dp", "zero", "shard_group", "ep", "zero_gather", "offload_optimizer", "offload_copies", "host_mem",
                   "shard_bandwidth", "replica_bandwidth", "ep_bandwidth", "host_bandwidth", "host_step_ns",
                   "gpus_per_node", "nvlink_domain", "nics_per_gpu", "tp_overlap")

@dataclass(frozen=True)
class DataParallelOptions:
    """The data-parallel option group as given on the command line (dp_fields turns it into
    TrainSetup's data-parallel part, the bandwidths defaulted from the profile's GPU)."""

    dp: int = 1
    zero: int = 0
    shard_group: int | None = None
    ep: int = 1
    zero_gather: str = "per-microbatch"
    offload_optimizer: bool = False
    offload_copies: str | None = None  # None: the runtime's record (offload_copies_default)
    host_mem: str | None = None  # a size, as given
    shard_bandwidth: float | None = None  # GB/s; None: from the profile's GPU
    replica_bandwidth: float | None = None
    ep_bandwidth: float | None = None
    host_bandwidth: float | None = None
    host_step_ns: float | None = None  # None: the profile's measurement
    # the topology (comm_fields): None, the GPU's reference system
    gpus_per_node: int | None = None
    nvlink_domain: int | None = None  # None: the GPU record's, else the host's (planner/models/topology.py)
    nics_per_gpu: float | None = None
    tp_overlap: str = "none"
    ub_cfg: str | None = None  # a config's userbuffers config under tp-comm-overlap (planner/cost/ub_sms.py)
    ub_gemms: dict | None = None  # a --tp-comm-overlap-cfg file's, per GEMM (planner/models/configs/ub_cfg.py)
    # the training settings' options, carried with this group so every command passes them through
    settings: TrainingSettings = None  # type: ignore[assignment]  # None: the defaults
    # Megatron-LM's DDP overlap as DataParallelSetup's fields (ddp_options.py; a config's JobSettings.ddp)
    ddp: dict = None  # type: ignore[assignment]  # None: none given
    deepspeed: dict = None  # type: ignore[assignment]  # DeepSpeed's stage3 knobs (deepspeed_options.py); None: none


def setup_options(func):
    """Decorate a click command with the shared setup options (in --help order); the command
    gets the data-parallel group as one `data_parallel: DataParallelOptions`."""
    import inspect

    # an option the command declares itself (evaluate's --gpus-per-node for --from-*): read by both
    own = set(inspect.signature(func).parameters) & set(DP_OPTION_NAMES)

    @functools.wraps(func)
    def grouped(**kwargs):
        settings = TrainingSettings.from_options(kwargs)
        data_parallel = DataParallelOptions(**{name: kwargs[name] if name in own else kwargs.pop(name)
                                               for name in DP_OPTION_NAMES}, settings=settings,
                                            ddp=ddp_given(kwargs), deepspeed=deepspeed_given(kwargs))
        return func(data_parallel=data_parallel, **kwargs)

    for option in reversed(_OPTIONS + SETTING_OPTIONS + DDP_OPTIONS + DEEPSPEED_OPTIONS):
        if option_name(option) not in own:
            grouped = option(grouped)
    return grouped


def shared_option(name: str):
    """The setup option declaring parameter `name`, for a command that takes it alone (search's
    --tp-overlap): one definition of each option."""
    return next(option for option in _OPTIONS if option_name(option) == name)


def option_name(option) -> str:
    """The parameter name a click.option decorator declares ("--gpus-per-node": gpus_per_node)."""
    holder = option(lambda: None)
    return holder.__click_params__[-1].name


def newest_profile() -> Path:
    candidates = sorted(Path("profiles").glob("*.json"), key=lambda p: p.stat().st_mtime)
    if not candidates:
        raise UserError("no profile given and none in profiles/; run `ckplan profile MODEL.py` or pass --profile")
    return candidates[-1]


def default_parallel_stages(profile, stages: int, dp: int = 1) -> int | None:
    """On CPU the ranks share this machine's cores, each with the threads a launch gives it
    (placement.placement_threads: never more than the cores): as many stages compute at
    once as there are cores for."""
    from planner.placement import placement_threads, stages_at_once

    if profile.device.type != "cpu":
        return None
    cores = os.cpu_count() or 1
    threads, _ = placement_threads(profile.device.threads, stages * dp, cores)
    return stages_at_once(cores=cores, threads=threads, stages=stages, dp=dp)


def caps_bytes(mem: str, stages: int) -> list[int]:
    from planner.units import parse_size_list

    try:
        caps = parse_size_list(mem, memory=True)
    except ValueError as exc:
        raise UserError(f"--mem: {exc}") from exc
    if len(caps) == 1:
        return caps * stages
    if len(caps) != stages:
        raise UserError(f"--mem lists {len(caps)} caps for {stages} stages; give one cap for all or one per stage")
    return caps


def gpu_mem(profile) -> tuple[str, str]:
    """(--mem, a sentence saying where it came from): what one process can allocate on an
    analytic profile's GPU (the memory as sold, in profiles made before that was recorded)."""
    facts = profile.assumptions
    gpu, usable, sold = facts.get("gpu"), facts.get("gpu_usable_bytes"), facts.get("gpu_memory_bytes")
    if isinstance(usable, int):
        mem = str(usable)
        return mem, (f"--mem not given: {format_bytes(usable)} per device, what a process can allocate on the "
                     f"profile's GPU ({gpu}: {facts.get('gpu_usable_source', 'its CUDA total less the context')})")
    if not isinstance(sold, int):
        raise UserError("give --mem (the memory cap per device, e.g. 24GB); only a profile made with "
                        "`ckplan profile --arch ... --gpu NAME` carries a default")
    mem = f"{sold / 1e9:g}GB"
    return mem, f"--mem not given: {mem} per device, the memory of the profile's GPU ({gpu})"


SOLVER_OPTION = click.option(
    "--solver", type=click.Choice(["auto", "dp", "milp"]), default="auto", show_default=True,
    help="dp: the exact dynamic programme; milp: the mixed-integer program on HiGHS; auto: the DP where its "
         "structure holds (contiguous stages, one chunk per rank), else the MILP.")


def planned_setup(profile, profile_path: Path, *, say=None, **options):
    """(the TrainSetup every planning command plans with, sentences about its time constants):
    build_setup's, with the calibration beside the profile applied for the placement a
    launch will use. solve, --auto-dp, --sweep and evaluate all take it from here, so they
    predict the same plan alike."""
    from planner.commands.calibration import calibrated_setup

    return calibrated_setup(profile, profile_path, build_setup(profile, say=say, **options))


def build_setup(profile, *, stages: int, mem: str | None, microbatches: int | None, schedule: str,
                optimizer: str, precision: str, parallel_stages: int | None, runtime: str = "ckplan",
                fragmentation: float | None = None, chunks: int | None = None, recompute: str = "options",
                data_parallel: DataParallelOptions = DataParallelOptions(), say=None, deadline=None):
    """The TrainSetup the options describe; `say(sentence)` is told when --mem or a bandwidth
    comes from the profile's GPU. Bad combinations raise UserError in one sentence. `deadline`
    (the solve's --time-limit) bounds building a chunked schedule's order (SolverTimeLimit past it)."""
    from pydantic import ValidationError

    from planner.commands import comm_setup
    from planner.schema import TrainSetup

    if stages > len(profile.layers):
        raise UserError(f"--stages {stages} exceeds the {len(profile.layers)} layers of the profile; "
                        f"use at most {len(profile.layers)}")
    if schedule == "auto":
        raise UserError("--schedule auto is `ckplan solve`'s (it solves every schedule side by side); name one "
                        "schedule here")
    if schedule == "1F1B" and microbatches is not None and microbatches < stages:
        raise UserError(f"1F1B needs at least as many microbatches as stages; use --microbatches {stages} or more")
    if mem is None:
        mem, note = gpu_mem(profile)
        if say is not None:
            say(note)
    if fragmentation is not None and profile.device.type != "cuda":
        raise UserError(f"--fragmentation applies to a GPU's caching allocator; this profile is of "
                        f"{profile.device.type}, where the peak is counted exactly: drop it")
    chunks = chunks or (2 if schedule in CHUNKED_SCHEDULES else 1)
    if schedule in CHUNKED_SCHEDULES:
        if stages * chunks > len(profile.layers):  # before the order is built: that takes long for large sizes
            raise UserError(f"--stages {stages} x --chunks {chunks} is {stages * chunks} pipeline stages, more than the "
                            f"profile's {len(profile.layers)} layers; use fewer chunks or stages")
        build_order(schedule, stages=stages, chunks=chunks, microbatches=microbatches or 2 * stages, deadline=deadline)
    elif chunks != 1:
        raise UserError(f"--chunks {chunks} needs a schedule with chunks ({', '.join(CHUNKED_SCHEDULES)}); "
                        f"{schedule} runs one stage per rank")
    check_ep_runtime(profile, ep=data_parallel.ep, zero=data_parallel.zero, runtime=runtime)
    check_ddp(data_parallel.ddp or {}, runtime=runtime, zero=data_parallel.zero, chunks=chunks)
    refused = deepspeed_checkpointing_refused(data_parallel.deepspeed or {}, runtime)  # the setup's own check, said first
    if refused:
        raise UserError(refused)
    settings = (data_parallel.settings or TrainingSettings()).fields()
    check_zero_runtime(runtime, settings["runtime_version"], precision=precision, data_parallel=data_parallel,
                       stages=stages, microbatches=microbatches or 2 * stages, tied=profile.tied)
    check_settings(profile, runtime=runtime, settings=settings, say=say)
    data_parallel = with_context_parallel(data_parallel, settings["context_parallel"], say=say)  # dp x cp
    data_parallel = offload_copies_default(data_parallel, runtime, settings["runtime_version"], say=say)
    try:
        setup = TrainSetup(
            stages=stages, microbatches=microbatches or 2 * stages, micro_batch_size=profile.micro_batch_size,
            schedule=schedule, chunks=chunks, mem_caps_bytes=caps_bytes(mem, stages), optimizer=optimizer, precision=precision,
            runtime=runtime, fragmentation=fragmentation, recompute=recompute, **settings,
            parallel_stages=parallel_stages or default_parallel_stages(profile, stages, data_parallel.dp),
            **dp_fields(profile, data_parallel, stages=stages, optimizer=optimizer, say=say,
                        activations_offloadable=may_offload_activations(profile, recompute, schedule)),
            comm=comm_setup.comm_fields(profile, data_parallel, runtime=runtime, say=say, stages=stages,
                                        chunks=chunks),
        )
    except ValidationError as exc:
        from planner.io import describe_setup_error

        raise UserError(f"invalid setup: {describe_setup_error(exc)}") from exc
    from planner.cost import runtimes

    if runtimes.of(setup.training).zero_as_fsdp2:
        from planner.cost import dataparallel

        ran = dataparallel.as_torchtitan_runs(setup)
        if ran != setup and say is not None:
            say(f"--runtime torchtitan: ZeRO-{setup.data_parallel.zero} runs as FSDP2 beside torch.distributed."
                "pipelining, weights and gradients whole until the last backward (ZeRO 3, --zero-gather "
                "per-iteration)" if stages > 1 else
                f"--runtime torchtitan: ZeRO-{setup.data_parallel.zero} runs as FSDP2 without a pipeline, "
                "resharded after every forward (ZeRO 3, --zero-gather per-microbatch)")
        setup = ran
    if runtimes.of(setup.training).ddp_buckets and setup.data_parallel.dp > 1 and say is not None:
        from planner.cost.megatron_dp import described

        say(described(setup))
    if setup.data_parallel.ep > 1 and say is not None:
        for note in (routing_note(profile, setup.data_parallel.ep), expert_time_note(profile, setup.data_parallel.ep)):
            if note:
                say(note)
    from planner.cost import reserve_megatron
    from planner.cost.reserve_fsdp2 import allocator_setting_refused

    check_deepspeed(data_parallel.deepspeed or {}, profile, setup)
    for uncharged in (deepspeed_note(profile, setup), checkpointing_note(setup)):
        if uncharged and say is not None:
            say(uncharged)
    refused = allocator_setting_refused(profile, setup) or reserve_megatron.allocator_setting_refused(profile, setup)
    if refused:
        raise UserError(refused)
    return setup


def build_order(schedule: str, *, stages: int, chunks: int, microbatches: int, deadline=None) -> None:
    """torch's order for a chunked schedule (its own checks, in one sentence), built within the
    deadline: torch's constructors take long for many microbatches (ZBV: 5 s at 1,000, about the
    square of the count), so past the deadline it is refused, saying so."""
    from planner.cost import schedules
    from planner.errors import SolverTimeLimit
    from planner.solve.deadline import Expired, interrupted_at

    try:
        with interrupted_at(deadline):
            schedules.build_schedule(schedule, num_ranks=stages, num_microbatches=microbatches, num_chunks=chunks)
    except Expired:
        raise SolverTimeLimit(f"building {schedule}'s order (torch's) for {stages} ranks x {chunks} chunks x "
                              f"{microbatches} microbatches did not finish within --time-limit {deadline.limit_s:g} s; "
                              "use fewer --microbatches (the time grows with their square for ZBV), or raise "
                              "--time-limit") from None


def dp_fields(profile, options: DataParallelOptions, *, stages: int, optimizer: str, say=None,
              activations_offloadable: bool = True) -> dict:
    """TrainSetup's data-parallel fields from the options, the bandwidths defaulted from the
    profile's GPU (and said), the host step speed from the profile's measurement."""
    from planner.cost import nccl_buffers
    from planner.cost.dataparallel import profile_gpu
    from planner.cost.links import default_links

    dp, zero, shard_group, ep, host_mem = options.dp, options.zero, options.shard_group, options.ep, options.host_mem
    offload_optimizer, ep_bandwidth, host_step_ns = options.offload_optimizer, options.ep_bandwidth, options.host_step_ns
    shard_bandwidth, replica_bandwidth = options.shard_bandwidth, options.replica_bandwidth
    host_bandwidth = options.host_bandwidth
    zero_gather, offload_copies = options.zero_gather, options.offload_copies or "overlapped"

    check_dp_options(dp=dp, zero=zero, shard_group=shard_group)
    check_ep(profile, ep=ep, dp=dp, shard_group=shard_group if zero else None, ep_bandwidth=ep_bandwidth)
    in_cpu = bool((options.deepspeed or {}).get("checkpoint_in_cpu"))  # DeepSpeed's checkpoints on the host
    fields = dict(dp=dp, zero=zero, shard_group=shard_group if zero else None, offload=offload_optimizer,
                  offload_overlap=offload_copies == "overlapped", zero_gather=zero_gather, ep=ep, **(options.ddp or {}),
                  **(options.deepspeed or {}))
    if host_mem is not None and not offload_optimizer and not activations_offloadable and not in_cpu:
        raise UserError("--host-mem caps what goes to the host: the offloaded optimizer, and activations of layers "
                        "with the offload option, which this plan cannot have (a cpu profile, where the host is the "
                        "device, --recompute whole-layer or a chunked schedule); add --offload-optimizer or drop "
                        "--host-mem")
    if dp == 1 and not offload_optimizer and host_mem is None and not in_cpu:
        return fields
    links = default_links(profile, stages=stages, dp=dp, shard_group=shard_group or dp, ep=ep,
                          gpus_per_node=options.gpus_per_node, nvlink_domain=options.nvlink_domain,
                          nics_per_gpu=options.nics_per_gpu,
                          given={"--shard-bandwidth": shard_bandwidth, "--replica-bandwidth": replica_bandwidth,
                                 "--host-bandwidth": host_bandwidth, "--ep-bandwidth": ep_bandwidth})
    given = (shard_bandwidth, replica_bandwidth, host_bandwidth) + ((ep_bandwidth,) if ep > 1 else ())
    notes = list(links.notes) if None in given else []  # every figure given: nothing to say
    fields.update(shard_gb_per_s=links.shard_gb_per_s, replica_gb_per_s=links.replica_gb_per_s,
                  host_gb_per_s=links.host_gb_per_s, devices_per_node=links.devices_per_node,
                  ep_gb_per_s=links.ep_gb_per_s if ep > 1 else None)
    if profile.device.type == "cuda":  # the GPU NCCL's tuner sizes an all-reduce across nodes for
        fields.update(nccl_buffers.gpu_fields(profile, profile_gpu(profile), options.nics_per_gpu))
    if offload_optimizer:
        fields["host_step_ns_per_param"] = host_step_ns or profile_host_step_ns(profile, optimizer)
        notes.append(host_step_note(profile, optimizer, given=host_step_ns))
    fields["host_mem_bytes"] = host_mem and _size(host_mem, "--host-mem")
    for note in notes:
        if say is not None:
            say(note)
    fields["dp_notes"] = notes
    return fields


def may_offload_activations(profile, recompute: str, schedule: str) -> bool:
    """Whether a plan may put activations on the host: some layer of the profile has the offload option, the plan
    may take options (not --recompute whole-layer), and the schedule runs one chunk a rank (costmodel.useful_options)."""
    return (recompute == "options" and schedule not in CHUNKED_SCHEDULES
            and any(option.host_bytes for layer in profile.layers for option in layer.recompute_options))


def check_zero_runtime(runtime: str, version: str | None, *, precision: str, data_parallel, stages: int,
                       microbatches: int, tied: list = ()) -> None:
    """A ZeRO stage the runtime runs: its bf16 optimizer's only one, the highest beside a pipeline, the stages it
    shards over a smaller group at (runnable.data_parallel_refused); tied weights as it runs them (tied_refused)."""
    from planner.cost import runnable

    refused = runnable.data_parallel_refused(runtime, version, precision=precision, zero=data_parallel.zero,
                                             dp=data_parallel.dp, shard_group=data_parallel.shard_group, stages=stages)
    refused = (refused or runnable.accumulation_refused(runtime, version, stages=stages, microbatches=microbatches)
               or runnable.tied_refused(runtime, version, stages=stages, tied=list(tied)))
    if refused:
        raise UserError(refused)


def check_dp_options(*, dp: int, zero: int, shard_group: int | None) -> None:
    """One sentence for each combination that means nothing."""
    if zero and dp == 1:
        raise UserError(f"--zero {zero} shards over data-parallel ranks and --dp is 1, so there is nothing to "
                        "shard; give --dp N (N > 1) or drop --zero")
    if shard_group is not None and not zero:
        raise UserError(f"--shard-group {shard_group} needs --zero 1, 2 or 3: without ZeRO nothing is sharded")
    if shard_group is not None and dp % shard_group:
        divisors = ", ".join(str(k) for k in range(1, dp + 1) if dp % k == 0)
        raise UserError(f"--shard-group {shard_group} does not divide --dp {dp}; use one of {divisors}")
    if shard_group == 1:
        raise UserError("--shard-group 1 shards nothing; use a group of 2 or more ranks, or --zero 0")


def profile_host_step_ns(profile, optimizer: str) -> float:
    speed = profile.host_step_ns_per_param.get(optimizer)
    if speed is None:
        raise UserError("--offload-optimizer needs the host's optimizer speed, which this profile does not "
                        "record; give --host-step-ns NS, or re-run `ckplan profile` (it times the optimizer on "
                        "the host)")
    return speed


def host_step_note(profile, optimizer: str, given: float | None = None) -> str:
    """Where offload's host step speed came from, and how to give the training hosts'."""
    if given is not None:
        return f"host {optimizer} step: {given:.3g} ns per parameter (--host-step-ns)"
    if profile.source in ("analytic", "fake"):
        where = str(profile.assumptions.get("host_step", "the profile's"))
    else:
        where = "measured by `ckplan profile` on the profiled machine"
    return (f"host {optimizer} step: {profile.host_step_ns_per_param[optimizer]:.3g} ns per parameter, {where}; "
            "give the training hosts' with --host-step-ns")


def _size(text: str, option: str) -> int:
    from planner.units import parse_memory

    try:
        return parse_memory(text)
    except ValueError as exc:
        raise UserError(f"{option}: {exc}") from exc


def host_bytes(stages, setup) -> float:
    """Host bytes per node the plan takes (its offloaded optimizer and offloaded activations):
    every rank there as much as the busiest stage's rank. 0 where nothing goes to the host."""
    from planner.cost import dataparallel

    busiest = max((stage.predicted.host_bytes for stage in stages if stage.predicted is not None), default=0)
    return dataparallel.host_bytes_per_node(busiest, setup)

