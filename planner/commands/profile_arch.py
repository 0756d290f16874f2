"""`ckplan profile --arch NAME | --arch-config config.json`: an analytic profile of a
published architecture, written without running it (planner/profiler/analytic.py)."""

from __future__ import annotations

from pathlib import Path

import click

from planner.errors import UserError

# options that only the measured profiler reads, and those only the analytic one reads
MEASURED_ONLY = ("device", "warmup", "repeats", "threads", "timeout_s")
ANALYTIC_ONLY = ("seq_len", "tp", "sp", "cp", "ep", "attention", "attention_kernel", "gpu", "mfu", "capacity_factor",
                 "compiled", "optimizer_impl", "fused_softmax")


DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def dtype_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """--dtype takes torch's names or the short ones (bf16, fp16, fp32)."""
    return DTYPE_ALIASES.get(value, value)


def options(command):
    """The analytic profiler's options, added to `ckplan profile`."""
    from planner.models.archs import ARCHS, GPUS
    from planner.models.attention_kernels import FLASH2, KERNEL_HELP, KERNELS
    from planner.models.optimizer_impls import FUSED, IMPL_HELP, IMPLS

    decorators = [
        click.option("--arch", default=None, metavar="NAME",
                     help=f"Profile a published architecture without running it, instead of measuring "
                          f"MODEL.py: {', '.join(ARCHS)}."),
        click.option("--arch-config", type=click.Path(path_type=Path), default=None,
                     help="Like --arch, from a Hugging Face-style config.json (llama, mistral, qwen2, qwen3, gemma, "
                          "gemma3_text, gemma3 (its text model), smollm3, mixtral, qwen2_moe, qwen3_moe, "
                          "deepseek_v2, deepseek_v3, gpt2, opt, starcoder2)."),
        click.option("--seq-len", type=click.IntRange(min=1), default=None,
                     help="With --arch (required) or --hf-config (default 256): tokens per sequence."),
        click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True,
                     help="With --arch: tensor-parallel degree; the profile is per device."),
        click.option("--sp", is_flag=True, help="With --arch: sequence parallelism (needs --tp 2 or more)."),
        click.option("--cp", type=click.IntRange(min=1), default=1, show_default=True,
                     help="With --arch: context-parallel degree; each device holds --seq-len / cp tokens of every "
                          "sequence (2 x cp load-balanced chunks), its attention exchanging K/V with the others."),
        click.option("--ep", type=click.IntRange(min=1), default=1, show_default=True,
                     help="With a mixture-of-experts --arch: the expert-parallel degree the job runs; each rank's "
                          "experts / ep experts are timed as one grouped GEMM over ep x their tokens (Megatron-LM's "
                          "and torchtitan's dispatch), which `ckplan solve --ep` needs to match."),
        click.option("--attention", type=click.Choice(["flash", "eager"]), default="flash", show_default=True,
                     help="With --arch: flash keeps no s² attention scores, eager keeps them."),
        click.option("--fused-softmax", is_flag=True, default=False,
                     help="With --arch and --attention eager: the scores' causal softmax as Megatron's "
                          "FusedScaleMaskSoftmax runs it (one kernel, then torch's dropout: 8 B a score forward, 9 "
                          "backward) in place of Hugging Face's op-by-op softmax (20 and 30); Megatron-LM's and "
                          "Megatron-DeepSpeed's default (--masked-softmax-fusion) up to 2,048 keys."),
        click.option("--attention-kernel", type=click.Choice(KERNELS), default=FLASH2, show_default=True,
                     help="With --arch and flash attention: the flash kernel the job ran, timed at its published "
                          "rate on the --gpu; " + "; ".join(f"{name}: {text}" for name, text in KERNEL_HELP.items())
                          + ". Where none is published for the --gpu, its FlashAttention-2 figures are charged and "
                            "the profile says so."),
        click.option("--optimizer-impl", type=click.Choice(IMPLS), default=FUSED, show_default=True,
                     help="With --arch: the kernels the job's Adam step runs, timed per layer; "
                          + "; ".join(f"{name}: {text}" for name, text in IMPL_HELP.items()) + "."),
        click.option("--gpu", default="h100-sxm", show_default=True,
                     help=f"With --arch or --fake: the device whose peak sets the times and whose memory becomes "
                          f"`ckplan solve`'s default --mem: {', '.join(GPUS)} (h100 = h100-sxm)."),
        click.option("--mfu", type=click.FloatRange(min=0, max=1, min_open=True), default=None,
                     help="With --arch: override the roofline times with FLOPs at the peak x this model FLOPs "
                          "utilisation. Not given (the default), times are the roofline and the MFU they imply "
                          "is printed."),
        click.option("--capacity-factor", type=click.FloatRange(min=0, min_open=True), default=1.0,
                     show_default=True,
                     help="With a mixture-of-experts --arch: tokens each expert holds = factor x tokens x top-k / "
                          "experts, every expert charged at that capacity (memory and FLOPs). 1 is perfect balance, "
                          "the mean; the worst case, every token routed to one expert, is experts / top-k "
                          "(4 for Mixtral's 8 experts, top 2)."),
        click.option("--compiled", is_flag=True,
                     help="With --arch or --fake: also record each layer's kept bytes under torch.compile "
                          "(AOTAutograd's partition; --arch: dense LLaMA-style blocks with flash attention, no TP, "
                          "and torchtitan's op-level SAC; --fake: no recompute and whole-layer checkpoint), which "
                          "`--compile` charges; --arch also its passes' and the loss's times (inductor's fused "
                          "kernels), which `--compile` times them by."),
    ]
    for decorator in reversed(decorators):
        command = decorator(command)
    return command


def dispatch(model_file: str | None, *, dtype: str, micro_batch_size: int, out: Path | None, fake: bool = False,
             **arch_options) -> bool:
    """Write an analytic profile when --arch/--arch-config is given (True), else leave
    MODEL.py to the measured profiler (False). --dtype defaults to bfloat16 here."""
    ctx = click.get_current_context()
    check_mixing(ctx, model_file, arch_options, fake=fake)
    if not wanted(arch_options):
        return False
    if ctx.get_parameter_source("dtype") == click.core.ParameterSource.DEFAULT:
        dtype = "bfloat16"
    run(dtype=dtype, micro_batch_size=micro_batch_size, out=out, **arch_options)
    return True


def wanted(arch_options: dict) -> bool:
    return bool(arch_options.get("arch") or arch_options.get("arch_config"))


def check_mixing(ctx: click.Context, model_file: str | None, arch_options: dict, hf_config: str | None = None,
                 *, fake: bool = False) -> None:
    """MODEL.py, --hf-config or --arch/--arch-config, each with only the options it reads
    (--hf-config is measured, at --seq-len; --fake runs the code for a --gpu, timing nothing)."""
    given = [name for name in ctx.params if ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT]
    if fake:
        if wanted(arch_options):
            raise UserError("--fake runs a model's own code: give MODEL.py or --hf-config (an --arch profile is "
                            "computed from formulas, not run)")
        timed = [name for name in given if name in ("warmup", "repeats", "threads")]
        if timed:
            raise UserError(f"{_flag(ctx, timed[0])} sets how a measured profile times the layers; a --fake profile "
                            "times nothing (its times are rooflines): drop it")
    allowed = ("seq_len", "gpu", "compiled") if fake else ("seq_len",)
    if hf_config is not None:
        if model_file is not None or wanted(arch_options):
            raise UserError("give one model: MODEL.py, --hf-config or --arch/--arch-config")
        stray = [name for name in given if name in ANALYTIC_ONLY and name not in allowed]
        if stray:
            raise UserError(f"{_flag(ctx, stray[0])} applies to --arch/--arch-config profiles only; drop it")
        return
    if arch_options.get("arch") and arch_options.get("arch_config"):
        raise UserError("give --arch or --arch-config, not both")
    if wanted(arch_options):
        if model_file is not None:
            raise UserError(f"give MODEL.py ({model_file}) or --arch/--arch-config, not both")
        stray = [name for name in given if name in MEASURED_ONLY]
        if stray:
            raise UserError(f"{_flag(ctx, stray[0])} applies to measuring MODEL.py, not to an analytic "
                            "--arch profile; drop it")
        return
    if model_file is None:
        raise UserError("give MODEL.py to measure, --hf-config config.json to measure a Hugging Face model, or "
                        "--arch NAME / --arch-config config.json to profile a published architecture")
    stray = [name for name in given if name in ANALYTIC_ONLY and name not in allowed[1:]]
    if stray:
        raise UserError(f"{_flag(ctx, stray[0])} applies to --arch/--arch-config profiles only; drop it")


def _flag(ctx: click.Context, name: str) -> str:
    return next(param.opts[0] for param in ctx.command.params if param.name == name)


def run(*, dtype: str, micro_batch_size: int, out: Path | None, arch: str | None, arch_config: Path | None,
        seq_len: int | None, tp: int, sp: bool, attention: str, gpu: str, mfu: float | None,
        capacity_factor: float = 1.0, compiled: bool = False, cp: int = 1, ep: int = 1,
        attention_kernel: str = "flash2", optimizer_impl: str = "fused", fused_softmax: bool = False) -> None:
    from pydantic import ValidationError

    from planner import io
    from planner.console import warn
    from planner.models import archs
    from planner.profiler.analytic import Shape, analytic_profile

    if seq_len is None:
        raise UserError("an --arch/--arch-config profile needs --seq-len (tokens per sequence)")
    if dtype == "float32":
        raise UserError("--dtype float32 with --arch: the GPU table holds 16-bit tensor-core peaks only; "
                        "use --dtype bf16 or fp16")
    spec, model_ref = _arch(arch, arch_config)
    check_ep(spec, ep)
    device, kernel_unmodelled = _kernel_device(archs.gpu(gpu), attention, attention_kernel, mfu)
    _check_kernel_window(spec, attention_kernel, seq_len)
    check_arch_shape(spec, seq_len, say=warn)
    if fused_softmax:
        check_fused_softmax(spec, attention=attention, seq_len=seq_len, micro_batch_size=micro_batch_size, tp=tp,
                            cp=cp)
    shape = Shape(seq_len=seq_len, micro_batch_size=micro_batch_size, tp=tp, sp=sp, attention=attention,
                  dtype=dtype, capacity_factor=capacity_factor, cp=cp, ep=ep, fused_softmax=fused_softmax)
    try:
        profile = analytic_profile(spec, shape, gpu=device, mfu=mfu, model=model_ref, compiled=compiled)
    except ValidationError as exc:  # e.g. a layer's bytes past an exbibyte: no device holds that
        raise UserError(f"{spec.name} at --seq-len {seq_len} and --micro-batch-size {micro_batch_size} gives "
                        f"numbers no device holds ({io.describe_error(exc)}); check --seq-len, "
                        "--micro-batch-size and the config's sizes") from exc
    profile = _with_optimizer_impl(_with_host_step(_with_model_facts(profile, spec, dtype)), optimizer_impl, device)
    profile = profile.model_copy(update={"assumptions": profile.assumptions | {
        "attention_kernel": attention_kernel, **({"fused_softmax": True} if fused_softmax else {}),
        **({"attention_kernel_not_modelled": kernel_unmodelled}
                                                 if kernel_unmodelled else {})}})
    if kernel_unmodelled:
        from planner.console import warn

        warn(kernel_unmodelled)
    if compiled and not any(layer.compiled_kept_bytes for layer in profile.layers):
        from planner.console import warn

        warn(f"--compiled: no block of {spec.name} got compiled figures (the formula is checked on dense "
             "LLaMA-style blocks with flash attention at --tp 1 only; planner/profiler/compiled_kept.py): "
             "--compile will charge these layers as eager")
    elif compiled and not any(layer.compiled_time for layer in profile.layers):
        from planner.console import warn

        warn(f"--compiled: no block of {spec.name} got compiled times (--mfu times FLOPs alone, and inductor's fused "
             "kernels are checked where Q is as wide as hidden; planner/profiler/compiled_time.py): --compile will "
             "time these layers as eager")
    out = out or Path("profiles") / f"{profile.name}-{device.name}.json"
    io.check_writable(out)
    io.save_profile(profile, out)
    _report(profile, spec, shape, out)


def check_fused_softmax(spec, *, attention: str, seq_len: int, micro_batch_size: int, tp: int, cp: int) -> None:
    """--fused-softmax where Megatron's fused causal kernel runs (Megatron-DeepSpeed 62bc4562
    megatron/model/fused_softmax.py FusedScaleMaskSoftmax.forward: 16 < sk <= 2048, sq % 4 == 0, b x np % 4 == 0,
    a causal mask over the whole sequence); elsewhere Megatron runs its unfused fp32 path, which the option does
    not model: one sentence and a refusal."""
    if attention != "eager":
        raise UserError("--fused-softmax is eager attention's softmax kernel: give --attention eager (flash "
                        "attention has no separate softmax)")
    if spec.sliding_window or spec.mla or spec.attention_sinks or cp > 1:
        raise UserError(f"--fused-softmax models Megatron's causal kernel over the whole sequence; {spec.name}'s "
                        "attention (a sliding window, latent attention, sinks or context parallelism) is not that")
    heads = spec.num_heads // tp
    if not 16 < seq_len <= 2048 or seq_len % 4 or (micro_batch_size * heads) % 4:
        raise UserError(f"--fused-softmax: Megatron's fused kernel needs 16 < --seq-len <= 2048, --seq-len a "
                        f"multiple of 4 and micro-batch x heads/tp a multiple of 4 (here {seq_len} and "
                        f"{micro_batch_size} x {heads}); outside that Megatron runs its unfused softmax: drop the flag")


def check_ep(spec, ep: int) -> None:
    """--ep where the model has routed experts that it divides, in one sentence otherwise."""
    if ep == 1:
        return
    if not spec.num_experts:
        raise UserError(f"--ep {ep} times routed experts as expert parallelism runs them; {spec.name} has none: "
                        "drop --ep")
    if spec.num_experts % ep:
        fits = ", ".join(str(k) for k in range(2, spec.num_experts + 1) if spec.num_experts % k == 0)
        raise UserError(f"--ep {ep} does not divide {spec.name}'s {spec.num_experts} routed experts; every "
                        f"expert-parallel rank holds the same number of them (one of {fits})")


# What `ckplan solve` plans unless told (--precision): fp32 weights, gradients and Adam state.
# An LLM at 16 bits trains as bf16-mixed (16-bit weights and activations, fp32 master and Adam).
SOLVE_DEFAULT_PRECISION = "fp32"
LLM_PRECISION = "bf16-mixed"


def _kernel_device(device, attention: str, kernel: str, mfu: float | None = None):
    """The --gpu as the job's flash kernel runs attention on it (planner/models/attention_kernels.py), and what
    was not modelled ('' when all was). Under --mfu no kernel's rate is read (every FLOP at the one rate:
    analytic_time.times_ms), so another kernel than the default is refused there rather than recorded unused."""
    from planner.models.attention_kernels import FLASH2, kernel_gpu

    if kernel != FLASH2 and attention != "flash":
        raise UserError(f"--attention-kernel {kernel} names a flash kernel, and --attention {attention} runs none; "
                        "drop one")
    if kernel != FLASH2 and mfu is not None:
        raise UserError(f"--attention-kernel {kernel} sets the attention's rate in the roofline, and --mfu {mfu:g} "
                        "times every FLOP at one rate, reading no kernel's; drop one")
    return kernel_gpu(device, kernel)


def _check_kernel_window(spec, kernel: str, seq_len: int) -> None:
    """FlashAttention (1) runs no sliding window: flash-attn 1.0.9's CUDA interface takes none (flash_attn_unpadded_func:
    causal only) and its Triton port masks by an attention bias over every causal block; flash-attn added local
    attention in 2.3 (docs/framework-facts.md §431). A window shorter than the sequence, whose FLOPs the profile
    would count windowed, with --attention-kernel flash1: refused in one sentence."""
    from planner.models.attention_kernels import FLASH1

    windows = [w for w in (spec.sliding_window, *spec.layer_windows) if w]
    if kernel == FLASH1 and windows and min(windows) < seq_len:
        raise UserError(f"--attention-kernel flash1: FlashAttention (1) runs no sliding window (flash-attn added local "
                        f"attention in 2.3), and {spec.name} attends within {min(windows)} tokens of --seq-len "
                        f"{seq_len}; drop --attention-kernel, or give a model without the window")


def check_arch_shape(spec, seq_len: int, *, say) -> None:
    """What `profile` and `search` both say of a config at a sequence length: a learned position table shorter than
    the sequence refused (GPT-2's wpe, OPT's: a token past the table's last row has no embedding to look up, so the
    model does not run; Megatron-LM asserts the same, §681), a rotary model past its max_position_embeddings said,
    and the multi-token-prediction modules a config describes and the profile leaves out."""
    table = spec.max_position_embeddings
    if table and seq_len > table and not spec.rotates:
        raise UserError(f"--seq-len {seq_len} exceeds {spec.name}'s learned position table of {table} rows (its "
                        f"max_position_embeddings): the model looks up one position embedding a token and has none "
                        f"past row {table}, so it does not run at this length; give --seq-len {table} or less")
    if table and seq_len > table:
        say(f"--seq-len {seq_len} exceeds {spec.name}'s max_position_embeddings {table} (rotary positions: it runs, "
            "at lengths it was not trained to)")
    if spec.num_mtp_layers:
        say(f"{spec.name}'s {spec.num_mtp_layers} multi-token-prediction module(s) are not planned: the profile is "
            "the main model's")


def _with_model_facts(profile, spec, dtype: str):
    """The profile with the model's positions and norms beside its dimensions (what an export
    needs to reproduce the model), and the training precision an LLM at this dtype expects."""
    model = dict(profile.assumptions.get("model") or {}) | spec.facts()
    facts = {"model": model}
    if dtype in ("bfloat16", "float16"):
        facts["training_precision"] = LLM_PRECISION
    return profile.model_copy(update={"assumptions": profile.assumptions | facts})


def _with_optimizer_impl(profile, impl: str, gpu):
    """Each layer's Adam step as the job's optimizer runs it (planner/models/optimizer_impls.py), recorded in the
    profile's assumptions; the fused step the analytic profile times is kept for `fused` (and for SGD)."""
    from planner.models import optimizer_impls

    if impl == optimizer_impls.FUSED:
        return profile
    layers = [layer.model_copy(update={"step_ms": layer.step_ms | {
        "adam": optimizer_impls.adam_step_ms(impl, layer.param_count, gpu)}}) for layer in profile.layers]
    return profile.model_copy(update={"layers": layers, "assumptions": profile.assumptions | {
        "optimizer_impl": impl, "optimizer_impl_source": optimizer_impls.DECOUPLED_ADAMW_SOURCE,
        "optimizer_step": f"Adam: {impl}, {optimizer_impls.DECOUPLED_ADAMW_BYTES} bytes per parameter / the eager "
                          "elementwise rate; SGD: 20 bytes per parameter / HBM bandwidth"}})


def _with_host_step(profile):
    """The host's optimizer step an offloaded optimizer takes: Adam at the published server
    figure (archs.HOST_ADAM_NS_PER_PARAM, not this machine's CPU, which trains nothing), SGD
    at the ratio of the two timed on this machine."""
    from planner.models.archs import HOST_ADAM_NS_PER_PARAM, HOST_ADAM_SOURCE
    from planner.profiler.measure import host_step_ns_per_param

    here = host_step_ns_per_param()
    # adam exactly the published figure (x ns / ns need not round back to it)
    published = {name: HOST_ADAM_NS_PER_PARAM if name == "adam" else HOST_ADAM_NS_PER_PARAM * ns / here["adam"]
                 for name, ns in here.items()}
    assumptions = profile.assumptions | {
        "host_step": f"{HOST_ADAM_SOURCE}; other optimizers at their ratio to adam timed on the machine that "
                     "wrote this profile"}
    return profile.model_copy(update={"host_step_ns_per_param": published, "assumptions": assumptions})


def _arch(arch: str | None, arch_config: Path | None, flag: str = "--arch-config"):
    """The architecture, and what the profile is pinned to: the built-in's canonical
    dimensions, or the config file's content; `flag` is the option the user gave the file by."""
    from planner import io
    from planner.models import archconfig, archs
    from planner.schema import FileRef

    if arch is not None:
        spec = archs.arch(arch)
        return spec, FileRef(file=f"arch:{spec.name}", sha256=spec.sha256())
    config = io.load_json(arch_config, flag, "pass a model's config.json")
    name = arch_config.parent.name if arch_config.name == "config.json" and arch_config.parent.name else arch_config.stem
    spec = archconfig.from_hf_config(config, where=str(arch_config), name=name)
    if spec.left_out:  # a multimodal config (Gemma 3's): what is planned is said, never silently narrowed
        from planner.console import warn

        warn(f"{arch_config}: {spec.left_out}")
    return spec, io.file_ref(arch_config)


def _report(profile, spec, shape, out: Path) -> None:
    from planner.console import console, info, table
    from planner.profiler.analytic import active_params, total_params
    from planner.units import format_bytes

    rows = [[_span(same), same[0].kind, f"× {len(same)}", f"{same[0].fwd_ms:.3f}", f"{same[0].bwd_ms:.3f}",
             format_bytes(same[0].act_bytes), format_bytes(same[0].input_bytes), f"{same[0].param_count:,}"]
            for same in _runs(profile.layers)]
    facts = profile.assumptions
    timing = f"at MFU {facts['mfu']:g} (--mfu)" if facts["mfu"] is not None else "roofline"
    title = (f"{profile.name}: analytic, per {facts['gpu']} {timing}, {profile.dtype}, "
             f"{facts['attention']} attention")
    console.print(table(title, ["layer", "kind", "count", "fwd ms", "bwd ms", "kept", "input", "params/device"],
                        rows, right_from=2))
    params = sum(layer.param_count for layer in profile.layers)
    params -= sum((len(item.layers) - 1) * item.param_count for item in profile.tied)  # a tied table held once
    kept = sum(layer.act_bytes for layer in profile.layers)
    info(f"per device: {params:,} parameters, {format_bytes(kept)} of activations kept per microbatch without "
         f"checkpointing; loss keeps {format_bytes(profile.loss_bytes)} (fp32 softmax over the logits)")
    if spec.num_experts:
        info(f"{spec.name}: {total_params(spec):,} parameters, {active_params(spec):,} active per token; each expert "
             f"charged {facts['expert_tokens']:,} tokens per microbatch at --capacity-factor "
             f"{facts['capacity_factor']:g} (worst case {spec.num_experts / spec.num_experts_per_tok:g}); "
             f"{_expert_gemms(spec, shape)}")
    info(f"{_timing(facts)}; "
         f"`ckplan solve` defaults --mem to {format_bytes(facts['gpu_usable_bytes'])}, what a process can "
         f"allocate on the {facts['gpu']}")
    if facts.get("optimizer_impl"):
        info(f"optimizer step: {facts['optimizer_step']} ({facts['optimizer_impl_source']})")
    if facts.get("training_precision") == LLM_PRECISION:
        info(f"precision: `ckplan solve` plans fp32 weights, gradients and Adam state unless told; a {profile.dtype} "
             f"LLM trains as {LLM_PRECISION}: pass --precision {LLM_PRECISION} to solve (or --precision fp32 to plan "
             "fp32 on purpose)")
    info(f"wrote {out}")


def _expert_gemms(spec, shape) -> str:
    """How the experts' GEMMs are timed: at the profile's expert parallelism, and what `solve --ep` takes."""
    from planner.profiler.formulas import expert_gemm_shape

    local, rows = expert_gemm_shape(spec, shape)
    if shape.ep == 1:
        return (f"the experts timed as one device runs them all ({local} GEMM{'s' if local > 1 else ''} of {rows:,} rows); for a job with "
                "expert parallelism E profile with --ep E (`ckplan solve --ep E` refuses this profile)")
    return (f"the experts timed as an --ep {shape.ep} rank runs them ({local} GEMM{'s' if local > 1 else ''} of {rows:,} rows); "
            f"`ckplan solve` takes this profile with --ep {shape.ep} only")


def _membound(facts: dict) -> str:
    measured = facts.get("membound_tbps")
    if not measured:  # a profile written before the measured rates
        return f"{facts['gpu_hbm_tbps']:g} TB/s"
    by_class = measured.get("by_class")
    eager = f"{measured['eager']:.2f} TB/s eager"
    if by_class:  # each op class at its own measured rate (planner/profiler/membound.py)
        eager = "eager by op class " + ", ".join(f"{name} {tbps:.2f}" for name, tbps in by_class.items()) + " TB/s"
    return (f"{eager}, {measured['fused']:.2f} fused: the rates measured of the "
            f"{facts['gpu_hbm_tbps']:g} TB/s datasheet")


def _timing(facts: dict) -> str:
    if facts["mfu"] is not None:
        return f"times assume {facts['gpu_bf16_tflops']:g} TFLOP/s × MFU {facts['mfu']:g} (--mfu)"
    kernel = ("FlashAttention (1)'s" if facts.get("attention_kernel") == "flash1"
              and not facts.get("attention_kernel_not_modelled") else "FlashAttention-2's")
    return (f"times are rooflines (matmuls at their size's published efficiency, attention at {kernel}, "
            f"memory-bound bytes at {_membound(facts)}): they imply MFU {facts['mfu_implied']:.3f} "
            f"of {facts['gpu_bf16_tflops']:g} TFLOP/s over the layers' forward and backward")


def _runs(layers: list) -> list[list]:
    """Consecutive layers of one kind (a MoE model's dense blocks apart from its MoE blocks)."""
    runs: list[list] = []
    for layer in layers:
        if runs and runs[-1][0].kind == layer.kind:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return runs


def _span(same: list) -> str:
    return same[0].name if len(same) == 1 else f"{same[0].name} … {same[-1].name}"
