"""The options for the settings real jobs use (--runtime-version, --compile, --op-level-sac,
--float8, --fp8-all-gather, --cp, --cp-comm, --optimizer-state-dtype, --chunked-cross-entropy,
--mtp-layers, --expert-tp, and Megatron-LM's --no-gradient-accumulation-fusion, --log-params-norm,
--log-num-zeros-in-grad, --deterministic-mode, --grad-reduce-in-bf16, --te-cross-entropy, --local-layers): TrainingSetup's fields of the same names. planner/cost/runtimes.py
models each or refuses it in one sentence; none is ignored."""

from __future__ import annotations

from dataclasses import dataclass

import click

from planner.errors import UserError

# The settings real jobs use (TrainingSetup's fields of the same names; planner/cost/runtimes.py
# models each or refuses it in one sentence).
SETTING_OPTIONS = [
    click.option("--runtime-version", default=None, metavar="VERSION",
                 help="The runtime's version whose facts apply (torchtitan: bbb1b616 compiles the loss under "
                      "--compile, 9dec370 does not; colossalai: hf-4.46 or hf-4.3x, the transformers loss it runs; deepspeed: "
                      "56c52238, BLOOM 176B's, adds bf16 gradients into fp32 ones every microbatch and all-reduces "
                      "after the last) "
                      "[default: the newest read]."),
    click.option("--compile", "compile_components", is_flag=False, flag_value="model,loss", default=None,
                 metavar="[model,loss]", callback=lambda ctx, param, value: compile_components(value),
                 help="torch.compile (torchtitan's compile.enable with compile.components; bare: model,loss): model "
                      "compiles the layers, which keep what the profile recorded under compile (`ckplan profile "
                      "--arch ... --compiled`) and run the times it recorded, else are charged as eager, said; loss compiles "
                      "the loss as the runtime's version does. Only a runtime that compiles the model takes it "
                      "(torchtitan; refused under ckplan, megatron, deepspeed and colossalai, which run eager)."),
    click.option("--op-level-sac", is_flag=True,
                 help="torchtitan's op-level selective AC: a checkpointed block (evaluate) runs its op-sac policy, "
                      "every second mm and the attention saved, and solve may choose it for a block (analytic "
                      "LLaMA profiles)."),
    click.option("--float8", is_flag=True,
                 help="Float8 linears (torchtitan's torchao tensorwise; Megatron-LM's Transformer Engine, its FP8 "
                      "saved inputs and weight copies as TE v2.9 keeps them): "
                      "the blocks' linears in FP8, from the profile's Float8 records (analytic dense blocks)."),
    click.option("--fp8-all-gather", is_flag=True,
                 help="FSDP2's float8 all-gather of the Float8 linears' weights (torchtitan; with --float8); under "
                      "--runtime megatron, Megatron-LM's --fp8-param-gather (the weights kept and gathered in FP8)."),
    click.option("--cp", "context_parallel", type=click.IntRange(min=1), default=None,
                 help="Context-parallel degree: each rank holds seq/cp tokens, attention exchanges K/V in a ring "
                      "(Megatron-LM, torchtitan); the profile must be made at it (`ckplan profile --arch ... --cp N`) "
                      "[default: the profile's]."),
    click.option("--cp-comm", type=click.Choice(["p2p", "allgather", "a2a"]), default=None,
                 help="How context-parallel ranks exchange K/V: p2p (Megatron-LM's --cp-comm-type p2p, torchtitan's "
                      "alltoall rotation), allgather, or a2a (Megatron-LM's all-to-all of Q, K, V and the output "
                      "over the heads) [default: the runtime's: Megatron p2p, torchtitan allgather]."),
    click.option("--optimizer-state-dtype", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True,
                 help="Adam's moments in fp32 or bf16 (Megatron-LM's --exp-avg-dtype / --exp-avg-sq-dtype)."),
    click.option("--chunked-cross-entropy", type=click.IntRange(min=1), is_flag=False, flag_value=8, default=None,
                 metavar="[N]",
                 help="torchtitan's chunked cross-entropy (ChunkedLossWrapper, 0.3.0): the LM head and the loss run "
                      "over N chunks of each sequence, each chunk's backward at once [N: 8, its default] "
                      "(--runtime torchtitan)."),
    click.option("--mtp-layers", type=click.IntRange(min=0, max=64), default=0, show_default=True,
                 help="Multi-token-prediction modules (refused above 0: not modelled)."),
    click.option("--expert-tp", type=click.IntRange(min=1), default=None,
                 help="Expert tensor-parallel degree (refused where it differs from the profile's TP) [default: TP]."),
    click.option("--no-gradient-accumulation-fusion", "unfused_grad_accumulation", is_flag=True,
                 help="Megatron-LM's flag of that name: each weight gradient written in bf16 and added into the fp32 "
                      "main_grad by its own kernel, 4 B more a weight a microbatch (--runtime megatron)."),
    click.option("--log-params-norm", is_flag=True,
                 help="Megatron-LM's flag: the parameters' norm read once a step over the rank's fp32 shard "
                      "(--runtime megatron)."),
    click.option("--log-num-zeros-in-grad", is_flag=True,
                 help="Megatron-LM's flag: the gradients' zeros counted once a step over the rank's fp32 shard "
                      "(--runtime megatron)."),
    click.option("--timing-log-level", type=click.IntRange(0, 2), default=0, show_default=True,
                 help="Megatron-LM's flag: its timers above level 0 synchronize the device at each start and stop "
                      "(1: around the step's forward-backward and optimizer parts; 2: also every microbatch's "
                      "forward and backward), so the host issues nothing ahead across them (--runtime megatron)."),
    click.option("--nccl-ring-simple", "nccl_ring_simple", is_flag=True,
                 help="The job's launch forces NCCL_ALGO=Ring and NCCL_PROTO=simple (Megatron-LM's functional tests' "
                      "_run_training.sh): the step's scalar all-reduces charged at Ring/Simple's latency, not at "
                      "the protocol NCCL's tuner picks (--runtime megatron)."),
    click.option("--nccl-nvls-off", "nccl_nvls_off", is_flag=True,
                 help="The job's launch sets NCCL_NVLS_ENABLE=0 (Megatron-Bridge's performance runs, Megatron-LM's "
                      "functional tests): no NVLink SHARP on multicast GPUs (H100 / H200 / B200 NVSwitch nodes, GB200 "
                      "NVL72), so neither its buffers nor its algorithms in NCCL's tuner."),
    click.option("--deterministic-mode", "deterministic", is_flag=True,
                 help="Megatron-LM's flag: torch's deterministic algorithms, whose NaN fill writes each of "
                      "Transformer Engine's outputs once more; its deterministic attention backward has no "
                      "published rate and is timed as the other (--runtime megatron)."),
    click.option("--test-mode", "test_mode", is_flag=True,
                 help="Megatron-LM's flag: each attention forward with q/k norms all-gathers them over DP and TP and "
                      "asserts them equal on the host, syncing the device (--runtime megatron)."),
    click.option("--grad-reduce-in-bf16", "grad_reduce_bf16", is_flag=True,
                 help="Megatron-LM's flag: gradients accumulated and reduced in bf16 (2 B a parameter, not the fp32 "
                      "main_grad's 4), the distributed optimizer's step copying its shard to fp32 (--runtime megatron)."),
    click.option("--te-cross-entropy", is_flag=True,
                 help="Megatron-LM's --cross-entropy-loss-fusion --cross-entropy-fusion-impl te: Transformer Engine's "
                      "fused cross-entropy, its gradient written into the logits (kept and peak 1x the logits; "
                      "--runtime megatron)."),
    click.option("--local-layers", is_flag=True,
                 help="Megatron-LM's --transformer-impl local: Megatron-core's own layers, no Transformer Engine (no "
                      "TE cuBLAS workspace; DotProductAttention's global buffer at the attention scores' size, kept; "
                      "the profile's attention eager, as --from-megatron reads it; --runtime megatron)."),
    click.option("--fused-cross-entropy", "fused_cross_entropy", is_flag=True,
                 help="Megatron-LM's --cross-entropy-loss-fusion (native): its own cross-entropy in torch.compile'd "
                      "steps, the fp32 softmax saved and a second fp32 copy in the backward (peak 5x the bf16 logits; "
                      "--runtime megatron)."),
    click.option("--te-grouped-gemm", "te_grouped_gemm", is_flag=True,
                 help="Megatron-LM's --moe-grouped-gemm on Transformer Engine's layers: TE's grouped GEMM over the "
                      "experts, four more cuBLAS workspaces of 32 MiB on Hopper (--runtime megatron)."),
    click.option("--fp8-current-scaling", "fp8_current_scaling", is_flag=True,
                 help="Megatron-LM's --fp8-recipe tensorwise under --float8: Transformer Engine's FP8 current scaling, "
                      "whose sequence-parallel blocks all-reduce each gathered input's and output gradient's amax over "
                      "the TP group before its cast, four a block-microbatch (--runtime megatron)."),
    click.option("--fp8-delayed-scaling", "fp8_delayed_scaling", is_flag=True,
                 help="Megatron-LM's --fp8-recipe delayed (its default) under --float8: Transformer Engine's delayed "
                      "scaling, each cast at its amax history's scale with no amax pass, the amaxes all-reduced over "
                      "TP x DP x CP twice a model chunk a microbatch and once a recompute, the history held "
                      "(--runtime megatron)."),
    click.option("--fp8-amax-history-len", "fp8_amax_history_len", type=click.IntRange(1, 1 << 20), default=None,
                 help="Megatron-LM's --fp8-amax-history-len under --fp8-delayed-scaling: each TE module's amax "
                      "history, fp32, a row per step [default: 1, Megatron-LM's]."),
    click.option("--fp8-tp-only-amax-red", "fp8_amax_tp_only", is_flag=True,
                 help="Megatron-LM's --tp-only-amax-red under --fp8-delayed-scaling: the amaxes reduced over TP x CP "
                      "only."),
    click.option("--expandable-segments/--no-expandable-segments", "expandable_segments", default=None,
                 help="Whether the job's launch sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: the caching "
                      "allocator's replay (the reserve on cuda) runs its rules or the default segments (ROCm builds "
                      "of the runs' torch ignored it) [default: as the runtime's launch script sets it: torchtitan's "
                      "run_train.sh sets it, its Slurm script does not]."),
]
SETTING_OPTION_NAMES = ("runtime_version", "compile_components", "op_level_sac", "float8", "fp8_all_gather",
                        "context_parallel", "cp_comm", "optimizer_state_dtype", "chunked_cross_entropy", "mtp_layers", "expert_tp",
                        "unfused_grad_accumulation", "log_params_norm", "log_num_zeros_in_grad", "timing_log_level",
                        "deterministic", "test_mode",
                        "expandable_segments", "grad_reduce_bf16", "te_cross_entropy", "fused_cross_entropy",
                        "te_grouped_gemm", "local_layers", "nccl_ring_simple", "nccl_nvls_off",
                        "fp8_current_scaling", "fp8_delayed_scaling", "fp8_amax_history_len", "fp8_amax_tp_only")


COMPILE_COMPONENTS = ("model", "loss")  # torchtitan's compile.components (config/job_config.py 725, 238fa9953e4a)


def compile_components(text: str | None) -> tuple[str, ...] | None:
    """--compile's value as the components it compiles (None: not given); anything but model and
    loss is refused in one sentence."""
    if text is None:
        return None
    parts = tuple(part.strip() for part in text.split(",") if part.strip())
    stray = [part for part in parts if part not in COMPILE_COMPONENTS]
    if stray or not parts:
        raise click.BadParameter(f"{text!r}: name what torch.compile compiles, model and/or loss, separated by a "
                                 "comma (bare --compile: model,loss)")
    return parts


@dataclass(frozen=True)
class TrainingSettings:
    """The settings real jobs use, as given (TrainingSetup's fields; `compile_model` is its `compile`,
    the layers compiled; `compile_loss` its `compile_loss`)."""

    runtime_version: str | None = None
    compile_model: bool = False
    compile_loss: bool | None = None  # None: with the model, as the runtime's version compiles it
    op_level_sac: bool = False
    float8: bool = False
    fp8_all_gather: bool = False
    context_parallel: int | None = None  # None: the profile's degree
    cp_comm: str | None = None
    optimizer_state_dtype: str = "fp32"
    chunked_cross_entropy: int | None = None  # N chunks; None (not given): the loss on whole logits
    mtp_layers: int = 0
    expert_tp: int | None = None
    unfused_grad_accumulation: bool = False
    log_params_norm: bool = False
    log_num_zeros_in_grad: bool = False
    timing_log_level: int = 0
    deterministic: bool = False
    test_mode: bool = False
    expandable_segments: bool | None = None  # None: as the runtime's launch script sets it
    grad_reduce_bf16: bool = False
    te_cross_entropy: bool = False
    local_layers: bool = False
    fused_cross_entropy: bool = False
    te_grouped_gemm: bool = False
    nccl_ring_simple: bool = False
    nccl_nvls_off: bool = False
    fp8_current_scaling: bool = False
    fp8_delayed_scaling: bool = False
    fp8_amax_history_len: int | None = None  # None: Megatron-LM's 1
    fp8_amax_tp_only: bool = False

    @classmethod
    def from_options(cls, values: dict) -> TrainingSettings:
        """The settings from the options' values (SETTING_OPTION_NAMES), taken out of `values`."""
        given = {name: values.pop(name) for name in SETTING_OPTION_NAMES}
        components = given.pop("compile_components") or ()
        loss = None if set(components) == set(COMPILE_COMPONENTS) or not components else "loss" in components
        return cls(**given, compile_model="model" in components, compile_loss=loss)

    def fields(self) -> dict:
        """TrainingSetup's fields."""
        found = {name: getattr(self, name) for name in SETTING_OPTION_NAMES if name != "compile_components"}
        return found | {"compile": self.compile_model, "compile_loss": self.compile_loss,
                        "chunked_cross_entropy": self.chunked_cross_entropy or 0}


def check_settings(profile, *, runtime: str, settings: dict, say=None) -> None:
    """Refuse, in one sentence, a runtime version not read or a setting the cost model does not
    model (planner/cost/runtimes.py); say what --compile changes."""
    from types import SimpleNamespace

    from planner.cost import runtimes
    from planner.cost.rules import profile_tp

    runtimes.facts(runtime, settings["runtime_version"])  # an unknown version refused
    settings["context_parallel"] = context_parallel(profile, settings["context_parallel"])
    refused = runtimes.refused_settings(SimpleNamespace(runtime=runtime, **settings), tp=profile_tp(profile))
    refused += _a2a_heads(profile, settings["cp_comm"], settings["context_parallel"])
    if settings.get("te_grouped_gemm") and not any(layer.expert_param_count for layer in profile.layers):
        refused.append("--te-grouped-gemm runs Transformer Engine's grouped GEMM over a mixture-of-experts model's "
                       f"experts; the profile's {len(profile.layers)} layers hold none (a dense model makes no grouped "
                       "GEMM): drop it")
    refused += _nccl_off_gpu(profile, settings)
    if settings.get("fp8_current_scaling") and (runtime != "megatron" or not settings["float8"]):
        refused.append("--fp8-current-scaling is Transformer Engine's FP8 recipe under --runtime megatron with "
                       "--float8 (Megatron-LM's --fp8-recipe tensorwise); give both or drop it")
    refused += _delayed_refused(runtime, settings)
    if refused:
        raise UserError(refused[0])
    if say is not None:
        setting_notes(profile, runtime=runtime, settings=settings, say=say)


def _delayed_refused(runtime: str, settings: dict) -> list[str]:
    """TE's delayed scaling's settings where they mean nothing: without --float8 under --runtime megatron, beside
    current scaling, or its history and group without it."""
    if settings.get("fp8_delayed_scaling"):
        if runtime != "megatron" or not settings["float8"]:
            return ["--fp8-delayed-scaling is Transformer Engine's FP8 recipe under --runtime megatron with --float8 "
                    "(Megatron-LM's --fp8-recipe delayed); give both or drop it"]
        if settings.get("fp8_current_scaling"):
            return ["--fp8-delayed-scaling and --fp8-current-scaling are two FP8 recipes; a job runs one: drop one"]
        return []
    given = [flag for flag, name in (("--fp8-amax-history-len", "fp8_amax_history_len"),
                                     ("--fp8-tp-only-amax-red", "fp8_amax_tp_only")) if settings.get(name)]
    return [f"{given[0]} sets Transformer Engine's delayed scaling, which this job does not run: give "
            "--fp8-delayed-scaling or drop it"] if given else []


def _nccl_off_gpu(profile, settings: dict) -> list[str]:
    """NCCL's launch settings on a profile that runs no NCCL (a cpu profile: gloo's collectives), which the plan
    would carry into its launch files and no term reads: refused, as --nvlink-domain is (comm_setup.comm_fields)."""
    given = [flag for flag, name in (("--nccl-nvls-off", "nccl_nvls_off"), ("--nccl-ring-simple", "nccl_ring_simple"))
             if settings.get(name)]
    if not given or profile.device.type == "cuda":
        return []
    return [f"{given[0]} says how NCCL runs a GPU job's collectives, and the profile runs on {profile.device.type} "
            "(gloo's collectives, no NCCL): drop it or profile for a GPU"]


def setting_notes(profile, *, runtime: str, settings: dict, say) -> None:
    """Say what --float8 (where its memory is not modelled) and --compile change under `runtime`."""
    from planner.cost import runtimes

    record = runtimes.facts(runtime, settings["runtime_version"])
    if profile.assumptions.get("optimizer_impl"):
        say(_optimizer_impl_note(profile, runtime))
    if record.fused_kernels:
        say(_fused_kernels_note(profile, record))
    if settings["float8"] and not record.float8_memory and record.te_float8_saved_inputs:
        say(f"--float8: {runtime}'s Float8 ({record.float8}) is timed (its GEMMs in FP8, its casts); in memory its "
            "linears' inputs are kept as Transformer Engine v2.9 saves them in FP8 and its weights' FP8 copies "
            "charged (planner/cost/te_kept.py, bridgesettings.py), its casts' transients as the bf16 layers'")
    elif settings["float8"] and not record.float8_memory:
        say(f"--float8: {runtime}'s Float8 ({record.float8}) is timed (its GEMMs in FP8, its casts); its memory "
            "is charged as the bf16 layers' (its float8 weight workspaces and saved inputs are not modelled)")
    if settings.get("fp8_delayed_scaling"):
        say(_delayed_note(profile, settings))
    loss = settings["compile"] if settings.get("compile_loss") is None else settings["compile_loss"]
    if settings["compile"] or loss:
        say(f"--compile {compile_said(settings['compile'], loss)}: " + _compile_note(profile, record, settings["compile"], loss))


def _optimizer_impl_note(profile, runtime: str) -> str:
    """The Adam step the profile times (`ckplan profile --optimizer-impl`), charged in place of the runtime's own:
    the option names the job's optimizer, which no runtime record reads; its step's scratch stays the runtime's."""
    from planner.models.optimizer_impls import IMPL_HELP

    impl = profile.assumptions["optimizer_impl"]
    return (f"--optimizer-impl {impl} (the profile's): each layer's Adam step is timed as {IMPL_HELP.get(impl, impl)}, "
            f"in place of the Adam step --runtime {runtime} runs; the step's scratch memory is still the runtime's")


def _delayed_note(profile, settings: dict) -> str:
    """What --fp8-delayed-scaling charges (planner/cost/te_delayed.py), and the blocks charged as tensorwise."""
    from planner.cost.te_delayed import undelayed_layers

    group = "TP x CP" if settings.get("fp8_amax_tp_only") else "TP x DP x CP"
    said = (f"--fp8-delayed-scaling: Transformer Engine's delayed scaling: its casts without an amax pass (the norm "
            f"writing FP8 itself), the amaxes all-reduced over {group} at each model chunk's forward end and backward "
            f"end and each recompute, the meta buffers of {settings.get('fp8_amax_history_len') or 1} history row(s) "
            "held (planner/cost/te_delayed.py)")
    undelayed = undelayed_layers(profile)
    if undelayed:
        said += (f"; {len(undelayed)} block(s) ({undelayed[0]}, ...) charged with tensorwise casts: their experts' "
                 "grouped quantize under delayed scaling is not read")
    return said


def _fused_kernels_note(profile, record) -> str:
    """What the runtime's fused kernels change (planner/cost/fusedkernels.py), and the blocks left as profiled."""
    from planner.cost.fusedkernels import blocks as profile_blocks
    from planner.cost.fusedkernels import untimed_layers

    untimed = untimed_layers(profile)
    blocks = len(profile_blocks(profile))
    if profile.source != "analytic" and not any(layer.te_time is not None for layer in profile.layers):
        return (f"--runtime {record.name}: the {profile.source} profile records no layer's passes on Transformer "
                f"Engine's fused norms, rotary and activations, so its {len(profile.layers)} layers are timed as the "
                "profile's own passes, slower than Transformer Engine runs them (an analytic dense-block profile "
                "made without --mfu records them, and a --fake profile of an --hf-config whose architecture ckplan "
                "reads)")
    said = (f"--runtime {record.name}: {blocks - len(untimed)} of {blocks} blocks timed on Transformer Engine's fused "
            "norms, rotary and activations, attention at cuDNN's published rate where the GPU has one "
            "(planner/profiler/te_fused.py)")
    if untimed:
        said += (f"; {len(untimed)} ({untimed[0]}, ...) timed as the profile's own passes: the profile records no fused "
                 "time for them (an analytic dense-block profile made without --mfu does, and a --fake profile "
                 "of a --hf-config whose architecture ckplan reads)")
    return said


def compile_said(model: bool, loss: bool) -> str:
    """The components compiled, as --compile spells them."""
    return ",".join(name for name, on in zip(COMPILE_COMPONENTS, (model, loss)) if on)


def _compile_note(profile, record, model: bool, loss: bool) -> str:
    layers = sum(1 for layer in profile.layers if layer.compiled_kept_bytes)
    said = f"{record.name} {record.version} " + (
        (f"compiles the loss (charged as read from inductor's code; {_loss_time_said(profile)})"
         if record.loss_compiled is not None else "does not compile the loss") if loss else "runs the loss eager")
    if not model:
        return said + "; the layers eager"
    return said + (f"; {layers} of {len(profile.layers)} layers keep what the profile recorded under compile "
                   "(AOTAutograd's partition), the others as eager" if layers else
                   "; the profile recorded no layer's kept bytes under compile, so the layers' memory is charged as "
                   "eager (an --arch profile records them with --compiled)") + _compiled_time_said(profile)


def _loss_time_said(profile) -> str:
    return ("timed by inductor's kernels" if profile.compiled_loss_ms is not None else
            "timed as eager: the profile recorded no compiled loss time")


def _compiled_time_said(profile) -> str:
    timed = sum(1 for layer in profile.layers if layer.compiled_time is not None)
    if not timed:
        return ("; the profile recorded no layer's time under compile, so every layer is timed as eager (an --arch "
                "profile made with --compiled and without --mfu records it)")
    return (f"; {timed} of {len(profile.layers)} layers are timed as compiled (inductor's fused kernels' bytes), "
            "the others as eager")


def compiled_profile(profile, settings: TrainingSettings | None):
    """The profile as the setting runs it: under --compile each layer keeps what the profile
    recorded under compile (planner/profiler/compiled_kept.compiled_layers) and runs the passes it
    timed under compile (planner/profiler/compiled_time.timed_layers); else as given."""
    if settings is None or not settings.compile_model:
        return profile
    from planner.profiler.compiled_kept import compiled_layers
    from planner.profiler.compiled_time import timed_layers

    return timed_layers(compiled_layers(profile)[0])[0]


def _a2a_heads(profile, cp_comm: str | None, cp: int) -> list[str]:
    """--cp-comm a2a splits each rank's heads over the cp ranks: Transformer Engine asserts that cp
    divides the Q and the K/V heads (context_parallel.py 4246-4248, d0067d0d)."""
    model = profile.assumptions.get("model")
    if cp_comm != "a2a" or cp == 1 or not isinstance(model, dict):
        return []
    from planner.cost.rules import profile_tp

    tp = profile_tp(profile)
    heads, kv = model.get("num_heads", 0) // tp, max(model.get("num_kv_heads", 0) // tp, 1)
    if heads % cp or kv % cp:
        return [f"--cp-comm a2a splits each rank's {heads} Q and {kv} K/V heads over --cp {cp}, which does not divide "
                "them (Transformer Engine refuses it); use --cp-comm p2p or allgather"]
    return []


def profile_cp(profile) -> int:
    """The context-parallel degree an analytic profile was made at (1 where none is recorded)."""
    cp = profile.assumptions.get("cp", 1)
    return cp if isinstance(cp, int) and not isinstance(cp, bool) and cp >= 1 else 1


def context_parallel(profile, given: int | None) -> int:
    """--cp as the profile allows it: the profile's degree where not given; a degree the profile was
    not made at is refused in one sentence (its tokens per rank and attention exchange are the
    profile's), and so is any on a profile that records none (fake and measured profiles run the
    model file's whole sequence on one device)."""
    made_at = profile_cp(profile)
    if given is None or given == made_at:
        return made_at
    if profile.source != "analytic":
        raise UserError(f"--cp {given} needs a profile whose sequence is split over {given} ranks, and a {profile.source} "
                        "profile runs the model file's whole sequence on one device: profile the architecture with "
                        f"`ckplan profile --arch NAME --cp {given}` (or --hf-config), or drop --cp")
    raise UserError(f"--cp {given}: this profile was made at context parallelism {made_at}, so its tokens per rank and "
                    f"attention exchange are those of --cp {made_at}; profile again with --cp {given}, or give --cp "
                    f"{made_at}")


def with_context_parallel(data_parallel, cp: int, *, say=None):
    """The data-parallel group as the parameters see it under context parallelism: the cp ranks of
    a replica hold the same weights and reduce their gradients together, and ZeRO shards over them
    (Megatron-LM reduces and shards over its `dp_cp` group, megatron/core/process_groups_config.py
    261-275, 371-377 at d98e8a64; torchtitan's FSDP over dp_shard x cp, torchtitan/distributed/
    parallel_dims.py 281 at b5bcd76c): dp and the shard group times cp. Unchanged at cp 1."""
    import dataclasses

    if cp == 1:
        return data_parallel
    shard = data_parallel.shard_group and data_parallel.shard_group * cp
    if say is not None:
        say(f"--cp {cp}: the weights' {data_parallel.dp * cp} replicas are --dp {data_parallel.dp} x --cp {cp} (their "
            "gradients reduced and ZeRO-sharded over both, as Megatron-LM's distributed optimizer and torchtitan's "
            "dp_shard_cp mesh do); each rank holds seq_len / cp tokens of the profile's sequence")
    return dataclasses.replace(data_parallel, dp=data_parallel.dp * cp, shard_group=shard)


def offload_copies_default(data_parallel, runtime: str, version: str | None, *, say=None):
    """--offload-copies as the runtime's code runs the offloaded step where the user gave none: serial at the ZeRO
    stages the record's offload_step_serial_zero names (DeepSpeed v0.6.2's ZeRO 3, a sub-group's CPU Adam then its
    fp16 copy, one sub-group at a time), overlapped chunks elsewhere (ckplan's own, and every record not read)."""
    import dataclasses

    from planner.cost import runtimes

    if data_parallel.offload_copies is not None:
        return data_parallel
    record = runtimes.facts(runtime, version)
    serial = data_parallel.offload_optimizer and data_parallel.zero in record.offload_step_serial_zero
    if serial and say is not None:
        say(f"--offload-copies serial: {record.name}'s ZeRO {data_parallel.zero} steps each sub-group "
            "on the host, then copies its weights back, one sub-group after another (the record's "
            "offload_step_serial_zero, docs/framework-facts.md §292); give --offload-copies overlapped to score them "
            "overlapped")
    return dataclasses.replace(data_parallel, offload_copies="serial" if serial else "overlapped")


def op_sac_layers(profile) -> set[str]:
    """The layers that offer torchtitan's op-level policy (op-sac); a profile with none is refused
    in one sentence (--op-level-sac would change nothing)."""
    from planner.profiler.opsac import OPTION_OP_SAC

    offered = {layer.name for layer in profile.layers
               if any(option.name == OPTION_OP_SAC for option in layer.recompute_options)}
    if not offered:
        raise UserError("--op-level-sac needs a profile whose blocks offer torchtitan's op-level policy (op-sac): "
                        "an analytic LLaMA-style profile with flash attention, made by `ckplan profile --arch`")
    return offered


def op_sac_stages(stages, profile):
    """--op-level-sac: a hand plan's checkpointed layers run torchtitan's op-level policy where the
    profile offers it (`op-sac`, planner/profiler/opsac.py), whole-layer checkpointing elsewhere.
    A profile whose layers offer none of it is refused in one sentence."""
    from planner.profiler.opsac import OPTION_OP_SAC
    from planner.schema import OPTION_FULL, StagePlan

    offered = op_sac_layers(profile)
    out = []
    for stage in stages:
        recompute = {name: OPTION_OP_SAC if name in offered else OPTION_FULL for name in stage.checkpointed}
        out.append(StagePlan(index=stage.index, layers=list(stage.layers), recompute=recompute,
                             checkpointed=[name for name, option in recompute.items() if option == OPTION_FULL]))
    return out
