"""A torchtitan job TOML (0.2.x, `--job.config_file`) as a Job. Keys as
torchtitan/config/job_config.py defines them and flavors as torchtitan/models/llama3/__init__.py
(llama3_args) builds them, both read at pytorch/torchtitan 238fa9953e4a (2026-02, the last commit
with TOML train configs): 8B dim 4096 x 32 layers, 70B 8192 x 80, 405B 16384 x 126, 8 KV heads,
vocab 128256, rope_theta 500000 = ckplan's llama3-8b, llama3-70b, llama3.1-405b; qwen3's dense
flavors are ckplan's qwen3-* built-ins, read from torchtitan/models/qwen3/__init__.py at the same commit;
deepseek_v3's 16B flavor (deepseek_v3/__init__.py) has DeepSeek-V2-Lite's dimensions: ckplan's deepseek-v2-lite.
gpt_oss's 20b and 120b flavors (main b5bcd76c gpt_oss/__init__.py _20b, _120b) are ckplan's gpt-oss-20b and
gpt-oss-120b (planner/models/gptoss.py).
`parallelism.data_parallel_shard_degree = -1` takes the GPUs the other degrees leave; FSDP2
shards over dp_shard (ZeRO 3) and replicates over dp_replicate (HSDP); without a pipeline
`training.local_batch_size` is one microbatch a rank, with one it is split into
`pipeline_parallel_microbatch_size` microbatches; `global_batch_size` above local x dp
accumulates gradients (train.py).

torchtitan 0.3.0 and main configure a job in Python, `FILE.py:FUNCTION`, read here without running
it (titan_python.py) into the same keys; the flavors' dimensions are the same at main b5bcd76c
(models/llama3/__init__.py _8b, _70b, _405b). main from 73aed7f6c counts the batch in tokens:
`training.num_tokens_per_microbatch_per_dp_rank` token slots a forward, attended block-causally in
windows of `training.max_context_length` (read as that many sequences of that length),
`num_tokens_per_train_step`, and `parallelism.num_pp_microbatches` (planner/emit/titan_keys.py)."""

from __future__ import annotations

from pathlib import Path

import tomllib

from planner.errors import UserError
from planner.models import archs
from planner.models.configs import Job, Recompute, pending, titan_python, titan_settings
from planner.models.configs.titan_status import NOT_MODELLED, key_status

# (model.name, model.flavor) -> ckplan's built-in architecture (see the module docstring)
FLAVORS = {("llama3", "debugmodel"): "titan-llama3-debugmodel", ("llama3", "1B"): "llama3.2-1b",
           ("llama3", "3B"): "llama3.2-3b", ("llama3", "8B"): "llama3-8b", ("llama3", "70B"): "llama3-70b", ("llama3", "405B"): "llama3.1-405b",
           ("deepseek_v3", "671B"): "deepseek-v3", ("deepseek_v3", "16B"): "deepseek-v2-lite",
           ("qwen3", "30B-A3B"): "qwen3-30b-a3b", ("gpt_oss", "20b"): "gpt-oss-20b", ("gpt_oss", "120b"): "gpt-oss-120b",
           **{("qwen3", size): f"qwen3-{size.lower()}" for size in ("0.6B", "1.7B", "4B", "8B", "14B", "32B")}}
# torchtitan's families whose Hugging Face config.json `profile --arch-config` reads (archconfig.py's model_type)
ARCH_CONFIG_FAMILIES = {"llama3": "llama", "qwen3": "qwen3 and qwen3_moe", "deepseek_v3": "deepseek_v3",
                        "gpt_oss": "gpt_oss"}
# why ckplan reads no config of these families (docs/framework-facts.md §26, transformers 5.24.0)
UNMODELLED_FAMILIES = {"llama4": " (Llama 4's experts each run on their own stacked input, which routing.py's "
                                 "contract does not take)",
                       # b5bcd76c torchtitan/models/flux/config_registry.py: FluxTrainer.Config, loss MSELoss.Config
                       "flux": " (FLUX is a diffusion transformer trained on image latents with an MSE loss, not a "
                               "causal language model)"}
# torchtitan before the [parallelism] section (torchtitan/config_manager.py at b19456a987be,
# 2024-10-22): the same settings under [training], [experimental] and [float8], read as today's keys
ALIASES = {
    "training.batch_size": "training.local_batch_size",
    "training.data_parallel_replicate_degree": "parallelism.data_parallel_replicate_degree",
    "training.data_parallel_shard_degree": "parallelism.data_parallel_shard_degree",
    "training.tensor_parallel_degree": "parallelism.tensor_parallel_degree",
    "training.compile": "compile.enable",
    "training.mixed_precision_param": "training.mixed_precision_param",
    "training.enable_cpu_offload": "training.enable_cpu_offload",
    "training.warmup_steps": "lr_scheduler.warmup_steps",
    "experimental.pipeline_parallel_degree": "parallelism.pipeline_parallel_degree",
    "experimental.pipeline_parallel_schedule": "parallelism.pipeline_parallel_schedule",
    "experimental.context_parallel_degree": "parallelism.context_parallel_degree",
    "experimental.enable_async_tensor_parallel": "parallelism.enable_async_tensor_parallel",
    "float8.enable_fsdp_float8_all_gather": "quantize.linear.float8.enable_fsdp_float8_all_gather",
    "float8.precompute_float8_dynamic_scale_for_fsdp": "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp",
    # the rest of [float8] (job_config.py's Float8 until 5b5d4685 moved it to quantize.linear.float8)
    "float8.filter_fqns": "quantize.linear.float8.filter_fqns", "float8.recipe_name": "quantize.linear.float8.recipe_name",
    "float8.emulate": "quantize.linear.float8.emulate",
    "float8.force_recompute_fp8_weight_in_bwd": "quantize.linear.float8.force_recompute_fp8_weight_in_bwd",
    "checkpoint.enable_checkpoint": "checkpoint.enable",
    # AsyncTP moved into the compile section at 737594746 (2026-08-12; 0.3.0 and main)
    "compile.enable_async_tensor_parallel": "parallelism.enable_async_tensor_parallel",
}
# Keys torchtitan's config_manager.py takes at 9dec370 (2024-12-26) and no longer at bbb1b616 (2025-04-02):
# a file with one predates the [parallelism] section (785c34c9, 2025-03-18)
BEFORE_PARALLELISM = frozenset({
    "checkpoint.interval_type", "experimental.context_parallel_degree", "experimental.context_parallel_rotate_method",
    "experimental.enable_async_tensor_parallel", "experimental.enable_compiled_autograd",
    "experimental.pipeline_parallel_degree", "experimental.pipeline_parallel_microbatches",
    "experimental.pipeline_parallel_schedule", "experimental.pipeline_parallel_schedule_csv",
    "experimental.pipeline_parallel_split_points", "optimizer.fused", "training.data_parallel_replicate_degree",
    "training.data_parallel_shard_degree", "training.disable_loss_parallel", "training.tensor_parallel_degree",
    "training.warmup_steps"})
# Sections and keys that came after bbb1b616: [compile] (08b8b244, 2025-08-20), [quantize] (5b5d4685, 2025-09-26), the
# local / global batch sizes (8570415c, 2025-06-05)
AFTER_BBB1B616 = ("compile.", "quantize.", "training.local_batch_size", "training.global_batch_size",
                  "training.num_tokens_per_microbatch_per_dp_rank", "training.max_context_length")
_SCHEDULES = {"1F1B": "1F1B", "GPipe": "GPipe", "Interleaved1F1B": "interleaved-1F1B", "InterleavedZeroBubble": "ZB",
              "ZBVZeroBubble": "ZBV", "DualPipeV": "DualPipeV"}


def read(path: Path) -> Job:
    """A job TOML, or FILE.py:FUNCTION, a config function read without running it (titan_python.py)."""
    python = titan_python.split(str(path))
    if python is not None:
        return from_mapping(titan_python.read(*python), str(path))
    if str(path).endswith(".py"):
        raise UserError(f"{path}: name the config function too, FILE.py:FUNCTION (e.g. "
                        "torchtitan/models/llama3/config_registry.py:llama3_8b)")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: no such file; give a torchtitan job TOML") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} cannot be read as text ({exc.__class__.__name__}); give a torchtitan job TOML") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path} is not valid TOML ({exc}); give a torchtitan job TOML") from None
    return from_mapping(data, str(path))


def _flatten(data: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


class _Keys:
    """The file's keys (older spellings read as today's: ALIASES), each taken once."""

    def __init__(self, flat: dict, where: str):
        self.where, self.taken = where, []
        self.left = {ALIASES.get(key, key): value for key, value in flat.items()}
        self.spelled = {ALIASES[key]: key for key in flat if key in ALIASES}  # today's key -> the file's

    def name(self, key: str) -> str:
        return self.spelled.get(key, key)

    def take(self, key: str, what: str, kind, default=None):
        if key not in self.left:
            return default
        value = self.left.pop(key)
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            name = {int: "a whole number", str: "a string", bool: "true or false", list: "a list"}.get(kind, "a value")
            raise UserError(f"{self.where}: {key} = {value!r} is not {name}; give {name}")
        self.taken.append((key, value, "modelled", what))
        return value

    def pending(self, key: str, active: bool, setting: str) -> None:
        if key in self.left:
            value = self.left.pop(key)
            self.taken.append((key, value, "not modelled" if active else "no effect",
                               pending(setting) if active else "off"))


def from_mapping(data: dict, where: str) -> Job:
    flat = _flatten(data)
    keys = _Keys(flat, where)
    name = keys.take("model.name", "model family", str, "llama3")
    flavor = keys.take("model.flavor", "model size", str, "debugmodel")
    arch_name = FLAVORS.get((name, flavor))
    if arch_name is None:
        raise UserError(_unknown_model(where, name, flavor, flat.get("hf_model", flat.get("model.hf_model"))))
    seq_len, local, per_microbatch = _batch(keys, where)
    job = Job(framework="torchtitan", source=where, arch=archs.arch(arch_name), seq_len=seq_len, micro_batch_size=local,
              local_batch_size=local)
    step = keys.take("training.num_tokens_per_train_step", "tokens per step over all ranks", int, -1)
    gbs = keys.take("training.global_batch_size", "sequences per step over all ranks", int, step // seq_len)
    job.global_batch_size = gbs if gbs > 0 else None
    _parallel(keys, job, per_microbatch)
    _recompute(keys, job)
    _precision(keys, job)
    titan_settings.read(keys, job)
    _version(flat, job)
    for key, value, status, what in keys.taken:
        job.said(keys.name(key), value, status, what)
    _rest(keys, job)
    return job


NEWEST = "torchtitan b5bcd76c (2026-08-21)"
BEFORE_RETURN_OUTPUTS = ("a torchtitan from before e5ef99aab (2025-10-22) kept pipeline stages' outputs to the step's "
                         "end: give --runtime-version bbb1b616 to score every stage's (a torch from before "
                         "pytorch#153383, 2025-05-13), 2c8b5947 the last stage's (a later torch)")
# training.compile beside the local / global batch sizes: a file of 8570415c (2025-06-05) to 08b8b244 (2025-08-20,
# where [compile] replaced training.compile), the span of the 2c8b5947 record
BATCH_SIZES = ("training.local_batch_size", "training.global_batch_size")


def _version(flat: dict, job: Job) -> None:
    """The runtime version whose record applies (planner/cost/runtimes.py: 9dec370, whose loss is not
    compiled; 2c8b5947, which compiles it and whose pipeline keeps the last stage's outputs to the step's
    end; else the newest record, b5bcd76c, which compiles it with the model and whose pipeline keeps no
    outputs to the step's end, where bbb1b616's kept every stage's), as the file's keys date it; said."""
    old = sorted(key for key in flat if key in BEFORE_PARALLELISM)
    new = sorted(key for key in flat if key.startswith(AFTER_BBB1B616) or key.startswith("parallelism."))
    if old and new:
        raise UserError(f"{job.source} spells {old[0]} as torchtitan did before its parallelism section (2025-03-18) "
                        f"and {new[0]} as after it; give one torchtitan's keys")
    if old:
        job.modelled.runtime_version = "9dec370"
        job.notes.append(f"runtime version: torchtitan 9dec370 (2024-12-26), the record read before the parallelism "
                         f"section, since the file spells {old[0]} (config_manager.py at 9dec370, gone at bbb1b616); "
                         "torchtitan from b19456a9 (2024-10-22) until 9dec370 compiled the loss under "
                         "training.compile (train.py 138-139), 9dec370 does not, nor any until bbb1b616 "
                         "(components/loss.py 17-18 at 54ef4222, 2025-03-12): give --runtime-version to score "
                         "another")
    elif "training.compile" in flat and any(key in flat for key in BATCH_SIZES) and \
            not any(key.startswith(("compile.", "quantize.")) for key in flat):
        job.modelled.runtime_version = "2c8b5947"
        job.notes.append("runtime version: torchtitan 2c8b5947 (2025-08-08), since the file spells training.compile "
                         "(replaced by the compile section at 08b8b244, 2025-08-20) beside training.local_batch_size or "
                         "global_batch_size (since 8570415c, 2025-06-05): the loss compiled with the model; a "
                         "pipeline's last stage keeps its outputs to the step's end on a torch from after "
                         "pytorch#153383 (2025-05-13): give --runtime-version bbb1b616 for an earlier torch")
    elif new:
        later = [key for key in new if key.startswith(AFTER_BBB1B616)]
        job.notes.append(f"runtime version: {NEWEST}, the newest record read, since the file "
                         + (f"sets {later[0]}, a key torchtitan took after bbb1b616" if later else
                            f"sets {new[0]} (the parallelism section since 785c34c9, 2025-03-18; before bbb1b616 torchtitan did "
                            "not compile the loss)") + f"; {BEFORE_RETURN_OUTPUTS}")
    else:
        job.notes.append(f"runtime version: {NEWEST}, the newest record read (the default): no key of the file "
                         f"dates it; {BEFORE_RETURN_OUTPUTS}")


def _batch(keys: _Keys, where: str) -> tuple[int, int, int | None]:
    """(sequence length, sequences a rank runs per step, sequences a pipeline microbatch holds where the
    file counts it in tokens). 0.3.0 and before: training.seq_len and local_batch_size. main from
    73aed7f6c (planner/emit/titan_keys.py): a forward of num_tokens_per_microbatch_per_dp_rank token
    slots, attended block-causally within each max_context_length window, is that many windows of
    max_context_length tokens, each a sequence as ckplan scores them."""
    if "training.num_tokens_per_microbatch_per_dp_rank" not in keys.left:
        seq_len = _positive(where, "training.seq_len", keys.take("training.seq_len", "tokens per sequence", int, 2048))
        return seq_len, _positive(where, "training.local_batch_size", keys.take(
            "training.local_batch_size", "sequences per data-parallel rank", int, 8)), None
    tokens = _positive(where, "training.num_tokens_per_microbatch_per_dp_rank", keys.take(
        "training.num_tokens_per_microbatch_per_dp_rank", "token slots a rank runs per forward", int))
    # the default 2048: config/configs.py TrainingConfig.max_context_length at b5bcd76c
    seq_len = _positive(where, "training.max_context_length", keys.take(
        "training.max_context_length", "tokens per sequence (the attention window)", int, 2048))
    if tokens % seq_len:
        raise UserError(f"{where}: num_tokens_per_microbatch_per_dp_rank {tokens} is not a multiple of "
                        f"max_context_length {seq_len}; ckplan scores whole sequences of max_context_length tokens")
    return seq_len, tokens // seq_len, tokens // seq_len


def _unknown_model(where: str, name: str, flavor: str, hf_model=None) -> str:
    """What works for a model the reader has no built-in for: --arch-config where ckplan reads the
    family's config.json (planner/models/archconfig.py), or where the job builds a Hugging Face model by
    its hub name (the transformers backend's hf_model); else that ckplan does not model it."""
    known = ", ".join(f"{n} {f}" for n, f in FLAVORS)
    said = f"{where}: model {name} flavor {flavor} is not one ckplan has built in ({known})"
    if name == "transformers_modeling_backend":
        # 0.3.0 experiments/transformers_modeling_backend/__init__.py: the model is transformers' build of
        # hf_model's config (AutoConfig.from_pretrained), which a flavor other than full overrides in part
        model = f"Hugging Face's {hf_model}" if hf_model else "the Hugging Face model its hf_model names"
        override = "" if flavor == "full" else f" (flavor {flavor} overrides some of that config's sizes: set them in it)"
        return (f"{where}: model {name} builds {model} with transformers from its hub config, which ckplan never "
                f"downloads: profile that model's config.json with `ckplan profile --hf-config config.json --fake` "
                f"(or --arch-config, where ckplan reads the family){override}, then score the job with `ckplan "
                "evaluate --profile PROFILE --layers-per-stage ...`")
    if name in ARCH_CONFIG_FAMILIES:
        return (f"{said}; profile its Hugging Face config.json with `ckplan profile --arch-config config.json "
                f"--seq-len N` (it reads {ARCH_CONFIG_FAMILIES[name]} configs) and score the job with `ckplan "
                "evaluate --profile PROFILE --layers-per-stage ...`")
    why = UNMODELLED_FAMILIES.get(name, "")
    return (f"{said}, and ckplan does not model torchtitan's {name} models{why}: neither `profile --arch-config` "
            "nor `profile --hf-config` reads them, so no ckplan route scores this job")


def _positive(where: str, key: str, value: int) -> int:
    if value < 1:
        raise UserError(f"{where}: {key} = {value}; give 1 or more")
    return value


def _context_parallel(keys: _Keys, job: Job) -> None:
    """context_parallel_degree; the rotate method (9dec370's experimental.context_parallel_rotate_method,
    allgather or alltoall: torch's _RotateMethod, alltoall passing K/V rank to rank as a p2p ring does);
    the load balancer (b5bcd76c torchtitan/config/configs.py 239-248: headtail by default, None off)."""
    job.cp = _positive(job.source, "context_parallel_degree",
                       keys.take("parallelism.context_parallel_degree", "context parallelism (each rank seq / cp "
                                 "tokens, torch's ring attention)", int, 1))
    rotate = keys.take("parallelism.context_parallel_rotate_method", "context parallelism's K/V exchange", str)
    if rotate is not None:
        if rotate not in ("allgather", "alltoall"):
            raise UserError(f"{job.source}: context_parallel_rotate_method {rotate!r}: torchtitan takes allgather or "
                            "alltoall")
        job.modelled.cp_comm = "allgather" if rotate == "allgather" else "p2p"
    balancer = keys.take("parallelism.context_parallel_load_balancer", "context parallelism's load balancer "
                         "(headtail: every rank the same causal work)", str)
    if balancer is not None and balancer not in ("headtail", "ptrr"):
        keys.taken[-1] = (*keys.taken[-1][:2], "not modelled", pending("cp-unbalanced"))


def _parallel(keys: _Keys, job: Job, per_microbatch: int | None = None) -> None:
    where = job.source
    job.tp = _positive(where, "tensor_parallel_degree",
                       keys.take("parallelism.tensor_parallel_degree", "tensor parallelism (with sequence "
                                 "parallelism, as torchtitan runs it)", int, 1))
    # SequenceParallel beside TP unless told (config/configs.py ParallelismConfig at b5bcd76c and 0.3.0)
    sequence_parallel = keys.take("parallelism.enable_sequence_parallel", "sequence parallelism beside tensor "
                                  "parallelism (on by default)", bool, True)
    job.sp = job.tp > 1 and sequence_parallel
    job.pp = _positive(where, "pipeline_parallel_degree",
                       keys.take("parallelism.pipeline_parallel_degree", "pipeline stages", int, 1))
    _context_parallel(keys, job)
    job.ep = keys.take("parallelism.expert_parallel_degree", "expert parallelism", int, 1)
    replicate = keys.take("parallelism.data_parallel_replicate_degree", "data-parallel replicas (HSDP)", int, 1)
    shard = keys.take("parallelism.data_parallel_shard_degree", "FSDP2 shard group (-1: the rest of the GPUs)",
                      int, -1)
    job.dp_given = None if shard == -1 else shard * replicate
    job.dp_replicate = _positive(where, "data_parallel_replicate_degree", replicate)
    job.zero = 3  # FSDP2 (zero 0 where the shard degree is 1: decided with the GPU count)
    schedule = keys.take("parallelism.pipeline_parallel_schedule", "pipeline schedule", str, "1F1B")
    if job.pp > 1:
        # torch's get_schedule_class takes the name in any case (pipelining/schedules.py 3620-3644 at 2.13.0)
        named = {name.lower(): ours for name, ours in _SCHEDULES.items()}
        if schedule.lower() not in named:
            raise UserError(f"{where}: pipeline_parallel_schedule {schedule!r} is not one ckplan scores "
                            f"({', '.join(_SCHEDULES)})")
        job.schedule = named[schedule.lower()]
    mbs = keys.take("parallelism.pipeline_parallel_microbatch_size", "sequences per pipeline microbatch", int,
                    per_microbatch or 1)
    count = keys.take("parallelism.num_pp_microbatches", "pipeline microbatches per accumulation step", int, 1)
    if job.pp > 1 and per_microbatch:
        job.local_batch_size = per_microbatch * _positive(where, "num_pp_microbatches", count)
    elif job.pp == 1 and keys.taken and keys.taken[-1][0] == "parallelism.num_pp_microbatches":
        keys.taken[-1] = (*keys.taken[-1][:2], "no effect", "ignored without a pipeline (trainer.py 409-411)")
    if job.pp > 1:
        if job.local_batch_size % mbs:
            raise UserError(f"{where}: local_batch_size {job.local_batch_size} is not a multiple of "
                            f"pipeline_parallel_microbatch_size {mbs}")
        job.micro_batch_size = mbs
    count = keys.take("experimental.pipeline_parallel_microbatches", "microbatches (torchtitan 2024)", int)
    if job.pp > 1 and count is not None:
        if job.local_batch_size % count:
            raise UserError(f"{where}: batch_size {job.local_batch_size} is not a multiple of "
                            f"pipeline_parallel_microbatches {count}")
        job.micro_batch_size = job.local_batch_size // count
    points = keys.take("experimental.pipeline_parallel_split_points", "modules starting each stage (2024)", list)
    per_stage = keys.take("parallelism.pipeline_parallel_layers_per_stage", "decoder layers per stage", int)
    parts = keys.take("parallelism.module_fqns_per_model_part", "modules of each stage", list)
    first = keys.take("parallelism.pipeline_parallel_first_stage_less_layers", "first stage's fewer layers", int, 1)
    last = keys.take("parallelism.pipeline_parallel_last_stage_less_layers", "last stage's fewer layers", int, 1)
    job.chunks = 2 if job.schedule in ("interleaved-1F1B", "ZB", "ZBV", "DualPipeV") else 1
    layers = job.arch.num_layers
    if points:
        starts = [0, *(int(str(p).split(".")[1]) for p in points), job.arch.num_layers]
        job.layers_per_stage = [b - a for a, b in zip(starts, starts[1:])]
    elif parts is not None:
        job.layers_per_stage = [sum(1 for m in part if str(m).startswith("layers.")) for part in parts]
    elif per_stage is not None:
        stages = -(-layers // per_stage)
        job.layers_per_stage = [per_stage] * (stages - 1) + [layers - per_stage * (stages - 1)]
    else:
        job.layers_per_stage = _even(layers, job.pp * job.chunks, first, last)
    if len(job.layers_per_stage) % job.pp:
        raise UserError(f"{where}: the stages given ({len(job.layers_per_stage)}) are not a multiple of "
                        f"pipeline_parallel_degree {job.pp}")
    job.chunks = len(job.layers_per_stage) // job.pp
    # job_config.py at 238fa9953e4a: default 1, no effect without experts or with ep 1
    etp = keys.take("parallelism.expert_tensor_parallel_degree", "expert tensor parallelism", int)
    if job.arch.num_experts and job.ep > 1 and (1 if etp is None else etp) != job.tp:
        if etp is None:
            keys.taken.append(("parallelism.expert_tensor_parallel_degree", "1 (default)", "not modelled",
                               pending("etp")))
        else:
            keys.taken[-1] = (*keys.taken[-1][:2], "not modelled", pending("etp"))
    elif job.arch.num_experts and job.ep > 1:
        job.modelled.expert_tp = job.tp  # the experts split as the profile's TP splits them


def _even(layers: int, stages: int, first: int, last: int) -> list[int]:
    """torchtitan's split (distributed/pipeline_parallel.py generate_llm_fqn_per_model_part): the
    embedding and the output count as `first` and `last` layers, the total spread evenly, the
    remainder to the first stages."""
    if stages == 1:
        return [layers]
    total = layers + first + last
    base, extra = divmod(total, stages)
    sizes = [base + (1 if s < extra else 0) for s in range(stages)]
    sizes[0] -= first
    sizes[-1] -= last
    if min(sizes) < 1 or sum(sizes) != layers:
        raise UserError(f"{layers} layers do not split over {stages} pipeline stages as torchtitan splits them; "
                        "give parallelism.module_fqns_per_model_part")
    return sizes


def _recompute(keys: _Keys, job: Job) -> None:
    mode = keys.take("activation_checkpoint.mode", "activation checkpointing", str, "selective")
    option = keys.take("activation_checkpoint.selective_ac_option", "every Nth layer, or op-level", str, "2")
    if mode == "full":
        job.recompute = Recompute(mode="full")
    elif mode == "selective" and option.isdigit() and int(option) >= 1:
        job.recompute = Recompute(mode="every", num_layers=int(option))
    elif mode == "selective" and option == "op":
        arch = job.arch
        if arch.style == "llama" and not arch.shared_expert_gate:  # opsac.offers_op_sac's blocks (MoE, MLA: §74)
            job.recompute = Recompute(mode="op")
            job.modelled.op_level_sac = True
            keys.taken[-1] = (*keys.taken[-1][:3], "op-level selective AC: every block checkpointed under "
                              "torchtitan's per-op policy (op-sac: every second mm and the attention saved)")
        else:
            keys.taken[-1] = (*keys.taken[-1][:2], "not modelled", pending("op-sac"))
    elif mode == "memory_budget":
        keys.taken.append(("activation_checkpoint.mode", mode, "not modelled", NOT_MODELLED[
            "activation_checkpoint.memory_budget"] + " (scored as no recompute)"))
    elif mode != "none":
        raise UserError(f"{job.source}: activation_checkpoint.mode {mode!r} with selective_ac_option {option!r}: give "
                        "none, full, or selective with a whole number or 'op'")


FP32_RUN = ("FSDP2 computes in fp32: the weights, gradients and Adam state are scored in fp32, but the activations "
            "and matmuls as bf16 (the profile's 16-bit tensor-core rates and 2-byte kept tensors); give bfloat16 to "
            "score a bf16 run")


def _precision(keys: _Keys, job: Job) -> None:
    dtype = keys.take("training.dtype", "training dtype (bfloat16: weights and state in bf16)", str, "float32")
    param = keys.take("training.mixed_precision_param", "FSDP2's compute dtype", str, "bfloat16")
    if param not in ("bfloat16", "float32"):  # torchtitan/config/configs.py 94 at b5bcd76c; no loss scaler in it
        raise UserError(f"{job.source}: training.mixed_precision_param {param!r}: torchtitan takes bfloat16 or float32 "
                        "(it has no loss scaler for float16)")
    job.precision = "bf16" if dtype == "bfloat16" else "bf16-mixed" if param == "bfloat16" else "fp32"
    if job.precision == "fp32":  # FSDP2 computes in fp32: the analytic profile is bf16's (evaluate_config._profile)
        keys.taken[:] = [(k, v, "not modelled", FP32_RUN) if k == "training.mixed_precision_param" else (k, v, st, w)
                         for k, v, st, w in keys.taken]
    name = keys.take("optimizer.name", "optimizer", str, "AdamW")
    if name.lower() not in ("adam", "adamw", "sgd"):
        raise UserError(f"{job.source}: optimizer {name!r}: ckplan scores Adam, AdamW and SGD")
    job.optimizer = "sgd" if name.lower() == "sgd" else "adam"


def _rest(keys: _Keys, job: Job) -> None:
    for key, value in keys.left.items():
        job.said(keys.name(key), value, *key_status(key, value))
