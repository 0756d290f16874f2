"""FSDP2's units: which of a model's layers a runtime shards as one unit (one all-gather, one
reduce-scatter), which units it keeps gathered from their forward to the end of their backward,
and so what FSDP2 holds beyond the sharded state at each moment of a stage's step under ZeRO 3
resharded after every forward (torchtitan without a pipeline; beside a pipeline every unit stays
gathered and is charged whole in static, dataparallel.kept_whole).

A runtime's record says how (RuntimeFacts.fsdp_units, fsdp_gathered_from_forward). "largest-layer"
keeps the buffer term measured on ckplan's runtime, a constant per stage of the model's largest
layer (dataparallel.unsharded_bytes). Otherwise the units are charged per moment, for one
microbatch, with i an index into the model's layers and each unit a set of them:
  the loss (the end of the forward, on the last stage): the gathered weights of the units kept
      gathered from their forward on; no gradient exists yet
  layer i's backward (its forward and recompute hold a subset): gathered, each unit once, the
      unit of i, the unit of i - 1 (FSDP2's backward prefetch of the unit before it in forward
      order), and every unit kept gathered from its forward whose backward has not ended (its
      first layer at or before i); the unsharded gradients, in the weights' dtype, of the layers
      from i on of each unit whose backward is under way (reduced in its post-backward, after its
      first layer's backward); the reduce-scatter input (reduce dtype) of the unit reduced before,
      kept until the next post-backward
  layer i's unit's post-backward, where i is its first layer, after the layer's own backward scratch
      is freed: the unit resharded (torch 2.13.0 cf30153c _fsdp_param_group.py 637-638: reshard before
      the reduce), the others as above, the gradients, and its own reduce-scatter input alone
      (FSDP2 waits on the previous reduce-scatter and drops its input before the next copy-in:
      647-658, foreach_reduce at 688; reduce_scatter_max_input_buffers = 1 at 112).
On every layer its own unit with none kept gathered, layer i's backward is two gathered layers, its
gradient and the previous layer's reduce-scatter input: dataparallel.unsharded_bytes's measured
composition (and its post-backward one gathered layer less).
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.cost import dataparallel
from planner.schema import TrainSetup


def unit_of_layers(num_layers: int, grouping: str) -> list[int]:
    """Each layer's unit (an index per unit, in forward order of first use): "per-layer" every layer
    its own; "root-ends" the first and the last layer one unit (torchtitan's root `fully_shard(model)`
    holding tok_embeddings, norm and output), every other layer its own."""
    if grouping == "per-layer" or num_layers < 3:
        return list(range(num_layers))
    if grouping == "root-ends":
        return [0, *range(1, num_layers - 1), 0]
    raise ValueError(f"unknown FSDP2 unit grouping {grouping!r}")


def gathered_from_forward(units: Sequence[int], held: Sequence[str]) -> set[int]:
    """The units kept gathered from their forward to the end of their backward, named in the
    record by the layer they hold: "first" (the model's first layer), "last", "before-last"."""
    at = {"first": 0, "last": len(units) - 1, "before-last": len(units) - 2}
    return {units[at[name]] for name in held}


def charged_per_moment(setup: TrainSetup, grouping: str) -> bool:
    """Whether the units are charged per moment: ZeRO 3 resharded after forward over a shard group
    of 2 or more, under a record whose units were read (not "largest-layer", nor "submodules": DeepSpeed's
    coordinator, planner/cost/deepspeed_terms.py; nor "megatron-fsdp": planner/cost/megatron_fsdp.py)."""
    return (grouping not in ("largest-layer", "submodules", "megatron-fsdp") and setup.data_parallel.zero >= 3
            and dataparallel.shard_size(setup) > 1 and not dataparallel.kept_whole(setup))


def loss_moment_bytes(params: Sequence[float], fp8: Sequence[float], setup: TrainSetup, *,
                      grouping: str, held: Sequence[str]) -> float:
    """What FSDP2 holds gathered at the loss: the units kept gathered from their forward on. `params`
    and `fp8` are each layer's parameters held on the rank and its Float8 weights among them."""
    units = unit_of_layers(len(params), grouping)
    kept = gathered_from_forward(units, held)
    return sum(dataparallel.gathered_bytes(p, setup, fp8_count=f)
               for p, f, u in zip(params, fp8, units) if u in kept)


def layer_moment_bytes(params: Sequence[float], fp8: Sequence[float], i: int, setup: TrainSetup, *,
                       grouping: str, held: Sequence[str]) -> tuple[float, float]:
    """(computing, after): what FSDP2 holds beyond the sharded state while layer i's backward
    computes, and in its unit's post-backward where i is the unit's first layer (else 0), when the
    layer's own backward scratch is gone (the module's docstring)."""
    units = unit_of_layers(len(params), grouping)
    kept = gathered_from_forward(units, held)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    unit_params: dict[int, float] = {}
    for j, (u, p) in enumerate(zip(units, params)):  # one pass: the rules call this per layer and option
        first.setdefault(u, j)
        last[u] = j
        unit_params[u] = unit_params.get(u, 0.0) + p
    own = units[i]
    others = ({units[i - 1]} if i > 0 else set()) | {u for u in kept if first[u] <= i}

    def gathered(chosen: set[int]) -> float:
        return sum(dataparallel.gathered_bytes(p, setup, fp8_count=f) for p, f, u in zip(params, fp8, units)
                   if u in chosen)

    running = {u for u in first if first[u] <= i <= last[u]}
    held_bytes = dataparallel.param_bytes(setup)
    grads = sum(params[j] for j in range(i, len(params)) if units[j] in running) * held_bytes.weights
    before = next((units[j] for j in range(i + 1, len(params)) if first[units[j]] > i), None)  # reduced last
    scattered = unit_params[before] if before is not None else 0.0
    computing = gathered(others | {own}) + grads + scattered * held_bytes.grads
    if first[own] != i:
        return computing, 0.0
    # post-backward: the unit resharded, then its reduce-scatter input made once the previous one is dropped
    return computing, gathered(others - {own}) + grads + unit_params[own] * held_bytes.grads
