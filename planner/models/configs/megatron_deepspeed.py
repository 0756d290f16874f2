"""A Megatron-DeepSpeed launch script (`--deepspeed --deepspeed_config FILE`) read for DeepSpeed's engine: the
ds_config the script writes (a here-document, kept as text by bashargs, never run) or the JSON file beside it,
its ZeRO stage, offload, precision, batch and stage3 knobs taken into the job, and every other key listed.

Sources: Megatron-DeepSpeed 62bc4562 (megatron/arguments.py 418-425, 829-876: --checkpoint-activations,
--zero-stage, --deepspeed-activation-checkpointing, --checkpoint-in-cpu; megatron/training.py 412-419:
deepspeed.initialize(args=args), the engine reading args.deepspeed_config; pretrain_gpt.py 46-49: the model built
under deepspeed.zero.Init where --zero-stage is 3); DeepSpeed v0.6.2 (deepspeed/runtime/config.py 980-1002
_batch_assertion: train_batch_size = micro batch x gradient accumulation x data-parallel ranks; zero/config.py
reading known keys only, so a misspelt key leaves DeepSpeed's default) and edaa7221 (config_utils.py 110: pydantic
with extra keys forbidden). docs/published-runs.md §27.dsllama, framework-facts §111."""

from __future__ import annotations

import json
from pathlib import Path

from planner.errors import UserError
from planner.models.configs import Job, Recompute
from planner.models.configs.megatron_args import Flags

KNOBS = ("stage3_max_reuse_distance", "stage3_prefetch_bucket_size", "stage3_max_live_parameters")
# ds_config keys that change neither memory nor time (logging, loss scaling, checkpoint saving)
NO_EFFECT = {
    "steps_per_print": "logging", "wall_clock_breakdown": "logging (timers)", "gradient_clipping": "clipping threshold",
    "zero_allow_untested_optimizer": "a check at start", "tensorboard": "logging", "wandb": "logging",
    "csv_monitor": "logging", "flops_profiler": "profiling", "comms_logger": "logging", "dump_state": "logging",
    "memory_breakdown": "logging", "zero_force_ds_cpu_optimizer": "a check at start",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save": "checkpoint saving",
    "zero_optimization.stage3_gather_fp16_weights_on_model_save": "checkpoint saving",
    "zero_optimization.elastic_checkpoint": "checkpoint saving", "zero_optimization.ignore_unused_parameters": "a check",
    "aio": "NVMe offload's I/O (no NVMe offload here)",
    "activation_checkpointing": "Megatron-DeepSpeed configures DeepSpeed's checkpointing from its flags "
    "(--checkpoint-in-cpu, --partition-activations, ...) and passes no deepspeed_config (initialize.py 170-177 at "
    "62bc4562), and the engine never reads this block (DeepSpeed v0.6.2): give the flags",
}
# keys DeepSpeed reads that change memory or time and ckplan does not model
NOT_MODELLED = {
    "zero_optimization.allgather_bucket_size": "ZeRO 1/2's all-gather bucket",
    "zero_optimization.contiguous_gradients": "the gradients copied into one flat buffer as they are reduced (ckplan "
    "charges ZeRO 3's buffer as DeepSpeed's default, on)",
    "zero_optimization.sub_group_size": "the optimizer step's parameter groups (its fp32 scratch)",
    "zero_optimization.reduce_scatter": "reduce-scatter rather than all-reduce (ZeRO 1/2)",
    "zero_optimization.allgather_partitions": "ZeRO 1/2's all-gather of the updated partitions",
    "zero_optimization.round_robin_gradients": "gradient partitioning order under offload",
    "zero_optimization.stage3_param_persistence_threshold": "parameters kept whole (ckplan takes DeepSpeed's 1e5)",
    "zero_optimization.offload_optimizer.pin_memory": "pinned host buffers", "zero_optimization.offload_optimizer."
    "buffer_count": "NVMe buffers", "zero_optimization.offload_optimizer.pipeline_read": "NVMe reads",
    "zero_optimization.offload_optimizer.pipeline_write": "NVMe writes",
    "zero_optimization.offload_optimizer.fast_init": "NVMe init", "zero_optimization.offload_optimizer.ratio":
    "a share of the optimizer on the host",
    "communication_data_type": "the reductions' dtype", "prescale_gradients": "scaling before the reduction",
    "gradient_predivide_factor": "scaling before the reduction", "optimizer": "DeepSpeed's own optimizer (the script "
    "hands Megatron's to deepspeed.initialize)", "scheduler": "learning-rate schedule",
}
ZERO_KEYS = {"stage", *KNOBS, "reduce_bucket_size", "offload_optimizer", "offload_param", "overlap_comm", "cpu_offload"}


def megatron_lm_flags(pairs: list[tuple[str, list[str]]]) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """Megatron-DeepSpeed's model flags as Megatron-LM's (the reader's): --num-key-value-heads N as
    --group-query-attention --num-query-groups N, --use-rotary-position-embeddings as --position-embedding-type rope
    (Megatron-DeepSpeed 73029edf megatron/arguments.py 314-317, 622-642: rotary drops the learned table), and
    --no-query-key-layer-scaling, a scalar, with no effect. Returns (the pairs, a note per flag translated)."""
    out, notes = [], []
    for flag, values in pairs:
        if flag == "--num-key-value-heads":
            out += [("--group-query-attention", []), ("--num-query-groups", values)]
            notes.append(f"--num-key-value-heads {' '.join(values)} (Megatron-DeepSpeed's): read as "
                         f"--group-query-attention --num-query-groups {' '.join(values)}")
        elif flag == "--use-rotary-position-embeddings":
            out.append(("--position-embedding-type", ["rope"]))
            notes.append("--use-rotary-position-embeddings (Megatron-DeepSpeed's): read as --position-embedding-type "
                         "rope, no learned position table")
        elif flag != "--no-query-key-layer-scaling":
            out.append((flag, values))
        else:
            notes.append("--no-query-key-layer-scaling (Megatron-DeepSpeed's): the attention scores' scale, no effect")
    return out, notes


def read_deepspeed(flags: Flags, job: Job, files: dict[str, str], where: str) -> None:
    """Score the job under DeepSpeed's engine (job.runtime "deepspeed") with its ds_config's settings, each key
    said; one sentence where the ds_config and the flags contradict each other."""
    flags.take("--deepspeed", "DeepSpeed's engine: scored under --runtime deepspeed", bool)
    name = flags.take("--deepspeed_config", "the ds_config, read (as text, never run)", str)
    if name is None:
        raise UserError(f"{where}: --deepspeed without --deepspeed_config; DeepSpeed needs its config: give the file")
    config = _config(name, files, where)
    zero = config.get("zero_optimization", {}) or {}
    stage = _int(zero.get("stage", 0), "zero_optimization.stage", where)
    flag_stage = flags.take("--zero-stage", "checked against the ds_config's stage (zero.Init at 3)", int)
    if flag_stage is not None and flag_stage != stage:
        raise UserError(f"{where}: --zero-stage {flag_stage} and the ds_config's zero_optimization.stage {stage} "
                        "differ (Megatron-DeepSpeed builds the model under zero.Init for --zero-stage 3, the engine "
                        "runs the ds_config's stage); give the same stage")
    ddp_flags = [flag for flag, value, *_ in flags.sink if value != "false" and flag.startswith(
        ("--overlap-grad-reduce", "--overlap-param-gather", "--align-", "--ddp-", "--bucket-size"))]
    if ddp_flags:
        raise UserError(f"{where}: {ddp_flags[0]} is Megatron-LM's DDP setting, and under --deepspeed DeepSpeed's "
                        "engine reduces the gradients (the ds_config's overlap_comm); drop it")
    if job.zero:
        job.notes.append(f"--use-distributed-optimizer / Megatron FSDP (ZeRO {job.zero}) give way to DeepSpeed's "
                         f"engine: scored at the ds_config's ZeRO {stage}")
    job.modelled.ddp.clear()  # Megatron-LM's DDP does not run: DeepSpeed's engine reduces
    job.runtime, job.zero = "deepspeed", stage
    job.said("ds_config zero_optimization.stage", stage, "modelled", "ZeRO stage (--zero)")
    _precision(flags, job, config, where)
    _batch(flags, job, config, where)
    _offload(job, zero, stage, where)
    _knobs(job, zero, stage, where)
    _recompute(flags, job)
    _attention(flags, job)
    _rest(job, config, zero)
    job.notes.append(f"runtime: DeepSpeed's engine (--deepspeed), scored under --runtime deepspeed with ZeRO {stage} "
                     "from the ds_config; the Megatron-DeepSpeed model's flags read as Megatron-LM's")


def _config(name: str, files: dict[str, str], where: str) -> dict:
    """The ds_config: the here-document the script writes to `name`, else the JSON file of that name beside it."""
    text = files.get(name)
    if text is None:
        beside = Path(where).parent / name
        if not beside.is_file():
            raise UserError(f"{where}: --deepspeed_config {name} is neither written by the script (cat <<EOT > "
                            f"{name}) nor a file beside it; put the ds_config beside the script")
        text = beside.read_text()
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where}: the ds_config {name} is not JSON ({exc.msg}, line {exc.lineno}); give the "
                        "config DeepSpeed reads") from None
    if not isinstance(config, dict):
        raise UserError(f"{where}: the ds_config {name} is not a JSON object; give the config DeepSpeed reads")
    return config


def _int(value, key: str, where: str) -> int:
    """A count as DeepSpeed casts it (3e9 in JSON is a float; pp_int and int() take it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 0:
        raise UserError(f"{where}: the ds_config's {key} {value!r} is not a whole number; give one")
    return int(value)


def _precision(flags: Flags, job: Job, config: dict, where: str) -> None:
    """bf16 / fp16 from the ds_config (the engine's), agreeing with --bf16 / --fp16 (Megatron's model dtype)."""
    enabled = [key for key in ("fp16", "bf16") if (config.get(key) or {}).get("enabled")]
    given = {"fp16-mixed": "fp16", "bf16-mixed": "bf16"}.get(job.precision, "fp32")  # megatron._precision's
    if len(enabled) > 1 or (enabled or ["fp32"])[0] != given:
        raise UserError(f"{where}: the ds_config enables {' and '.join(enabled) or 'neither fp16 nor bf16'} and the "
                        f"flags give {given if given != 'fp32' else 'neither --fp16 nor --bf16'}; give one precision "
                        "in both")
    job.precision = {"fp16": "fp16-mixed", "bf16": "bf16-mixed"}[enabled[0]] if enabled else "fp32"
    for key in ("fp16", "bf16"):
        if key in config:
            job.said(f"ds_config {key}", json.dumps(config[key]), "modelled",
                     "16-bit weights and gradients, fp32 master weights and Adam state (fp16: fp16-mixed, DeepSpeed's "
                     "ZeRO holding bf16's bytes by its code; the loss-scale keys have no effect on them)")


def _batch(flags: Flags, job: Job, config: dict, where: str) -> None:
    """train_micro_batch_size_per_gpu = --micro-batch-size, train_batch_size = --global-batch-size, and where the
    three are given, the data-parallel ranks DeepSpeed's _batch_assertion implies (train = micro x accumulation
    x ranks)."""
    micro, train = config.get("train_micro_batch_size_per_gpu"), config.get("train_batch_size")
    accumulation = config.get("gradient_accumulation_steps")
    if micro is not None and _int(micro, "train_micro_batch_size_per_gpu", where) != job.micro_batch_size:
        raise UserError(f"{where}: the ds_config's train_micro_batch_size_per_gpu {micro} and --micro-batch-size "
                        f"{job.micro_batch_size} differ; give the same")
    if train is not None and job.global_batch_size is not None and _int(train, "train_batch_size", where) != \
            job.global_batch_size:
        raise UserError(f"{where}: the ds_config's train_batch_size {train} and --global-batch-size "
                        f"{job.global_batch_size} differ; give the same")
    if train is not None and job.global_batch_size is None:
        job.global_batch_size = _int(train, "train_batch_size", where)
    if train is not None and accumulation is not None:
        per_rank = job.micro_batch_size * _int(accumulation, "gradient_accumulation_steps", where)
        if not per_rank or _int(train, "train_batch_size", where) % per_rank:
            raise UserError(f"{where}: the ds_config's train_batch_size {train} is not train_micro_batch_size_per_gpu "
                            f"{job.micro_batch_size} x gradient_accumulation_steps {accumulation} x data-parallel ranks, "
                            "which DeepSpeed asserts; give consistent batch keys")
        job.dp_given = int(train) // per_rank
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        if key in config:
            job.said(f"ds_config {key}", config[key], "modelled", "checked against --micro-batch-size, "
                     "--global-batch-size and the data-parallel ranks (DeepSpeed's _batch_assertion)")


def _offload(job: Job, zero: dict, stage: int, where: str) -> None:
    """offload_optimizer.device cpu (or the old cpu_offload: true) puts Adam on the host; parameters on the host
    (offload_param) and NVMe are refused: ckplan does not model them."""
    device = (zero.get("offload_optimizer") or {}).get("device", "none")
    if zero.get("cpu_offload") is True:
        device = "cpu"
    if device not in ("none", "cpu"):
        raise UserError(f"{where}: the ds_config offloads the optimizer to {device!r}; ckplan models the host (cpu) "
                        "only: give cpu or none")
    param = (zero.get("offload_param") or {}).get("device", "none")
    if param != "none" and stage == 3:
        raise UserError(f"{where}: the ds_config puts ZeRO 3's parameters on {param!r} (offload_param), which "
                        "ckplan does not model (it keeps the shards on the GPU); drop it or give device none")
    job.modelled.offload_optimizer = device == "cpu" and stage > 0
    job.said("ds_config zero_optimization.offload_optimizer.device", device, "modelled",
             "Adam's state, master weights and gradients on the host (--offload-optimizer)" if device == "cpu" else
             "on the GPU")


def _knobs(job: Job, zero: dict, stage: int, where: str) -> None:
    """The stage3 knobs: ZeRO 3's (--stage3-*); at another stage DeepSpeed does not read them."""
    for key in KNOBS:
        if key not in zero:
            continue
        value = _int(zero[key], f"zero_optimization.{key}", where)
        if stage == 3:
            job.modelled.deepspeed[key] = value
            job.said(f"ds_config zero_optimization.{key}", zero[key], "modelled", f"--{key.replace('_', '-')}")
        else:
            job.said(f"ds_config zero_optimization.{key}", zero[key], "no effect", f"a ZeRO 3 setting, at ZeRO {stage}")
    if "reduce_bucket_size" in zero:
        value = _int(zero["reduce_bucket_size"], "zero_optimization.reduce_bucket_size", where)
        if stage == 3:
            job.modelled.deepspeed["reduce_bucket_size"] = value
            job.said("ds_config zero_optimization.reduce_bucket_size", zero["reduce_bucket_size"], "modelled",
                     "--reduce-bucket-size: ZeRO 3's gradient bucket on the GPU")
        else:
            job.said("ds_config zero_optimization.reduce_bucket_size", zero["reduce_bucket_size"], "not modelled",
                     f"ZeRO {stage}'s gradient buckets")
    overlap = zero.get("overlap_comm")
    if overlap is not None:
        job.said("ds_config zero_optimization.overlap_comm", overlap, "modelled" if overlap else "not modelled",
                 "the reductions overlapped with the backward, as the deepspeed record assumes" if overlap else
                 "the reductions after the backward: the deepspeed record overlaps them")


def _recompute(flags: Flags, job: Job) -> None:
    """Megatron-DeepSpeed's --checkpoint-activations: every layer rerun whole (its _checkpointed_forward, one layer
    a chunk at --checkpoint-num-layers 1), under DeepSpeed's reentrant checkpoint with
    --deepspeed-activation-checkpointing."""
    if flags.take("--checkpoint-activations", "every layer recomputed whole (Megatron-DeepSpeed's old flag)", bool,
                  False):
        job.recompute = Recompute(mode="full")
    chunk = flags.take("--checkpoint-num-layers", "layers a checkpoint holds", int, 1)
    if chunk and chunk > 1:
        job.notes.append(f"--checkpoint-num-layers {chunk}: scored as each layer checkpointed alone (Megatron-DeepSpeed "
                         f"keeps one input per {chunk} layers: fewer bytes than scored)")
    deepspeed_ckpt = flags.take("--deepspeed-activation-checkpointing", "DeepSpeed's reentrant checkpoint (the "
                                "deepspeed record's whole-forward rerun)", bool)
    _checkpointing(flags, job, bool(deepspeed_ckpt))
    if flags.take("--no-pipeline-parallel", "the model without DeepSpeed's PipelineEngine (one stage)", bool) and \
            job.pp > 1:  # Megatron-DeepSpeed 62bc4562 megatron/arguments.py 79-81 asserts it
        raise UserError(f"--no-pipeline-parallel with --pipeline-model-parallel-size {job.pp}: Megatron-DeepSpeed "
                        "asserts one pipeline stage without DeepSpeed's pipeline; drop one of them")
    flags.take("--cpu-optimizer", "DeepSpeed's CPU Adam, the offloaded optimizer's", bool)


# Megatron-DeepSpeed 62bc4562's flags for deepspeed.checkpointing.configure (megatron/arguments.py 866-877,
# megatron/initialize.py 153-180; its spelling --contigious-checkpointing): setup field and what each does
CHECKPOINTING_FLAGS = {
    "--checkpoint-in-cpu": ("checkpoint_in_cpu", "each checkpoint on the host, copied out and back (--checkpoint-in-cpu)"),
    "--partition-activations": ("partition_activations", "each checkpoint split over the tensor-parallel group "
                                "(--partition-activations)"),
    "--contigious-checkpointing": ("contiguous_checkpointing", "the checkpoints in preallocated buffers "
                                   "(--contiguous-checkpointing)"),
    "--synchronize-each-layer": ("synchronize_each_layer", "torch.cuda.synchronize() at each checkpoint's boundaries "
                                 "(--synchronize-each-layer)"),
}


def _checkpointing(flags: Flags, job: Job, deepspeed_ckpt: bool) -> None:
    """DeepSpeed's checkpointing flags: read where --deepspeed-activation-checkpointing hands Megatron-DeepSpeed's
    checkpoints to DeepSpeed (initialize.py 233-234); without it Megatron's own checkpoint runs and they do nothing.
    --profile-backward only times the checkpoints."""
    for flag, (name, what) in CHECKPOINTING_FLAGS.items():
        if not flags.has(flag):
            flags.take(flag, what, bool)  # a "false" value: said as off
            continue
        if deepspeed_ckpt:
            flags.take(flag, what, bool)
            job.modelled.deepspeed[name] = True
        else:
            values = flags.given.pop(flag)
            flags.sink.append((flag, " ".join(values), "no effect", "without --deepspeed-activation-checkpointing "
                               "Megatron's own checkpoint runs, which does not read it (initialize.py 233-234)"))
    if flags.has("--profile-backward"):
        values = flags.given.pop("--profile-backward")
        flags.sink.append(("--profile-backward", " ".join(values), "no effect", "timers around each checkpoint"))


def _attention(flags: Flags, job: Job) -> None:
    """Megatron-DeepSpeed's attention is its unfused softmax (the s x s scores kept) unless a flash flag is given."""
    flash = [flag for flag in ("--use-flash-attn", "--use-flash-attn-v1", "--use-flash-attn-v2",
                               "--use-flash-attn-triton") if flags.has(flag)]
    for flag in flash:
        flags.take(flag, "flash attention", bool)
    if not flash:
        job.attention = "eager"
        job.notes.append("no --use-flash-attn*: Megatron-DeepSpeed's attention is its fused-softmax core, the s x s "
                         "scores kept (scored as eager attention)")


def _rest(job: Job, config: dict, zero: dict) -> None:
    """Every other ds_config key, said: no effect, not modelled, or not a key DeepSpeed reads."""
    done = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "fp16", "bf16",
            "zero_optimization"}
    keys = [(key, value) for key, value in config.items() if key not in done]
    keys += [(f"zero_optimization.{key}", value) for key, value in zero.items() if key not in ZERO_KEYS]
    offload = zero.get("offload_optimizer") or {}
    keys += [(f"zero_optimization.offload_optimizer.{key}", value) for key, value in offload.items() if key != "device"]
    for key, value in keys:
        shown = json.dumps(value) if isinstance(value, (dict, list)) else value
        if key.startswith("zero_optimization.offload_optimizer.") and offload.get("device", "none") == "none":
            job.said(f"ds_config {key}", shown, "no effect", "an offload setting, with no offload (device none)")
        elif key in NO_EFFECT:
            job.said(f"ds_config {key}", shown, "no effect", NO_EFFECT[key])
        elif key in NOT_MODELLED:
            job.said(f"ds_config {key}", shown, "not modelled", NOT_MODELLED[key])
        elif key.startswith("zero_optimization."):
            job.said(f"ds_config {key}", shown, "unknown", "not a key of DeepSpeed's zero_optimization: v0.6.2 "
                     "ignores it (its default stands), edaa7221 refuses it (extra keys forbidden)")
        else:
            job.said(f"ds_config {key}", shown, "unknown", "a ds_config key this reader does not know: if it changes "
                     "memory or time, the prediction leaves it out")
