"""`ckplan search --compare` and the hand configuration: configurations people run, scored under
the same cost model as the search's (planner/models/published.py holds the published ones)."""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import UserError


@dataclass
class Scored:
    """A configuration someone runs, as the cost model scores it; `why_not` says why it could not
    be scored for this job (then `cost` is None)."""

    config: object  # published.Published
    degrees: object = None  # degrees.Degrees
    setup: object = None
    profile: object = None
    stages: list | None = None
    cost: object = None  # costmodel.PlanCost
    note: str = ""  # how it was adapted to the job (scaled data parallelism, another batch)
    why_not: str = ""


def for_job(config, *, gpus: int, global_batch: int, seq_len: int | None = None, gpu: str | None = None):
    """(degrees, note) of a configuration adapted to this job's GPUs and batch: its tp, cp, pp, ep,
    ZeRO and micro-batch size kept, data parallelism taking the GPUs, the microbatches the batch;
    UserError where it cannot be."""
    from planner.solve.degrees import Degrees

    model_parallel = config.tp * config.cp * config.pp
    if gpus % model_parallel:
        cp = f" x cp {config.cp}" if config.cp > 1 else ""
        raise UserError(f"tp {config.tp}{cp} x pp {config.pp} does not divide {gpus} GPUs")
    dp = gpus // model_parallel
    if global_batch % (dp * config.micro_batch_size):
        raise UserError(f"the batch of {global_batch} does not split into dp {dp} x micro-batch "
                        f"{config.micro_batch_size}")
    notes = []
    if config.gpus is None:
        notes.append(f"the recipe gives no GPU count: dp {dp} on {gpus}")
    elif config.gpus != gpus:
        notes.append(f"published on {config.gpus} GPUs, data parallelism scaled to {gpus}")
    if config.global_batch and config.global_batch != global_batch:
        notes.append(f"published batch {config.global_batch}, run at {global_batch}")
    if seq_len is not None and config.seq_len != seq_len:
        notes.append(f"published at {config.seq_len} tokens, run at {seq_len}")
    if gpu is not None and config.framework != "hand" and _gpu_name(config.gpu) != gpu:
        notes.append(f"published on {config.gpu}, run on {gpu}")
    replicas = dp * config.cp  # the ranks holding the same weights, which ZeRO shards over (degrees.zero_choices)
    group = config.shard_group if config.shard_group and replicas % config.shard_group == 0 else None
    degrees = Degrees(tp=config.tp, sp=config.sp, pp=config.pp, dp=dp, micro_batch_size=config.micro_batch_size,
                      microbatches=global_batch // (dp * config.micro_batch_size), schedule=config.schedule,
                      chunks=config.chunks, zero=config.zero if replicas > 1 else 0, shard_group=group,
                      ep=config.ep, cp=config.cp)
    if config.ep > 1 and dp % config.ep:
        raise UserError(f"ep {config.ep} does not divide dp {dp}")
    return degrees, "; ".join(notes)


def _gpu_name(name: str) -> str:
    from planner.models import archs

    return archs.gpu(name).name


def score(config, *, gpus: int, global_batch: int, options, profile_for, time_limit_s: float,
          seq_len: int | None = None, gpu: str | None = None) -> Scored:
    """One configuration: its layer split and checkpointing as published (full or none), or with
    recompute "plan" ckplan's exact plan for its degrees."""
    from pydantic import ValidationError

    from planner.cost import costmodel
    from planner.cost.float8 import float8_profile
    from planner.solve import jobsearch, search
    from planner.solve.deadline import Deadline

    scored = Scored(uncharged_said(config, options))
    try:
        scored.degrees, scored.note = for_job(config, gpus=gpus, global_batch=global_batch, seq_len=seq_len, gpu=gpu)
        options = own_settings(config, options, scored.degrees)
        # its experts timed at its own expert parallelism (formulas.Shape.ep), as the search times its own
        scored.profile = profile_for(config.tp, config.sp, config.micro_batch_size,
                                     **({"cp": config.cp} if config.cp > 1 else {}),
                                     **({"ep": config.ep} if config.ep > 1 else {}))
        scored.setup = jobsearch.job_setup(scored.profile, scored.degrees, options)
        scored.profile = float8_profile(scored.profile, scored.setup)  # --float8: its records applied
    except (UserError, ValidationError) as exc:
        scored.why_not = str(exc).splitlines()[0]
        return scored
    if config.recompute == "plan":
        result = search.plan(scored.profile, scored.setup, deadline=Deadline(time_limit_s))
        if isinstance(result, search.NoFit):
            scored.why_not = "no plan of these degrees fits" if result.status == "infeasible" else "time limit"
            return scored
        scored.stages, scored.cost = result.stages, result.cost
        return scored
    try:
        stages = published_stages(scored.profile, config, scored.setup)
    except UserError as exc:
        scored.why_not = str(exc)
        return scored
    if (config.framework == "hand" or config.op_level_sac) and scored.setup.training.op_level_sac:
        # the user's --op-level-sac on the hand plan, or a torchtitan file's op-level AC: the checkpointed blocks
        # run torchtitan's op-level policy, as `evaluate` runs them (published records say how they score theirs)
        from planner.commands.training_settings import op_sac_stages

        stages = op_sac_stages(stages, scored.profile)
    if scored.setup.pipeline.chunks > 1:
        stages = costmodel.ranks_of(stages, scored.setup)
    scored.stages, scored.cost = stages, costmodel.evaluate(stages, scored.profile, scored.setup)
    return scored


# what a published record says its run ran and ckplan does not charge, against the search's setting that charges it
_CHARGED_BY = {"torch.compile": lambda options: bool(options.training.get("compile")),
               "Float8": lambda options: bool(options.training.get("float8")),
               "AsyncTP": lambda options: options.tp_overlap == "async-tp"}


def uncharged_said(config, options):
    """A published record whose `not_expressible` names only what the search's settings leave uncharged: its
    torch.compile, Float8 or AsyncTP are charged where the search was given --compile, --float8 or --tp-overlap
    async-tp, since every configuration, the published ones too, is scored with them. Records read from a
    framework's file say what they say already (from_framework_job)."""
    import dataclasses

    from planner.models.published import PUBLISHED

    if config not in PUBLISHED or not config.not_expressible:
        return config
    items = [item for item in config.not_expressible.split(", ")
             if not (item in _CHARGED_BY and _CHARGED_BY[item](options))]
    return dataclasses.replace(config, not_expressible=", ".join(items))


def own_settings(config, options, degrees):
    """The search's options with a framework file's own DDP and userbuffers settings, as `evaluate --from-*`
    scores them (evaluate_config._with_settings); one data-parallel rank (no cp) gathers nothing, as
    evaluate_config._data_parallel has it."""
    import dataclasses

    ddp = dict(config.ddp)
    if ddp.get("overlap_param_gather") and degrees.dp * degrees.cp == 1:
        ddp["overlap_param_gather"] = False
    if not ddp and config.ub_cfg is None and config.ub_gemms is None:
        return options
    return dataclasses.replace(options, data_parallel=options.data_parallel | ddp, ub_cfg=config.ub_cfg,
                               ub_gemms=config.ub_gemms)


def published_stages(profile, config, setup):
    """The stage plans of a configuration: its decoder layers per stage (or as even as they
    split), the first k of each checkpointed (all with recompute full, none with none)."""
    from planner.commands.handplan import hand_stages
    from planner.emit.rounding import llm_roles
    from planner.solve.baselines import balanced_split

    num_stages = setup.pipeline.stages * setup.pipeline.chunks
    roles = llm_roles(profile)
    counted = len(roles.decoder) if roles is not None else len(profile.layers)
    counts = list(config.layers_per_stage) if config.layers_per_stage else balanced_split([1.0] * counted, num_stages)
    if len(counts) != num_stages or sum(counts) != counted:
        raise UserError(f"its split {counts} is not {num_stages} stages of {counted} layers")
    if config.ckpt_per_stage:
        ckpt = list(config.ckpt_per_stage)
    else:
        ckpt = counts if config.recompute == "full" else [0] * len(counts)
    return hand_stages(profile, counts, ckpt, "first")


def hand_config(*, tp, sp, pp, dp, zero, shard_group, ep, micro_batch_size, schedule, chunks, recompute, gpus,
                global_batch, arch_name: str, gpu: str, seq_len: int):
    """The hand configuration given by flags, as a Published record (framework "hand")."""
    from planner.models.published import Published

    if dp is not None and dp * tp * pp != gpus:
        raise UserError(f"--tp {tp} x --pp {pp} x --dp {dp} is {dp * tp * pp} GPUs, not --gpus {gpus}; drop --dp or "
                        "make them agree")
    return Published(name="your configuration", arch=arch_name, framework="hand", gpus=gpus, gpu=gpu,
                     seq_len=seq_len, global_batch=global_batch, micro_batch_size=micro_batch_size, tp=tp, sp=sp,
                     pp=pp, schedule=schedule, chunks=chunks or (2 if schedule not in ("1F1B", "GPipe") else 1),
                     zero=zero, shard_group=shard_group, ep=ep, recompute=recompute, source="the flags given")


def matching(arch_name: str | None):
    """The published configurations of this model (run at this job's GPUs, batch and sequence
    length: for_job says where they differ)."""
    from planner.models.published import published_for

    return published_for(arch_name) if arch_name is not None else []


def from_framework_job(job, *, arch, gpu: str, seq_len: int, settings: dict | None = None):
    """A configuration read from a framework's own file (`--from-megatron`, `--from-torchtitan`:
    planner/models/configs) as a Published record, scored beside the search like a published one,
    with the search's settings (`settings`: TrainingSetup's fields and tp_overlap; None: the
    defaults). Its model must be the one searched; what the file asks for that is not charged so
    (not modelled, or set otherwise in the search) is said in `not_expressible`."""
    import dataclasses

    from planner.models.published import Published

    # the head size as each model has it (a file's --kv-channels equal to hidden / heads is the derived one)
    mine = {k: v for k, v in dataclasses.asdict(job.arch).items() if k not in _ARCH_LABELS} | {
        "head_dim": job.arch.head_size}
    searched = {k: v for k, v in dataclasses.asdict(arch).items() if k not in _ARCH_LABELS} | {
        "head_dim": arch.head_size}
    differ = [k for k in searched if mine.get(k) != searched[k]]
    padded = differ == ["vocab_size"] and job.vocab_unpadded == arch.vocab_size  # Megatron-LM's padding of it
    if differ and not padded:
        key = differ[0]
        raise UserError(f"{job.source} describes another model than the one searched ({key} {mine.get(key)} "
                        f"against {searched[key]}); search that model, or compare a config of this one")
    stages = job.pp * job.chunks
    recompute, ckpt, unsaid = _framework_recompute(job, stages, op_level_sac=bool((settings or {}).get("op_level_sac")))
    unmodelled = [setting.name for setting in job.of("not modelled")] + unsaid + _settings_unsaid(job.modelled,
                                                                                                  settings or {})
    if job.arch.router_aux_loss and not arch.router_aux_loss:  # a training loss, not the model: scored without it
        unmodelled.append("the router's aux loss (scored without it, as the searched model's router)")
    if job.arch.router_dtype_bytes and not arch.router_dtype_bytes:  # how the job runs its router, not the model
        unmodelled.append("--moe-router-dtype fp32 (scored in the input's dtype, as the searched model's router)")
    dp = job.dp_given if job.dp_given and job.dp_given > 0 else None
    batch = job.global_batch_size or (job.local_batch_size * dp if job.local_batch_size and dp else 0)
    shard_group = dp // job.dp_replicate if dp and job.dp_replicate > 1 else None
    return Published(name=f"{job.framework}: {job.source}", arch=arch.name, framework=job.framework,
                     gpus=job.world_size, gpu=gpu, seq_len=seq_len, global_batch=batch,
                     micro_batch_size=job.micro_batch_size, tp=job.tp, sp=job.sp, pp=job.pp, schedule=job.schedule,
                     chunks=job.chunks, zero=job.zero, shard_group=shard_group, ep=job.ep, cp=job.cp, recompute=recompute,
                     ddp=tuple(job.modelled.ddp.items()), ub_cfg=job.modelled.ub_cfg, ub_gemms=job.modelled.ub_gemms,
                     model=job.arch if padded else None,
                     layers_per_stage=tuple(job.layers_per_stage) if job.layers_per_stage else None,
                     ckpt_per_stage=ckpt, op_level_sac=job.recompute.mode == "op", not_expressible=", ".join(unmodelled), source=str(job.source))


def _settings_unsaid(modelled, searched: dict) -> list[str]:
    """The settings `evaluate --from-*` models (configs.JobSettings) that the file sets otherwise
    than the search scores every configuration (`searched`): said, not dropped."""
    loss = modelled.compile if modelled.compile_loss is None else modelled.compile_loss
    model_searched = searched.get("compile", False)
    delayed = modelled.fp8_delayed_scaling and searched.get("fp8_delayed_scaling", False)  # both: their histories
    loss_searched = model_searched if searched.get("compile_loss") is None else searched["compile_loss"]
    found = [("torch.compile of the blocks", modelled.compile, model_searched),
             ("torch.compile of the loss", loss, loss_searched),
             ("Float8 linears", modelled.float8, searched.get("float8", False)),
             ("the float8 all-gather", modelled.fp8_all_gather, searched.get("fp8_all_gather", False)),
             ("FP8 current scaling (TE's amax all-reduces over TP)", modelled.fp8_current_scaling,
              searched.get("fp8_current_scaling", False)),
             ("FP8 delayed scaling (TE's amax history and all-reduces)", modelled.fp8_delayed_scaling,
              searched.get("fp8_delayed_scaling", False)),
             ("TP overlap", modelled.tp_overlap, searched.get("tp_overlap", "none")),
             ("Adam's moments", modelled.optimizer_state_dtype, searched.get("optimizer_state_dtype", "fp32")),
             ("the runtime version", modelled.runtime_version, searched.get("runtime_version")),
             ("the unfused weight-gradient accumulation", modelled.unfused_grad_accumulation,
              searched.get("unfused_grad_accumulation", False)),
             ("the parameters' norm logged", modelled.log_params_norm, searched.get("log_params_norm", False)),
             ("the gradients' zeros logged", modelled.log_num_zeros_in_grad, searched.get("log_num_zeros_in_grad", False)),
             ("deterministic mode", modelled.deterministic, searched.get("deterministic", False)),
             ("NCCL's Ring / Simple forced", modelled.nccl_ring_simple, searched.get("nccl_ring_simple", False)),
             ("NVLink SHARP turned off (NCCL_NVLS_ENABLE=0)", modelled.nccl_nvls_off,
              searched.get("nccl_nvls_off", False)),
             ("gradients reduced in bf16 (--grad-reduce-in-bf16)", modelled.grad_reduce_bf16,
              searched.get("grad_reduce_bf16", False)),
             ("Transformer Engine's fused cross-entropy", modelled.te_cross_entropy,
              searched.get("te_cross_entropy", False)),
             ("Megatron's own fused cross-entropy", modelled.fused_cross_entropy,
              searched.get("fused_cross_entropy", False)),
             ("Megatron-core's local layers (--transformer-impl local)", modelled.local_layers,
              searched.get("local_layers", False)),
             ("Transformer Engine's grouped GEMM over the experts", modelled.te_grouped_gemm,
              searched.get("te_grouped_gemm", False)),
             ("the timers' level (--timing-log-level)", modelled.timing_log_level, searched.get("timing_log_level", 0)),
             ("the amax reduced over TP only (--tp-only-amax-red)", modelled.fp8_amax_tp_only,
              searched.get("fp8_amax_tp_only", False)),
             ("the amax history's length", modelled.fp8_amax_history_len if delayed else 1,
              (searched.get("fp8_amax_history_len") or 1) if delayed else 1),
             ("chunked cross-entropy's chunks", modelled.chunked_cross_entropy or 0,
              searched.get("chunked_cross_entropy") or 0)]
    return [f"{what} {_said(mine)} (scored {_said(theirs)}, as the search)" for what, mine, theirs in found
            if mine != theirs]


def _said(value) -> str:
    if value is None:
        return "the newest read"
    return {True: "on", False: "off"}[value] if isinstance(value, bool) else str(value)


# Arch fields that name or cite a model rather than shape it, and its numerics (rotary base and scaling, norm
# epsilon: no bytes, no FLOPs), which a Megatron-LM file's reader leaves unset (--rotary-base, --norm-epsilon
# have no effect on the plan) while the built-in architectures carry their model cards' values
# what names a model or is how one implementation runs it, not what the model is: routing_weight_bytes and
# renormalizes_top_k are the router's ops as transformers runs them (archs.Arch, counted by analytic_moe), which a
# framework's file never says (Megatron-LM's router is its own); router_aux_loss is a loss the job trains with
# (a Megatron file's --moe-aux-loss-coeff), said in not_expressible where the searched model's router runs without it;
# router_dtype_bytes is the dtype a job runs its router in (a Megatron file's --moe-router-dtype), said the same way
_ARCH_LABELS = ("name", "source", "max_position_embeddings", "rope_theta", "norm_eps", "rope_scaling",
                "routing_weight_bytes", "renormalizes_top_k", "router_aux_loss", "router_dtype_bytes")


def _framework_recompute(job, stages: int, *, op_level_sac: bool = False):
    """(recompute, checkpointed layers per stage, what is scored otherwise than the file says) of a
    read job: none and full as they are, Megatron's block method as the first N of each stage;
    torchtitan's op-level AC every block checkpointed (under the policy where the search is given
    --op-level-sac, `op_level_sac`); every-Nth and selective recompute have no whole-layer form and are
    scored as full recompute."""
    mode = job.recompute.mode
    if mode in ("none", "full"):
        return mode, None, []
    if mode == "block":
        said = [] if job.recompute.option == "full" else [  # Megatron-LM's --cpu-offloading-num-layers
            f"{job.recompute.option} of the first {job.recompute.num_layers} layers (scored as whole-layer recompute)"]
        if job.layers_per_stage:
            return "full", tuple(min(job.recompute.num_layers, n) for n in job.layers_per_stage), said
        return "full", (job.recompute.num_layers,) * stages, said
    if mode == "op":  # torchtitan's selective_ac_option "op": evaluate runs it, and the search under --op-level-sac
        return "full", None, [] if op_level_sac else [
            "op-level SAC, activation_checkpoint.selective_ac_option op (scored as full recompute: search with "
            "--op-level-sac to score it)"]
    return "full", None, [f"{mode} recompute (scored as full recompute)"]
