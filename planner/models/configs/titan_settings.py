"""The settings a torchtitan job file asks for beyond its degrees and batch: torch.compile and
what it compiles, Float8 and the other converters, AsyncTP (read by planner/models/configs/
torchtitan.py's reader, whose `_Keys` account for every key taken)."""

from __future__ import annotations

from planner.errors import UserError
from planner.models.configs import Job, pending

FLOAT8_CONVERTERS = ("float8", "quantize.linear.float8")
# converters other than Float8's linears that are no quantized matmul: their PENDING sentence
OTHER_CONVERTERS = {"LoRAConverter.Config": "lora", "lora": "lora"}


def read(keys, job: Job) -> None:
    """compile and AsyncTP (modelled: Job.modelled); the keys that ask for a setting the cost model
    does not model (configs.PENDING), listed "not modelled"."""
    compiled = keys.take("compile.enable", "torch.compile of what compile.components names (--compile)", bool, False)
    _compile_components(keys, job, compiled)
    converters = keys.left.get("model.converters", [])  # before _float8 takes it
    _float8(keys, job)
    _loss(keys, job)
    for key in ("quantize.grouped_mm.float8.fqns", "quantize.grouped_mm.mx.fqns"):  # Float8 / MX on the experts
        # only where model.converters names that converter: ModelConvertersContainer builds those it names
        # (components/quantization/__init__.py, float8.py 239 at 238fa9953e4a), the fqns alone convert nothing
        keys.pending(key, bool(keys.left.get(key)) and isinstance(converters, list)
                     and key.rsplit(".", 1)[0] in converters, "float8")
    if keys.take("parallelism.enable_async_tensor_parallel", "AsyncTP: tensor-parallel collectives overlapped with "
                 "the matmuls (the runtime's tp_overlap, --tp-overlap async-tp)", bool, False):
        # distributed/tensor_parallel.py 20-23 at 238fa9953e4a; parallelisms/parallelize_llama.py 55 at b19456a987be
        if job.tp > 1 and not job.modelled.compile:
            raise UserError(f"{job.source}: enable_async_tensor_parallel needs compile.enable with 'model' in "
                            "compile.components (torchtitan raises 'Async TP requires ...' otherwise)")
        if job.tp > 1:
            job.modelled.tp_overlap = "async-tp"
        else:
            keys.taken[-1] = (*keys.taken[-1][:2], "no effect", "tensor_parallel_degree 1: no collectives to overlap")


def _compile_components(keys, job: Job, compiled: bool) -> None:
    """compile.components (torchtitan/config/job_config.py 725, default ["model", "loss"], at 238fa9953e4a;
    the 2024 spelling training.compile compiles the loss too, train.py 138-139 at b19456a987be): "model"
    compiles each TransformerBlock (models/llama3/infra/parallelize.py 107-123, apply_compile), charged
    as the profile's compiled kept bytes; "loss" the loss function (components/loss.py 33), as the
    runtime's version compiles it. Other names torchtitan never tests for: listed. Without
    compile.enable neither is compiled."""
    if not compiled:
        if "compile.components" in keys.left:
            keys.taken.append(("compile.components", keys.left.pop("compile.components"), "no effect",
                               "compile.enable is false: nothing compiled"))
        return
    components = keys.take("compile.components", "what torch.compile compiles: model (the blocks) and loss "
                           "(--compile model,loss)", list, ["model", "loss"])
    stray = [str(c) for c in components if c not in ("model", "loss")]
    if stray:
        keys.taken.append(("compile.components", " ".join(stray), "no effect", "not a component torchtitan compiles "
                           "(it tests for model and loss only)"))
    job.modelled.compile = "model" in components
    job.modelled.compile_loss = None if {"model", "loss"} <= set(components) else "loss" in components


# [float8]'s experts to convert beside the linears, read by the float8 converter alone (Float8Converter's
# moe_fqns from float8_config.moe_fqns_prototype, components/float8.py before 5b5d4685; the file's moe_fqns)
OLD_EXPERT_KEYS = ("float8.moe_fqns", "float8.moe_fqns_prototype")


def _float8(keys, job: Job) -> None:
    """Float8 linears (model.converters ["float8"]; 2024: float8.enable_float8_linear) as torchao's
    tensorwise Float8Linear on every linear but the head (planner/profiler/float8.py), and FSDP2's
    float8 all-gather where the weights are sharded. A recipe other than tensorwise (rowwise), a
    filter other than the head's, and torchtitan's forced recompute of the float8 weight are not
    modelled (listed)."""
    converters = keys.left.get("model.converters", [])
    if not isinstance(converters, list):  # a string, which would read as no converter at all
        raise UserError(f"{keys.where}: model.converters = {converters!r} is not a list; give a list of converter "
                        f"names, e.g. converters = [{converters!r}]")
    old = bool(keys.left.get("float8.enable_float8_linear"))  # torchtitan 2024's switch
    # the converter's name: "float8" until 5b5d4685 (2025-09-26), "quantize.linear.float8" since
    # (components/quantization/float8.py 238 at 238fa9953e4a)
    float8 = old or any(name in FLOAT8_CONVERTERS for name in converters)
    _other_converters(keys, converters)
    _scaling_types(keys, float8)
    recipe = keys.left.get("quantize.linear.float8.recipe_name")
    # 9dec370's converter leaves `output` out whatever the file says; today's filter_fqns defaults to []
    filters = keys.left.get("quantize.linear.float8.filter_fqns", ["output"] if old else [])
    modelled = float8 and recipe in (None, "tensorwise") and isinstance(filters, list) and set(filters) == {"output"} \
        and not keys.left.get("quantize.linear.float8.force_recompute_fp8_weight_in_bwd")
    if not modelled:
        keys.pending("model.converters", float8, "float8")
        keys.pending("float8.enable_float8_linear", old, "float8")
        for key in ("quantize.linear.float8.recipe_name", "quantize.linear.float8.filter_fqns",
                    "quantize.linear.float8.enable_fsdp_float8_all_gather",
                    "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp",
                    "quantize.linear.float8.force_recompute_fp8_weight_in_bwd", *OLD_EXPERT_KEYS):
            keys.pending(key, float8 and bool(keys.left.get(key)), "float8")
        return
    for key in OLD_EXPERT_KEYS:  # Float8 grouped GEMMs on the experts: not modelled
        keys.pending(key, bool(keys.left.get(key)), "float8")
    what = "Float8 linears: torchao's tensorwise Float8Linear on every block linear, the head in bf16 (--float8)"
    for key in ("model.converters", "float8.enable_float8_linear"):
        if key in keys.left:
            keys.take(key, what, list if key == "model.converters" else bool)
    keys.take("quantize.linear.float8.recipe_name", "tensorwise scaling (torchao's default)", str)
    if "quantize.linear.float8.filter_fqns" in keys.left:
        keys.take("quantize.linear.float8.filter_fqns", "the head left in bf16 (ckplan converts no head)", list)
    gather = bool(keys.left.get("quantize.linear.float8.enable_fsdp_float8_all_gather"))
    keys.take("quantize.linear.float8.enable_fsdp_float8_all_gather", "FSDP2 gathers the Float8 weights in float8 "
              "where it shards them (--fp8-all-gather)", bool)
    keys.take("quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp", "the float8 weights' scales "
              "computed once per step (charged with --fp8-all-gather)", bool)
    job.modelled.float8 = True
    job.modelled.fp8_all_gather = gather


# torchtitan's [float8] scaling types before 2271b638 (2025-01-31, "Delete delayed scaling", torchao deprecating it):
# dynamic (the default) or delayed, per tensor (config_manager.py 551-570 at its parent d4c86e37; 9dec370 552-570)
SCALING_KEYS = ("float8.scaling_type_input", "float8.scaling_type_weight", "float8.scaling_type_grad_output")


def _scaling_types(keys, float8: bool) -> None:
    """torchtitan 2024's per-tensor scaling types: dynamic is the tensorwise scaling ckplan charges; delayed (torchao's
    Float8Linear with amax and scale histories, synced by sync_float8_amax_and_scale_history after each backward) is
    refused in one sentence where Float8 is on, and has no effect where it is off."""
    for key in SCALING_KEYS:
        value = keys.left.get(key)
        if value is None:
            continue
        if not float8:
            keys.pending(key, False, "float8")
        elif value == "dynamic":
            keys.take(key, "dynamic (tensorwise) scaling, torchao's default: as --float8 charges it", str)
        else:
            raise UserError(f"{keys.where}: {key} = {value!r}: torchao's delayed scaling (its amax and scale "
                            "histories, synced after each backward) is not modelled, and torchtitan removed it at "
                            "2271b638 (2025-01-31); give \"dynamic\" or drop the key" if value == "delayed" else
                            f"{keys.where}: {key} = {value!r} is not one of torchtitan's choices; give \"dynamic\"")


def _other_converters(keys, converters: list) -> None:
    """Converters other than Float8's linears (MX linears, quantized grouped matmuls: components/
    quantization/mx.py 171-172, float8.py 239 at 238fa9953e4a) are not modelled: listed, and their
    keys with them; without them those keys have no effect."""
    others = [str(name) for name in converters if name not in FLOAT8_CONVERTERS]
    for name in others:  # one row each: a LoRA adapter is no quantized matmul
        keys.taken.append(("model.converters", name, "not modelled", pending(OTHER_CONVERTERS.get(name, "mx"))))
    if others and not any(name in FLOAT8_CONVERTERS for name in converters):
        keys.left.pop("model.converters", None)  # listed above, one row a converter
    for key in [key for key in keys.left if key.startswith(("quantize.linear.mx.", "quantize.grouped_mm."))
                and not key.endswith(".fqns")]:  # the experts' fqns: listed with Float8 (_settings)
        converter = key.rsplit(".", 1)[0]
        keys.pending(key, converter in converters or converter == "quantize.linear.mx" and "mx" in converters, "mx")


CHUNKED_LOSS_DEFAULT_CHUNKS = 8  # ChunkedLossWrapper.Config.num_chunks, components/loss.py 610, b5bcd76c (0.3.0)


def _loss(keys, job: Job) -> None:
    """The loss (Trainer.Config's `loss`, torchtitan 0.3.0's Python configs): CrossEntropyLoss, or
    ChunkedLossWrapper over loss.num_chunks chunks (--chunked-cross-entropy N; its default 8)."""
    function = keys.take("loss.function", "the loss: cross-entropy on whole logits, or ChunkedLossWrapper's "
                         "over chunks of each sequence (--chunked-cross-entropy N)", str, None)
    if function is not None and "Chunked" in function:
        job.modelled.chunked_cross_entropy = keys.take(
            "loss.num_chunks", "chunks of each sequence the chunked loss runs (--chunked-cross-entropy N)", int,
            CHUNKED_LOSS_DEFAULT_CHUNKS)
        if job.modelled.chunked_cross_entropy < 1:
            raise UserError(f"{job.source}: loss.num_chunks = {job.modelled.chunked_cross_entropy}: give a whole number "
                            "of chunks, 1 or more")
