"""A plan as DeepSpeed's PipelineModule: the closest it can say is marker classes. A plan of one
stage is a torch.nn.Sequential for DeepSpeed's plain engine, which runs every ZeRO stage.

Facts from DeepSpeed 0.19 (runtime/pipe/module.py, runtime/utils.py): partition_method is
'uniform', 'parameters' or 'type:REGEX', never a list of stage sizes; 'type:REGEX' gives
each layer whose class name matches weight 1 and balances the weights with
partition_balanced, so marking exactly the first layer of every stage yields those
stages (its tie-break keeps the latest cut, the marked layer). activation_checkpoint_interval
is a chunk of that many consecutive layers of a stage, checkpointed when every layer in
it is of a class named in checkpointable_layers; interval 1 chooses single layers.
DeepSpeed's default (reentrant) checkpoint gives no gradient to a layer whose input needs
none, so the model's first layer is never checkpointed. The pipeline runs 1F1B
(TrainSchedule); gradient_accumulation_steps is the number of microbatches.

A plan of a chunked schedule (interleaved 1F1B, ZB, ZBV, DualPipeV) is exported as the 1F1B
DeepSpeed runs: each rank takes V consecutive pipeline stages of the plan as its one stage, so
the layers keep their order, the stages their balance and every layer its recompute choice; the
re-score says what 1F1B's in-flight microbatches make of the peaks. Refusing would leave the
user nothing to run, and re-solving is one command, which the rounding names.
"""

from __future__ import annotations

from planner.emit import dp_support, facts, rounding, scored_as
from planner.schema import Plan, Profile

TARGET = "DeepSpeed"
CANNOT_EXPRESS = [
    "layers per stage by number: partition_method has no list, so the first layer of each stage gets a "
    "marker class and partition_method=\"type:^StageStart\" cuts there.",
    "per-layer checkpointing by name: checkpointed layers get a marker class listed in checkpointable_layers, "
    "with activation_checkpoint_interval=1 (larger intervals checkpoint chunks of consecutive layers).",
    "checkpointing the model's first layer: its input needs no gradient, and the default reentrant "
    "checkpoint would then give its parameters none.",
    "more than one stage per rank (interleaved, zero-bubble, V schedules): its PipelineEngine runs 1F1B over "
    "one stage per rank.",
    "selective recompute (part of a layer): activation_checkpoint_interval checkpoints whole layers.",
]


def export(plan: Plan, profile: Profile, *, plan_file: str) -> rounding.Export:
    scored_as.refuse_uncompiled_target(plan.setup, TARGET)
    rounded = rounding.start(plan, TARGET)
    rounding.one_f_one_b(rounded, TARGET)
    dp_support.round_zero(rounded, TARGET)
    dp_support.round_shard_group(rounded, TARGET)
    first = profile.layers[0].name
    if first in rounded.stages[0].checkpointed:
        rounded.stages[0] = rounded.stages[0].with_checkpointed(
            [n for n in rounded.stages[0].checkpointed if n != first])
        rounded.changes.append(f"{first}, the model's first layer, runs without checkpointing")
    scored = rounding.rescore(plan, profile, rounded)
    header = rounding.header_lines(plan_file, TARGET, CANNOT_EXPRESS, rounded, scored, plan_setup=plan.setup)
    text = rounding.comment(header) + facts.sequence_note(profile) + "\n" + _module(rounded, profile)
    return rounding.Export(TARGET, text, ".deepspeed.py", rounded, scored, CANNOT_EXPRESS)


def stage_starts(rounded: rounding.Rounded, profile: Profile) -> list[int]:
    index = {layer.name: i for i, layer in enumerate(profile.layers)}
    return [index[stage.layers[0]] for stage in rounded.stages]


def checkpointed_indices(rounded: rounding.Rounded, profile: Profile) -> list[int]:
    index = {layer.name: i for i, layer in enumerate(profile.layers)}
    return sorted(index[name] for stage in rounded.stages for name in stage.checkpointed)


def _module(rounded: rounding.Rounded, profile: Profile) -> str:
    setup = rounded.setup
    names = "\n".join(f"#   {i}: {rounding.one_line(layer.name)}" for i, layer in enumerate(profile.layers))
    # DeepSpeed's precision block: fp16 runs its dynamic loss scaler (loss_scale 0, the default)
    precision = {"bf16-mixed": ', "bf16": {"enabled": True}', "fp16-mixed": ', "fp16": {"enabled": True}'}.get(
        setup.training.precision, "")
    # the ZeRO stage the re-score charged (dp_support rounds it to 1 at most beside a pipeline): without the block
    # DeepSpeed runs stage 0, whose bf16 path (BF16_Optimizer) holds whole fp32 gradients the plan never charged
    zero = _zero_block(setup) + _checkpointing_block(setup, len(checkpointed_indices(rounded, profile)))
    if setup.pipeline.stages == 1:
        return _one_stage_module(rounded, profile, names, precision + zero) + _configure_line(setup)
    return f'''from deepspeed.pipe import LayerSpec, PipelineModule

# Your pipeline layers must be ckplan's profiled layers, in this order:
{names}
NUM_LAYERS = {len(profile.layers)}
STAGE_STARTS = {stage_starts(rounded, profile)}  # the first layer of each stage
CHECKPOINTED = {checkpointed_indices(rounded, profile)}


def ckplan_layers(layers):
    """Give the first layer of each stage a class named StageStart..., and each checkpointed layer
    one named ...Ckpt...; returns the layers and the class names to pass as checkpointable_layers."""
    if len(layers) != NUM_LAYERS:
        raise ValueError(f"this ckplan plan is for {{NUM_LAYERS}} pipeline layers, got {{len(layers)}}")
    checkpointable = []
    for index, layer in enumerate(layers):
        prefix = ("StageStart" if index in STAGE_STARTS else "") + ("Ckpt" if index in CHECKPOINTED else "")
        if not prefix:
            continue
        base = layer.typename if isinstance(layer, LayerSpec) else type(layer)
        marked = type(prefix + base.__name__, (base,), {{}})
        if isinstance(layer, LayerSpec):
            layer.typename = marked
        else:
            layer.__class__ = marked
        if index in CHECKPOINTED:
            checkpointable.append(marked.__name__)
    return layers, checkpointable


def ckplan_pipeline_module(layers, **kwargs):
    """PipelineModule with the plan's stages and checkpointed layers; kwargs: loss_fn, topology..."""
    layers, checkpointable = ckplan_layers(list(layers))
    return PipelineModule(layers=layers, num_stages={setup.pipeline.stages}, partition_method="type:^StageStart",
                          activation_checkpoint_interval=1 if checkpointable else 0,
                          checkpointable_layers=checkpointable, **kwargs)


# {setup.pipeline.microbatches} microbatches of {setup.pipeline.micro_batch_size}: DeepSpeed's pipeline runs gradient_accumulation_steps
# microbatches per step
CKPLAN_DS_CONFIG = {{"train_micro_batch_size_per_gpu": {setup.pipeline.micro_batch_size}, "gradient_accumulation_steps": {setup.pipeline.microbatches}{precision}{zero}}}
''' + _configure_line(setup)


# DeepSpeed's activation_checkpointing keys, as the setup's fields name them (deepspeed_ckpt.py, §133)
_CHECKPOINTING_KEYS = (("partition_activations", "partition_activations"), ("cpu_checkpointing", "checkpoint_in_cpu"),
                       ("contiguous_memory_optimization", "contiguous_checkpointing"),
                       ("synchronize_checkpoint_boundary", "synchronize_each_layer"))


def _checkpointing_block(setup, checkpointed: int) -> str:
    """The config's activation_checkpointing block where the re-score was given DeepSpeed's checkpointing
    settings: the keys set, and number_checkpoints (the checkpointed layers) with contiguous buffers."""
    dp = setup.data_parallel
    keys = [f'"{key}": True' for key, field in _CHECKPOINTING_KEYS if getattr(dp, field)]
    if not keys:
        return ""
    if dp.contiguous_checkpointing:
        keys.append(f'"number_checkpoints": {checkpointed}')
    return ', "activation_checkpointing": {' + ", ".join(keys) + "}"


def _configure_line(setup) -> str:
    """DeepSpeed's engine never reads activation_checkpointing: deepspeed.checkpointing.configure does
    (checkpointing.py _configure_using_config_file), so the export calls it where the block is written."""
    if not any(getattr(setup.data_parallel, field) for _, field in _CHECKPOINTING_KEYS):
        return ""
    return '''
# DeepSpeed's engine does not read "activation_checkpointing"; its checkpoint module does, when configured:
import deepspeed  # noqa: E402

deepspeed.checkpointing.configure(None, deepspeed_config=CKPLAN_DS_CONFIG)
'''


def _zero_block(setup) -> str:
    """The config's ZeRO block: the stage the re-score charged. DeepSpeed shards over the whole data-parallel
    group (a smaller group, MiCS, was removed in 0.19.8; solve and search refuse one: runnable). The stage3 knobs
    the re-score was given go with it under their ds_config keys (the others stay DeepSpeed's defaults, as charged)."""
    dp = setup.data_parallel
    knobs = "".join(f', "{name}": {getattr(dp, name)}' for name in ("stage3_max_reuse_distance",
                    "stage3_prefetch_bucket_size", "stage3_max_live_parameters", "reduce_bucket_size")
                    if getattr(dp, name) is not None)
    return f', "zero_optimization": {{"stage": {dp.zero}{knobs}}}' if dp.zero else ""


def _one_stage_module(rounded: rounding.Rounded, profile: Profile, names: str, config: str) -> str:
    """One stage: the layers as a torch.nn.Sequential for DeepSpeed's engine. A PipelineModule, even of one
    stage, runs under PipelineEngine, which asserts ZeRO below 2 (pipe/engine.py 76-78, edaa7221); the plain
    engine runs every stage. Each checkpointed layer runs under DeepSpeed's own (reentrant) checkpoint."""
    setup = rounded.setup
    return f'''import torch
from deepspeed.runtime.activation_checkpointing.checkpointing import checkpoint

# Your model's layers must be ckplan's profiled layers, in this order:
{names}
NUM_LAYERS = {len(profile.layers)}
CHECKPOINTED = {checkpointed_indices(rounded, profile)}


class CkplanCheckpointed(torch.nn.Module):
    """A layer whose forward is recomputed in the backward (DeepSpeed's reentrant checkpoint)."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, *inputs):
        return checkpoint(self.layer, *inputs)


def ckplan_model(layers):
    """The layers in order as one torch.nn.Sequential, each checkpointed one wrapped: pass it to
    deepspeed.initialize(model=..., config=CKPLAN_DS_CONFIG)."""
    layers = list(layers)
    if len(layers) != NUM_LAYERS:
        raise ValueError(f"this ckplan plan is for {{NUM_LAYERS}} layers, got {{len(layers)}}")
    return torch.nn.Sequential(*(CkplanCheckpointed(layer) if index in CHECKPOINTED else layer
                                 for index, layer in enumerate(layers)))


# {setup.pipeline.microbatches} microbatches of {setup.pipeline.micro_batch_size}: gradient_accumulation_steps microbatches per step
CKPLAN_DS_CONFIG = {{"train_micro_batch_size_per_gpu": {setup.pipeline.micro_batch_size}, "gradient_accumulation_steps": {setup.pipeline.microbatches}{config}}}
'''
