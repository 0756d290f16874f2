"""What a data-parallel rank holds unsharded beside its shards: ZeRO 3's gathered weights and ZeRO 2/3's
unsharded gradient for the largest layer, FSDP2's units per moment (planner/cost/fsdpunits.py), Megatron-FSDP's
buffers (planner/cost/megatron_fsdp.py), and the reduce-scatter input FSDP2 keeps beside a pipeline: the value
functions terms.py's rows call for them. Pure functions; nothing here reads a file or prints."""

from __future__ import annotations

from collections.abc import Callable

from planner.cost import chunkedloss, dataparallel, fsdpunits, megatron_fsdp
from planner.cost.deepspeed_terms import charged as deepspeed_charged
from planner.cost.layers import LayerCost
from planner.cost.rules import layer_extra_bytes, runtime_facts
from planner.schema import Profile, TrainSetup


def unsharded_bytes(profile: Profile, stage: int, setup: TrainSetup) -> int:
    """ZeRO 3's gathered weights in flight and ZeRO 2/3's one unsharded gradient, for the
    model's largest layer (dataparallel.unsharded_bytes): counted with the buffers, a
    constant per stage; 0 where the runtime's FSDP2 units are charged per moment instead
    (fsdp_unit_layer_bytes, fsdp_unit_loss_bytes), or DeepSpeed's submodules' (deepspeed_terms); Megatron-FSDP's
    own buffers where it runs (planner/cost/megatron_fsdp.py)."""
    if megatron_fsdp.runs(setup):
        return int(round(megatron_fsdp.buffer_bytes(profile, stage, setup)))
    if fsdpunits.charged_per_moment(setup, runtime_facts(setup).fsdp_units) or deepspeed_charged(profile, setup):
        return 0
    largest, fp8 = max(_held_params(profile, setup))
    return int(round(dataparallel.unsharded_bytes(largest, setup, fp8_count=fp8)))


def kept_reduce_scatter_input_bytes(profile: Profile, stage: int, setup: TrainSetup) -> float:
    """The reduce-scatter input FSDP2 keeps beside a pipeline from a stage's last backward to the
    next step's (its record's keeps_last_reduce_scatter_input): the whole gradients, in the reduce
    dtype, of the last FSDP2 group the stage reduces (torchtitan fully_shards each block and the
    root, and reduces them root first: a stage's last block), taken for the model's largest layer
    as unsharded_bytes takes it. 0 without a pipeline (FSDP2's own final callback drops it), without
    sharding, or where gradients are not kept whole through the microbatches."""
    if setup.pipeline.stages == 1 or not dataparallel.kept_whole(setup) or dataparallel.shard_size(setup) == 1:
        return 0.0
    if not runtime_facts(setup).keeps_last_reduce_scatter_input:
        return 0.0
    ep = setup.data_parallel.ep
    largest = max(layer.param_count - layer.expert_param_count + layer.expert_param_count // ep
                  for layer in profile.layers)
    return largest * dataparallel.param_bytes(setup).grads


def _held_params(profile: Profile, setup: TrainSetup) -> list[tuple[int, int]]:
    """Each layer's (parameters a rank holds, Float8 weights among them): under expert parallelism
    a layer holds 1/E of its routed experts."""
    ep = setup.data_parallel.ep
    return [(layer.param_count - layer.expert_param_count + layer.expert_param_count // ep,
             layer.float8.param_count if layer.float8 is not None else 0) for layer in profile.layers]


def _units_args(profile: Profile, setup: TrainSetup):
    """Each layer's parameters on the rank, its Float8 weights, and the units' arguments: a parameter several
    layers share (tied weights) is one FSDP2 parameter of their one unit (fsdpunits.unit_of_layers), counted at
    its first holder only."""
    held = _held_params(profile, setup)
    names = [layer.name for layer in profile.layers]
    tied = [sorted(names.index(name) for name in item.layers) for item in profile.tied]
    shared = [0] * len(names)
    for item, holders in zip(profile.tied, tied):
        for j in holders[1:]:
            shared[j] += item.param_count
    record = runtime_facts(setup)
    return ([p - s for (p, _), s in zip(held, shared)], [f for _, f in held],
            dict(grouping=record.fsdp_units, held=record.fsdp_gathered_from_forward, tied=tied))


def fsdp_unit_layer_bytes(layer: LayerCost, option: int, profile: Profile, setup: TrainSetup,
                          kept_bytes: Callable[[], float]) -> int:
    """What FSDP2 holds beyond the sharded state while `layer` (under `option`) runs, by the runtime's units
    (fsdpunits.layer_moment_bytes, forward_bytes), as an extra of the layer: the largest of its moments, each
    beside what the layer itself holds then. The start of its backward: its scratch, none of its gradients
    (autograd makes each as the backward reaches it); its end and its unit's post-backward: all of them, its
    scratch and saved tensors freed, its input's gradient made; its unit's copy-out as its forward begins:
    nothing of its own kept yet; the last layer's forward: its kept bytes. 0 where they are not charged per
    moment (unsharded_bytes holds the largest layer's instead). `kept_bytes`: the layer's kept bytes under `option`
    (terms.layer_value's "kept", asked only where the moments are charged)."""

    if not fsdpunits.charged_per_moment(setup, runtime_facts(setup).fsdp_units):
        return 0
    params, fp8, units = _units_args(profile, setup)
    index = next(i for i, known in enumerate(profile.layers) if known.name == layer.name)
    start, end, after = fsdpunits.layer_moment_bytes(params, fp8, index, setup, **units)
    if index == len(profile.layers) - 1:  # the LM head's gradient, reduced in a chunked loss (chunkedloss.py)
        end, after = (a - b for a, b in zip((end, after), chunkedloss.head_grads_reduced_in_loss(profile, setup)))
    copy_out, forward_end = fsdpunits.forward_bytes(params, fp8, index, setup, **units)
    scratch = layer_extra_bytes(layer, option)
    kept = kept_bytes()
    done = scratch + kept - layer.input_bytes  # freed by the end of its backward, its input's gradient made
    return int(round(max(start, end - done, after - done, copy_out - kept - scratch, forward_end - scratch)))


def fsdp_unit_loss_bytes(profile: Profile, stage: int, setup: TrainSetup) -> int:
    """What FSDP2 holds gathered at the loss, on the last stage, by the runtime's units
    (fsdpunits.loss_moment_bytes): an extra of the stage beside the loss's scratch."""
    if stage != setup.pipeline.stages - 1 or not fsdpunits.charged_per_moment(setup, runtime_facts(setup).fsdp_units):
        return 0
    params, fp8, units = _units_args(profile, setup)
    return int(round(fsdpunits.loss_moment_bytes(params, fp8, setup, **units)))
