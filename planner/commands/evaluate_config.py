"""`ckplan evaluate --from-megatron FILE | --from-torchtitan FILE.toml`: the job a config
users already have describes (planner/models/configs/), scored per pipeline rank by the same
cost model as every plan: static, allocated peak and reserved peak, the iteration, tokens/s
and MFU; and every flag or key accounted for (modelled, not modelled, no effect, unknown)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from planner.commands.config_checks import check_ep, check_microbatches, microbatches_of
from planner.errors import UserError
from planner.profiler.throughput import MEGATRON_SOURCE

# The MFU the job's own framework logs (planner/profiler/throughput.py, as the search prints it: search_report.mfu_named):
# torchtitan's FLOPs per token (torchtitan/models/utils.py get_dense_model_nparams_and_flops, read at 238fa9953e4a:
# 6 x parameters without the token embedding + 12 x layers x heads x head_dim x seq_len), or Megatron-LM's
# num_floating_point_operations (causal attention halved, the logits counted); against the GPU's dense BF16 peak
# (planner/models/gpus.py), as torchtitan's metrics.py divides and Megatron-LM's TFLOP/s/GPU over the peak.
MFU_SOURCE = "torchtitan/models/utils.py get_dense_model_nparams_and_flops at 238fa9953e4a"


@dataclass
class Prediction:
    """A job scored: its profile, setup, stages (one per pipeline rank), cost, and what was assumed."""

    job: object
    gpus: int
    dp: int
    profile: object
    setup: object
    stages: list
    cost: object
    tokens_per_iteration: int
    notes: list[str] = field(default_factory=list)

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_iteration / (self.cost.iteration_ms / 1e3) / self.gpus

    @property
    def mfu_of(self) -> str:
        """Whose MFU: the framework that runs the job logs it (torchtitan's, else Megatron-LM's)."""
        from planner.commands.search_report import mfu_named

        return mfu_named(self.job.runtime or self.job.framework)

    def throughput(self, gpu):
        """The iteration's figures as torchtitan and Megatron-LM log them (planner/profiler/throughput.py, as solve
        and search report them)."""
        from planner.profiler.throughput import throughput

        return throughput(iteration_ms=self.cost.iteration_ms, tokens_per_iteration=self.tokens_per_iteration,
                          gpus=self.gpus, peak_tflops=gpu.bf16_tflops, arch=self.job.arch, seq_len=self.job.seq_len)

    def mfu(self, gpu) -> float:
        """The MFU the job's framework logs (mfu_of)."""
        found = self.throughput(gpu)
        return found.torchtitan_mfu if self.mfu_of == "torchtitan" else found.megatron_mfu

    def mfu_source(self, gpu) -> str:
        from planner.profiler.throughput import MEGATRON_SOURCE

        return MFU_SOURCE if self.mfu_of == "torchtitan" else (
            f"{self.megatron_tflops_per_gpu(gpu):,.1f} TFLOP/s/GPU as {MEGATRON_SOURCE}")

    def megatron_tflops_per_gpu(self, gpu) -> float:
        """What Megatron-LM logs as "throughput per GPU (TFLOP/s/GPU)": its own FLOPs count (causal attention
        halved, the logits in) over the iteration and the world size."""
        return self.throughput(gpu).megatron_tflops_per_gpu


def read_job(from_megatron: Path | None, from_torchtitan: Path | None):
    if (from_megatron is None) == (from_torchtitan is None):
        raise UserError("give one config: --from-megatron FILE or --from-torchtitan FILE.toml")
    if from_megatron is not None:
        from planner.models.configs import megatron

        return megatron.read(from_megatron)
    from planner.models.configs import torchtitan

    return torchtitan.read(from_torchtitan)


def predict(job, *, gpus: int | None, gpu_name: str, gpus_per_node: int | None = None, mem: str | None = None,
            fragmentation: float | None = None, nvlink_domain: int | None = None) -> Prediction:
    """The job on `gpus` GPUs of `gpu_name`, scored by the cost model."""
    from planner.commands.setup_options import build_setup
    from planner.cost import costmodel
    from planner.models import archs, topology
    from planner.models.configs.megatron_moe_dispatch import backend_setup

    model_parallel = job.tp * job.pp * job.cp
    given, stated = gpus, []
    gpus = gpus or job.world_size
    if gpus is None and job.dp_given is not None:  # every degree stated: their product is the world size
        gpus = job.dp_given * model_parallel  # (torchtitan/distributed/parallel_dims.py _validate at 238fa9953e4a)
        requires = ("DeepSpeed's _batch_assertion requires of the ds_config's batch keys" if job.runtime == "deepspeed"
                    else "torchtitan requires of the world size")
        stated.append(f"{gpus} GPUs: the product of the degrees the file gives (data parallelism {job.dp_given} x "
                      f"TP {job.tp} x PP {job.pp} x CP {job.cp}), which {requires}")
    if gpus is None:
        raise UserError(f"{job.source} does not say how many GPUs the job runs on; give --gpus N")
    override = job.world_size is not None and gpus != job.world_size
    if gpus % model_parallel:
        counted = (f"--gpus {gpus} is" if given else
                   f"{job.source}'s launcher line starts {gpus} GPUs (read without its environment),")
        raise UserError(f"{counted} not a multiple of TP {job.tp} x PP {job.pp} x CP {job.cp} = "
                        f"{model_parallel}; give --gpus N, a multiple of {model_parallel}")
    dp = gpus // model_parallel
    if job.dp_given is not None and job.dp_given != dp:
        raise UserError(f"{job.source} gives data parallelism {job.dp_given}, and {gpus} GPUs over TP x PP x CP "
                        f"{model_parallel} leave {dp}; give --gpus {job.dp_given * model_parallel}")
    check_ep(job, dp=dp, gpus=gpus)
    microbatches, notes = microbatches_of(job, dp)
    notes[:0] = stated
    check_microbatches(job, microbatches, dp=dp)
    if override:  # the script's count may come from its environment (SLURM_NNODES): --gpus wins, said
        notes.append(f"--gpus {gpus}; the script's launcher line starts {job.world_size} processes as read without "
                     "its environment")
    device = archs.gpu(gpu_name)
    profile = _profile(job, device)
    if job.modelled.float8 and device.fp8_tflops and not _records_float8(profile, job):
        _float8_unscored(job, notes)
    data_parallel = _with_settings(_with_node(_data_parallel(job, dp, notes), job, device, gpus_per_node, notes,
                                              nvlink_domain), job)
    setup = build_setup(profile, stages=job.pp, mem=mem, microbatches=microbatches, schedule=job.schedule,
                        chunks=job.chunks, optimizer=job.optimizer, precision=job.precision, parallel_stages=None,
                        runtime=job.runtime or job.framework, fragmentation=fragmentation, data_parallel=data_parallel,
                        say=notes.append)
    if gpus_per_node is not None:
        setup = setup.model_copy(update={"devices_per_node": gpus_per_node})
    domain = topology.nvlink_domain(device, gpus_per_node, nvlink_domain)  # DeepEP's / HybridEP's NVLink reach
    backend = backend_setup(job, device, domain, notes)  # the flex dispatcher's DeepEP / HybridEP
    if backend is not None:
        setup = setup.model_copy(update={"data_parallel": setup.data_parallel.model_copy(
            update={"ep_dispatch": backend})})
    from planner.commands.training_settings import compiled_profile
    from planner.cost.float8 import float8_profile

    # compile's and Float8's records applied where the config asks for them
    profile = float8_profile(compiled_profile(profile, data_parallel.settings), setup)
    stages = _stages(job, profile, setup, notes)
    cost = costmodel.evaluate(stages, profile, setup)
    sequences = microbatches * setup.pipeline.micro_batch_size * dp
    return Prediction(job=job, gpus=gpus, dp=dp, profile=profile, setup=setup, stages=stages, cost=cost,
                      tokens_per_iteration=sequences * job.seq_len, notes=[*job.notes, *notes])


FP8_SETTINGS = ("--fp8-", "model.converters", "quantize.linear.float8.", "float8.")


def _records_float8(profile, job) -> bool:
    """Whether the profile's layers carry Float8 records under the job's runtime (a MoE block's is its Transformer
    Engine record's, read under Megatron-LM's: planner/cost/te_moe_float8.py)."""
    from planner.cost import runtimes, te_moe_float8

    return te_moe_float8.records_float8(profile, runtimes.facts(job.runtime or job.framework))


def _float8_unscored(job, notes: list[str]) -> None:
    """FP8 GEMMs the file asks for, on blocks whose profile records no Float8 timing (ckplan's Float8
    records are for dense LLaMA-style blocks: planner/profiler/float8.py): the job is scored in bf16 and its
    FP8 settings listed as not modelled, rather than the job refused."""
    from dataclasses import replace

    job.modelled.float8 = job.modelled.fp8_all_gather = job.modelled.fp8_current_scaling = False
    job.modelled.fp8_delayed_scaling = job.modelled.fp8_amax_tp_only = False
    what = ("FP8 GEMMs on blocks ckplan records no Float8 timing for under this runtime (latent attention; "
            "mixture-of-experts but Megatron-LM's TE experts: planner/profiler/float8.py, te_moe_float8.py): "
            "scored in bf16")
    job.settings[:] = [replace(s, status="not modelled", what=what)
                       if s.status == "modelled" and s.name.startswith(FP8_SETTINGS) else s for s in job.settings]
    notes.append(f"{job.source}: its FP8 GEMMs are scored in bf16: the {job.arch.name} profile records no Float8 "
                 "timing for its blocks")


def _profile(job, device):
    """The analytic profile of the job's model at its microbatch, TP, SP, CP and EP (the experts' GEMMs as a rank
    runs them: formulas.Shape.ep), on the GPU; an EP that does not divide the experts is check_ep's sentence."""
    from pydantic import ValidationError

    from planner import io
    from planner.profiler.analytic import Shape, analytic_profile
    from planner.schema import FileRef

    shape = Shape(seq_len=job.seq_len, micro_batch_size=job.micro_batch_size, tp=job.tp, sp=job.sp,
                  attention=job.attention, dtype="bfloat16", cp=job.cp,
                  ep=job.ep if job.arch.num_experts and job.arch.num_experts % job.ep == 0 else 1, mtp=job.mtp_layers)
    try:
        profile = analytic_profile(job.arch, shape, gpu=device, model=FileRef(file=job.source,
                                   sha256=job.arch.sha256()), compiled=job.modelled.compile)
    except ValidationError as exc:
        raise UserError(f"{job.source}: the model at --seq-length {job.seq_len} gives numbers no device holds "
                        f"({io.describe_error(exc)})") from exc
    if job.runtime == "deepspeed":  # the blocks' modules as Megatron-DeepSpeed builds them (fused QKV, gate/up)
        profile.assumptions["modules"] = "fused"
    if job.modelled.offload_optimizer:  # the ds_config's offload_optimizer: Adam on the host at the published rate
        from planner.commands.profile_arch import _with_host_step

        profile = _with_host_step(profile)
    return profile


def _data_parallel(job, dp: int, notes: list[str]):
    from planner.commands.setup_options import DataParallelOptions
    from planner.schema.setup import DEEPSPEED_CHECKPOINTING

    if dp == 1 and job.cp == 1:  # under CP the cp ranks of the one replica shard the optimizer (with_context_parallel)
        if job.modelled.ddp.get("overlap_param_gather"):  # one rank holds the whole shard: its gather moves nothing
            job.modelled.ddp["overlap_param_gather"] = False
            notes.append("one data-parallel rank: the distributed optimizer shards nothing, and --overlap-param-gather "
                         "gathers nothing")
        # DeepSpeed's checkpointing settings act on one rank too (its checkpoints' copies to the host)
        checkpointing = {name: value for name, value in job.modelled.deepspeed.items() if name in DEEPSPEED_CHECKPOINTING}
        return DataParallelOptions(ep=job.ep, deepspeed=checkpointing if job.runtime == "deepspeed" else None)
    if job.runtime == "deepspeed":  # Megatron-DeepSpeed's engine: the ds_config's ZeRO, offload and knobs
        return DataParallelOptions(dp=dp, zero=job.zero, ep=job.ep, offload_optimizer=job.modelled.offload_optimizer,
                                   deepspeed=dict(job.modelled.deepspeed))
    if job.framework == "megatron":
        return DataParallelOptions(dp=dp, zero=job.zero, shard_group=_optimizer_group(job, dp, notes), ep=job.ep)
    if dp % job.dp_replicate:
        raise UserError(f"data_parallel_replicate_degree {job.dp_replicate} does not divide data parallelism {dp}")
    shard = dp // job.dp_replicate
    if shard == 1:  # replicas only: DDP
        return DataParallelOptions(dp=dp, ep=job.ep)
    return DataParallelOptions(dp=dp, zero=3, shard_group=shard if job.dp_replicate > 1 else None, ep=job.ep)


def _optimizer_group(job, dp: int, notes: list[str]) -> int | None:
    """The ranks each distributed-optimizer instance shards over (--num-distributed-optimizer-instances
    replicas of it across the data-parallel domain, megatron-core parallel_state.py 918-929 at d98e8a64)."""
    instances = job.dp_replicate
    if instances == 1:
        return None
    if job.zero == 0:
        notes.append(f"--num-distributed-optimizer-instances {instances}: no distributed optimizer to split "
                     "(--use-distributed-optimizer not given), no effect")
        return None
    if dp % instances or dp == instances:
        raise UserError(f"--num-distributed-optimizer-instances {instances} must divide the {dp} data-parallel ranks "
                        "(Megatron-LM asserts it) and leave 2 or more in each instance (one rank an instance shards "
                        "nothing: drop it and --use-distributed-optimizer)")
    return dp // instances


def _with_settings(options, job):
    """The settings the file asks for that the cost model models (Job.modelled) as the options
    group's TrainingSettings and --tp-overlap, so build_setup puts them in the setup."""
    from dataclasses import replace

    from planner.commands.training_settings import TrainingSettings

    modelled = job.modelled
    settings = TrainingSettings(runtime_version=modelled.runtime_version,
                                compile_model=modelled.compile, compile_loss=modelled.compile_loss,
                                op_level_sac=modelled.op_level_sac,
                                optimizer_state_dtype=modelled.optimizer_state_dtype, expert_tp=modelled.expert_tp,
                                context_parallel=job.cp, cp_comm=modelled.cp_comm,
                                float8=modelled.float8, fp8_all_gather=modelled.fp8_all_gather,
                                unfused_grad_accumulation=modelled.unfused_grad_accumulation,
                                log_params_norm=modelled.log_params_norm,
                                log_num_zeros_in_grad=modelled.log_num_zeros_in_grad,
                                timing_log_level=modelled.timing_log_level, test_mode=modelled.test_mode,
                                deterministic=modelled.deterministic,
                                grad_reduce_bf16=modelled.grad_reduce_bf16,
                                te_cross_entropy=modelled.te_cross_entropy,
                                local_layers=modelled.local_layers,
                                fused_cross_entropy=modelled.fused_cross_entropy,
                                te_grouped_gemm=modelled.te_grouped_gemm,
                                nccl_ring_simple=modelled.nccl_ring_simple, nccl_nvls_off=modelled.nccl_nvls_off,
                                fp8_current_scaling=modelled.fp8_current_scaling,
                                fp8_delayed_scaling=modelled.fp8_delayed_scaling,
                                fp8_amax_history_len=modelled.fp8_amax_history_len if modelled.fp8_delayed_scaling
                                else None, fp8_amax_tp_only=modelled.fp8_amax_tp_only,
                                expandable_segments=modelled.expandable_segments,
                                chunked_cross_entropy=modelled.chunked_cross_entropy)
    return replace(options, settings=settings, tp_overlap=modelled.tp_overlap, ub_cfg=modelled.ub_cfg,
                   ddp=dict(modelled.ddp), ub_gemms=modelled.ub_gemms)


def _with_node(options, job, device, gpus_per_node: int | None, notes: list[str], nvlink_domain: int | None = None):
    """--gpus-per-node / --nvlink-domain: each group's link as links.default_links chooses it (in-node where
    the group's ranks x TP fit in the NVLink domain, else the network), for this domain, and the domain the
    pipeline's sends and the tensor-parallel collectives are placed by (comm_setup). Under context
    parallelism the data-parallel groups take their replicas' cp ranks too (build_setup's dp x cp)."""
    from dataclasses import replace

    from planner.models import network_rate, topology

    if gpus_per_node is None and nvlink_domain is None:
        return options
    given = f"--nvlink-domain {nvlink_domain}" if nvlink_domain else f"--gpus-per-node {gpus_per_node}"
    domain = topology.nvlink_domain(device, gpus_per_node, nvlink_domain)  # the links by the domain, not the host
    # the sends' and TP's links too (comm_setup.comm_fields)
    options = replace(options, gpus_per_node=gpus_per_node, nvlink_domain=nvlink_domain)
    if options.dp * job.cp == 1:
        return options
    span = job.tp * job.cp  # the ranks inside each data-parallel step: tp, then cp

    def link(ranks: int, stride: int = span, *, ring: bool = True) -> float:  # as links.default_links
        rate = network_rate.collective_rate if ring else network_rate.alltoall_rate  # in a node, or k ranks' NICs
        return rate(device, ranks, stride, domain, options.nics_per_gpu)

    shard = options.shard_group or options.dp
    k = network_rate.ranks_per_node(shard, span, domain)
    notes.append(f"{given}: shard group of {shard}{f' x CP {job.cp}' if job.cp > 1 else ''} "
                 f"x TP {job.tp} over {'the in-node link' if shard * span <= domain else f'the network, {k} NIC(s) a node'}")
    return replace(options, shard_bandwidth=link(shard), replica_bandwidth=link(max(1, options.dp // shard), span * shard),
                   ep_bandwidth=link(options.ep, ring=False) if options.ep > 1 else None)


def _block_option_stages(stages, profile, decoder: set, rec) -> list:
    """The first rec.num_layers decoder layers of each stage take rec.option (offload), refused where the
    profile does not offer it (a CPU-measured profile has no offload option)."""
    offered = {layer.name: {o.name for o in layer.recompute_options} for layer in profile.layers}
    chosen = [[n for n in s.layers if n in decoder][:rec.num_layers] for s in stages]
    missing = [n for names in chosen for n in names if rec.option not in offered.get(n, ())]
    if missing:
        raise UserError(f"layer {missing[0]} of the profile offers no {rec.option} option, which the config's "
                        f"--cpu-offloading needs: profile the model on the GPU, or drop --cpu-offloading")
    return [s.with_recompute(dict.fromkeys(names, rec.option)) for s, names in zip(stages, chosen)]


def _stages(job, profile, setup, notes: list[str]) -> list:
    """One stage per pipeline stage (P x V), the job's recompute applied; ranks for chunked schedules."""
    from planner.commands.handplan import hand_stages
    from planner.cost import costmodel
    from planner.emit.rounding import llm_roles

    counts = job.layers_per_stage or [job.arch.num_layers]
    stages = hand_stages(profile, counts, [0] * len(counts), "first")
    decoder = set(llm_roles(profile).decoder)
    # Megatron-core's MTP layers recompute with the decoder's, but for method block (analytic_mtp.recompute_options)
    mtp = {layer.name for layer in profile.layers if layer.kind == "mtp"}
    rec = job.recompute
    if rec.mode == "block" and rec.option != "full":  # Megatron-LM's --cpu-offloading-num-layers (megatron_offload.py)
        stages = _block_option_stages(stages, profile, decoder, rec)
    elif rec.mode in ("full", "block"):
        stages = [s.with_checkpointed([n for n in s.layers if n in decoder][:rec.num_layers if rec.mode == "block"
                                                                            else None]
                                      + [n for n in s.layers if n in mtp and rec.mode == "full"]) for s in stages]
    elif rec.mode == "every":
        chosen = set()
        for rank in range(job.pp):  # the stages a rank builds, in order: a loop, or a V (torchtitan's placement)
            mine = ([rank, 2 * job.pp - 1 - rank] if job.schedule in ("ZBV", "DualPipeV") and job.chunks == 2
                    else range(rank, len(stages), job.pp))
            built = [n for k in sorted(mine) for n in stages[k].layers if n in decoder]
            chosen |= {n for i, n in enumerate(built, start=1) if i % rec.num_layers == 0}
        stages = [s.with_checkpointed([n for n in s.layers if n in chosen]) for s in stages]
    elif rec.mode == "op":  # torchtitan's op-level SAC wraps every block (training_settings.op_sac_stages)
        from planner.commands.training_settings import op_sac_stages

        stages = op_sac_stages([s.with_checkpointed([n for n in s.layers if n in decoder]) for s in stages], profile)
    elif rec.mode == "selective" and rec.modules:
        from planner.models.configs.megatron_flags import selective_stages

        stages = selective_stages(stages, profile, decoder | mtp, rec.modules, notes)
    elif rec.mode == "selective":
        layers = {layer.name: layer for layer in profile.layers}
        able = {n for n in decoder if rec.option in {o.name for o in layers[n].recompute_options}}
        if rec.option == "none" or not able:
            notes.append(f"selective recompute ({rec.option}) is no option of this model's layers: scored as none")
        else:
            stages = [s.with_recompute({n: rec.option for n in s.layers if n in able}) for s in stages]
    if job.chunks > 1:
        stages = costmodel.ranks_of(stages, setup)
    return stages


def run(*, from_megatron: Path | None, from_torchtitan: Path | None, gpus: int | None, gpu: str,
        gpus_per_node: int | None, mem: str | None, fragmentation: float | None, as_json: bool,
        nvlink_domain: int | None = None) -> None:
    import json

    import click

    from planner.models import archs

    job = read_job(from_megatron, from_torchtitan)
    prediction = predict(job, gpus=gpus, gpu_name=gpu, gpus_per_node=gpus_per_node, mem=mem,
                         fragmentation=fragmentation, nvlink_domain=nvlink_domain)
    device = archs.gpu(gpu)
    if as_json:
        click.echo(json.dumps(summary(prediction, device), indent=2))
    else:
        _print(prediction, device)


def _fp8_share(prediction, device) -> str:
    """A Float8 job's matmuls run against the FP8 peak: its MFU against BF16's can pass 100%."""
    if not prediction.job.modelled.float8 or not device.fp8_tflops:
        return ""
    share = prediction.mfu(device) * device.bf16_tflops / device.fp8_tflops
    return f" ({share:.1%} of the dense FP8 peak its matmuls run at)"


def rank_rows(prediction) -> list[dict]:
    """Per pipeline rank: static, allocated peak and reserved peak (what every --json carries:
    planner/commands/stage_json.py)."""
    from planner.commands.stage_json import reserve_ranges, stages_json

    return stages_json(prediction.stages, prediction.cost, reserve_ranges(
        prediction.stages, prediction.cost, profile=prediction.profile, setup=prediction.setup))


def summary(prediction, device) -> dict:
    job, setup = prediction.job, prediction.setup
    return {
        "source": job.source, "framework": job.framework, "runtime": job.runtime or job.framework, "model": job.arch.name, "gpus": prediction.gpus,
        "gpu": device.name, "tp": job.tp, "sp": job.sp, "pp": job.pp, "virtual_stages": job.chunks, "cp": job.cp,
        "ep": job.ep, "dp": prediction.dp, "zero": setup.data_parallel.zero, "schedule": setup.pipeline.schedule,
        "micro_batch_size": setup.pipeline.micro_batch_size, "microbatches": setup.pipeline.microbatches,
        "seq_len": job.seq_len, "precision": job.precision, "ranks": rank_rows(prediction),
        "feasible": prediction.cost.feasible, "iteration_ms": prediction.cost.iteration_ms,
        "tokens_per_s_per_gpu": prediction.tokens_per_s_per_gpu, "mfu": prediction.mfu(device),
        "mfu_of": prediction.mfu_of,
        "tflops_per_gpu_megatron": prediction.megatron_tflops_per_gpu(device),
        "mfu_megatron": prediction.megatron_tflops_per_gpu(device) / device.bf16_tflops,
        "settings": [{"name": s.name, "value": s.value, "status": s.status, "what": s.what} for s in job.settings],
        "notes": prediction.notes,
    }


def _print(prediction, device) -> None:
    from planner.commands.solve_report import _layer_range
    from planner.commands.stage_json import range_line, reserve_ranges
    from planner.console import console, info, table
    from planner.units import format_bytes, format_ms

    job, setup = prediction.job, prediction.setup
    rows = [[str(s.index), " + ".join(_layer_range(chunk) for chunk in s.chunks or [s.layers]),
             f"{len(s.recompute)}/{len(s.layers)}", format_bytes(c.static_bytes), format_bytes(c.after_step_bytes),
             format_bytes(c.peak_bytes),
             format_bytes(c.reserved_bytes) if c.reserved_bytes is not None else "-", format_bytes(c.cap_bytes),
             "yes" if c.fits else "[bold red]NO[/]", format_ms(c.time_ms)]
            for s, c in zip(prediction.stages, prediction.cost.stages)]
    title = (f"{job.source} ({job.runtime or job.framework}): {job.arch.name} on {prediction.gpus} x {device.name}, TP {job.tp}"
             f"{' SP' if job.sp else ''}, PP {job.pp}{f' x {job.chunks} virtual' if job.chunks > 1 else ''}, "
             f"{f'CP {job.cp}, ' if job.cp > 1 else ''}DP {prediction.dp} (ZeRO {setup.data_parallel.zero}), "
             f"{f'EP {setup.data_parallel.ep}, ' if setup.data_parallel.ep > 1 else ''}{setup.pipeline.microbatches} microbatches x "
             f"{setup.pipeline.micro_batch_size} x {job.seq_len} tokens, {setup.pipeline.schedule}, {job.precision}")
    # "after step": what the rank holds once the optimizer has stepped (static and what the runtime keeps
    # past it), the figure Megatron-LM logs as mem-allocated-bytes
    console.print(table(title, ["rank", "layers", "recompute", "static", "after step", "allocated peak",
                                "reserved peak", "cap", "fits", "time/mb"], rows, right_from=2))
    console.print(f"iteration {format_ms(prediction.cost.iteration_ms)}; "
                  f"{prediction.tokens_per_s_per_gpu:,.0f} tokens/s per GPU; MFU {prediction.mfu(device):.1%} "
                  f"of the dense BF16 peak{_fp8_share(prediction, device)} ({prediction.mfu_source(device)})")
    if prediction.mfu_of == "torchtitan":  # a Megatron-LM job's MFU above is already its logged TFLOP/s/GPU
        tflops = prediction.megatron_tflops_per_gpu(device)
        console.print(f"Megatron-LM would log it as throughput per GPU {tflops:.1f} TFLOP/s/GPU "
                      f"({tflops / device.bf16_tflops:.1%} of the dense BF16 peak; {MEGATRON_SOURCE})")
    if (line := range_line(reserve_ranges(prediction.stages, prediction.cost, profile=prediction.profile,
                                          setup=prediction.setup), prediction.cost)) is not None:
        console.print(line)
    for status in ("not modelled", "unknown"):
        found = job.of(status)
        if found:
            # no column is a number: the value and the sentence wrap, the flag stays whole
            console.print(table(f"{status}: {len(found)} flag(s) the prediction leaves out",
                                ["flag", "value", "what"], [[s.name, s.value, s.what] for s in found], right_from=3))
    quiet = job.of("no effect")
    if quiet:
        info(f"no effect on the plan ({len(quiet)}): " + ", ".join(s.name for s in quiet))
    info(f"modelled ({len(job.of('modelled'))}): " + ", ".join(s.name for s in job.of("modelled")))
    for note in prediction.notes:
        info(note)
